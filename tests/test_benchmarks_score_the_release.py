"""Benchmarks score what is published (issue 43, item 1): every benchmark's figure for one of our release kinds comes
from the kind's own release code path, never from a parallel re-implementation.

Each test runs a benchmark's own "ours" code on a small fixed input with a fixed seed, and the kind's own release on
the same noisy measurements: the kind's ingest, prepare and draw (on a dask cluster, as the release stage runs them),
the measurements written as the draw writes them, then the kind's `postprocess`, read back from the published files.
The noise on both sides is the kind's plan's, drawn as a benchmark draws it (`dpalgos.noise.simulated`: a seeded numpy
source whose seed is the generator's first integer, the generator then the public randomness; or the benchmark's own
`SeededNoise` keys), so the two must agree to floating-point tolerance. The release side is written from the spec a
user would write (the kind's defaults, the public rules), not from the benchmark's helpers: a benchmark that flips a
default, re-implements an estimator or skips a postprocessing step fails here.
"""

from __future__ import annotations

import json
import logging
from argparse import Namespace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from dpalgos.noise import Measure, SeededNoise, simulated
from tasks.ingest import ingest_dataset
from tasks.kinds import kind_of
from tasks.run import META, RunPaths
from tasks.sets import read_sets, set_table
from tasks.spec import parse_spec

LOG = logging.getLogger("test_benchmarks_score_the_release")


@pytest.fixture(scope="module", autouse=True)
def dask_client():
    """One in-process dask cluster for the kinds' data passes (one worker thread: the machine is shared)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0",
                           silence_logs=logging.WARNING)
    client = Client(cluster, set_as_default=True)
    yield client
    client.close()
    cluster.close()


def kind_release(spec: dict, folder: Path, rng: np.random.Generator, measure_for=None) -> Path:
    """The kind's own release of the spec's data into folder/release (see the module docstring); `measure_for(plan)`
    gives the noise (default `simulated(plan, rng)`), `rng` is the public randomness. A test, not a release."""
    spec = parse_spec({**spec, "mode": "test"})
    kind = kind_of(spec)
    run = RunPaths(folder)
    run.internal.mkdir(parents=True, exist_ok=True)
    prepared = kind.prepare(ingest_dataset(spec.dataset, run.stage("ingested"), run.internal, LOG), run, LOG)
    plan = kind.plan
    measure = measure_for(plan) if measure_for is not None else simulated(plan, rng)
    draw = kind.draw(prepared, measure, rng, LOG)
    measurements, release = folder / "release" / "measurements", folder / "release"
    measurements.mkdir(parents=True)
    draw.write(measurements)
    (measurements / META).write_text(json.dumps({"release_id": "test", "plan": plan.to_json(), **draw.meta}))
    kind.postprocess(measurements, release, run.internal, LOG)
    (release / "manifest.json").write_text(json.dumps({"privacy": {"mechanisms": plan.manifest(measure.samplers())}}))
    return release


def columns(path: Path, names) -> np.ndarray:
    return pq.read_table(path).to_pandas()[list(names)].to_numpy()


def points_file(path: Path, X: np.ndarray) -> Path:
    pq.write_table(pa.table({f"c{j}": X[:, j] for j in range(X.shape[1])}), path)
    return path


def sets_file(path: Path, X: sp.csr_matrix, column: str) -> Path:
    pq.write_table(set_table(column, X.indptr, X.indices), path)
    return path


def blobs(n: int, seed: int, d: int = 2) -> np.ndarray:
    """Three blobs in raw units, some of them beyond the unit L1 ball once scaled (the projection matters)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, 100, (3, d))
    return centres[rng.integers(0, 3, n)] + rng.normal(0, 6, (n, d))


# --------------------------------------------------------------------------------------------------------------------
# kmeans: kmeans_peers.py, dpkm_wcss.py, leekifer_wcss.py (tasks/experiments/kmeans.py)
# --------------------------------------------------------------------------------------------------------------------
def kmeans_spec(tmp_path: Path, X: np.ndarray, **release) -> dict:
    """A user's kmeans spec of X: the data's min/max as its public bounds (the benchmarks' stand-in bounds)."""
    bounds = {f"c{j}": [float(X[:, j].min()), float(X[:, j].max())] for j in range(X.shape[1])}
    return {"dataset": {"id": "km", "path": str(points_file(tmp_path / "points.parquet", X)), "bounds": bounds},
            "release": {"kind": "kmeans", **release}}


