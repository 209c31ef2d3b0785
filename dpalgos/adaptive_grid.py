"""Adaptive grids for 2-D counts, after Qardaji, Yang & Li, "Differentially private grids for geospatial data",
ICDE 2013 (AG), with HDMM's Kronecker strategy on the coarse level: a coarse m1 x m1 grid whose side a public rule
sets from the number of points and epsilon, measured through the Kronecker product of HDMM's per-axis p-Identity
strategies (McKenna et al. VLDB 2018); each coarse cell cut into m2 x m2 leaves by its estimated count and the
leaves measured; both levels reconciled by generalised least squares; every leaf's count shared among its cells
as its neighbours lean (`smooth`). Where the map is dense for its epsilon the release measures the whole grid
instead (`dense`).

The paper's equations, as named here:
  Guideline 1 (UG)   m = sqrt(N epsilon / c), c = 10: the side balancing a query's noise against the
                     non-uniformity of the cells it cuts; a grid finer than the cells themselves means the map
                     is dense for its epsilon (`dense`).
  AG level 1         m1 = sqrt(N epsilon / c) / 4. Ours: rounded up to a power of two between MIN_COARSE and the
                     cells, so that coarse cells are equal blocks and HDMM's shipped strategies apply.
  AG level 2         m2 = ceil(sqrt(N' (1 - alpha) epsilon / (c / 2))) for a coarse cell of estimated count N'.
                     Ours (`leaf_sides`): the nearest integer to the root, rounded up only at a peak of the coarse
                     estimates (`peaks`), where the points inside are less even than the guideline's c assumes.
  inference          AG averages a coarse cell's noisy count with its leaves' sum. Ours: the coarse level is the
                     Kronecker strategy's answers y1 = A S x + noise (S sums leaves into coarse cells), the leaves
                     u = x + noise; x^ = argmin w1 ||A S x - y1||^2 + w2 ||x - u||^2 (w = 1 / variance), the
                     generalised least squares over both levels, linear in the noise (`leaves_gls`).
  evenness           Ours (`flatten_even`): a coarse cell whose leaves spread about their even share no more than
                     their noise explains gets that even share (the coarse cell's estimate, spread evenly).
  spreading          AG spreads a leaf's count evenly over its cells. Ours (`smooth`): in proportion to a 3 x 3
                     box average of the estimate, repeated; every leaf keeps its least-squares total.

Counts are in units of the privacy unit's weight (`unit`): the rules read counts / unit, whose noise is 1 / epsilon.
All of it reads the grid's public size and noisy values only, except `aggregate` over a partition the public
parameters and earlier noisy values fixed (the plan's sensitivity argument: a point falls in one coarse cell and in
one leaf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import convolve, uniform_filter
from scipy.sparse.linalg import LinearOperator, cg

#: Qardaji et al.'s constant c (their Guideline 1 and experiments): AG's leaves; the coarse level's is the caller's.
C = 10.0
#: The least coarse side (ours: AG's 10, as a power of two).
MIN_COARSE = 8
#: The conjugate gradients' relative tolerance and step limit for `leaves_gls` (a few dozen steps in practice).
GLS_TOLERANCE, GLS_STEPS = 1e-10, 1000
#: `smooth`'s box side (cells) and passes (measured on tests/benchmarks/spatial_peers.py's corpus: 3 and 8; 5 and
#: 9 cells, or one pass, were worse).
SMOOTH_SIDE, SMOOTH_PASSES = 3, 8
#: `peaks` (ours): a coarse cell whose estimate is above PEAK times its neighbours' mean. `flatten_even` (ours): a
#: coarse cell of at least EVEN_LEAVES leaves is even where its leaves' spread about their even share is below what
#: their noise gives plus EVEN_MARGIN standard deviations (with fewer leaves the spread is too noisy to tell). Both
#: measured on tests/benchmarks/spatial_peers.py's corpus, seeds 0-3, and checked on seeds 4-7
#: (docs/explanation/grid.md): PEAK 2 (1.5 worse, 3 alike); 16 leaves (4 and 9 flattened real structure on the
#: taxi-like map); 1 deviation (0.5 alike, 2 and 3 flattened clustered maps).
PEAK = 2.0
EVEN_LEAVES, EVEN_MARGIN = 16, 1.0


def guideline(points: float, epsilon: float, unit: float = 1.0, c: float = C) -> float:
    """Qardaji et al.'s uniform grid side sqrt(N epsilon / c), N in units of the privacy unit's weight."""
    return math.sqrt(max(points / unit, 0.0) * epsilon / c)


def dense(points: float, epsilon: float, cells: int, unit: float = 1.0, c: float = C) -> bool:
    """The map is dense for its epsilon: the guideline's grid is at least as fine as the cells."""
    return guideline(points, epsilon, unit, c) >= cells


