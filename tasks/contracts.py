"""The contract task: validate a stage output before the next stage may start, and record the result in the
dataset's great-expectations project (data_contracts/project.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from data_contracts.gx_run import GxRun
from data_contracts.suites import Contract
from data_contracts.validate import ContractViolation, failure_report, validate_parquet
from tasks import settings, storage
from tasks.partitions import current_client
from tasks.progress import Progress
from tasks.retry import sanitised


def gx_run(dataset_id: str, kind: str, release_id: str, output_dir: str | Path) -> GxRun:
    """Where a release records its contracts: the dataset's project, one per dataset id, the release id as run name,
    in `gx_location`. On a store, the project's stores and Data Docs are at `<location>/<dataset id>` and this host
    keeps only the project's config, in `<output_dir>/.gx/` (a folder per store URL)."""
    base = gx_location()
    if base is None:
        return GxRun(Path(output_dir).resolve() / ".gx" / dataset_id, dataset_id, kind, release_id)
    if not storage.is_url(base):
        return GxRun(Path(base).resolve() / dataset_id, dataset_id, kind, release_id)
    store = storage.join(base, dataset_id)
    config = Path(output_dir).resolve() / ".gx" / f"{dataset_id}-{hashlib.sha256(store.encode()).hexdigest()[:8]}"
    return GxRun(config, dataset_id, kind, release_id, store)


def gx_location() -> str | None:
    """The operator's `gx_folder` (a folder or a store's URL); unset, with the output and the scratch on stores (the
    workers share no disk), `<scratch>/.gx`: private, as the results' counts are raw-derived, and one history
    whichever host ran the release; else None (`<output_dir>/.gx`, beside the runs)."""
    current = settings.current()
    if current.gx_folder is not None:
        return current.gx_folder
    if current.output and current.scratch and storage.is_url(current.output) and storage.is_url(current.scratch):
        return storage.join(current.scratch, ".gx")
    return None


@task(name="contract", task_run_name="contract-{stage}", cache_policy=NO_CACHE, persist_result=False)
@sanitised
def check_contract(stage: str, path: str | Path, contract: Contract, report_dir: Path, gx: GxRun | None = None,
                   recorded_as: str | Path | None = None) -> dict:
    """Validate `path` against `contract`, partitions on the dask workers, and record the result (passed or failed)
    in the dataset's great-expectations project `gx`, whose Data Docs it updates; the report goes to
    `report_dir`/<stage>.json (internal), naming `recorded_as` when the validated copy is a staging folder that is
    about to move (the release).

    Raises ContractViolation (naming stage, column and expectation) when an expectation fails.
    """
    log = get_run_logger()
    report_dir.mkdir(parents=True, exist_ok=True)
    n = len(contract.rows) + len(contract.table)
    bar = Progress(log, f"partitions of '{stage}' validated", 1, stage=False)

    def on_partition(done: int, total: int) -> None:
        bar.total = total
        bar.update(done)
    try:
        report = validate_parquet(path, contract, gx=gx, client=current_client(), on_partition=on_partition)
    except ContractViolation as exc:
        (report_dir / f"{stage}.json").write_text(json.dumps({**failure_report(exc), "expectations": n}, indent=2,
                                                             default=str))
        if gx is not None:
            log.info("contract '%s': its Data Docs are at %s (internal)", stage, gx.index)
        raise
    report = {**report, "path": str(recorded_as or path), "expectations": n}
    (report_dir / f"{stage}.json").write_text(json.dumps(report, indent=2, default=str))
    log.info("contract '%s': %d expectations passed", stage, n)
    return {"stage": stage, "expectations": n, "rows": report["rows"], "files": report["files"], "success": True}
