"""Clustering accuracy on binarised MNIST (60,000 training images) of DP kernel k-means with random Fourier
features against plain DP k-means on the raw records (Acs et al. Figure 3 setting: k = 10, 20 iterations,
delta = 1/N, sigma calibrated with dp_accounting; mean over runs). The kernel figure is the `kernel_kmeans` kind's
release (its own clustering on the images as sets of on pixels, the test split as its public sample, every record
assigned by its published rule: tasks/experiments/mnist.py `kernel_release`); plain DP k-means is the paper's
baseline. Last line:
    RESULT eps=<e> acc_kernel=<a> acc_plain=<b>

    python tests/benchmarks/kernel_kmeans_mnist.py --eps 0.5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tasks.experiments.mnist import accuracy_table, load_binarised

MNIST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eps", type=float, default=0.5)
    ap.add_argument("--d", type=int, default=200, help="random Fourier features")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=str(MNIST), help="folder of the MNIST .gz files")
    args = ap.parse_args()
    X, y = load_binarised(args.data, "train")
    public, _ = load_binarised(args.data, "t10k")
    t0 = time.perf_counter()
    table = accuracy_table(X, y, public, runs=args.runs, seed=args.seed, epsilons=(args.eps,), dims=(args.d,))
    acc = table.groupby("method")["accuracy"].agg(["mean", "std", "min", "max"])
    print(f"MNIST train: {X.shape}, {args.runs} runs, {time.perf_counter() - t0:.0f}s\n{acc.to_string()}")
    print(f"RESULT eps={args.eps:g} acc_kernel={acc.loc[f'kernel d={args.d}', 'mean']:.4f} "
          f"acc_plain={acc.loc['plain', 'mean']:.4f}")


if __name__ == "__main__":
    main()