def coarse_side(points: float, epsilon: float, cells: int, unit: float = 1.0, c: float = C) -> int:
    """m1: AG's level-1 side rounded up to a power of two, between MIN_COARSE and `cells`."""
    want = max(guideline(points, epsilon, unit, c) / 4.0, 1.0)
    return int(min(cells, max(MIN_COARSE, 2 ** math.ceil(math.log2(want)))))


def leaf_sides(coarse: np.ndarray, epsilon_leaves: float, unit: float = 1.0) -> np.ndarray:
    """m2 per coarse cell (`coarse`: the m1 x m1 estimates, row-major, a negative estimate as 0), at least 1: AG's
    root sqrt(N' epsilon_leaves / (c / 2)) to the nearest integer, rounded up at a peak (`peaks`). AG rounds every
    root up; the nearest side is the closer to the balance its guideline strikes, except where the points are
    concentrated, which the guideline's c (a typical unevenness) understates."""
    counts = np.maximum(np.asarray(coarse, dtype=np.float64).ravel() / unit, 0.0)
    root = np.sqrt(counts * epsilon_leaves / (C / 2))
    m1 = math.isqrt(counts.size)
    sides = np.where(peaks(counts.reshape(m1, m1)).ravel(), np.ceil(root), np.rint(root))
    return sides.astype(np.int64).clip(min=1)


def peaks(coarse: np.ndarray) -> np.ndarray:
    """Ours: whether each cell of a (m1, m1) grid of non-negative estimates is above PEAK times the mean of its
    neighbours (the up to eight around it inside the grid)."""
    around = np.ones((3, 3))
    around[1, 1] = 0.0
    total = convolve(coarse, around, mode="constant")
    neighbours = convolve(np.ones_like(coarse), around, mode="constant")
    return coarse > PEAK * total / neighbours


@dataclass(frozen=True)
class Partition:
    """Leaves over a cells x cells grid: `leaf` (cells, cells) the leaf of every cell, `parent` each leaf's coarse
    cell (row-major in the m1 x m1 grid), and each leaf's cell ranges [x_first, x_end) x [y_first, y_end)."""
    leaf: np.ndarray
    parent: np.ndarray
    x_first: np.ndarray
    x_end: np.ndarray
    y_first: np.ndarray
    y_end: np.ndarray

    @property
    def size(self) -> int:
        return self.parent.size

    def sizes(self) -> np.ndarray:
        """Cells per leaf."""
        return (self.x_end - self.x_first) * (self.y_end - self.y_first)


def coarse_of(cells: int, m1: int) -> np.ndarray:
    """The coarse cell (row-major, m1 x m1) of every cell: equal blocks of cells / m1 cells per axis."""
    p = np.arange(cells) // (cells // m1)
    return p[:, None] * m1 + p[None, :]


def partition(cells: int, m1: int, m2: np.ndarray) -> Partition:
    """AG's leaves: coarse cell j (a block of b = cells / m1 cells per axis) cut into min(m2_j, b) parts per axis
    of floor or ceil(b / parts) cells, numbered coarse cell by coarse cell, row-major inside one."""
    b = cells // m1
    k = np.minimum(m2, b)                                  # parts per axis of each coarse cell
    offset = np.arange(cells) % b
    block = np.arange(cells) // b
    c = block[:, None] * m1 + block[None, :]
    lx, ly = (offset[:, None] * k[c]) // b, (offset[None, :] * k[c]) // b
    first = np.concatenate([[0], np.cumsum(k * k)[:-1]])
    leaf = first[c] + lx * k[c] + ly
    parent = np.repeat(np.arange(m1 * m1), k * k)
    inner = np.arange(parent.size) - first[parent]         # a leaf's index inside its coarse cell
    ix, iy = np.divmod(inner, k[parent])
    cx, cy = np.divmod(parent, m1)
    edge = lambda i: (i * b + k[parent] - 1) // k[parent]  # first offset t with t k // b == i
    return Partition(leaf, parent, cx * b + edge(ix), cx * b + edge(ix + 1), cy * b + edge(iy),
                     cy * b + edge(iy + 1))


def aggregate(grid: np.ndarray, labels: np.ndarray, size: int) -> np.ndarray:
    """The sums of the grid's cells per label (0..size-1); integer counts stay integers (exact below 2^53)."""
    values = np.asarray(grid).ravel()
    sums = np.bincount(labels.ravel(), weights=values.astype(np.float64), minlength=size)
    return np.rint(sums).astype(np.int64) if np.issubdtype(values.dtype, np.integer) else sums


