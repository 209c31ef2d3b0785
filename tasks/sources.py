"""The structure of a dataset's source, checked before its records are read: a CSV file's encoding, delimiter, header
and the number of fields of each line; a Parquet file's schema. Structure only, never a value: a refusal names the
spec's columns, field counts and the file, and the number of a bad line goes to the run's internal log only (it
counts the records before it: "an error that prints N is an oracle for N", DESIGN.md).

The admission asks `check_structure` before anything runs (the header and the schema: public facts of the file, as
its name and size are); the ingest asks `csv_layout` again and `check_lines` over every line before it writes a
record. Nothing here imports Prefect or dask at module level.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from tasks.errors import InputError, reason
from tasks.storage.options import configure

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?(nan|inf|infinity)$", re.IGNORECASE)
#: Leading bytes that say what a file is when it is not UTF-8 text: a refusal names the format, never the content.
_MAGIC = ((b"\xff\xfe", "UTF-16 text (little-endian): save it as UTF-8"),
          (b"\xfe\xff", "UTF-16 text (big-endian): save it as UTF-8"),
          (b"PAR1", "a Parquet file: give format: parquet (or a .parquet name)"),
          (b"\x1f\x8b", "gzip-compressed: name it with a .gz suffix"),
          (b"PK\x03\x04", "a zip archive (an .xlsx workbook?): export it as CSV"))
#: Bytes of a line-count block (`check_lines`): the per-block arrays are a few times this.
LINES_BLOCKSIZE = 16 * 2 ** 20


@dataclass(frozen=True)
class CsvLayout:
    """How a CSV file is read: its delimiter (None: runs of whitespace), whether its first line is a header, and its
    fields' names (the header's, or the spec's columns in order for a headerless file)."""
    sep: str | None
    header: bool
    names: tuple[str, ...]


def _opener(path: str):
    import fsspec

    configure()  # the operator's credentials block, for a URL's store (fsspec.open applies fsspec's configuration)
    return fsspec.open(path, "rb", compression="gzip" if path.endswith(".gz") else None)


def _head(path: str, size: int = 64 * 1024) -> bytes:
    try:
        with _opener(path) as fh:
            return fh.read(size)
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read {path}: {reason(exc)}") from None


def first_lines(path: str, n: int) -> list[str]:
    """Up to n non-blank lines from the start of a (possibly gzipped) text file, local or in a store, decoded as UTF-8
    with a byte-order mark dropped (a BOM header was refused as "columns missing": the first name read `\\ufeffx`)."""
    import io

    lines = []
    try:
        with _opener(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="") as fh:
            for line in fh:
                if line.strip():
                    lines.append(line.strip())
                    if len(lines) == n:
                        break
    except (OSError, EOFError) as exc:
        raise InputError(f"cannot read {path}: {reason(exc)}") from None
    return lines


def not_text(path: str) -> str | None:
    """What the file is, when its first bytes say it is not UTF-8 text (None: it may be)."""
    head = _head(path)
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    if b"\x00" in head:
        return "binary, not text (it holds NUL bytes)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not a character cut by the end of the sample
            return "not UTF-8 text (another encoding, e.g. Latin-1: save it as UTF-8)"
    return None


def delimiter_of(line: str) -> str | None:
    """The delimiter a CSV file's first line shows, where nothing names one: a comma, else a tab, else runs of
    whitespace (None). The one rule of the pipeline's readers and of the experiments' point files."""
    return "," if "," in line else "\t" if "\t" in line else None


def split(line: str, sep: str | None) -> list[str]:
    return line.split() if sep is None else [t.strip().strip('"') for t in line.split(sep)]


def csv_layout(dataset, path: str) -> CsvLayout:
    """The layout of the CSV file at `path` for the spec's `dataset`, or an InputError naming what does not fit: not
    UTF-8 text, empty, a header without data rows, a header missing a column of the spec's or naming one twice,
    a headerless first line with another number of fields than the spec's columns."""
    what = not_text(path)
    if what is not None:
        raise InputError(f"dataset '{dataset.id}': {path} is {what}")
    lines = first_lines(path, 2)
    if not lines:
        raise InputError(f"dataset '{dataset.id}': {path} is empty")
    first = lines[0]
    sep = dataset.delimiter or delimiter_of(first)
    tokens = split(first, sep)
    header = dataset.header if dataset.header is not None else not all(_NUMBER.match(t) for t in tokens)
    if header and len(lines) < 2:
        raise InputError(f"dataset '{dataset.id}': {path} has a header but no data rows")
    wanted = dataset.columns + dataset.user_columns + ([dataset.weight_column] if dataset.weight_column else [])
    if not header:
        named = dataset.columns + dataset.user_columns
        if len(tokens) != len(named):
            # Not the number of fields found: it is a count over the first record.
            raise InputError(f"dataset '{dataset.id}': the headerless file {path} does not have one field per "
                             f"column the spec's bounds name ({named}); give bounds for every field, in "
                             f"order")
        return CsvLayout(sep, False, tuple(named))
    missing = [c for c in wanted if c not in tokens]
    if missing:
        raise InputError(f"dataset '{dataset.id}': columns {missing} are missing from {path}")
    twice = sorted({t for t in tokens if tokens.count(t) > 1})
    if twice:
        # Names the spec's columns only: the header's other names are not the spec's to learn.
        named = [t for t in twice if t in wanted]
        which = f"column(s) {named}" if named else "a column the spec does not read"
        raise InputError(f"dataset '{dataset.id}': the header of {path} (line 1) names {which} twice: which one "
                         f"holds the data is ambiguous")
    return CsvLayout(sep, True, tuple(tokens))


