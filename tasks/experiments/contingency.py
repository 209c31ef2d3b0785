"""Contingency-table experiment of Lee, Wang & Kifer §5.1 (Figure 5.1.1): cell MSE vs epsilon of LM,
ADMM, Privelet and MWEM when the marginals M0, M1 or M2 are public, with the zero-budget maximum-entropy
table and the empirical-Bayes table.

admm_l1 is the true L1 (maximum-likelihood) problem, admm_elastic the elastic net of the paper's experiments
(alpha = 0.9, rho = 2; the paper's "ADMM(l1)"), admm_l2 the L2 variant; all keep the table non-negative and
consistent with the public marginals. max_entropy is the maximum-entropy table of the public marginals alone
(no budget spent); empirical_bayes is `contingency.empirical_bayes_table` on the same noisy cells as ADMM. Each of
ours is the `contingency` kind's published `count` column under its spec (`OURS`), computed by the kind's own
postprocessing function (`tasks.kinds.contingency.released_table`) from its plan's noise.
MWEM knows the number of records (M0) and answers the workload of all marginal cells of order 1 and 2 and all
cells, with 10 rounds. Negative cells of LM and Privelet are set to 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpalgos import baselines, contingency
from dpalgos.noise import simulated

EPSILONS = tuple(round(0.1 * i, 1) for i in range(1, 11))
METHODS = ("lm", "admm_l1", "admm_elastic", "admm_l2", "privelet", "mwem", "max_entropy", "empirical_bayes")
MWEM_ROUNDS = 10


def load_table(path: str | Path) -> tuple[contingency.Table, np.ndarray]:
    """A flattened table file (one row per cell, attribute columns then `count`) as a Table and its counts."""
    frame = pd.read_csv(path, dtype=str)
    names = [c for c in frame.columns if c != "count"]
    levels = tuple(tuple(sorted(frame[c].unique())) for c in names)
    table = contingency.Table(tuple(names), levels)
    idx = np.ravel_multi_index([frame[c].map({lv: i for i, lv in enumerate(lv_)}).to_numpy()
                                for c, lv_ in zip(names, levels)], table.shape)
    x = np.zeros(table.size)
    np.add.at(x, idx, frame["count"].astype(float).to_numpy())
    return table, x


#: Our estimators: each is the `contingency` kind's released `count` column under the spec's release section
#: (the kind's defaults for everything else; admm_elastic is the kind's default release).
OURS = {"admm_l1": {"penalty": "l1"}, "admm_elastic": {}, "admm_l2": {"penalty": "l2"},
        "empirical_bayes": {"estimator": "empirical_bayes"}}


def contingency_spec(table: contingency.Table, epsilon: float, **release):
    """The `contingency` release spec of an experiment on `table` (its attributes and levels, public)."""
    from tasks.spec import parse_spec

    return parse_spec({"dataset": {"id": "experiment", "path": "experiment.parquet",
                                   "categories": {n: list(lv) for n, lv in zip(table.names, table.levels)}},
                       "release": {"kind": "contingency", "epsilon": epsilon, **release}})


def noisy_cells(spec, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The kind's measurement of the exact cells x: its plan's noise, simulated (seeded numpy, not private)."""
    from tasks.kinds.contingency import KIND

    return simulated(KIND.bind(spec).plan, rng)("cells", x)


def released_count(spec, noisy: np.ndarray, marginals, b: np.ndarray) -> np.ndarray:
    """The table the kind publishes (`count`: its estimator's non-negative cells) from the noisy cells and the
    public marginals (`tasks.kinds.contingency.released_table`, the postprocessing's own function)."""
    from tasks.kinds.contingency import KIND, released_table, table_of

    return released_table(spec.release, table_of(spec), noisy, marginals, b, KIND.bind(spec).plan["cells"].scale).count


def estimate(method: str, table: contingency.Table, x: np.ndarray, order: int, *, epsilon: float,
             rng: np.random.Generator) -> np.ndarray:
    marginals = table.marginals(order)
    A = table.constraint_matrix(marginals)
    b = A @ x
    if method == "max_entropy":
        return contingency.max_entropy(A, b)
    if method == "lm":
        return np.maximum(baselines.lm(x, epsilon=epsilon, rng=rng), 0.0)
    if method == "privelet":
        return np.maximum(baselines.privelet(x, epsilon=epsilon, rng=rng), 0.0)
    if method == "mwem":
        return baselines.mwem(x, contingency.mwem_workload(table), epsilon=epsilon, rounds=MWEM_ROUNDS,
                              total=float(x.sum()), rng=rng)
    spec = contingency_spec(table, epsilon, **OURS[method])
    return released_count(spec, noisy_cells(spec, x, rng), marginals, b)


def table_mse(name: str, table: contingency.Table, x: np.ndarray, *, runs: int, seed: int, epsilons=EPSILONS,
              orders=(0, 1, 2), methods=METHODS) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"dataset": name, "known": f"M{order}", "epsilon": eps, "method": m, "run": r,
             "mse": float(np.mean((estimate(m, table, x, order, epsilon=eps, rng=rng) - x) ** 2))}
            for order in orders for eps in epsilons for m in methods for r in range(runs)]
    return pd.DataFrame(rows)
