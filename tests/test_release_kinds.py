"""The histogram, contingency-table and matrix-mechanism releases through the real flow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dpalgos import contingency
from dpalgos.hierarchy import Tree
from flows.release import TEST_RUN
from tasks.errors import InputError, ReleaseConflict
from tasks.kinds.contingency import write_marginals
from tasks.spec import parse_spec
from tests.conftest import write_csv, write_parquet

pytestmark = pytest.mark.usefixtures("prefect_api")


def _run(d: dict):
    from flows.release import release

    return release(spec=parse_spec(d))


def _base(tmp_path, dataset: dict, release: dict) -> dict:
    return {"dataset": dataset, "release": release, "output_dir": str(tmp_path / "runs"),
            "mode": "test", "seed": 11}


def _sparse_histogram(n=256, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.1, rng.integers(50, 400, n), 0)


def test_histogram_release_is_consistent_nonnegative_with_a_signed_estimate_for_sums(tmp_path):
    """The tree strategy (ranges): non-negative counts whose tree is exactly consistent, the signed least-squares
    estimate beside them, the internal evaluation scoring what is published."""
    truth = _sparse_histogram()
    data = write_parquet(tmp_path / "h.parquet", {"value": np.arange(256) + 0.5, "n": truth.astype(float)})
    s = _run(_base(tmp_path, {"id": "h", "path": str(data), "bounds": {"value": [0, 256]}, "weight_column": "n",
                    "weights_count_records": True},
                   {"kind": "histogram", "bins": 256, "branching": 4, "epsilon": 1.0, "strategy": "tree"}))
    rel = Path(s["release_dir"])
    hist = pq.read_table(rel / "histogram.parquet").to_pandas()
    tree = pq.read_table(rel / "tree.parquet").to_pandas()
    t = Tree(256, 4)
    assert hist["count"].min() >= 0 and len(hist) == 256
    for column in ("count", "estimate"):  # every parent = sum of children
        assert np.abs(t.consistency_matrix() @ tree[column].to_numpy()).max() < 1e-6
        assert np.allclose(t.leaves_of(tree[column].to_numpy()), hist[column])
    assert hist["estimate"].min() < 0  # signed: the noise of empty bins is kept, so sums stay unbiased
    manifest = json.loads((rel / "manifest.json").read_text())
    assert manifest["privacy"]["mechanisms"][0]["sensitivity"] == t.levels
    ev = json.loads(Path(s["evaluation"]).read_text())
    assert ev["records"] == truth.sum() and ev["strategy"] == "tree" and ev["range_query_mse"]
    assert json.loads((rel / "consistency.json").read_text())["converged"]


def test_histogram_for_ranges_measures_hdmms_strategy_and_commits_it(tmp_path):
    """The default for ranges (up to 4,096 bins): HDMM's p-Identity strategy, its matrix committed with the
    measurements (public), Laplace at sensitivity 1 on its answers, the estimate its least squares."""
    from dpalgos.hdmm import PIdentity

    truth = _sparse_histogram()
    data = write_parquet(tmp_path / "h.parquet", {"value": np.arange(256) + 0.5, "n": truth.astype(float)})
    s = _run(_base(tmp_path, {"id": "h", "path": str(data), "bounds": {"value": [0, 256]}, "weight_column": "n",
                    "weights_count_records": True},
                   {"kind": "histogram", "bins": 256, "epsilon": 1.0}))
    rel = Path(s["release_dir"])
    with np.load(rel / "measurements" / "strategy.npz") as f:
        strategy = PIdentity(f["B"])
    noisy = pq.read_table(rel / "noisy_strategy.parquet").column("noisy_count").to_numpy()
    hist = pq.read_table(rel / "histogram.parquet").to_pandas()
    assert strategy.B.shape == (16, 256) and noisy.size == 272 and not (rel / "tree.parquet").exists()
    assert np.allclose(hist["estimate"], strategy.least_squares(noisy))
    assert np.array_equal(hist["count"], np.maximum(hist["estimate"], 0))
    (mechanism,) = json.loads((rel / "manifest.json").read_text())["privacy"]["mechanisms"]
    assert mechanism["name"] == "strategy" and mechanism["sensitivity"] == pytest.approx(1.0, abs=1e-8)
    assert strategy.sensitivity() <= mechanism["sensitivity"]
    assert json.loads(Path(s["evaluation"]).read_text())["strategy"] == "optimized"


@pytest.mark.parametrize("n", [2, 3, 5, 8, 9, 12, 24, 40])
def test_an_optimised_strategy_reconstructs_every_bin_without_noise(n):
    """Sizes not shipped are optimised on first use: the strategy's least squares returns the histogram it was given
    (at 8 bins an unchecked run once returned B entries of 1e9 and a least squares that lost bin 3), and its loss is
    the dense formula's, never below what the identity strategy cannot beat by cancellation."""
    from dpalgos import hdmm

    result = hdmm.optimise(n, seed=0)
    strategy = hdmm.PIdentity.of(result.B)
    x = np.arange(1.0, n + 1.0)
    assert hdmm.sane(result.B) and np.allclose(strategy.least_squares(strategy.answers(x)), x)
    A = np.vstack([np.eye(n), result.B]) / (1.0 + result.B.sum(axis=0))
    W = np.array([[1.0 if a <= j < b else 0.0 for j in range(n)] for a in range(n) for b in range(a + 1, n + 1)])
    dense = np.linalg.norm(W @ np.linalg.pinv(A), "fro") ** 2
    assert result.loss == pytest.approx(dense, rel=1e-6) and result.loss <= hdmm.identity_loss(n) * (1 + 1e-9)


