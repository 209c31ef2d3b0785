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