def test_kmeans_peers_scores_the_kmeans_release(tmp_path):
    """`ours` of kmeans_peers.py: the kind's default release (its domain of d, seeding for T >= 2, the refinement
    where `leekifer.refinement_released` says so, the MCMC seeded from the measurements) and its dpkm_centroids."""
    from tests.benchmarks.kmeans_peers import ours

    X = blobs(400, 1)
    (bench,) = ours(X, 3, 1.0, 1, 5, None, np.random.default_rng(7))
    release = kind_release(kmeans_spec(tmp_path, X, k=3, iterations=5, epsilon=1.0), tmp_path, np.random.default_rng(7))
    assert json.loads((release / "refinement.json").read_text())["released"] == "Lee & Kifer §3.2-3.3"
    np.testing.assert_allclose(bench["released"], columns(release / "centroids.parquet", ["c0", "c1"]), rtol=1e-9,
                               atol=1e-12)
    np.testing.assert_allclose(bench["dpkm"], columns(release / "dpkm_centroids.parquet", ["c0", "c1"]), rtol=1e-9,
                               atol=1e-12)


def test_dpkm_wcss_scores_the_kmeans_release_of_algorithm_1(tmp_path):
    """dpkm_wcss.py scores the kind with seeding: none and postprocess: [] (Lee & Kifer's Algorithm 1 as the paper,
    its last iterate published), in three dimensions (the box, the kind's default domain from d = 3)."""
    from tests.benchmarks.dpkm_wcss import ours

    X = blobs(300, 2, d=3)
    bench = ours(X, 3, 2.0, 4, None, np.random.default_rng(3))
    release = kind_release(kmeans_spec(tmp_path, X, k=3, iterations=4, epsilon=2.0, seeding="none", postprocess=[]),
                           tmp_path, np.random.default_rng(3))
    np.testing.assert_allclose(bench, columns(release / "centroids.parquet", ["c0", "c1", "c2"]), rtol=1e-9,
                               atol=1e-12)


def test_leekifer_wcss_released_is_the_kmeans_release(tmp_path):
    """leekifer_wcss.py's `released` and `dpkm` rows (tasks/experiments/kmeans.py `wcss_table`, the benchmark's
    default seeding) are the WCSS of the kind's default release's centroids.parquet and dpkm_centroids.parquet."""
    from dpalgos import metrics
    from tasks.experiments.kmeans import scaled, wcss_table
    from tests.benchmarks.leekifer_wcss import ours_seeding

    X = blobs(300, 4)
    table = wcss_table("blobs", X, 3, runs=1, seed=11, epsilons=(0.5,), methods=("dpkm", "released"),
                       seeding=ours_seeding("default"))
    release = kind_release(kmeans_spec(tmp_path, X, k=3, iterations=5, epsilon=0.5), tmp_path,
                           np.random.default_rng(11))
    B = scaled(X)
    for method, name in (("released", "centroids.parquet"), ("dpkm", "dpkm_centroids.parquet")):
        bench = float(table.loc[table["method"] == method, "wcss"].iloc[0])
        assert bench == pytest.approx(metrics.wcss(B, columns(release / name, ["c0", "c1"])), rel=1e-9), method


def test_leekifer_gate_scores_the_kmeans_release(tmp_path):
    """leekifer_gate.py's `gate` is the kind's default release's centroids.parquet (the refinement where the gate
    says so, seeded from the measurements) and its `never` the dpkm_centroids.parquet, on the same noise."""
    from dpalgos import dpkmeans
    from tasks.experiments.kmeans import kmeans_spec as experiment_spec
    from tasks.experiments.kmeans import release_points, stand_in_bounds
    from tests.benchmarks.leekifer_gate import one_run

    X = blobs(300, 5)
    bounds = stand_in_bounds(X)
    spec = experiment_spec(3, 2, 0.5, bounds=bounds)
    bench = one_run(spec, dpkmeans.array_stats(release_points(X, spec, bounds)), np.random.default_rng(13))
    release = kind_release(kmeans_spec(tmp_path, X, k=3, iterations=5, epsilon=0.5), tmp_path,
                           np.random.default_rng(13))
    assert bench["refines"] == (json.loads((release / "refinement.json").read_text())["released"]
                                == "Lee & Kifer §3.2-3.3")
    np.testing.assert_allclose(bench["gate"], columns(release / "centroids.parquet", ["c0", "c1"]), rtol=1e-9,
                               atol=1e-12)
    np.testing.assert_allclose(bench["never"], columns(release / "dpkm_centroids.parquet", ["c0", "c1"]), rtol=1e-9,
                               atol=1e-12)


