"""The `release` flow: ingest -> prepare -> DP measurement -> postprocessing -> publish -> evaluation -> report,
with a data contract between every two stages (docs/design.md, "The data path of one release").

Reading one release's path (docs/explanation/architecture.md): `release`, then `_release` and `_stages`; next,
tasks/kinds/base.py, what a release kind supplies to the stages."""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.states import Failed, State

from data_contracts import suites
from data_contracts.gx_run import GxRun
from data_contracts.project import build_docs
from flows.logs import api_without_tracebacks, consoles_outlive_their_reader, in_run_logging, log_path, run_logging
from tasks import admission, scheduler, settings
from tasks.artifacts import (
    StageProgress,
    emit_failed,
    emit_if_budget_low,
    emit_published,
    publish_artifacts,
    record_lineage,
)
from tasks.contracts import check_contract, gx_run
from tasks.errors import Refused, StageFailed
from tasks.ingest import ingest
from tasks.kinds import kind_of
from tasks.ledger import configured_ledger
from tasks.manifest import adopt_public, complete_publication, publish_release
from tasks.params import MAX_WEIGHT
from tasks.partitions import dask_client
from tasks.progress import stage_listener
from tasks.reconcile import after_publication
from tasks.report import write_report
from tasks.resume import forget, reusable, stage_key, stamp
from tasks.retry import INTERNAL_LOG, ours
from tasks.run import RunPaths, StageOutput, discard_failed, open_run
from tasks.spec import ReleaseSpec
from tasks.stages import evaluate, measure, postprocess, prepare
from tasks.storage.catalogue import release_location, table_location
from tasks.transient import riding_out

Period = Literal["daily", "weekly", "monthly"]
#: The status of a test-mode run: it made its products, and nothing was published.
TEST_RUN = "made in test mode (seeded noise, not private, not published)"


def import_stage_libraries() -> None:
    """Import what the stages import on first use, distributed (~1 s on 2 cores) and great-expectations (3.6 s:
    scipy.stats, altair, its SQL layer), so that the CLI loads them while its temporary API server boots rather
    than after (measured: deferring great-expectations to the first contract check put its import after the
    server's boot instead of beside it; importing it on a thread meanwhile failed a release, pandas half-initialised
    under the flow's own import of dask.dataframe). matplotlib is left to the evaluation's plots."""
    import distributed  # noqa: F401
    import great_expectations  # noqa: F401


#: A hung stage (a lost dask worker, a stuck file system) must not hang the nightly schedule: the flow run
#: fails after this long (the operator's `flow_timeout_seconds`, default 6 hours) and the next run of the same
#: release id resumes it. The flow is not retried by Prefect: Prefect cannot tell a refused input or budget (which
#: would fail again) from a transient error, so retries are on the tasks that are safe to retry.
FLOW_TIMEOUT_SECONDS = settings.current().flow_timeout_seconds


def period_key(start: datetime, period: Period) -> str:
    """The period a scheduled start falls in (UTC): 20261120, 2026W47, 202611."""
    start = start.astimezone(timezone.utc)
    if period == "daily":
        return f"{start:%Y%m%d}"
    if period == "weekly":
        year, week, _ = start.isocalendar()
        return f"{year}W{week:02d}"
    return f"{start:%Y%m}"


def default_release_id(dataset_id: str, kind: str, period: Period | None) -> str:
    """A scheduled release is <dataset>-<kind>-<period of its scheduled start>: every run of one period (a backlog
    of missed runs, a manual retry after midnight, two runs started at once) is the same release id, which the
    ledger draws once; the kind keeps apart the deployments of one dataset (one data source is one dataset id).
    Other runs: <dataset>-<scheduled start>-<flow run id prefix>, both fixed when the flow run is created, so
    stable under Prefect's retries of the same flow run."""
    start = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    if period is not None:
        return f"{dataset_id}-{kind}-{period_key(start, period)}"
    return f"{dataset_id}-{start.astimezone(timezone.utc):%Y%m%dT%H%M%S}-{str(flow_run.get_id() or 'local')[:8]}"


