"""The `grid` kind's PUBLISHED answers against the spatial peers (identity, UG, AG, a quadtree with HTree
consistency, HDMM's Kronecker strategy: tests/benchmarks/_spatial_peers.py) on 2-D count grids, at epsilon 0.1
and 1 (issue 46).

Ours is the release of the spec a user writes for each workload, through the kind's own public functions
(`tasks.kinds.grid`: its plan, `measure_grid` through the plan's entries, `signed_estimate` / `estimates`,
`rectangle_sums`), with the noise of the plan's entries (`dpalgos.noise.simulated`: the same laws as the
production samplers, seeded numpy for speed; tests/test_benchmarks_score_the_release.py checks that these are
the values the release publishes):
  rectangles  `workload: rectangles` (the default strategy, STRATEGY_FOR_WORKLOAD): a rectangle's answer is the
              sum of the published signed `estimate` over its cells, cut at zero (what `query --rect` answers);
  unit cells  `workload: unit`: a cell's answer is its published `count`.
A peer answers both from its own estimated grid, signed, as it publishes it. The rectangle workload is the
peers' (`rectangles`: six sizes after Qardaji et al., random positions), the same for every method.

    python tests/benchmarks/spatial_peers.py [--data grid.npy | points.csv] [--reps 10] [--rects 2000]
    python tests/benchmarks/spatial_peers.py --seeds 0-7     # the corpus regenerated eight times, pooled

Without --data: the corpus (`_spatial_peers.datasets`: the shipped check-ins and generated uniform, clustered,
very sparse, road-like and taxi-like grids). A CSV holds points x,y (header), binned on 256 x 256 cells over
their --bounds (default: the points' range; a benchmark's choice, a release's bounds are public inputs).
Prints `RESULT data=... eps=... workload=... ours=... best_peer=... ours_over_best=...` per cell and
`RESULT release=... workload=... geo_mean=... worst=...` per workload. With --seeds, every seed regenerates the
generated maps and redraws every noise (the check-ins stay): the lines above per seed (with `seed=`), then the same
summary over all of them (`seeds=`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _spatial_peers as peers  # noqa: E402
from _corpus import seed_list  # noqa: E402

from dpalgos.noise import simulated  # noqa: E402
from tasks.kinds import grid as G  # noqa: E402
from tasks.spec import parse_spec  # noqa: E402

CELLS = 256


def spec_for(epsilon: float, workload: str, cells: int = CELLS, strategy: str | None = None):
    """The spec a user writes for the workload (defaults otherwise; `strategy` when the user names one); the
    dataset's path is never read here."""
    release = {"kind": "grid", "cells": cells, "epsilon": epsilon, "workload": workload}
    return parse_spec({"dataset": {"id": "bench", "path": "unused.parquet", "bounds": {"x": [0, 1], "y": [0, 1]}},
                       "release": release | ({"strategy": strategy} if strategy else {})})


