"""The `release` flow: ingest -> prepare -> DP measurement -> postprocessing -> publish -> evaluation -> report,
with a data contract between every two stages (DESIGN.md, "The data path of one release")."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from data_contracts import suites
from tasks.contracts import check_contract
from tasks.errors import ReleaseConflict, ReleaseError
from tasks.ingest import ingest
from tasks.kinds import kind_of
from tasks.ledger import require_budget
from tasks.manifest import publish_release
from tasks.partitions import dask_client
from tasks.report import write_report
from tasks.run import RunPaths, discard_failed, open_run, read_meta
from tasks.spec import ReleaseSpec, load_spec
from tasks.stages import evaluate, measure, postprocess, prepare


Period = Literal["daily", "weekly", "monthly"]


def period_key(start: datetime, period: Period) -> str:
    """The period a scheduled start falls in (UTC): 20261120, 2026W47, 202611."""
    start = start.astimezone(timezone.utc)
    if period == "daily":
        return f"{start:%Y%m%d}"
    if period == "weekly":
        year, week, _ = start.isocalendar()
        return f"{year}W{week:02d}"
    return f"{start:%Y%m}"


def default_release_id(spec: ReleaseSpec, period: Period | None) -> str:
    """A scheduled release is <dataset>-<period of its scheduled start>: every run of one period (a backlog of
    missed runs, a manual retry after midnight, two runs started at once) is the same release id, which the
    ledger draws once. Other runs: <dataset>-<scheduled start>-<flow run id prefix>, both fixed when the flow
    run is created, so stable under Prefect's retries of the same flow run."""
    start = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    if period is not None:
        return f"{spec.dataset.id}-{period_key(start, period)}"
    return f"{spec.dataset.id}-{start.astimezone(timezone.utc):%Y%m%dT%H%M%S}-{str(flow_run.get_id() or 'local')[:8]}"


def _run_name() -> str:
    params = flow_run.get_parameters()
    spec = params.get("spec")
    if spec is not None:
        return f"{spec.dataset.id}-{spec.release.kind}" if isinstance(spec, ReleaseSpec) else "release"
    return f"release-{str(params.get('spec_file', '')).rsplit('/', 1)[-1].removesuffix('.yaml')}"


class _Timer:
    """Stage timings; logs a marker when each stage starts (operators, and the fault tests, follow them)."""

    def __init__(self, log):
        self.log = log
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        self.log.info("stage '%s' started", name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)


@flow(name="release", flow_run_name=_run_name)
def release(spec: ReleaseSpec | None = None, spec_file: str | None = None, release_id: str | None = None,
            period: Period | None = None) -> dict:
    """Make one DP release; returns a summary (paths, privacy spend, evaluation).

    Give the spec itself (`spec`) or the path of a spec file (`spec_file`, what deployments pass); `release_id`
    overrides the spec's; `period` (deployments: daily / weekly / monthly, matching the schedule) makes the
    default release id the dataset and the period of the scheduled start. Rerunning a release id resumes it:
    stored measurements are reused and the ledger is not charged again; a published release is left as it is.
    Where outputs go is the spec's `output_dir`, not a flow parameter; the ledger is the machine's.
    """
    log = get_run_logger()
    if (spec is None) == (spec_file is None):
        raise ReleaseError("give exactly one of `spec` and `spec_file`")
    if spec is None:
        spec = load_spec(spec_file)
    if release_id is not None:
        spec = spec.model_copy(update={"release_id": release_id})
    release_id = spec.release_id or default_release_id(spec, period)
    if not spec.test_mode:
        require_budget(spec.dataset.id)  # before anything runs or is written
    created = not (Path(spec.output_dir) / release_id).exists()
    run = open_run(spec.output_dir, release_id, test=spec.test_mode)
    if run.published():
        if read_meta(run.measurements)["fingerprint"] != spec.fingerprint():
            raise ReleaseConflict(f"release id '{release_id}' is published at {run.release} with other data or "
                                  f"parameters; choose a new release id")
        log.info("release %s is already published at %s; nothing to do", release_id, run.release)
        return _summary(spec, release_id, run, json.loads(run.manifest.read_text()), {}, "already published")
    log.info("release %s (%s on dataset '%s') -> %s", release_id, spec.release.kind, spec.dataset.id, run.root)
    timer = _Timer(log)
    try:
        with dask_client(spec.dask) as client:
            log.info("dask scheduler: %s", client.scheduler.address)
            manifest, evaluation = _stages(spec, release_id, run, timer)
    except BaseException:
        log.error("release %s failed: %s", release_id, discard_failed(run, created))
        raise
    (run.internal / "timings.json").write_text(json.dumps(timer.seconds, indent=2))
    summary = _summary(spec, release_id, run, manifest, timer.seconds, "published")
    (run.internal / "summary.json").write_text(json.dumps(summary, indent=2))
    summary["report"] = str(write_report(spec, release_id, run, manifest, evaluation, timer.seconds))
    return summary


def _stages(spec: ReleaseSpec, release_id: str, run: RunPaths, timer: _Timer):
    kind = kind_of(spec)
    ds = spec.dataset
    contracts_dir = run.internal / "contracts"
    with timer.stage("ingest"):
        ingested = ingest(ds, run.internal / "ingested")
        contract = (suites.ingested_sets(ds.items_column, ds.item_count) if ds.items_column else
                    suites.ingested(list(ds.bounds or {}) + list(ds.numeric or []), ds.categories, ds.weight_column))
        check_contract("ingested", ingested.path, contract, contracts_dir)
    prepared = ingested
    if kind.prepared_stage is not None:
        with timer.stage(kind.prepared_stage):
            prepared = prepare(spec, ingested, run)
            check_contract(kind.prepared_stage, prepared.path, kind.prepared_contract(spec), contracts_dir)
    with timer.stage("dp measurement"):
        measured = measure(spec, release_id, run, prepared)
        name, contract = kind.measurements_contract(spec)
        check_contract("measurements", f"{measured.path}/{name}", contract, contracts_dir)
    with timer.stage("postprocess"):
        staging = run.new_staging()
        postprocess(spec, measured, staging, run)
        name, contract = kind.release_contract(spec)
        check_contract("release", staging / name, contract, contracts_dir)
    with timer.stage("publish"):
        manifest = publish_release(spec, release_id, run, staging, measured)
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
            "epsilon": privacy["epsilon"], "delta": privacy["delta"], "accounting": privacy["accounting"],
            "private": privacy["private"], "dataset_budget": privacy.get("dataset_budget"),
            "evaluation": str(run.internal / "evaluation" / "evaluation.json") if spec.evaluate else None,
            "timings": timings}