# --------------------------------------------------------------------------------------------------------------------
# contingency: contingency_peers.py (tasks/experiments/contingency.py)
# --------------------------------------------------------------------------------------------------------------------
CONTINGENCY_SPECS = {"admm_elastic": {}, "admm_l1": {"penalty": "l1"}, "admm_l2": {"penalty": "l2"},
                     "empirical_bayes": {"estimator": "empirical_bayes"}}


def _contingency(tmp_path: Path, methods, order: int = 1, eps: float = 0.7):
    """contingency_peers.py's `ours` and the kind's published `count` under each method's spec (a user's spec: the
    kind's defaults, the public marginals of `order` in a CSV), on a generated 2^3 table, the same seed."""
    from tasks.kinds.contingency import write_marginals
    from tests.benchmarks.contingency_peers import loglinear_table, ours

    _, table, x = loglinear_table("loglinear:3:80:5")
    _, bench = ours(table, x, order, eps, np.random.default_rng(5), methods)
    cells = table.cell_levels()
    rows = {name: np.repeat([c[j] for c in cells], x.astype(int)) for j, name in enumerate(table.names)}
    pq.write_table(pa.table(rows), tmp_path / "records.parquet")
    marginals = table.marginals(order)
    write_marginals(tmp_path / "marginals.csv", table, marginals, table.constraint_matrix(marginals) @ x)
    dataset = {"id": "t", "path": str(tmp_path / "records.parquet"),
               "categories": {n: list(lv) for n, lv in zip(table.names, table.levels)}}
    published = {}
    for method in methods:
        spec = {"dataset": dataset, "release": {"kind": "contingency", "epsilon": eps, **CONTINGENCY_SPECS[method],
                                                "public_marginals": str(tmp_path / "marginals.csv"),
                                                "public_marginals_source": "the test's table"}}
        out = kind_release(spec, tmp_path / method, np.random.default_rng(5))
        published[method] = pq.read_table(out / "table.parquet").column("count").to_numpy()
    return table, x, bench, published


def test_contingency_peers_scores_the_published_count(tmp_path):
    """contingency_peers.py's ADMM estimators are the `count` column the kind publishes under their specs (the
    default, estimator admm with the elastic net, alpha 0.9 and rho 2; penalty l1; penalty l2) from the same noisy
    cells with the public 1-way marginals; the experiment flow's `estimate` draws and publishes the same."""
    from tasks.experiments.contingency import estimate

    table, x, bench, published = _contingency(tmp_path, ("admm_elastic", "admm_l1", "admm_l2"))
    for method, count in published.items():
        np.testing.assert_allclose(bench[method], count, rtol=1e-9, atol=1e-9, err_msg=method)
    np.testing.assert_allclose(estimate("admm_elastic", table, x, 1, epsilon=0.7, rng=np.random.default_rng(5)),
                               published["admm_elastic"], rtol=1e-9, atol=1e-9)


