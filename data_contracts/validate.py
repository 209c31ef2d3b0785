"""Validate a Parquet stage output (one file or a folder of partitions) against its `Contract`."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from data_contracts.suites import Contract

if TYPE_CHECKING:  # pandas and pyarrow load on the first validation, not with the contracts (see `_read`)
    import pandas as pd

    from data_contracts.project import GxRun

#: The result format of every validation: counts, never row values (a failure's text reaches logs and states).
RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 0, "include_unexpected_rows": False}


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

    no_fingerprint()
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas("stage").add_dataframe_asset("frame")
    return asset.add_batch_definition_whole_dataframe("whole")


def no_fingerprint() -> None:
    """great-expectations hashes every frame under 1 GB it validates into the result's batch markers (a fingerprint of
    the rows, which `data_contracts.project` dropped before storing a merged result): most of a row suite's time on a
    partition of floats (measured 2026-11-29, tests/benchmarks/scan_ratio.py). A threshold of 0 skips the hash, for
    every result (no stored result holds one); if a great-expectations release renames the constant, nothing
    breaks: the hash is computed again and dropped from merged results as before."""
    from great_expectations.execution_engine import pandas_execution_engine as engine

    if hasattr(engine, "HASH_THRESHOLD"):
        engine.HASH_THRESHOLD = 0


def _widened(frame: pd.DataFrame) -> pd.DataFrame:
    """Integer columns narrower than 64 bits as int64: great-expectations' pandas `ExpectColumnValuesToBeBetween`
    compares int64 and float64 columns as arrays, and any other dtype value by value in Python (an int32 bin index:
    550 ns a record against 5, measured 2026-11-29). Widening changes no value."""
    import numpy as np

    narrow = {c: "int64" for c, t in frame.dtypes.items()
              if isinstance(t, np.dtype) and t.kind in "iu" and t.itemsize < 8}
    return frame.astype(narrow) if narrow else frame


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


def _validate(frame: pd.DataFrame, expectations: list, contract: Contract, file: str) -> tuple[list[Failure], dict]:
    """The failures of `expectations` on `frame`, and the result as JSON without the data's fingerprint (a hash of
    the frame: the partitions' results are stored in the dataset's great-expectations project)."""
    import great_expectations as gx

    if not expectations:
        return [], {"success": True, "results": []}
    suite = gx.ExpectationSuite(name=f"{contract.stage}", expectations=list(expectations))
    res = _batch_definition().get_batch(batch_parameters={"dataframe": frame}).validate(suite,
                                                                                        result_format=RESULT_FORMAT)
    failures = [Failure(contract.stage, file, r.expectation_config.kwargs.get("column"), r.expectation_config.type,
                        _describe(r)) for r in res.results if not r.success]
    result = res.to_json_dict()
    result["meta"] = {k: v for k, v in result.get("meta", {}).items() if k != "batch_markers"}
    return failures, result


def _name(f: str) -> str:
    """A file's name, of a local path or a store's URL."""
    return str(f).rstrip("/").rsplit("/", 1)[-1]


def _read(f: str, contract: Contract) -> tuple[pd.DataFrame | None, list[Failure]]:
    import pyarrow.parquet as pq

    name = _name(f)
    try:
        fs, path = _filesystem(str(f))
        if contract.schema is not None and pq.read_schema(path, filesystem=fs).names != contract.schema:
            return None, [Failure(contract.stage, name, None, "expect_table_columns_to_match_ordered_list",
                                  f"expected {contract.schema!r}")]
        frame = _widened(pq.read_table(path, columns=contract.load_columns, filesystem=fs).to_pandas())
    except Exception as exc:  # a corrupt file is a contract failure of the stage that wrote it
        return None, [Failure(contract.stage, name, None, "readable_parquet", type(exc).__name__)]
    try:
        return (contract.derive(frame) if contract.derive is not None else frame), []
    except Exception as exc:  # a column of the wrong type breaks the derived checks: the stage's failure too
        return None, [Failure(contract.stage, name, None, "derivable_columns", type(exc).__name__)]


def validate_partition(f: str, contract: Contract) -> tuple[list[Failure], int, dict | None]:
    """The row suite on one file, where the file is (a dask worker): its failures, its row count and the result (safe
    format: counts, no row values; None when the file could not be read). Only these leave the worker, never a row."""
    frame, failures = _read(f, contract)
    if frame is None:
        return failures, 0, None
    failures, result = _validate(frame, contract.rows, contract, _name(f))
    return failures, len(frame), result


def _partitions(files: list[str], contract: Contract, client, on_partition) -> list[tuple[list[Failure], int, dict]]:
    if client is None:
        done = []
        for f in files:
            done.append(validate_partition(f, contract))
            on_partition(len(done), len(files))
        return done
    from distributed import as_completed

    futures = client.map(validate_partition, files, contract=contract, pure=False)
    for i, _ in enumerate(as_completed(futures), start=1):
        on_partition(i, len(files))
    return client.gather(futures)


def validate_parquet(path: str | Path, contract: Contract, gx: GxRun | None = None, client=None,
                     on_partition=lambda done, total: None) -> dict:
    """Validate `path` against `contract`: for partitioned outputs the row suite on every file (on the dask
    workers of `client` when given; `on_partition(done, total)` after each), then the table-level suite on the
    aggregates; small outputs whole.

    With `gx` (the release's names in its dataset's great-expectations project, data_contracts/project.py) the
    result is recorded there, passed or failed, and the Data Docs updated: small outputs through the contract's
    Checkpoint, partitioned ones as one merged result of the stage's suite. Returns a JSON-able report; raises
    ContractViolation listing every failed expectation.
    """
    import pandas as pd

    files = parquet_files(path)
    failures: list[Failure] = []
    if contract.partitioned:
        results = _partitions(files, contract, client, on_partition)
        failures += [f for fs, _, _ in results for f in fs]
        row_count = sum(n for _, n, _ in results)
        aggregates = pd.DataFrame({"row_count": [row_count]})
        if gx is not None:
            from data_contracts.project import PartitionResult, record_partitions

            parts = [PartitionResult(_name(f), n, r) for f, (_, n, r) in zip(files, results)]
            failures += _failures(record_partitions(gx, contract.stage, contract.rows, contract.table, parts,
                                                    aggregates), contract, Path(path).name)
        else:
            failures += _validate(aggregates, contract.table, contract, Path(path).name)[0]
    else:
        frames = []
        for f in files:
            frame, bad = _read(f, contract)
            failures += bad
            frames += [] if frame is None else [frame]
        table = pd.concat(frames, ignore_index=True) if frames else None
        row_count = 0 if table is None else len(table)
        if table is not None and gx is not None:
            from data_contracts.project import run_checkpoint

            failures += _failures(run_checkpoint(gx, contract.stage, contract.rows + contract.table, table), contract,
                                  Path(path).name)
        elif table is not None:
            failures += _validate(table, contract.rows + contract.table, contract, Path(path).name)[0]
    if failures:
        raise ContractViolation(contract.stage, failures)
    return {"stage": contract.stage, "path": str(path), "files": len(files), "rows": row_count,
            "success": True, "suites": contract.suites()}


def _failures(results: list, contract: Contract, name: str) -> list[Failure]:
    return [Failure(contract.stage, name, r.expectation_config.kwargs.get("column"), r.expectation_config.type,
                    _describe(r)) for r in results if not r.success]


def failure_report(error: ContractViolation) -> dict:
    return {"stage": error.stage, "success": False, "failures": [asdict(f) for f in error.failures]}
