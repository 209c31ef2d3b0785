"""Histogram experiments of Lee, Wang & Kifer §5.2 (Figures 5.2.1 and 5.2.2): unit-length and range-query
MSE of LM(L), LM(H), HTree, Privelet, EFPA and ADMM on 1-D histograms: admm_l1 is the true L1 (maximum
likelihood) problem, admm_elastic the elastic net alpha = 0.9 of the paper's experiments (its "ADMM(l1)").

Every method returns a function answering ranges [lo, hi) of bins; answers of methods without consistent
non-negative output are replaced by 0 when negative, as the paper does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from dpalgos import admm, baselines
from dpalgos.hierarchy import Tree, tree_plan
from dpalgos.noise import simulated

EPSILONS = tuple(round(0.1 * i, 1) for i in range(1, 11))
RANGE_EPSILONS = (0.1, 1.0)
METHODS = ("lm", "lm_h", "htree", "privelet", "efpa", "admm_l1", "admm_elastic")
RANGES_PER_LENGTH = 1000

Answer = Callable[[np.ndarray, np.ndarray], np.ndarray]


def padded(h: np.ndarray, branching: int) -> np.ndarray:
    """Pad a histogram with empty bins to a power of the branching factor (the padding holds no records)."""
    m = 1
    while m < h.size:
        m *= branching
    return np.concatenate([np.asarray(h, dtype=np.float64), np.zeros(m - h.size)])


def _prefix(x: np.ndarray) -> Answer:
    cs = np.concatenate([[0.0], np.cumsum(x)])
    return lambda lo, hi: np.maximum(cs[hi] - cs[lo], 0.0)


def release(method: str, h: np.ndarray, *, epsilon: float, rng: np.random.Generator, branching: int = 16) -> Answer:
    """Run one method on histogram h (length a power of `branching` for the tree methods)."""
    if method == "lm":
        return _prefix(baselines.lm(h, epsilon=epsilon, rng=rng))
    if method == "privelet":
        return _prefix(baselines.privelet(h, epsilon=epsilon, rng=rng))
    if method == "efpa":
        return _prefix(baselines.efpa(h, epsilon=epsilon, rng=rng))
    tree = Tree(h.size, branching)
    if method == "htree":
        return _prefix(baselines.htree(tree, h, epsilon=epsilon, rng=rng))
    noisy = simulated(tree_plan(tree, epsilon=epsilon), rng)("tree", tree.aggregate(h))
    if method == "lm_h":
        return lambda lo, hi: np.maximum(tree.range_answer(noisy, lo, hi), 0.0)
    if method in ("admm_l1", "admm_elastic"):
        res = admm.solve_projection(noisy, tree.projection(), penalty=method.removeprefix("admm_"),
                                    scale=tree.levels / epsilon, x0=tree.htree(noisy))
        return _prefix(np.maximum(tree.leaves_of(res.x), 0.0))
    raise ValueError(f"unknown method {method!r}")


def unit_mse(answer: Answer, h: np.ndarray, n: int) -> float:
    lo = np.arange(n)
    return float(np.mean((answer(lo, lo + 1) - h[:n]) ** 2))


def unit_query_table(name: str, h: np.ndarray, *, runs: int, seed: int, epsilons=EPSILONS, methods=METHODS,
                     branching: int = 16) -> pd.DataFrame:
    """Figure 5.2.1: MSE of all unit-length queries per method and epsilon (mean over runs)."""
    hp = padded(h, branching)
    rng = np.random.default_rng(seed)
    rows = [{"dataset": name, "epsilon": eps, "method": m, "run": r,
             "mse": unit_mse(release(m, hp, epsilon=eps, rng=rng, branching=branching), hp, h.size)}
            for eps in epsilons for m in methods for r in range(runs)]
    return pd.DataFrame(rows)


def range_query_table(name: str, h: np.ndarray, *, runs: int, seed: int, epsilons=RANGE_EPSILONS, methods=METHODS,
                      branching: int = 16) -> pd.DataFrame:
    """Figure 5.2.2: MSE of 1,000 random ranges of each length 2^1 .. 2^(h-2) (h the binary tree height)."""
    hp = padded(h, branching)
    rng = np.random.default_rng(seed)
    height = int(np.ceil(np.log2(h.size))) + 1
    lengths = [2 ** j for j in range(1, height - 1) if 2 ** j <= h.size]
    cs = np.concatenate([[0.0], np.cumsum(hp)])
    starts = {L: rng.integers(0, h.size - L + 1, RANGES_PER_LENGTH) for L in lengths}
    rows = []
    for eps in epsilons:
        for m in methods:
            for r in range(runs):
                answer = release(m, hp, epsilon=eps, rng=rng, branching=branching)
                for L, lo in starts.items():
                    err = answer(lo, lo + L) - (cs[lo + L] - cs[lo])
                    rows.append({"dataset": name, "epsilon": eps, "method": m, "run": r, "range_length": L,
                                 "mse": float(np.mean(err ** 2))})
    return pd.DataFrame(rows)
