"""`dprelease budget show` and `budget set`: a dataset's lifetime budget, its spend and its releases in the privacy
ledger, and the only way a dataset gets a budget, bound to its data and to how the specs you reviewed read it."""

from __future__ import annotations

import json
import sys

from flows.cli.arguments import LEDGER_HELP, ledger_from, lifetime_epsilon, probability
from tasks.errors import Refused, ReleaseConflict, SpecError
from tasks.ledger.spends import MAX_LIFETIME_EPSILON


def add_parsers(sub) -> None:
    budget = sub.add_parser("budget", help="inspect or set a dataset's privacy budget",
                            description="The privacy ledger keeps every release's spend per dataset.")
    bsub = budget.add_subparsers(dest="budget_command", required=True)
    show = bsub.add_parser("show", help="print a dataset's budget, spend and releases",
                           description="Print the lifetime budget, the composed spend and every release "
                                       "of a dataset.")
    show.add_argument("dataset", help="dataset id")
    show.add_argument("--ledger", default=None, help=LEDGER_HELP)
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_budget_show)
    setb = bsub.add_parser("set", help="set or change a dataset's lifetime budget",
                           description="Set a dataset's lifetime (epsilon, delta) budget in the ledger: the only "
                                       "way a dataset gets a budget. A release of a dataset without one is "
                                       "refused before anything runs.")
    setb.add_argument("dataset", help="dataset id")
    setb.add_argument("--epsilon", type=lifetime_epsilon, required=True,
                      help=f"lifetime epsilon (> 0, at most {MAX_LIFETIME_EPSILON:g})")
    setb.add_argument("--delta", type=probability, default=0.0,
                      help="lifetime delta in [0, 1) (default 0: enough for pure-DP kinds; kinds with a delta, "
                           "e.g. synthetic or mean, need one)")
    setb.add_argument("--source", default=None,
                      help="the data the dataset id stands for: a file, a folder or a built-in dataset's name; "
                           "required the first time (with --reading-from), kept when omitted after. A release that "
                           "reads other data under this id is refused")
    setb.add_argument("--reading-from", metavar="SPEC", nargs="+", default=None,
                      help="bind how the data is read to these specs' dataset sections, which you reviewed: format, "
                           "header, delimiter, user_column, weight_column, weights_count_records (alike in every "
                           "spec; changeable until the dataset's first release), the path, and the columns (their "
                           "union, each parsed as its spec says). A release that reads the data otherwise, or "
                           "other columns, is refused. Required with the first --source")
    setb.add_argument("--reason", default=None,
                      help="why the budget changes, kept in the budget's history (`budget show`); required to raise "
                           "the budget of a dataset that has spent any of it")
    setb.add_argument("--ledger", default=None, help=LEDGER_HELP)
    setb.set_defaults(func=cmd_budget_set)


def cmd_budget_show(args) -> int:
    ledger, shown = ledger_from(args, create=False)
    if ledger is None:
        print(f"error: no privacy ledger at {shown}", file=sys.stderr)
        return 1
    budget = ledger.budget(args.dataset)
    if budget is None:
        print(f"error: dataset '{args.dataset}' has no budget in {shown}", file=sys.stderr)
        return 1
    spent = ledger.spent(args.dataset)
    rows = ledger.releases(args.dataset)
    history = ledger.budget_history(args.dataset)
    if args.json:
        print(json.dumps({"dataset_id": args.dataset, "source": ledger.source(args.dataset),
                          "reading": ledger.reading(args.dataset),
                          "budget": {"epsilon": budget[0], "delta": budget[1]},
                          "spent": spent.__dict__, "releases": rows, "budget_history": history}, indent=2))
        return 0
    print(f"dataset '{args.dataset}'  ledger {shown}")
    print(f"  data source      {ledger.source(args.dataset) or '(none yet: bound by its first release)'}")
    unbound = "(not bound yet: by its first release, or by `budget set --reading-from SPEC`)"
    print(f"  read as          {ledger.reading(args.dataset) or unbound}")
    print(f"  lifetime budget  epsilon={budget[0]:g}  delta={budget[1]:g}")
    print(f"  spent            epsilon={spent.epsilon:.6g}  delta={spent.delta:g}  ({spent.method})")
    print(f"  remaining        epsilon={max(budget[0] - spent.epsilon, 0.0):.6g}")
    print(f"  {'release id':<44} {'kind':<16} {'epsilon':>9} {'delta':>8}  {'status':<10} attempts created")
    for r in rows:
        print(f"  {r['release_id']:<44} {r['kind']:<16} {r['epsilon']:>9.4g} {r['delta']:>8.2g}  "
              f"{r['status']:<10} {r['attempts']:>8} {r['created_at']}")
    print("  budget history (every change, oldest first):")
    for h in history:
        old = "none" if h["old_epsilon"] is None else f"epsilon={h['old_epsilon']:g} delta={h['old_delta']:g}"
        print(f"    {h['changed_at']}  {old} -> epsilon={h['new_epsilon']:g} delta={h['new_delta']:g}  (spent "
              f"epsilon={h['spent_epsilon']:.4g}){'  reason: ' + h['reason'] if h['reason'] else ''}")
    return 0


