"""The fused Lloyd passes (dpalgos.lloyd) against the numpy path they replace, alone and through
`Partitioned.reduce` on a dask cluster whose library threads `tasks.threads` limits."""

import os

import numpy as np
import pytest

from dpalgos import dpkmeans, lloyd, metrics
from dpalgos import kernel_kmeans as kk


def numpy_labels(X, C):
    """The numpy path's assignment: argmin of ||c||^2 - 2 x.c, ties to the lowest index."""
    return np.argmin(np.einsum("kd,kd->k", C, C) - 2.0 * X @ C.T, axis=1)


def numpy_stats(X, C):
    K, d = C.shape
    labels = numpy_labels(X, C)
    sums = np.column_stack([np.bincount(labels, weights=X[:, j], minlength=K) for j in range(d)]) if len(X) \
        else np.zeros((K, d))
    return sums.reshape(K, d), np.bincount(labels, minlength=K).astype(np.float64)


def numpy_wcss(X, C):
    d2 = np.einsum("nd,nd->n", X, X) + np.min(np.einsum("kd,kd->k", C, C) - 2.0 * X @ C.T, axis=1)
    return float(np.maximum(d2, 0.0).sum())


def assert_same_stats(got, want):
    assert np.array_equal(got[1], want[1])  # same counts, exactly
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)


CASES = [(2000, 15, 2), (777, 1, 3), (500, 4, 1), (255, 6, 10), (256, 6, 10), (257, 6, 10), (1, 3, 2), (300, 5, 600)]


@pytest.mark.parametrize("n, k, d", CASES)
def test_random_data_gives_the_numpy_path_counts_sums_labels_and_wcss(n, k, d):
    rng = np.random.default_rng(n * 1000 + k * 10 + d)
    X, C = rng.normal(0, 0.3, (n, d)), rng.normal(0, 0.3, (k, d))
    assert_same_stats(dpkmeans.cluster_stats(X, C), numpy_stats(X, C))
    assert np.array_equal(dpkmeans.assign(X, C), numpy_labels(X, C))
    assert metrics.wcss(X, C) == pytest.approx(numpy_wcss(X, C), rel=1e-12)


@pytest.mark.parametrize("d", [2, 40])  # the coordinate loop and the BLAS pass
def test_ties_go_to_the_lowest_index_as_in_numpy(d):
    # Dyadic points and centres: every score is exact, so equal distances are exact ties.
    rng = np.random.default_rng(d)
    X = rng.integers(-4, 5, (3000, d)) / 4.0
    C = np.zeros((5, d))
    C[[0, 1, 2, 3, 4], [0, 0, 1, 0, 1]] = [0.5, -0.5, 0.5, 0.5, -0.5]  # centre 3 duplicates centre 0
    scores = np.einsum("kd,kd->k", C, C) - 2.0 * X @ C.T
    assert np.mean((scores == scores.min(axis=1, keepdims=True)).sum(axis=1) > 1) > 0.2  # many ties
    labels = dpkmeans.assign(X, C)
    assert np.array_equal(labels, numpy_labels(X, C))
    assert not np.any(labels == 3)
    assert_same_stats(dpkmeans.cluster_stats(X, C), numpy_stats(X, C))


def test_no_points_and_k1_d1():
    C = np.array([[0.1], [0.3]])
    sums, counts = dpkmeans.cluster_stats(np.empty((0, 1)), C)
    assert sums.shape == (2, 1) and not sums.any() and not counts.any()
    assert dpkmeans.assign(np.empty((0, 1)), C).shape == (0,)
    assert metrics.wcss(np.empty((0, 1)), C) == 0.0
    X = np.linspace(-1, 1, 101)[:, None]
    sums, counts = dpkmeans.cluster_stats(X, np.array([[0.7]]))
    assert counts.tolist() == [101.0] and sums[0, 0] == pytest.approx(0.0, abs=1e-12)


def test_float32_points_are_summed_in_float64():
    X = np.random.default_rng(1).normal(0, 0.3, (1000, 4)).astype(np.float32)
    C = np.random.default_rng(2).normal(0, 0.3, (3, 4))
    assert_same_stats(lloyd.stats(X, C), numpy_stats(X.astype(np.float64), C))


def test_centres_of_the_wrong_shape_and_bad_bounds_are_refused():
    X = np.zeros((5, 3))
    for C in (np.zeros((2, 2)), np.zeros((0, 3)), np.zeros(3)):
        with pytest.raises(ValueError):
            lloyd.stats(X, C)
    for bound in (0.0, -1.0, np.inf):
        with pytest.raises(ValueError):
            lloyd.clipped_stats(X, np.zeros((2, 3)), bound)


def _features(n=600, d=32, seed=3):
    rng = np.random.default_rng(seed)
    Z = (rng.normal(0, 0.4, (n, d)) * rng.uniform(0.2, 3.0, (n, 1))).astype(np.float32)  # norms across 1
    return Z, rng.normal(0, 0.2, (4, d))


