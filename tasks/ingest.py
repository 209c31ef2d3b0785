"""The ingest task: CSV / Parquet source -> typed, partitioned Parquet."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from data_contracts.validate import parquet_files
from tasks import sources, storage
from tasks.errors import InputError, reason
from tasks.example_data import is_builtin, materialise
from tasks.params import DatasetSpec
from tasks.partitions import compute_with_progress, ingest_file, typed_frame
from tasks.progress import Progress, gather
from tasks.retry import INTERNAL_LOG, SAFE, sanitised
from tasks.run import StageOutput
from tasks.sets import ingest_sets, ingest_users
from tasks.transient import written_not_read

_CSV_BLOCKSIZE = "64MB"
#: Beside the ingested records, in internal/: how many records lost item ids at or above item_count (raw-derived).
ITEMS_OUTSIDE = "items_outside.json"


def count_rows(path: str) -> int:
    import pyarrow.parquet as pq

    total = 0
    for f in parquet_files(path):
        fs, local = (storage.filesystem(f) if storage.is_url(f) else (None, f))
        total += pq.read_metadata(local, filesystem=fs).num_rows
    return total


def _read_csv(dataset: DatasetSpec, path: str, dtypes: dict[str, str]):
    """The file's columns named in `dtypes` (the spec's), each parsed as given. The other columns are read as text
    and dropped: typed by dask's guess from a sample, one record's blank or 40.5 in an undeclared integer column past
    the sample refused the whole file. Its layout (`sources.csv_layout`: encoding, header, duplicate names) and then
    every line's number of fields (`sources.check_lines`) are checked first: a line with fewer fields than the header
    was read with nulls for the missing ones, one with more refused without a hint of where."""
    import dask.dataframe as dd

    layout = sources.csv_layout(dataset, path)
    bad = sources.check_lines(path, layout, _client())
    if bad is not None:
        # The line's number counts the records before it: the run's log file only (the internal log's INFO records
        # reach neither the terminal nor Prefect's API, tasks/retry.py), never the error's text.
        INTERNAL_LOG.info("dataset '%s': line %d of %s has %d fields, not %d", dataset.id, bad.line, path,
                          bad.fields, len(layout.names))
        raise InputError(f"dataset '{dataset.id}': {path} has a malformed line: {bad.fields} field(s) where the "
                         f"{'header has' if layout.header else 'spec names'} {len(layout.names)} (its line number is "
                         f"in the run's internal log)")
    wanted = list(dtypes)
    gz = path.endswith(".gz")
    # Never dask's guess from a sample: a guess lets one record's value decide how the others are read (or
    # refuse them as "mismatched dtypes"). The other columns are read as text, never typed; every column is read so
    # that a line with more fields than the header is refused, not read as its first fields (a review's ragged line).
    others = {} if not layout.header else {c: "string" for c in layout.names if c not in dtypes}
    return dd.read_csv(str(path), sep=layout.sep or r"\s+", header=0 if layout.header else None,
                       names=None if layout.header else list(layout.names), dtype={**others, **dtypes},
                       blocksize=None if gz else _CSV_BLOCKSIZE, compression="gzip" if gz else None,
                       encoding="utf-8-sig")[wanted]


def _client():
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):  # no client: the lines are counted in this process
        return None


def _unreadable(dataset: DatasetSpec, exc: BaseException) -> InputError:
    """One text whether a bad value sat in dask's first sample (read when the graph is built) or after it (read
    when computed): two texts would say where the record is."""
    return InputError(f"dataset '{dataset.id}': cannot read {dataset.path} as {dataset.source_format}: "
                      f"{reason(exc)} (a value that is not a number in a numeric column, or a malformed line?)")


def read_source(dataset: DatasetSpec, path: str):
    """The dataset at `path` as a dask DataFrame restricted to the spec's columns (not yet computed): numeric
    columns as float64, categorical ones as strings (nulls kept), the weight column as float64."""
    import dask.dataframe as dd
    import pandas as pd

    path = str(path)
    if not storage.exists(path):
        raise InputError(f"dataset '{dataset.id}': {path} does not exist")
    weight = [dataset.weight_column] if dataset.weight_column else []
    numeric = list(dataset.bounds or {}) + list(dataset.numeric or []) + weight
    categorical = list(dataset.categories or {}) + dataset.user_columns
    wanted = dataset.columns + dataset.user_columns + weight
    try:
        parquet = dataset.source_format == "parquet" or is_builtin(dataset.path)
        ddf = dd.read_parquet(path) if parquet else _read_csv(dataset, path, {
            c: "string" if c in categorical else "float64" for c in wanted})
    except InputError:
        raise
    except Exception as exc:
        raise _unreadable(dataset, exc) from None
    missing = [c for c in wanted if c not in ddf.columns]
    if missing:
        raise InputError(f"dataset '{dataset.id}': columns {missing} are missing from {path}")
    ddf = ddf[wanted]
    wrong = {c: str(ddf.dtypes[c]) for c in numeric
             if not (pd.api.types.is_numeric_dtype(ddf.dtypes[c]) and not pd.api.types.is_bool_dtype(ddf.dtypes[c]))}
    if wrong:
        raise InputError(f"dataset '{dataset.id}': columns must be numeric, but {wrong} are not")
    meta = {c: ("string" if c in categorical else "float64") for c in wanted}
    return ddf.map_partitions(typed_frame, numeric, categorical, meta=meta)


def _ingest_sets(dataset: DatasetSpec, source: str, out: str, internal: Path, log) -> StageOutput:
    if not storage.exists(source):
        raise InputError(f"dataset '{dataset.id}': {source} does not exist")
    storage.remove(out)
    from distributed import get_client

    fmt = dataset.format or dataset.source_format
    if dataset.user_column:
        rows, parts, outside = ingest_users(source, dataset.items_column, dataset.user_column, out,
                                            dataset.item_count)
    else:
        rows, parts, outside = ingest_sets(source, fmt, dataset.items_column, out, client=get_client(),
                                           item_count=dataset.item_count)
    if rows + outside["records_left_out"] == 0:  # empty before the public universe: a fixed fact of the data
        raise InputError(f"dataset '{dataset.id}': {dataset.path} has no records")
    (internal / ITEMS_OUTSIDE).write_text(json.dumps({"records_trimmed": outside["records_trimmed"],
                                                      "records_left_out": outside["records_left_out"]}))
    log.info("ingested the set-valued records; records with item ids at or above item_count: counted in %s "
             "(internal)", (internal / ITEMS_OUTSIDE).resolve())
    return StageOutput(out, rows, parts)


@task(name="ingest", cache_policy=NO_CACHE, **SAFE)
@sanitised
def ingest(dataset: DatasetSpec, out: str, internal: Path, admitted: list[list]) -> StageOutput:
    """Read the source with dask and write it as partitioned Parquet (float64 columns) to the location `out` (the
    run's scratch: a local folder, or a store's prefix every worker reads); small diagnostics to `internal`. The
    source must be what the run was admitted to read (`admitted`, its `storage.identity`: each object's version id
    or ETag, each file's size, times and inode) before the read and still after it: what was read is the version
    the checks took (an object replaced during the read is refused, its partitions removed)."""
    if not is_builtin(dataset.path) and storage.identity(dataset.path) != admitted:
        raise InputError(f"dataset '{dataset.id}': {dataset.path} changed since the run's checks (an object or file "
                         f"was replaced, added or removed): nothing was read; rerun the release")
    output = ingest_dataset(dataset, out, internal, get_run_logger())
    if not is_builtin(dataset.path) and storage.identity(dataset.path) != admitted:
        storage.remove(out)
        raise InputError(f"dataset '{dataset.id}': {dataset.path} changed while it was read (an object or file was "
                         f"replaced, added or removed): what was read was discarded; rerun the release")
    return output


def ingest_dataset(dataset: DatasetSpec, out: str, internal: Path, log) -> StageOutput:
    """The ingest step on the current dask client, outside Prefect (the conformance suite runs it)."""
    out = str(out)
    if is_builtin(dataset.path):
        try:
            source = materialise(dataset.path, storage.join(storage.parent(out), "builtin-source"))
        except ValueError as exc:
            raise InputError(f"dataset '{dataset.id}': {exc}") from None
        log.info("generated the built-in dataset %s (public synthetic data)", dataset.path)
    else:
        source = dataset.path
    if dataset.items_column:
        return _ingest_sets(dataset, source, out, Path(internal), log)
    files = _flat_parquet(dataset, source)
    rows = _ingest_files(dataset, source, files, out, log) if files else _ingest_dask(dataset, source, out, log)
    if rows == 0:
        raise InputError(f"dataset '{dataset.id}': {dataset.path} has no data rows")
    parts = len(parquet_files(out))
    log.info("ingested the %d columns of the spec", len(dataset.columns + dataset.user_columns)
             + bool(dataset.weight_column))
    return StageOutput(out, rows, parts)


def _ingest_dask(dataset: DatasetSpec, source: str, out: str, log) -> int:
    ddf = read_source(dataset, source)
    storage.remove(out)
    try:  # the partitions written are the stage's progress (tasks/partitions.py)
        compute_with_progress(ddf.to_parquet(out, write_index=False, compute=False), "toparquetdata-",
                              Progress(log, "partitions ingested", ddf.npartitions))
    except Exception as exc:  # a value that does not parse surfaces here unless it is in dask's first sample
        if written_not_read(exc):  # the scratch full or out of reach: the write failed, not the data
            raise
        raise _unreadable(dataset, exc) from None
    return count_rows(out)


def _flat_parquet(dataset: DatasetSpec, source: str) -> list[str] | None:
    """The source's Parquet files when it is one, or a folder of them and nothing else to read: each is ingested by
    itself, a batch at a time (`_ingest_files`). None for anything dask must read (CSV, nested or hive-partitioned
    folders, files without the suffix), as before."""
    if dataset.source_format != "parquet" and not is_builtin(dataset.path):
        return None
    if not storage.is_dir(source):
        return [source] if source.endswith(".parquet") else None
    found = parquet_files(source)
    read = [f for f in storage.files(source) if not storage.name(f).startswith(("_", "."))]
    folder = storage.parent(storage.join(source, "_"))  # the source as its files' parents spell it
    flat = all(storage.parent(f) == folder for f in read)
    return found if flat and sorted(read) == sorted(found) else None


def _ingest_files(dataset: DatasetSpec, source: str, files: list[str], out: str, log) -> int:
    """Every source file typed into a partition of `out` on the dask workers, a batch at a time: a worker holds a
    batch per thread, whatever the files' size, and the records go from Arrow to Parquet without a pandas frame
    (dask's read, map and write held each file whole, three copies of it). Returns the rows written."""
    from distributed import get_client

    storage.remove(out)
    storage.makedirs(out)
    weight = [dataset.weight_column] if dataset.weight_column else []
    numeric = list(dataset.bounds or {}) + list(dataset.numeric or []) + weight
    client = get_client()
    futures = client.map(ingest_file, files, [storage.join(out, f"part.{i}.parquet") for i in range(len(files))],
                         wanted=dataset.columns + dataset.user_columns + weight, numeric=numeric,
                         categorical=list(dataset.categories or {}) + dataset.user_columns,
                         dataset_id=dataset.id, source=str(source), pure=False)
    try:
        return sum(gather(client, futures, Progress(log, "partitions ingested", len(files))))
    except InputError:
        raise
    except Exception as exc:
        if written_not_read(exc):  # the scratch full or out of reach: the write failed, not the data
            raise
        raise _unreadable(dataset, exc) from None
