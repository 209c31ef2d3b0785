"""Validate a Parquet stage output (one file or a folder of partitions) against its `Contract`."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from data_contracts.direct import Suite
from data_contracts.results import RESULT_FORMAT, merged_result, no_fingerprint, result_key
from data_contracts.suites import Contract

if TYPE_CHECKING:  # pandas and pyarrow load on the first validation, not with the contracts (see `_read`)
    import pandas as pd
    import pyarrow as pa

    from data_contracts.gx_run import GxRun




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


#: One great-expectations context per thread: a context's pandas execution engine keeps the frame it validates and
#: the metrics it computed under one batch id, the same for every frame of the asset, so two worker threads validating
#: at once read each other's frame (measured: a partition breaking its contract passed, a good one failed, in 9 of
#: 60 concurrent validations on 2 threads).
_PER_THREAD = threading.local()


def _batch_definition():
    if not hasattr(_PER_THREAD, "batch_definition"):
        _PER_THREAD.batch_definition = _new_batch_definition()
    return _PER_THREAD.batch_definition


def _new_batch_definition():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    no_fingerprint()
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas("stage").add_dataframe_asset("frame")
    return asset.add_batch_definition_whole_dataframe("whole")


def _widened(table: pa.Table) -> pa.Table:
    """Integer columns narrower than 64 bits as int64: great-expectations' pandas `ExpectColumnValuesToBeBetween`
    compares int64 and float64 columns as arrays, and any other dtype value by value in Python (an int32 bin index:
    550 ns a record against 5, measured 2026-11-29); `data_contracts.direct` decides int64 and float64 only. Widened
    in Arrow, before pandas (pandas' astype of a frame's columns cost 0.2 s on 200,000 rows of three columns under
    load). Widening changes no value."""
    import pyarrow as pa

    narrow = [i for i, f in enumerate(table.schema) if pa.types.is_integer(f.type) and f.type.bit_width < 64]
    for i in narrow:
        table = table.set_column(i, table.schema.field(i).name, table.column(i).cast(pa.int64()))
    return table


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


#: Bytes of a batch's values (8 a value) in per-partition work: a worker holds a batch per thread, not a partition,
#: whatever the partitions' size (a source of 10^8 records in 8 files made partitions of 12.5 million rows, and the
#: memory grew with the records). A step holds about 4 times its batch beside a fixed 130 MB. 8 MiB (a million values
#: of one column): the histogram release's peak memory 1.27 times from 10^7 to 10^8 records (1.42 with 16 MiB, 1.88
#: with 32), paid in great-expectations' fixed cost per validation (20 ms for 4 expectations: 20 ns a record; 140 ms
#: for the 14 of 2-d points; 2026-11-29, tests/benchmarks/scan_ratio.py, load 11 to 13).
BATCH_BYTES = 8 * 2 ** 20


def batch_rows(columns: int) -> int:
    return max(2 ** 16, BATCH_BYTES // (8 * max(1, columns)))


def read_batches(location: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """A Parquet file's rows (the given columns) as tables of at most `batch_rows` rows, in order (a local path or a
    store's URL); an empty file as one empty table of its schema. Row group by row group: pyarrow's batches over a
    whole file held about the file's column chunks (its memory pool's peak 118 MB reading a file of 12.5 million
    floats in batches of a million, 28 MB row group by row group; pyarrow 26, 2026-11-29), so a worker's memory grew
    with the partitions' size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, path = _filesystem(str(location))
    with (contextlib.nullcontext(path) if fs is None else fs.open(path, "rb")) as source:  # local: pyarrow's reader
        parquet = pq.ParquetFile(source)
        names = columns if columns is not None else parquet.schema_arrow.names
        empty = True
        for group in range(parquet.num_row_groups):  # one by one: see the docstring
            for batch in parquet.iter_batches(batch_size=batch_rows(len(names)), row_groups=[group], columns=columns):
                empty = False
                yield pa.Table.from_batches([batch])
        if empty:
            yield parquet.schema_arrow.empty_table().select(names)


def _filesystem(location: str):
    """(filesystem, path) for pyarrow: None and the path for a local file, an fsspec filesystem for a URL."""
    if "://" not in location or location.startswith("file://"):
        return None, location.removeprefix("file://")
    import fsspec

    return fsspec.core.url_to_fs(location)


def _describe(result) -> str:
    return _describe_json({"result": result.result, "exception_info": result.exception_info})


def _describe_json(result: dict) -> str:
    """What failed, without any value read off the data: the count of offending rows is the one number a
    failure may state (an observed value, e.g. a row count or a column's levels, would be raw-derived)."""
    r = result.get("result") or {}
    if "unexpected_count" in r:
        return f"{r['unexpected_count']} rows break it"
    if (result.get("exception_info") or {}).get("raised_exception"):
        return "expectation could not be evaluated"
    return "failed"


