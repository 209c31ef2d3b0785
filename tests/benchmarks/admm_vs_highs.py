"""L1 (maximum-likelihood) consistency of a noisy binary range tree: ADMM (Lee, Wang & Kifer Algorithm 3,
Hay et al.'s Htree as the projection) against the exact LP optimum from HiGHS (scipy linprog), same run.

The data: a sparse histogram over 2^L leaves (90% empty bins, geometric counts elsewhere), its binary tree,
Laplace noise with epsilon = 1 split over the L+1 levels. Both solvers get the same noisy tree and must
return a tree that is consistent (every parent = sum of its children) and non-negative; ADMM's output is
the tree aggregated from its non-negative leaves, and its L1 objective ||x - x~||_1 is compared with the LP's.
The limit is printed beside ADMM's time: the memory-bandwidth floor of its iterations, i.e. the time to
stream the bytes that any iteration of the two-block scheme must move (read x~, x, v; write x, v: 40 bytes
per node) at the bandwidth of a numpy add measured in the same run over vectors of the same size.
Last line:
    RESULT leaves=<m> admm_s=<s> floor_s=<s> admm_cpu_s=<s> highs_s=<s> speedup=<highs_s/admm_s>
           cpu_speedup=<the same in CPU seconds> objective_gap=<(admm - lp)/lp>

    python tests/benchmarks/admm_vs_highs.py --leaves-log2 16
    python tests/benchmarks/admm_vs_highs.py --leaves-log2 22 --skip-highs
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from dpalgos import admm
from dpalgos.hierarchy import Tree, tree_plan
from dpalgos.noise import simulated


def highs_l1(tree: Tree, xt: np.ndarray) -> tuple[float, float, float]:
    """Exact optimum of min ||x - x~||_1 s.t. tree consistency, x >= 0, with x = x~ + p - q."""
    A = tree.consistency_matrix()
    n = tree.size
    t0, c0 = time.perf_counter(), time.process_time()
    r = linprog(np.ones(2 * n), A_ub=sp.hstack([-sp.identity(n), sp.identity(n)]).tocsr(), b_ub=xt,
                A_eq=sp.hstack([A, -A]).tocsr(), b_eq=-(A @ xt), bounds=(0, None), method="highs")
    if r.status != 0:
        raise SystemExit(f"HiGHS failed: {r.message}")
    return time.perf_counter() - t0, time.process_time() - c0, r.fun


def admm_l1(tree: Tree, xt: np.ndarray, noise_scale: float) -> tuple[float, float, float, int]:
    """Wall seconds, CPU seconds of this process (the machine may be shared), L1 objective, iterations."""
    t0, c0 = time.perf_counter(), time.process_time()
    res = admm.solve_projection(xt, tree.projection(), penalty="l1", scale=noise_scale, x0=tree.htree(xt))
    consistent = tree.aggregate(np.maximum(tree.leaves_of(res.x), 0.0))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return seconds, cpu, float(np.abs(consistent - xt).sum()), res.iterations


BYTES_PER_NODE = 40  # read x~, x, v and write x, v (8-byte floats) in each iteration


def stream_bandwidth(n: int, repeats: int = 5) -> float:
    """Bytes per second of c = a + b over n-vectors (24 bytes per element), the best of `repeats`."""
    a, b, c = np.ones(n), np.ones(n), np.empty(n)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.add(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 24.0 * n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--leaves-log2", type=int, default=16)
    ap.add_argument("--skip-highs", action="store_true", help="ADMM only (HiGHS takes minutes beyond 2^18)")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    m = 2 ** args.leaves_log2
    rng = np.random.default_rng(args.seed)
    leaves = np.where(rng.random(m) < 0.1, rng.geometric(0.05, m), 0).astype(np.float64)
    tree = Tree(m, 2)
    xt = simulated(tree_plan(tree, epsilon=args.epsilon), rng)("tree", tree.aggregate(leaves))
    noise_scale = tree.levels / args.epsilon
    small = Tree(8, 2)
    # numba compilation, not timed
    admm_l1(small, simulated(tree_plan(small, epsilon=1.0), rng)("tree", small.aggregate(np.ones(8))), 4.0)

    admm_s, admm_cpu, admm_obj, its = admm_l1(tree, xt, noise_scale)
    bandwidth = stream_bandwidth(tree.size)
    floor_s = its * BYTES_PER_NODE * tree.size / bandwidth
    print(f"tree: {m} leaves, {tree.size} nodes; ADMM {its} iterations, {admm_s:.3f}s ({admm_cpu:.3f}s CPU), "
          f"L1 objective {admm_obj:.6g}")
    print(f"memory floor: {its} iterations x {BYTES_PER_NODE} B x {tree.size} nodes at {bandwidth / 1e9:.2f} GB/s "
          f"(numpy add, this run) = {floor_s:.3f}s; ADMM at {floor_s / admm_s:.0%} of it")
    highs_s = highs_cpu = opt = math.nan
    if not args.skip_highs:
        highs_s, highs_cpu, opt = highs_l1(tree, xt)
        print(f"HiGHS: {highs_s:.3f}s ({highs_cpu:.3f}s CPU), optimum {opt:.6g}")
    gap = (admm_obj - opt) / opt if not args.skip_highs else math.nan
    print(f"RESULT leaves={m} admm_s={admm_s:.3f} floor_s={floor_s:.3f} admm_cpu_s={admm_cpu:.3f} "
          f"highs_s={highs_s:.3f} speedup={highs_s / admm_s:.1f} cpu_speedup={highs_cpu / admm_cpu:.1f} "
          f"objective_gap={gap:.2e}")


if __name__ == "__main__":
    main()
