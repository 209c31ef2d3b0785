"""The `experiment` flow: reproduce a paper figure on the reference datasets (../shared/data), writing a
Parquet table and PNG plots into <output_dir>/experiments/<name>-<UTC time>/internal/.

The FriendlyCore experiments (friendlycore_mean, friendlycore_kmeans) generate their data (the FriendlyCore blog
post's setup) and need no reference dataset; they fix the budget (rho = 0.5 zCDP) and take no epsilons.

Experiments evaluate methods against the true data, so everything they write is internal. Their noise is
seeded (default 0) for reproducibility: they are measurements of methods, not releases.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.errors import InputError
from tasks.experiments import contingency as exp_contingency
from tasks.experiments import friendlycore as exp_fc
from tasks.experiments import histogram as exp_histogram
from tasks.experiments import kmeans as exp_kmeans
from tasks.experiments import matrix_mechanism as exp_mm
from tasks.experiments import mnist as exp_mnist
from tasks.experiments.plots import bars, line_grid
from tasks.experiments.points import gowalla_like, load_points

Name = Literal["kmeans", "contingency", "histogram", "matrix_mechanism", "mnist_clustering", "friendlycore_mean",
               "friendlycore_kmeans"]
HISTOGRAMS = ("NETTRACE", "SEARCHLOGS")
TABLES = ("edwards_mildew", "czech_autoworkers_reinis")


def _data(data_dir: Path, relative: str) -> Path:
    path = data_dir / relative
    if not path.exists():
        raise InputError(f"reference dataset {path} not found (give --data-dir, the folder of ../shared/data)")
    return path


def _histogram(data_dir: Path, name: str) -> np.ndarray:
    return np.load(_data(data_dir, f"histograms/{name}.n4096.npy"))


def _save(frame: pd.DataFrame, out: Path, stem: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / f"{stem}.parquet", index=False)
    return out / f"{stem}.parquet"


@task(name="kmeans-postprocessing", cache_policy=NO_CACHE)
def kmeans_figure(data_dir: Path, out: Path, runs: int, seed: int, epsilons) -> list[str]:
    """Lee & Kifer Figure 1: WCSS vs epsilon of DPKM, DPKM + consistency, DPKM + consistency + MCMC (T = 5)
    on S1 (K = 15), Adult numeric (K = 5) and a Gowalla-like point set (K = 5)."""
    sets = [("S1", load_points(_data(data_dir, "kmeans/s1.txt")), 15),
            ("ADULT", load_points(_data(data_dir, "kmeans/adult_numeric.csv")), 5),
            ("GOWALLA-like", gowalla_like(_data(data_dir, "spatial/checkin_256_256.npy")), 5)]
    # Lee & Kifer's setting: data-independent starting centroids (`released` is then the kind with seeding: none).
    frame = pd.concat([exp_kmeans.wcss_table(name, X, k, runs=runs, seed=seed, epsilons=epsilons, seeding=False)
                       for name, X, k in sets], ignore_index=True)
    # The single-centroid baseline (64x k-means++ on S1) stays in the table; plotted, it would flatten the others.
    line_grid(frame[frame["method"] != "single_centroid"], x="epsilon", y="ratio", cols="dataset",
              path=out / "fig1_kmeans_wcss.png",
              title="WCSS / k-means++ on the [-1, 1]-scaled data, by epsilon (Lee & Kifer Fig 1)")
    return [str(_save(frame, out, "kmeans_wcss"))]


@task(name="contingency-tables", cache_policy=NO_CACHE)
def contingency_figure(data_dir: Path, out: Path, runs: int, seed: int, epsilons) -> list[str]:
    """Figure 5.1.1: cell MSE vs epsilon, M0 / M1 / M2 public, on the two 2^6 tables."""
    frames = []
    for name in TABLES:
        table, x = exp_contingency.load_table(_data(data_dir, f"contingency/{name}.csv"))
        frames.append(exp_contingency.table_mse(name, table, x, runs=runs, seed=seed, epsilons=epsilons))
    frame = pd.concat(frames, ignore_index=True)
    line_grid(frame, x="epsilon", y="mse", rows="known", cols="dataset", path=out / "fig5_1_1_contingency.png",
              title="Contingency tables: cell MSE (Fig 5.1.1)")
    return [str(_save(frame, out, "contingency"))]


@task(name="histograms", cache_policy=NO_CACHE)
def histogram_figures(data_dir: Path, out: Path, runs: int, seed: int, epsilons) -> list[str]:
    """Figures 5.2.1 (unit-length queries vs epsilon) and 5.2.2 (range queries by length at eps 0.1, 1.0)."""
    unit = pd.concat([exp_histogram.unit_query_table(n, _histogram(data_dir, n), runs=runs, seed=seed,
                                                     epsilons=epsilons) for n in HISTOGRAMS], ignore_index=True)
    ranges = pd.concat([exp_histogram.range_query_table(n, _histogram(data_dir, n), runs=runs, seed=seed)
                        for n in HISTOGRAMS], ignore_index=True)
    line_grid(unit, x="epsilon", y="mse", cols="dataset", path=out / "fig5_2_1_unit_queries.png",
              title="Unit-length queries (Fig 5.2.1)")
    line_grid(ranges, x="range_length", y="mse", rows="epsilon", cols="dataset", logx=True,
              path=out / "fig5_2_2_range_queries.png", title="Range queries (Fig 5.2.2)")
    return [str(_save(unit, out, "histogram_unit_queries")), str(_save(ranges, out, "histogram_range_queries"))]


@task(name="matrix-mechanism", cache_policy=NO_CACHE)
def matrix_mechanism_figures(data_dir: Path, out: Path, runs: int, seed: int, epsilons,
                             domain: int = exp_mm.DOMAIN) -> list[str]:
    """Figure 5.3.1 (random +-1 workload vs epsilon) and 5.3.2 (three workloads at eps 0.1), domain 1024."""
    pm, workloads = [], []
    for name in HISTOGRAMS:
        x = exp_mm.coarsen(_histogram(data_dir, name), domain)
        pm.append(exp_mm.workload_mse(name, x, runs=runs, seed=seed, workloads=("plus_minus_one",),
                                      epsilons=epsilons, methods=("mm_l1", "mm_elastic", "mm_l2", "lm", "htree",
                                                                      "privelet")))
        workloads.append(exp_mm.workload_mse(name, x, runs=runs, seed=seed))
    pm, workloads = pd.concat(pm, ignore_index=True), pd.concat(workloads, ignore_index=True)
    line_grid(pm, x="epsilon", y="mse", cols="dataset", path=out / "fig5_3_1_plus_minus_one.png",
              title="Matrix mechanism, random +-1 workload (Fig 5.3.1)")
    bars(workloads, group="workload", y="mse", cols="dataset", path=out / "fig5_3_2_workloads.png",
         title="MM(l1) vs MM(l2), eps = 0.1 (Fig 5.3.2)")
    return [str(_save(pm, out, "mm_plus_minus_one")), str(_save(workloads, out, "mm_workloads"))]


@task(name="mnist-clustering", cache_policy=NO_CACHE)
def mnist_figure(data_dir: Path, out: Path, runs: int, seed: int, epsilons) -> list[str]:
    """Acs et al. Figure 3: clustering accuracy vs epsilon of DP kernel k-means (d = 100, 200, 500) and plain
    DP k-means on binarised MNIST (k = 10, 20 iterations)."""
    folder = _data(data_dir, "mnist")
    X, y = exp_mnist.load_binarised(folder, "train")
    public, _ = exp_mnist.load_binarised(folder, "t10k")
    frame = exp_mnist.accuracy_table(X, y, public, runs=runs, seed=seed, epsilons=epsilons)
    line_grid(frame, x="epsilon", y="accuracy", path=out / "fig3_mnist_clustering.png", logx=True, logy=False,
              title="MNIST clustering accuracy (Acs et al. Fig 3)")
    return [str(_save(frame, out, "mnist_clustering"))]


@task(name="friendlycore-mean", cache_policy=NO_CACHE)
def friendlycore_mean_figure(data_dir: Path, out: Path, runs: int, seed: int, epsilons) -> list[str]:
    """FriendlyCore blog, averaging: L2 error of the mean of n = 800 samples of N(mu, I_d), FriendlyCore vs
    CoinPress (t = 2, 4) at rho = 0.5, vs R at d = 1000 and vs d with R = sqrt(d). Generated data (no data_dir);
    fast (about 1.5 s per run for the 11 settings), so no quick settings."""
    frame = exp_fc.mean_table(runs=runs, seed=seed)
    exp_fc.mean_figure(frame, out / "friendlycore_mean_l2.png")
    return [str(_save(frame, out, "friendlycore_mean"))]


@task(name="friendlycore-kmeans", cache_policy=NO_CACHE)
def friendlycore_kmeans_figure(data_dir: Path, out: Path, runs: int, seed: int, epsilons,
                               quick: bool = False) -> list[str]:
    """FriendlyCore blog, k-means: cost / k-means++ (median, 0.1/0.9 quantiles) vs n = 1e3 .. 1e6 on 8 separated
    2-D Gaussians, friendly k-means vs DP k-means (T = 5) and its Lee & Kifer refinement at FriendlyCore's
    (eps, delta). Generated data (no data_dir). quick: n = 1e3, 1e4, 5e4 only (n = 1e6 takes ~1.5 min a run)."""
    frame = exp_fc.kmeans_table(runs=runs, seed=seed, ns=exp_fc.QUICK_KMEANS_NS if quick else exp_fc.KMEANS_NS)
    exp_fc.kmeans_figure(frame, out / "friendlycore_kmeans_cost.png")
    return [str(_save(frame, out, "friendlycore_kmeans"))]


FIGURES = {"kmeans": kmeans_figure, "mnist_clustering": mnist_figure, "contingency": contingency_figure,
           "histogram": histogram_figures,
           "matrix_mechanism": matrix_mechanism_figures, "friendlycore_mean": friendlycore_mean_figure,
           "friendlycore_kmeans": friendlycore_kmeans_figure}
#: Experiments on generated data with a fixed budget: no data_dir, no epsilons.
GENERATED = ("friendlycore_mean", "friendlycore_kmeans")


@flow(name="experiment", flow_run_name="experiment-{name}")
def experiment(name: Name, data_dir: str = "../shared/data", output_dir: str = "dprelease-runs", runs: int = 10,
               seed: int = 0, epsilons: list[float] | None = None, domain: int = exp_mm.DOMAIN) -> dict:
    """Run one paper-reproduction experiment; returns the paths of its tables and plots.
    `domain`: histogram size of the matrix-mechanism experiment (the paper's 1024).
    The FriendlyCore experiments (GENERATED) refuse `epsilons` (their budget is rho = 0.5 zCDP, as in the blog
    post); friendlycore_kmeans runs quick settings (n <= 5e4) when runs <= 2."""
    log = get_run_logger()
    out = Path(output_dir) / "experiments" / f"{name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}" / "internal"
    defaults = {"kmeans": exp_kmeans.EPSILONS, "mnist_clustering": exp_mnist.EPSILONS}
    eps = tuple(epsilons) if epsilons else defaults.get(name, tuple(round(0.1 * i, 1) for i in range(1, 11)))
    quick = name == "friendlycore_kmeans" and runs <= 2
    if name in GENERATED:
        if epsilons:
            raise InputError(f"experiment {name} fixes its budget (rho = {exp_fc.RHO} zCDP): it takes no epsilons")
        log.info("experiment %s: %d runs per setting%s, rho %g (zCDP), generated data -> %s", name, runs,
                 " (quick settings: runs <= 2)" if quick else "", exp_fc.RHO, out)
    else:
        log.info("experiment %s: %d runs per setting, epsilons %s -> %s", name, runs, eps, out)
    extra = {"domain": domain} if name == "matrix_mechanism" else {"quick": quick} if quick else {}
    tables = FIGURES[name](Path(data_dir), out, runs, seed, eps, **extra)
    return {"experiment": name, "internal_dir": str(out), "tables": tables,
            "plots": sorted(str(p) for p in out.glob("*.png"))}
