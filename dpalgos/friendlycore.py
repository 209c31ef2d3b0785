"""FriendlyCore: private averaging without a bound on the data, and k-means by k-tuple aggregation.

FriendlyCore framework after Tsfadia, Cohen, Kaplan, Mansour & Stemmer, "FriendlyCore: Practical Differentially
Private Aggregation" (ICML 2022); filter and analysis derived in this project. The paper's text was not available
here: the weight rule, the constants (2, 4r, 3, 8r, 6r), the release rule and every proof are ours, written out in
full in docs/friendlycore.md (cited below as "§n"). Nothing in this module is the paper's constant.

The mechanism, for a symmetric predicate f with f(x, z) => ||x - z|| <= r (§1):

  1. Soft core (§2): deg(x) = #{z in D : f(x, z)}, w(x) = clip(2 deg(x)/n - 1, 0, 1), W = sum w. No coins.
  2. Friendly average (§5): M = sum w(x) x / W. Under add/remove of one point,
        |W(D') - W(D)| <= (2n+1)/(n+1) < 2                           (Corollary 3.2, tight)
        ||M(D') - M(D)||_2 <= 4 r / max(W(D), W(D'))   if max(W, W') >= 2   (Theorem 5.1)
     (the design note's 3 and 6r, re-checked: both hold, both are loose; §10).
  3. Release, propose-test-release style (§6): W^ = W + N(0, (2 s_W)^2); L = W^ - z s_W' (z from delta', a
     sub-Gaussian tail, valid for OpenDP's discrete Gaussian); if L < L_min (>= 2) release "no friendly core"
     (None); else M^ = M + N(0, (s_M 4 r / L)^2 I). Theorem 6.1: with the noise multipliers of the plan this is
     (eps_0, delta_0 + delta')-DP for every (eps_0, delta_0) that rho-zCDP (rho = sum of the plan's rhos) converts
     to; `ptr_delta(params)` is the delta' the release must add to the delta it charges (§8).
  4. Radius (§7): a public r, or the smallest r of a public geometric grid whose noisy W reaches a public
     fraction of a noisy count, found by a binary search (ceil(log2 J) Gaussian probes of W, sensitivity 2).
  5. k-means (§9): records go to m (even, public) subsets by independent coins from a generator that is not
     published; non-private k-means++ on every subset gives m k-tuples; adding a record replaces one tuple, and
     the same weights then satisfy |dW| < 3 and ||dM|| < 8 r / max(W, W'') under replacement (Theorem 9.3,
     this is "group privacy 2" done on the statistics; m even is needed, Lemma 9.2). Tuple predicate: both
     tuples 6r-separated and the nearest-centre matching a bijection within r in Frobenius norm; on a friendly
     set the matchings are consistent (Lemma 9.5), so bucketing every core tuple's centres by the nearest
     centre of any core tuple gives the same k buckets; the k bucket averages are one friendly average in
     R^{k d} (one Gaussian release with one W^).

Noise and accounting go through `dpalgos.plan` / `dpalgos.noise`: every noisy value is drawn by
`measure(name, exact, bound=...)` for an entry of the plan built by `mean_plan(params)` / `kmeans_plan(params)`.
Public randomness (subset coins, k-means++ seeds) comes from a separate `np.random.Generator`.

Friend counts never build an n x n matrix for large n: `EuclideanFriends` works in row blocks (BLAS distances
used only where a rigorous rounding-error margin certifies the comparison, the defining formula elsewhere,
§12); `GridFriends` (d <= 3) counts a cell predicate by a histogram and a convolution in O(n + cells);
`PairFriends` counts any predicate given as a block function; `TupleFriends` is the k-means predicate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

import numpy as np

from dpalgos.noise import Measure
from dpalgos.plan import Mechanism, Plan

# --------------------------------------------------------------------------------------------------------------
# Constants proven in docs/friendlycore.md
# --------------------------------------------------------------------------------------------------------------
#: L2 sensitivity of W under add/remove (Corollary 3.2: |dW| <= (2n+1)/(n+1) < 2).
WEIGHT_SENSITIVITY = 2.0
#: ||M(D') - M(D)|| <= MEAN_SENSITIVITY_MULTIPLE * r / max(W, W') under add/remove (Theorem 5.1).
MEAN_SENSITIVITY_MULTIPLE = 4.0
#: Sensitivity of the count n (add/remove).
COUNT_SENSITIVITY = 1.0
#: Under replacement of one element (k-means tuples, m even): |dW| < 3 and ||dM|| < 8 r / max(W, W'') (Thm 9.3).
TUPLE_WEIGHT_SENSITIVITY = 3.0
TUPLE_MEAN_SENSITIVITY_MULTIPLE = 8.0
#: Tuples must be more than SEPARATION_FACTOR * r separated for the tuple predicate (Lemma 9.5 needs > 6r).
SEPARATION_FACTOR = 6.0
#: Thresholds are shrunk by this factor so that a floating-point "yes" implies the exact inequality (§12).
_SHRINK = 1.0 - 1e-9
#: The largest public radius: every threshold the predicates compare with, (SEPARATION_FACTOR r)^2 (1 + 1e-9) the
#: largest, must be a finite double. Above about 1.3e154 r^2 overflows to inf and `inf <= inf` made a record at
#: 1e300 everyone's friend (an attacker's review released a mean of 5e296 with it, 9e152 without it).
MAX_RADIUS = 1e150


def check_radius(r: float, what: str = "r") -> float:
    """A public radius whose thresholds are finite: 0 < r <= MAX_RADIUS (a ValueError otherwise)."""
    if not (math.isfinite(r) and 0 < r <= MAX_RADIUS):
        raise ValueError(f"{what} must be in (0, {MAX_RADIUS:g}] (its square, times the predicates' factors, must "
                         f"be a finite number)")
    return float(r)

PREDICATES = ("distance", "grid")


# --------------------------------------------------------------------------------------------------------------
# Predicates and friend counts (§1, §12)
# --------------------------------------------------------------------------------------------------------------
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
    with np.errstate(over="ignore"):  # an overflow is inf, "not friends" (`_within`)
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
        t = r * r * _SHRINK
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
                friends[ii, jj] = _within(sq_dist_pairs(self._X[ii + i0], self._X[jj]), t)
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


def _within(sq: np.ndarray, t: float) -> np.ndarray:
    """sq <= t for a finite threshold t (`check_radius`): an overflowed (inf) or nan squared distance is "not
    friends", whatever the threshold."""
    return np.isfinite(sq) & (sq <= t)