def test_histogram_for_single_bins_measures_every_bin_once(tmp_path):
    """The identity strategy (workload unit): the noisy bins at sensitivity 1, no tree; the counts are the noisy
    bins cut at zero, the estimate the noisy bins."""
    truth = _sparse_histogram()
    data = write_parquet(tmp_path / "h.parquet", {"value": np.arange(256) + 0.5, "n": truth.astype(float)})
    s = _run(_base(tmp_path, {"id": "h", "path": str(data), "bounds": {"value": [0, 256]}, "weight_column": "n",
                    "weights_count_records": True},
                   {"kind": "histogram", "bins": 256, "epsilon": 1.0, "workload": "unit"}))
    rel = Path(s["release_dir"])
    hist = pq.read_table(rel / "histogram.parquet").to_pandas()
    noisy = pq.read_table(rel / "noisy_bins.parquet").column("noisy_count").to_numpy()
    assert not (rel / "tree.parquet").exists() and np.array_equal(hist["estimate"], noisy)
    assert np.array_equal(hist["count"], np.maximum(noisy, 0))
    (mechanism,) = json.loads((rel / "manifest.json").read_text())["privacy"]["mechanisms"]
    assert mechanism["name"] == "bins" and mechanism["sensitivity"] == 1.0
    assert json.loads(Path(s["evaluation"]).read_text())["strategy"] == "identity"


