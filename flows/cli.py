"""`dprelease`: run releases, inspect and set privacy budgets, check specs.

Exit codes: 0 success; 1 the release or the command failed (bad input, broken contract, over budget, an
internal error...), nothing charged unless the release's noisy measurements were committed; 2 bad usage, an invalid
spec, a missing input or a store that cannot be reached, found before anything runs (nothing charged or written);
3 the release was published but holds no released values (e.g. no friendly core): its budget is spent, and a new
release of the same spec spends again; 130 interrupted (Ctrl-C). A failure prints one `error:` line per problem and no
traceback; the full log of a run, tracebacks included, is in <output_dir>/.logs/<release id>.log (`--debug`
prints tracebacks too).
Prefect, dask and the release kinds are imported only by the commands that need them, after the checks
that need none of them: a spec naming a missing file fails in well under two seconds.

Reading one release's path (docs/explanation/architecture.md): start at `cmd_run` and `admitted_run` here; next,
tasks/admission/__init__.py (the rules `admitted_run` asks), then flows/release.py.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import logging
import math
import os
import secrets
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from flows.environment import apply_defaults
from flows.ledger_commands import add_parsers as add_reconcile_parser
from flows.ledger_commands import ledger_from
from tasks import admission
from tasks.errors import Refused, ReleaseError, SpecError
from tasks.ledger.spends import MAX_LIFETIME_EPSILON

DEFAULT_OUTPUT = "dprelease-runs"
#: The built-in example's own budget, registered in its own ledger (never the operator's); the same figure
#: as deployments/specs/example-kmeans.yaml suggests for the operator's ledger.
EXAMPLE_BUDGET = (30.0, 1e-6)
LEDGER_HELP = ("the ledger: a SQLite file or a postgresql:// URL (default: the `ledger` setting, $DPRELEASE_LEDGER, "
               "config.toml, or ~/.local/state/dprelease/privacy-ledger.sqlite)")


def _new_release_id(dataset_id: str) -> str:
    return f"{dataset_id}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"


def admitted_run(args):
    """The spec of `dprelease run` and its release id, through every admission rule (`tasks.admission`), before
    Prefect, dask or the flow's stages are imported."""
    if args.example:
        from flows.example import example_spec

        spec = example_spec(output_dir=args.output_dir or DEFAULT_OUTPUT)
        _example_ledger(spec, quiet=args.json)
        data, source = spec.model_dump(), "the built-in example"
    else:
        data, source = admission.admit_file(args.spec), args.spec
    overrides = {"release_id": args.release_id, "output_dir": args.output_dir,
                 "evaluate": False if args.no_evaluate else None}
    spec = admission.admit_spec({**data, **{k: v for k, v in overrides.items() if v is not None}}, source=source)
    release_id = spec.release_id or _new_release_id(spec.dataset.id)
    spec = spec.model_copy(update={"release_id": release_id})
    admission.admit_run(spec, release_id)
    return spec


def cmd_run(args) -> int:
    # The cyclic garbage collector paused while the run's libraries load, then told to leave what they made alone:
    # they make millions of objects and few cycles, and collecting them took 1.4 s of a 12 s example (1.7 s in 1,600
    # collections, 0.37 s with the pause; measured 2026-11-26).
    gc.disable()
    try:
        spec = admitted_run(args)
        from flows.api import TemporaryServer, prefect_api

        server = TemporaryServer.launch()  # boots on the other core while the flow's modules load
        if not args.json:
            print(f"release id: {spec.release_id}  (to resume after a failure: --release-id {spec.release_id})",
                  flush=True)
        from flows.logs import log_path, run_logging

        with run_logging(log_path(spec.output_dir, spec.release_id), debug=args.debug) as log_file:
            from flows.release import import_stage_libraries

            import_stage_libraries()
            gc.freeze()
            gc.enable()
            with prefect_api(server):
                return _run_release(spec, args, log_file)
    finally:
        gc.enable()