def euclidean_block_predicate(A, B, r):
    """The Euclidean predicate of `EuclideanFriends` as a block function (defining formula on every pair)."""
    r = check_radius(r)
    return _within(sq_dist_pairs(np.asarray(A)[:, None, :], np.asarray(B)[None, :, :]), r * r * _SHRINK)


def friend_counter(X, predicate: str = "distance", *, grid_q: int = 16) -> FriendCounter:
    if predicate == "distance":
        return EuclideanFriends(X)
    if predicate == "grid":
        return GridFriends(X, q=grid_q)
    raise ValueError(f"predicate must be one of {PREDICATES}, got {predicate!r}")


# --------------------------------------------------------------------------------------------------------------
# Soft core and friendly average (§2-§6)
# --------------------------------------------------------------------------------------------------------------
def total_weight(weights: np.ndarray) -> float:
    """W = sum of the weights, correctly rounded (math.fsum): its error stays below the slack of Corollary 3.2
    (§12)."""
    return math.fsum(np.asarray(weights, dtype=np.float64).tolist())


def soft_weights(counts: np.ndarray, n=None) -> np.ndarray:
    """w(x) = clip(2 deg(x)/n - 1, 0, 1) (§2): 0 for points with at most n/2 friends, 1 for friends of all.
    n (default: the number of counts) may be an array broadcasting against `counts` (n = 0 gives weight 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = np.asarray(counts.size if n is None else n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.clip(2.0 * counts / n - 1.0, 0.0, 1.0)
    return np.where(n > 0, w, 0.0)


def weighted_mean(points: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
    """M = sum w x / W, computed relative to the heaviest point (so its rounding error is of order
    n u * 2r / W + ulp(M), §12); None when W = 0."""
    points = np.asarray(points, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    W = total_weight(w)
    if not W > 0:
        return None
    ref = points[int(np.argmax(w))]
    sel = w > 0
    return ref + (w[sel] @ (points[sel] - ref)) / W


def gaussian_tail_z(delta_ptr: float) -> float:
    """z with P[X >= z sigma] <= delta' for X ~ N(0, sigma^2) AND for the discrete Gaussian on any grid
    (sub-Gaussian with variance proxy sigma^2: Canonne, Kamath & Steinke 2020, Cor. 9): z = sqrt(2 ln(1/delta'))."""
    if not 0.0 < delta_ptr < 1.0:
        raise ValueError(f"delta' must be in (0, 1), got {delta_ptr}")
    return math.sqrt(2.0 * math.log(1.0 / delta_ptr))


def ptr_lower_bound(noisy_weight, sigma_weight: float, delta_ptr: float):
    """L = W^ - z sigma_W, lowered by a relative 1e-9 so that floating-point rounding (of W^ by the sampler and
    of this subtraction) cannot raise it (§6, §12). P[L > W] <= delta'. Vectorised over `noisy_weight`."""
    z = gaussian_tail_z(delta_ptr)
    w = np.asarray(noisy_weight, dtype=np.float64)
    return w - z * sigma_weight * (1.0 + 1e-9) - 1e-9 * np.abs(w)


def mean_noise_scale(plan_entry: Mechanism, r: float, L) -> np.ndarray:
    """The standard deviation the plan gives the mean's noise for radius r and test value L (vectorised in L):
    noise_multiplier * bound_multiple * (r / L)."""
    return plan_entry.noise_multiplier * plan_entry.bound_multiple * (float(r) / np.asarray(L, dtype=np.float64))


# --------------------------------------------------------------------------------------------------------------
# Radius grid and private choice (§7)
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RadiusGrid:
    """Public geometric grid r_j = r_min * ratio^j, j = 0..J-1, J = floor(log(r_max/r_min)/log(ratio)) + 1."""
    r_min: float
    r_max: float
    ratio: float = 2.0 ** 0.125

    def __post_init__(self):
        check_radius(self.r_min, "r_min")
        check_radius(self.r_max, "r_max")
        if not (self.r_min <= self.r_max and self.ratio > 1):
            raise ValueError("need r_min <= r_max and ratio > 1")

    @property
    def radii(self) -> np.ndarray:
        J = math.floor(math.log(self.r_max / self.r_min) / math.log(self.ratio) + 1e-9) + 1
        return self.r_min * self.ratio ** np.arange(J)

    @property
    def probes(self) -> int:
        """Number of binary-search probes: ceil(log2 J) (0 for a single radius)."""
        J = self.radii.size
        return math.ceil(math.log2(J)) if J > 1 else 0


#: A binary search's threshold stays this many probe standard deviations below the noisy count: a statistic
#: that saturates at n (W(r), the count within a radius) then passes its probes at large radii, whatever the
#: target. At n = 200 and a target of 0.9 n, probes of W = n failed 1 in 4 times and sent r to 10^3..10^5; with a
#: margin of 3 a first probe failed at 2.7 deviations in 1 of 10 runs at n = 800 (r = 1011 instead of 16, the
#: error 7x); at 4 a probe fails with probability 3e-5.
SEARCH_MARGIN = 4.0


def search_threshold(target: float, noisy_count: float, sigma_probe: float) -> float:
    """min(target * n~, n~ - SEARCH_MARGIN * sigma_probe): a function of a noisy count and public values."""
    return min(target * noisy_count, noisy_count - SEARCH_MARGIN * sigma_probe)


def binary_search_radius(weight_at: Callable[[float], float], grid: RadiusGrid, threshold: float,
                         measure: Measure, name: str) -> tuple[float, list[tuple[float, float]]]:
    """Smallest r_j with noisy W(r_j) >= threshold, assuming W(r) nondecreasing (it is: a larger r has more friends);
    r_max if none. Each probe is one draw of the plan entry `name`. Returns (r, [(r_j, noisy W_j), ...])."""
    radii = grid.radii
    lo, hi = 0, radii.size - 1
    probes: list[tuple[float, float]] = []
    while lo < hi:
        mid = (lo + hi) // 2
        noisy = float(measure(name, np.array([weight_at(float(radii[mid]))]))[0])
        probes.append((float(radii[mid]), noisy))
        if noisy >= threshold:
            hi = mid
        else:
            lo = mid + 1
    return float(radii[lo]), probes


# --------------------------------------------------------------------------------------------------------------
# Averaging: parameters, plan, release
# --------------------------------------------------------------------------------------------------------------
_MEAN_SPLIT_GRID = {"count": 0.02, "radius": 0.08, "weight": 0.10, "mean": 0.80}
_MEAN_SPLIT_FIXED = {"weight": 0.10, "mean": 0.90}
#: With the refinement (§13) the friendly mean only has to locate the data: most of rho goes to the clipped sum,
#: whose add/remove sensitivity is the clip radius C (about the data's spread around its centre), not 4r / W.
#: `outside` counts the records beyond the clip ball, so that a release says how many were pulled onto it.
_MEAN_SPLIT_GRID_REFINED = {"count": 0.01, "radius": 0.05, "weight": 0.04, "mean": 0.15, "clip": 0.03,
                            "outside": 0.02, "refine": 0.70}
_MEAN_SPLIT_FIXED_REFINED = {"count": 0.01, "weight": 0.04, "mean": 0.17, "clip": 0.03, "outside": 0.02,
                             "refine": 0.73}


@dataclass(frozen=True)
class MeanParams:
    """Public parameters of the friendly average (everything here is public: spec values, never data).

    rho        total zCDP budget of the release (its (eps, delta) adds `delta_ptr`, `Plan.guarantee`).
    r          a public radius, or None to choose it privately over `grid`.
    grid       the public radius grid (required when r is None).
    delta_ptr  delta' of the propose-test-release step (§6).
    split      fractions of rho: keys count/radius/weight/mean (grid) or weight/mean (public r).
    target     the search picks the smallest r_j with noisy W_j >= target * noisy n.
    min_weight L_min: release None when L < L_min. Must be >= 2 (Theorem 6.1 needs max(W, W') >= 2).
    predicate  "distance" (exact Euclidean, any d) or "grid" (cell predicate, d <= 3, for very large n).
    grid_q     cells per radius of the grid predicate.
    refine     after the friendly mean c1, release c1 + (noisy sum of the points clipped to the ball B(c1, C)) /
               noisy n instead (§13, ours); C is the smallest radius of a public grid around c1 whose noisy count
               of points reaches `clip_target` * noisy n, and a noisy count of the points beyond C says how many
               were pulled onto the ball. Split keys then add count (always), clip, outside and refine.
    clip_target, clip_ratio, clip_span  the clip grid: C_j = hi / clip_span * clip_ratio^j up to
               hi = 2 r + sigma_M (sqrt(d) + 4) (every core point is within 2r of the friendly mean, §5(i)).
    """
    rho: float
    r: float | None = None
    grid: RadiusGrid | None = None
    delta_ptr: float = 1e-8
    split: dict | None = None
    target: float = 0.9
    min_weight: float = 2.0
    predicate: Literal["distance", "grid"] = "distance"
    grid_q: int = 16
    refine: bool = False
    clip_target: float = 0.95
    clip_ratio: float = 2.0 ** (1 / 16)
    clip_span: float = 64.0

    def __post_init__(self):
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError("rho must be positive")
        if (self.r is None) == (self.grid is None):
            raise ValueError("give exactly one of a public radius r and a radius grid")
        if self.r is not None:
            check_radius(self.r)
        if self.min_weight < WEIGHT_SENSITIVITY:
            raise ValueError("min_weight must be >= 2 (Theorem 6.1)")
        if not 0 < self.target <= 1:
            raise ValueError("target must be in (0, 1]")
        if not 0 < self.clip_target <= 1:
            raise ValueError("clip_target must be in (0, 1]")
        if not (self.clip_ratio > 1 and self.clip_span >= 1):
            raise ValueError("need clip_ratio > 1 and clip_span >= 1")
        if self.predicate not in PREDICATES:
            raise ValueError(f"predicate must be one of {PREDICATES}")
        gaussian_tail_z(self.delta_ptr)
        s = self.budget_split()
        if any(v <= 0 for v in s.values()) or abs(sum(s.values()) - 1) > 1e-9:
            raise ValueError(f"split fractions must be positive and sum to 1, got {s}")

    @property
    def counted(self) -> bool:
        """A noisy count n is drawn: for the radius search's threshold and for the refinement's divisor."""
        return self.grid is not None or self.refine

    @property
    def clip_probes(self) -> int:
        """Binary-search probes of the clip grid (its size is public: ceil(log2 J))."""
        J = clip_radii(1.0, self).size
        return math.ceil(math.log2(J)) if self.refine and J > 1 else 0

    def budget_split(self) -> dict:
        if self.refine:
            default = _MEAN_SPLIT_GRID_REFINED if self.grid is not None else _MEAN_SPLIT_FIXED_REFINED
        else:
            default = _MEAN_SPLIT_GRID if self.grid is not None else _MEAN_SPLIT_FIXED
        s = dict(self.split or default)
        if set(s) != set(default):
            raise ValueError(f"split keys must be {sorted(default)}, got {sorted(s)}")
        return s


def _nm(rho: float) -> float:
    """Gaussian noise multiplier for rho-zCDP: sigma / sensitivity = 1 / sqrt(2 rho)."""
    return 1.0 / math.sqrt(2.0 * rho)


#: Why a FriendlyCore plan's extra delta (`Plan.extra_delta`) is its PTR delta'.
PTR_ARGUMENT = ("the propose-test-release test passes with L above the true core weight with probability at most "
                "delta' (docs/friendlycore.md Theorem 6.1, §8)")


def mean_plan(params: MeanParams) -> Plan:
    """The plan of `friendly_mean`: its event is the zCDP part, its extra delta the PTR delta' (`ptr_delta`), so
    `plan.guarantee(delta)` is the release's (eps, delta) (Theorem 6.1, §8)."""
    s = {k: v * params.rho for k, v in params.budget_split().items()}
    mech = []
    if params.counted:
        mech.append(Mechanism(
            name="fc_count", query="number of records n", distribution="gaussian",
            sensitivity=COUNT_SENSITIVITY, integer=True, noise_multiplier=_nm(s["count"]),
            argument="adding or removing one record changes n by 1"))
    if params.grid is not None:
        mech.append(Mechanism(
            name="fc_radius", query="soft-core weight W(r_j) at a grid radius (binary-search probe)",
            distribution="gaussian", sensitivity=WEIGHT_SENSITIVITY, repetitions=max(params.grid.probes, 1),
            noise_multiplier=_nm(s["radius"] / max(params.grid.probes, 1)),
            argument="docs/friendlycore.md Corollary 3.2: adding or removing one record changes W by at most "
                     "(2n+1)/(n+1) < 2 for any symmetric predicate; r_j is public or chosen from earlier probes"))
    mech.append(Mechanism(
        name="fc_weight", query="soft-core total weight W at the chosen radius (PTR test)", distribution="gaussian",
        sensitivity=WEIGHT_SENSITIVITY, noise_multiplier=_nm(s["weight"]),
        argument="docs/friendlycore.md Corollary 3.2: |W(D') - W(D)| <= (2n+1)/(n+1) < 2"))
    mech.append(Mechanism(
        name="fc_mean", query="friendly weighted mean M = sum w x / W", distribution="gaussian",
        sensitivity=None, bound_multiple=MEAN_SENSITIVITY_MULTIPLE, noise_multiplier=_nm(s["mean"]),
        argument="docs/friendlycore.md Theorem 5.1: ||M(D') - M(D)|| <= 4 r / max(W, W') when max(W, W') >= 2; "
                 "the bound C = r / L with L = W^ - z sigma_W <= max(W, W') except with probability delta' "
                 "(Theorem 6.1, propose-test-release)"))
    if params.refine:
        k = params.clip_probes
        mech.append(Mechanism(
            name="fc_clip", query="number of records within a grid radius C_j of the friendly mean c1 "
                                  "(binary-search probe of the clip radius)",
            distribution="gaussian", sensitivity=COUNT_SENSITIVITY, integer=True, repetitions=max(k, 1),
            noise_multiplier=_nm(s["clip"] / max(k, 1)),
            argument="docs/friendlycore.md §13: for a centre c1 and a radius C_j that are functions of earlier "
                     "noisy outputs, adding or removing one record changes the count of records within C_j of "
                     "c1 by at most 1"))
        mech.append(Mechanism(
            name="fc_outside", query="number of records farther than the clip radius C from the friendly mean c1",
            distribution="gaussian", sensitivity=COUNT_SENSITIVITY, integer=True,
            noise_multiplier=_nm(s["outside"]),
            argument="docs/friendlycore.md §13: c1 and C are functions of earlier noisy outputs; adding or removing "
                     "one record changes the count of records beyond C by at most 1"))
        mech.append(Mechanism(
            name="fc_refine", query="sum over all records of (x - c1) clipped to norm C (refinement)",
            distribution="gaussian", sensitivity=None, bound_multiple=1.0, noise_multiplier=_nm(s["refine"]),
            argument="docs/friendlycore.md §13, Lemma 13.1: every clipped vector has norm at most C (c1 and C are "
                     "functions of earlier noisy outputs), and adding or removing a record adds or removes one "
                     "of them: the sum moves by at most C; C = the clip radius"))
    return Plan(tuple(mech), ptr_delta(params), PTR_ARGUMENT)


def ptr_delta(params: MeanParams | KMeansParams) -> float:
    """delta' of the release: the probability that its PTR test passes with L above the true weight. One test per
    release (the mean's, or the k-means centres'). A release charges (eps, delta_0 + ptr_delta(params)) with
    eps = epsilon of `plan.event()` at delta_0 (`Plan.guarantee`, docs §8)."""
    return float(params.delta_ptr)


@dataclass(frozen=True)
class MeanRelease:
    """What `friendly_mean` releases (all of it is DP output): mean is None for "no friendly core". With the
    refinement, `friendly` is the first-stage friendly mean c1, `clip_radius` the C of the clipped sum, `outside`
    the noisy count of records farther than C from c1 (pulled onto the ball by the clip)."""
    mean: np.ndarray | None
    radius: float
    noisy_weight: float
    weight_lower_bound: float
    noisy_count: float | None = None
    probes: tuple = field(default=())
    friendly: np.ndarray | None = None
    clip_radius: float | None = None
    clip_probes: tuple = field(default=())
    outside: float | None = None

    @property
    def released(self) -> bool:
        return self.mean is not None


def friendly_mean(X, params: MeanParams, measure: Measure, *, friends: FriendCounter | None = None) -> MeanRelease:
    """FriendlyCore averaging of the rows of X (n, d): no bound on the data or its mean is needed.

    measure : Measure over `mean_plan(params)` (or a plan with the same entry names, e.g. a conformance
              suite's `plan.scaled(...)`); every noisy value is drawn through it.
    friends : optional friend counter of X for the params' predicate (reuse across calls on the same X).
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError("X must be (n, d)")
    n = X.shape[0]
    plan = measure.plan
    if friends is None:
        friends = friend_counter(X, params.predicate, grid_q=params.grid_q) if n else None

    def weights(r):
        return soft_weights(friends.counts(r), n) if n else np.zeros(0)

    noisy_count, probes = None, ()
    if params.counted:
        # Sensitivity 1: adding or removing one record changes n by 1.
        noisy_count = float(measure("fc_count", np.array([float(n)]))[0])
    if params.grid is not None:
        # Each probe: W(r_j), sensitivity < 2 (Corollary 3.2), r_j public or a function of earlier noisy probes.
        r, probes = binary_search_radius(lambda rr: total_weight(weights(rr)), params.grid,
                                         search_threshold(params.target, noisy_count, plan["fc_radius"].scale),
                                         measure, "fc_radius")
        probes = tuple(probes)
    else:
        r = float(params.r)
    w = weights(r)
    W = total_weight(w)
    # Sensitivity of W < 2 (Corollary 3.2).
    noisy_weight = float(measure("fc_weight", np.array([W]))[0])
    sigma_w = plan["fc_weight"].scale
    L = float(ptr_lower_bound(noisy_weight, sigma_w, params.delta_ptr))
    if not L >= params.min_weight:
        return MeanRelease(None, r, noisy_weight, L, noisy_count, probes)
    M = weighted_mean(X, w)
    if M is None:  # W = 0 < 2 <= L: only on the PTR failure event (probability <= delta'), where anything goes
        return MeanRelease(None, r, noisy_weight, L, noisy_count, probes)
    # Sensitivity 4 r / max(W, W') <= 4 r / L on the PTR event (Theorem 5.1, Theorem 6.1); L >= 2 ensures W > 0.
    noisy = np.asarray(measure("fc_mean", M, bound=r / L), dtype=np.float64)
    if not params.refine:
        return MeanRelease(noisy, r, noisy_weight, L, noisy_count, probes)
    hi = 2.0 * r + plan["fc_mean"].scale_for(r / L) * (math.sqrt(X.shape[1]) + 4.0)
    threshold = search_threshold(params.clip_target, noisy_count, plan["fc_clip"].scale)
    C, clip_probes, outside, refined = refine_mean(X, noisy, clip_radii(hi, params), threshold, max(noisy_count, L),
                                                   measure)
    return MeanRelease(refined, r, noisy_weight, L, noisy_count, probes, noisy, C, tuple(clip_probes), outside)


# --------------------------------------------------------------------------------------------------------------
# Refinement inside the located ball (§13, ours)
# --------------------------------------------------------------------------------------------------------------
def clip_radii(hi: float, params: MeanParams) -> np.ndarray:
    """The clip grid hi / clip_span * clip_ratio^j, j = 0..J-1, J = floor(log(clip_span) / log(clip_ratio)) + 1:
    its size (hence the number of probes) is public, its scale hi a function of released values (§13)."""
    J = math.floor(math.log(params.clip_span) / math.log(params.clip_ratio) + 1e-9) + 1
    return (hi / params.clip_span) * params.clip_ratio ** np.arange(J)


def distances_to(X: np.ndarray, c: np.ndarray) -> np.ndarray:
    """||x - c|| per row, scaled by the row's largest |coordinate| so that nothing overflows; a row whose
    difference is not finite (|x| near the largest double) gets +inf."""
    V = np.asarray(X, dtype=np.float64) - c
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s = np.max(np.abs(V), axis=1) if V.shape[1] else np.zeros(V.shape[0])
        scaled = np.where(s[:, None] > 0, V / np.where(s > 0, s, 1.0)[:, None], 0.0)
        out = s * np.sqrt(np.einsum("ij,ij->i", scaled, scaled))
    return np.where(np.isfinite(out), out, np.inf)


def clipped_sum(X: np.ndarray, c: np.ndarray, C: float) -> np.ndarray:
    """sum over rows of phi_C(x - c), phi_C(v) = v min(1, C (1 - 1e-9) / ||v||) (Lemma 13.1): every term has
    norm <= C, the 1e-9 covering the rounding of the norm and of the product (§13); a row whose difference is not
    finite contributes 0 (also of norm <= C)."""
    V = np.asarray(X, dtype=np.float64) - c
    norms = distances_to(X, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(norms > 0, np.minimum(1.0, C * (1.0 - 1e-9) / norms), 1.0)
    f[~np.isfinite(norms)] = 0.0
    V[~np.isfinite(norms)] = 0.0
    return (f[:, None] * V).sum(axis=0)


def refine_mean(X, c1: np.ndarray, radii: np.ndarray, threshold: float, divisor: float, measure: Measure):
    """§13: C = the smallest radius of `radii` whose noisy count of rows within it of c1 reaches `threshold` (the
    largest if none; a binary search, one `fc_clip` draw per probe), the noisy count of rows beyond C (`fc_outside`),
    then c1 + (noisy clipped sum) / divisor. Returns (C, [(C_j, noisy count), ...], noisy count beyond C, refined
    mean)."""
    d = distances_to(X, c1)
    lo, hi = 0, radii.size - 1
    probes = []
    while lo < hi:
        mid = (lo + hi) // 2
        # Sensitivity 1: one record is within C_j of c1 or not (c1, C_j: earlier outputs and public values).
        noisy = float(measure("fc_clip", np.array([float(np.count_nonzero(d <= radii[mid]))]))[0])
        probes.append((float(radii[mid]), noisy))
        if noisy >= threshold:
            hi = mid
        else:
            lo = mid + 1
    C = float(radii[lo])
    # Sensitivity 1: one record is beyond C of c1 or not (c1, C: earlier outputs and public values).
    outside = float(measure("fc_outside", np.array([float(np.count_nonzero(~(d <= C)))]))[0])
    # Sensitivity C: every clipped term has norm <= C, one record adds or removes one term (Lemma 13.1).
    S = np.asarray(measure("fc_refine", clipped_sum(X, c1, C), bound=C), dtype=np.float64)
    return C, probes, outside, c1 + S / divisor


# --------------------------------------------------------------------------------------------------------------
# k-means by k-tuple aggregation (§9)
# --------------------------------------------------------------------------------------------------------------
class TupleFriends:
    """The k-tuple predicate (§9.3) on tuples (m, k, d) (a tuple with a non-finite value has no friends):

        f_r(T, Z) = sep(T) > 6r  and  sep(Z) > 6r  and  pi = nearest-centre map T -> Z is a bijection
                    and  sum_i ||t_i - z_pi(i)||^2 <= r^2,

    sep(T) = min_{i != j} ||t_i - t_j|| (inf for k = 1). Floating point (§12): squared distances by
    `sq_dist_pairs`, the k mate distances summed in sorted order (so f_r(T, Z) == f_r(Z, T) bit for bit),
    thresholds r^2 (1 - 1e-9) and 36 r^2 (1 + 1e-9). With the separations, the nearest-centre map is the only
    matching within r, so f_r is "some matching within r in Frobenius norm".

    `proxy_counts` drops the separation condition: a predicate that is monotone in r, used only to choose r
    (any pair predicate gives |dW| < 3 under replacement, Lemma 9.2).
    """

    def __init__(self, tuples, *, cache_bytes: int = 64 << 20, block_bytes: int = 32 << 20):
        T = np.asarray(tuples, dtype=np.float64)
        if T.ndim != 3:
            raise ValueError("tuples must be (m, k, d)")
        self.n, self.k, self.d = T.shape
        self._T = T
        self.valid = np.all(np.isfinite(T), axis=(1, 2))
        sep = np.full(self.n, np.inf)
        for i in range(self.k):
            for j in range(i + 1, self.k):
                sep = np.minimum(sep, sq_dist_pairs(T[:, i], T[:, j]))
        sep[~self.valid] = np.nan
        self.sep_sq = sep
        self._rows = max(1, int(block_bytes // (8 * max(self.n, 1) * self.k * self.k * 3)))
        self._cost = self._cost_rows(0, self.n) if self.n * self.n * 8 <= cache_bytes else None

    def _cost_rows(self, a0, a1):
        out = np.empty((a1 - a0, self.n))
        T = self._T
        for b0 in range(a0, a1, self._rows):
            b1 = min(a1, b0 + self._rows)
            D = sq_dist_pairs(T[b0:b1, None, :, None, :], T[None, :, None, :, :])  # (b, m, k, k)
            nn = np.argmin(D, axis=-1)
            mate = np.take_along_axis(D, nn[..., None], axis=-1)[..., 0]
            bij = np.all(np.sort(nn, axis=-1) == np.arange(self.k), axis=-1)
            mate = np.sort(mate, axis=-1)
            cost = np.zeros(mate.shape[:-1])
            for i in range(self.k):
                cost += mate[..., i]
            cost[~bij] = np.inf
            cost[~self.valid[b0:b1]] = np.inf
            cost[:, ~self.valid] = np.inf
            out[b0 - a0:b1 - a0] = cost
        return out

    def _count(self, r, separated):
        r = check_radius(r)
        t = r * r * _SHRINK
        ok = self.valid.copy()
        if separated:
            s = SEPARATION_FACTOR * float(r)
            ok &= self.sep_sq > s * s * (1.0 + 1e-9)
        out = np.zeros(self.n, dtype=np.int64)
        step = self.n if self._cost is not None else max(1, self._rows)
        for a0 in range(0, self.n, step):
            a1 = min(self.n, a0 + step)
            C = self._cost[a0:a1] if self._cost is not None else self._cost_rows(a0, a1)
            F = _within(C, t) & ok[None, :] & ok[a0:a1, None]
            out[a0:a1] = F.sum(axis=1)
        return out

    def counts(self, r: float) -> np.ndarray:
        return self._count(r, separated=True)

    def proxy_counts(self, r: float) -> np.ndarray:
        return self._count(r, separated=False)


def align_tuples(tuples: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Relabel every tuple's centres by the nearest centre of `reference` (the bucketing of §9.4). Raises if the
    labelling of some tuple is not a bijection (impossible for core tuples, Lemma 9.5)."""
    T = np.asarray(tuples, dtype=np.float64)
    R = np.asarray(reference, dtype=np.float64)
    k = R.shape[0]
    lab = np.argmin(sq_dist_pairs(T[:, :, None, :], R[None, None, :, :]), axis=-1)  # (s, k)
    if not np.all(np.sort(lab, axis=-1) == np.arange(k)):
        raise RuntimeError("a core tuple's bucketing is not a bijection: Lemma 9.5 violated (bug)")
    out = np.empty_like(T)
    np.put_along_axis(out, lab[..., None], T, axis=1)
    return out


def _sq_dists(P, C):
    """(m, s, k) squared distances of padded points P (m, s, d) to centres C (m, k, d) (coordinate order)."""
    return sq_dist_pairs(P[:, :, None, :], C[:, None, :, :])


def _seq_sum(A, axis):
    """Sum along `axis` in index order (cumsum): a subset's value then does not depend on how far it is padded
    (the padding adds exact zeros), unlike pairwise summation whose blocking depends on the length (§9.1)."""
    return np.cumsum(A, axis=axis).take(-1, axis=axis) if A.shape[axis] else np.sum(A, axis=axis)


def _nearest(D2):
    """argmin over the last axis (ties to the lowest index) by elementwise comparisons, one centre at a time:
    np.argmin branches on the values, and its time follows how predictable the labels are (on 10,000 points
    with one far record added, 108 instead of 136 us per pass)."""
    best, lab = D2[..., 0].copy(), np.zeros(D2.shape[:-1], dtype=np.int64)
    for j in range(1, D2.shape[-1]):
        closer = D2[..., j] < best
        lab += closer * (j - lab)
        np.minimum(best, D2[..., j], out=best)
    return lab


#: Points per block of `_cluster_sums`: a fixed number, so that a subset's sums do not depend on the batch.
SUM_BLOCK = 4096


def _cluster_sums(P, lab, mask, k):
    """Per subset and centre, the count (m, k) and coordinate sums (m, k, d) of its points, summed in index order
    block by block (blocks at fixed offsets: padding adds exact zeros at the end, so a subset's sums do not
    depend on its padding or on the other subsets, §9.1). Dense and branch-free: np.bincount, adding point by
    point into the label's slot, was slower where consecutive points share a label (one far record turning a
    subset's centres into 1 + 2 clusters made a run 2 % slower)."""
    m, s, d = P.shape
    cnt, sums = np.zeros((m, k)), np.zeros((m, k, d))
    Pt = P.transpose(0, 2, 1)                                                 # (m, d, s): blocks along the last axis
    for i in range(0, s, SUM_BLOCK):
        onehot = ((lab[:, None, i:i + SUM_BLOCK] == np.arange(k)[:, None]) & mask[:, None, i:i + SUM_BLOCK])
        onehot = onehot.astype(np.float64)                                    # (m, k, b)
        cnt += onehot.sum(axis=-1)                                            # integers: exact
        sums += _seq_sum(onehot[:, :, None, :] * Pt[:, None, :, i:i + SUM_BLOCK], -1)
    return cnt, sums


def _kmeanspp(P, mask, sizes, k, rng):
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; 2 + ln k candidates per step, as scikit-learn),
    batched over the subsets; every subset uses only its own row of each random draw."""
    m, _s, d = P.shape
    ar = np.arange(m)
    n_local = 2 + int(np.log(k))
    C = np.empty((m, k, d))
    first = np.minimum((rng.random(m) * sizes).astype(np.int64), sizes - 1)
    C[:, 0] = P[ar, first]
    D2 = sq_dist_pairs(P, C[:, None, 0]) * mask
    for c in range(1, k):
        cs = np.cumsum(D2, axis=1)
        tot = cs[:, -1]
        u = rng.random((m, n_local)) * tot[:, None]
        idx = (cs[:, None, :] < u[:, :, None]).sum(axis=-1)
        uniform = np.minimum((rng.random((m, n_local)) * sizes[:, None]).astype(np.int64), sizes[:, None] - 1)
        idx = np.where(tot[:, None] > 0, np.minimum(idx, sizes[:, None] - 1), uniform)
        cand = P[ar[:, None], idx]                                        # (m, L, d)
        newD2 = np.minimum(D2[:, None, :], sq_dist_pairs(P[:, None, :, :], cand[:, :, None, :])) * mask[:, None, :]
        best = np.argmin(_seq_sum(newD2, -1), axis=1)
        C[:, c] = cand[ar, best]
        D2 = newD2[ar, best]
    return C


#: Lloyd passes per k-means++ start in every subset: always all of them, never "until the labels settle". The
#: subsets hold raw records and the stage's running time is published: stopping when settled let the running
#: time alone tell whether a far record was there (advantage 0.31 to 0.61 of a threshold on the time over runs
#: of tests/benchmarks/timing_channel.py, at m = 2 subsets of 10,000 points, where eps-DP at eps 1 allows 0.46
#: to any test on the output; shipped 0.01 [-0.13, 0.14]). A settled subset is a fixed point of further passes, so
#: subsets that settle within LLOYD_PASSES get the centres a stop would give (same cost ratio on the
#: friendlycore_kmeans benchmark, whose subsets settle within 10; 1.5x its time at n = 200,000).
LLOYD_PASSES = 20


def _batched_kmeans(P, mask, k, rng, restarts, max_iter):
    """k-means++ + exactly max_iter Lloyd passes on every subset at once; best of `restarts` by cost. Returns
    (centres (m,k,d), cost). Each subset's result is bitwise the same as if it were run alone (sequential sums),
    so it depends only on its own points and random draws (§9.1)."""
    m, _s, d = P.shape
    sizes = mask.sum(axis=1)
    best_C = np.full((m, k, d), np.nan)
    best_cost = np.full(m, np.inf)
    for _ in range(restarts):
        C = _kmeanspp(P, mask, sizes, k, rng)
        for _ in range(max_iter):
            lab = _nearest(_sq_dists(P, C))
            cnt, sums = _cluster_sums(P, lab, mask, k)
            C = np.where(cnt[..., None] > 0, sums / np.maximum(cnt, 1.0)[..., None], C)
        cost = _seq_sum(np.where(mask, _sq_dists(P, C).min(axis=-1), 0.0), 1)
        better = cost < best_cost
        best_C[better], best_cost[better] = C[better], cost[better]
    return best_C, best_cost


def subset_tuples(X, k: int, subsets: int, rng: np.random.Generator, *, restarts: int = 3,
                  max_iter: int = LLOYD_PASSES) -> np.ndarray:
    """Non-private part of friendly k-means: each record goes to one of `subsets` subsets by an independent coin
    from `rng` (independent of the data, not published, §9.1), and k-means++ with Lloyd (best of `restarts`)
    runs on every subset. Returns the tuples (m, k, d); a subset with fewer than k points gives a NaN tuple
    (which has no friends).

    Every subset's k-means++ draws from a generator of its own, spawned from `rng` (not from its stream): a
    subset's tuple is then a function of its own records and its own randomness only, so adding a record
    changes one tuple for every fixed draw of the randomness (the coupling of Lemma 9.1). A shared stream
    would not do: how much of it the other subsets consume depends on their contents. The subsets run in
    padded batches (of at most BATCH_FLOATS), which change no bit of any tuple (tests/test_friendlycore.py)."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    coins = rng.integers(0, subsets, size=n)
    streams = rng.spawn(subsets)
    order = np.argsort(coins, kind="stable")
    sizes = np.bincount(coins, minlength=subsets)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out = np.full((subsets, k, d), np.nan)
    run = np.nonzero(sizes >= k)[0]
    width = int(sizes.max()) if n else 0
    # Subsets batched by the public shapes only; within a batch, padding and the other subsets change no bit of
    # a subset's tuple (`_batched_kmeans`), and each draws from its own stream as if run alone (`_RowStreams`).
    per_batch = max(1, BATCH_FLOATS // max(1, width * k * max(d, 1)))
    for b in range(0, run.size, per_batch):
        group = run[b:b + per_batch]
        P, mask = np.zeros((group.size, width, d)), np.arange(width)[None, :] < sizes[group][:, None]
        for row, g in enumerate(group):
            P[row, :sizes[g]] = X[order[starts[g]:starts[g + 1]]]
        out[group] = _batched_kmeans(P, mask, k, _RowStreams([streams[g] for g in group]), restarts, max_iter)[0]
    return out


#: Floats of the largest array a batch of subsets makes (points x centres x coordinates): 512 kB, which stays in
#: the cache (at n = 200,000, k = 8, m = 624: 3.1 s for all subsets against 5.2 s with 128 MB batches).
BATCH_FLOATS = 1 << 16


class _RowStreams:
    """Draws of shape (m, ...) whose row g comes from stream g, in the order and amount a run of subset g alone
    would draw: a subset's k-means++ then depends on its own stream only, however it is batched (Lemma 9.1's
    coupling needs a subset's tuple to be a function of its own records and its own randomness)."""

    def __init__(self, streams):
        self.streams = streams

    def random(self, shape):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return np.stack([s.random(shape[1:]) for s in self.streams])


_KM_SPLIT_GRID = {"radius": 0.10, "weight": 0.10, "centres": 0.80}
_KM_SPLIT_FIXED = {"weight": 0.10, "centres": 0.90}


@dataclass(frozen=True)
class KMeansParams:
    """Public parameters of friendly k-means.

    k, subsets  number of centres and of subsets m (even: Lemma 9.2). Choose m from PUBLIC knowledge of the
                data size (e.g. ~ n / (k * 40)): the subsets should each hold enough points per cluster for
                k-means++ to find the clusters.
    rho, r, grid, delta_ptr, split, target, min_weight  as in MeanParams (split keys radius/weight/centres);
                target is a fraction of m (public); min_weight >= 3 (Theorem 9.6).
    restarts, max_iter  the non-private k-means++ per subset.
    """
    rho: float
    k: int
    subsets: int
    r: float | None = None
    grid: RadiusGrid | None = None
    delta_ptr: float = 1e-8
    split: dict | None = None
    target: float = 0.6
    min_weight: float = 3.0
    restarts: int = 3
    max_iter: int = LLOYD_PASSES

    def __post_init__(self):
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError("rho must be positive")
        if self.k < 1:
            raise ValueError("k must be >= 1")
        if self.subsets < 2 or self.subsets % 2:
            raise ValueError("the number of subsets must be even and >= 2 (Lemma 9.2)")
        if (self.r is None) == (self.grid is None):
            raise ValueError("give exactly one of a public radius r and a radius grid")
        if self.r is not None:
            check_radius(self.r)
        if self.min_weight < TUPLE_WEIGHT_SENSITIVITY:
            raise ValueError("min_weight must be >= 3 (Theorem 9.6)")
        if not 0 < self.target <= 1:
            raise ValueError("target must be in (0, 1]")
        gaussian_tail_z(self.delta_ptr)
        s = self.budget_split()
        if any(v <= 0 for v in s.values()) or abs(sum(s.values()) - 1) > 1e-9:
            raise ValueError(f"split fractions must be positive and sum to 1, got {s}")

    def budget_split(self) -> dict:
        default = _KM_SPLIT_GRID if self.grid is not None else _KM_SPLIT_FIXED
        s = dict(self.split or default)
        if set(s) != set(default):
            raise ValueError(f"split keys must be {sorted(default)}, got {sorted(s)}")
        return s


def kmeans_plan(params: KMeansParams) -> Plan:
    """The plan of `friendly_kmeans`, its extra delta the PTR delta' (Theorem 9.6)."""
    s = {key: v * params.rho for key, v in params.budget_split().items()}
    why = ("adding or removing one record changes one subset (coins are independent of the data), hence "
           "replaces one of the m tuples: ")
    mech = []
    if params.grid is not None:
        mech.append(Mechanism(
            name="fck_radius", query="tuple soft-core weight W(r_j) of the proxy predicate (binary-search probe)",
            distribution="gaussian", sensitivity=TUPLE_WEIGHT_SENSITIVITY, repetitions=max(params.grid.probes, 1),
            noise_multiplier=_nm(s["radius"] / max(params.grid.probes, 1)),
            argument=why + "docs/friendlycore.md Lemma 9.2, |W(D'') - W(D)| <= 2(m-1)/m + 1 < 3 under "
                           "replacement, for any pair predicate"))
    mech.append(Mechanism(
        name="fck_weight", query="tuple soft-core total weight W at the chosen radius (PTR test)",
        distribution="gaussian", sensitivity=TUPLE_WEIGHT_SENSITIVITY, noise_multiplier=_nm(s["weight"]),
        argument=why + "docs/friendlycore.md Lemma 9.2, |dW| < 3"))
    mech.append(Mechanism(
        name="fck_centres", query="friendly weighted mean of the core tuples aligned by nearest reference centre "
                                  "(k bucket averages, one vector in R^{k d})",
        distribution="gaussian", sensitivity=None, bound_multiple=TUPLE_MEAN_SENSITIVITY_MULTIPLE,
        noise_multiplier=_nm(s["centres"]),
        argument=why + "docs/friendlycore.md Theorem 9.3 with Lemma 9.5 (consistent matchings, m even): "
                       "||dM|| < 8 r / max(W, W''); C = r / L, L <= max(W, W'') except with probability delta' "
                       "(Theorem 9.6)"))
    return Plan(tuple(mech), ptr_delta(params), PTR_ARGUMENT)


@dataclass(frozen=True)
class KMeansRelease:
    """What `friendly_kmeans` releases (DP output): centres (k, d) sorted lexicographically (the released object
    is the SET of centres, §9.4), or None for "no friendly core"."""
    centres: np.ndarray | None
    radius: float
    noisy_weight: float
    weight_lower_bound: float
    probes: tuple = field(default=())

    @property
    def released(self) -> bool:
        return self.centres is not None


def friendly_kmeans_from_tuples(tuples, params: KMeansParams, measure: Measure, *,
                                friends: TupleFriends | None = None) -> KMeansRelease:
    """The private part of friendly k-means on the m subset tuples (m, k, d) (see `friendly_kmeans`)."""
    T = np.asarray(tuples, dtype=np.float64)
    m, k, d = T.shape
    if m != params.subsets or k != params.k:
        raise ValueError(f"expected {params.subsets} tuples of {params.k} centres, got {T.shape}")
    plan = measure.plan
    friends = friends or TupleFriends(T)
    probes = ()
    if params.grid is not None:
        # Each probe: W of the proxy predicate at r_j, sensitivity < 3 under tuple replacement (Lemma 9.2).
        r, probes = binary_search_radius(lambda rr: total_weight(soft_weights(friends.proxy_counts(rr), m)),
                                         params.grid, params.target * m, measure, "fck_radius")
        probes = tuple(probes)
    else:
        r = float(params.r)
    w = soft_weights(friends.counts(r), m)
    W = total_weight(w)
    # Sensitivity of W < 3 under tuple replacement (Lemma 9.2).
    noisy_weight = float(measure("fck_weight", np.array([W]))[0])
    L = float(ptr_lower_bound(noisy_weight, plan["fck_weight"].scale, params.delta_ptr))
    if not L >= params.min_weight or not W > 0:  # W = 0 with L >= 3 happens only on the PTR failure event
        return KMeansRelease(None, r, noisy_weight, L, probes)
    core = np.nonzero(w > 0)[0]
    reference = T[core[np.argmax(w[core])]]
    aligned = align_tuples(T[core], reference).reshape(core.size, k * d)
    M = weighted_mean(aligned, w[core]).reshape(k, d)
    # Sensitivity 8 r / max(W, W'') <= 8 r / L on the PTR event (Theorem 9.3, Theorem 9.6).
    noisy = np.asarray(measure("fck_centres", M, bound=r / L), dtype=np.float64).reshape(k, d)
    noisy = noisy[np.lexsort(noisy.T[::-1])]
    return KMeansRelease(noisy, r, noisy_weight, L, probes)


def friendly_kmeans(X, params: KMeansParams, measure: Measure, rng: np.random.Generator) -> KMeansRelease:
    """Friendly k-means of the rows of X (n, d): no domain bound needed.

    measure : Measure over `kmeans_plan(params)`.
    rng     : public randomness for the subset coins and the k-means++ seeds; in production seed it from the
              OS and do not publish it (§9.1: the guarantee is over these coins).
    """
    tuples = subset_tuples(X, params.k, params.subsets, rng, restarts=params.restarts, max_iter=params.max_iter)
    return friendly_kmeans_from_tuples(tuples, params, measure)