def test_histogram_default_strategy_follows_the_public_workload():
    """The rule of STRATEGY_FOR_WORKLOAD: ranges (the default workload) -> HDMM's optimized strategy up to 4,096 bins,
    the tree above; unit queries -> identity; a consistency implies the tree; an explicit strategy wins; a
    consistency with another strategy is refused."""
    from pydantic import ValidationError

    from tasks.kinds.histogram import HistogramParams

    base = {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0}
    assert HistogramParams(**base).strategy_used == "optimized"
    assert HistogramParams(**{**base, "bins": 65536}).strategy_used == "tree"  # above the optimized one's 4,096
    assert HistogramParams(**base, consistency="admm").strategy_used == "tree"
    assert HistogramParams(**base).consistency_method == "admm"
    assert HistogramParams(**base, workload="unit").strategy_used == "identity"
    assert HistogramParams(**base, workload="unit", consistency="none").strategy_used == "tree"
    assert HistogramParams(**base, workload="unit", strategy="tree").consistency_method == "admm"
    assert HistogramParams(**{**base, "bins": 10}, workload="unit").strategy_used == "identity"
    with pytest.raises(ValidationError, match="consistency applies to the tree strategy only"):
        HistogramParams(**base, strategy="identity", consistency="htree")
    with pytest.raises(ValidationError, match="power of the branching factor"):
        HistogramParams(**{**base, "bins": 10, "strategy": "tree"})
    assert HistogramParams(**{**base, "bins": 10}).strategy_used == "optimized"  # any number of bins
    with pytest.raises(ValidationError, match="at most 4,096 bins"):
        HistogramParams(**{**base, "bins": 8192, "strategy": "optimized"})


def test_contingency_release_honours_the_public_marginals(tmp_path):
    rng = np.random.default_rng(4)
    levels = {"a": ["0", "1"], "b": ["x", "y", "z"], "c": ["p", "q"]}
    rows = [(a, b, c) for a in levels["a"] for b in levels["b"] for c in levels["c"]]
    cells = rng.poisson(30, len(rows)).astype(float)
    cells[[1, 4]] = 0
    data = tmp_path / "t.csv"
    data.write_text("a,b,c,count\n" + "\n".join(f"{a},{b},{c},{int(n)}" for (a, b, c), n in zip(rows, cells)) + "\n")
    table = contingency.Table(tuple(levels), tuple(tuple(v) for v in levels.values()))
    marginals = table.marginals(0) + table.marginals(1)
    truth = cells  # row order of the file is the table's row-major order
    b = np.array([table.marginal_row(m) @ truth for m in marginals])
    write_marginals(tmp_path / "m1.csv", table, marginals, b)
    d = _base(tmp_path, {"id": "t", "path": str(data), "categories": levels, "weight_column": "count",
              "weights_count_records": True},
              {"kind": "contingency", "epsilon": 0.5, "public_marginals": str(tmp_path / "m1.csv"),
               "public_marginals_source": "the test's own (made public for it)"})
    s = _run(d)
    released = pq.read_table(Path(s["release_dir"]) / "table.parquet").to_pandas()
    x = released["count"].to_numpy()
    assert x.min() >= 0
    A = table.constraint_matrix(marginals)
    assert np.abs(A @ x - b).max() <= 1e-3 * b.max()
    assert list(released[["a", "b", "c"]].itertuples(index=False, name=None)) == rows

    # Inconsistent public marginals are refused, and nothing is published.
    write_marginals(tmp_path / "bad.csv", table, marginals, b + np.r_[0, 5, np.zeros(len(b) - 2)])
    d2 = {**d, "release": {**d["release"], "public_marginals": str(tmp_path / "bad.csv")}, "release_id": "bad-m"}
    with pytest.raises(InputError, match="inconsistent"):
        _run(d2)
    assert not (tmp_path / "runs" / "bad-m" / "release").exists()


def test_contingency_records_outside_the_public_levels_are_left_out_and_counted_internally(tmp_path):
    """A refusal would tell whoever wrote the levels, for free, whether anyone has a level they left out: such
    records are left out (as numeric values are clipped to public bounds), their count internal only."""
    data = write_csv(tmp_path / "c.csv", np.array([["u", "1"], ["w", "2"], ["v", "1"]], dtype=object),
                     header=("a", "count"))
    d = _base(tmp_path, {"id": "c", "path": str(data), "categories": {"a": ["u", "v"]}, "weight_column": "count",
              "weights_count_records": True},
              {"kind": "contingency", "epsilon": 1.0})
    s = _run({**d, "release_id": "lv"})
    assert s["status"] == TEST_RUN
    internal = tmp_path / "runs" / "lv" / "internal"
    assert json.loads((internal / "encoding.json").read_text())["rows_outside_public_levels"] == 1
    exact = np.bincount(pq.read_table(internal / "encoded").column("cell").to_numpy(), minlength=2)
    assert exact.tolist() == [1, 1]  # 'u' and 'v', not 'w'