def cmd_budget_set(args) -> int:

    ledger, shown = ledger_from(args)
    if (args.source is None or args.reading_from is None) and ledger.source(args.dataset) is None:
        print(f"error: dataset '{args.dataset}' is bound to no data yet: give its --source (the file or folder its "
              f"releases read; a dataset id spends the budget of its own data only) and --reading-from (the specs "
              f"you reviewed: how it is read, its exact path and columns)", file=sys.stderr)
        return 2
    try:
        if args.source is not None:
            from tasks import storage

            storage.check_supported(args.source, "--source")
            if storage.is_url(args.source):
                storage.probe(storage.canonical(args.source))  # a store that does not answer: one line, in seconds
        source = args.source or ledger.source(args.dataset)
        reading = _reading_of(args.reading_from, args.dataset, source) if args.reading_from else None
        ledger.set_budget(args.dataset, args.epsilon, args.delta, source=args.source, reading=reading,
                          reason=args.reason)
    except (SpecError, Refused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ReleaseConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"dataset '{args.dataset}' ({ledger.source(args.dataset)}): lifetime budget set to epsilon={args.epsilon:g}, "
          f"delta={args.delta:g} in {shown}")
    bound = ledger.reading(args.dataset)
    print(f"  read as {bound}" if bound else "  how its data is read is not bound yet (a budget set before readings "
          "were): its first release will bind it; bind it now with --reading-from SPEC..., the specs you reviewed")
    return 0


def _reading_of(spec_paths: list[str], dataset_id: str, source: str) -> dict:
    """The reading (`tasks.params.dataset_reading`) of reviewed specs' dataset sections, which must be the
    dataset's and read its data alike, with their path and the union of their columns: the operator's reading names
    the exact file or folder releases read and the columns they may read (`ledger.check_reading`)."""
    from tasks.ledger import data_source, unit_fields, within
    from tasks.params import dataset_reading
    from tasks.spec import load_spec

    bound: dict = {}
    for spec_path in spec_paths:
        dataset = load_spec(spec_path).dataset
        if dataset.id != dataset_id:
            raise SpecError(f"--reading-from {spec_path} is a spec of dataset '{dataset.id}', not '{dataset_id}'")
        if not within(data_source(dataset.path), data_source(source)):
            raise SpecError(f"--reading-from {spec_path} reads {data_source(dataset.path)}, not the dataset's data "
                            f"{data_source(source)}")
        reading = {**dataset_reading(dataset), "path": data_source(dataset.path)}
        if bound and {**unit_fields(bound), "path": bound["path"]} != {**unit_fields(reading), "path": reading["path"]}:
            raise SpecError(f"--reading-from: {spec_path} reads the data otherwise than {spec_paths[0]} (format, "
                            f"header, delimiter, user or weight column, or path)")
        clash = sorted(c for c, how in reading["columns"].items() if bound.get("columns", {}).get(c, how) != how)
        if clash:
            raise SpecError(f"--reading-from: {spec_path} parses column(s) {', '.join(clash)} otherwise than an "
                            f"earlier spec")
        bound = {**reading, "columns": {**bound.get("columns", {}), **reading["columns"]}}
    return bound
