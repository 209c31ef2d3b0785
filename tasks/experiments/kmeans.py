"""DP k-means experiments: Lee & Kifer Figure 1 (WCSS vs epsilon of DPKM, DPKM + consistency and
DPKM + consistency + MCMC, T = 5), and what the `kmeans` kind releases (the refinement only where
`leekifer.refinement_released` says so). Every trajectory is the kind's own
measurement (`tasks.kinds.kmeans.measure_trajectory` on the points as its prepare writes them, its plan's noise
simulated) and `released` its own postprocessing (`tasks.kinds.kmeans.released_centroids`): what a release would
publish.

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
from tasks.kinds import kmeans as kmeans_kind

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


def kmeans_spec(k: int, d: int, epsilon: float, *, iterations: int = 5, domain_name: str | None = None,
                seeding: bool | None = None, postprocess: list[str] | None = None,
                bounds: tuple[np.ndarray, np.ndarray] | None = None):
    """The `kmeans` release spec of an experiment: columns c0..c{d-1} with public `bounds` (default [-1, 1], the
    scaled points), the kind's defaults for everything not given (domain: `domain.default_domain`; seeding: the
    kind's rule of T, or oversampled / none; postprocess: consistency and MCMC where `leekifer.refinement_released`
    says so)."""
    from tasks.params import MAX_EPSILON
    from tasks.spec import parse_spec

    lower, upper = bounds if bounds is not None else (-np.ones(d), np.ones(d))
    release = {"kind": "kmeans", "k": k, "iterations": iterations, "epsilon": epsilon}
    if domain_name is not None:
        release["domain"] = domain_name
    if seeding is not None:
        release["seeding"] = "oversampled" if seeding else "none"
    if postprocess is not None:
        release["postprocess"] = list(postprocess)
    spec = parse_spec({"dataset": {"id": "experiment", "path": "experiment.parquet",
                                   "bounds": {f"c{j}": [float(lower[j]), float(upper[j])] for j in range(d)}},
                       "release": {**release, "epsilon": min(epsilon, MAX_EPSILON)}})
    if epsilon > MAX_EPSILON:
        # A noise-free diagnostic (an epsilon no spec accepts): everything else is the release's.
        spec = spec.model_copy(update={"release": spec.release.model_copy(update={"epsilon": epsilon})})
    return spec


def release_points(X: np.ndarray, spec, bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The points as the kind's prepare writes them (`domain.normalise` with the spec's domain): scaled to
    [-1, 1] with `bounds` (default: `stand_in_bounds`), projected onto the domain."""
    lower, upper = bounds if bounds is not None else stand_in_bounds(X)
    return domain.normalise(np.asarray(X, dtype=np.float64), lower, upper, kmeans_kind.domain_of(spec))[0]


def draw(spec, stats, rng: np.random.Generator, measure=None) -> kmeans_kind.Measured:
    """The kind's DP measurement (`tasks.kinds.kmeans.measure_trajectory`) on in-memory statistics, noise through
    the kind's plan: simulated (seeded numpy from `rng`, not private) unless `measure` is given; `rng` is the
    public randomness too."""
    measure = measure or simulated(kmeans_kind.KIND.bind(spec).plan, rng)
    return kmeans_kind.measure_trajectory(spec, stats, measure, rng)


def released(spec, measured: kmeans_kind.Measured) -> np.ndarray:
    """The centroids the release publishes from these measurements (`tasks.kinds.kmeans.released_centroids`, its
    postprocessing seeded as the release seeds it: from the measurements file's bytes)."""
    seed = kmeans_kind.trajectory_seed(measured.trajectory, measured.seeding)
    return kmeans_kind.released_centroids(spec, measured.trajectory, seed)[0]


def wcss_table(name: str, X: np.ndarray, k: int, *, runs: int, seed: int, epsilons=EPSILONS, iterations: int = 5,
               methods=METHODS, domain_name: str | None = None, seeding: bool | None = None) -> pd.DataFrame:
    """One row per (epsilon, run, method): WCSS and WCSS / k-means++ on the scaled points (`wcss`, `ratio`)
    and in the projected space (`wcss_projected`, `ratio_projected`), plus the single-centroid baseline.
    Every trajectory is the `kmeans` kind's measurement of the spec (`kmeans_spec`) with these settings; `released`
    is what the kind publishes from it. `seeding`: None the kind's default rule (the first of the T rounds seeds
    when T >= 2), False Lee & Kifer's setting (data-independent centroids: spec `seeding: none`)."""
    B = scaled(np.asarray(X, dtype=np.float64))
    spec = kmeans_spec(k, B.shape[1], epsilons[0], iterations=iterations, domain_name=domain_name, seeding=seeding)
    dom = kmeans_kind.domain_of(spec)
    P = release_points(X, spec)
    ref = references(B, P, k)
    stats = dpkmeans.array_stats(P)
    rng = np.random.default_rng(seed)
    rows = []
    for eps in epsilons:
        spec = kmeans_spec(k, B.shape[1], eps, iterations=iterations, domain_name=domain_name, seeding=seeding)
        for run in range(runs):
            centroids = method_centroids(spec, draw(spec, stats, rng), methods, int(rng.integers(2 ** 31)))
            row = {"dataset": name, "domain": dom, "epsilon": eps, "run": run}
            for m, C in centroids.items():
                rows.append({**row, "method": m, **scores(B, P, C, ref)})
            rows.append({**row, "method": "single_centroid", "wcss": ref["single_centroid"],
                         "ratio": ref["single_centroid"] / ref["kmeanspp"],
                         "wcss_projected": np.nan, "ratio_projected": np.nan})
    return pd.DataFrame(rows)


def run_dpkm(stats, k: int, d: int, eps: float, iterations: int, dom: str, rng, seeding: bool = False
             ) -> dpkmeans.Trajectory:
    """One DP k-means trajectory (T rounds, the first seeding if `seeding`) of the kind's measurement with
    simulated (seeded, not private) noise of its plan."""
    return draw(kmeans_spec(k, d, eps, iterations=iterations, domain_name=dom, seeding=seeding), stats, rng).trajectory


def method_centroids(spec, measured: kmeans_kind.Measured, methods, seed: int) -> dict[str, np.ndarray]:
    """The centroids of each method on one trajectory: `dpkm` its last iterate (the kind's dpkm_centroids.parquet),
    the refinement's ablations (`dpkm+consistency`, `dpkm+consistency+mcmc`: always run, with the spec's chain
    settings and the MCMC seeded by `seed`), and `released`, what the kind publishes (`released`)."""
    traj, p = measured.trajectory, spec.release
    chain = {"steps": p.mcmc_steps, "temperature": p.mcmc_temperature, "delta": tuple(p.mcmc_delta)}
    out = {"dpkm": traj.final_centroids}
    if "dpkm+consistency" in methods:
        out["dpkm+consistency"] = leekifer.refine(traj, mcmc=False, **chain).centroids
    if "dpkm+consistency+mcmc" in methods:
        out["dpkm+consistency+mcmc"] = leekifer.refine(traj, seed=seed, **chain).centroids
    if "released" in methods:
        out["released"] = released(spec, measured)
    return {m: C for m, C in out.items() if m in methods}


def scores(B: np.ndarray, P: np.ndarray, C: np.ndarray, ref: dict[str, float]) -> dict[str, float]:
    w, wp = metrics.wcss(B, C), metrics.wcss(P, C)
    return {"wcss": w, "ratio": w / ref["kmeanspp"], "wcss_projected": wp,
            "ratio_projected": wp / ref["kmeanspp_projected"]}
