"""The row suites' directly computed results (data_contracts/direct.py) against great-expectations' own validation:
a frame great-expectations fails is never passed directly, and a directly passed frame's result is great-expectations'
result field for field; so a partition's outcome, and what is recorded in the dataset's project, is the same whichever
computed it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts import suites
from data_contracts.direct import Suite
from data_contracts.results import result_key
from data_contracts.validate import _widened, validate_partition, validated_by_gx

BIG = 2 ** 53 + 1  # an int64 that float64 does not hold


def _contracts() -> dict:
    return {"ingested": suites.ingested(["x", "y"], {"c": ["a", "b"]}, weight="w", max_weight=5),
            "normalised": suites.normalised(["x", "y"]),
            "encoded": suites.encoded("bin", 16, weight="weight"),
            "sets": suites.ingested_sets("items", 100)}


def _good(name: str, n: int = 6) -> dict:
    """Columns that pass `name`'s suite, values at its bounds included."""
    if name == "ingested":
        return {"x": np.linspace(-1e300, 1e300, n), "y": np.zeros(n),
                "c": np.array(["a", "b", "z", "a", "b", "a"][:n], dtype=object),
                "w": np.array([0.0, 5.0, 1, 2, 3, 4][:n])}
    if name == "normalised":
        return {"x": np.array([-1.0, 0.5, 0, 0.25, 1.0, -0.5][:n]), "y": np.array([0.0, -0.5, 0, 0.75, 0, 0.5][:n])}
    if name == "encoded":
        return {"bin": np.array([0, 15, 3, 3, 7, 1][:n], dtype=np.int32), "weight": np.array([0, 1, 2, 0, 9, 1.5][:n])}
    return {"n_items": np.array([1, 100, 3, 2, 5, 1][:n], dtype=np.int32),
            "min_item": np.array([0, 0, 7, 1, 99, 3][:n], dtype=np.int32),
            "max_item": np.array([0, 99, 9, 2, 99, 3][:n], dtype=np.int32)}


def _frame(contract, columns: dict) -> pd.DataFrame:
    """The frame validation sees: read from Arrow, narrow integers widened, derived columns added."""
    frame = _widened(pa.table(columns)).to_pandas()
    return contract.derive(frame) if contract.derive is not None else frame


def _broken(name: str) -> list[dict]:
    """Variants of the good columns, each breaking (or testing the edge of) one rule."""
    g = _good(name)
    first = next(iter(g))
    out = []
    for col, v in g.items():
        if v.dtype.kind == "f":
            for bad in (np.nan, np.inf, -np.inf, 1e308 * 10, np.nextafter(1.0, 2.0), -np.nextafter(1.0, 2.0),
                        np.nextafter(5.0, 6.0), -1e-300, 0.5):
                w = v.copy()
                w[2] = bad
                out.append({**g, col: w})
            out.append({**g, col: np.full(len(v), np.nan)})
            with np.errstate(all="ignore"):
                out += [{**g, col: v.astype(np.float32)}, {**g, col: v.astype(np.int64)}]
        elif v.dtype.kind == "i":
            for bad in (-1, 16, 99, 100, 101, BIG, -BIG):
                w = v.astype(np.int64)
                w[2] = bad
                out.append({**g, col: w})
            out.append({**g, col: v.astype(np.float64)})
            out.append({**g, col: pa.array(list(v[:2]) + [None] + list(v[3:]), type=pa.int32())})
        else:
            out.append({**g, col: pa.array(["a", None, "b", "a", "b", "a"])})
    out.append({k: v for k, v in g.items() if k != first})  # a column missing
    out.append({**g, "extra": np.zeros(len(g[first]))})  # one too many
    out.append(dict(reversed(g.items())))  # the columns out of order
    out.append({k: v[:0] for k, v in g.items()})  # no rows
    return out


def _by_key(result: dict) -> dict:
    return {result_key(r["expectation_config"]): r for r in result["results"]}


