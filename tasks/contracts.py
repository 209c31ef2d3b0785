"""The contract task: validate a stage output before the next stage may start, and record the result in the
dataset's great-expectations project (data_contracts/project.py)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from data_contracts.project import GxRun
from data_contracts.suites import Contract
from data_contracts.validate import ContractViolation, failure_report, validate_parquet
from tasks import settings
from tasks.partitions import current_client
from tasks.progress import Progress
from tasks.retry import sanitised


def gx_run(dataset_id: str, kind: str, release_id: str, output_dir: str | Path) -> GxRun:
    """Where a release records its contracts: the dataset's project in the operator's `gx_folder` (default
    <output_dir>/.gx), one per dataset id, the release id as run name."""
    base = settings.current().gx_folder or Path(output_dir) / ".gx"
    return GxRun(Path(base).resolve() / dataset_id, dataset_id, kind, release_id)


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
