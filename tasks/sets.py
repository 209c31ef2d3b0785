"""Set-valued records (call-detail records, transit histories, baskets): reading them from Parquet
(a list<int> column) or from a transactions text file, and normalising every record to a sorted set of
distinct item ids. Written with the per-row summaries the data contract checks (n_items, min_item,
max_item), since great-expectations cannot look inside list values."""

from __future__ import annotations

import io
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


#: Bytes read from a transactions file at a time (cut after its last line end): its tokens are Python objects for a
#: moment (about 15 MB a block).
BLOCK_BYTES = 2 ** 20
#: The bytes of a block `_plain_lines` splits: ASCII digits, signs, spaces, tabs and line ends (carriage returns made
#: line feeds first, as Python's universal newlines do). A block with any other byte (another whitespace, non-ASCII
#: text, a letter) is read by Python's text rules (Unicode whitespace and digits), which on these bytes split lines and
#: tokens as `_plain_lines` does. Its time depends on that: a record with such bytes costs its block (a megabyte) a
#: Python parse, about 50 ms; a plain-ASCII file, which the generators and CDR exports write, never does.
_PLAIN = np.zeros(256, dtype=bool)
_PLAIN[[ord(c) for c in "0123456789+- \t\n"]] = True
_SPACE = np.zeros(256, dtype=bool)
_SPACE[[ord(c) for c in " \t\n"]] = True


def _transaction_chunks(path: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(offsets, item ids) of ROWS_PER_PART lines at a time (the last chunk shorter), one record per line, its
    whitespace-separated integers. Read in blocks whose lines numpy finds (`_plain_lines`): a line at a time through
    Python's text reading was most of the ingest of CDR-sized files."""
    lengths, values, held = [], [], 0
    for block_lengths, block_values in _blocks(path):
        lengths.append(block_lengths)
        values.append(block_values)
        held += block_lengths.size
        while held >= ROWS_PER_PART:
            lens, vals = np.concatenate(lengths), np.concatenate(values)
            cut = int(lens[:ROWS_PER_PART].sum())
            yield np.concatenate([[0], np.cumsum(lens[:ROWS_PER_PART])]), vals[:cut]
            lengths, values, held = [lens[ROWS_PER_PART:]], [vals[cut:]], lens.size - ROWS_PER_PART
    if held:
        lens = np.concatenate(lengths)
        yield np.concatenate([[0], np.cumsum(lens)]), np.concatenate(values)


def _blocks(path: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(items per line, item ids) of every block of whole lines of the file."""
    import fsspec

    storage.configure()  # the operator's credentials block, which fsspec.open applies to a URL's store
    with fsspec.open(path, "rb", compression="gzip" if path.endswith(".gz") else None) as fh:
        rest, first = b"", True
        while True:
            data = fh.read(BLOCK_BYTES)
            block = rest + data
            if first and block.startswith(b"\xef\xbb\xbf"):  # utf-8-sig: the byte order mark is not data
                block = block[3:]
            first = False
            if not data:  # the last line, without its line end
                if block:
                    yield _parsed(path, block)
                return
            end = block.rfind(b"\n") + 1
            if end:
                yield _parsed(path, block[:end])
            rest = block[end:]


def _parsed(path: str, block: bytes) -> tuple[np.ndarray, np.ndarray]:
    block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")  # universal newlines, on every block alike
    raw = np.frombuffer(block, dtype=np.uint8)
    if _PLAIN[raw].all():
        lengths, tokens = _plain_lines(raw), block.split()
    else:  # Python's text rules: UTF-8, universal newlines, `str.split`
        lines = [line.split() for line in io.StringIO(block.decode("utf-8"), newline=None)]
        lengths, tokens = np.array([len(t) for t in lines], dtype=np.int64), [t for line in lines for t in line]
    try:
        return lengths, np.array(list(map(int, tokens)), dtype=np.int64)
    except ValueError:  # a token that is not an integer; no line number: it would count the records before it
        raise InputError(f"{path}: item ids must be integers (a line holds another token)") from None


def _plain_lines(raw: np.ndarray) -> np.ndarray:
    """Items per line of a block of plain bytes (`_PLAIN`) ending with a line end, or with the file's end."""
    newline = raw == 10
    token = ~_SPACE[raw]
    starts = np.flatnonzero(token & ~np.concatenate([[False], token[:-1]]))
    return np.bincount(np.cumsum(newline)[starts], minlength=int(newline.sum()) + (raw[-1] != 10)).astype(np.int64)


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