@pytest.mark.parametrize("workload", ["predicate", "all_range"])
def test_matrix_mechanism_release(tmp_path, workload):
    truth = _sparse_histogram(64, seed=2)
    data = write_parquet(tmp_path / "m.parquet", {"v": np.arange(64) * 1.0, "n": truth.astype(float)})
    s = _run(_base(tmp_path, {"id": "m", "path": str(data), "bounds": {"v": [0, 64]}, "weight_column": "n",
                    "weights_count_records": True},
                   {"kind": "matrix_mechanism", "bins": 64, "workload": workload, "workload_queries": 32,
                    "epsilon": 1.0}))
    rel = Path(s["release_dir"])
    assert pq.read_table(rel / "estimate.parquet").column("count").to_numpy().min() >= 0
    assert (rel / "workload_answers.parquet").exists() == (workload != "all_range")
    assert json.loads(Path(s["evaluation"]).read_text())["workload_mse"] >= 0
    # The strategy is the binary tree: its sensitivity is the number of levels (7 for 64 bins).
    assert json.loads((rel / "manifest.json").read_text())["privacy"]["mechanisms"][0]["sensitivity"] == 7


def test_kernel_kmeans_release_on_generated_cdr(tmp_path):
    from tasks import generators

    generators.generate(generators.CDR, tmp_path / "cdr", users=30_000, seed=1, partition_rows=10_000)
    generators.generate(generators.CDR, tmp_path / "public", users=2_000, seed=9)
    d = _base(tmp_path, {"id": "cdr", "path": str(tmp_path / "cdr"), "items_column": "towers", "item_count": 1303},
              {"kind": "kernel_kmeans", "k": 4, "iterations": 5, "epsilon": 1.0, "delta": 1e-6, "features": 32,
               "public_sample": str(tmp_path / "public")})
    s = _run(d)
    rel = Path(s["release_dir"])
    centres = pq.read_table(rel / "centres.parquet").to_pandas()
    assert len(centres) == 4 and centres["noisy_size"].min() >= 0
    assert (rel / "measurements" / "rff_W.npy").exists() and (rel / "assignment_rule.json").exists()
    manifest = json.loads((rel / "manifest.json").read_text())
    assert manifest["privacy"]["delta"] == 1e-6 and manifest["privacy"]["epsilon"] <= 1.0 + 1e-6
    internal = Path(s["internal_dir"])
    labels = np.concatenate([pq.read_table(f).column("cluster").to_numpy()
                             for f in sorted((internal / "assignments").glob("*.parquet"))])
    assert labels.size == 30_000 and set(np.unique(labels)) <= set(range(4))
    assert sum(json.loads(Path(s["evaluation"]).read_text())["cluster_sizes"]) == 30_000
    assert not list(rel.rglob("assignments*"))  # per-record outputs stay internal


