"""Validate a Parquet stage output (one file or a folder of partitions) against its `Contract`."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from data_contracts.suites import Contract

if TYPE_CHECKING:  # pandas and pyarrow load on the first validation, not with the contracts (see `_read`)
    import pandas as pd


@dataclass(frozen=True)
class Failure:
    """One failed expectation. `file` and `detail` (e.g. how many rows break it) are raw-derived: they go to the
    internal report only; the text of a failure, which reaches logs and Prefect states, names column and
    expectation. (Files and counts would be a free query: a spec chooses the levels or bounds it checks.)"""
    stage: str
    file: str
    column: str | None
    expectation: str
    detail: str

    def __str__(self) -> str:
        where = f"column '{self.column}'" if self.column else "table"
        return f"{where}: {self.expectation} failed"


class ContractViolation(Exception):
    """A stage output broke its data contract; the message names the stage, column and expectation."""

    def __init__(self, stage: str, failures: list[Failure]):
        self.stage = stage
        self.failures = failures
        # Which files and how many break an expectation stay in the internal report: a spec chooses the levels
        # or bounds it checks, so where and how often they fail would be a free query on the data.
        shown = "\n  ".join(dict.fromkeys(str(f) for f in failures))
        super().__init__(f"stage '{stage}' broke its data contract (details in the internal contract report):"
                         f"\n  {shown}")


@functools.lru_cache(maxsize=1)
def _batch_definition():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    return ctx.data_sources.add_pandas("stage").add_dataframe_asset("frame").add_batch_definition_whole_dataframe("whole")


def parquet_files(path: str | Path) -> list[str]:
    """The Parquet files of an output, a local path or a store's URL (the stages' outputs live in the operator's
    scratch location, which may be a bucket): the file itself, or a folder's *.parquet in partition order."""
    location = str(path)
    if "://" not in location or location.startswith("file://"):
        local = Path(location.removeprefix("file://"))
        if local.is_dir():
            found = [str(f) for f in local.glob("*.parquet")]
        elif local.exists():
            return [str(local)]
        else:
            raise FileNotFoundError(f"{local} does not exist")
    else:
        import fsspec

        fs, root = fsspec.core.url_to_fs(location)
        if not fs.isdir(root):
            if not fs.exists(root):
                raise FileNotFoundError(f"{location} does not exist")
            return [location]
        scheme = location.split("://", 1)[0]
        found = [f"{scheme}://{p}" for p in fs.glob(f"{root.rstrip('/')}/*.parquet")]
    if not found:
        raise FileNotFoundError(f"no Parquet files in {location}")
    return sorted(found, key=_partition_order)


def _partition_order(location: str):
    file = location.rstrip("/").rsplit("/", 1)[-1]
    digits = "".join(ch for ch in file.removesuffix(".parquet") if ch.isdigit())
    return (int(digits) if digits else -1, file)


def _filesystem(location: str):
    """(filesystem, path) for pyarrow: None and the path for a local file, an fsspec filesystem for a URL."""
    if "://" not in location or location.startswith("file://"):
        return None, location.removeprefix("file://")
    import fsspec

    return fsspec.core.url_to_fs(location)


def _describe(result) -> str:
    """What failed, without any value read off the data: the count of offending rows is the one number a
    failure may state (an observed value, e.g. a row count or a column's levels, would be raw-derived)."""
    r = result.result or {}
    if "unexpected_count" in r:
        return f"{r['unexpected_count']} rows break it"
    if (result.exception_info or {}).get("raised_exception"):
        return "expectation could not be evaluated"
    return "failed"


def _validate(frame: pd.DataFrame, expectations: list, contract: Contract, file: str) -> list[Failure]:
    import great_expectations as gx

    if not expectations:
        return []
    suite = gx.ExpectationSuite(name=f"{contract.stage}", expectations=list(expectations))
    res = _batch_definition().get_batch(batch_parameters={"dataframe": frame}).validate(
        suite, result_format={"result_format": "BASIC", "partial_unexpected_count": 0,
                              "include_unexpected_rows": False})
    return [Failure(contract.stage, file, r.expectation_config.kwargs.get("column"),
                    r.expectation_config.type, _describe(r))
            for r in res.results if not r.success]


