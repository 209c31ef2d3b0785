"""DP k-means (Lee & Kifer Algorithm 1) utility: mean WCSS / k-means++ over runs, per epsilon.

Protocol of the spine issue: attributes scaled to [-1, 1] with the data's min/max as (stand-in) public bounds,
projected onto the domain (--domain; default the kind's rule from the dimension); T = 5; data-independent
initial centroids; reference = scikit-learn KMeans (k-means++, best of 10) on the same points. WCSS is
measured on the scaled points before the projection (RESULT) and in the projected space (printed), beside
the single-centroid baseline (the scaled points' mean, non-private). Last line:
    RESULT eps=0.05,0.1,0.25,0.5,1.0 wcss_ratio=r1,r2,r3,r4,r5 single_centroid=b

    python tests/benchmarks/dpkm_wcss.py --data ../shared/data/kmeans/s1.txt --k 15 --runs 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import load_numeric_csv  # noqa: E402

from dpalgos import domain, dpkmeans, metrics  # noqa: E402
from dpalgos.noise import ExactNoise, Measure, simulated  # noqa: E402
from tasks.experiments.kmeans import references, scaled  # noqa: E402

EPSILONS = (0.05, 0.1, 0.25, 0.5, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="CSV of numeric columns (header optional)")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--eps", default=",".join(map(str, EPSILONS)), help="comma-separated epsilons")
    ap.add_argument("--seed", type=int, default=None, help="benchmark reproducibility (default: OS entropy)")
    ap.add_argument("--exact", action="store_true", help="draw with OpenDP's exact samplers, as releases do")
    ap.add_argument("--domain", default=None, help="l1_ball, box or l2_ball (default: the kind's rule)")
    args = ap.parse_args()
    epsilons = [float(e) for e in args.eps.split(",")]

    B = scaled(load_numeric_csv(args.data))
    dom = args.domain or domain.default_domain(B.shape[1])
    P = domain.project(B, dom)
    t0 = time.perf_counter()
    ref = references(B, P, args.k)
    print(f"data {args.data}: n={len(P)} d={P.shape[1]} k={args.k}, domain {dom}; k-means++ WCSS={ref['kmeanspp']:.6g} "
          f"on the scaled data, {ref['kmeanspp_projected']:.6g} projected; single centroid "
          f"{ref['single_centroid'] / ref['kmeanspp']:.3f} ({time.perf_counter() - t0:.1f}s)")
    rng = np.random.default_rng(args.seed)
    stats = dpkmeans.array_stats(P)
    means = []
    for eps in epsilons:
        ratios, projected = [], []
        t0 = time.perf_counter()
        for _ in range(args.runs):
            C0, _ = dpkmeans.data_independent_centroids(args.k, P.shape[1], rng, domain=dom)
            plan = dpkmeans.plan(epsilon=eps, iterations=args.iterations, k=args.k, d=P.shape[1], domain=dom)
            measure = Measure(plan, ExactNoise()) if args.exact else simulated(plan, rng)
            C = dpkmeans.dp_kmeans(stats, C0, iterations=args.iterations, measure=measure, domain=dom).final_centroids
            ratios.append(metrics.wcss(B, C) / ref["kmeanspp"])
            projected.append(metrics.wcss(P, C) / ref["kmeanspp_projected"])
        means.append(float(np.mean(ratios)))
        print(f"eps={eps:<5g} mean WCSS/k-means++ = {means[-1]:.3f}  (sd {np.std(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}; projected space {np.mean(projected):.3f}; "
              f"{time.perf_counter() - t0:.2f}s)", flush=True)
    print(f"RESULT eps={args.eps.replace(' ', '')} wcss_ratio={','.join(f'{m:.3f}' for m in means)} "
          f"single_centroid={ref['single_centroid'] / ref['kmeanspp']:.3f}")


if __name__ == "__main__":
    main()