@pytest.mark.parametrize("d", [8, 32])  # the coordinate loop and the BLAS pass
def test_clipped_stats_are_the_stats_of_the_clipped_rows(d):
    Z, C = _features(d=d)
    clipped = kk.clip_rows(Z.astype(np.float64), 1.0)
    sums, counts = lloyd.clipped_stats(Z, C, 1.0)
    want_sums, want_counts = numpy_stats(clipped, C)
    assert np.array_equal(counts, want_counts)
    np.testing.assert_allclose(sums, want_sums, rtol=1e-6, atol=1e-6)  # float32 features
    assert np.array_equal(lloyd.clipped_labels(Z, C, 1.0), numpy_labels(clipped, C))


@pytest.mark.parametrize("bound, d", [(0.5, 8), (1.0, 32)])
def test_one_added_record_moves_one_count_by_1_and_the_sums_by_at_most_the_bound(bound, d):
    Z, C = _features(d=d, seed=4)
    s0, n0 = lloyd.clipped_stats(Z, C, bound)
    moves = []
    for z in _features(n=50, d=d, seed=5)[0]:
        s1, n1 = lloyd.clipped_stats(np.vstack([Z, z]), C, bound)
        assert np.abs(n1 - n0).sum() == 1.0
        moves.append(np.linalg.norm(s1 - s0))
    assert max(moves) <= bound
    assert max(moves) == pytest.approx(bound, rel=1e-5)  # attained by long rows: the bound is tight


# --- through dask ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client():
    """An in-process dask cluster (1 worker x 2 threads) with the thread limits registered; the test process's
    environment and library limits are restored afterwards."""
    import threadpoolctl
    from distributed import Client, LocalCluster

    from tasks.threads import THREAD_VARIABLES, limit_threads

    saved = {v: os.environ.get(v) for v in THREAD_VARIABLES}
    with threadpoolctl.threadpool_limits(limits=None), \
            LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as c:
        limit_threads(c)
        yield c
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def test_reduce_over_partitions_with_an_empty_one_is_the_numpy_path_on_all_points(client, tmp_path, monkeypatch):
    """Kept in the workers' memory (`Partitioned`) or read a batch at a time in every pass (`Streamed`, k-means'
    rounds: memory flat in the records), the same sums as numpy's on all points."""
    from data_contracts import validate
    from tasks.partitions import Partitioned, Streamed, write_points

    monkeypatch.setattr(validate, "BATCH_BYTES", 1)  # batches of 2^16 rows: the last file is read in two

    rng = np.random.default_rng(6)
    X = np.vstack([rng.integers(-4, 5, (700, 3)) / 4.0, rng.normal(0, 0.3, (2 ** 16 + 900, 3))])  # ties, random
    C = np.vstack([rng.integers(-2, 3, (3, 3)) / 4.0, rng.normal(0, 0.3, (2, 3))])
    files = []
    for i, part in enumerate((X[:700], X[700:700], X[700:1100], X[1100:])):
        files.append(tmp_path / f"p{i}.parquet")
        write_points(str(files[-1]), part, ["a", "b", "c"])
    for points in (Partitioned.points(client, files, ["a", "b", "c"]), Streamed(client, files, ["a", "b", "c"])):
        try:
            assert_same_stats(points.reduce(dpkmeans.cluster_stats, C), numpy_stats(X, C))
            assert points.reduce(metrics.wcss, C) == pytest.approx(numpy_wcss(X, C), rel=1e-12)
            assert_same_stats(points.reduce(dpkmeans.cluster_stats, C[:1]), numpy_stats(X, C[:1]))
        finally:
            points.close()


def test_library_threads_times_dask_threads_stay_within_the_cores(client):
    import threadpoolctl

    from tasks.threads import host_cores, library_threads

    assert library_threads(2, 2) == 1 and library_threads(8, 2) == 4 and library_threads(2, 6) == 1
    expected = library_threads(host_cores(), 2)
    inside = client.submit(threadpoolctl.threadpool_info, pure=False).result()
    # OpenMP's thread count is a per-thread setting (the plugin sets it in the thread it runs in, and
    # OMP_NUM_THREADS for runtimes loaded later): another worker thread of an already loaded runtime may read its
    # own default, so only the process-wide BLAS pools are checked here.
    blas = [pool for pool in inside if pool["user_api"] == "blas"]
    assert blas and all(pool["num_threads"] == expected for pool in blas)
    assert 1 <= int(os.environ["OPENBLAS_NUM_THREADS"]) <= expected  # for libraries loaded later


def test_limits_keep_an_operators_lower_setting_and_leave_a_loaded_numba_alone():
    import threadpoolctl

    from tasks.threads import THREAD_VARIABLES, apply_limits

    saved = dict(os.environ)
    try:
        for var in THREAD_VARIABLES:
            os.environ.pop(var, None)
        os.environ["MKL_NUM_THREADS"] = "1"
        with threadpoolctl.threadpool_limits(limits=1):
            apply_limits(3)
            assert {pool["num_threads"] for pool in threadpoolctl.threadpool_info()} == {1}  # never raised
        assert os.environ["OMP_NUM_THREADS"] == "3" and os.environ["MKL_NUM_THREADS"] == "1"
        # numba is loaded here: changing its variable would make every later compilation fail once its pool
        # has started.
        assert "NUMBA_NUM_THREADS" not in os.environ
    finally:
        os.environ.clear()
        os.environ.update(saved)