def _run_release(spec, args, log_file: Path) -> int:
    from flows.release import release
    from tasks.retry import ours

    try:
        summary = release(spec=spec)
    except Exception as exc:  # every failure, expected or not: one line here, the traceback in the log
        message = (" ".join(str(exc).split()) if ours(exc)
                   else f"{type(exc).__name__} (internal error; see the log)")
        if args.json:
            print(json.dumps({"status": "failed", "release_id": spec.release_id, "error": message,
                              "log": str(log_file)}))
        print(f"error: {message} (log: {log_file})", file=sys.stderr)
        return 1
    summary["log"] = str(log_file)
    summary["values_released"] = not nothing_released(summary)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    if not summary["values_released"]:  # published with null values, its budget spent: not a release at a glance
        print(f"error: release {spec.release_id} was published with no released values (its values are null; "
              f"the budget is spent): {'; '.join(summary['caveats'])}", file=sys.stderr)
        return NO_VALUES
    return 0


#: The exit code of a release published with no released values (no friendly core): its budget is spent, and a
#: pipeline must not take it for a release (nor run the spec again under a new id, which spends again).
NO_VALUES = 3


def nothing_released(summary: dict) -> bool:
    """Whether a run's summary says that its release holds no released values (a kind's caveat says so)."""
    from tasks.kinds.base import NOTHING_RELEASED

    return any(NOTHING_RELEASED in c for c in summary.get("caveats", []))


def _example_ledger(spec, quiet: bool = False) -> None:
    """The example draws on its own ledger, beside its outputs, with a budget it registers itself."""
    from tasks.ledger import LEDGER_ENV, PrivacyLedger
    from tasks.params import dataset_reading

    path = (Path(spec.output_dir) / "example-privacy-ledger.sqlite").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ[LEDGER_ENV] = str(path)
    ledger = PrivacyLedger(path)
    if ledger.budget(spec.dataset.id) is None:
        ledger.set_budget(spec.dataset.id, *EXAMPLE_BUDGET, source=spec.dataset.path,
                          reading=dataset_reading(spec.dataset))
    if not quiet:
        print(f"the example uses its own ledger {path}, where it registered dataset '{spec.dataset.id}' with a "
              f"lifetime budget epsilon={EXAMPLE_BUDGET[0]:g}, delta={EXAMPLE_BUDGET[1]:g}", flush=True)


def format_summary(s: dict) -> str:
    budget = s["dataset_budget"]
    status = (f"{s['status']}, but NOTHING RELEASED (its values are null; the budget is spent)"
              if nothing_released(s) else s["status"])
    lines = [
        "",
        f"Release {s['release_id']} ({s['kind']} on dataset '{s['dataset_id']}'): {status}",
        f"  release/   {s['release_dir']}   (safe to publish)" if s["private"] else
        f"  output     {s['release_dir']}   (TEST MODE: seeded noise, NOT private, never publish)",
        *([f"  published  {s['published_at']}"] if s.get("published_at")
          and s["published_at"] != str(Path(s["release_dir"]).resolve()) else []),
        f"  internal/  {s['internal_dir']}   (raw-derived: never publish)",
        f"  privacy    epsilon={s['epsilon']:.4g}, delta={s['delta']:.3g} ({s['accounting']})"
        + ("" if s["private"] else " if it were drawn privately"),
        f"  budget     dataset spent epsilon={budget['spent_epsilon']:.4g} of {budget['epsilon']:.4g}, "
        f"remaining {budget['remaining_epsilon']:.4g}" if budget else "  budget     not charged (test mode)",
    ]
    lines += [f"  caveat     {c}" for c in s.get("caveats", [])]
    if s.get("evaluation") and Path(s["evaluation"]).exists():
        # Its figures are computed on the raw data (with the published values they can single out a record):
        # the terminal, like the UI, gets only where they are.
        lines.append(f"  utility    {s['evaluation']}   (internal evaluation, raw-derived: never publish)")
    if s.get("timings"):
        lines.append("  stages     " + ", ".join(f"{k} {v:.1f}s" for k, v in s["timings"].items()))
    if s.get("report"):
        lines.append(f"  report     {s['report']}")
    return "\n".join(lines)


