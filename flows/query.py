"""`dprelease query RELEASE (--range START STOP | --weights ROW:W,... | --rect X0 X1 Y0 Y1 | --origin Z |
--destination Z | --pair O D) [--product FILE] [--column C] [--confidence C] [--storage-options JSON] [--json]`: a
range, linear, (grid releases) rectangle or (od releases) origin-destination query of a published release, with its
interval from the release's bootstrap replicates (`tasks.replicates`). Reads the release only: a folder, or its prefix
on a store (`s3://...`), credentials from the store's environment, the operator's block or `--storage-options`."""

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


def od_cells(release: str, origin: str | None, destination: str | None) -> dict[int, float]:
    """The cells of an `od` release with the origin and / or destination given, as weights of 1 (zone names are
    public: the spec's and the released table's)."""
    from tasks import storage
    from tasks.kinds import od

    try:
        info = json.loads(storage.read_bytes(storage.join(release, od.CONSISTENCY)))
        columns = (info["origin_column"], info["destination_column"])
        frame = storage.read_table(storage.join(release, od.TABLE), columns=["cell", *columns]).to_pandas()
    except (OSError, ValueError, KeyError):
        raise ValueError(f"{release} is not an od release: --origin, --destination and --pair select the cells of "
                         f"an origin-destination table") from None
    keep = frame["cell"] >= 0
    for column, zone, side in ((columns[0], origin, "origin"), (columns[1], destination, "destination")):
        if zone is None:
            continue
        if zone not in set(frame[column]):
            raise ValueError(f"{side} {zone!r} is not a zone of this release (its {side}s are the levels of "
                             f"'{column}' in {od.TABLE})")
        keep &= frame[column] == zone
    return {int(c): 1.0 for c in frame["cell"][keep]}


def cmd_query(args) -> int:
    from tasks import storage
    from tasks.kinds import od
    from tasks.replicates import GRID, Replicates, rectangle_weights
    from tasks.storage import options

    if storage.is_url(args.release):
        if args.storage_options:
            options.use(options.parse(args.storage_options), args.release.split("://", 1)[0].lower())
        storage.probe(args.release)  # a store that does not answer: one line in seconds, not the outage retries
    if args.rect and args.product not in (None, GRID):
        raise ValueError(f"--rect answers from {GRID} (the grid's cells), not {args.product}")
    origin, destination = (args.pair or (args.origin, args.destination))
    selected = origin is not None or destination is not None
    replicates = Replicates.open(args.release, args.product or (GRID if args.rect else od.TABLE if selected else None))
    if args.rect:
        answer = replicates.linear(rectangle_weights(args.release, *args.rect), args.column, args.confidence)
        what = "sum of cells [{}, {}) x [{}, {})".format(*args.rect)
    elif selected:
        answer = replicates.linear(od_cells(args.release, origin, destination), args.column, args.confidence)
        what = f"trips from {origin or 'any zone'} to {destination or 'any zone'}"
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
