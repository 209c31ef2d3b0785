"""Benchmark peers for 2-D count grids (density maps) and rectangle queries, written from their papers (no package
offers them; no peer code copied; the papers are not in ../shared/papers, so from the published texts as known here:
the sections are named rather than numbered), with the corpus of grids and the rectangle workload they are scored on.

Each peer is `peer(grid, epsilon, rng) -> np.ndarray`: grid the true 2-D counts (shape (nx, ny), non-negative),
epsilon a pure-DP budget under add/remove of one point (one cell changes by 1), rng a numpy Generator; the result
is the peer's estimated grid of the same shape, signed (nothing is clipped), from which it answers a rectangle
query by summing cells (prefix sums: `rect_answers`). The sensitivity argument sits next to each noise draw.

    identity  Laplace(1/epsilon) on every cell.
    UG        Qardaji, Yang & Li, "Differentially private grids for geospatial data", ICDE 2013, uniform grids:
              an m x m grid, m = sqrt(N epsilon / c), c = 10, coarse cells spread uniformly over their fine cells.
    AG        the same paper, adaptive grids: a coarse m1 x m1 grid with alpha epsilon, each coarse cell split
              m2 x m2 by its noisy count with (1 - alpha) epsilon, two-level constrained inference, uniform leaves.
    quadtree  Cormode, Procopiuc, Srivastava, Shen & Yu, "Differentially private spatial decompositions", ICDE 2012:
              the full (data-independent) quadtree down to single cells, their geometric budget across levels,
              made consistent by weighted least squares (Hay, Rastogi, Miklau & Suciu, PVLDB 2010, two passes;
              Cormode et al.'s post-processing for unequal level budgets), fan-out 4.
    HDMM      McKenna, Miklau, Hay & Machanavajjhala, "Optimizing error of high-dimensional statistical queries
              under differential privacy", PVLDB 2018, OPT_x (Kronecker products): the Kronecker product of the
              per-axis p-Identity strategies optimised for all 1-D ranges (the project's `dpalgos.hdmm`, shipped
              under tasks/strategies/), Laplace noise, least squares solved per axis.

UG and AG need N, the number of points, to set their resolution; the paper takes it as given. Here N is a noisy
count drawn with N_SHARE of epsilon (sequential composition: the grid gets the rest), so that every peer is
epsilon-DP end to end and no peer reads a parameter off the data that a release could not.

These are benchmark peers, not release code: they draw numpy's floating-point Laplace noise, which the release
path must not use (DESIGN.md, privacy rules).

    python tests/benchmarks/_spatial_peers.py [--reps 30] [--rects 2000]   # every peer's MSE on the corpus
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository, when run as a script
from dpalgos import hdmm  # noqa: E402
from tasks import strategies  # noqa: E402

SPATIAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spatial"
CHECKIN = SPATIAL / "checkin_256_256.npy"
#: Qardaji et al.'s constant c in m = sqrt(N epsilon / c) (their Guideline 1; c = 10 in their experiments).
C = 10.0
#: The share of epsilon UG and AG spend on the noisy number of points N that sets their resolution.
N_SHARE = 0.05
#: AG's split of the rest of the budget between its two levels (the paper's alpha = 0.5).
ALPHA = 0.5
EPSILONS = (0.1, 1.0)

# --------------------------------------------------------------------------------------------------------------
# Shared helpers


def _grid(grid) -> np.ndarray:
    a = np.asarray(grid, dtype=np.float64)
    if a.ndim != 2 or a.size == 0 or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError("a count grid is a non-empty 2-D array of non-negative finite counts")
    return a


def _laplace(rng: np.random.Generator, scale: float, size=None):
    return rng.laplace(0.0, scale, size)


def _parts(n: int, m: int) -> np.ndarray:
    """The part (0..m-1) of each of n fine cells when n is cut into m contiguous parts of floor or ceil(n/m) cells
    (part of cell t = floor(t m / n)); m <= n, so no part is empty."""
    return (np.arange(n) * m) // n


def _noisy_total(grid: np.ndarray, epsilon: float, rng: np.random.Generator) -> float:
    # Sensitivity: adding or removing one point changes the total by 1; Laplace(1/epsilon) is epsilon-DP.
    return float(grid.sum() + _laplace(rng, 1.0 / epsilon))


def _side(n_noisy: float, epsilon: float, c: float) -> int:
    """Qardaji et al.'s grid size sqrt(N epsilon / c), at least 1, from a noisy N (a negative N counts as 0)."""
    return max(1, math.ceil(math.sqrt(max(n_noisy, 0.0) * epsilon / c)))