def admitted(spec: ReleaseSpec | dict | None, spec_file: str | None, release_id: str | None,
             period: Period | None) -> tuple[ReleaseSpec, str, list]:
    """The flow's parameters -> (spec, release id, the identity of the data admitted), through the same admission
    rules as the CLI, in the same order (`tasks.admission`): a flow run that a Prefect worker started meets exactly
    the CLI's checks."""
    if (spec is None) == (spec_file is None):
        raise Refused("give exactly one of `spec` and `spec_file`")
    if flow_run.get_id() is not None:
        admission.admit_flow_run(_job_variables())
    if spec_file is not None:
        data, source = admission.admit_file(spec_file, flow_run=flow_run.get_id() is not None), spec_file
    else:
        data, source = (spec.model_dump() if isinstance(spec, ReleaseSpec) else spec), "the spec parameter"
    if release_id is not None:
        data = {**data, "release_id": release_id}
    spec = admission.admit_spec(data, source=source)
    _of_the_deployments_dataset(spec, source)
    release_id = spec.release_id or default_release_id(spec.dataset.id, spec.release.kind, period)
    spec = spec.model_copy(update={"release_id": release_id})
    admitted = admission.admit_run(spec, release_id)
    return spec, release_id, admitted.source


def _of_the_deployments_dataset(spec: ReleaseSpec, source: str) -> None:
    """A flow run whose deployment is tagged `dataset:X` releases dataset X only: a spec naming another dataset ran
    tagged with both (filters, automations and concurrency limits keyed on the tag acted on the wrong dataset).
    Refused before anything is read or charged."""
    tagged = sorted(t.split(":", 1)[1] for t in flow_run.get_tags() if t.startswith("dataset:"))
    if tagged and spec.dataset.id not in tagged:
        raise Refused(f"{source} releases dataset '{spec.dataset.id}', but this run is tagged "
                      f"{', '.join('dataset:' + t for t in tagged)} (its deployment's dataset): run the spec from a "
                      f"deployment of its dataset, or correct the deployment's tags")


def _job_variables() -> dict:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run.get_id()).job_variables or {}


def _run_name() -> str:
    """The flow run is named after its release id (the UI's run list reads as the release history): the spec file
    is read only where the admission lets a flow run read one, and nothing else is checked here (the body refuses,
    with its message)."""
    params = flow_run.get_parameters()
    if params.get("release_id"):
        return str(params["release_id"])
    try:
        spec = params.get("spec")
        data = admission.admit_file(params["spec_file"], flow_run=True) if spec is None else \
            (spec.model_dump() if isinstance(spec, ReleaseSpec) else spec)
        return str(data.get("release_id") or
                   default_release_id(data["dataset"]["id"], data["release"]["kind"], params.get("period")))
    except Exception:  # the name must not fail the run
        return "release-invalid-spec"


@contextmanager
def _owner_only():
    """Everything the run writes (internal/ holds a copy of the raw data) is readable by its owner only, whatever
    the process's umask (an audit read internal/ingested/ as another local user): release/ is published by
    copying it, not by its mode."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def _tag_run(spec: ReleaseSpec) -> None:
    """Tags `dataset:<id>` and `kind:<kind>` on the flow run, for filters and automations."""
    run_id = flow_run.get_id()
    if run_id is None:
        return
    tags = sorted(set(flow_run.get_tags()) | {f"dataset:{spec.dataset.id}", f"kind:{spec.release.kind}"})
    with get_client(sync_client=True) as client:
        client.update_flow_run(run_id, tags=tags)


class _Timer:
    """Stage timings; logs a marker when each stage starts (operators, and the fault tests, follow them) and
    moves the run's progress artifact when it ends."""

    def __init__(self, log, progress: StageProgress):
        self.log = log
        self.progress = progress
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        """The stage's progress bars (tasks/progress.py) also move the flow's progress artifact within it."""
        self.log.info("stage '%s' started", name)
        start = time.perf_counter()
        with stage_listener(lambda fraction: self.progress.within(name, fraction)):
            yield
        self.seconds[name] = round(time.perf_counter() - start, 3)
        self.progress.done(name)


