"""Work on raw data that does not depend on the values. A stage's running time is published (Prefect's task
timestamps, the timings artifact) and DP's attacker knows every record but one: a computation on raw data
whose work depends on the values beyond the public shapes answers, through its duration, a question the
accounting never charged. Each test counts the work on neighbouring inputs (one record added or changed) and
fails when a data-dependent shortcut or early stop is put back; tests/benchmarks/timing_channel.py measures
the durations themselves."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dpalgos import domain, lloyd, metrics
from dpalgos import friendlycore as fc
from tasks import sets
from tasks.kinds import kernel_kmeans as kk_kind


def _counting(monkeypatch, owner, name: str) -> list:
    """Replace owner.name by a wrapper that records the shapes of its array arguments."""
    calls, real = [], getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls.append(tuple(np.shape(a) for a in args if isinstance(a, np.ndarray)))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def _work(calls: list, run) -> list:
    calls.clear()
    run()
    return list(calls)


def test_the_kmeans_reference_does_the_same_passes_whatever_the_values(monkeypatch):
    """scikit-learn's KMeans stops when the labels settle: one added record changed its running time by a third.
    Where both settle, the fixed-pass reference finds scikit-learn's WCSS."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(c, 0.1, size=(300, 3)) for c in rng.uniform(-1, 1, size=(4, 3))])
    passes = _counting(monkeypatch, lloyd, "stats")
    work = [len(_work(passes, lambda: metrics.kmeans_reference(data, 4, n_init=2, seed=0)))
            for data in (X, np.vstack([X, [[0.99, 0.99, 0.99]]]), rng.uniform(-1, 1, size=X.shape))]
    assert work == [2 * metrics.REFERENCE_ITERATIONS] * 3
    # the evaluations' variant: starts chosen on a sample of fixed size, then a second reference from the first's
    # centres (the projected space's): the same passes, on the same shapes, whatever the values
    variant = lambda data: metrics.kmeans_reference(data, 4, n_init=2, seed=0, start_rows=500)[1]
    shapes = [_work(passes, lambda: metrics.kmeans_reference(data, 4, init=variant(data)))
              for data in (X, np.vstack([X[:-1], [[0.99, 0.99, 0.99]]]), rng.uniform(-1, 1, size=X.shape))]
    assert shapes[0] == shapes[1] == shapes[2]
    assert len(shapes[0]) == 2 * metrics.REFERENCE_ITERATIONS + 2 * metrics.POLISH_ITERATIONS
    assert [s[0][0] for s in shapes[0]].count(500) == 2 * metrics.REFERENCE_ITERATIONS
    monkeypatch.undo()
    ours, _ = metrics.kmeans_reference(X, 4, n_init=3, seed=0)
    theirs = metrics.wcss(X, KMeans(4, n_init=3, random_state=0).fit(X).cluster_centers_)
    assert ours == pytest.approx(theirs, rel=1e-4)
    sampled, centres = metrics.kmeans_reference(X, 4, n_init=3, seed=0, start_rows=500)
    assert sampled == pytest.approx(theirs, rel=1e-4)
    assert metrics.kmeans_reference(X, 4, init=centres)[0] == pytest.approx(sampled, rel=1e-9)


def test_item_ids_outside_the_universe_take_the_same_path_as_none(monkeypatch):
    offsets, values = np.array([0, 2, 5, 6]), np.array([1, 3, 0, 2, 4, 1])
    calls = _counting(monkeypatch, np, "bincount")
    inside = _work(calls, lambda: sets.within_universe(offsets, values, 10))
    outside = _work(calls, lambda: sets.within_universe(offsets, np.where(values == 4, 12, values), 10))
    assert len(inside) == len(outside) == 1
    monkeypatch.undo()
    kept = sets.within_universe(offsets, np.where(values == 4, 12, values), 10)
    assert kept[0].tolist() == [0, 2, 4, 5] and kept[1].tolist() == [1, 3, 0, 2, 1]
    assert kept[2] == Counter(records_trimmed=1, records_left_out=0)


def test_the_l1_projection_does_the_same_work_with_one_point_outside(monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.1, 0.1, size=(50, 4))
    neighbour = np.vstack([X, [[0.9, -0.9, 0.1, 0.0]]])
    for name in ("sort", "cumsum", "count_nonzero"):  # every step of the projection, not only its start
        calls = _counting(monkeypatch, np, name)
        assert _work(calls, lambda: domain.project_l1_ball(np.vstack([X, X[:1]]))) == \
            _work(calls, lambda: domain.project_l1_ball(neighbour)) != []
    monkeypatch.undo()
    out = domain.project_l1_ball(neighbour)
    assert np.array_equal(out[:50], X) and np.abs(out[50]).sum() == pytest.approx(1.0)
    assert out[50].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_a_degenerate_kernel_clustering_is_evaluated_with_the_same_work(monkeypatch):
    calls = _counting(monkeypatch, kk_kind, "feature_wcss_ratio")
    rng = np.random.default_rng(1)
    Z, centres = rng.normal(size=(40, 3)), rng.normal(size=(2, 3))
    for exact in (np.array([20.0, 20.0]), np.array([39.0, 1.0])):
        report = kk_kind.clustering_evaluation(exact, exact, Z, centres, iterations=2)
        assert report["degenerate"] == (exact[0] == 39.0)
        assert (report["feature_wcss_ratio_to_noise_free_lloyd"] is None) == report["degenerate"]
    assert len(calls) == 2


def test_friendly_kmeans_subsets_run_the_same_lloyd_passes_with_a_far_record(monkeypatch):
    """Stopping each subset's Lloyd when its labels settled let the running time tell, with advantage 0.31 to
    0.61 at m = 2 subsets, whether a far record was there (tests/benchmarks/timing_channel.py)."""
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(c, 1.0, size=(60, 2)) for c in ((0, 0), (20, 0), (0, 20))])
    passes = _counting(monkeypatch, fc.kmeans, "_sq_dists")  # the section that looks it up
    argmins = _counting(monkeypatch, np, "argmin")
    work = [len(_work(passes, lambda: fc.subset_tuples(data, 3, 2, np.random.default_rng(7))))
            for data in (X, np.vstack([X, [[1e6, 1e6]]]))]
    assert work[0] == work[1] == 3 * (fc.LLOYD_PASSES + 1)  # restarts x (passes + the cost), both subsets at once
    # np.argmin's time follows how predictable the labels are: the passes label points branch-free
    # (`fc._nearest`); only k-means++ picks among its candidates with it, (k - 1) times per start.
    assert len(argmins) == 2 * 3 * (3 - 1)
