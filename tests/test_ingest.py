"""Ingest reads each record by itself: how one record is parsed never depends on another's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tasks.ingest import read_source
from tasks.params import DatasetSpec


def _levels(path: Path) -> dict:
    spec = DatasetSpec(id="t", path=str(path), bounds={"x": [0, 1]}, categories={"sex": ["1", "2"]})
    return read_source(spec, path).compute()["sex"].value_counts(dropna=False).to_dict()


def test_one_records_value_never_changes_how_the_others_are_read(tmp_path):
    """Neighbouring files differ in one record's level only. With dask's guess of the column types from a sample,
    one record's 1.5 in an integer-coded column made every other record of its partition "1.0", outside the
    public levels (one record moving every count); placed after the sample, it made the file unreadable."""
    rng = np.random.default_rng(0)
    rows = [f"{s},{x:.3f}" for s, x in zip(rng.integers(1, 3, 50_000), rng.uniform(0, 1, 50_000))]
    base = tmp_path / "base.csv"
    base.write_text("sex,x\n" + "\n".join(rows) + "\n")
    expected = _levels(base)
    assert set(expected) == {"1", "2"}
    for at in (5, 49_000):  # inside and after the first 256 kB dask samples
        neighbour = tmp_path / f"neighbour{at}.csv"
        neighbour.write_text("sex,x\n" + "\n".join(rows[:at] + ["1.5,0.5"] + rows[at:]) + "\n")
        assert _levels(neighbour) == {**expected, "1.5": 1}


def test_whole_numbers_stored_as_floats_read_as_integer_levels_value_by_value(tmp_path):
    path = tmp_path / "levels.parquet"
    pd.DataFrame({"sex": [1.0, 2.0, 1.5, None, 1e20], "x": [0.1] * 5}).to_parquet(path)
    spec = DatasetSpec(id="t", path=str(path), bounds={"x": [0, 1]}, categories={"sex": ["1", "2"]})
    assert read_source(spec, path).compute()["sex"].tolist() == ["1", "2", "1.5", pd.NA, "1e+20"]


def test_columns_the_spec_does_not_name_are_not_read(tmp_path):
    """Typed by dask's guess from a sample, an undeclared integer column with one record's 40.5 (or a blank)
    past the sample refused the whole file: a free question about any record."""
    rng = np.random.default_rng(1)
    rows = [f"{s},{x:.3f},{h}" for s, x, h in zip(rng.integers(1, 3, 50_000), rng.uniform(0, 1, 50_000),
                                                    rng.integers(1, 99, 50_000))]
    for odd in ("40.5", "", "x"):
        path = tmp_path / f"undeclared{odd}.csv"
        path.write_text("sex,x,hours\n" + "\n".join(rows[:49_000] + [f"1,0.5,{odd}"] + rows[49_000:]) + "\n")
        assert sum(_levels(path).values()) == 50_001


def test_parquet_categories_and_nullable_floats_are_read_value_by_value(tmp_path):
    """A writer's category column turns integer codes into float categories (1.0, 2.0) once one record holds
    1.5; a nullable Float64's null stays null (it read as the level "0")."""
    coded = pd.Series([1.0, 2.0, 1.5, 2.0]).astype("category")
    nullable = pd.Series([1.0, None, 2.0, 2.0], dtype="Float64")
    for i, col in enumerate((coded, nullable)):
        path = tmp_path / f"levels{i}.parquet"
        pd.DataFrame({"sex": col, "x": [0.1] * 4}).to_parquet(path)
        spec = DatasetSpec(id="t", path=str(path), bounds={"x": [0, 1]}, categories={"sex": ["1", "2"]})
        got = read_source(spec, path).compute()["sex"].tolist()
        assert got == (["1", "2", "1.5", "2"] if i == 0 else ["1", pd.NA, "2", "2"])