@flow(name="release", flow_run_name=_run_name, timeout_seconds=FLOW_TIMEOUT_SECONDS)
def release(spec: ReleaseSpec | None = None, spec_file: str | None = None, release_id: str | None = None,
            period: Period | None = None) -> dict:
    """Make one DP release; returns a summary (paths, privacy spend; nothing raw-derived).

    Rerunning a release id resumes it: validated ingest and prepare outputs and stored measurements are reused, the
    ledger is not charged again; a published release is left as it is (a missing evaluation and report are made).
    Where outputs go is the spec's `output_dir`, not a flow parameter; the ledger is the machine's. Prefect shows
    the descriptions below beside the parameters in the UI (deployment runs, custom runs).

    Args:
        spec: The release spec itself (the CLI passes it). Give this or `spec_file`, not both.
        spec_file: Path of a release spec file (YAML or JSON) inside the operator's spec folders
            (DPRELEASE_SPEC_FOLDERS; default the checkout's deployments/specs); relative to the deployment's
            working directory. What deployments pass.
        release_id: The release id: resumes that release, or names a new one. Default: <dataset>-<kind>-<period
            of the scheduled start> with a `period`, else <dataset>-<scheduled start>-<flow run id>.
        period: daily, weekly or monthly, matching the deployment's schedule: every run of one period is one
            release id, drawn and charged once (a backlog of missed runs, a manual retry after midnight).
    """
    log = get_run_logger()
    if flow_run.get_id() is not None and not in_run_logging():  # a worker's process: the UI gets no traceback,
        api_without_tracebacks()  # and a worker killed alone does not end the run with the pipe it read
        consoles_outlive_their_reader()
    try:
        spec, release_id, source = admitted(spec, spec_file, release_id, period)
    except Exception as exc:  # refused before anything ran: a Failed state with its one line, no traceback
        return _failed(_ours(exc, "the release's admission"))
    _tag_run(spec)
    # Started by a Prefect worker, not the CLI: the same split of the logs (library records and tracebacks to the
    # run's internal log file only, never the worker's console or Prefect's API).
    with _owner_only(), (nullcontext() if in_run_logging() else
                         run_logging(log_path(spec.output_dir, release_id), configure=False)), riding_out():
        try:
            return _release(spec, release_id, log, period, source)
        except Exception as exc:
            exc = _ours(exc, "the release flow")
            emit_failed(release_id, spec.dataset.id, spec.release.kind, str(exc))
            return _failed(exc)


def _ours(exc: Exception, where: str) -> Exception:
    """The exception, or, for a text the pipeline did not write (it may quote raw values), its type only: the
    traceback goes to the internal log."""
    if ours(exc):
        return exc
    INTERNAL_LOG.error("%s failed", where, exc_info=exc)
    return StageFailed(f"{type(exc).__name__} in {where} (details in the run's internal log)")


def _failed(exc: Exception) -> State:
    """The flow run's final state for a failure: Failed, its message the exception's one line (Prefect then logs
    no traceback of it), and the exception itself as its data, which a caller of the flow gets raised."""
    return Failed(message=" ".join(str(exc).split()), data=exc)


