"""Set-valued records: ingest normalisation, the transactions format, the CDR / transit generators."""

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts import ContractViolation, suites, validate_parquet
from tasks import generators
from tasks.errors import InputError
from tasks.sets import ingest_sets, read_sets


def test_records_become_sorted_distinct_sets_with_their_summaries(tmp_path):
    src = tmp_path / "t.dat.gz"
    with gzip.open(src, "wt") as fh:
        fh.write("5 3 5 1\n7\n2 2 2\n")
    rows, parts, _ = ingest_sets(src, "transactions", "items", tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / "part.0.parquet")
    assert (rows, parts) == (3, 1)
    assert table.column("items").to_pylist() == [[1, 3, 5], [7], [2]]
    assert table.column("n_items").to_pylist() == [3, 1, 1]
    assert table.column("min_item").to_pylist() == [1, 7, 2] and table.column("max_item").to_pylist() == [5, 7, 2]
    validate_parquet(tmp_path / "out", suites.ingested_sets("items", 8))
    X = read_sets(str(tmp_path / "out" / "part.0.parquet"), "items", 8)
    assert X.shape == (3, 8) and X.toarray()[0].tolist() == [0, 1, 0, 1, 0, 1, 0, 0]


def test_item_ids_outside_the_public_universe_are_left_out_and_counted(tmp_path):
    """As numeric values are clipped to public bounds: refusing them would give whoever chose item_count the
    largest id in the data for free."""
    src = tmp_path / "t.dat"
    src.write_text("1 2\n9\n7 3\n4\n")
    rows, parts, outside = ingest_sets(src, "transactions", "items", tmp_path / "out", item_count=5)
    assert rows == 3 and outside == {"records_trimmed": 2, "records_left_out": 1}
    assert pq.read_table(tmp_path / "out" / "part.0.parquet").column("items").to_pylist() == [[1, 2], [3], [4]]
    validate_parquet(tmp_path / "out", suites.ingested_sets("items", 5))


def test_out_of_range_and_empty_records_break_the_contract(tmp_path):
    src = tmp_path / "t.dat"
    src.write_text("1 2\n9\n\n-1 3\n")
    ingest_sets(src, "transactions", "items", tmp_path / "out")
    with pytest.raises(ContractViolation) as info:
        validate_parquet(tmp_path / "out", suites.ingested_sets("items", 5))
    failed = {(f.column, f.expectation) for f in info.value.failures}
    assert ("max_item", "expect_column_values_to_be_between") in failed   # 9 >= item_count
    assert ("n_items", "expect_column_values_to_be_between") in failed    # the empty line
    assert ("min_item", "expect_column_values_to_be_between") in failed   # -1


def test_bad_tokens_and_wrong_column_types_are_clear_errors(tmp_path):
    (tmp_path / "bad.dat").write_text("1 2\n3 x\n")
    with pytest.raises(InputError, match="item ids must be integers") as refused:
        ingest_sets(tmp_path / "bad.dat", "transactions", "items", tmp_path / "o1")
    assert "2" not in str(refused.value).replace(str(tmp_path), "")  # no line number: it counts records
    pq.write_table(pa.table({"items": ["a", "b"]}), tmp_path / "s.parquet")
    with pytest.raises(InputError, match="not a list"):
        ingest_sets(tmp_path / "s.parquet", "parquet", "items", tmp_path / "o2")


def test_cdr_generator_is_deterministic_realistic_and_heavy_tailed(tmp_path):
    a = generators.generate(generators.CDR, tmp_path / "a", users=60_000, seed=3, partition_rows=30_000)
    b = generators.generate(generators.CDR, tmp_path / "b", users=60_000, seed=3, partition_rows=30_000)
    assert [pq.read_table(x).equals(pq.read_table(y)) for x, y in zip(a, b)] == [True, True]
    towers = pq.read_table(a[0]).column("towers")
    lengths = np.diff(towers.combine_chunks().offsets.to_numpy())
    assert 9.5 < lengths.mean() < 13.5 and lengths.min() >= 1 and lengths.max() > 60
    pop = np.bincount(towers.combine_chunks().values.to_numpy(), minlength=1303)
    assert pop.std() / pop.mean() > 0.8                     # heavy-tailed tower popularity
    transit = generators.generate(generators.TRANSIT, tmp_path / "t", users=30_000, seed=3)
    lengths = np.diff(pq.read_table(transit[0]).column("stations").combine_chunks().offsets.to_numpy())
    assert 4.5 < lengths.mean() < 6.0