def check_structure(dataset, path: str) -> None:
    """The checks of the source's structure that need no record: a CSV file's layout (`csv_layout`), a Parquet
    file's schema (`parquet_schema`). Set-valued sources and built-in datasets are checked by their own ingest."""
    from tasks.example_data import is_builtin

    if is_builtin(dataset.path) or dataset.items_column:
        if dataset.source_format == "transactions":
            what = not_text(path)
            if what is not None:
                raise InputError(f"dataset '{dataset.id}': {path} is {what}")
        return
    if dataset.source_format == "parquet":
        parquet_schema(dataset, path)
    else:
        csv_layout(dataset, path)


def parquet_schema(dataset, path: str) -> None:
    """The schema of the first Parquet file (the one dask takes the columns' types from): the spec's columns present,
    once each, numeric ones of a numeric type."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks import storage

    files = storage.files(path, ".parquet") if storage.is_dir(path) else [path]
    if not files:
        raise InputError(f"dataset '{dataset.id}': {path} holds no .parquet file")
    try:
        fs, local = (storage.filesystem(files[0]) if storage.is_url(files[0]) else (None, files[0]))
        schema = pq.read_schema(local, filesystem=fs)
    except (OSError, pa.ArrowException) as exc:
        what = not_text(files[0]) if not storage.is_url(files[0]) else None
        raise InputError(f"dataset '{dataset.id}': {files[0]} is not a Parquet file"
                         f"{f' (it is {what})' if what and 'Parquet' not in what else ''}: {reason(exc)}") from None
    names = [n for n in schema.names if n != "__index_level_0__"]
    weight = [dataset.weight_column] if dataset.weight_column else []
    missing = [c for c in dataset.columns + dataset.user_columns + weight if c not in names]
    if missing:
        raise InputError(f"dataset '{dataset.id}': columns {missing} are missing from {path}")
    twice = sorted({c for c in dataset.columns + weight if names.count(c) > 1})
    if twice:
        raise InputError(f"dataset '{dataset.id}': {files[0]} has column(s) {twice} twice: which one holds the data "
                         f"is ambiguous")
    numeric = list(dataset.bounds or {}) + list(dataset.numeric or []) + weight
    wrong = {c: str(schema.field(c).type) for c in numeric
             if not (pa.types.is_integer(schema.field(c).type) or pa.types.is_floating(schema.field(c).type)
                     or pa.types.is_decimal(schema.field(c).type))}
    if wrong:
        raise InputError(f"dataset '{dataset.id}': columns must be numeric, but {wrong} are not")


# ---- every line (the ingest) --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BadLine:
    """The first line of a file whose number of fields is not the header's: its number (internal only) and its
    field count."""
    line: int
    fields: int


def check_lines(path: str, layout: CsvLayout, client=None) -> BadLine | None:
    """The first line (1-based, blank lines counted, the header line 1) whose number of fields differs from
    `layout.names`, or None. A short line was read with its missing fields as nulls, a long one refused by pandas
    with no hint of where. One pass over the file's bytes in blocks (on the dask client when given), each counted
    with numpy: the delimiters between newlines; lines with a quote by Python's csv reader."""
    import dask
    from dask.bytes import read_bytes

    gz = path.endswith(".gz")
    _, blocks = read_bytes(path, delimiter=b"\n", blocksize=None if gz else LINES_BLOCKSIZE, sample=False,
                           compression="gzip" if gz else None)
    parts = [dask.delayed(_count_block)(b, layout.sep, len(layout.names)) for file_blocks in blocks
             for b in file_blocks]
    results = client.compute(parts, sync=True) if client is not None else dask.compute(*parts, scheduler="sync")
    before = 0
    for lines, bad in results:
        if bad is not None:
            return BadLine(before + bad[0] + 1, bad[1])
        before += lines
    return None


def _count_block(block: bytes, sep: str | None, expected: int) -> tuple[int, tuple[int, int] | None]:
    """(lines in the block, (index of its first bad line, its field count) or None). Blank lines are skipped, as the
    reader skips them."""
    import numpy as np

    if not block:
        return 0, None
    if block.startswith(b"\xef\xbb\xbf"):
        block = block[3:]
    data = np.frombuffer(block, dtype=np.uint8)
    newlines = np.flatnonzero(data == 10)
    ends = np.append(newlines, data.size) if not block.endswith(b"\n") else newlines
    starts = np.concatenate([[0], newlines[:ends.size - 1] + 1]) if ends.size else np.empty(0, dtype=np.int64)
    if sep is None or b'"' in block:
        return ends.size, _count_slow(block, starts, ends, sep, expected)
    positions = np.flatnonzero(data == ord(sep))
    fields = np.searchsorted(positions, ends) - np.searchsorted(positions, starts) + 1
    length = ends - starts
    cr = length > 0
    cr[cr] = data[ends[cr] - 1] == 13
    blank = (length - cr) == 0
    bad = np.flatnonzero((fields != expected) & ~blank)
    if bad.size:
        return ends.size, (int(bad[0]), int(fields[bad[0]]))
    return ends.size, None


def _count_slow(block: bytes, starts, ends, sep: str | None, expected: int) -> tuple[int, int] | None:
    """Whitespace-separated or quoted lines: each line by itself (a quoted field may hold the delimiter)."""
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        line = block[s:e].decode("utf-8", errors="replace").rstrip("\r")
        if not line.strip():
            continue
        if sep is None:
            n = len(line.split())
        elif '"' in line:
            n = len(next(csv.reader([line], delimiter=sep), []))
        else:
            n = line.count(sep) + 1
        if n != expected:
            return i, n
    return None
