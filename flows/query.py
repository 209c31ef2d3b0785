"""`dprelease query RELEASE (--range START STOP | --weights ROW:W,...) [--product FILE] [--column C]
[--confidence C] [--storage-options JSON] [--json]`: a range or linear query of a published release, with its interval
from the release's bootstrap replicates (`tasks.replicates`). Reads the release only: a folder, or its prefix on a
store (`s3://...`), credentials from the store's environment, the operator's block or `--storage-options`."""

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
    from tasks import storage
    from tasks.replicates import Replicates
    from tasks.storage import options

    if storage.is_url(args.release):
        if args.storage_options:
            options.use(options.parse(args.storage_options), args.release.split("://", 1)[0].lower())
        storage.probe(args.release)  # a store that does not answer: one line in seconds, not the outage retries
    replicates = Replicates.open(args.release, args.product)
    if args.range:
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