def test_rows_of_one_user_become_one_record(tmp_path):
    """With a user column, the privacy unit is the user: their rows (across files) merge into one set."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.sets import ingest_users, read_sets

    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"user": [7, 3, 7], "items": pa.array([[1, 2], [5], [2, 9]], type=pa.list_(pa.int32()))}),
                   src / "a.parquet")
    pq.write_table(pa.table({"user": [3, 8], "items": pa.array([[0], []], type=pa.list_(pa.int32()))}),
                   src / "b.parquet")
    rows, parts, _ = ingest_users(src, "items", "user", tmp_path / "out")
    X = read_sets(str(tmp_path / "out" / "part.0.parquet"), "items", 10)
    assert rows == 2 and parts == 1  # user 8 has no items: no record (the ingest contract refuses empty ones)
    assert [sorted(X[i].indices.tolist()) for i in range(2)] == [[0, 5], [1, 2, 9]]
    assert "user" not in pq.ParquetFile(tmp_path / "out" / "part.0.parquet").schema_arrow.names


def _by_lines(path) -> tuple[list, list]:
    """The records of a transactions file by Python's text reading, a line at a time (how they were read before the
    blocks): items per line and every item id, or the exception it raises."""
    import io

    raw = gzip.open(path).read() if str(path).endswith(".gz") else open(path, "rb").read()
    lengths, values = [], []
    for line in io.StringIO(raw.decode("utf-8-sig"), newline=None):
        items = [int(t) for t in line.split()]
        lengths.append(len(items))
        values.extend(items)
    return lengths, values


@pytest.mark.parametrize("text", [
    "5 3 5 1\n7\n2 2 2\n", "1 2\n\n\n3", "\ufeff1 2\r\n3\r\n", "1\r2\r\n3\n", "  +4\t-2 \t 007\n\n 9  ",
    "1\x0b2\x0c3\n4\xa05\u30006\n", "1 2\n3 4\n" * 40, "", "\n", "1" * 17 + " 2\n", "٣ 4\n", "1_0 2\n"])
@pytest.mark.parametrize("block", [7, 2 ** 20])
def test_transactions_blocks_read_as_python_reads_lines(tmp_path, monkeypatch, text, block):
    """Lines and tokens found in blocks by numpy, or by Python's text rules where a block holds anything but ASCII
    digits, signs, spaces, tabs and line feeds: the same records as a line at a time, cut into the same partitions
    (blocks of 7 bytes cut lines and a CRLF's neighbours; parts of 3 records)."""
    from tasks import sets

    monkeypatch.setattr(sets, "BLOCK_BYTES", block)
    monkeypatch.setattr(sets, "ROWS_PER_PART", 3)
    src = tmp_path / "t.dat.gz"
    with gzip.open(src, "wb") as fh:
        fh.write(text.encode("utf-8"))
    lengths, values = _by_lines(src)
    chunks = list(sets._transaction_chunks(str(src)))
    assert [c[0].size - 1 for c in chunks] == [min(3, len(lengths) - i) for i in range(0, len(lengths), 3)]
    assert np.concatenate([np.diff(c[0]) for c in chunks] or [[]]).tolist() == lengths
    assert np.concatenate([c[1] for c in chunks] or [[]]).tolist() == values


@pytest.mark.parametrize("text", ["1 2\n3 x\n", "1 -\n", "1 2-3\n", "+\n", "1 ++2\n", "1 2\n3\xe94\n"])
def test_transactions_bad_tokens_refused_as_python_refuses_them(tmp_path, monkeypatch, text):
    from tasks import sets

    monkeypatch.setattr(sets, "BLOCK_BYTES", 4)
    (tmp_path / "bad.dat").write_text(text)
    with pytest.raises(ValueError):
        _by_lines(tmp_path / "bad.dat")
    with pytest.raises(InputError, match="item ids must be integers"):
        list(sets._transaction_chunks(str(tmp_path / "bad.dat")))
