"""Matrix-mechanism experiments of Lee, Wang & Kifer §5.3 (Figures 5.3.1 and 5.3.2), domain 1024.

Strategy: the binary tree (hierarchical) for every workload; MM(l2) reconstructs by least squares, mm_l1 by
Algorithm 4 with the true L1 (maximum-likelihood) penalty, mm_elastic by Algorithm 4 with the elastic net
alpha = 0.9 of the paper's experiments (the paper's "MM(l1)"). Figure 5.3.1: the random +-1 workload vs epsilon, with
LM, HTree and Privelet answering the workload from their histogram estimates. Figure 5.3.2: identity, predicate and
all-range workloads at eps 0.1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpalgos import baselines
from dpalgos import matrix_mechanism as mm
from dpalgos.hierarchy import Tree
from dpalgos.noise import simulated

DOMAIN = 1024
EPSILONS = tuple(round(0.1 * i, 1) for i in range(1, 11))
WORKLOADS = ("identity", "predicate", "all_range")


def coarsen(h: np.ndarray, size: int = DOMAIN) -> np.ndarray:
    """Aggregate a histogram to `size` bins (sums of consecutive bins; the length must be a multiple)."""
    h = np.asarray(h, dtype=np.float64)
    if h.size % size:
        raise ValueError(f"histogram length {h.size} is not a multiple of {size}")
    return h.reshape(size, -1).sum(axis=1)


def estimate(method: str, x: np.ndarray, *, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    if method == "lm":
        return baselines.lm(x, epsilon=epsilon, rng=rng)
    if method == "htree":
        return baselines.htree(Tree(x.size, 2), x, epsilon=epsilon, rng=rng)
    if method == "privelet":
        return baselines.privelet(x, epsilon=epsilon, rng=rng)
    A = mm.hierarchical_strategy(x.size)
    noisy = simulated(mm.strategy_plan(A, epsilon=epsilon), rng)("strategy", A @ x)
    if method == "mm_l2":
        return mm.reconstruct_l2(A, noisy)
    if method in ("mm_l1", "mm_elastic"):
        return mm.reconstruct_l1(A, noisy, noise_scale=mm.sensitivity(A) / epsilon,
                                 penalty="l1" if method == "mm_l1" else "elastic").x
    raise ValueError(f"unknown method {method!r}")


def workload_mse(name: str, x: np.ndarray, *, runs: int, seed: int, workloads=WORKLOADS, epsilons=(0.1,),
                 methods=("mm_l1", "mm_elastic", "mm_l2"), queries: int = 512) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for wk in workloads:
        W = mm.workload(wk, x.size, queries=queries, seed=seed)
        for eps in epsilons:
            for m in methods:
                for r in range(runs):
                    xe = estimate(m, x, epsilon=eps, rng=rng)
                    if wk == "plus_minus_one":
                        mse = W.mse(xe, x)
                    else:  # counting queries: negative answers are replaced by 0
                        mse = float(np.mean((np.maximum(W.answer(xe), 0.0) - W.answer(x)) ** 2))
                    rows.append({"dataset": name, "workload": wk, "epsilon": eps, "method": m, "run": r, "mse": mse})
    return pd.DataFrame(rows)
