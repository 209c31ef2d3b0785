"""DP k-means (Lee & Kifer Algorithm 1) utility: mean WCSS / k-means++ over runs, per epsilon.

Protocol of the spine issue: attributes scaled to [-1, 1] with the data's min/max as (stand-in) public bounds,
projected onto the domain (--domain; default the kind's rule from the dimension); T = 5; data-independent
initial centroids; reference = scikit-learn KMeans (k-means++, best of 10) on the same points. What is scored is
the `kmeans` kind's release with `seeding: none` and `postprocess: []` (Algorithm 1 as the paper, its last noisy
iterate published: centroids.parquet), computed by the kind's own code (`ours`); the kind's default release (seeded,
refined where it helps) is scored by kmeans_peers.py and leekifer_wcss.py. WCSS is measured on the scaled points
before the projection (RESULT) and in the projected space (printed), beside the single-centroid baseline (the
scaled points' mean, non-private). Last line:
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

from dpalgos import dpkmeans, metrics  # noqa: E402
from dpalgos.noise import ExactNoise, Measure  # noqa: E402
from tasks.experiments.kmeans import draw, kmeans_spec, references, release_points, released, scaled  # noqa: E402
from tasks.kinds import kmeans as kmeans_kind  # noqa: E402

EPSILONS = (0.05, 0.1, 0.25, 0.5, 1.0)


def spec_of(k: int, d: int, eps: float, iterations: int, dom: str | None):
    """The release scored: Algorithm 1 from data-independent centroids, its last iterate published."""
    return kmeans_spec(k, d, eps, iterations=iterations, domain_name=dom, seeding=False, postprocess=[])


def ours(X: np.ndarray, k: int, eps: float, iterations: int, dom: str | None, rng: np.random.Generator,
         exact: bool = False) -> np.ndarray:
    """The centroids the kind publishes for `spec_of` on X (the data's min/max as public bounds), one run: its
    measurement on the points as its prepare writes them, the plan's noise simulated from `rng` (OpenDP's exact
    samplers with `exact`), its postprocessing."""
    spec = spec_of(k, X.shape[1], eps, iterations, dom)
    measure = Measure(kmeans_kind.KIND.bind(spec).plan, ExactNoise()) if exact else None
    return released(spec, draw(spec, dpkmeans.array_stats(release_points(X, spec)), rng, measure))


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

    X = load_numeric_csv(args.data)
    B = scaled(X)
    spec = spec_of(args.k, B.shape[1], epsilons[0], args.iterations, args.domain)
    dom = kmeans_kind.domain_of(spec)
    P = release_points(X, spec)
    t0 = time.perf_counter()
    ref = references(B, P, args.k)
    print(f"data {args.data}: n={len(P)} d={P.shape[1]} k={args.k}, domain {dom}; k-means++ WCSS={ref['kmeanspp']:.6g} "
          f"on the scaled data, {ref['kmeanspp_projected']:.6g} projected; single centroid "
          f"{ref['single_centroid'] / ref['kmeanspp']:.3f} ({time.perf_counter() - t0:.1f}s)")
    rng = np.random.default_rng(args.seed)
    means = []
    for eps in epsilons:
        ratios, projected = [], []
        t0 = time.perf_counter()
        for _ in range(args.runs):
            C = ours(X, args.k, eps, args.iterations, args.domain, rng, args.exact)
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
