"""Utility metrics, computed against raw (normalised) data: internal evaluation only, never released."""

from __future__ import annotations

import numpy as np

from dpalgos.dpkmeans import CHUNK_ROWS


def wcss(X: np.ndarray, centroids: np.ndarray) -> float:
    """Within-cluster sum of squares: sum over rows of X (n, d) of the squared Euclidean distance to the
    nearest of `centroids` (K, d). Additive over disjoint parts of X."""
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(centroids, dtype=np.float64)
    c2 = np.einsum("kd,kd->k", C, C)
    total = 0.0
    for start in range(0, X.shape[0], CHUNK_ROWS):
        block = X[start:start + CHUNK_ROWS]
        d2 = np.einsum("nd,nd->n", block, block) + np.min(c2 - 2.0 * block @ C.T, axis=1)
        total += float(np.maximum(d2, 0.0).sum())
    return total


def kmeans_reference(X: np.ndarray, k: int, *, n_init: int = 10, seed: int | None = None) -> tuple[float, np.ndarray]:
    """Non-private reference: scikit-learn KMeans, k-means++ init, best of `n_init` restarts.

    Returns (WCSS of its centroids on X, centroids (k, d)).
    """
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed).fit(np.asarray(X, dtype=np.float64))
    return wcss(X, km.cluster_centers_), km.cluster_centers_