def _release(spec: ReleaseSpec, release_id: str, log, period: str | None = None, source: list | None = None) -> dict:
    output_dir = Path(spec.output_dir).resolve()  # every path a log line names is absolute
    created = not (output_dir / release_id).exists()
    run = open_run(output_dir, release_id, test=spec.test_mode)
    run.clear_stale_staging()
    published = adopt_public(spec, release_id, run)
    if published:  # a public copy, a catalogue row or the ledger's `published` a failure left undone
        complete_publication(spec, release_id, run, json.loads(run.manifest.read_text()))
    if published and (run.internal / "report.md").exists():
        log.info("release %s is already published at %s; nothing to do", release_id, run.release)
        return _summary(spec, release_id, run, json.loads(run.manifest.read_text()), {}, "already published")
    log.info("release %s (%s on dataset '%s') -> %s", release_id, spec.release.kind, spec.dataset.id, run.root)
    timer = _Timer(log, StageProgress(_stage_names(spec, published)))
    gx = gx_run(spec.dataset.id, spec.release.kind, release_id, output_dir)
    try:
        with _cluster(spec, run, log):
            manifest, evaluation = _stages(spec, release_id, run, timer, published, gx, period, source or [])
    except BaseException:
        log.error("release %s failed: %s", release_id, discard_failed(run, created))
        raise
    finally:
        _data_docs(gx, log)
    (run.internal / "timings.json").write_text(json.dumps(timer.seconds, indent=2))
    summary = _summary(spec, release_id, run, manifest, timer.seconds, "already published" if published else
                       TEST_RUN if spec.test_mode else "published")
    (run.internal / "summary.json").write_text(json.dumps(summary, indent=2))
    summary["report"] = str(write_report(spec, release_id, run, manifest, evaluation, timer.seconds))
    if not spec.test_mode:  # raw-derived scratch: removed once published (the operator's scratch_keep_days)
        INTERNAL_LOG.info("stage outputs removed: %s", after_publication(configured_ledger(), release_id,
                                                                           spec.dataset.id, run) or "none")
    log.info("data docs of the contracts: %s (internal)", gx.index)
    summary["data_docs"] = str(gx.index)  # the report links the dataset's contract history
    _announce(spec, summary, manifest, run, evaluation, published)
    return summary