def ours(grid: np.ndarray, epsilon: float, workload: str, rng: np.random.Generator,
         strategy_name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One simulated release of the exact grid: (published signed estimate, published counts)."""
    spec = spec_for(epsilon, workload, grid.shape[0], strategy_name)
    plan = G.KIND.bind(spec).plan
    strategy = {"kronecker": lambda: G.kronecker_now(spec.release.cells, 2), "adaptive": lambda: plan}.get(
        spec.release.strategy_used, lambda: None)()
    noisy, _ = G.measure_grid(spec, grid, simulated(plan, rng), strategy)
    if workload == "rectangles":  # its answers are sums of the signed estimate: the counts are not needed
        return G.signed_estimate(spec, noisy, strategy), None
    count, estimate, _ = G.estimates(spec, noisy, plan[G.entry_of(spec)].scale, strategy)
    return estimate, count


#: Our releases scored: the default spec per workload, and the same with `strategy: adaptive`.
OURS = {"ours": None, "ours_adaptive": "adaptive"}


def score(grid: np.ndarray, epsilon: float, reps: int, rects: np.ndarray, seed: int) -> dict:
    """{method: (rectangle MSE, unit-cell MSE)}: ours per workload, each peer's from its estimate."""
    truth = peers.rect_answers(grid, rects)
    out = {}
    for k, (name, strategy) in enumerate(OURS.items()):
        rng = np.random.default_rng([seed, 1 + k])
        rect = [np.mean((G.rectangle_sums(ours(grid, epsilon, "rectangles", rng, strategy)[0], rects) - truth) ** 2)
                for _ in range(reps)]
        unit = [peers.unit_mse(ours(grid, epsilon, "unit", rng, strategy)[1], grid) for _ in range(reps)]
        out[name] = (float(np.mean(rect)), float(np.mean(unit)))
    for i, (name, peer) in enumerate(peers.PEERS.items()):
        rng = np.random.default_rng([seed, 10 + i])
        runs = [peer(grid, epsilon, rng) for _ in range(reps)]
        out[name] = (float(np.mean([np.mean((peers.rect_answers(e, rects) - truth) ** 2) for e in runs])),
                     float(np.mean([peers.unit_mse(e, grid) for e in runs])))
    return out


def load(path: Path, bounds: list[float] | None) -> dict[str, np.ndarray]:
    if path.suffix == ".npy":
        return {path.stem: np.asarray(np.load(path), dtype=np.float64)}
    points = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(0, 1))
    x0, x1, y0, y1 = bounds or (points[:, 0].min(), points[:, 0].max(), points[:, 1].min(), points[:, 1].max())
    grid, _, _ = np.histogram2d(np.clip(points[:, 0], x0, x1), np.clip(points[:, 1], y0, y1), bins=CELLS,
                                range=[[x0, x1], [y0, y1]])
    return {path.stem: grid}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="a 2-D grid of counts (.npy) or points x,y (.csv); default: the corpus")
    ap.add_argument("--bounds", type=float, nargs=4, metavar=("X0", "X1", "Y0", "Y1"), help="a CSV's bounds")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rects", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=seed_list,
                    help="several seeds, pooled: a range FIRST-LAST or a comma-separated list")
    args = ap.parse_args(argv)
    seeds = args.seeds or [args.seed]
    pooled = {}
    for seed in seeds:
        data = load(args.data, args.bounds) if args.data else peers.datasets(seed=seed)
        ratios = run(data, args.reps, args.rects, seed)
        label = f"seed={seed} " if args.seeds else ""
        for key, r in ratios.items():
            pooled.setdefault(key, []).extend(r)
            _summary(label, key, r)
    if len(seeds) > 1:
        for key, r in pooled.items():
            _summary(f"seeds={seeds[0]}-{seeds[-1]} " if seeds == list(range(seeds[0], seeds[-1] + 1))
                     else f"seeds={','.join(map(str, seeds))} ", key, r)


def _summary(label: str, key, r) -> None:
    print(f"RESULT {label}release={key[0]} workload={key[1]} geo_mean={math.exp(np.mean(np.log(r))):.3g} "
          f"worst={max(r):.3g}", flush=True)


def run(data: dict, reps: int, n_rects: int, seed: int) -> dict:
    """Per (our release, workload): its ratios to the best peer over the data and epsilons."""
    ratios = {(name, workload): [] for name in OURS for workload in ("rectangles", "unit")}
    for d, (name, grid) in enumerate(data.items()):
        rects = peers.rectangles(grid.shape, n_rects, np.random.default_rng([seed, 99]))
        print(f"# {name}: {grid.shape}, {grid.sum():.4g} points, {np.mean(grid == 0):.1%} empty cells", flush=True)
        for eps in peers.EPSILONS:
            t0 = time.perf_counter()
            table = score(grid, eps, reps, rects, seed + 1000 * d)
            for j, workload in enumerate(("rectangles", "unit")):
                best = min((k for k in table if k not in OURS), key=lambda k: table[k][j])
                for ours_name in OURS:
                    ratios[ours_name, workload].append(table[ours_name][j] / table[best][j])
                mine = " ".join(f"{k}={table[k][j]:.4g} {k}_over_best={table[k][j] / table[best][j]:.3g}"
                                for k in OURS)
                others = " ".join(f"{k}={v[j]:.4g}" for k, v in table.items() if k not in OURS)
                print(f"RESULT data={name} eps={eps:g} workload={workload} {mine} best_peer={best} {others}",
                      flush=True)
            print(f"# {name} eps={eps:g}: {time.perf_counter() - t0:.0f} s", flush=True)
    return ratios

if __name__ == "__main__":
    main()
