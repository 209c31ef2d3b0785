"""Fused Lloyd passes: nearest-centre assignment and what a pass needs of it, in one sweep over the points.

Every per-iteration pass over points (DP Lloyd's counts and sums, kernel k-means' clipped feature sums and
assignments, the evaluations' WCSS) is one loop here: a block of points is read once, its K scores are
formed, and each point is added to its cluster's statistics at once, so no (n, K) score matrix, label vector
or clipped copy is ever built.

Scores are those of the numpy path, c_j.c_j - 2 x.c_j (||x||^2 does not change the argmin), with ties going
to the lowest index as np.argmin does. Below ROWS_MIN_D coordinates the dot products are accumulated in
coordinate order (`_sweep`); from there on one BLAS product per block forms them (`_sweep_rows`). Either way
the rule is a deterministic function of the point and the (public or already noisy) centres, which is all
the plans' sensitivity arguments need (each point lands in exactly one cluster); matching numpy's rule keeps
the statistics identical to the numpy implementation's up to the rounding of the dot products.

The kernels are serial (BLAS at the thread count `tasks.threads` sets) and release the GIL: dask supplies the
parallelism, one partition per task.
"""

from __future__ import annotations

import numba
import numpy as np

#: Points scored together: a block's copy (at most 256 x ROWS_MIN_D float64 in `_sweep`), its scores and
#: running minima stay in the L1/L2 caches.
BLOCK = 256
#: From this dimension on, `_sweep_rows` (BLAS dot products) is the faster pass (measured at d = 16..200).
ROWS_MIN_D = 32


@numba.njit(cache=True, nogil=True)
def _load(X, start, m, XT):
    for t in range(X.shape[1]):
        for i in range(m):
            XT[t, i] = X[start + i, t]


@numba.njit(cache=True, nogil=True)
def _clip(XT, m, bound, norms):
    # As `kernel_kmeans.clip_rows`: each row scaled to norm at most bound * (1 - 1e-6), in float64 here, so
    # that no rounding takes a clipped row above the bound the sums' sensitivity is stated with.
    norms[:m] = 0.0
    for t in range(XT.shape[0]):
        for i in range(m):
            norms[i] += XT[t, i] * XT[t, i]
    for i in range(m):
        norms[i] = max(1.0, np.sqrt(norms[i]) / (bound * (1.0 - 1e-6)))
    for t in range(XT.shape[0]):
        for i in range(m):
            XT[t, i] /= norms[i]


@numba.njit(cache=True, nogil=True)
def _select(j, cj, dots, x_last, c_last, m, best, arg):
    # The last coordinate's product, the score and the running minimum over centres in one loop without
    # branches (vectorises); strict < keeps the lowest index on ties.
    if j == 0:
        for i in range(m):
            best[i] = cj - 2.0 * (dots[i] + x_last[i] * c_last)
            arg[i] = 0
        return
    for i in range(m):
        s = cj - 2.0 * (dots[i] + x_last[i] * c_last)
        lower = s < best[i]
        arg[i] = j if lower else arg[i]
        best[i] = s if lower else best[i]


@numba.njit(cache=True, nogil=True)
def _score(XT, m, C, c2, dots, best, arg):
    # Centre by centre over the block: the inner loops run over points, independent lanes that vectorise
    # without reassociating a sum (each dot product keeps its coordinate order: the partial sum of the
    # first d - 1 coordinates in `dots`, the last one added as the score is formed).
    d = C.shape[1]
    for j in range(C.shape[0]):
        if d == 1:
            dots[:m] = 0.0
        else:
            c = C[j, 0]
            for i in range(m):
                dots[i] = XT[0, i] * c
            for t in range(1, d - 1):
                c = C[j, t]
                for i in range(m):
                    dots[i] += XT[t, i] * c
        _select(j, c2[j], dots, XT[d - 1], C[j, d - 1], m, best, arg)


