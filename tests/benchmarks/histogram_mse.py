"""Unit-length query MSE of LM (identity Laplace, negatives set to 0), HTree (Hay et al. least squares on the
noisy tree) and ADMM (Lee, Wang & Kifer Algorithm 3, Htree projection: admm_l1 the true L1, admm_elastic the
elastic net alpha=0.9 of the paper, rho=2) on a 1-D histogram, at epsilon 0.1 and 1.0, mean over runs. Tree methods use a 16-ary tree (--branching); the
histogram is padded with empty bins to a power of the branching factor (the padding is not scored).
Last line:
    RESULT eps=0.1,1.0 lm=<m1>,<m2> htree=<m1>,<m2> admm_l1=<m1>,<m2> admm_elastic=<m1>,<m2>

    python tests/benchmarks/histogram_mse.py --data ../shared/data/histograms/NETTRACE.n4096.npy
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tasks.experiments.histogram import unit_query_table

METHODS = ("lm", "htree", "admm_l1", "admm_elastic")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help=".npy file of a 1-D histogram of counts")
    ap.add_argument("--eps", default="0.1,1.0")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--branching", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    h = np.load(args.data)
    if h.ndim != 1:
        print(f"note: {args.data} has shape {h.shape}; flattened to 1-D")
        h = h.reshape(-1)
    if np.any(h < 0) or not np.all(np.isfinite(h)):
        raise SystemExit(f"{args.data}: a histogram needs finite non-negative counts")
    epsilons = [float(e) for e in args.eps.split(",")]
    t0 = time.perf_counter()
    table = unit_query_table("data", h.astype(np.float64), runs=args.runs, seed=args.seed, epsilons=epsilons,
                             methods=METHODS, branching=args.branching)
    means = table.groupby(["method", "epsilon"])["mse"].mean()
    print(f"{args.data}: {h.size} bins, {h.sum():.0f} records, {np.mean(h == 0):.1%} empty; "
          f"{args.runs} runs; {time.perf_counter() - t0:.1f}s")
    print(means.unstack("epsilon").to_string(float_format=lambda v: f"{v:.4g}"))
    parts = " ".join(f"{m}={','.join(f'{means[m, e]:.4g}' for e in epsilons)}" for m in METHODS)
    print(f"RESULT eps={args.eps.replace(' ', '')} {parts}")


if __name__ == "__main__":
    main()
