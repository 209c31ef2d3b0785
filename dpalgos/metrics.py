"""Utility metrics, computed against raw (normalised) data: internal evaluation only, never released."""

from __future__ import annotations

import numpy as np

from dpalgos import lloyd


def wcss(X: np.ndarray, centroids: np.ndarray) -> float:
    """Within-cluster sum of squares: sum over rows of X (n, d) of the squared Euclidean distance to the
    nearest of `centroids` (K, d), in one fused pass. Additive over disjoint parts of X."""
    return lloyd.wcss(np.asarray(X, dtype=np.float64), centroids)


#: Lloyd passes of `kmeans_reference`: a fixed number, not "until the labels settle". The evaluations run it on
#: raw data and their stages' running times are published (Prefect's task timestamps, the timings artifact):
#: scikit-learn's KMeans, which stops when the labels settle, took 47 ms on 20,000 points and 64 ms (or 42 ms)
#: with one record added (a threshold on the time tells them apart with advantage 0.85 to 0.90; this reference:
#: within noise of 0; tests/benchmarks/timing_channel.py). A settled run is a fixed point of further passes, so fixing
#: the count changes no result that settles within it.
REFERENCE_ITERATIONS = 100


def kmeans_reference(X: np.ndarray, k: int, *, n_init: int = 10, seed: int | None = None) -> tuple[float, np.ndarray]:
    """Non-private reference: k-means++ seeding (scikit-learn's), then exactly REFERENCE_ITERATIONS Lloyd passes
    (an empty cluster keeps its centre), best of `n_init` restarts by WCSS. Its work depends on the shape of X, k
    and n_init, not on the values (see REFERENCE_ITERATIONS); on S1 and Adult it reaches scikit-learn KMeans'
    WCSS to within 1e-5.

    Returns (WCSS of its centroids on X, centroids (k, d)).
    """
    from sklearn.cluster import kmeans_plusplus

    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.shape[0] == 0:
        return 0.0, np.zeros((k, X.shape[1]))
    # Fewer points than centres (a release of more clusters than records is made, not refused, and evaluated: a
    # failing evaluation would answer "is N < K?" through the run's state): the points repeated to k rows, whose
    # centres put every point at distance 0.
    fit = X if X.shape[0] >= k else np.resize(X, (k, X.shape[1]))
    rng = np.random.default_rng(seed)
    best_cost, best = np.inf, None
    for _ in range(n_init):
        C, _ = kmeans_plusplus(fit, k, random_state=int(rng.integers(2 ** 31 - 1)))
        for _ in range(REFERENCE_ITERATIONS):
            sums, counts = lloyd.stats(fit, C)
            C = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1.0)[:, None], C)
        cost = lloyd.wcss(X, C)
        if cost < best_cost:
            best_cost, best = cost, C
    return best_cost, best