@contextmanager
def _cluster(spec: ReleaseSpec, run: RunPaths, log):
    """The run's dask client; a local cluster's workers spill into internal/dask-scratch/ (owner-only, removed when
    the cluster closes, before a failed run's internal/ goes to quarantine); with the operator's
    `performance_report: on`, dask's performance report of the stages into internal/."""
    scratch = run.internal / "dask-scratch"
    try:
        with dask_client(spec.dask, scratch=scratch) as client:
            # The address to the internal log only: the Prefect API is readable by whoever can open the UI.
            choice = scheduler.chosen()
            log.info("dask scheduler: %s; TLS: %s", choice.source, choice.tls_source)
            dashboard = client.dashboard_link if choice.address or settings.current().dask_dashboard else "off"
            INTERNAL_LOG.info("dask scheduler %s, dashboard %s", client.scheduler.address, dashboard)
            if not settings.current().performance_report:
                yield client
                return
            from distributed import performance_report

            report = run.internal / "dask-performance-report.html"
            try:
                with performance_report(filename=str(report), mode="inline"):  # inline: readable offline
                    yield client
            finally:
                log.info("dask performance report: %s (internal)", report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _data_docs(gx: GxRun, log) -> None:
    """The Data Docs of the release's contract results, passed or failed; a failure to build them fails no release
    (the results are stored: the next build shows them)."""
    try:
        build_docs(gx)
    except Exception as exc:  # great-expectations' text may quote a stored value: the type only, to the UI
        INTERNAL_LOG.warning("data docs not built", exc_info=True)
        log.warning("the Data Docs were not updated (%s; see the run's log)", type(exc).__name__)


def _announce(spec, summary, manifest, run, evaluation, published: bool) -> None:
    """Artifacts for the UI, and the events automations react to."""
    rows = [] if spec.test_mode else configured_ledger().releases(spec.dataset.id)
    publish_artifacts(summary, manifest, run.internal / "contracts", rows,
                      evaluation["headline"] if evaluation else None)
    if not published and not spec.test_mode:  # automations publish downstream on this event
        emit_published(summary)
        record_lineage(manifest, table_location(spec.output_dir, spec.dataset.id, spec.release.kind),
                       summary["published_at"], spec.dataset.path)
    emit_if_budget_low(summary)


def _stage_names(spec: ReleaseSpec, published: bool) -> list[str]:
    prepared = kind_of(spec).prepared_stage
    names = ["ingest"] + ([prepared] if prepared else [])
    names += [] if published else ["dp measurement", "postprocess", "publish"]
    return names + (["evaluate"] if spec.evaluate else [])


def _validated(stage: str, key: str, run: RunPaths, make, contract, gx: GxRun) -> StageOutput:
    """A stage's output: reused if this run folder holds one made under the same key (tasks/resume.py), else
    made and validated against its contract, then stamped."""
    output = reusable(run.internal, stage, key)
    if output is not None:
        get_run_logger().info("stage '%s': reusing the validated output of an earlier attempt", stage)
        return output
    forget(run.internal, stage)
    output = make()
    check_contract(stage, output.path, contract, run.internal / "contracts", gx)
    stamp(run.internal, stage, key, output)
    return output


def _stages(spec: ReleaseSpec, release_id: str, run: RunPaths, timer: _Timer, published: bool, gx: GxRun,
            period: str | None, source: list):
    kind = kind_of(spec)
    ds = spec.dataset
    contracts_dir = run.internal / "contracts"
    with timer.stage("ingest"):
        ingest_key = stage_key("ingested", spec)
        contract = (suites.ingested_sets(ds.items_column, ds.item_count) if ds.items_column else
                    suites.ingested(list(ds.bounds or {}) + list(ds.numeric or []),
                                    {**(ds.categories or {}), **dict.fromkeys(ds.user_columns, [])}, ds.weight_column,
                                    MAX_WEIGHT if ds.weights_count_records else None))
        prepared = _validated("ingested", ingest_key, run,
                              lambda: ingest(ds, run.stage("ingested"), run.internal, source), contract, gx)
    if kind.prepared_stage is not None:
        ingested = prepared
        with timer.stage(kind.prepared_stage):
            prepared = _validated(kind.prepared_stage, stage_key(kind.prepared_stage, spec, ingest_key), run,
                                  lambda: prepare(spec, ingested, run), kind.prepared_contract, gx)
    if published:
        manifest = json.loads(run.manifest.read_text())
    else:
        with timer.stage("dp measurement"):
            measured = measure(spec, release_id, run, prepared)
            name, contract = kind.measurements_contract
            check_contract("measurements", f"{measured.path}/{name}", contract, contracts_dir, gx)
        with timer.stage("postprocess"):
            staging = run.new_staging()
            postprocess(spec, measured, staging, run)
            name, contract = kind.release_contract
            check_contract("release", staging / name, contract, contracts_dir, gx, recorded_as=run.release / name)
        with timer.stage("publish"):
            manifest = publish_release(spec, release_id, run, staging, measured, period)
    evaluation = None
    if spec.evaluate:
        with timer.stage("evaluate"):
            evaluation = evaluate(spec, run, prepared)
    return manifest, evaluation


def _summary(spec, release_id, run, manifest, timings, status) -> dict:
    """What the flow returns (and Prefect may keep): paths and the privacy spend, nothing raw-derived; the
    evaluation's figures stay in internal/evaluation/evaluation.json."""
    privacy = manifest["privacy"]
    return {"status": status, "release_id": release_id, "dataset_id": spec.dataset.id,
            "kind": spec.release.kind, "release_dir": str(run.release), "internal_dir": str(run.internal),
            "published_at": None if spec.test_mode else
            release_location(spec.output_dir, spec.dataset.id, spec.release.kind, release_id),
            "epsilon": privacy["epsilon"], "delta": privacy["delta"], "accounting": privacy["accounting"],
            "private": privacy["private"], "dataset_budget": privacy.get("dataset_budget"),
            "caveats": manifest.get("caveats", []),
            "evaluation": str(run.internal / "evaluation" / "evaluation.json") if spec.evaluate else None,
            "timings": timings}
