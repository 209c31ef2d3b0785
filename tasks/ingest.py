"""The ingest task: CSV / Parquet source -> typed, partitioned Parquet."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from data_contracts.validate import parquet_files
from tasks.errors import InputError, reason
from tasks.example_data import is_builtin, materialise
from tasks.params import DatasetSpec
from tasks.partitions import compute_with_progress
from tasks.progress import Progress
from tasks.retry import SAFE, sanitised
from tasks.run import StageOutput
from tasks.sets import ingest_sets, ingest_users

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?(nan|inf|infinity)$", re.IGNORECASE)
_CSV_BLOCKSIZE = "64MB"
#: Beside the ingested records, in internal/: how many records lost item ids at or above item_count (raw-derived).
ITEMS_OUTSIDE = "items_outside.json"


def count_rows(path: str | Path) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in parquet_files(path))


def _first_lines(path: Path, n: int) -> list[str]:
    """Up to n non-blank lines from the start of a (possibly gzipped) text file."""
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    try:
        with opener(path, "rt", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    lines.append(line.strip())
                    if len(lines) == n:
                        break
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read {path}: {reason(exc)}") from None
    return lines


def _split(line: str, sep: str | None) -> list[str]:
    return line.split() if sep is None else [t.strip().strip('"') for t in line.split(sep)]


def _read_csv(dataset: DatasetSpec, path: Path, dtypes: dict[str, str]):
    """The file's columns named in `dtypes` (the spec's), each parsed as given. The other columns are read as text
    and dropped: typed by dask's guess from a sample, one record's blank or 40.5 in an undeclared integer column past
    the sample refused the whole file. A line with a field count other than the header's is refused."""
    import dask.dataframe as dd

    lines = _first_lines(path, 2)
    if not lines:
        raise InputError(f"dataset '{dataset.id}': {path} is empty")
    first = lines[0]
    sep = dataset.delimiter or ("," if "," in first else "\t" if "\t" in first else None)
    tokens = _split(first, sep)
    header = dataset.header if dataset.header is not None else not all(_NUMBER.match(t) for t in tokens)
    if header and len(lines) < 2:
        raise InputError(f"dataset '{dataset.id}': {path} has a header but no data rows")
    names, wanted = None, list(dtypes)
    if header:
        missing = [c for c in wanted if c not in tokens]
        if missing:
            raise InputError(f"dataset '{dataset.id}': columns {missing} are missing from {path}")
    else:
        if len(tokens) != len(dataset.columns):
            # Not the number of fields found: it is a count over the first record.
            raise InputError(f"dataset '{dataset.id}': the headerless file {path} does not have one field per "
                             f"column the spec's bounds name ({dataset.columns}); give bounds for every field, in "
                             f"order")
        names = dataset.columns
    gz = path.suffix == ".gz"
    # Never dask's guess from a sample: a guess lets one record's value decide how the others are read (or
    # refuse them as "mismatched dtypes"). The other columns are read as text, never typed; every column is read so
    # that a line with more fields than the header is refused, not read as its first fields (a review's ragged line).
    others = {} if not header else {c: "string" for c in tokens if c not in dtypes}
    return dd.read_csv(str(path), sep=sep or r"\s+", header=0 if header else None, names=names,
                       dtype={**others, **dtypes}, blocksize=None if gz else _CSV_BLOCKSIZE,
                       compression="gzip" if gz else None)[wanted]


def _unreadable(dataset: DatasetSpec, exc: BaseException) -> InputError:
    """One text whether a bad value sat in dask's first sample (read when the graph is built) or after it (read
    when computed): two texts would say where the record is."""
    return InputError(f"dataset '{dataset.id}': cannot read {dataset.path} as {dataset.source_format}: "
                      f"{reason(exc)} (a value that is not a number in a numeric column, or a malformed line?)")


def read_source(dataset: DatasetSpec, path: Path):
    """The dataset at `path` as a dask DataFrame restricted to the spec's columns (not yet computed): numeric
    columns as float64, categorical ones as strings (nulls kept), the weight column as float64."""
    import dask.dataframe as dd
    import pandas as pd

    if not path.exists():
        raise InputError(f"dataset '{dataset.id}': {path} does not exist")
    weight = [dataset.weight_column] if dataset.weight_column else []
    numeric = list(dataset.bounds or {}) + list(dataset.numeric or []) + weight
    categorical = list(dataset.categories or {})
    try:
        parquet = dataset.source_format == "parquet" or is_builtin(dataset.path)
        ddf = dd.read_parquet(str(path)) if parquet else _read_csv(dataset, path, {
            c: "string" if c in categorical else "float64" for c in dataset.columns + weight})
    except InputError:
        raise
    except Exception as exc:
        raise _unreadable(dataset, exc) from None
    wanted = dataset.columns + weight
    missing = [c for c in wanted if c not in ddf.columns]
    if missing:
        raise InputError(f"dataset '{dataset.id}': columns {missing} are missing from {path}")
    ddf = ddf[wanted]
    wrong = {c: str(ddf.dtypes[c]) for c in numeric
             if not (pd.api.types.is_numeric_dtype(ddf.dtypes[c]) and not pd.api.types.is_bool_dtype(ddf.dtypes[c]))}
    if wrong:
        raise InputError(f"dataset '{dataset.id}': columns must be numeric, but {wrong} are not")
    meta = {c: ("string" if c in categorical else "float64") for c in wanted}
    return ddf.map_partitions(_typed, numeric, categorical, meta=meta)