def cmd_experiment(args) -> int:
    import pandas as pd

    from flows.experiments import experiment

    eps = [float(e) for e in args.epsilons.split(",")] if args.epsilons else None
    result = experiment(name=args.name, data_dir=args.data_dir, output_dir=args.output_dir, runs=args.runs,
                        seed=args.seed, epsilons=eps)
    print(f"\nExperiment {args.name}: tables and plots in {result['internal_dir']} (internal: not for publication)")
    for table in result["tables"]:
        frame = pd.read_parquet(table)
        keys = [c for c in ("dataset", "known", "workload", "panel", "dimension", "R", "n", "epsilon", "range_length")
                if c in frame.columns]
        metric = next(c for c in ("ratio", "accuracy", "mse", "l2_error") if c in frame.columns)
        # Tables with a 'released' column count a failed release as +inf: their mean would be +inf, so the median.
        agg = "median" if "released" in frame.columns else "mean"
        summary = frame.groupby(keys + ["method"])[metric].agg(agg).unstack("method")
        label = {"ratio": "WCSS / k-means++", "accuracy": "clustering accuracy", "mse": "MSE",
                 "l2_error": "L2 error"}[metric]
        print(f"\n{Path(table).name} ({agg} {label} over runs)\n"
              f"{summary.to_string(float_format=lambda v: f'{v:.4g}')}")
    return 0


def cmd_generate(args) -> int:
    from distributed import Client, LocalCluster

    from tasks import generators

    model = generators.MODELS[args.model]
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} is not empty", file=sys.stderr)
        return 1
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        paths = generators.generate(model, out, users=args.users, seed=args.seed, client=client)
    print(f"wrote {args.users} {args.model} records ({model.items} items, column '{model.item_column}') in "
          f"{len(paths)} partitions to {out}")
    return 0


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
    from tasks.errors import ReleaseConflict, SpecError

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
    from tasks.errors import SpecError
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


def cmd_public_register(args) -> int:
    from tasks import storage
    from tasks.errors import ReleaseConflict

    storage.check_supported(args.path, "path")
    if not storage.probe(storage.canonical(args.path)):
        print(f"error: {args.path} does not exist", file=sys.stderr)
        return 2
    ledger, shown = ledger_from(args)
    try:
        digest = ledger.register_public(args.path, args.source)
    except ReleaseConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{storage.canonical(args.path)} is public ({args.source}; sha256 {digest[:16]}...) in {shown}")
    return 0


def cmd_public_list(args) -> int:
    ledger, _ = ledger_from(args, create=False)
    rows = ledger.public_inputs() if ledger else []
    for r in rows:
        print(f"{r['path']}  sha256 {r['sha256'][:16]}...  {r['source']}  (registered {r['registered_at']})")
    return 0


def cmd_releases_list(args) -> int:
    from tasks import settings, storage
    from tasks.storage import catalogue

    output = args.output or settings.current().output or storage.canonical(DEFAULT_OUTPUT)
    storage.check_supported(output, "--output")
    catalogue.check_output_location(output, "--output" if args.output else "the output location")
    try:
        rows = catalogue.rows(output, args.dataset)
    except Exception as exc:
        if storage.store_failure(exc):
            raise
        # A file in catalogue/ that is not a catalogue row (truncated, another writer's): its type only.
        raise ReleaseError(f"the catalogue of {output} cannot be read ({type(exc).__name__}): a file in "
                           f"{storage.join(output, catalogue.CATALOGUE)} is not a catalogue row") from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"releases in {output}" + (f" of dataset '{args.dataset}'" if args.dataset else "") + f": {len(rows)}")
    for r in rows:
        print(f"  {r['release_id']:<44} {r['dataset_id']:<20} {r['kind']:<16} {r['period'] or '-':<10} "
              f"epsilon={r['epsilon']:<8.4g} delta={r['delta']:<8.2g} {r['published_at']}  {r['location']}")
    return 0


