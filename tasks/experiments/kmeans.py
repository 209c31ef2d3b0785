"""DP k-means experiments: Lee & Kifer Figure 1 (WCSS vs epsilon of DPKM, DPKM + consistency and
DPKM + consistency + MCMC, T = 5), and what the `kmeans` kind releases (the refinement only where
`leekifer.refinement_expected_to_help` says so).

Points are scaled to [-1, 1] with the data's min/max as (stand-in) public bounds, then projected onto the
release's domain (default: `domain.default_domain` of the dimension). Every figure is reported twice:
`ratio`, the WCSS on the [-1, 1]-scaled points before any projection over that of scikit-learn's k-means++
(best of 10) on the same points (the honest figure: a projection that distorts the data cannot hide it), and
`ratio_projected`, both measured in the projected space (the paper's figure). A `single_centroid` row per
epsilon and run is the WCSS of the one mean of the scaled points (non-private), the baseline every DP
method must beat to be of any use."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpalgos import domain, dpkmeans, leekifer, metrics
from dpalgos.noise import simulated

EPSILONS = (0.05, 0.1, 0.25, 0.5, 1.0)
METHODS = ("dpkm", "dpkm+consistency", "dpkm+consistency+mcmc", "released")


def stand_in_bounds(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The data's min/max as the public bounds of an experiment (a constant column gets a unit range)."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    return lo, np.where(hi > lo, hi, lo + 1.0)


def scaled(X: np.ndarray) -> np.ndarray:
    """The points scaled to [-1, 1] with `stand_in_bounds`: where every k-means figure is measured."""
    return domain.scale_to_unit_box(X, *stand_in_bounds(X))[0]


def normalise(X: np.ndarray, name: str = "l1_ball") -> np.ndarray:
    """The points as the release sees them: scaled to [-1, 1], projected onto the domain `name`."""
    return domain.project(scaled(X), name)


def references(B: np.ndarray, P: np.ndarray, k: int) -> dict[str, float]:
    """Non-private references: k-means++ on the scaled points B and on the projected points P, and the WCSS
    of B's single mean."""
    return {"kmeanspp": metrics.kmeans_reference(B, k, seed=0)[0],
            "kmeanspp_projected": metrics.kmeans_reference(P, k, seed=0)[0],
            "single_centroid": metrics.wcss(B, B.mean(axis=0, keepdims=True))}


def wcss_table(name: str, X: np.ndarray, k: int, *, runs: int, seed: int, epsilons=EPSILONS, iterations: int = 5,
               methods=METHODS, domain_name: str | None = None, seeding: bool = False) -> pd.DataFrame:
    """One row per (epsilon, run, method): WCSS and WCSS / k-means++ on the scaled points (`wcss`, `ratio`)
    and in the projected space (`wcss_projected`, `ratio_projected`), plus the single-centroid baseline.
    `seeding`: the first of the T rounds seeds (`dpkmeans.oversampled_seeds`); off, Lee & Kifer's setting."""
    B = scaled(np.asarray(X, dtype=np.float64))
    dom = domain_name or domain.default_domain(B.shape[1])
    P = domain.project(B, dom)
    ref = references(B, P, k)
    stats = dpkmeans.array_stats(P)
    rng = np.random.default_rng(seed)
    rows = []
    for eps in epsilons:
        for run in range(runs):
            traj = run_dpkm(stats, k, P.shape[1], eps, iterations, dom, rng, seeding)
            centroids = method_centroids(traj, methods, int(rng.integers(2 ** 31)))
            row = {"dataset": name, "domain": dom, "epsilon": eps, "run": run}
            for m, C in centroids.items():
                rows.append({**row, "method": m, **scores(B, P, C, ref)})
            rows.append({**row, "method": "single_centroid", "wcss": ref["single_centroid"],
                         "ratio": ref["single_centroid"] / ref["kmeanspp"],
                         "wcss_projected": np.nan, "ratio_projected": np.nan})
    return pd.DataFrame(rows)


def run_dpkm(stats, k: int, d: int, eps: float, iterations: int, dom: str, rng, seeding: bool = False
             ) -> dpkmeans.Trajectory:
    """One DP k-means trajectory (T rounds, the first seeding if `seeding`) with simulated (seeded, not
    private) noise of the domain's plan."""
    measure = simulated(dpkmeans.plan(epsilon=eps, iterations=iterations, k=k, d=d, domain=dom, seeding=seeding), rng)
    if seeding:
        C0 = dpkmeans.oversampled_seeds(stats, k, d, rng, measure=measure, domain=dom).initial_centroids
    else:
        C0, _ = dpkmeans.data_independent_centroids(k, d, rng, domain=dom)
    return dpkmeans.dp_kmeans(stats, C0, iterations=iterations - seeding, measure=measure, domain=dom)


def method_centroids(traj: dpkmeans.Trajectory, methods, seed: int) -> dict[str, np.ndarray]:
    """The centroids of each method; `released` is what the kind releases (the refinement only where it is
    expected to help)."""
    out = {"dpkm": traj.final_centroids}
    if "dpkm+consistency" in methods:
        out["dpkm+consistency"] = leekifer.refine(traj, mcmc=False).centroids
    helps = leekifer.refinement_expected_to_help(traj)
    if "dpkm+consistency+mcmc" in methods or ("released" in methods and helps):
        out["dpkm+consistency+mcmc"] = leekifer.refine(traj, seed=seed).centroids
    if "released" in methods:
        out["released"] = out["dpkm+consistency+mcmc"] if helps else traj.final_centroids
    return {m: C for m, C in out.items() if m in methods}


def scores(B: np.ndarray, P: np.ndarray, C: np.ndarray, ref: dict[str, float]) -> dict[str, float]:
    w, wp = metrics.wcss(B, C), metrics.wcss(P, C)
    return {"wcss": w, "ratio": w / ref["kmeanspp"], "wcss_projected": wp,
            "ratio_projected": wp / ref["kmeanspp_projected"]}
