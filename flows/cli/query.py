"""`dprelease query RELEASE (--range START STOP | --weights ROW:W,... | --rect X0 X1 Y0 Y1 | --origin Z |
--destination Z | --pair O D) [--product FILE] [--column C] [--confidence C] [--storage-options JSON] [--json]`: a
range, linear, (grid releases) rectangle or (od releases) origin-destination query of a published release, with its
interval from the release's bootstrap replicates (`tasks.replicates`). Reads the release only: a folder, or its prefix
on a store (`s3://...`), credentials from the store's environment, the operator's block or `--storage-options`."""

from __future__ import annotations

import json

from flows.cli.arguments import confidence


def add_parsers(sub) -> None:
    query = sub.add_parser("query", help="a range or linear query of a release, with its interval",
                           description="Answer a range sum or a linear query of a published release's product "
                                       "from its values, with the interval of the query's values on the release's "
                                       "bootstrap replicates. Reads the release folder only.")
    query.add_argument("release", help="the release folder (<output_dir>/<release id>/release) or its URL "
                                       "(<output>/dataset=D/kind=K/release=ID, e.g. on s3://)")
    what = query.add_mutually_exclusive_group(required=True)
    what.add_argument("--range", type=int, nargs=2, metavar=("START", "STOP"), help="the sum of rows START..STOP-1")
    what.add_argument("--weights", help="ROW:WEIGHT,... (e.g. 3:1,4:1,7:-1), rows not named weigh 0")
    what.add_argument("--origin", metavar="ZONE", help="an od release: the trips from ZONE (the sum of its row)")
    what.add_argument("--destination", metavar="ZONE", help="an od release: the trips to ZONE (the sum of its column)")
    what.add_argument("--pair", nargs=2, metavar=("ORIGIN", "DESTINATION"), help="an od release: one cell")
    what.add_argument("--rect", type=int, nargs=4, metavar=("X0", "X1", "Y0", "Y1"),
                      help="a grid release's rectangle sum over cells [X0, X1) x [Y0, Y1) of its first two axes "
                           "(cell indices, half-open like --range)")
    query.add_argument("--product", help="the product (default: the first with replicates, e.g. histogram.parquet)")
    query.add_argument("--column", help="the value column (default: the product's first)")
    query.add_argument("--confidence", type=confidence, help="the interval's confidence (default: the release's)")
    query.add_argument("--storage-options", metavar="JSON", help="the store's fsspec options for a URL (e.g. "
                       "'{\"profile\": \"analyst\"}'), where its standard environment is not enough")
    query.add_argument("--json", action="store_true", help="machine-readable output")
    query.set_defaults(func=cmd_query)


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


def _rect_without_interval(args) -> int:
    """An adaptive grid's rectangle: the sum of its published estimate, cut at zero, with no interval (its cells
    share each leaf's count by a rule, an unevenness no released value measures)."""
    from tasks.replicates import GRID, published, rectangle_weights, sum_answer

    if args.column not in (None, "estimate"):
        raise ValueError("--rect on an adaptive grid answers from its `estimate` column only")
    weights = rectangle_weights(args.release, *args.rect)
    value = float(sum_answer(published(args.release, GRID).column("estimate") @ weights, True))
    what = "sum of cells [{}, {}) x [{}, {})".format(*args.rect)
    why = ("no interval: an adaptive grid's cells share each leaf's count by a smoothing rule; the leaves' own noisy "
           "counts and exact intervals are in the release's noisy_adaptive.parquet")
    if args.json:
        print(json.dumps({"release": args.release, "product": GRID, "column": "estimate", "query": what,
                          "estimate": value, "std": None, "lo": None, "hi": None, "replicates": 0, "note": why}))
    else:
        print(f"{GRID} estimate, {what}: {value:.6g}  ({why})")
    return 0


def cmd_query(args) -> int:
    from tasks import storage
    from tasks.kinds import od
    from tasks.replicates import GRID, Replicates, grid_info, rectangle_weights
    from tasks.storage import options

    if storage.is_url(args.release):
        if args.storage_options:
            options.use(options.parse(args.storage_options), args.release.split("://", 1)[0].lower())
        storage.probe(args.release)  # a store that does not answer: one line in seconds, not the outage retries
    if args.rect and args.product not in (None, GRID):
        raise ValueError(f"--rect answers from {GRID} (the grid's cells), not {args.product}")
    if args.rect and grid_info(args.release).get("strategy") == "adaptive":
        return _rect_without_interval(args)
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
