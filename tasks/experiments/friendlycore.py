"""FriendlyCore experiments, in the setup of the FriendlyCore blog post (../shared/papers/friendlycore-blog.txt;
framework after Tsfadia et al., ICML 2022, filter and analysis derived in this project: docs/friendlycore.md).
Every method of ours is a release kind's own code on its release section (`tasks.kinds.friendlycore`,
`tasks.kinds.kmeans`): what a release would publish, the noise of its plan simulated.

Averaging (`mean_table`): the private mean of n = 800 samples of N(mu, I_d), L2 error of the `mean` kind's release
(`tasks.kinds.friendlycore.release_mean`: radius chosen privately over the public grid [1e-2, 1e8], no bound on the
mean; refined by default, `fc_plain` with refine: false) against CoinPress (`dpalgos.coinpress`, t = 2 and 4 steps,
given the true prior radius R >= ||mu||) at the rho the release spends (zCDP; the release's epsilon at delta = 1e-6
is the one that converts to rho, `release_epsilon`), as R grows at d = 1000 (R = sqrt(d) .. 1e4 sqrt(d)) and as d
grows with R = sqrt(d). mu = mu_frac * R * (a random unit vector). The non-private mean is a reference line.

k-means (`kmeans_table`): a uniform mixture of k = 8 separated 2-D Gaussians (centres uniform in [-50, 50]^2,
pairwise >= 15 apart, unit covariance), n = 1e3 .. 1e6; cost (WCSS) normalised by scikit-learn k-means++ (best
of 10) on the same data. The `friendly_kmeans` kind's release (m = even(n / (k * 40)) subsets, a public function
of n; radius over the public grid [1e-3, 1e5]; rho zCDP + delta' = 1e-8; its subset coins from the noise source's
secret generator) against the `kmeans` kind's release (Lee & Kifer Alg. 1, T = 5, pure eps-DP, the kind's default
domain, seeding and refinement rule, on the public bounds [-120, 120]^2, which no point of the data leaves) and
its last noisy iterate, at FriendlyCore's eps at delta = 1e-6 (`Plan.guarantee`): pure eps-DP is the stronger
guarantee at that eps. "No friendly core" is a failure: its cost is +inf (the quantiles then use sample values, so
a failure stays +inf).

The benchmarks tests/benchmarks/friendlycore_mean.py and friendlycore_kmeans.py use the same functions with
their own keyed noise; the experiment flows (flows/experiments.py) draw seeded noise through
`dpalgos.noise.simulated`: measurements of methods, never releases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from dpalgos import coinpress as cp
from dpalgos import domain, dpkmeans
from dpalgos import friendlycore as fc
from dpalgos.metrics import kmeans_reference, wcss
from dpalgos.noise import Measure, SeededNoise, simulated
from dpalgos.plan import Plan

#: (plan, key) -> the Measure of one release; key names the draw (the benchmarks seed their noise with it).
NoiseFor = Callable[[Plan, int], Measure]

RHO = 0.5
DELTA = 1e-6
DELTA_PTR = 1e-8  # the kinds' default delta' (tasks.kinds.friendlycore)

# Averaging
MEAN_GRID = fc.RadiusGrid(1e-2, 1e8)
MEAN_N = 800
MEAN_D = 1000
MU_FRAC = 0.5
R_MULTIPLES = (1, 10, 100, 1000, 10_000)
DIMENSIONS = (10, 50, 100, 500, 1000, 2000)
COINPRESS_TS = (2, 4)
MEAN_METHODS = {"fc": "FriendlyCore", "fc_plain": "FriendlyCore, friendly mean only",
                **{f"cp{t}": f"CoinPress t={t}" for t in COINPRESS_TS},
                "nonprivate": "non-private mean"}
PANEL_R = f"error vs R (d = {MEAN_D})"
PANEL_D = "error vs d (R = sqrt(d))"

# k-means
KMEANS_GRID = fc.RadiusGrid(1e-3, 1e5)
KMEANS_BOUNDS = (np.array([-120.0, -120.0]), np.array([120.0, 120.0]))
K = 8
POINTS_PER_CLUSTER = 40.0
ITERATIONS = 5
KMEANS_NS = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
QUICK_KMEANS_NS = (1_000, 10_000, 50_000)
KMEANS_METHODS = ("friendly k-means", f"DP k-means (T={ITERATIONS}), last iterate",
                  "DP k-means release (Lee-Kifer where it helps)")


def keyed_noise(seed: int) -> NoiseFor:
    """The benchmarks' noise: SeededNoise(seed + key) (reproducible per draw, independent of the order)."""
    return lambda plan, key: Measure(plan, SeededNoise(seed + key))