def _validate(frame: pd.DataFrame, expectations: list, contract: Contract, file: str,
              suite: Suite | None = None) -> tuple[list[Failure], dict]:
    """The failures of `expectations` on `frame`, and the result as JSON without the data's fingerprint (a hash of
    the frame: the partitions' results are stored in the dataset's great-expectations project). A suite that passes
    on expectations `data_contracts.direct` decides gets its result from there (`suite`: the expectations' `Suite`,
    made once for a partition's batches); any other by great-expectations' validation (`validated_by_gx`)."""
    if not expectations:
        return [], {"success": True, "results": []}
    result = (suite or Suite(expectations, contract.stage)).passing(frame)
    if result is not None:
        return [], result
    result = validated_by_gx(frame, expectations, contract.stage)
    failures = [Failure(contract.stage, file, r["expectation_config"]["kwargs"].get("column"),
                        r["expectation_config"]["type"], _describe_json(r)) for r in result["results"]
                if not r["success"]]
    return failures, result


def validated_by_gx(frame: pd.DataFrame, expectations: list, suite_name: str) -> dict:
    """great-expectations' own validation of `expectations` on `frame`, as JSON without the batch markers."""
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=suite_name, expectations=list(expectations))
    res = _batch_definition().get_batch(batch_parameters={"dataframe": frame}).validate(suite,
                                                                                        result_format=RESULT_FORMAT)
    result = res.to_json_dict()
    result["meta"] = {k: v for k, v in result.get("meta", {}).items() if k != "batch_markers"}
    return result


def _name(f: str) -> str:
    """A file's name, of a local path or a store's URL."""
    return str(f).rstrip("/").rsplit("/", 1)[-1]


def pq_schema(path: str, fs):
    import pyarrow.parquet as pq

    return pq.read_schema(path, filesystem=fs)


def _read(f: str, contract: Contract) -> tuple[pd.DataFrame | None, list[Failure]]:
    """A small output's file whole (`validate_partition` reads a partition's in batches)."""
    import pyarrow.parquet as pq

    name = _name(f)
    try:
        fs, path = _filesystem(str(f))
        if contract.schema is not None and pq_schema(path, fs).names != contract.schema:
            return None, [Failure(contract.stage, name, None, "expect_table_columns_to_match_ordered_list",
                                  f"expected {contract.schema!r}")]
        frame = _widened(pq.read_table(path, columns=contract.load_columns, filesystem=fs)).to_pandas()
    except Exception as exc:  # a corrupt file is a contract failure of the stage that wrote it
        return None, [Failure(contract.stage, name, None, "readable_parquet", type(exc).__name__)]
    return _derived(frame, contract, name)


def _derived(frame: pd.DataFrame, contract: Contract, name: str) -> tuple[pd.DataFrame | None, list[Failure]]:
    try:
        return (contract.derive(frame) if contract.derive is not None else frame), []
    except Exception as exc:  # a column of the wrong type breaks the derived checks: the stage's failure too
        return None, [Failure(contract.stage, name, None, "derivable_columns", type(exc).__name__)]


def validate_partition(f: str, contract: Contract) -> tuple[list[Failure], int, dict | None]:
    """The row suite on one file, where the file is (a dask worker), a batch at a time (`read_batches`: the worker's
    memory is a batch's, whatever the file's size): its failures, its row count and the result merged over the
    batches (safe format: counts, no row values; None when the file could not be read). Only these leave the worker,
    never a row."""
    name, results, rows = _name(f), [], 0
    try:
        fs, path = _filesystem(str(f))
        if contract.schema is not None and pq_schema(path, fs).names != contract.schema:
            return [Failure(contract.stage, name, None, "expect_table_columns_to_match_ordered_list",
                            f"expected {contract.schema!r}")], 0, None
        suite = Suite(contract.rows, contract.stage)
        for table in read_batches(f, contract.load_columns):
            frame, failures = _derived(_widened(table).to_pandas(), contract, name)
            if frame is None:
                return failures, 0, None
            results.append(_validate(frame, contract.rows, contract, name, suite)[1])
            rows += len(frame)
    except Exception as exc:  # a corrupt file is a contract failure of the stage that wrote it
        return [Failure(contract.stage, name, None, "readable_parquet", type(exc).__name__)], 0, None
    result = merged_results(results)
    failures = [Failure(contract.stage, name, r["expectation_config"]["kwargs"].get("column"),
                        r["expectation_config"]["type"], _describe_json(r))
                for r in result["results"] if not r["success"]]
    return failures, rows, result


def merged_results(results: list[dict]) -> dict:
    """A suite's results on the batches of one file as one result of the file (`merged_result` per expectation)."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    by_key = [{result_key(r["expectation_config"]): r for r in res["results"]} for res in results]
    merged = []
    for r in first["results"]:
        parts = [found[result_key(r["expectation_config"])] for found in by_key]
        errors = [p["exception_info"] for p in parts if (p.get("exception_info") or {}).get("raised_exception")]
        merged.append({**r, "success": all(p["success"] for p in parts),
                       "result": merged_result([p.get("result") or {} for p in parts]),
                       "exception_info": errors[0] if errors else r.get("exception_info")})
    ok = sum(r["success"] for r in merged)
    statistics = {"evaluated_expectations": len(merged), "successful_expectations": ok,
                  "unsuccessful_expectations": len(merged) - ok,
                  "success_percent": 100.0 * ok / len(merged) if merged else None}
    return {**first, "success": ok == len(merged), "results": merged, "statistics": statistics}


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