def test_synthetic_release_end_to_end_on_generated_cdr(tmp_path):
    """DPGM through the real flow: synthetic records in the ingest format, one charge for all of it,
    reproducible post-processing, and the counting-query evaluation kept internal."""
    from tasks import generators
    from tasks.kinds.synthetic import KIND, SYNTHETIC
    from tasks.sets import read_sets

    generators.generate(generators.CDR, tmp_path / "cdr", users=8_000, seed=2, partition_rows=3_000)
    d = _base(tmp_path, {"id": "cdr", "path": str(tmp_path / "cdr"), "items_column": "towers", "item_count": 1303},
              {"kind": "synthetic", "k": 3, "iterations": 4, "epsilon": 2.0, "delta": 1e-6, "features": 32,
               "gamma": 0.05, "steps": 30, "q": 0.05, "hidden": [32], "queries": 100, "max_items": 30})
    s = _run(d)
    rel, internal = Path(s["release_dir"]), Path(s["internal_dir"])
    parts = sorted((rel / SYNTHETIC).glob("*.parquet"))
    table = pq.read_table(parts[0])
    import pyarrow as pa
    assert pa.types.is_list(table.schema.field("towers").type)
    assert table.schema.field("towers").type.value_type == pa.int32()
    X = sp_vstack([read_sets(str(f), "towers", 1303) for f in parts])
    mixture = pq.read_table(rel / "mixture.parquet").to_pandas()
    assert X.shape[0] == round(mixture["noisy_size"].sum()) and np.diff(X.indptr).min() >= 1
    manifest = json.loads((rel / "manifest.json").read_text())
    assert manifest["privacy"]["epsilon"] <= 2.0 + 1e-6 and manifest["privacy"]["delta"] == 1e-6
    assert [m["name"] for m in manifest["privacy"]["mechanisms"]] == ["sizes", "sums", "marginals", "sgd"]
    assert manifest["privacy"]["mechanisms"][-1]["sampling_rate"] == 0.05
    # Post-processing again from the stored measurements draws the very same records.
    again = tmp_path / "again"
    again.mkdir()
    import logging

    from tasks.partitions import dask_client
    with dask_client(parse_spec(d).dask):  # the parts are synthesised on the dask workers, as in the flow
        KIND.bind(parse_spec(d)).postprocess(rel / "measurements", again, tmp_path, logging.getLogger("test"))
    Y = sp_vstack([read_sets(str(f), "towers", 1303) for f in sorted((again / SYNTHETIC).glob("*.parquet"))])
    assert (X != Y).nnz == 0
    # Measurements of the layout before the rows of all records (k rows) are refused, not misread.
    import shutil

    from tasks.kinds.synthetic import TABLE
    old = shutil.copytree(rel / "measurements", tmp_path / "old")
    np.save(old / TABLE, np.load(old / TABLE)[:-2])
    with pytest.raises(ReleaseConflict, match="drawn by another version"):
        KIND.bind(parse_spec(d)).postprocess(old, tmp_path / "never", tmp_path, logging.getLogger("test"))
    errors = json.loads(Path(s["evaluation"]).read_text())["relative_error_by_length_bucket"]
    assert set(errors) == {"dpgm_linear", "mwem_linear", "dpgm_anyof", "independent_anyof"}
    assert np.mean(errors["dpgm_linear"]) < np.mean(errors["mwem_linear"])
    assert (internal / "evaluation" / "counting_queries.png").exists()
    assert not list(rel.rglob("*.png")) and not list(rel.rglob("evaluation*"))


def sp_vstack(parts):
    import scipy.sparse as sp

    return sp.vstack(parts).tocsr()


def test_set_valued_records_are_grouped_per_user_before_any_statistic(tmp_path):
    """dataset.user_column: several rows of a user are one privacy unit, merged at ingest."""
    import pyarrow as pa

    rng = np.random.default_rng(5)
    users = np.repeat(np.arange(300), 2)  # every user in two rows
    items = [sorted(set(rng.choice(30, 3, replace=False).tolist())) for _ in users]
    (tmp_path / "rows").mkdir()
    write_parquet(tmp_path / "rows" / "part.0.parquet",
                  {"user": users, "items": pa.array(items, type=pa.list_(pa.int32()))})
    d = _base(tmp_path, {"id": "u", "path": str(tmp_path / "rows"), "items_column": "items", "item_count": 30,
                         "user_column": "user"},
              {"kind": "kernel_kmeans", "k": 2, "iterations": 2, "features": 16, "gamma": 0.1, "epsilon": 1.0})
    s = _run(d)
    ingested = Path(s["internal_dir"]) / "ingested"
    assert sum(pq.ParquetFile(f).metadata.num_rows for f in ingested.glob("*.parquet")) == 300