@numba.njit(cache=True, nogil=True)
def _sweep(X, C, c2, bound, sums, counts, labels, want_wcss):
    """One pass: per block, load (and clip if bound > 0), score, then add each point to what is asked
    (sums/counts if sums.size, labels if labels.size, the WCSS returned if want_wcss)."""
    d = X.shape[1]
    XT, dots = np.empty((d, BLOCK)), np.empty(BLOCK)
    best, arg = np.empty(BLOCK), np.empty(BLOCK, dtype=np.int64)
    total = 0.0
    for start in range(0, X.shape[0], BLOCK):
        m = min(BLOCK, X.shape[0] - start)
        _load(X, start, m, XT)
        if bound > 0.0:
            _clip(XT, m, bound, dots)
        _score(XT, m, C, c2, dots, best, arg)
        if labels.size:
            labels[start:start + m] = arg[:m]
        if sums.size:
            for i in range(m):
                j = arg[i]
                counts[j] += 1.0
                for t in range(d):
                    sums[j, t] += XT[t, i]
        if want_wcss:
            for i in range(m):
                xx = 0.0
                for t in range(d):
                    xx += XT[t, i] * XT[t, i]
                total += max(xx + best[i], 0.0)
    return total


@numba.njit(cache=True, nogil=True)
def _load_rows(X, start, m, bound, XB):
    for i in range(m):
        nn = 0.0
        for t in range(X.shape[1]):
            v = np.float64(X[start + i, t])
            XB[i, t] = v
            nn += v * v
        if bound > 0.0:
            XB[i] /= max(1.0, np.sqrt(nn) / (bound * (1.0 - 1e-6)))  # as `_clip`


@numba.njit(cache=True, nogil=True)
def _sweep_rows(X, C, c2, bound, sums, counts, labels, want_wcss):
    """`_sweep` for many coordinates: a row-major block whose dot products are one BLAS product
    (rows x d) @ (d x K), which keeps its sums in registers where the coordinate loop cannot."""
    CT = np.ascontiguousarray(C.T)
    XB = np.zeros((BLOCK, X.shape[1]))  # zeros: a last, partial block goes to BLAS whole
    total = 0.0
    for start in range(0, X.shape[0], BLOCK):
        m = min(BLOCK, X.shape[0] - start)
        _load_rows(X, start, m, bound, XB)
        D = np.dot(XB, CT)
        for i in range(m):
            best, arg = c2[0] - 2.0 * D[i, 0], 0
            for j in range(1, C.shape[0]):
                s = c2[j] - 2.0 * D[i, j]
                if s < best:
                    best, arg = s, j
            if labels.size:
                labels[start + i] = arg
            if sums.size:
                counts[arg] += 1.0
                sums[arg] += XB[i]
            if want_wcss:
                total += max(np.dot(XB[i], XB[i]) + best, 0.0)
    return total


def _run(X, centroids, bound=0.0, *, stats=False, labels=False, wcss=False):
    X = np.asarray(X)
    X = np.ascontiguousarray(X if X.dtype in (np.float32, np.float64) else X.astype(np.float64))
    C = np.ascontiguousarray(centroids, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] < 1 or C.shape[1] != X.shape[1]:
        raise ValueError(f"need centres of shape (K >= 1, {X.shape[1]}), got {C.shape}")
    K, d = C.shape
    sums, counts = (np.zeros((K, d)), np.zeros(K)) if stats else (np.zeros((0, 0)), np.zeros(0))
    out = np.empty(X.shape[0] if labels else 0, dtype=np.int64)
    sweep = _sweep_rows if d >= ROWS_MIN_D else _sweep
    total = sweep(X, C, np.einsum("kd,kd->k", C, C), float(bound), sums, counts, out, wcss)
    return sums, counts, out, float(total)


def labels(X, centroids) -> np.ndarray:
    """Index (int64) of the nearest centroid of every row of X (n, d)."""
    return _run(X, centroids, labels=True)[2]


def stats(X, centroids) -> tuple[np.ndarray, np.ndarray]:
    """Sums (K, d) and counts (K,), float64, of the rows of X (n, d) grouped by nearest centroid."""
    return _run(X, centroids, stats=True)[:2]


def wcss(X, centroids) -> float:
    """Sum over the rows of X of the squared distance to the nearest centroid, ||x||^2 + min_j score_j
    (floored at 0 per row against cancellation)."""
    return _run(X, centroids, wcss=True)[3]


def clipped_stats(Z, centroids, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """`stats` of the rows of Z, each first scaled to L2 norm at most `bound` > 0 (kernel k-means' features)."""
    return _run(Z, centroids, _positive(bound), stats=True)[:2]


def clipped_labels(Z, centroids, bound: float) -> np.ndarray:
    """`labels` of the rows of Z, each first scaled to L2 norm at most `bound` > 0."""
    return _run(Z, centroids, _positive(bound), labels=True)[2]


def _positive(bound: float) -> float:
    if not (np.isfinite(bound) and bound > 0):
        raise ValueError(f"the clipping bound must be positive and finite, got {bound}")
    return float(bound)