def simulated_noise(rng: np.random.Generator) -> NoiseFor:
    """The experiments' noise: `dpalgos.noise.simulated` from the experiment's generator."""
    return lambda plan, key: simulated(plan, rng)


# --------------------------------------------------------------------------------------------------------------
# Averaging
# --------------------------------------------------------------------------------------------------------------
def release_epsilon(rho: float, delta: float = DELTA, delta_ptr: float = DELTA_PTR) -> float:
    """The epsilon of a FriendlyCore release spec (at `delta`, its PTR delta' included) that spends `rho` zCDP:
    the release converts its (epsilon, delta - delta') back to this rho (`tasks.kinds.friendlycore.math_params`)."""
    from dp_accounting import dp_event as dpe

    from dpalgos.accounting import epsilon_at

    return epsilon_at(dpe.ZCDpEvent(rho), delta - delta_ptr).epsilon


def mean_params(rho: float = RHO, refine: bool = True):
    """The `mean` kind's release section spending `rho` (`release_epsilon`) with the public radius grid MEAN_GRID and
    the kind's defaults: refined (the friendly mean, then a clipped sum around it, docs/friendlycore.md §13), or with
    refine=False the friendly mean alone (§6)."""
    from tasks.kinds.friendlycore import MeanParams

    return MeanParams(epsilon=release_epsilon(rho), delta=DELTA, r_min=MEAN_GRID.r_min, r_max=MEAN_GRID.r_max,
                      refine=refine)


def released_mean(X: np.ndarray, p, measure: Measure, friends=None) -> np.ndarray | None:
    """The mean the `mean` kind publishes for the release section `p` (`tasks.kinds.friendlycore.release_mean`,
    what its draw measures and writes), or None for "no friendly core"."""
    from tasks.kinds import friendlycore as fck

    return fck.release_mean(p, X, measure, friends=friends).mean


def mean_errors(d: int, n: int, R: float, *, rho: float, runs: int, rng: np.random.Generator, noise: NoiseFor,
                mu_frac: float = MU_FRAC, ts=COINPRESS_TS,
                coinpress_rho_factor: float = 1.0) -> tuple[dict[str, np.ndarray], int]:
    """Per-run L2 errors {fc, fc_plain, cp<t>..., nonprivate} and the refined FriendlyCore's 'no friendly core'
    count (error +inf). FriendlyCore is the `mean` kind's release (`mean_params`, `released_mean`) through its plan;
    CoinPress spends the rho the release spends. Noise keys: k for FriendlyCore's run k (refined and plain share the
    friendly core's draws up to the mean), k + 500_000 t for CoinPress with t steps. `coinpress_rho_factor`
    multiplies CoinPress's rho (4: CoinPress under add/remove with n public, whose sensitivity is half its
    replace-one one)."""
    from tasks.kinds import friendlycore as fck

    variants = {"fc": mean_params(rho), "fc_plain": mean_params(rho, refine=False)}
    fplans = {key: fck.plan_of(p) for key, p in variants.items()}
    spent = fck.math_params(variants["fc"]).rho
    cplans = {t: cp.coinpress_plan(spent * coinpress_rho_factor, t) for t in ts}
    out = {"fc": [], "fc_plain": [], "nonprivate": [], **{f"cp{t}": [] for t in ts}}
    none = 0
    for k in range(runs):
        u = rng.normal(size=d)
        mu = mu_frac * R * u / np.linalg.norm(u)
        X = mu + rng.normal(size=(n, d))
        friends = fc.EuclideanFriends(X)
        for key, p in variants.items():
            mean = released_mean(X, p, noise(fplans[key], k), friends=friends)
            none += key == "fc" and mean is None
            out[key].append(np.inf if mean is None else float(np.linalg.norm(mean - mu)))
        for t in ts:
            est = cp.coinpress_mean(X, R=R, measure=noise(cplans[t], k + 500_000 * t))
            out[f"cp{t}"].append(float(np.linalg.norm(est - mu)))
        out["nonprivate"].append(float(np.linalg.norm(X.mean(axis=0) - mu)))
    return {key: np.array(v) for key, v in out.items()}, none


