"""Every stage contract passes on good output and fails, naming stage, column and expectation, on bad; the
dataset's great-expectations project records every release's contracts."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from data_contracts import ContractViolation, suites, validate_parquet
from data_contracts.project import build_docs
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


# ---- the dataset's great-expectations project (data_contracts/project.py) -------------------------------------------
def _gx(tmp_path, release_id: str):
    from data_contracts.gx_run import GxRun

    return GxRun(tmp_path / "gx" / "blobs", "blobs", "kmeans", release_id)


def _stored(gx) -> dict:
    """Every stored validation result of the project: {(suite, run name): result JSON}."""
    folder = gx.root / "gx" / "uncommitted" / "validations"
    out = {}
    for f in folder.rglob("*.json"):
        result = json.loads(f.read_text())
        out[(result["suite_name"], result["meta"]["run_id"]["run_name"])] = result
    return out


def _pages(gx) -> list[Path]:
    return sorted((gx.root / "gx" / "uncommitted" / "data_docs" / "local_site").rglob("*.html"))


def test_every_release_of_a_dataset_records_its_contracts_in_one_project_with_offline_data_docs(tmp_path):
    """Two releases and a failed third: one result per contract and release (named by the release id) in the
    dataset's project, a partitioned contract's row expectations merged over its partitions beside the table's, so
    that the results count what the contract artifact counts; the failed one has its page; the pages load nothing
    from outside the site; suite parameters are named by meaning; no data fingerprint is stored."""
    good = {"x": np.array([0.5, -0.2]), "y": np.array([-0.5, 0.7])}
    contract = suites.normalised(COLS)
    validate_parquet(_parts(tmp_path / "a", [good, good, good]), contract, gx=_gx(tmp_path, "blobs-r1"))
    validate_parquet(_parts(tmp_path / "b", [good, good]), contract, gx=_gx(tmp_path, "blobs-r2"))
    with pytest.raises(ContractViolation):
        validate_parquet(_parts(tmp_path / "c", [good, {"x": np.array([1.5, 0.0]), "y": np.zeros(2)}]), contract,
                         gx=_gx(tmp_path, "blobs-r3"))
    release = {"cluster": np.arange(3, dtype=np.int32), "x": np.array([0.1, 0.2, -0.3]), "y": np.array([0.0, 0.5, 0.1])}
    validate_parquet(write_parquet(tmp_path / "r.parquet", release), suites.kmeans_release(3, COLS),
                     gx=_gx(tmp_path, "blobs-r1"))
    gx = _gx(tmp_path, "blobs-r1")
    assert not gx.index.exists()  # built once per release, at its end
    for i in (1, 2, 3):  # what the flow does when each release ends, passed or failed
        assert build_docs(_gx(tmp_path, f"blobs-r{i}")) == gx.index
    stored = _stored(gx)
    assert set(stored) == {("kmeans.normalised", f"blobs-r{i}") for i in (1, 2, 3)} | {("kmeans.release", "blobs-r1")}
    n = len(contract.rows) + len(contract.table)
    for (suite, run), result in stored.items():
        count = n if suite == "kmeans.normalised" else len(suites.kmeans_release(3, COLS).rows) + 2
        assert result["statistics"]["evaluated_expectations"] == len(result["results"]) == count
        assert result["success"] == (run != "blobs-r3")
        assert result["meta"]["batch_spec"]["data_asset_name"] == "blobs"
        assert "pandas_data_fingerprint" not in json.dumps(result)  # whole-table checkpoints included
    failed = stored[("kmeans.normalised", "blobs-r3")]
    assert [p["success"] for p in failed["meta"]["partitions"]] == [True, False]
    x_range = next(r for r in failed["results"] if r["expectation_config"]["kwargs"].get("column") == "x"
                   and r["expectation_config"]["kwargs"].get("max_value") == 1.0)
    assert not x_range["success"] and x_range["result"]["unexpected_count"] == 1
    assert x_range["meta"]["failed_partitions"] == ["part.1.parquet"] and x_range["result"]["element_count"] == 4
    assert "partial_unexpected_list" not in json.dumps(failed).replace('"partial_unexpected_list": []', "")
    # the checkpoint of a whole-table contract keeps its Data Docs action (for whoever runs it from great-expectations)
    checkpoint = json.loads((gx.root / "gx" / "checkpoints" / "kmeans.release.json").read_text())
    assert [a["type"] for a in checkpoint["actions"]] == ["update_data_docs"]
    suite = (gx.root / "gx" / "expectations" / "kmeans" / "normalised.json").read_text()
    assert {"x_min", "x_max", "finite_min", "finite_max", "l1_norm_max"} <= set(re.findall(r'"\$PARAMETER": "(\w+)"',
                                                                                            suite))
    assert json.loads(suite)["meta"]["dprelease"]["digest"]
    pages = _pages(gx)
    index = (gx.root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html").read_text()
    assert all(f"blobs-r{i}" in index for i in (1, 2, 3))
    assert len([p for p in pages if "validations" in p.parts]) == 4
    outside = re.compile(r'<(?:script|link|img)[^>]+(?:src|href)="(?:https?:)?//', re.IGNORECASE)
    assert not [p for p in pages if outside.search(p.read_text())]
    for page in pages:  # every local asset a page names is there
        for ref in re.findall(r'(?:src|href)="(\.[^"?#]*)', page.read_text()):
            assert (page.parent / ref).exists(), (page, ref)


def test_a_project_survives_a_kill_while_it_was_made_or_its_config_rewritten(tmp_path):
    """A kill while the project was made leaves a temporary folder, never a half-made project; a kill while
    great-expectations rewrote its config (it does when a data asset is added) leaves it empty: the next check
    makes a new config and keeps the history."""
    good = {"x": np.array([0.5, -0.2]), "y": np.array([-0.5, 0.7])}
    gx = _gx(tmp_path, "blobs-r1")
    (gx.root / ".creating-killed" / "gx").mkdir(parents=True)  # what a kill during the creation leaves
    validate_parquet(_parts(tmp_path / "a", [good]), suites.normalised(COLS), gx=gx)
    config = gx.root / "gx" / "great_expectations.yml"
    config.write_text("")
    validate_parquet(_parts(tmp_path / "b", [good]), suites.normalised(COLS), gx=_gx(tmp_path, "blobs-r2"))
    assert {run for _, run in _stored(gx)} == {"blobs-r1", "blobs-r2"}
    config.write_text(config.read_text()[:200])  # cut short
    validate_parquet(_parts(tmp_path / "c", [good]), suites.normalised(COLS), gx=_gx(tmp_path, "blobs-r3"))
    assert {run for _, run in _stored(gx)} == {"blobs-r1", "blobs-r2", "blobs-r3"}


@pytest.mark.parametrize("plant", ["module", "plugin", "store_elsewhere", "others_write"])
def test_a_planted_project_is_refused_before_great_expectations_reads_it(tmp_path, plant):
    """The project may sit under a spec's output_dir: a config another hand left there (a store backend or plugin
    that great-expectations imports as code, a store writing the raw-derived results elsewhere, a folder others may
    write) is refused in one line, and nothing it names runs or is written."""
    import os

    good = {"x": np.array([0.5, -0.2]), "y": np.array([-0.5, 0.7])}
    gx = _gx(tmp_path, "blobs-r1")
    validate_parquet(_parts(tmp_path / "a", [good]), suites.normalised(COLS), gx=gx)
    config = gx.root / "gx" / "great_expectations.yml"
    marker, elsewhere = tmp_path / "ran", tmp_path / "elsewhere"
    if plant == "module":
        (tmp_path / "evil_backend.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
        config.write_text(config.read_text().replace("class_name: TupleFilesystemStoreBackend",
                                                     "class_name: TupleFilesystemStoreBackend\n      module_name: "
                                                     "evil_backend", 1))
    elif plant == "plugin":
        (gx.root / "gx" / "plugins" / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    elif plant == "store_elsewhere":
        config.write_text(config.read_text().replace("base_directory: uncommitted/validations/",
                                                     f"base_directory: {elsewhere}/", 1))
    else:
        os.chmod(gx.root, 0o777)
    with pytest.raises(ValueError, match="the contracts project .* is refused"):
        validate_parquet(_parts(tmp_path / "b", [good]), suites.normalised(COLS), gx=_gx(tmp_path, "blobs-r2"))
    assert not marker.exists() and not elsewhere.exists()


def test_narrow_integer_columns_are_checked_as_arrays_and_still_fail_when_out_of_range(tmp_path):
    """An int32 bin index went value by value through great-expectations' pandas range check (550 ns a record):
    columns are widened to int64 before the check, which must still see every value."""
    contract = suites.encoded("bin", 4)
    ok = write_parquet(tmp_path / "ok.parquet", {"bin": np.array([0, 3, 2], dtype=np.int32)})
    assert validate_parquet(ok, contract)["rows"] == 3
    bad = write_parquet(tmp_path / "bad.parquet", {"bin": np.array([0, 4, 2], dtype=np.int16)})
    with pytest.raises(ContractViolation, match="expect_column_values_to_be_between"):
        validate_parquet(bad, contract)


def test_a_partition_is_validated_a_batch_at_a_time_into_one_result(tmp_path, monkeypatch):
    """A worker holds a batch of a partition, not the partition (memory flat in the records): the batches' results
    are one result of the file, counts summed, a value breaking the range in the last batch found."""
    from data_contracts import validate

    monkeypatch.setattr(validate, "BATCH_BYTES", 1)  # the smallest batch, 2^16 rows
    x = np.linspace(0.0, 1.0, 3 * 2 ** 16 + 5)
    x[-1] = 2.0
    path = tmp_path / "out"
    path.mkdir()
    write_parquet(path / "part.0.parquet", {"x": x})
    failures, rows, result = validate.validate_partition(str(path / "part.0.parquet"), suites.encoded("x", 2))
    assert rows == x.size and len(failures) == 1 and failures[0].detail == "1 rows break it"
    between, = [r for r in result["results"] if r["expectation_config"]["type"] == "expect_column_values_to_be_between"]
    assert between["result"]["element_count"] == x.size and between["result"]["unexpected_count"] == 1
    assert result["statistics"]["unsuccessful_expectations"] == 1 and not result["success"]


def test_partitions_validated_at_once_on_threads_of_one_worker_get_their_own_results(tmp_path):
    """A worker's threads shared one great-expectations context, whose engine keeps the validated frame under a batch
    id the same for every frame: validations at once read each other's frame (a partition breaking its contract
    passed in 9 of 60 on 2 threads)."""
    from concurrent.futures import ThreadPoolExecutor

    from data_contracts.validate import validate_partition

    good = write_parquet(tmp_path / "good.parquet", {"bin": np.arange(200_000, dtype=np.int32) % 4})
    bad = write_parquet(tmp_path / "bad.parquet", {"bin": np.full(100_000, 7, dtype=np.int32)})
    contract = suites.encoded("bin", 4)

    def check(i: int) -> tuple[bool, bool, int]:
        failures, rows, _ = validate_partition(str(good if i % 2 else bad), contract)
        return bool(i % 2), bool(failures), rows
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(check, range(40)))
    assert all(is_good != failed and rows == (200_000 if is_good else 100_000) for is_good, failed, rows in results)
