"""Lee & Kifer postprocessing: mean WCSS / k-means++ over runs of DP k-means (T = 5) without and with
consistency + MCMC refinement, per epsilon. Points are scaled with the data's min/max as bounds and projected
onto the unit L1 ball. Last line:
    RESULT eps=0.05,0.1,0.25,0.5,1.0 dpkm=r1,..,r5 refined=q1,..,q5

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="CSV of numeric columns (header optional)")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--eps", default="0.05,0.1,0.25,0.5,1.0")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    epsilons = [float(e) for e in args.eps.split(",")]
    X = load_numeric_csv(args.data)
    t0 = time.perf_counter()
    table = wcss_table(Path(args.data).stem, X, args.k, runs=args.runs, seed=args.seed, epsilons=epsilons,
                       methods=("dpkm", "dpkm+consistency+mcmc"))
    means = table.groupby(["method", "epsilon"])["ratio"].mean()
    print(f"{args.data}: n={len(X)} d={X.shape[1]} k={args.k}, {args.runs} runs, {time.perf_counter() - t0:.0f}s")
    print(means.unstack("epsilon").to_string(float_format=lambda v: f"{v:.3f}"))
    dpkm = ",".join(f"{means['dpkm', e]:.3f}" for e in epsilons)
    refined = ",".join(f"{means['dpkm+consistency+mcmc', e]:.3f}" for e in epsilons)
    print(f"RESULT eps={args.eps.replace(' ', '')} dpkm={dpkm} refined={refined}")


if __name__ == "__main__":
    main()