def cmd_ledger_migrate(args) -> int:
    from tasks import settings
    from tasks.ledger import PrivacyLedger, ledger_at
    from tasks.ledger.migrate import copy_ledger

    source_location = args.source or settings.current().ledger
    if settings.is_database(source_location) or not settings.is_database(args.target):
        raise SpecError(f"ledger migrate copies a SQLite file (--from, else the `ledger` setting: "
                        f"{settings.masked(source_location)}) into a PostgreSQL database (--to postgresql://...)")
    source = ledger_at(source_location, create=False)
    if source is None:
        raise SpecError(f"no privacy ledger at {source_location}: nothing to migrate")
    target = PrivacyLedger(args.target)
    copied = copy_ledger(source, target)
    print(f"copied the ledger {source.name} into {target.name}: "
          + ", ".join(f"{table} {n} rows" for table, n in copied["rows"].items()))
    for dataset_id, (epsilon, delta, spent) in copied["datasets"].items():
        print(f"  dataset '{dataset_id}': lifetime epsilon={epsilon:g} delta={delta:g}, spent epsilon={spent:.6g} "
              f"(the same in both)")
    print(f"next: set `ledger = \"{target.name}\"` on every host that runs releases (the password as you "
          f"keep it), then check with `dprelease budget show DATASET`")
    return 0


SHAPES = {"points": "numeric columns with public bounds", "values": "one numeric column with public bounds",
          "categories": "categorical columns with public levels", "sets": "set-valued records (a list of item ids)",
          "numeric": "numeric columns, no bounds needed",
          "trips": "trips: origin and destination columns with public zones, optionally a user column"}


def kinds_table() -> str:
    """The release kinds as a Markdown table, from the registry (the README's table is this output)."""
    from tasks.kinds import REGISTRY

    rows = ["| kind | data | method |", "|---|---|---|"]
    rows += [f"| `{k.name}` | {SHAPES[k.shape]} | {k.summary} |" for k in REGISTRY.values()]
    return "\n".join(rows)


def cmd_kinds(args) -> int:
    print(kinds_table())
    return 0