def test_a_line_with_more_fields_than_the_header_is_refused_not_read_as_its_first_fields(tmp_path):
    """A review's ragged line `1,2,3,4` in a two-column file was read as (1, 2) without a word."""
    import logging

    import pytest

    from tasks.errors import InputError
    from tasks.ingest import ingest_dataset

    for name, text, header in (("h.csv", "x,y\n0.1,0.2\n1,2,3,4\n0.5,0.6\n", True),
                               ("n.csv", "0.1,0.2\n1,2,3,4\n0.5,0.6\n", False)):
        path = tmp_path / name
        path.write_text(text)
        spec = DatasetSpec(id="t", path=str(path), header=header, bounds={"x": [0, 1], "y": [0, 1]})
        with pytest.raises(InputError, match="has a malformed line: 4 field") as refused:  # no line number, no value
            ingest_dataset(spec, str(tmp_path / f"out-{name}"), tmp_path, logging.getLogger("test"))
        assert "Expected" not in str(refused.value)
    fine = tmp_path / "fine.csv"
    fine.write_text("x,y,note\n0.1,0.2,a\n0.3,0.4,b c\n")
    spec = DatasetSpec(id="t", path=str(fine), bounds={"x": [0, 1], "y": [0, 1]})
    assert read_source(spec, fine).compute().values.tolist() == [[0.1, 0.2], [0.3, 0.4]]


def test_a_null_item_in_a_record_is_refused_not_dropped(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest

    from tasks.errors import InputError
    from tasks.sets import ingest_sets, ingest_users

    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"u": [1, 1, 2], "items": pa.array([[1, 2], [None, 3], [4]], type=pa.list_(pa.int32()))}),
                   path)
    with pytest.raises(InputError, match="null item ids"):
        ingest_sets(path, "parquet", "items", tmp_path / "a", item_count=10)
    with pytest.raises(InputError, match="null item ids"):
        ingest_users(path, "items", "u", tmp_path / "b", item_count=10)


def test_a_parquet_file_is_ingested_by_arrow_as_dask_reads_it(tmp_path):
    """A Parquet source is typed file by file from Arrow, a batch at a time (`ingest_file`), not by dask and pandas:
    the same columns in the same order, the same values and levels, the same refusals."""
    import pyarrow.parquet as pq
    import pytest

    from tasks.errors import InputError
    from tasks.partitions import ingest_file

    source = pd.DataFrame({"hours": np.array([1, 2, 2 ** 60, 4], dtype=np.int64), "w": [1, 0, 3, 2],
                           "sex": pd.Series([1.0, 2.0, 1.5, 2.0]).astype("category"),
                           "x": pd.Series([0.1, None, 0.3, 0.4], dtype="Float64"), "other": ["a", "b", "c", "d"]})
    path = tmp_path / "src.parquet"
    source.to_parquet(path)
    spec = DatasetSpec(id="t", path=str(path), bounds={"x": [0, 1], "hours": [0, 99]},
                       categories={"sex": ["1", "2"]}, weight_column="w", max_weight=3)
    wanted = spec.columns + ["w"]
    rows = ingest_file(str(path), str(tmp_path / "out.parquet"), wanted=wanted, numeric=["x", "hours", "w"],
                       categorical=["sex"], dataset_id="t", source=str(path))
    ours = pq.read_table(tmp_path / "out.parquet").to_pandas()
    theirs = read_source(spec, path).compute().reset_index(drop=True)
    assert rows == 4 and list(ours.columns) == list(theirs.columns) == wanted
    pd.testing.assert_frame_equal(ours, theirs, check_dtype=False)
    with pytest.raises(InputError, match="columns must be numeric"):
        ingest_file(str(path), str(tmp_path / "bad.parquet"), wanted=["other"], numeric=["other"], categorical=[],
                    dataset_id="t", source=str(path))
    with pytest.raises(InputError, match="missing"):
        ingest_file(str(path), str(tmp_path / "bad.parquet"), wanted=["nope"], numeric=["nope"], categorical=[],
                    dataset_id="t", source=str(path))
