"""`dprelease run`: one release, its spec through every admission rule (`admitted_run`) before Prefect, dask or the
flow's stages are imported, then the temporary Prefect API and the `release` flow (flows/release.py); the built-in
example's own ledger; the run's summary on the terminal.

Reading one release's path (docs/explanation/architecture.md): start at `cmd_run` and `admitted_run` here; next,
tasks/admission/__init__.py (the rules `admitted_run` asks), then flows/release.py.
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import sys
from datetime import datetime, timezone
from pathlib import Path

from flows.cli.arguments import DEFAULT_OUTPUT
from tasks import admission

#: The built-in example's own budget, registered in its own ledger (never the operator's); the same figure
#: as deployments/specs/example-kmeans.yaml suggests for the operator's ledger.
EXAMPLE_BUDGET = (30.0, 1e-6)


def add_parsers(sub) -> None:
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


def new_release_id(dataset_id: str) -> str:
    """A new release's id: its dataset, the UTC time and 4 random hex digits (`spec check` names one too)."""
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
    release_id = spec.release_id or new_release_id(spec.dataset.id)
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