def cmd_spec_check(args) -> int:
    """Every admission rule a run would meet, up to the dry run of its charge, without running anything."""
    spec = admission.admit_spec(admission.admit_file(args.spec), source=args.spec)
    release_id = spec.release_id or _new_release_id(spec.dataset.id)
    admission.admit_run(spec.model_copy(update={"release_id": release_id}), release_id)
    if args.json:
        from flows.accuracy import plan_accuracy

        print(json.dumps({"spec": args.spec, "valid": True, "kind": spec.release.kind, "dataset_id": spec.dataset.id,
                          "columns": spec.dataset.columns, "epsilon": spec.release.epsilon,
                          "fingerprint": spec.fingerprint(), "confidence": spec.release.confidence,
                          "accuracy": plan_accuracy(spec, spec.release.epsilon)}))
        return 0
    print(f"{args.spec}: valid {spec.release.kind} release of dataset '{spec.dataset.id}' "
          f"(columns {spec.dataset.columns}, epsilon={spec.release.epsilon:g}); its input files exist and the ledger "
          f"would charge it")
    return 0


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_finite(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def lifetime_epsilon(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_LIFETIME_EPSILON:  # nan and inf too
        raise argparse.ArgumentTypeError(f"must be a number in (0, {MAX_LIFETIME_EPSILON:g}], got {text}")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a usage error as one `error:` line (argparse prints the usage, then the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import version

    parser = _Parser(prog="dprelease", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"dprelease {version('dprelease')}")
    parser.add_argument("--debug", dest="debug_all", action="store_true",
                        help="print the traceback of an internal error on the terminal (every command)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a release flow (Prefect, local dask cluster by default)",
                         description="Run one differentially private release: ingest -> normalise -> DP "
                                     "measurement -> postprocess -> publish -> evaluate. Outputs go to "
                                     "<output_dir>/<release_id>/{release,internal,measurements}.")
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("spec", nargs="?", help="release spec file (YAML or JSON)")
    src.add_argument("--example", action="store_true",
                     help="the built-in default release on generated data (no spec, no server needed)")
    run.add_argument("--release-id", help="resume or name a release (a failed release keeps its "
                                          "measurements: rerunning its id spends no budget again)")
    run.add_argument("--output-dir", help=f"override the spec's output_dir (default {DEFAULT_OUTPUT})")
    run.add_argument("--no-evaluate", action="store_true", help="skip the internal utility evaluation")
    run.add_argument("--json", action="store_true", help="print the run's summary (or its failure) as JSON")
    run.add_argument("--debug", action="store_true", help="print tracebacks on the terminal too (they are "
                                                          "always in the run's log file)")
    run.set_defaults(func=cmd_run)

    exp = sub.add_parser("experiment", help="reproduce a paper figure on the reference datasets",
                         description="Run a paper-reproduction experiment (a Prefect flow): sweep epsilon over "
                                     "the methods, write a Parquet table and PNG plots into "
                                     "<output_dir>/experiments/<name>-<time>/internal/.")
    exp.add_argument("name", choices=["kmeans", "contingency", "histogram", "matrix_mechanism", "mnist_clustering",
                                      "friendlycore_mean", "friendlycore_kmeans"],
                     help="kmeans: Lee-Kifer Fig 1 (DPKM vs consistency vs MCMC); contingency: Lee-Wang-Kifer "
                          "Fig 5.1.1; histogram: Figs 5.2.1-5.2.2; matrix_mechanism: Figs 5.3.1-5.3.2; "
                          "mnist_clustering: Acs et al. Fig 3; friendlycore_mean: FriendlyCore blog, averaging vs "
                          "CoinPress (error vs R and vs d); friendlycore_kmeans: FriendlyCore blog, k-means cost vs n "
                          "(friendly k-means vs DP k-means and Lee-Kifer). The friendlycore_* experiments generate "
                          "their data and fix rho = 0.5 (no --epsilons); friendlycore_kmeans with --runs <= 2 "
                          "runs quick settings (n <= 5e4)")
    exp.add_argument("--runs", type=int, default=10, help="runs per setting (default 10)")
    exp.add_argument("--seed", type=int, default=0, help="seed of the experiment's noise (default 0)")
    exp.add_argument("--epsilons", help="comma-separated epsilons (default 0.05,0.1,0.25,0.5,1.0 for kmeans, "
                                        "0.1,0.2,...,1.0 otherwise)")
    exp.add_argument("--data-dir", default="../shared/data", help="reference datasets (default ../shared/data)")
    exp.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"default {DEFAULT_OUTPUT}")
    exp.set_defaults(func=cmd_experiment)

    gen = sub.add_parser("generate", help="generate synthetic call-detail or transit records",
                         description="Write realistic synthetic set-valued records (Acs et al.'s CDR: 1,303 towers, "
                                     "~11.4 per subscriber; TRANSIT: 342 stations, ~5.3 per passenger) as "
                                     "partitioned Parquet with a list<int32> column. Deterministic given --seed.")
    gen.add_argument("model", choices=["cdr", "transit"])
    gen.add_argument("--users", type=positive_int, required=True,
                     help="number of records (4400000 for the paper's CDR)")
    gen.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--workers", type=positive_int, default=2, help="dask worker processes")
    gen.set_defaults(func=cmd_generate)

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

    public = sub.add_parser("public", help="declare a file public (public marginals, a public sample)",
                            description="Public inputs of releases (public marginals, public samples) are files "
                                        "the operator declared public, with where they come from; a release "
                                        "naming any other file as public is refused before anything runs.")
    psub = public.add_subparsers(dest="public_command", required=True)
    reg = psub.add_parser("register", help="declare a file or folder public",
                          description="Record a file (or folder) as public in the ledger, with its sha256: a "
                                      "release refuses it once its content changes. A dataset's own data cannot "
                                      "be declared public.")
    reg.add_argument("path", help="the public file or folder")
    reg.add_argument("--source", required=True, help="where it comes from (e.g. 'census 2021, table P12')")
    reg.add_argument("--ledger", default=None, help=LEDGER_HELP)
    reg.set_defaults(func=cmd_public_register)
    plist = psub.add_parser("list", help="list the files declared public", description="List the public inputs.")
    plist.add_argument("--ledger", default=None, help=LEDGER_HELP)
    plist.set_defaults(func=cmd_public_list)

    releases = sub.add_parser("releases", help="list the published releases of an output location (its catalogue)",
                              description="The catalogue of an output location: one row per published release "
                                          "(release id, dataset, kind, period, epsilon, delta, published time, "
                                          "manifest digest, location, files), written after its manifest.")
    rsub = releases.add_subparsers(dest="releases_command", required=True)
    rlist = rsub.add_parser("list", help="list the releases of an output location",
                            description="Print the catalogue of the operator's output location (`output`), or of "
                                        "--output.")
    rlist.add_argument("--dataset", default=None, help="only this dataset's releases")
    rlist.add_argument("--output", default=None, help=f"the output location: a folder or a store's URL (default: the "
                                                      f"operator's `output` setting, else {DEFAULT_OUTPUT})")
    rlist.add_argument("--json", action="store_true", help="machine-readable output")
    rlist.set_defaults(func=cmd_releases_list)
    ledger = sub.add_parser("ledger", help="move the privacy ledger to a shared database, reconcile it with the "
                                           "published releases, or upgrade its schema",
                            description="The privacy ledger's store: a SQLite file on one machine, or a PostgreSQL "
                                        "database that every host running releases shares.")
    lsub = ledger.add_subparsers(dest="ledger_command", required=True)
    migrate = lsub.add_parser("migrate", help="copy a SQLite ledger into an empty PostgreSQL database",
                              description="Copy every row of a SQLite ledger (budgets, their history, spends, public "
                                          "inputs) into a PostgreSQL database that holds no ledger rows, in one "
                                          "transaction, then check that the copy holds as many rows and that "
                                          "every dataset has the same budget and composed spend. Stop every "
                                          "release first; afterwards, point every host's `ledger` setting at the "
                                          "database. The SQLite file is left as it was.")
    migrate.add_argument("--to", required=True, metavar="URL", dest="target",
                         help="the PostgreSQL database to copy into, postgresql://USER@HOST:PORT/DATABASE (its "
                              "password is never printed); it must hold no ledger rows")
    migrate.add_argument("--from", metavar="PATH", dest="source", default=None,
                         help="the SQLite ledger to copy (default: the `ledger` setting, which must then be a "
                              "SQLite file)")
    migrate.set_defaults(func=cmd_ledger_migrate)
    add_reconcile_parser(lsub, LEDGER_HELP)

    kinds = sub.add_parser("kinds", help="list the release kinds (a Markdown table)",
                           description="Print every registered release kind, its data shape and its method.")
    kinds.set_defaults(func=cmd_kinds)

    spec = sub.add_parser("spec", help="work with release spec files")
    ssub = spec.add_subparsers(dest="spec_command", required=True)
    check = ssub.add_parser("check", help="validate a spec file without running anything",
                            description="Validate a release spec: schema, bounds, seed mode, and that its input "
                                        "files (data, public sample, public marginals) exist. Exit 2 otherwise.")
    check.add_argument("spec", help="release spec file (YAML or JSON)")
    check.add_argument("--json", action="store_true", help="machine-readable output (with the accuracy planner's "
                                                           "expected errors at the spec's epsilon)")
    check.set_defaults(func=cmd_spec_check)
    _uncertainty_parsers(sub)
    return parser


def _uncertainty_parsers(sub) -> None:
    """`accuracy` (the planner, flows/accuracy.py) and `query` (a release's derived queries, flows/query.py)."""
    from flows.accuracy import cmd_accuracy
    from flows.query import cmd_query

    acc = sub.add_parser("accuracy", help="expected error of each published quantity, per epsilon, before spending",
                         description="The accuracy planner: the expected error (standard deviation and interval "
                                     "half-width at the spec's confidence) of each quantity the spec's release "
                                     "publishes, for each epsilon, from the plan alone. Reads neither the data nor "
                                     "the ledger; states its assumptions where the error depends on the data.")
    acc.add_argument("spec", help="release spec file (YAML or JSON)")
    acc.add_argument("--epsilon", type=positive_finite, nargs="+", help="epsilons to plan (default: the spec's)")
    acc.add_argument("--records", type=positive_int, help="a public guess of the number of records, for quantities "
                                                          "whose error depends on it (a cluster's size, a core weight)")
    acc.add_argument("--json", action="store_true", help="machine-readable output")
    acc.set_defaults(func=cmd_accuracy)
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
    query.add_argument("--confidence", type=_confidence, help="the interval's confidence (default: the release's)")
    query.add_argument("--storage-options", metavar="JSON", help="the store's fsspec options for a URL (e.g. "
                       "'{\"profile\": \"analyst\"}'), where its standard environment is not enough")
    query.add_argument("--json", action="store_true", help="machine-readable output")
    query.set_defaults(func=cmd_query)


def _confidence(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_defaults()  # before any command imports Prefect, dask or great-expectations
    try:
        code = args.func(args)
    except (SpecError, Refused) as exc:  # refused before anything ran
        return _failed(args, exc, 2)
    except ReleaseError as exc:
        return _failed(args, exc, 1)
    except ValueError as exc:
        if _raised_here(exc):  # a text of this package's (a query's weights, a replicate file's shape)
            return _failed(args, exc, 1)
        return _unexpected(args, exc)
    except RecursionError:  # a structure nested past Python's stack (a spec 5,000 levels deep), wherever it was read
        return _failed(args, Refused("an input is nested too deeply to be read (a spec file's mappings and lists "
                                     "nested hundreds of levels deep?)"), 2)
    except KeyboardInterrupt:
        return _failed(args, ReleaseError("interrupted"), INTERRUPTED)
    except Exception as exc:
        return _unexpected(args, exc)
    return 0 if code is None else code


def _unexpected(args, exc: Exception) -> int:
    """An error the pipeline did not raise: its text may quote anything (a value a parser read, a path, a key), so
    one line with its type, or what kind of failure it is, and the traceback only with --debug."""
    from tasks import storage

    if storage.store_failure(exc):
        return _failed(args, Refused(f"an object store cannot be reached ({type(exc).__name__}): credentials and "
                                     f"endpoint come from the store's standard environment (e.g. AWS_ACCESS_KEY_ID, "
                                     f"AWS_ENDPOINT_URL). Nothing was run"), 2)
    if _debugging(args):
        import traceback

        traceback.print_exc()
    if type(exc).__name__ == "ValidationError" and type(exc).__module__.startswith("pydantic"):
        # A library's settings model refused the environment (a PREFECT_* variable): the setting and the rule.
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "?"
        return _failed(args, ReleaseError(f"invalid settings of a library ({exc.title}: {where}: {first['msg']}); "
                                          f"check its environment variables"), 1)
    return _failed(args, ReleaseError(f"internal error ({type(exc).__name__}) in `dprelease {args.command}`"
                                      f"{'' if _debugging(args) else '; --debug prints its traceback'}"), 1)


#: The package's own folders: an exception raised from their code carries a text the package wrote.
_OURS = tuple(str(Path(__file__).resolve().parents[1] / p) + os.sep for p in ("flows", "tasks", "dpalgos",
                                                                              "data_contracts"))


def _raised_here(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OURS)


#: The exit code of a command interrupted by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def _debugging(args) -> bool:
    return bool(getattr(args, "debug", False) or getattr(args, "debug_all", False))


def _failed(args, exc: Exception, code: int) -> int:
    """One `error:` line per problem on stderr; with --json, the failure as JSON on stdout too."""
    lines = str(exc).splitlines()
    if getattr(args, "json", False):
        print(json.dumps({"status": "refused" if code == 2 else "failed", "error": " ".join(lines),
                          "problems": lines, "exit_code": code}))
    print("\n".join(f"error: {line}" for line in lines), file=sys.stderr)
    return code


def entry_point() -> NoReturn:
    """The `dprelease` program: `main`, then an exit without the interpreter's teardown. After a release the
    process holds Prefect, dask, great-expectations and their dependencies; tearing their modules down took
    2.7 s on a 2-core machine after the last exit handler had run. Everything the teardown would finish is
    finished here first: the exit handlers, the logs and the standard streams."""
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, --version, a usage error (its one line already printed)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry_point()