def _typed(frame, numeric: list[str], categorical: list[str]):
    import pandas as pd

    out = {c: frame[c].astype("float64") for c in numeric}
    out.update({c: _level_text(frame[c]) for c in categorical})
    return pd.DataFrame(out, index=frame.index)[list(frame.columns)]


def _level_text(col):
    """A categorical column's values as text, each by itself: a whole number stored as a float (Parquet) prints
    as "1", not "1.0". Never by a test over the partition: one record's 1.5 would then turn every other record's
    "1" into "1.0", outside the public levels (one record moving every count), and change the work done."""
    import pandas as pd

    if isinstance(col.dtype, pd.CategoricalDtype):  # a writer's categories may be floats: 1.0 for 1
        return _level_text(col.astype(col.dtype.categories.dtype))
    if not pd.api.types.is_float_dtype(col):
        return col.astype("string")
    col = col.astype("float64")  # a nullable Float64's NA as NaN, which the comparisons below leave null
    whole = (col % 1 == 0) & (col.abs() < 2.0 ** 53)  # NaN compares False: nulls stay null
    text = col.astype("string")
    return text.where(~whole, col.where(whole, 0.0).astype("int64").astype("string"))


def _ingest_sets(dataset: DatasetSpec, source: Path, out_dir: Path, log) -> StageOutput:
    if not source.exists():
        raise InputError(f"dataset '{dataset.id}': {source} does not exist")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    from distributed import get_client

    fmt = dataset.format or dataset.source_format
    if dataset.user_column:
        rows, parts, outside = ingest_users(source, dataset.items_column, dataset.user_column, out_dir,
                                            dataset.item_count)
    else:
        rows, parts, outside = ingest_sets(source, fmt, dataset.items_column, out_dir, client=get_client(),
                                           item_count=dataset.item_count)
    if rows + outside["records_left_out"] == 0:  # empty before the public universe: a fixed fact of the data
        raise InputError(f"dataset '{dataset.id}': {dataset.path} has no records")
    (out_dir.parent / ITEMS_OUTSIDE).write_text(json.dumps({"records_trimmed": outside["records_trimmed"],
                                                            "records_left_out": outside["records_left_out"]}))
    log.info("ingested the set-valued records; records with item ids at or above item_count: counted in %s "
             "(internal)", out_dir.parent / ITEMS_OUTSIDE)
    return StageOutput(str(out_dir), rows, parts)


@task(name="ingest", cache_policy=NO_CACHE, **SAFE)
@sanitised
def ingest(dataset: DatasetSpec, out_dir: Path) -> StageOutput:
    """Read the source with dask and write it as partitioned Parquet (float64 columns) to `out_dir`."""
    return ingest_dataset(dataset, out_dir, get_run_logger())


def ingest_dataset(dataset: DatasetSpec, out_dir: Path, log) -> StageOutput:
    """The ingest step on the current dask client, outside Prefect (the conformance suite runs it)."""
    if is_builtin(dataset.path):
        try:
            source = materialise(dataset.path, out_dir.parent / "builtin-source")
        except ValueError as exc:
            raise InputError(f"dataset '{dataset.id}': {exc}") from None
        log.info("generated the built-in dataset %s (public synthetic data)", dataset.path)
    else:
        source = Path(dataset.path)
    if dataset.items_column:
        return _ingest_sets(dataset, source, out_dir, log)
    ddf = read_source(dataset, source)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    try:  # the partitions written are the stage's progress (tasks/partitions.py)
        compute_with_progress(ddf.to_parquet(str(out_dir), write_index=False, compute=False), "toparquetdata-",
                              Progress(log, "partitions ingested", ddf.npartitions))
    except Exception as exc:  # a value that does not parse surfaces here unless it is in dask's first sample
        raise _unreadable(dataset, exc) from None
    rows = count_rows(out_dir)
    if rows == 0:
        raise InputError(f"dataset '{dataset.id}': {dataset.path} has no data rows")
    parts = len(parquet_files(out_dir))
    log.info("ingested the %d columns of the spec", len(ddf.columns))
    return StageOutput(str(out_dir), rows, parts)