def _read(f: str, contract: Contract) -> tuple[pd.DataFrame | None, list[Failure]]:
    import pyarrow.parquet as pq

    name = str(f).rstrip("/").rsplit("/", 1)[-1]
    try:
        fs, path = _filesystem(str(f))
        if contract.schema is not None and pq.read_schema(path, filesystem=fs).names != contract.schema:
            return None, [Failure(contract.stage, name, None, "expect_table_columns_to_match_ordered_list",
                                  f"expected {contract.schema!r}")]
        frame = pq.read_table(path, columns=contract.load_columns, filesystem=fs).to_pandas()
    except Exception as exc:  # a corrupt file is a contract failure of the stage that wrote it
        return None, [Failure(contract.stage, name, None, "readable_parquet", type(exc).__name__)]
    try:
        return (contract.derive(frame) if contract.derive is not None else frame), []
    except Exception as exc:  # a column of the wrong type breaks the derived checks: the stage's failure too
        return None, [Failure(contract.stage, name, None, "derivable_columns", type(exc).__name__)]


def validate_partition(f: str, contract: Contract) -> tuple[list[Failure], int]:
    """The row suite on one file, where the file is (a dask worker): its failures and its row count. Only
    these leave the worker, never a row."""
    frame, failures = _read(f, contract)
    if frame is None:
        return failures, 0
    return _validate(frame, contract.rows, contract, str(f).rstrip("/").rsplit("/", 1)[-1]), len(frame)


def _partitions(files: list[str], contract: Contract, client) -> list[tuple[list[Failure], int]]:
    if client is None:
        return [validate_partition(f, contract) for f in files]
    return client.gather(client.map(validate_partition, files, contract=contract, pure=False))


def validate_parquet(path: str | Path, contract: Contract, project: Path | None = None, client=None) -> dict:
    """Validate `path` against `contract`: for partitioned outputs the row suite on every file (on the dask
    workers of `client` when given), then the table-level suite on the aggregates; small outputs whole.

    The table-level validation (the whole table for small outputs) runs through the stage's Checkpoint in
    the great-expectations project at `project` (data_contracts/project.py), which keeps the suite, the
    Validation Definition, the result and the Data Docs there. Returns a JSON-able report; raises
    ContractViolation listing every failed expectation.
    """
    import pandas as pd

    files = parquet_files(path)
    failures: list[Failure] = []
    if contract.partitioned:
        results = _partitions(files, contract, client)
        failures += [f for fs, _ in results for f in fs]
        row_count = sum(n for _, n in results)
        table, expectations = pd.DataFrame({"row_count": [row_count]}), contract.table
    else:
        frames = []
        for f in files:
            frame, bad = _read(f, contract)
            failures += bad
            frames += [] if frame is None else [frame]
        table = pd.concat(frames, ignore_index=True) if frames else None
        row_count = 0 if table is None else len(table)
        expectations = contract.rows + contract.table
    if table is not None:
        failures += _validate_table(table, expectations, contract, Path(path).name, project)
    if failures:
        raise ContractViolation(contract.stage, failures)
    return {"stage": contract.stage, "path": str(path), "files": len(files), "rows": row_count,
            "success": True, "suites": contract.suites()}


def _validate_table(frame: pd.DataFrame, expectations: list, contract: Contract, name: str,
                    project: Path | None) -> list[Failure]:
    if project is None or not expectations:
        return _validate(frame, expectations, contract, name)
    from data_contracts.project import run_checkpoint

    results = run_checkpoint(project, contract.stage, expectations, frame)
    return [Failure(contract.stage, name, r.expectation_config.kwargs.get("column"), r.expectation_config.type,
                    _describe(r)) for r in results if not r.success]


def failure_report(error: ContractViolation) -> dict:
    return {"stage": error.stage, "success": False, "failures": [asdict(f) for f in error.failures]}
