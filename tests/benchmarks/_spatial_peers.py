"""Benchmark peers for 2-D count grids (density maps) and rectangle queries, written from their papers (no package
offers them; no peer code copied), with the corpus of grids and the rectangle workload they are scored on.

Each peer is `peer(grid, epsilon, rng) -> np.ndarray`: grid the true 2-D counts (shape (nx, ny), non-negative),
epsilon a pure-DP budget under add/remove of one point (one cell changes by 1), rng a numpy Generator; the result
is the peer's estimated grid of the same shape, signed (nothing is clipped), from which it answers a rectangle
query by summing cells (prefix sums: `rect_answers`). The sensitivity argument sits next to each noise draw.

    identity  Laplace(1/epsilon) on every cell.
    UG        Qardaji, Yang & Li, "Differentially private grids for geospatial data", ICDE 2013, §IV (uniform grid):
              an m x m grid, m = sqrt(N epsilon / c), c = 10, coarse cells spread uniformly over their fine cells.
    AG        the same paper, §V (adaptive grids): a coarse m1 x m1 grid with alpha epsilon, each coarse cell split
              m2 x m2 by its noisy count with (1 - alpha) epsilon, two-level constrained inference, uniform leaves.
    quadtree  Cormode, Procopiuc, Srivastava, Shen & Yu, "Differentially private spatial decompositions", ICDE 2012:
              the full (data-independent) quadtree down to single cells, geometric budget across levels (§4.1),
              made consistent by weighted least squares (Hay, Rastogi, Miklau & Suciu, PVLDB 2010, two passes;
              Cormode et al. §4.2 for unequal level budgets), fan-out 4.
    HDMM      McKenna, Miklau, Hay & Machanavajjhala, "Optimizing error of high-dimensional statistical queries
              under differential privacy", PVLDB 2018, §6 (OPT_x): the Kronecker product of the per-axis p-Identity
              strategies optimised for all 1-D ranges (the project's `dpalgos.hdmm`, shipped under
              tasks/strategies/), Laplace noise, least squares solved per axis.

UG and AG need N, the number of points, to set their resolution; the paper takes it as given. Here N is a noisy
count drawn with N_SHARE of epsilon (sequential composition: the grid gets the rest), so that every peer is
epsilon-DP end to end and no peer reads a parameter off the data that a release could not.

These are benchmark peers, not release code: they draw numpy's floating-point Laplace noise, which the release
path must not use (DESIGN.md, privacy rules).

    python tests/benchmarks/_spatial_peers.py [--reps 10] [--rects 2000]   # every peer's MSE on the corpus
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
#: Qardaji et al.'s constant c in m = sqrt(N epsilon / c) (their §IV-B: c = 10 fits every dataset they tried).
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
    """`count` random half-open rectangles (x0, x1, y0, y1) of varied sizes: Qardaji et al.'s workload (§VI-A) of
    six query sizes q1..q6, each doubling both sides of the last, the largest half of each axis (a quarter of the
    domain), the smallest 1/64 of each axis (at least one cell); each rectangle's size drawn uniformly among the six
    and its position uniformly among those inside the grid."""
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
    §6.1: for a product workload W_1 (x) W_2 the error of A_1 (x) A_2 factors into the per-axis errors, so each
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
    Y = np.apply_along_axis(ay.answers, 1, np.apply_along_axis(ax.answers, 0, g))
    Y = Y + _laplace(rng, 1.0 / epsilon, Y.shape)
    return np.apply_along_axis(ay.least_squares, 1, np.apply_along_axis(ax.least_squares, 0, Y))


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
    """n points along the polylines (each an (v, 2) array of vertices), uniform in arc length over all of them,
    with Gaussian noise of `noise` across (and along) the road."""
    segs = np.concatenate([np.stack([line[:-1], line[1:]], axis=1) for line in lines])   # (s, 2, 2)
    lengths = np.linalg.norm(segs[:, 1] - segs[:, 0], axis=1)
    which = rng.choice(len(segs), n, p=lengths / lengths.sum())
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
    "HDMM": hdmm_kron,
}


def score(grid: np.ndarray, epsilon: float, reps: int, rects: np.ndarray, seed: int = 0) -> dict[str, tuple]:
    """Each peer's (rectangle MSE, unit-cell MSE, seconds per run), means over `reps` runs."""
    truth = rect_answers(grid, rects)
    out = {}
    for i, (name, peer) in enumerate(PEERS.items()):
        rng = np.random.default_rng([seed, i])
        rect, unit, t0 = [], [], time.perf_counter()
        for _ in range(reps):
            est = peer(grid, epsilon, rng)
            rect.append(np.mean((rect_answers(est, rects) - truth) ** 2))
            unit.append(unit_mse(est, grid))
        out[name] = (float(np.mean(rect)), float(np.mean(unit)), (time.perf_counter() - t0) / reps)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rects", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    data = datasets(seed=args.seed)
    for name, grid in data.items():
        print(f"# {name}: {grid.shape}, {grid.sum():.4g} points, {np.mean(grid == 0):.1%} empty cells", flush=True)
    rects = rectangles((256, 256), args.rects, np.random.default_rng([args.seed, 99]))
    for d, (name, grid) in enumerate(data.items()):
        for eps in EPSILONS:
            table = score(grid, eps, args.reps, rects, args.seed + 1000 * d)
            best = min(v[0] for v in table.values())
            for peer, (rect, unit, secs) in table.items():
                print(f"RESULT data={name} eps={eps:g} peer={peer} rect_mse={rect:.4g} unit_mse={unit:.4g} "
                      f"rect_vs_best={rect / best:.3g} seconds={secs:.3f}", flush=True)


if __name__ == "__main__":
    main()
