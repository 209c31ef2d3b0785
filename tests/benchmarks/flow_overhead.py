"""Overhead of the release flow: wall time of the flow minus the time of the dpalgos calls alone.

Runs the `release` flow (ephemeral Prefect API, local dask cluster, GX contracts, Parquet stages) on a numeric
CSV, then the same mathematics in memory with dpalgos only: scaling + L1 projection, initial centroids, DP
k-means, and the evaluation (WCSS per iteration, k-means++ reference). The first flow call of a process
also pays for starting the ephemeral Prefect API; it is reported separately.

    python tests/benchmarks/flow_overhead.py --data ../shared/data/kmeans/s1.txt --k 15
Last line: RESULT flow_s=<warm flow> dpalgos_s=<math alone> overhead_s=<difference> cold_flow_s=<first call>
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import load_numeric_csv, operator_ledger  # noqa: E402

from flows.environment import apply_defaults  # noqa: E402

apply_defaults()  # before Prefect is imported
from dpalgos import domain, dpkmeans, metrics  # noqa: E402
from dpalgos.noise import simulated  # noqa: E402


def dpalgos_alone(path: str, k: int, lo, hi, eps: float, T: int) -> float:
    t0 = time.perf_counter()
    X = load_numeric_csv(path)
    P, _ = domain.to_unit_l1_ball(X, lo, hi)
    rng = np.random.default_rng()
    C0, _ = dpkmeans.data_independent_centroids(k, P.shape[1], rng)
    traj = dpkmeans.dp_kmeans(dpkmeans.array_stats(P), C0, iterations=T, measure=simulated(dpkmeans.plan(epsilon=eps, iterations=T), rng))
    [metrics.wcss(P, C) for C in traj.centroids]
    metrics.kmeans_reference(P, k, seed=0)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    X = load_numeric_csv(args.data)
    lo, hi = X.min(axis=0), X.max(axis=0)
    cols = [f"x{j}" for j in range(X.shape[1])]

    from flows.release import release
    from tasks.spec import parse_spec

    out = Path(tempfile.mkdtemp(prefix="flow-overhead-"))
    operator_ledger(out, {"bench": (1e6, 0.0)})

    def flow_once(i: int) -> float:
        spec = parse_spec({
            "dataset": {"id": "bench", "path": args.data, "header": False,
                        "bounds": {c: [float(a), float(b)] for c, a, b in zip(cols, lo, hi)}},
            "release": {"kind": "kmeans", "k": args.k, "iterations": args.iterations, "epsilon": args.eps},
            "output_dir": str(out), "release_id": f"bench-{i}"})
        t0 = time.perf_counter()
        s = release(spec=spec)
        return time.perf_counter() - t0, s["timings"]

    cold, _ = flow_once(0)
    warm, stages = zip(*[flow_once(i + 1) for i in range(args.repeats)])
    math = [dpalgos_alone(args.data, args.k, lo, hi, args.eps, args.iterations) for _ in range(args.repeats)]
    flow_s, math_s = float(np.median(warm)), float(np.median(math))
    print(f"flow stages (last run): {stages[-1]}")
    print(f"flow wall time: cold {cold:.2f}s (includes starting the ephemeral Prefect API), warm median {flow_s:.2f}s")
    print(f"dpalgos alone: median {math_s:.2f}s")
    print(f"RESULT flow_s={flow_s:.2f} dpalgos_s={math_s:.2f} overhead_s={flow_s - math_s:.2f} cold_flow_s={cold:.2f}")


if __name__ == "__main__":
    main()
