"""Query MSE of LM (identity Laplace, negatives set to 0), LM(H) (the noisy tree's own range answers), HTree (Hay
et al. least squares on the noisy tree) and ADMM (Lee, Wang & Kifer Algorithm 3, Htree projection: admm_l1 the
true L1 problem, admm_elastic the elastic net alpha = 0.9 of the paper, rho = 2) on a 1-D histogram, at epsilon 0.1
and 1.0, mean over runs, for three workloads on the same releases:
  unit    every unit-length query (one bin): where the plain Laplace mechanism is optimal (each bin measured once
          with the whole budget), so this workload alone hides what the tree methods are for;
  ranges  1,000 random ranges of each length 2^1 .. n (one column per length);
  random  1,000 random ranges [lo, hi), lo < hi uniform over the pairs of bin boundaries (the range workload).
Tree methods use a 16-ary tree (--branching); the histogram is padded with empty bins to a power of the branching
factor (the padding is not scored). Last line (per method, one figure per epsilon):
    RESULT eps=0.1,1.0 unit_<method>=<m1>,<m2> ... random_<method>=<m1>,<m2> ...

    python tests/benchmarks/histogram_mse.py --data ../shared/data/histograms/NETTRACE.n4096.npy
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tasks.experiments.histogram import workload_table

METHODS = ("lm", "lm_h", "htree", "admm_l1", "admm_elastic")


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
    table = workload_table("data", h.astype(np.float64), runs=args.runs, seed=args.seed, epsilons=epsilons,
                           methods=METHODS, branching=args.branching)
    print(f"{args.data}: {h.size} bins, {h.sum():.0f} records, {np.mean(h == 0):.1%} empty; "
          f"{args.runs} runs; {time.perf_counter() - t0:.1f}s")
    means = table.groupby(["epsilon", "workload", "method"])["mse"].mean()
    order = ["unit"] + [f"length {L}" for L in sorted({int(x) for x in table["range_length"] if x > 1})] + ["random"]
    with pd.option_context("display.width", 200):
        for eps in epsilons:
            grid = means[eps].unstack("method").reindex(order)[list(METHODS)]
            print(f"\nepsilon {eps:g}: MSE per workload (rows) and method (columns); best in each row marked *")
            print(grid.apply(lambda row: [f"{v:.4g}{'*' if v == row.min() else ''}" for v in row], axis=1,
                             result_type="expand").set_axis(list(METHODS), axis=1).to_string())
    parts = [f"{w}_{m}={','.join(f'{means[e, w, m]:.4g}' for e in epsilons)}"
             for w in ("unit", "random") for m in METHODS]
    print(f"RESULT eps={','.join(f'{e:g}' for e in epsilons)} " + " ".join(parts))


if __name__ == "__main__":
    main()