@pytest.mark.slow  # the empirical-Bayes fit takes seconds even on 8 cells, twice: 10-20 s on 2 loaded cores
def test_contingency_peers_empirical_bayes_is_the_published_count(tmp_path):
    """The estimator contingency_peers.py counts (its RESULT line) is the kind's `estimator: empirical_bayes`."""
    _, _, bench, published = _contingency(tmp_path, ("empirical_bayes",))
    np.testing.assert_allclose(bench["empirical_bayes"], published["empirical_bayes"], rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------------------------------------------------
# mean and friendly_kmeans: friendlycore_mean.py, friendlycore_kmeans.py (tasks/experiments/friendlycore.py)
# --------------------------------------------------------------------------------------------------------------------
def _epsilon_of_rho(rho: float, delta: float = 1e-6, delta_ptr: float = 1e-8) -> float:
    """The (epsilon, delta) a FriendlyCore spec states for a zCDP budget rho (the kind converts it back)."""
    from dp_accounting import dp_event as dpe

    from dpalgos.accounting import epsilon_at

    return epsilon_at(dpe.ZCDpEvent(rho), delta - delta_ptr).epsilon


def test_friendlycore_mean_scores_the_mean_release(tmp_path):
    """friendlycore_mean.py's `fc` and `fc_plain` errors are those of the `mean` kind's release (refine true, the
    default, and false) on the public grid [1e-2, 1e8], at the epsilon that spends the benchmark's rho."""
    from tests.benchmarks.friendlycore_mean import one_setting

    d, n, R, rho, seed = 4, 400, 20.0, 0.5, 3
    res, _ = one_setting(d, n, R, rho, 1, seed, 0.5, ts=(2,))
    rng = np.random.default_rng(seed)  # the benchmark's data: mu, then the points around it
    u = rng.normal(size=d)
    mu = 0.5 * R * u / np.linalg.norm(u)
    X = mu + rng.normal(size=(n, d))
    data = {"id": "m", "path": str(points_file(tmp_path / "points.parquet", X)), "numeric": [f"c{j}" for j in range(d)]}
    for key, refine in (("fc", True), ("fc_plain", False)):
        spec = {"dataset": data, "release": {"kind": "mean", "epsilon": _epsilon_of_rho(rho), "delta": 1e-6,
                                             "r_min": 1e-2, "r_max": 1e8, "refine": refine}}
        release = kind_release(spec, tmp_path / key, np.random.default_rng(0),
                               lambda plan: Measure(plan, SeededNoise(seed * 1000)))
        mean = columns(release / "result.parquet", data["numeric"])[0]
        assert res[key][0] == pytest.approx(float(np.linalg.norm(mean - mu)), rel=1e-9), key


def test_friendlycore_kmeans_scores_the_friendly_kmeans_and_kmeans_releases(tmp_path):
    """friendlycore_kmeans.py's friendly k-means cost is the `friendly_kmeans` kind's release (m subsets from the
    public n, the grid [1e-3, 1e5], subset coins from the noise source's secret generator), and its DP k-means cost
    the `kmeans` kind's default release at the same epsilon on the public bounds [-120, 120]^2."""
    from dpalgos.domain import unscale_from_unit_box
    from dpalgos.metrics import kmeans_reference, wcss
    from tasks.experiments.friendlycore import mixture
    from tests.benchmarks.friendlycore_kmeans import run

    n, k, ppc, seed = 24_000, 3, 40.0, 2
    args = Namespace(rho=0.5, k=k, seed=seed, delta=1e-6, iterations=3)
    _, eps, fc_cost, dp_cost, _, fails, _ = run(n, 1, args, ppc)
    assert fails == 0
    rng = np.random.default_rng([seed, n, 0])  # the benchmark's data, then its DP k-means public seed
    X = mixture(n, k, rng)
    init = rng.integers(2 ** 31)
    ref, _ = kmeans_reference(X, k, n_init=10, seed=0)
    data = {"id": "p", "path": str(points_file(tmp_path / "points.parquet", X)), "numeric": ["c0", "c1"]}
    spec = {"dataset": data, "release": {"kind": "friendly_kmeans", "k": k, "subsets": 200, "delta": 1e-6,
                                         "epsilon": _epsilon_of_rho(0.5), "r_min": 1e-3, "r_max": 1e5}}
    release = kind_release(spec, tmp_path / "fc", np.random.default_rng(0), lambda plan: Measure(plan, SeededNoise(0)))
    assert fc_cost[0] == pytest.approx(wcss(X, columns(release / "result.parquet", ["c0", "c1"])) / ref, rel=1e-9)
    lower, upper = np.full(2, -120.0), np.full(2, 120.0)
    spec = {"dataset": {"id": "p", "path": data["path"], "bounds": {"c0": [-120, 120], "c1": [-120, 120]}},
            "release": {"kind": "kmeans", "k": k, "iterations": 3, "epsilon": eps}}
    release = kind_release(spec, tmp_path / "km", np.random.default_rng(init),
                           lambda plan: Measure(plan, SeededNoise(10_000)))
    C = unscale_from_unit_box(columns(release / "centroids.parquet", ["c0", "c1"]), lower, upper)
    assert dp_cost[0] == pytest.approx(wcss(X, C) / ref, rel=1e-9)


# --------------------------------------------------------------------------------------------------------------------
# kernel_kmeans: kernel_kmeans_mnist.py (tasks/experiments/mnist.py)
# --------------------------------------------------------------------------------------------------------------------
def test_kernel_kmeans_mnist_scores_the_kernel_kmeans_release(tmp_path):
    """kernel_kmeans_mnist.py's kernel rows are the `kernel_kmeans` kind's release (k = 10, 20 iterations, delta =
    1/N, clip 1, gamma by the median heuristic on the public sample, initial centres from it), every record assigned
    by the published rule: the centres and the accuracy agree on binary 784-pixel records."""
    from dpalgos import kernel_kmeans as kk
    from tasks.experiments.mnist import accuracy_table, kernel_release, kernel_spec
    from tasks.kinds.kernel_kmeans import partition_assignment

    rng = np.random.default_rng(8)
    X, public = (rng.random((300, 784)) < 0.15).astype(np.float64), (rng.random((60, 784)) < 0.15).astype(np.float64)
    y = rng.integers(0, 10, 300)
    eps, d = 1.0, 20
    spec = {"dataset": {"id": "img", "path": str(sets_file(tmp_path / "x.parquet", sp.csr_matrix(X), "pixels")),
                        "items_column": "pixels", "item_count": 784},
            "release": {"kind": "kernel_kmeans", "k": 10, "iterations": 20, "epsilon": eps, "delta": 1 / 300,
                        "features": d,
                        "public_sample": str(sets_file(tmp_path / "public.parquet", sp.csr_matrix(public), "pixels"))}}
    release = kind_release(spec, tmp_path / "r", np.random.default_rng(4))
    centres = columns(release / "centres.parquet", [f"f_{j}" for j in range(d)])
    rff, clip, bench = kernel_release(sp.csr_matrix(X), sp.csr_matrix(public), kernel_spec(eps, d, 300),
                                      np.random.default_rng(4))
    np.testing.assert_allclose(bench, centres, rtol=1e-9, atol=1e-12)
    measurements = release / "measurements"
    published_rff = kk.RandomFourierFeatures(np.load(measurements / "rff_W.npy"), np.load(measurements / "rff_b.npy"),
                                             rff.gamma)
    labels = partition_assignment(read_sets(str(tmp_path / "x.parquet"), "pixels", 784), published_rff, 1.0, centres)
    table = accuracy_table(X, y, public, runs=1, seed=4, epsilons=(eps,), dims=(d,), plain=False)
    assert table["accuracy"].iloc[0] == pytest.approx(kk.clustering_accuracy(labels, y), abs=1e-12)


# --------------------------------------------------------------------------------------------------------------------
# synthetic: dpgm_counting.py (tasks/experiments/dpgm.py)
# --------------------------------------------------------------------------------------------------------------------
def test_dpgm_counting_scores_the_synthetic_release(tmp_path):
    """dpgm_counting.py's synthetic records (tasks/experiments/dpgm.py `run`) are the records the `synthetic` kind
    publishes for the same settings: clustering, marginals, DP-SGD (its Poisson samples from the noise source's
    secret generator), the synthesis in parts of the release's size with the seeds the release stores."""
    from dpalgos import dpgm
    from tasks.experiments import dpgm as E

    rng = np.random.default_rng(6)
    dense = rng.random((300, 20)) < np.linspace(0.02, 0.4, 20)
    dense[dense.sum(axis=1) == 0, 0] = True  # a release's records are non-empty
    path = sets_file(tmp_path / "sets.parquet", sp.csr_matrix(dense.astype(np.float32)), "items")
    X = read_sets(str(path), "items", 20)
    settings = E.DPGMSettings(epsilon=2.0, delta=1e-6, k=2, kmeans_iterations=2, features=20, gamma=0.05,
                              max_items=10, shares=(0.15, 0.35, 0.5),
                              sgd=dpgm.SGDConfig(hidden=(8,), steps=4, q=0.2))
    bench, _, _ = E.run(X, settings, np.random.default_rng(9))
    spec = {"dataset": {"id": "s", "path": str(path), "items_column": "items", "item_count": 20},
            "release": {"kind": "synthetic", "k": 2, "iterations": 2, "features": 20, "gamma": 0.05, "steps": 4,
                        "q": 0.2, "hidden": [8], "max_items": 10, "epsilon": 2.0, "delta": 1e-6,
                        "budget_shares": [0.15, 0.35, 0.5]}}
    release = kind_release(spec, tmp_path / "r", np.random.default_rng(9))
    parts = sorted((release / "synthetic").glob("*.parquet"), key=lambda f: int(f.stem.split(".")[1]))
    published = sp.vstack([read_sets(str(f), "items", 20) for f in parts]).tocsr()
    assert published.shape == bench.shape and (published != bench).nnz == 0


# --------------------------------------------------------------------------------------------------------------------
# fp_attack.py: the true statistic behind every published value is the one the kind measured
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("release", [{"kind": "kmeans", "k": 3, "iterations": 3, "epsilon": 1.0, "postprocess": []},
                                     {"kind": "histogram", "bins": 64, "branching": 4, "epsilon": 1.0,
                                      "strategy": "tree"},
                                     {"kind": "histogram", "bins": 64, "epsilon": 1.0},
                                     {"kind": "histogram", "bins": 50, "epsilon": 1.0, "workload": "unit"}],
                         ids=["kmeans", "histogram-tree", "histogram-optimized", "histogram-identity"])
def test_fp_attack_recomputes_what_the_kind_measured(tmp_path, release):
    """With seeded numpy noise (the sampler the attack decides exactly) every published value is possible at the
    true statistic the attack recomputes, bit for bit: the kmeans sums are those of the points the kind normalised
    (the default domain of d = 2 is the L2 ball, not the L1 ball), the histogram's counts those of its own bins, for
    the tree, for HDMM's strategy (its answers through the committed matrix) and for the identity strategy
    (noisy_bins.parquet)."""
    from tests.benchmarks.fp_attack import attack_run

    X = blobs(200, 5)
    if release["kind"] == "kmeans":
        spec = kmeans_spec(tmp_path, X, **release)
    else:
        spec = {"dataset": {"id": "h", "path": str(points_file(tmp_path / "points.parquet", X[:, :1])),
                            "bounds": {"c0": [0.0, 60.0]}}, "release": release}  # some values beyond the bounds
    kind_release(spec, tmp_path, np.random.default_rng(1))
    result = attack_run(parse_spec({**spec, "mode": "test"}), tmp_path)
    assert all(r["tested"] and r["possible_at_c"] == r["values"] for r in result["rows"]), result["rows"]


# --------------------------------------------------------------------------------------------------------------------
# spatial_peers.py: the grid kind's published estimate (rectangles) and counts (unit cells)
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workload,strategy", [("rectangles", None), ("unit", None), ("rectangles", "adaptive"),
                                               ("unit", "adaptive")])