def rect_answers(grid, rects) -> np.ndarray:
    """The sum of `grid` over each half-open rectangle [x0, x1) x [y0, y1) (rows of `rects`: x0, x1, y0, y1), by
    2-D prefix sums."""
    g = np.asarray(grid, dtype=np.float64)
    P = np.zeros((g.shape[0] + 1, g.shape[1] + 1))
    P[1:, 1:] = g.cumsum(axis=0).cumsum(axis=1)
    x0, x1, y0, y1 = np.asarray(rects, dtype=np.int64).T
    return P[x1, y1] - P[x0, y1] - P[x1, y0] + P[x0, y0]


def rectangles(shape, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` random half-open rectangles (x0, x1, y0, y1) of varied sizes, after Qardaji et al.'s workload of six
    query sizes q1..q6 at random positions: here each size doubles both sides of the last, the largest half of
    each axis (a quarter of the domain), the smallest 1/64 of each axis (at least one cell); each rectangle's size
    drawn uniformly among the six and its position uniformly among those inside the grid."""
    nx, ny = shape
    k = rng.integers(1, 7, count)                       # side = axis / 2^k
    wx = np.maximum(1, np.ceil(nx / 2.0 ** k)).astype(np.int64)
    wy = np.maximum(1, np.ceil(ny / 2.0 ** k)).astype(np.int64)
    x0 = (rng.random(count) * (nx - wx + 1)).astype(np.int64)
    y0 = (rng.random(count) * (ny - wy + 1)).astype(np.int64)
    return np.column_stack([x0, x0 + wx, y0, y0 + wy])


def unit_cells(shape) -> np.ndarray:
    """The workload of every single cell, as rectangles."""
    x, y = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    x, y = x.ravel(), y.ravel()
    return np.column_stack([x, x + 1, y, y + 1])


def unit_mse(estimate, grid) -> float:
    """The mean squared error over single cells."""
    return float(np.mean((np.asarray(estimate, dtype=np.float64) - np.asarray(grid, dtype=np.float64)) ** 2))


# --------------------------------------------------------------------------------------------------------------
# identity


def identity(grid, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Laplace(1/epsilon) on every cell; the noisy cells are the estimate."""
    g = _grid(grid)
    # Sensitivity: one point changes one cell by 1 (L1 distance 1 between neighbouring grids).
    return g + _laplace(rng, 1.0 / epsilon, g.shape)


# --------------------------------------------------------------------------------------------------------------
# HDMM (Kronecker product of per-axis p-Identity strategies)


def _kron_strategy(shape) -> tuple[hdmm.PIdentity, hdmm.PIdentity]:
    """HDMM's OPT_x strategy for the product workload (all x-ranges) x (all y-ranges), i.e. all rectangles: the
    Kronecker product A_x (x) A_y of the 1-D OPT_0 p-Identity strategies for all ranges of each axis (McKenna et al.
    OPT_x: for a product workload W_1 (x) W_2 the error of A_1 (x) A_2 factors into the per-axis errors, so each
    factor is optimised alone). The strategies come shipped, cached or optimised now (`tasks.strategies`)."""
    return tuple(hdmm.PIdentity.of(strategies.pidentity(int(n))) for n in shape)


def hdmm_kron(grid, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Y = A_x X A_y' + Laplace(1/epsilon) on every entry; the least-squares X^ = A_x^+ Y (A_y^+)'.

    Sensitivity: each column of a p-Identity strategy has L1 norm 1 (`dpalgos.hdmm`), and a column of A_x (x) A_y
    is the Kronecker product of one column of each, whose L1 norm is the product of theirs, 1. One point changes
    X by one unit cell, so Y by one column of A_x (x) A_y: L1 distance 1, and Laplace(1/epsilon) per entry is
    epsilon-DP. Least squares factors too: (A_x (x) A_y)^+ = A_x^+ (x) A_y^+, so the 2-D solve is one 1-D solve per
    column then per row, never the (nx ny) x (nx ny) system."""
    g = _grid(grid)
    ax, ay = _kron_strategy(g.shape)
    assert ax.sensitivity() * ay.sensitivity() <= 1.0 + 1e-9
    Y = kron_answers(ax, ay, g)
    return kron_least_squares(ax, ay, Y + _laplace(rng, 1.0 / epsilon, Y.shape))


def kron_answers(ax: hdmm.PIdentity, ay: hdmm.PIdentity, X: np.ndarray) -> np.ndarray:
    """(A_x (x) A_y) vec(X) as a matrix: A_x X A_y' (vec row-major)."""
    return np.apply_along_axis(ay.answers, 1, np.apply_along_axis(ax.answers, 0, X))


def kron_least_squares(ax: hdmm.PIdentity, ay: hdmm.PIdentity, Y: np.ndarray) -> np.ndarray:
    """(A_x (x) A_y)^+ vec(Y) as a matrix: A_x^+ Y (A_y^+)'."""
    return np.apply_along_axis(ay.least_squares, 1, np.apply_along_axis(ax.least_squares, 0, Y))


def hdmm_expected_rect_mse(shape, rects, epsilon: float) -> float:
    """The exact expected squared error of `hdmm_kron`'s answer to each rectangle, averaged over `rects`: a rectangle
    is the Kronecker product of two 1-D ranges q_x (x) q_y, its least-squares answer's weights on the noisy answers
    P'q factor into P_x'q_x (x) P_y'q_y, so its variance is 2 / epsilon^2 ||P_x'q_x||^2 ||P_y'q_y||^2."""
    ax, ay = _kron_strategy(shape)

    def norm2(strategy: hdmm.PIdentity, lo: int, hi: int) -> float:
        q = np.zeros(strategy.n)
        q[lo:hi] = 1.0
        return float(np.sum(strategy.estimate_weights(q) ** 2))

    rects = np.asarray(rects, dtype=np.int64)
    return float(np.mean([norm2(ax, x0, x1) * norm2(ay, y0, y1) for x0, x1, y0, y1 in rects])) * 2 / epsilon ** 2


# --------------------------------------------------------------------------------------------------------------
# UG and AG (Qardaji, Yang & Li, ICDE 2013)


def _spread(noisy: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Each fine cell's share of its part's noisy count, spread uniformly: `cell` maps every fine cell to its part
    (an index into `noisy`)."""
    size = np.bincount(cell.ravel(), minlength=noisy.size).reshape(noisy.shape)
    return (noisy / size).ravel()[cell]


def _grid_split(shape, mx: int, my: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An mx x my grid of coarse cells over the fine cells (mx <= nx, my <= ny): the coarse cell (row-major) of each
    fine cell, and the coarse row of each fine row and coarse column of each fine column."""
    px, py = _parts(shape[0], mx), _parts(shape[1], my)
    return px[:, None] * my + py[None, :], px, py


def uniform_grid(grid, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """UG (Qardaji et al., uniform grid): an m x m grid over the domain, m = ceil(sqrt(N epsilon / c)), c = 10 (their
    Guideline 1, which balances the noise error m^2 / epsilon^2 of a query against the non-uniformity error
    sqrt(N) / m of the cells it cuts), Laplace noise on each of its cells, each cell's noisy count spread uniformly
    over the fine cells it covers. N is a noisy count with N_SHARE of epsilon; the grid gets the rest. The grid's
    cells are unions of fine cells (m at most the fine resolution per axis; where m does not divide it, cells
    differ by one fine cell in width), as the data are known at the fine resolution only."""
    g = _grid(grid)
    eps_n, eps_g = N_SHARE * epsilon, (1.0 - N_SHARE) * epsilon
    m = _side(_noisy_total(g, eps_n, rng), eps_g, C)
    cell = _grid_split(g.shape, min(m, g.shape[0]), min(m, g.shape[1]))[0]
    counts = np.bincount(cell.ravel(), weights=g.ravel())
    # Sensitivity: the grid is a partition fixed before it sees the counts (m depends on the noisy N only), so one
    # point changes one cell by 1: Laplace(1/eps_g); with the N draw, epsilon in all.
    return _spread(counts + _laplace(rng, 1.0 / eps_g, counts.size), cell)


def _split_cells(px: np.ndarray, py: np.ndarray, m2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AG's leaves: every coarse cell of the grid (px, py: the coarse row of each fine row, coarse column of each fine
    column) cut into mx x my parts, mx = min(m2, its width), my = min(m2, its height) in fine cells (m2: one per
    coarse cell). Returns the leaf of each fine cell (leaves numbered coarse cell by coarse cell) and the coarse cell
    of every leaf."""
    wx, wy = np.bincount(px), np.bincount(py)                  # each coarse row's / column's width in fine cells
    ox = np.arange(px.size) - np.concatenate([[0], np.cumsum(wx)[:-1]])[px]   # offset inside the coarse cell
    oy = np.arange(py.size) - np.concatenate([[0], np.cumsum(wy)[:-1]])[py]
    cx, cy = np.divmod(np.arange(wx.size * wy.size), wy.size)
    W, H = wx[cx], wy[cy]
    mx, my = np.minimum(m2, W), np.minimum(m2, H)
    c = px[:, None] * wy.size + py[None, :]
    lx = (ox[:, None] * mx[c]) // W[c]
    ly = (oy[None, :] * my[c]) // H[c]
    first = np.concatenate([[0], np.cumsum(mx * my)[:-1]])
    return first[c] + lx * my[c] + ly, np.repeat(np.arange(m2.size), mx * my)


def adaptive_grid(grid, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """AG (Qardaji et al., adaptive grids). N is a noisy count with N_SHARE of epsilon; of the rest (eps'):
    1. level 1: an m1 x m1 grid, m1 = max(10, ceil(sqrt(N eps' / c) / 4)), Laplace noise with alpha eps' (alpha = 0.5);
    2. level 2: each level-1 cell with noisy count N' cut into m2 x m2 cells, m2 = ceil(sqrt(N' (1 - alpha) eps' /
       (c / 2))) (at least 1; at most the cell's width and height in fine cells), Laplace noise with (1 - alpha) eps';
    3. constrained inference (the paper's, between the two levels): a level-1 cell's count becomes the
       inverse-variance average of its noisy count v and the sum of its m2^2 leaves,
       v' = (alpha^2 m2^2 v + (1 - alpha)^2 sum u) / (alpha^2 m2^2 + (1 - alpha)^2),
       and the difference v' - sum u is shared equally among its leaves;
    4. each leaf's count spread uniformly over its fine cells."""
    g = _grid(grid)
    eps_n, eps = N_SHARE * epsilon, (1.0 - N_SHARE) * epsilon
    eps1, eps2 = ALPHA * eps, (1.0 - ALPHA) * eps
    m1 = max(10, math.ceil(math.sqrt(max(_noisy_total(g, eps_n, rng), 0.0) * eps / C) / 4))
    cell1, px, py = _grid_split(g.shape, min(m1, g.shape[0]), min(m1, g.shape[1]))
    counts1 = np.bincount(cell1.ravel(), weights=g.ravel())
    # Sensitivity: level 1 is a partition fixed by the noisy N: one point changes one cell by 1.
    v = counts1 + _laplace(rng, 1.0 / eps1, counts1.size)
    m2 = np.ceil(np.sqrt(np.maximum(v, 0.0) * eps2 / (C / 2))).astype(np.int64).clip(min=1)
    leaf, parent = _split_cells(px, py, m2)
    counts2 = np.bincount(leaf.ravel(), weights=g.ravel(), minlength=parent.size)
    # Sensitivity: the leaves partition the domain, fixed by the level-1 noisy counts (released values): one point
    # changes one leaf by 1. Levels compose sequentially: eps_n + eps1 + eps2 = epsilon.
    u = counts2 + _laplace(rng, 1.0 / eps2, counts2.size)
    return _spread(two_level(v, u, parent, ALPHA), leaf)


def two_level(v: np.ndarray, u: np.ndarray, parent: np.ndarray, alpha: float) -> np.ndarray:
    """AG's constrained inference (Qardaji et al.): the leaves u (parent[i]: the level-1 cell of leaf i) made to sum
    to v', the inverse-variance average of the level-1 cell's noisy count v (budget alpha, variance
    proportional to 1 / alpha^2) and the sum of its k leaves (variance k / (1 - alpha)^2),
    v' = (alpha^2 k v + (1 - alpha)^2 sum u) / (alpha^2 k + (1 - alpha)^2), the difference shared equally. This is
    the weighted least-squares estimate of the leaves from both levels."""
    k = np.bincount(parent, minlength=v.size)
    su = np.bincount(parent, weights=u, minlength=v.size)
    wv, wu = alpha ** 2 * k, (1.0 - alpha) ** 2
    vbar = (wv * v + wu * su) / (wv + wu)
    return u + ((vbar - su) / k)[parent]


# --------------------------------------------------------------------------------------------------------------
# quadtree with HTree consistency (Cormode et al. ICDE 2012; Hay et al. PVLDB 2010)


def _blocks(a: np.ndarray, b: int) -> np.ndarray:
    """Sums of a (n x n) over its b x b blocks."""
    n = a.shape[0] // b
    return a.reshape(n, b, n, b).sum(axis=(1, 3))


def quadtree_budgets(height: int, epsilon: float, budget: str = "geometric") -> np.ndarray:
    """The budget of each level, root (0) to leaves (height). Geometric (Cormode et al.'s budget strategy for the
    range queries of a full tree): the budget grows by 2^(1/3) per level towards the leaves,
    eps_l = 2^(l/3) epsilon (2^(1/3) - 1) / (2^((height+1)/3) - 1); uniform: epsilon / (height + 1) each."""
    levels = np.arange(height + 1)
    if budget == "uniform":
        return np.full(height + 1, epsilon / (height + 1))
    r = 2.0 ** (1.0 / 3.0)
    return r ** levels * epsilon * (r - 1.0) / (r ** (height + 1) - 1.0)


def htree_consistent(noisy: list[np.ndarray], variances: np.ndarray) -> list[np.ndarray]:
    """The weighted least-squares estimate of every node of a quadtree from its independent noisy counts
    (noisy[l]: the 2^l x 2^l counts of level l, variances[l] their noise variance), by Hay et al.'s two passes
    ("Boosting the accuracy of differentially private histograms through consistency", for fan-out k and
    equal variances) with the per-level weights of Cormode et al.'s post-processing for unequal budgets, fan-out 4:
      up:   z_leaf = y_leaf; z_v = (y_v / var_v + S / var_S) / (1 / var_v + 1 / var_S), S = the sum of v's
            children's z, var_S = 4 var(z_child); var(z_v) = 1 / (1 / var_v + 1 / var_S);
      down: x_root = z_root; x_c = z_c + (x_v - S) / 4 for each child c of v (its children's z having equal
            variances, the difference is shared equally).
    The result is consistent: every node equals the sum of its children."""
    h = len(noisy) - 1
    z, vz = [None] * (h + 1), np.empty(h + 1)
    z[h], vz[h] = noisy[h], variances[h]
    for lev in range(h - 1, -1, -1):
        S, vS = _blocks(z[lev + 1], 2), 4.0 * vz[lev + 1]
        w = (1.0 / variances[lev]) / (1.0 / variances[lev] + 1.0 / vS)
        z[lev] = w * noisy[lev] + (1.0 - w) * S
        vz[lev] = 1.0 / (1.0 / variances[lev] + 1.0 / vS)
    x = [z[0]]
    for lev in range(1, h + 1):
        gap = x[-1] - _blocks(z[lev], 2)
        x.append(z[lev] + np.kron(gap, np.ones((2, 2))) / 4.0)
    return x


def quadtree(grid, epsilon: float, rng: np.random.Generator, budget: str = "geometric") -> np.ndarray:
    """The full quadtree over the grid (padded with empty cells to a 2^h x 2^h square), from the root down to single
    cells (Cormode et al.'s data-independent quadtree, height h = log2 of the padded side), Laplace noise on every
    node with its level's budget (`quadtree_budgets`, geometric by default), made consistent by
    `htree_consistent`; the leaves inside the grid are the estimate.

    Sensitivity: the nodes of a level partition the domain, so one point changes one node per level by 1; Laplace
    noise of scale 1 / eps_l at level l makes level l eps_l-DP, and the levels compose to sum_l eps_l = epsilon.
    The padding cells are public (always empty); noising them costs nothing in privacy."""
    g = _grid(grid)
    side = 1 << max(0, math.ceil(math.log2(max(g.shape))))
    h = side.bit_length() - 1
    padded = np.zeros((side, side))
    padded[:g.shape[0], :g.shape[1]] = g
    eps = quadtree_budgets(h, epsilon, budget)
    noisy = [_blocks(padded, side >> lev) + _laplace(rng, 1.0 / eps[lev], (1 << lev, 1 << lev))
             for lev in range(h + 1)]
    return htree_consistent(noisy, 2.0 / eps ** 2)[h][:g.shape[0], :g.shape[1]]


# --------------------------------------------------------------------------------------------------------------
# Corpus


def _points_to_grid(points: np.ndarray, shape) -> np.ndarray:
    """Points in [0, 1)^2 (others dropped: they fall outside the public bounds) counted on a grid of `shape`."""
    g, _, _ = np.histogram2d(points[:, 0], points[:, 1], bins=shape, range=[[0.0, 1.0], [0.0, 1.0]])
    return g


def _blobs(rng: np.random.Generator, n: int, k: int, sigma: tuple[float, float]) -> np.ndarray:
    """n points from k Gaussian blobs with random centres in [0.05, 0.95]^2, widths uniform in `sigma` (fractions
    of the axis) and Dirichlet(1) weights."""
    centres = rng.uniform(0.05, 0.95, (k, 2))
    widths = rng.uniform(*sigma, k)
    which = rng.choice(k, n, p=rng.dirichlet(np.ones(k)))
    return centres[which] + rng.normal(size=(n, 2)) * widths[which, None]


def _polylines(rng: np.random.Generator, n: int, lines: list[np.ndarray], noise: float) -> np.ndarray:
    """n points along the polylines (each an (v, 2) array of vertices), each road with its own traffic (lognormal,
    so a few roads carry most points), uniform in arc length along a road, with Gaussian noise of `noise` across
    (and along) it."""
    segs = [np.stack([line[:-1], line[1:]], axis=1) for line in lines]                   # (s, 2, 2) per road
    traffic = np.concatenate([np.full(len(s), t) for s, t in zip(segs, rng.lognormal(0.0, 1.0, len(lines)))])
    segs = np.concatenate(segs)
    weight = np.linalg.norm(segs[:, 1] - segs[:, 0], axis=1) * traffic
    which = rng.choice(len(segs), n, p=weight / weight.sum())
    t = rng.random(n)[:, None]
    return segs[which, 0] * (1 - t) + segs[which, 1] * t + rng.normal(scale=noise, size=(n, 2))


def _random_roads(rng: np.random.Generator, count: int, vertices: int) -> list[np.ndarray]:
    """Random wandering polylines crossing the unit square (a start on one edge, steps with a drifting heading)."""
    lines = []
    for _ in range(count):
        start = rng.uniform(0.0, 1.0, 2)
        start[rng.integers(2)] = rng.integers(2)          # on an edge
        heading = math.atan2(0.5 - start[1], 0.5 - start[0]) + rng.normal(scale=0.4)
        pts = [start]
        for _ in range(vertices - 1):
            heading += rng.normal(scale=0.3)
            pts.append(pts[-1] + 1.2 / (vertices - 1) * np.array([math.cos(heading), math.sin(heading)]))
        lines.append(np.array(pts))
    return lines


def _uniform(rng, shape):
    return rng.multinomial(100_000, np.full(shape[0] * shape[1], 1.0 / (shape[0] * shape[1]))).reshape(shape)


def _clustered(rng, shape):
    return _points_to_grid(_blobs(rng, 500_000, 20, (0.01, 0.06)), shape)


def _sparse(rng, shape):
    # 3,000 points in tight blobs: at most 3,000 of 65,536 cells non-empty (>95 % empty at 256 x 256).
    return _points_to_grid(_blobs(rng, 3_000, 12, (0.002, 0.02)), shape)


def _roads(rng, shape):
    return _points_to_grid(_polylines(rng, 300_000, _random_roads(rng, 8, 12), 0.002), shape)


def _taxi(rng, shape):
    """~1e6 trips: half in a city centre (two Gaussian cores), 40 % along radial and ring roads through it, 10 %
    spread over the whole map."""
    centre = np.array([0.52, 0.47])
    core = centre + rng.normal(size=(500_000, 2)) * np.where(rng.random(500_000) < 0.6, 0.03, 0.09)[:, None]
    angles = rng.uniform(0, 2 * np.pi, 6)
    radial = [np.array([centre, centre + 0.7 * np.array([math.cos(a), math.sin(a)])]) for a in angles]
    ring = [centre + 0.25 * np.column_stack([np.cos(t), np.sin(t)]) for t in [np.linspace(0, 2 * np.pi, 40)]]
    roads = _polylines(rng, 400_000, radial + ring, 0.003)
    background = rng.random((100_000, 2))
    return _points_to_grid(np.concatenate([core, roads, background]), shape)


GENERATED: dict[str, Callable[[np.random.Generator, tuple], np.ndarray]] = {
    "uniform": _uniform, "clustered": _clustered, "sparse": _sparse, "roads": _roads, "taxi": _taxi,
}


def _checkin(shape) -> np.ndarray | None:
    """The shipped Gowalla check-in grid (256 x 256, 6.4e6 check-ins), summed into `shape` where 256 divides into it;
    None (with a message) where the file is absent or the shape does not divide it."""
    if not CHECKIN.is_file():
        print(f"checkin: skipped ({CHECKIN} absent)", file=sys.stderr)
        return None
    g = np.load(CHECKIN).astype(np.float64)
    if g.shape[0] % shape[0] or g.shape[1] % shape[1]:
        print(f"checkin: skipped (its {g.shape} grid does not sum into {tuple(shape)})", file=sys.stderr)
        return None
    fx, fy = g.shape[0] // shape[0], g.shape[1] // shape[1]
    return g.reshape(shape[0], fx, shape[1], fy).sum(axis=(1, 3))


def datasets(shape=(256, 256), seed: int = 0) -> dict[str, np.ndarray]:
    """The corpus of 2-D count grids: the shipped check-ins (where ../shared/data is present) and generated grids
    (uniform 1e5 points; clustered 5e5 in 20 Gaussian blobs; sparse 3e3 in 12 tight blobs, >95 % empty cells;
    roads 3e5 along 8 wandering polylines; taxi ~1e6, a city centre plus roads). Deterministic given the seed."""
    shape = (int(shape[0]), int(shape[1]))
    out = {}
    checkin = _checkin(shape)
    if checkin is not None:
        out["checkin"] = checkin
    for i, (name, make) in enumerate(GENERATED.items()):
        out[name] = np.asarray(make(np.random.default_rng([seed, i]), shape), dtype=np.float64)
    return out


# --------------------------------------------------------------------------------------------------------------
# The table


PEERS: dict[str, Callable[[np.ndarray, float, np.random.Generator], np.ndarray]] = {
    "identity": identity,
    "UG": uniform_grid,
    "AG": adaptive_grid,
    "quadtree": quadtree,
    "HDMM": hdmm_kron,
}


def score(grid: np.ndarray, epsilon: float, reps: int, rects: np.ndarray, seed: int = 0) -> dict[str, tuple]:
    """Each peer's rectangle MSE and unit-cell MSE (means over `reps` runs, each with the standard error of its mean
    over the runs: the rectangles of one run share its noise, so the runs are the independent samples) and its
    seconds per run."""
    truth = rect_answers(grid, rects)
    out = {}
    for i, (name, peer) in enumerate(PEERS.items()):
        rng = np.random.default_rng([seed, i])
        rect, unit, t0 = np.empty(reps), np.empty(reps), time.perf_counter()
        for r in range(reps):
            est = peer(grid, epsilon, rng)
            rect[r] = np.mean((rect_answers(est, rects) - truth) ** 2)
            unit[r] = unit_mse(est, grid)
        se = lambda a: float(a.std(ddof=1) / math.sqrt(reps)) if reps > 1 else float("nan")
        out[name] = (float(rect.mean()), se(rect), float(unit.mean()), se(unit), (time.perf_counter() - t0) / reps)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rects", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    data = datasets(seed=args.seed)
    for name, grid in data.items():
        print(f"# {name}: {grid.shape}, {grid.sum():.4g} points, {np.mean(grid == 0):.1%} empty cells", flush=True)
    rects = rectangles((256, 256), args.rects, np.random.default_rng([args.seed, 99]))
    area = np.mean((rects[:, 1] - rects[:, 0]) * (rects[:, 3] - rects[:, 2]))
    for eps in EPSILONS:
        # the data-independent linear peers' exact expected errors, against which their simulated ones are checked
        print(f"RESULT exact eps={eps:g} identity_rect_mse={2 * area / eps ** 2:.4g} "
              f"HDMM_rect_mse={hdmm_expected_rect_mse((256, 256), rects, eps):.4g}", flush=True)
    for d, (name, grid) in enumerate(data.items()):
        for e, eps in enumerate(EPSILONS):
            table = score(grid, eps, args.reps, rects, args.seed + 1000 * d + 100 * e)
            best_rect, best_unit = (min(table, key=lambda peer: table[peer][k]) for k in (0, 2))
            for peer, (rect, rect_se, unit, unit_se, secs) in table.items():
                print(f"RESULT data={name} eps={eps:g} peer={peer} rect_mse={rect:.4g} rect_se={rect_se:.2g} "
                      f"unit_mse={unit:.4g} unit_se={unit_se:.2g} rect_vs_best={rect / table[best_rect][0]:.3g} "
                      f"unit_vs_best={unit / table[best_unit][2]:.3g} seconds={secs:.3f}", flush=True)
            print(f"RESULT data={name} eps={eps:g} best_rect={best_rect} best_unit={best_unit}", flush=True)


if __name__ == "__main__":
    main()
