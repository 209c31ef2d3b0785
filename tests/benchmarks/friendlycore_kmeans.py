"""Friendly k-means (dpalgos.friendlycore; framework after Tsfadia et al., ICML 2022, filter and analysis derived in
this project) on a uniform mixture of k = 8 separated 2-D Gaussians: k-means cost normalised by k-means++.

Data: centres uniform in [-50, 50]^2 with pairwise distance >= 15 (redrawn each repetition), unit covariance,
n points. Friendly k-means is the `friendly_kmeans` kind's release (`ours`: `tasks.kinds.friendlycore.release_kmeans`
on its release section): m = even(n / (k * points_per_cluster)) subsets (a public function of n, which the benchmark
treats as public), k-means++ + Lloyd (best of 3) per subset on the kind's secret subset coins, radius chosen
privately over the public grid [1e-3, 1e5]; rho zCDP + delta' = 1e-8 (the spec's epsilon at delta = 1e-6 is the one
that converts to rho). Its (eps, delta) at delta = 1e-6 (dp_accounting) is the budget given to the `kmeans` kind's
release (Lee & Kifer Alg. 1 with the kind's default domain, seeding and refinement rule, T iterations, pure eps-DP:
a stronger guarantee at the same eps) on the public bounds [-120, 120]^2, which no point of the data leaves (also
run with eps = 1e9, a noise-free diagnostic of its start and T Lloyd steps).
Cost = WCSS on the original data / WCSS of scikit-learn k-means++ (best of 10) on the same data.
"No friendly core" counts as a failure (cost +inf in the quantiles).

    python tests/benchmarks/friendlycore_kmeans.py --n 200000            # 30 repetitions; last line RESULT ...
    python tests/benchmarks/friendlycore_kmeans.py --sweep --runs 10 --points-per-cluster 10,40   # small n

Last line: RESULT median_normalized_cost=<c> q10=<c> q90=<c>

The setup (data, parameters, methods) is shared with `dprelease experiment friendlycore_kmeans`
(tasks/experiments/friendlycore.py), which draws its noise with dpalgos.noise.simulated and plots the sweep.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpalgos import friendlycore as fc  # noqa: E402
from dpalgos.metrics import kmeans_reference, wcss  # noqa: E402
from dpalgos.noise import Measure, SeededNoise  # noqa: E402
from tasks.experiments import friendlycore as fce  # noqa: E402  (shared with the experiment)
from tasks.kinds.friendlycore import math_params  # noqa: E402


def ours(X, params, seed: int):
    """The centres the `friendly_kmeans` kind publishes for the release section `params` on X, its plan's noise
    seeded with `seed` (SeededNoise: the subset coins too, from its secret generator), or None for no core."""
    return fce.friendly_kmeans_centres(X, params, Measure(fce.kmeans_plan(params), SeededNoise(seed)))


def dpkmeans_cost(X, k, eps, T, rng, seed):
    """WCSS of the `kmeans` kind's released centroids at pure eps, mapped back to the data's units."""
    released, _ = fce.dpkmeans_release(X, k, epsilon=eps, iterations=T, rng=rng,
                                       measure=lambda plan: Measure(plan, SeededNoise(seed)))
    return wcss(X, fce.to_data_space(released))


def run(n, runs, args, ppc, *, with_dpkmeans=True):
    params = fce.kmeans_params(n, rho=args.rho, k=args.k, per_cluster=ppc)
    eps = fce.kmeans_plan(params).guarantee(args.delta).epsilon
    fc_cost, dp_cost, dp_free, fails, secs = [], [], [], 0, []
    for rep in range(runs):
        rng = np.random.default_rng([args.seed, n, rep])
        X = fce.mixture(n, args.k, rng)
        ref, _ = kmeans_reference(X, args.k, n_init=10, seed=rep)
        t = time.time()
        centres = ours(X, params, rep)
        secs.append(time.time() - t)
        if centres is None:
            fails += 1
            fc_cost.append(np.inf)
        else:
            fc_cost.append(wcss(X, centres) / ref)
        if with_dpkmeans:
            init = rng.integers(2 ** 31)
            dp_cost.append(dpkmeans_cost(X, args.k, eps, args.iterations, np.random.default_rng(init),
                                         10_000 + rep) / ref)
            # The same run with eps = 1e9 (no noise in effect): separates the noise from the initialisation.
            dp_free.append(dpkmeans_cost(X, args.k, 1e9, args.iterations, np.random.default_rng(init),
                                         10_000 + rep) / ref)
    return params, eps, np.array(fc_cost), np.array(dp_cost), np.array(dp_free), fails, float(np.median(secs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--points-per-cluster", default="40", help="per subset and cluster (sets m); the sweep "
                                                                 "accepts a comma-separated list")
    ap.add_argument("--iterations", type=int, default=5, help="T of the DP k-means comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help="normalised cost vs n (failure at small n)")
    args = ap.parse_args()

    if args.sweep:
        print(f"k={args.k} rho={args.rho} runs={args.runs}; cost / k-means++: median [0.1, 0.9 quantiles]")
        print(f"{'n':>8} {'pts/cl':>6} {'m':>6} {'eps':>6} {'friendly k-means':>28} {'no core':>8} "
              f"{'kmeans release (same eps)':>28}")
        for n in (2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000):
            for ppc in (float(v) for v in args.points_per_cluster.split(",")):
                params, eps, f, d, _, fails, _ = run(n, args.runs, args, ppc)
                fq, dq = fce.quantiles(f), fce.quantiles(d)
                print(f"{n:>8} {ppc:>6g} {params.subsets:>6} {eps:6.3f} {fq[1]:9.4g} "
                      f"[{fq[0]:.4g}, {fq[2]:.4g}]".ljust(67)
                      + f" {fails:>3}/{args.runs:<4} {dq[1]:9.4g} [{dq[0]:.4g}, {dq[2]:.4g}]", flush=True)
        return

    t0 = time.time()
    params, eps, f, d, dfree, fails, secs = run(args.n, args.runs, args, float(args.points_per_cluster))
    fq, dq, zq = fce.quantiles(f), fce.quantiles(d), fce.quantiles(dfree)
    print(f"n={args.n} k={args.k} subsets m={params.subsets} rho={args.rho} (eps={eps:.3f}, delta={args.delta:g} incl. "
          f"delta'={fc.ptr_delta(math_params(params)):g}) runs={args.runs} ({time.time() - t0:.0f} s; friendly k-means "
          f"{secs:.2f} s per run)")
    print(f"  friendly k-means      cost/k-means++ median {fq[1]:.4f}  q10 {fq[0]:.4f}  q90 {fq[2]:.4f}  "
          f"no core {fails}/{args.runs}")
    print(f"  kmeans release (T={args.iterations}, pure eps={eps:.3f}) median {dq[1]:.4f}  q10 {dq[0]:.4f}  "
          f"q90 {dq[2]:.4f}")
    print(f"  kmeans release, same runs with eps=1e9 median {zq[1]:.4f}  q10 {zq[0]:.4f}  q90 {zq[2]:.4f}  "
          f"(its start and T Lloyd steps, noise-free)")
    print(f"RESULT median_normalized_cost={fq[1]:.6g} q10={fq[0]:.6g} q90={fq[2]:.6g}")


if __name__ == "__main__":
    main()
