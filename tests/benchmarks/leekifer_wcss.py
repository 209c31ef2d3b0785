"""Lee & Kifer postprocessing: mean WCSS / k-means++ over runs of DP k-means (T = 5) without and with
consistency + MCMC refinement, and what the kind releases (the refinement where it is expected to help), per
epsilon. Every trajectory is the `kmeans` kind's own measurement of its spec at these settings (the first round
seeding by the kind's default rule; --seeding none: Lee & Kifer's data-independent start, the spec's
`seeding: none`), and `released` is the kind's own postprocessing of it (`tasks.experiments.kmeans`). Points are
scaled to [-1, 1] with the data's min/max as bounds and projected onto the domain (--domain; default the kind's
rule). The figures are measured on the scaled points before the projection
(RESULT), the projected-space table is printed above it, with the single-centroid baseline. Last line:
    RESULT eps=0.05,0.1,0.25,0.5,1.0 dpkm=r1,..,r5 refined=q1,..,q5 released=s1,..,s5 single_centroid=b

    python tests/benchmarks/leekifer_wcss.py --data ../shared/data/kmeans/s1.txt --k 15 --runs 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import load_numeric_csv  # noqa: E402

from tasks.experiments.kmeans import wcss_table  # noqa: E402


def ours_seeding(choice: str) -> bool | None:
    """The `seeding` argument of `wcss_table` for --seeding (None: the kind's default rule)."""
    return {"default": None, "oversampled": True, "none": False}[choice]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="CSV of numeric columns (header optional)")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--eps", default="0.05,0.1,0.25,0.5,1.0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--domain", default=None, help="l1_ball, box or l2_ball (default: the kind's rule)")
    ap.add_argument("--seeding", choices=("default", "oversampled", "none"), default="default",
                    help="the spec's seeding (default: the kind's rule, oversampled for T >= 2)")
    args = ap.parse_args()
    epsilons = [float(e) for e in args.eps.split(",")]
    X = load_numeric_csv(args.data)
    t0 = time.perf_counter()
    table = wcss_table(Path(args.data).stem, X, args.k, runs=args.runs, seed=args.seed, epsilons=epsilons,
                       methods=("dpkm", "dpkm+consistency+mcmc", "released"), domain_name=args.domain,
                       seeding=ours_seeding(args.seeding))
    print(f"{args.data}: n={len(X)} d={X.shape[1]} k={args.k}, domain {table['domain'].iloc[0]}, seeding "
          f"{args.seeding}, {args.runs} runs, "
          f"{time.perf_counter() - t0:.0f}s")
    fmt = lambda v: f"{v:.3f}"
    print("WCSS / k-means++ in the projected space:")
    print(table.groupby(["method", "epsilon"])["ratio_projected"].mean().unstack("epsilon").dropna()
          .to_string(float_format=fmt))
    means = table.groupby(["method", "epsilon"])["ratio"].mean()
    print("WCSS / k-means++ on the [-1, 1]-scaled data:")
    print(means.unstack("epsilon").to_string(float_format=fmt))
    row = lambda m: ",".join(fmt(means[m, e]) for e in epsilons)
    print(f"RESULT eps={args.eps.replace(' ', '')} dpkm={row('dpkm')} refined={row('dpkm+consistency+mcmc')} "
          f"released={row('released')} single_centroid={means['single_centroid', epsilons[0]]:.3f}")


if __name__ == "__main__":
    main()