def mean_epsilons(rho: float, delta: float) -> tuple[float, float]:
    """(eps of FriendlyCore's release incl. its PTR delta', eps of CoinPress's rho-zCDP at the rho the release
    spends) at delta."""
    from dp_accounting import dp_event as dpe

    from dpalgos.accounting import epsilon_at
    from tasks.kinds import friendlycore as fck

    p = mean_params(rho)
    return (fck.plan_of(p).guarantee(delta).epsilon,
            epsilon_at(dpe.ZCDpEvent(fck.math_params(p).rho), delta).epsilon)


def mean_table(*, runs: int, seed: int, rho: float = RHO, n: int = MEAN_N, d_fixed: int = MEAN_D,
               r_multiples=R_MULTIPLES, dimensions=DIMENSIONS, mu_frac: float = MU_FRAC) -> pd.DataFrame:
    """One row per (panel, setting, run, method): L2 error of the mean (+inf when FriendlyCore found no core)."""
    settings = [(PANEL_R, d_fixed, m * math.sqrt(d_fixed), m) for m in r_multiples]
    settings += [(PANEL_D, d, math.sqrt(d), 1) for d in dimensions]
    rows = []
    for i, (panel, d, R, mult) in enumerate(settings):
        rng = np.random.default_rng([seed, i])
        errs, _ = mean_errors(d, n, R, rho=rho, runs=runs, rng=rng, noise=simulated_noise(rng), mu_frac=mu_frac)
        for key, method in MEAN_METHODS.items():
            for run, e in enumerate(errs[key]):
                rows.append({"panel": panel, "dimension": d, "R": R, "R_over_sqrt_d": mult, "n": n, "rho": rho,
                             "run": run, "method": method, "l2_error": float(e), "released": bool(np.isfinite(e))})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------------------
# k-means
# --------------------------------------------------------------------------------------------------------------
def mixture(n: int, k: int, rng: np.random.Generator, sep: float = 15.0) -> np.ndarray:
    """n points of a uniform mixture of k unit-covariance 2-D Gaussians, centres uniform in [-50, 50]^2 at
    pairwise distance >= sep (redrawn until they are)."""
    while True:
        C = rng.uniform(-50, 50, (k, 2))
        if np.min(np.linalg.norm(C[:, None] - C[None], axis=-1) + np.eye(k) * 1e9) >= sep:
            break
    return C[rng.integers(0, k, n)] + rng.normal(size=(n, 2))


def subsets_for(n: int, k: int, per_cluster: float) -> int:
    """m: the even number of subsets closest to n / (k * per_cluster), at least 2 (a public function of n)."""
    return max(2, round(n / (k * per_cluster) / 2) * 2)


def kmeans_params(n: int, *, rho: float = RHO, k: int = K, per_cluster: float = POINTS_PER_CLUSTER):
    """The `friendly_kmeans` kind's release section spending `rho` (`release_epsilon`): m = `subsets_for(n)`
    subsets, the public radius grid KMEANS_GRID, the kind's defaults for the rest."""
    from tasks.kinds.friendlycore import FriendlyKMeansParams

    return FriendlyKMeansParams(epsilon=release_epsilon(rho), delta=DELTA, r_min=KMEANS_GRID.r_min,
                                r_max=KMEANS_GRID.r_max, k=k, subsets=subsets_for(n, k, per_cluster))


