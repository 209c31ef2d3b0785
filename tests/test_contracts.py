"""Every stage contract passes on good output and fails, naming stage, column and expectation, on bad."""

import numpy as np
import pytest

from data_contracts import ContractViolation, suites, validate_parquet
from tests.conftest import write_parquet

COLS = ["x", "y"]


def _fails(path, contract, column, expectation):
    with pytest.raises(ContractViolation) as info:
        validate_parquet(path, contract)
    msg = str(info.value)
    assert f"stage '{contract.stage}'" in msg
    assert any(f.column == column and f.expectation == expectation for f in info.value.failures), msg
    if column:
        assert f"column '{column}'" in msg and expectation in msg


def _parts(tmp_path, frames):
    folder = tmp_path / "out"
    folder.mkdir(parents=True)
    for i, cols in enumerate(frames):
        write_parquet(folder / f"part.{i}.parquet", cols)
    return folder


def test_ingested_contract(tmp_path):
    good = {"x": np.array([1.0, 2.0]), "y": np.array([3.0, 4.0])}
    assert validate_parquet(_parts(tmp_path / "a", [good, good]), suites.ingested(COLS))["rows"] == 4
    _fails(_parts(tmp_path / "b", [good, {"x": np.array([1.0, np.nan]), "y": np.ones(2)}]),
           suites.ingested(COLS), "x", "expect_column_values_to_not_be_null")
    _fails(_parts(tmp_path / "c", [{"x": np.array([1.0, np.inf]), "y": np.ones(2)}]),
           suites.ingested(COLS), "x", "expect_column_values_to_be_between")
    _fails(_parts(tmp_path / "d", [{"x": np.ones(2)}]), suites.ingested(COLS), None,
           "expect_table_columns_to_match_ordered_list")
    _fails(_parts(tmp_path / "e", [{"x": np.ones(2), "y": np.array([1, 2], dtype=np.int64)}]),
           suites.ingested(COLS), "y", "expect_column_values_to_be_of_type")
    _fails(_parts(tmp_path / "f", [{"x": np.ones(0), "y": np.ones(0)}]), suites.ingested(COLS),
           "row_count", "expect_column_values_to_be_between")


def test_normalised_contract(tmp_path):
    good = {"x": np.array([0.5, -0.2]), "y": np.array([-0.5, 0.7])}
    validate_parquet(_parts(tmp_path / "a", [good]), suites.normalised(COLS))
    _fails(_parts(tmp_path / "b", [{"x": np.array([1.5, 0.0]), "y": np.zeros(2)}]),
           suites.normalised(COLS), "x", "expect_column_values_to_be_between")
    # Every coordinate in [-1, 1] but the row outside the L1 ball.
    _fails(_parts(tmp_path / "c", [{"x": np.array([0.8, 0.0]), "y": np.array([0.7, 0.0])}]),
           suites.normalised(COLS), suites.L1_NORM, "expect_column_values_to_be_between")


def _trajectory(T=3, K=2, d=2, **overrides):
    cols = {"iteration": np.repeat(np.arange(1, T + 1, dtype=np.int32), K),
            "cluster": np.tile(np.arange(K, dtype=np.int32), T),
            "noisy_count": np.full(T * K, 10.0)}
    cols.update({f"noisy_sum_{j}": np.full(T * K, 1.0) for j in range(d)})
    cols.update({f"centroid_{j}": np.full(T * K, 0.1) for j in range(d)})
    cols.update(overrides)
    return cols


def test_measurements_contract(tmp_path):
    contract = suites.kmeans_measurements(k=2, iterations=3, d=2)
    validate_parquet(write_parquet(tmp_path / "ok.parquet", _trajectory()), contract)
    _fails(write_parquet(tmp_path / "t.parquet", _trajectory(T=2)), suites.kmeans_measurements(2, 3, 2),
           None, "expect_table_row_count_to_equal")
    _fails(write_parquet(tmp_path / "n.parquet", _trajectory(noisy_sum_1=np.array([1, 2, np.nan, 4, 5, 6.0]))),
           contract, "noisy_sum_1", "expect_column_values_to_not_be_null")
    _fails(write_parquet(tmp_path / "c.parquet", _trajectory(centroid_0=np.full(6, 0.95))),
           contract, suites.L1_NORM, "expect_column_values_to_be_between")
    bad_iter = _trajectory(iteration=np.array([1, 1, 2, 2, 4, 4], dtype=np.int32))
    _fails(write_parquet(tmp_path / "i.parquet", bad_iter), contract, "iteration",
           "expect_column_distinct_values_to_equal_set")


def test_measurements_contract_with_a_seeding_round(tmp_path):
    seeds = {name: np.concatenate([np.zeros(8, dtype=np.int32) if name == "iteration" else
                                   np.arange(8, dtype=np.int32) if name == "cluster" else np.full(8, 0.2), v])
             for name, v in _trajectory(T=2).items()}  # 8 candidates (iteration 0), then Algorithm 1's 2 iterations
    validate_parquet(write_parquet(tmp_path / "ok.parquet", seeds), suites.kmeans_measurements(2, 2, 2, seeds=8))
    _fails(write_parquet(tmp_path / "none.parquet", _trajectory(T=2)), suites.kmeans_measurements(2, 2, 2, seeds=8),
           None, "expect_table_row_count_to_equal")
    _fails(write_parquet(tmp_path / "unseeded.parquet", seeds), suites.kmeans_measurements(2, 2, 2),
           None, "expect_table_row_count_to_equal")


def test_release_contract(tmp_path):
    contract = suites.kmeans_release(k=3, columns=COLS)
    ok = {"cluster": np.arange(3, dtype=np.int32), "x": np.array([0.1, 0.2, -0.3]), "y": np.array([0.0, 0.5, 0.1])}
    validate_parquet(write_parquet(tmp_path / "ok.parquet", ok), contract)
    _fails(write_parquet(tmp_path / "k.parquet", {k: v[:2] for k, v in ok.items()}), contract, None,
           "expect_table_row_count_to_equal")
    _fails(write_parquet(tmp_path / "b.parquet", {**ok, "y": np.array([0.0, 0.9, 0.1])}), contract,
           suites.L1_NORM, "expect_column_values_to_be_between")


def test_corrupt_parquet_breaks_the_contract(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "part.0.parquet").write_bytes(b"PAR1 garbage")
    _fails(folder, suites.ingested(COLS), None, "readable_parquet")
