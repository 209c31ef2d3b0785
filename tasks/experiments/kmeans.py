"""DP k-means experiments: Lee & Kifer Figure 1 (WCSS vs epsilon of DPKM, DPKM + consistency and
DPKM + consistency + MCMC, T = 5) on points scaled to [-1, 1] with the data's min/max as (stand-in) public
bounds and projected onto the unit L1 ball, as the paper's experiments do. WCSS is reported relative to
scikit-learn's k-means++ (best of 10) on the same points."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpalgos import domain, dpkmeans, leekifer, metrics
from dpalgos.noise import simulated

EPSILONS = (0.05, 0.1, 0.25, 0.5, 1.0)
METHODS = ("dpkm", "dpkm+consistency", "dpkm+consistency+mcmc")


def normalise(X: np.ndarray) -> np.ndarray:
    lo, hi = X.min(axis=0), X.max(axis=0)
    return domain.to_unit_l1_ball(X, lo, np.where(hi > lo, hi, lo + 1.0))[0]


def wcss_table(name: str, X: np.ndarray, k: int, *, runs: int, seed: int, epsilons=EPSILONS, iterations: int = 5,
               methods=METHODS) -> pd.DataFrame:
    """One row per (epsilon, run, method): WCSS and WCSS / k-means++."""
    P = normalise(np.asarray(X, dtype=np.float64))
    ref, _ = metrics.kmeans_reference(P, k, seed=0)
    stats = dpkmeans.array_stats(P)
    rng = np.random.default_rng(seed)
    rows = []
    for eps in epsilons:
        for run in range(runs):
            C0, _ = dpkmeans.data_independent_centroids(k, P.shape[1], rng)
            measure = simulated(dpkmeans.plan(epsilon=eps, iterations=iterations), rng)
            traj = dpkmeans.dp_kmeans(stats, C0, iterations=iterations, measure=measure)
            centroids = {"dpkm": traj.final_centroids}
            if "dpkm+consistency" in methods:
                centroids["dpkm+consistency"] = leekifer.refine(traj, mcmc=False).centroids
            if "dpkm+consistency+mcmc" in methods:
                centroids["dpkm+consistency+mcmc"] = leekifer.refine(traj, seed=int(rng.integers(2**31))).centroids
            for m, C in centroids.items():
                w = metrics.wcss(P, C)
                rows.append({"dataset": name, "epsilon": eps, "run": run, "method": m, "wcss": w, "ratio": w / ref})
    return pd.DataFrame(rows)