def kmeans_plan(p) -> Plan:
    """The `friendly_kmeans` kind's plan of the release section `p`."""
    from tasks.kinds.friendlycore import plan_of

    return plan_of(p)


def friendly_kmeans_centres(X, p, measure: Measure):
    """The centres (k, 2) the `friendly_kmeans` kind publishes for the release section `p`
    (`tasks.kinds.friendlycore.release_kmeans`: its subset coins from the noise source's secret generator), or None
    for 'no friendly core'."""
    from tasks.kinds.friendlycore import release_kmeans

    return release_kmeans(p, X, measure).centres


def dpkmeans_spec(k: int, *, epsilon: float, iterations: int):
    """The `kmeans` kind's spec of the comparison: the data's public bounds KMEANS_BOUNDS, the kind's defaults."""
    from tasks.experiments.kmeans import kmeans_spec

    return kmeans_spec(k, KMEANS_BOUNDS[0].size, epsilon, iterations=iterations, bounds=KMEANS_BOUNDS)


def dpkmeans_release(X, k: int, *, epsilon: float, iterations: int, rng: np.random.Generator,
                     measure: Callable[[Plan], Measure] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What the `kmeans` kind publishes on X (`dpkmeans_spec`: pure epsilon-DP, its default domain, seeding and
    refinement rule): (centroids.parquet, dpkm_centroids.parquet), in the normalised space (map them back with
    `to_data_space`). Its measurement and postprocessing are the kind's own (`tasks.experiments.kmeans`); `rng` is
    the public randomness, and the noise's unless `measure(plan)` gives it."""
    from tasks.experiments.kmeans import draw, release_points, released
    from tasks.kinds.kmeans import KIND

    spec = dpkmeans_spec(k, epsilon=epsilon, iterations=iterations)
    m = draw(spec, dpkmeans.array_stats(release_points(X, spec, KMEANS_BOUNDS)), rng,
             None if measure is None else measure(KIND.bind(spec).plan))
    return released(spec, m), m.trajectory.final_centroids


def to_data_space(C: np.ndarray) -> np.ndarray:
    return domain.unscale_from_unit_box(C, *KMEANS_BOUNDS)


def quantiles(v) -> np.ndarray:
    """Empirical 0.1 / 0.5 / 0.9 quantiles (inverted CDF: sample values, so a failure (+inf) stays +inf)."""
    return np.quantile(np.asarray(v, dtype=np.float64), [0.1, 0.5, 0.9], method="inverted_cdf")


def kmeans_table(*, runs: int, seed: int, ns=KMEANS_NS, rho: float = RHO, delta: float = DELTA, k: int = K,
                 per_cluster: float = POINTS_PER_CLUSTER, iterations: int = ITERATIONS) -> pd.DataFrame:
    """One row per (n, run, method): WCSS and WCSS / k-means++ (+inf for 'no friendly core'). All methods at
    FriendlyCore's (eps, delta): the `friendly_kmeans` kind's release, and the `kmeans` kind's (pure eps-DP): its
    last noisy iterate (dpkm_centroids.parquet) and its released centroids (the refinement where it helps)."""
    rows = []
    for n in ns:
        params = kmeans_params(n, rho=rho, k=k, per_cluster=per_cluster)
        fplan = kmeans_plan(params)
        eps = fplan.guarantee(delta).epsilon
        for run in range(runs):
            rng = np.random.default_rng([seed, n, run])
            X = mixture(n, k, rng)
            ref, _ = kmeans_reference(X, k, n_init=10, seed=run)
            centres = {KMEANS_METHODS[0]: friendly_kmeans_centres(X, params, simulated(fplan, rng))}
            released, last = dpkmeans_release(X, k, epsilon=eps, iterations=iterations, rng=rng)
            centres[KMEANS_METHODS[1]] = to_data_space(last)
            centres[KMEANS_METHODS[2]] = to_data_space(released)
            for method, C in centres.items():
                cost = np.inf if C is None else wcss(X, C)
                rows.append({"n": n, "k": k, "subsets": params.subsets, "rho": rho, "epsilon": eps, "delta": delta,
                             "run": run, "method": method, "wcss": cost, "ratio": cost / ref,
                             "released": C is not None})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------------------
# Figures: median and 0.1-0.9 quantile band per method, a legend in every panel
# --------------------------------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _median_band(ax, frame: pd.DataFrame, x: str, y: str, methods) -> None:
    """Median line and 0.1-0.9 band of `y` against `x` per method (sample quantiles, +inf kept). A setting whose
    median is +inf (no release in most runs) is drawn as an open marker at the top of the axes, and the band
    of an infinite quantile runs to the top."""
    finite = frame.loc[np.isfinite(frame[y]), y]
    top = float(finite.max()) * 3 if len(finite) else 1.0
    for method in methods:
        g = frame[frame["method"] == method]
        if g.empty:
            continue
        xs = np.array(sorted(g[x].unique()), dtype=np.float64)
        q = np.array([quantiles(g.loc[g[x] == v, y]) for v in xs])
        fails = np.array([int((~np.isfinite(g.loc[g[x] == v, y])).sum()) for v in xs])
        runs = int(g.groupby(x).size().max())
        shown = np.minimum(q, top)
        label = method if not fails.any() else f"{method} (no release in {fails.sum()} of {runs * len(xs)} runs)"
        line, = ax.plot(xs, np.where(np.isfinite(q[:, 1]), q[:, 1], np.nan), "o-", ms=3, label=label)
        ax.fill_between(xs, shown[:, 0], shown[:, 2], alpha=0.2, color=line.get_color())
        off = ~np.isfinite(q[:, 1])
        if off.any():
            ax.plot(xs[off], np.full(off.sum(), top), "o", mfc="none", color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.grid(True, which="major", alpha=0.3)


def mean_figure(frame: pd.DataFrame, path: Path) -> None:
    """Two panels (L2 error vs R at d = 1000, vs d with R = sqrt(d)), log axes, a legend in each."""
    plt = _pyplot()
    rho, n, runs = frame["rho"].iloc[0], int(frame["n"].iloc[0]), int(frame["run"].max()) + 1
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    methods = list(MEAN_METHODS.values())
    for ax, panel, x, xlabel in ((axes[0], PANEL_R, "R", "R (CoinPress's bound on ||mu||)"),
                                 (axes[1], PANEL_D, "dimension", "d")):
        sub = frame[frame["panel"] == panel]
        _median_band(ax, sub, x, "l2_error", methods)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("L2 error of the mean")
        ax.set_title(f"{panel}\nrho = {rho:g} (zCDP), n = {n}, runs = {runs}; median, 0.1-0.9 band", fontsize=9)
    fig.suptitle("FriendlyCore averaging vs CoinPress, N(mu, I_d), ||mu|| = R/2")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def kmeans_figure(frame: pd.DataFrame, path: Path) -> None:
    """Cost / k-means++ vs n (log x), median and 0.1-0.9 quantile band per method."""
    plt = _pyplot()
    runs = int(frame["run"].max()) + 1
    k, rho, eps, delta = (frame[c].iloc[0] for c in ("k", "rho", "epsilon", "delta"))
    fig, ax = plt.subplots(figsize=(7, 5))
    _median_band(ax, frame, "n", "ratio", KMEANS_METHODS)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("n (points of the mixture)")
    ax.set_ylabel("k-means cost / k-means++ cost")
    ax.set_title(f"k-means on {k} separated 2-D Gaussians (k = {k}); rho = {rho:g} zCDP = ({eps:.3g}, {delta:g})-DP\n"
                 f"runs = {runs} per n (the blog: 30); median and 0.1-0.9 quantile band\n"
                 f"open marker at the top: the median run released nothing (no friendly core)",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
