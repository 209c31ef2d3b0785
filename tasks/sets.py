"""Set-valued records (call-detail records, transit histories, baskets): reading them from Parquet
(a list<int> column) or from a transactions text file, and normalising every record to a sorted set of
distinct item ids. Written with the per-row summaries the data contract checks (n_items, min_item,
max_item), since great-expectations cannot look inside list values."""

from __future__ import annotations

from collections import Counter
from typing import Iterator

import numpy as np
import pyarrow as pa

from dpalgos.arrays import distinct
from dpalgos.lazy import module
from tasks import storage
from tasks.errors import InputError, reason

sp = module("scipy.sparse")

ROWS_PER_PART = 200_000


def _normalise(offsets: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct items per row, from list offsets (n+1,) and flat values."""
    rows = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    # Shift by the smallest id so that negative ids (refused by the contract) still decode correctly.
    low = min(int(values.min()), 0) if values.size else 0
    span = int(values.max()) - low + 1 if values.size else 1
    key = distinct(rows.astype(np.int64) * span + (values.astype(np.int64) - low))
    row, item = key // span, (key % span + low).astype(np.int32)
    new_offsets = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=offsets.size - 1))]).astype(np.int32)
    return new_offsets, item


def within_universe(offsets: np.ndarray, values: np.ndarray, item_count: int | None
                    ) -> tuple[np.ndarray, np.ndarray, Counter]:
    """The records' items below the public item_count (None: all), as numeric values are clipped to public
    bounds: refusing an id at or above it would tell whoever chose item_count, for free, the largest id in the
    data. A record left with no item is left out; the counts (raw-derived) say how many records lost items.
    The same work whether or not any id is outside: a shortcut for "none" made one such id cost 17 ms more per
    200,000 records, in an ingest whose running time is published."""
    keep = values < item_count if item_count is not None else np.ones(values.size, dtype=bool)
    before = np.diff(offsets)
    rows = np.repeat(np.arange(before.size), before)
    after = np.bincount(rows[keep], minlength=before.size)
    survive = ~((before > 0) & (after == 0))
    counts = Counter(records_trimmed=int(np.count_nonzero(after < before)),
                     records_left_out=int(np.count_nonzero(~survive)))
    return np.concatenate([[0], np.cumsum(after[survive])]), values[keep], counts


def set_table(column: str, offsets: np.ndarray, values: np.ndarray) -> pa.Table:
    offsets, values = _normalise(np.asarray(offsets), np.asarray(values))
    n_items = np.diff(offsets).astype(np.int32)
    nonempty = n_items > 0
    mins = np.full(n_items.size, -1, dtype=np.int32)
    maxs = np.full(n_items.size, -1, dtype=np.int32)
    if values.size:
        starts = offsets[:-1][nonempty]
        mins[nonempty] = values[starts]
        maxs[nonempty] = values[offsets[1:][nonempty] - 1]
    return pa.table({column: pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32())),
                     "n_items": n_items, "min_item": mins, "max_item": maxs})


def _transaction_chunks(path: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    import fsspec

    storage.configure()  # the operator's credentials block, which fsspec.open applies to a URL's store
    lengths, values = [], []
    with fsspec.open(path, "rt", encoding="utf-8-sig", compression="gzip" if path.endswith(".gz") else None) as fh:
        for line in fh:
            tokens = line.split()
            try:
                items = [int(t) for t in tokens]
            except ValueError:
                # No line number: it would count the records before the bad one.
                raise InputError(f"{path}: item ids must be integers (a line holds another token)") from None
            lengths.append(len(items))
            values.extend(items)
            if len(lengths) == ROWS_PER_PART:
                yield np.concatenate([[0], np.cumsum(lengths)]), np.array(values, dtype=np.int64)
                lengths, values = [], []
    if lengths:
        yield np.concatenate([[0], np.cumsum(lengths)]), np.array(values, dtype=np.int64)


def _parquet_chunks(path: str, column: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for f in storage.files(path, ".parquet") if storage.is_dir(path) else [path]:
        table = storage.read_table(f, columns=[column])
        arr = table.column(column).combine_chunks()
        if not pa.types.is_list(arr.type) and not pa.types.is_large_list(arr.type):
            raise InputError(f"{f}: column '{column}' is {arr.type}, not a list of item ids")
        if not pa.types.is_integer(arr.type.value_type):
            raise InputError(f"{f}: column '{column}' holds {arr.type.value_type}, not integer item ids")
        if arr.null_count:
            raise InputError(f"{f}: column '{column}' has null records")
        if arr.values.null_count:  # a null item was dropped without a word (a review's bad input)
            raise InputError(f"{f}: column '{column}' has null item ids in its records")
        values = arr.values.to_numpy(zero_copy_only=False)
        offsets = arr.offsets.to_numpy()
        yield offsets - offsets[0], values[offsets[0]:offsets[-1]]


def _normalise_file(src: str, dst: str, column: str, item_count: int | None) -> tuple[int, Counter]:
    """One Parquet source file -> one normalised partition; returns its number of records and what
    `within_universe` left out."""
    offsets, values, outside = within_universe(*next(_parquet_chunks(src, column)), item_count)
    storage.write_table(set_table(column, offsets, values), dst)
    return offsets.size - 1, outside


def ingest_users(path: str, column: str, user_column: str, out_dir: str,
                 item_count: int | None = None) -> tuple[int, int, Counter]:
    """Parquet rows (user, items) grouped into one record per user, the union of the user's items (the privacy
    unit is the user, whatever the number of rows); the user ids are dropped. Returns (records, partitions,
    what `within_universe` left out)."""
    import polars as pl

    path, out_dir = str(path), str(out_dir)
    files = storage.files(path, ".parquet") if storage.is_dir(path) else [path]
    rows = pl.scan_parquet(files).select(pl.col(user_column), pl.col(column))
    try:
        null_items = rows.select(pl.col(column).list.eval(pl.element().is_null()).list.any().any()).collect().item()
        users = (rows.explode(column).drop_nulls(column).unique([user_column, column])
                 .group_by(user_column).agg(pl.col(column).sort()).sort(user_column).collect())
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise InputError(f"cannot read {path} with the user column '{user_column}': {reason(exc)}") from None
    if null_items:
        raise InputError(f"{path}: column '{column}' has null item ids in its records")
    storage.makedirs(out_dir)
    parts, rows, outside = 0, 0, Counter()
    for start in range(0, max(users.height, 1), ROWS_PER_PART):
        lists = users[column][start:start + ROWS_PER_PART].to_arrow()
        lists = lists.combine_chunks() if hasattr(lists, "combine_chunks") else lists
        offsets = lists.offsets.to_numpy()
        values = lists.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
        offsets, values, left = within_universe(offsets - offsets[0], values, item_count)
        storage.write_table(set_table(column, offsets, values), storage.join(out_dir, f"part.{parts}.parquet"))
        parts, rows, outside = parts + 1, rows + offsets.size - 1, outside + left
    return rows, parts, outside


def ingest_sets(path: str, fmt: str, column: str, out_dir: str, client=None,
                item_count: int | None = None) -> tuple[int, int, Counter]:
    """Write the records of the location `path` as out_dir/part.<i>.parquet (locations: local or a store's), their
    items below item_count (`within_universe`); returns (rows, partitions, what was left out). With a dask client,
    the files of a Parquet folder are normalised in parallel, one task per file."""
    path, out_dir = str(path), str(out_dir)
    if client is not None and fmt == "parquet" and storage.is_dir(path):
        files = storage.files(path, ".parquet")
        storage.makedirs(out_dir)
        try:
            done = client.gather(client.map(_normalise_file, files,
                                            [storage.join(out_dir, f"part.{i}.parquet") for i in range(len(files))],
                                            column=column, item_count=item_count))
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"cannot read {path}: {reason(exc)}") from None
        return int(sum(n for n, _ in done)), len(files), sum((c for _, c in done), Counter())
    chunks = _transaction_chunks(path) if fmt == "transactions" else _parquet_chunks(path, column)
    storage.makedirs(out_dir)
    rows, parts, outside = 0, 0, Counter()
    try:
        for chunk in chunks:
            offsets, values, left = within_universe(*chunk, item_count)
            storage.write_table(set_table(column, offsets, values), storage.join(out_dir, f"part.{parts}.parquet"))
            rows, parts, outside = rows + offsets.size - 1, parts + 1, outside + left
    except (OSError, EOFError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read {path}: {reason(exc)}") from None
    return rows, parts, outside


def read_sets(path: str, column: str, item_count: int) -> sp.csr_matrix:
    """One partition of set-valued records as a binary CSR matrix (n, item_count) float32."""
    arr = storage.read_table(path, columns=[column]).column(column).combine_chunks()
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    return sp.csr_matrix((np.ones(values.size, dtype=np.float32), values, offsets - offsets[0]),
                         shape=(offsets.size - 1, item_count))
