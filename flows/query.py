"""`dprelease query RELEASE (--range START STOP | --weights ROW:W,... | --rect X0 X1 Y0 Y1) [--product FILE]
[--column C] [--confidence C] [--json]`: a range, linear or (grid releases) rectangle query of a published release,
with its interval from the release's bootstrap replicates (`tasks.replicates`). Reads the release folder only."""

from __future__ import annotations

import json


def parse_weights(text: str) -> dict[int, float]:
    """"3:1,4:1,7:-0.5" -> {3: 1.0, 4: 1.0, 7: -0.5}."""
    weights = {}
    for part in text.split(","):
        row, sep, weight = part.partition(":")
        try:
            weights[int(row)] = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"--weights: {part!r} is not ROW:WEIGHT") from None
    return weights


def cmd_query(args) -> int:
    from tasks.replicates import GRID, Replicates, rectangle_weights

    if args.rect and args.product not in (None, GRID):
        raise ValueError(f"--rect answers from {GRID} (the grid's cells), not {args.product}")
    replicates = Replicates.open(args.release, GRID if args.rect else args.product)
    if args.rect:
        answer = replicates.linear(rectangle_weights(args.release, *args.rect), args.column, args.confidence)
        what = "sum of cells [{}, {}) x [{}, {})".format(*args.rect)
    elif args.range:
        start, stop = args.range
        answer = replicates.range_sum(start, stop, args.column, args.confidence)
        what = f"sum of rows [{start}, {stop})"
    else:
        answer = replicates.linear(parse_weights(args.weights), args.column, args.confidence)
        what = f"linear query {args.weights}"
    column = args.column or replicates.columns[0]
    if args.json:
        print(json.dumps({"release": args.release, "product": replicates.product, "column": column, "query": what,
                          **answer.to_json()}))
        return 0
    print(f"{replicates.product} {column}, {what}: {answer}")
    return 0
