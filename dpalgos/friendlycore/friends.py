"""Predicates and friend counts (docs/friendlycore.md §1, §12): the Euclidean, grid and pair predicates, counted
without an n x n matrix for large n."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

import numpy as np

from dpalgos.friendlycore.constants import PREDICATES, SHRINK, check_radius


class FriendCounter(Protocol):
    """Friend counts of a fixed dataset for a family of predicates f_r indexed by the radius r."""
    n: int

    def counts(self, r: float) -> np.ndarray:
        """deg(x) = #{z in D : f_r(x, z)} for every x in D (int64, shape (n,))."""


def sq_dist_pairs(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The defining formula of the squared distance of the pairs (A[i], B[i]): s = 0; s += (a_k - b_k)^2 for k in
    order. Elementwise IEEE operations in a fixed order, so the value is a function of the pair alone (no BLAS,
    no reduction whose order depends on memory layout) and symmetric (fl(a-b)^2 == fl(b-a)^2)."""
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    acc = np.zeros(np.broadcast_shapes(A.shape, B.shape)[:-1])
    with np.errstate(over="ignore"):  # an overflow is inf, "not friends" (`within`)
        for k in range(A.shape[-1]):
            t = A[..., k] - B[..., k]
            acc += t * t
    return acc


class EuclideanFriends:
    """f_r(x, z) = [sq_dist_pairs(x, z) <= r^2 (1 - 1e-9)]: implies ||x - z|| <= r exactly (§12).

    Counts in row blocks: squared distances by BLAS (||a||^2 + ||b||^2 - 2 a.b on rows shifted by the median),
    trusted only when they are farther from the threshold than a proven rounding-error bound (1e-10 (|a| + |b|)^2
    for d <= 1e5); the pairs inside the band are recomputed with the defining formula. For n^2 * 8 bytes <=
    `cache_bytes` the BLAS matrix is kept, so each further radius costs O(n^2) and no BLAS.
    """

    def __init__(self, X, *, cache_bytes: int = 64 << 20, block_bytes: int = 32 << 20):
        X = np.ascontiguousarray(np.asarray(X, dtype=np.float64))
        if X.ndim != 2:
            raise ValueError("X must be (n, d)")
        self.n, self.d = X.shape
        if self.d > 100_000:
            raise ValueError("the rounding-error margin is proven for d <= 1e5")
        if not np.all(np.isfinite(X)):
            raise ValueError("X must be finite")
        self._X = X
        # Shift point of the BLAS filter only (the predicate does not depend on it): the coordinate-wise median keeps
        # the rounding margins, hence the re-checked band, small even with far outliers.
        c = np.median(X, axis=0) if self.n else np.zeros(self.d)
        self._Y = X - c
        self._a = np.sqrt(np.einsum("ij,ij->i", self._Y, self._Y))
        self._rows = max(1, int(block_bytes // (8 * max(self.n, 1) * 3)))
        self._G = None
        if self.n * self.n * 8 <= cache_bytes:
            self._G = self._blas_block(0, self.n)

    def _blas_block(self, i0, i1):
        Yb = self._Y[i0:i1]
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is sent to the defining formula (`counts`)
            a2 = self._a * self._a
            return a2[i0:i1, None] + a2[None, :] - 2.0 * (Yb @ self._Y.T)

    def counts(self, r: float) -> np.ndarray:
        r = check_radius(r)
        t = r * r * SHRINK
        out = np.empty(self.n, dtype=np.int64)
        for i0 in range(0, self.n, self._rows):
            i1 = min(self.n, i0 + self._rows)
            G = self._G[i0:i1] if self._G is not None else self._blas_block(i0, i1)
            s = self._a[i0:i1, None] + self._a[None, :]
            with np.errstate(over="ignore", invalid="ignore"):
                margin = 1e-10 * s * s
            friends = G <= t
            # Inside the rounding band, or where BLAS overflowed (inf, or nan from inf - inf), the defining formula
            # decides: the predicate stays a function of the pair alone.
            ii, jj = np.nonzero((np.abs(G - t) <= margin) | ~np.isfinite(G))
            if ii.size:
                friends[ii, jj] = within(sq_dist_pairs(self._X[ii + i0], self._X[jj]), t)
            out[i0:i1] = friends.sum(axis=1)
        return out


class GridFriends:
    """Cell predicate for low dimension (d <= 3): with cells of side s = r / (q + 0.01) on a public grid (origin
    `origin`, default 0), f_r(x, z) = [sum_k (|c_k(x) - c_k(z)| + 1)^2 <= q^2], c(x) = floor((x - origin)/s), and
    f_r(x, z) = 0 when x or z lies more than `cap` cells from the origin in some coordinate (§1.3).

    It is a function of the pair alone, symmetric, implies ||x - z|| <= r (the farthest points of the two cells
    are s * ||(|dc| + 1)|| apart; the +0.01 absorbs floating-point cell errors, §12) and holds whenever
    ||x - z|| <= r (q - 2 sqrt(d)) / (q + 0.01). Counts: a histogram of the cells and a convolution with the
    predicate's kernel (FFT on the bounding box of the occupied cells, or sorted-key lookups when that box is
    large): O(n log n + cells * kernel), never a pairwise matrix.
    """

    _CAP: ClassVar[dict[int, int]] = {1: 2 ** 60, 2: 2 ** 30, 3: 2 ** 19}

    def __init__(self, X, *, q: int = 16, origin=None, dense_cells: int = 1 << 22):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or not 1 <= X.shape[1] <= 3:
            raise ValueError("GridFriends needs X of shape (n, d) with d <= 3")
        if int(q) != q or q < 2:
            raise ValueError("q must be an integer >= 2")
        if not np.all(np.isfinite(X)):
            raise ValueError("X must be finite")
        self.n, self.d = X.shape
        self.q = int(q)
        self._X = X
        self._origin = np.zeros(self.d) if origin is None else np.asarray(origin, dtype=np.float64)
        self._dense_cells = dense_cells
        rng = np.arange(-self.q, self.q + 1)
        grids = np.meshgrid(*([rng] * self.d), indexing="ij")
        offs = np.stack([g.ravel() for g in grids], axis=1)
        self.kernel = offs[((np.abs(offs) + 1) ** 2).sum(axis=1) <= self.q ** 2]

    def side(self, r: float) -> float:
        return float(r) / (self.q + 0.01)

    def cells(self, r: float) -> tuple[np.ndarray, np.ndarray]:
        """(integer cell coordinates (n, d), mask of points inside the cap)."""
        s = self.side(r)
        Y = (self._X - self._origin) / s
        ok = np.all(np.abs(Y) < self._CAP[self.d], axis=1)
        C = np.zeros(Y.shape, dtype=np.int64)
        C[ok] = np.floor(Y[ok]).astype(np.int64)
        return C, ok

    def counts(self, r: float) -> np.ndarray:
        C, ok = self.cells(r)
        out = np.zeros(self.n, dtype=np.int64)
        if not np.any(ok):
            return out
        Cok = C[ok]
        lo = Cok.min(axis=0) - self.q
        span = Cok.max(axis=0) + self.q + 1 - lo  # padded by q: a kernel offset never wraps
        rel = Cok - lo
        if float(np.prod(span.astype(np.float64))) <= self._dense_cells:
            deg_cells = self._dense(rel, span)
        else:
            deg_cells = self._sparse(rel, span)
        out[ok] = deg_cells
        return out

    def _dense(self, rel, span):
        from scipy.signal import fftconvolve

        flat = np.ravel_multi_index(tuple(rel.T), tuple(span))
        hist = np.bincount(flat, minlength=int(np.prod(span))).reshape(tuple(span)).astype(np.float64)
        ker = np.zeros((2 * self.q + 1,) * self.d)
        ker[tuple((self.kernel + self.q).T)] = 1.0
        conv = fftconvolve(hist, ker, mode="same")  # symmetric kernel: correlation == convolution
        exact = np.rint(conv)
        if np.max(np.abs(conv - exact), initial=0.0) > 0.25:  # cannot happen for counts < 2^40; be safe
            return self._sparse(rel, span)
        return exact.astype(np.int64).ravel()[flat]

    def _sparse(self, rel, span):
        # Keys in row-major order of the padded box: along the last axis the kernel is a contiguous interval
        # [-h, h] for each offset `a` of the other axes, so one count is a difference of two binary searches in
        # the cumulative counts of the sorted occupied cells (the padding by q keeps every interval in its row).
        strides = np.ones(self.d, dtype=np.int64)
        for k in range(self.d - 2, -1, -1):
            strides[k] = strides[k + 1] * span[k + 1]
        keys = rel @ strides
        uniq, inverse, cnt = np.unique(keys, return_inverse=True, return_counts=True)
        cum = np.concatenate([[0], np.cumsum(cnt)])
        deg = np.zeros(uniq.size, dtype=np.int64)
        for a, h in self._rows_of_kernel():
            base = uniq + (int(np.dot(a, strides[:-1])) if self.d > 1 else 0)
            hi = np.searchsorted(uniq, base + h, side="right")
            lo = np.searchsorted(uniq, base - h, side="left")
            deg += cum[hi] - cum[lo]
        return deg[inverse]

    def _rows_of_kernel(self):
        """[(offset of the first d-1 axes, half-width h of the last-axis interval)] of the kernel."""
        if self.d == 1:
            return [(np.zeros(0, dtype=np.int64), int(np.abs(self.kernel[:, 0]).max()))]
        rows = {}
        for off in self.kernel:
            key = tuple(int(v) for v in off[:-1])
            rows[key] = max(rows.get(key, 0), abs(int(off[-1])))
        return [(np.array(k, dtype=np.int64), h) for k, h in sorted(rows.items())]


class PairFriends:
    """Friend counts for any symmetric predicate given as a block function predicate(A, B) -> bool (a, b) on
    slices of `items`, evaluated in blocks of rows (never an n x n matrix beyond one block)."""

    def __init__(self, items, predicate: Callable[[np.ndarray, np.ndarray, float], np.ndarray], *,
                 block: int = 1024):
        self._items = items
        self.n = len(items)
        self._pred = predicate
        self._block = block

    def counts(self, r: float) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.int64)
        for i0 in range(0, self.n, self._block):
            A = self._items[i0:i0 + self._block]
            for j0 in range(0, self.n, self._block):
                out[i0:i0 + self._block] += np.asarray(
                    self._pred(A, self._items[j0:j0 + self._block], r), dtype=bool).sum(axis=1)
        return out


def within(sq: np.ndarray, t: float) -> np.ndarray:
    """sq <= t for a finite threshold t (`check_radius`): an overflowed (inf) or nan squared distance is "not
    friends", whatever the threshold."""
    return np.isfinite(sq) & (sq <= t)


def euclidean_block_predicate(A, B, r):
    """The Euclidean predicate of `EuclideanFriends` as a block function (defining formula on every pair)."""
    r = check_radius(r)
    return within(sq_dist_pairs(np.asarray(A)[:, None, :], np.asarray(B)[None, :, :]), r * r * SHRINK)


def friend_counter(X, predicate: str = "distance", *, grid_q: int = 16) -> FriendCounter:
    if predicate == "distance":
        return EuclideanFriends(X)
    if predicate == "grid":
        return GridFriends(X, q=grid_q)
    raise ValueError(f"predicate must be one of {PREDICATES}, got {predicate!r}")