def leaves_gls(strategy, coarse_answers: np.ndarray, var_coarse: float, leaves: np.ndarray, var_leaves: float,
               part: Partition) -> np.ndarray:
    """x^ = argmin ||A S x - y1||^2 / var_coarse + ||x - u||^2 / var_leaves: the normal equations
    (w1 S'A'A S + w2 I) x = w1 S'A'y1 + w2 u by conjugate gradients (the matrix is symmetric positive definite),
    A'A applied axis by axis (A'A = x_k A_k'A_k) and A'y1 as (A'A) times the strategy's least squares of y1; started
    from AG's inference (the leaves shifted to sum to the coarse least squares). Linear in y1 and u."""
    m1 = strategy.shape[0]
    k, coarse = m1 * m1, strategy.least_squares(coarse_answers).ravel()
    grams = [_gram(f) for f in strategy.factors]
    w1, w2 = 1.0 / var_coarse, 1.0 / var_leaves
    S = lambda x: np.bincount(part.parent, weights=x, minlength=k).reshape(m1, m1)
    AtA = lambda X: (grams[0] @ X @ grams[1].T).ravel()
    operator = LinearOperator((part.size, part.size), dtype=np.float64,
                              matvec=lambda x: w1 * AtA(S(x))[part.parent] + w2 * x)
    rhs = w1 * AtA(coarse.reshape(m1, m1))[part.parent] + w2 * leaves
    start = leaves + ((coarse - S(leaves).ravel()) / np.bincount(part.parent, minlength=k))[part.parent]
    x, info = cg(operator, rhs, x0=start, rtol=GLS_TOLERANCE, maxiter=GLS_STEPS)
    if info != 0:
        raise RuntimeError("the adaptive grid's least squares did not converge")
    return x


def _gram(factor) -> np.ndarray:
    """A_k'A_k of a p-Identity factor A_k = [I; B] D: D (I + B'B) D."""
    d = 1.0 / factor.s
    return d[:, None] * (np.eye(factor.n) + factor.B.T @ factor.B) * d[None, :]


def flatten_even(leaves: np.ndarray, part: Partition, var_leaves: float) -> np.ndarray:
    """Ours: the leaves of every coarse cell of p >= EVEN_LEAVES leaves replaced by their even share (the cell's
    total in proportion to the leaves' cells) where their spread about it, sum_j (x_j - even_j)^2, is below
    (p - 1) var_leaves (1 + EVEN_MARGIN sqrt(2 / (p - 1))): what the leaves' noise alone gives, plus EVEN_MARGIN of
    its standard deviation under Gaussian noise of that variance (a rule, not a test at a stated level: the leaves'
    noise is Laplace, whose squares spread more, and the least squares shrink it a little). Where the points are
    even inside a coarse cell the leaves add noise and nothing else; the cell's estimate, spread evenly, is then the
    better one. Every coarse cell keeps its total. Reads the leaves' estimates and their public variance only:
    post-processing."""
    sizes = part.sizes()
    leaves_in = np.bincount(part.parent)
    share = np.bincount(part.parent, weights=leaves) / np.bincount(part.parent, weights=sizes)
    even = share[part.parent] * sizes
    spread = np.bincount(part.parent, weights=(leaves - even) ** 2)
    dof = np.maximum(leaves_in - 1, 1)
    flat = (leaves_in >= EVEN_LEAVES) & (spread < dof * var_leaves * (1.0 + EVEN_MARGIN * np.sqrt(2.0 / dof)))
    return np.where(flat[part.parent], even, leaves)


def spread(leaves: np.ndarray, part: Partition) -> np.ndarray:
    """Every leaf's value shared evenly among its cells: the (cells, cells) grid."""
    return (leaves / part.sizes())[part.leaf]


def smooth(leaves: np.ndarray, part: Partition) -> np.ndarray:
    """Ours: every leaf's value shared among its cells in proportion to the SMOOTH_SIDE x SMOOTH_SIDE box average of
    the current grid's non-negative part, SMOOTH_PASSES times from the even spread: the mass inside a leaf leans
    towards its neighbours' while every leaf keeps its total (so every sum of whole leaves is unchanged). A leaf
    whose weights are all zero stays even (the tiny floor). Reads the leaves' estimates only: post-processing."""
    grid = spread(leaves, part)
    for _ in range(SMOOTH_PASSES):
        weight = uniform_filter(np.maximum(grid, 0.0), size=SMOOTH_SIDE, mode="nearest") + 1e-12
        total = np.bincount(part.leaf.ravel(), weights=weight.ravel(), minlength=part.size)
        grid = weight * (leaves / total)[part.leaf]
    return grid
