"""Speed of Lee & Kifer's MCMC: Metropolis-Hastings proposals per second on a Gowalla-like point set
(K = 5, T = 5, DP k-means at epsilon = 0.5), and the time of a chain of 10 N steps for N = 10^5 simulated
points. Uses ../shared/data/spatial/checkin_256_256.npy when present, else a generated 2-D mixture.
Proposals are prepared in blocks by a second thread while the chain runs (`leekifer.DatasetChain`): the
wall-clock rate needs two free cores; the CPU-time rate (proposals per second of CPU used by both threads)
says what the code does on a loaded machine. Last line:
    RESULT proposals_per_s=<n> cpu_proposals_per_s=<n> chain_10N_s=<s>

    python tests/benchmarks/mcmc_speed.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from dpalgos import dpkmeans, leekifer
from dpalgos.noise import simulated
from tasks.experiments.kmeans import normalise
from tasks.experiments.points import gowalla_like

GRID = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spatial" / "checkin_256_256.npy"


def points(n: int, rng) -> np.ndarray:
    if GRID.exists():
        return gowalla_like(GRID, n)
    centres = rng.uniform(0, 256, size=(40, 2))
    return centres[rng.integers(0, 40, n)] + rng.normal(0, 4, size=(n, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="simulated dataset size N")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    P = normalise(points(args.n, rng))
    C0, _ = dpkmeans.data_independent_centroids(5, 2, rng)
    traj = dpkmeans.dp_kmeans(dpkmeans.array_stats(P), C0, iterations=5,
                              measure=simulated(dpkmeans.plan(epsilon=0.5, iterations=5), rng))
    stats = leekifer.consistent_statistics(traj)
    leekifer.DatasetChain(traj, stats, seed=0).run(1000)  # compile
    chain = leekifer.DatasetChain(traj, stats, seed=1)
    t0, c0 = time.perf_counter(), time.process_time()
    chain.run(10 * chain.size)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    rate = 10 * chain.size / seconds
    print(f"simulated dataset: {chain.size} points; 10N = {10 * chain.size} steps in {seconds:.2f}s, {cpu:.2f}s CPU "
          f"({rate:.3g} proposals/s, acceptance {chain.accepted / chain.steps:.3f})")
    print(f"RESULT proposals_per_s={rate:.0f} cpu_proposals_per_s={10 * chain.size / cpu:.0f} "
          f"chain_10N_s={seconds:.2f}")


if __name__ == "__main__":
    main()