@pytest.mark.slow  # 18 s: tests/test_sets.py checks the same on the ingest alone
def test_kernel_kmeans_item_ids_outside_the_public_universe_are_left_out_not_refused(tmp_path):
    """An item_count below the data's largest id is a release of the public universe, not a free answer to "is
    the largest id below item_count?": the ids above it are left out and counted internally."""
    from tasks import generators

    generators.generate(generators.CDR, tmp_path / "cdr", users=200, seed=2, partition_rows=100)
    d = _base(tmp_path, {"id": "cdr", "path": str(tmp_path / "cdr"), "items_column": "towers", "item_count": 300},
              {"kind": "kernel_kmeans", "k": 3, "iterations": 2, "epsilon": 2.0, "delta": 1e-6, "features": 16,
               "gamma": 0.05})
    assert _run({**d, "release_id": "uni", "evaluate": False})["status"] == TEST_RUN
    outside = json.loads((tmp_path / "runs" / "uni" / "internal" / "items_outside.json").read_text())
    assert outside["records_trimmed"] > 0


def test_synthetic_release_with_more_clusters_than_records_is_made_not_refused(tmp_path):
    """A refusal on k > N before the charge would answer "is N < k?" for free: the release is made, its empty
    clusters from noise alone (seeded test mode here; the kind's path is the production one)."""
    from tasks import generators

    generators.generate(generators.CDR, tmp_path / "cdr", users=3, seed=2, partition_rows=3)
    d = _base(tmp_path, {"id": "cdr", "path": str(tmp_path / "cdr"), "items_column": "towers", "item_count": 1303},
              {"kind": "synthetic", "k": 5, "iterations": 2, "epsilon": 2.0, "delta": 1e-6, "features": 16,
               "gamma": 0.05, "steps": 5, "q": 0.05, "hidden": [8], "queries": 20, "max_items": 30})
    assert _run({**d, "evaluate": False})["status"] == TEST_RUN


@pytest.mark.parametrize("kind", ["kernel_kmeans", pytest.param("synthetic", marks=pytest.mark.slow)])
def test_a_release_whose_records_are_all_outside_the_public_universe_is_made_from_noise(tmp_path, kind):
    """Refusing it would answer "is every id at or above item_count?", a bisection for the smallest id."""
    data = tmp_path / "t.dat"
    data.write_text("55 60\n70\n90 80\n")
    release = {"kind": kind, "k": 2, "iterations": 2, "epsilon": 2.0, "delta": 1e-6, "features": 16, "gamma": 0.05}
    if kind == "synthetic":
        release.update(steps=3, q=0.5, hidden=[4], queries=10, max_items=3)
    d = _base(tmp_path, {"id": "t", "path": str(data), "format": "transactions", "items_column": "items",
                         "item_count": 50}, release)
    assert _run({**d, "release_id": "none-inside", "evaluate": False})["status"] == TEST_RUN
    outside = json.loads((tmp_path / "runs" / "none-inside" / "internal" / "items_outside.json").read_text())
    assert outside["records_left_out"] == 3


def test_an_epsilon_the_noise_cannot_reach_is_a_spec_error_before_the_data_is_read(tmp_path):
    from tasks.errors import SpecError

    (tmp_path / "t.dat").write_text("1 2 3\n4 5\n")
    d = _base(tmp_path, {"id": "t", "path": str(tmp_path / "t.dat"), "format": "transactions",
                         "items_column": "items", "item_count": 50},
              {"kind": "kernel_kmeans", "k": 2, "iterations": 5, "epsilon": 0.001, "delta": 1e-9, "features": 16,
               "gamma": 0.05})
    with pytest.raises(SpecError, match="cannot be calibrated to epsilon=0.001"):
        _run({**d, "release_id": "tiny-eps"})
    assert not (tmp_path / "runs" / "tiny-eps").exists()
