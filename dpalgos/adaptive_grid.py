"""Adaptive grids for 2-D counts (Qardaji, Yang & Li, "Differentially private grids for geospatial data", ICDE
2013, AG): a coarse m1 x m1 grid whose side a public rule sets from the number of points and epsilon, each coarse
cell cut into m2 x m2 leaves by its own noisy count, the two levels made consistent by weighted least squares, and
every leaf's count spread evenly over its cells.

The paper's equations, as named here:
  Guideline 1 (UG)   m = sqrt(N epsilon / c), c = 10: the side balancing a query's noise against the
                     non-uniformity of the cells it cuts.
  AG level 1         m1 = max(10, ceil(sqrt(N epsilon / c) / 4)).
  AG level 2         m2 = ceil(sqrt(N' (1 - alpha) epsilon / (c / 2))) for a coarse cell of noisy count N'.
  inference          v' = (alpha^2 m2^2 v + (1 - alpha)^2 sum u) / (alpha^2 m2^2 + (1 - alpha)^2), and v' - sum u
                     shared equally among the coarse cell's leaves (`two_level`, written for any variances).

Ours, beside the paper: `nonnegative_two_level`, the same weighted least squares over leaves >= 0 (for the
published non-negative counts), solved exactly per coarse cell: the optimum is x = max(u - t, 0) for the one t
where t = r (sum x - v) (`_shift`), found by bisection.

All of it reads the grid's public size and the noisy values only, except `coarse_counts` / `leaf_counts`, which
aggregate the exact grid over a partition that the public parameters and earlier noisy values fixed (the plan's
sensitivity argument: a point falls in exactly one coarse cell and one leaf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Qardaji et al.'s constant c (their Guideline 1 and experiments).
C = 10.0
#: AG's least coarse side.
MIN_COARSE = 10
#: Bisection steps of `nonnegative_two_level`'s shift: the bracket shrinks 2^-80, below any double's resolution.
BISECTION_STEPS = 80


def coarse_side(points: float, epsilon: float, cells: int) -> int:
    """AG's m1 from a (noisy or public) number of points and the budget of both levels; at most `cells`."""
    return int(min(cells, max(MIN_COARSE, math.ceil(math.sqrt(max(points, 0.0) * epsilon / C) / 4))))


def leaf_sides(noisy_coarse: np.ndarray, epsilon_leaves: float) -> np.ndarray:
    """AG's m2 per coarse cell from its noisy count (a negative count as 0), at least 1."""
    return np.ceil(np.sqrt(np.maximum(noisy_coarse, 0.0) * epsilon_leaves / (C / 2))).astype(np.int64).clip(min=1)


def parts(n: int, m: int) -> np.ndarray:
    """The part (0..m-1) of each of n cells cut into m contiguous parts of floor or ceil(n / m) cells."""
    return (np.arange(n) * m) // n


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
    """The coarse cell (row-major, m1 x m1) of every cell of the grid."""
    p = parts(cells, m1)
    return p[:, None] * m1 + p[None, :]


def partition(cells: int, m1: int, m2: np.ndarray) -> Partition:
    """AG's leaves: coarse cell j (of the m1 x m1 grid) cut into min(m2_j, its width) x min(m2_j, its height)
    leaves, numbered coarse cell by coarse cell."""
    p = parts(cells, m1)
    width = np.bincount(p, minlength=m1)
    offset = np.arange(cells) - np.concatenate([[0], np.cumsum(width)[:-1]])[p]
    cx, cy = np.divmod(np.arange(m1 * m1), m1)
    mx, my = np.minimum(m2, width[cx]), np.minimum(m2, width[cy])
    c = p[:, None] * m1 + p[None, :]
    lx = (offset[:, None] * mx[c]) // width[p][:, None]
    ly = (offset[None, :] * my[c]) // width[p][None, :]
    leaf = np.concatenate([[0], np.cumsum(mx * my)[:-1]])[c] + lx * my[c] + ly
    n = int(np.sum(mx * my))
    xs, ys = np.indices((cells, cells))
    first_x, first_y = np.full(n, cells), np.full(n, cells)
    np.minimum.at(first_x, leaf.ravel(), xs.ravel())
    np.minimum.at(first_y, leaf.ravel(), ys.ravel())
    end_x, end_y = np.zeros(n, np.int64), np.zeros(n, np.int64)
    np.maximum.at(end_x, leaf.ravel(), xs.ravel() + 1)
    np.maximum.at(end_y, leaf.ravel(), ys.ravel() + 1)
    return Partition(leaf, np.repeat(np.arange(m1 * m1), mx * my), first_x, end_x, first_y, end_y)


def aggregate(grid: np.ndarray, labels: np.ndarray, size: int) -> np.ndarray:
    """The sums of the grid's cells per label (0..size-1); integer counts stay integers (exact below 2^53)."""
    values = np.asarray(grid).ravel()
    sums = np.bincount(labels.ravel(), weights=values.astype(np.float64), minlength=size)
    return np.rint(sums).astype(np.int64) if np.issubdtype(values.dtype, np.integer) else sums


def two_level(v: np.ndarray, var_v: float, u: np.ndarray, var_u: float, parent: np.ndarray) -> np.ndarray:
    """The weighted least-squares leaves from the noisy coarse counts v (variance var_v) and leaves u (var_u):
    each coarse cell's total becomes the inverse-variance average of v and the sum of its k leaves (variance
    k var_u), and the difference to that sum is shared equally (AG's inference). Linear in the noise."""
    k = np.bincount(parent, minlength=v.size)
    su = np.bincount(parent, weights=u, minlength=v.size)
    wv, wu = 1.0 / var_v, 1.0 / (k * var_u)
    total = (wv * v + wu * su) / (wv + wu)
    return u + ((total - su) / k)[parent]


def nonnegative_two_level(v: np.ndarray, var_v: float, u: np.ndarray, var_u: float,
                          parent: np.ndarray) -> np.ndarray:
    """Ours: argmin over x >= 0 of (sum_{i in j} x_i - v_j)^2 / var_v + sum_i (x_i - u_i)^2 / var_u, per coarse
    cell j. The objective is strictly convex and separable by coarse cell; its KKT conditions give
    x_i = max(u_i - t_j, 0) with t_j = r (sum_i x_i - v_j), r = var_u / var_v. g(t) = t - r (sum_i max(u_i - t, 0)
    - v_j) is continuous and strictly increasing (sum max(u_i - t, 0) is non-increasing in t), negative at
    t = -B and positive at t = B for B = (1 + r k) (max|u| + r |v|) + 1, so it has one root: bisection."""
    r = var_u / var_v
    k = np.bincount(parent, minlength=v.size)
    bound = (1.0 + r * k) * (np.abs(u).max(initial=0.0) + r * np.abs(v)) + 1.0
    lo, hi = -bound, bound.copy()
    for _ in range(BISECTION_STEPS):
        t = (lo + hi) / 2.0
        g = t - r * (np.bincount(parent, weights=np.maximum(u - t[parent], 0.0), minlength=v.size) - v)
        hi, lo = np.where(g > 0, t, hi), np.where(g > 0, lo, t)
    return np.maximum(u - ((lo + hi) / 2.0)[parent], 0.0)


def spread(leaves: np.ndarray, part: Partition) -> np.ndarray:
    """Every leaf's value shared evenly among its cells: the (cells, cells) grid."""
    return (leaves / part.sizes())[part.leaf]
