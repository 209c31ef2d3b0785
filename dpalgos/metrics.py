"""Utility metrics, computed against raw (normalised) data: internal evaluation only, never released."""

from __future__ import annotations

import numpy as np

from dpalgos import lloyd


def wcss(X: np.ndarray, centroids: np.ndarray) -> float:
    """Within-cluster sum of squares: sum over rows of X (n, d) of the squared Euclidean distance to the
    nearest of `centroids` (K, d), in one fused pass. Additive over disjoint parts of X."""
    return lloyd.wcss(np.asarray(X, dtype=np.float64), centroids)


def kmeans_reference(X: np.ndarray, k: int, *, n_init: int = 10, seed: int | None = None) -> tuple[float, np.ndarray]:
    """Non-private reference: scikit-learn KMeans, k-means++ init, best of `n_init` restarts.

    Returns (WCSS of its centroids on X, centroids (k, d)).
    """
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed).fit(np.asarray(X, dtype=np.float64))
    return wcss(X, km.cluster_centers_), km.cluster_centers_
