"""The contract task: validate a stage output before the next stage may start."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from data_contracts.suites import Contract
from data_contracts.validate import ContractViolation, failure_report, validate_parquet
from tasks.partitions import current_client
from tasks.retry import sanitised


@task(name="contract", task_run_name="contract-{stage}", cache_policy=NO_CACHE, persist_result=False)
@sanitised
def check_contract(stage: str, path: str | Path, contract: Contract, report_dir: Path,
                   recorded_as: str | Path | None = None) -> dict:
    """Validate `path` against `contract`, partitions on the dask workers, the table through the stage's
    great-expectations Checkpoint in the run's project (`report_dir`'s parent, data_contracts/project.py); the
    report goes to `report_dir`/<stage>.json (internal), naming `recorded_as` when the validated copy is a
    staging folder that is about to move (the release).

    Raises ContractViolation (naming stage, column and expectation) when an expectation fails.
    """
    log = get_run_logger()
    report_dir.mkdir(parents=True, exist_ok=True)
    n = len(contract.rows) + len(contract.table)
    try:
        report = validate_parquet(path, contract, project=report_dir.parent, client=current_client())
    except ContractViolation as exc:
        (report_dir / f"{stage}.json").write_text(json.dumps({**failure_report(exc), "expectations": n}, indent=2,
                                                             default=str))
        raise
    report = {**report, "path": str(recorded_as or path), "expectations": n}
    (report_dir / f"{stage}.json").write_text(json.dumps(report, indent=2, default=str))
    log.info("contract '%s': %d expectations passed", stage, n)
    return {"stage": stage, "expectations": n, "rows": report["rows"], "files": report["files"], "success": True}