def test_spatial_peers_scores_the_grid_release(tmp_path, workload, strategy):
    """spatial_peers.py's `ours` is the grid release of the spec a user writes for the workload (its default
    strategy: kronecker for rectangles, identity for single cells; or the adaptive grid when the user names it):
    the signed estimate its rectangle answers sum,
    and the counts its unit-cell answers read, from the same noise; points at cell centres so that the benchmark's
    grid of counts is the one the kind bins."""
    from tests.benchmarks.spatial_peers import ours

    cells = 32
    rng = np.random.default_rng(4)
    grid = np.where(rng.random((cells, cells)) < 0.2, rng.integers(1, 30, (cells, cells)), 0)
    ix, iy = np.nonzero(grid)
    reps = grid[ix, iy]
    X = np.column_stack([np.repeat((ix + 0.5) / cells, reps), np.repeat((iy + 0.5) / cells, reps)])
    estimate, count = ours(grid.astype(float), 1.0, workload, np.random.default_rng(8), strategy)
    spec = {"dataset": {"id": "g", "path": str(points_file(tmp_path / "p.parquet", X)),
                        "bounds": {"c0": [0.0, 1.0], "c1": [0.0, 1.0]}},
            "release": {"kind": "grid", "cells": cells, "epsilon": 1.0, "workload": workload}
            | ({"strategy": strategy} if strategy else {})}
    release = kind_release(spec, tmp_path, np.random.default_rng(8))
    table = pq.read_table(release / "grid.parquet").to_pandas()
    np.testing.assert_allclose(table["estimate"].to_numpy().reshape(cells, cells), estimate, rtol=1e-9, atol=1e-9)
    if workload == "unit":
        np.testing.assert_allclose(table["count"].to_numpy().reshape(cells, cells), count, rtol=1e-9, atol=1e-9)