def _compare(contract, columns: dict) -> tuple[dict, dict | None]:
    frame = _frame(contract, columns)
    return validated_by_gx(frame, contract.rows, contract.stage), Suite(contract.rows, contract.stage).passing(frame)


@pytest.mark.slow  # about 170 validations by great-expectations: 20-130 s on 2 shared cores
@pytest.mark.parametrize("name", ["ingested", "normalised", "encoded", "sets"])
def test_direct_results_are_great_expectations_results(name):
    contract = _contracts()[name]
    gx, direct = _compare(contract, _good(name))
    assert gx["success"] and direct is not None  # the suite's good case is decided directly, as great-expectations
    assert _by_key(direct) == _by_key(gx)
    assert direct["statistics"] == gx["statistics"]
    decided = failed = 0
    for columns in _broken(name):
        gx, direct = _compare(contract, columns)
        failed += not gx["success"]
        if direct is None:
            continue
        decided += 1
        assert gx["success"], f"passed directly, failed by great-expectations: {columns}"
        assert _by_key(direct) == _by_key(gx)
    assert failed >= 5 and decided >= 1  # the variants break the suite, and some edges pass directly


@pytest.mark.slow
def test_random_frames_agree():
    """Frames of random values where each value may be NaN, infinite, a bound or just past it."""
    rng = np.random.default_rng(1)
    contract = _contracts()["normalised"]
    specials = np.array([np.nan, np.inf, -np.inf, 1.0, -1.0, np.nextafter(1.0, 2.0), 0.0])
    agreed = passed = 0
    for _ in range(40):
        n = int(rng.integers(1, 8))
        cols = {c: rng.uniform(-0.45, 0.45, n) for c in ("x", "y")}
        for c in cols:
            hit = rng.random(n) < 0.15
            cols[c][hit] = rng.choice(specials, hit.sum())
        gx, direct = _compare(contract, cols)
        if direct is not None:
            assert gx["success"] and _by_key(direct) == _by_key(gx)
            agreed += 1
        passed += gx["success"]
    assert agreed == passed > 3  # every frame great-expectations passed was decided directly, the same way


@pytest.mark.parametrize("name", ["ingested", "normalised", "encoded", "sets"])
def test_good_frames_are_decided_directly_as_great_expectations_decides(name):
    """The default suite's share: each contract's good frame (values at its bounds) passed directly, with
    great-expectations' result."""
    contract = _contracts()[name]
    gx, direct = _compare(contract, _good(name))
    assert gx["success"] and direct is not None and _by_key(direct) == _by_key(gx)
    assert direct["statistics"] == gx["statistics"]


def test_a_partition_failing_in_one_batch(tmp_path, monkeypatch):
    """A Parquet partition read in several batches, one of them breaking the suite: the failure and the merged
    counts are great-expectations' (the failing batch is validated by it), and the passing batches count alike."""
    monkeypatch.setattr("data_contracts.validate.BATCH_BYTES", 8 * 2 ** 16)
    contract = suites.normalised(["x", "y"])
    n = 3 * 2 ** 16
    x = np.linspace(-0.5, 0.5, n)
    x[n - 10] = 1.5  # in the third batch
    pq.write_table(pa.table({"x": x, "y": np.zeros(n)}), tmp_path / "part.0.parquet")
    failures, rows, result = validate_partition(str(tmp_path / "part.0.parquet"), contract)
    assert rows == n and not result["success"]
    assert {(f.column, f.expectation, f.detail) for f in failures} == {
        ("x", "expect_column_values_to_be_between", "1 rows break it"),
        ("l1_norm", "expect_column_values_to_be_between", "1 rows break it")}
    whole = validated_by_gx(_frame(contract, {"x": x, "y": np.zeros(n)}), contract.rows, contract.stage)
    for key, r in _by_key(whole).items():
        merged = _by_key(result)[key]
        assert merged["success"] == r["success"]
        assert (merged["result"].get("element_count"), merged["result"].get("unexpected_count")) == \
            (r["result"].get("element_count"), r["result"].get("unexpected_count"))
