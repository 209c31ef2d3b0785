"""The `kmeans` release kind: DP measurement (Lee & Kifer Algorithm 1), postprocessing, evaluation."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from data_contracts.suites import kmeans_trajectory_columns
from data_contracts.validate import parquet_files
from dpalgos import accounting, domain, dpkmeans, metrics
from tasks.errors import InputError, ReleaseConflict
from tasks.ingest import StageOutput
from tasks.ledger import PrivacyLedger
from tasks.partitions import PartitionedPoints
from tasks.run import RunPaths, commit_once
from tasks.spec import ReleaseSpec

TRAJECTORY = "trajectory.parquet"
META = "measurements.json"
CENTROIDS = "centroids.parquet"
CENTROIDS_ORIGINAL = "centroids_original_units.parquet"
#: The internal k-means++ reference runs on at most this many points (a uniform sample beyond).
REFERENCE_MAX_ROWS = 200_000


@dataclass(frozen=True)
class Measured:
    """Where the measurements are, what they cost, and whether this run drew them or reused them."""
    path: str
    reused: bool
    guarantee: accounting.Guarantee
    dataset_total: accounting.Guarantee
    budget: tuple[float, float]


def make_rng(spec: ReleaseSpec) -> np.random.Generator:
    # Production noise is seeded from OS entropy; a seed is only accepted in test mode (see ReleaseSpec).
    return np.random.default_rng(spec.seed if spec.mode == "test" else None)


def mechanisms(spec: ReleaseSpec) -> list[dict]:
    """Human-readable list of the noise calls of Algorithm 1, for the manifest."""
    p = spec.release
    scale = 2 * p.iterations / p.epsilon
    common = {"mechanism": "Laplace", "scale": scale, "l1_sensitivity": 1.0,
              "epsilon_each": p.epsilon / (2 * p.iterations), "repetitions": p.iterations}
    return [{**common, "query": "per-cluster point counts (K values) at each iteration"},
            {**common, "query": "per-cluster coordinate sums (K x d values) at each iteration, data in the unit L1 ball"}]


def write_trajectory(folder: Path, traj: dpkmeans.Trajectory, meta: dict) -> None:
    T, K, d = traj.noisy_sums.shape
    cols = {"iteration": np.repeat(np.arange(1, T + 1, dtype=np.int32), K),
            "cluster": np.tile(np.arange(K, dtype=np.int32), T),
            "noisy_count": traj.noisy_counts.reshape(-1)}
    cols.update({f"noisy_sum_{j}": traj.noisy_sums[:, :, j].reshape(-1) for j in range(d)})
    cols.update({f"centroid_{j}": traj.centroids[:, :, j].reshape(-1) for j in range(d)})
    pq.write_table(pa.table(cols), folder / TRAJECTORY)
    meta = {**meta, "initial_centroids": traj.initial_centroids.tolist(), "noise_scale": traj.noise_scale,
            "epsilon": traj.epsilon, "iterations": T, "k": K, "d": d}
    (folder / META).write_text(json.dumps(meta, indent=2))


def read_trajectory(folder: str | Path) -> tuple[dpkmeans.Trajectory, dict]:
    """The DP k-means measurements stored in `folder`, and their metadata."""
    folder = Path(folder)
    meta = json.loads((folder / META).read_text())
    T, K, d = meta["iterations"], meta["k"], meta["d"]
    table = pq.read_table(folder / TRAJECTORY).to_pandas().sort_values(["iteration", "cluster"])
    assert list(table.columns) == kmeans_trajectory_columns(d), "trajectory columns changed"
    arr = lambda prefix: np.stack([table[f"{prefix}_{j}"].to_numpy() for j in range(d)], axis=-1).reshape(T, K, d)
    traj = dpkmeans.Trajectory(initial_centroids=np.asarray(meta["initial_centroids"], dtype=np.float64),
                               noisy_counts=table["noisy_count"].to_numpy().reshape(T, K),
                               noisy_sums=arr("noisy_sum"), centroids=arr("centroid"),
                               noise_scale=meta["noise_scale"], epsilon=meta["epsilon"])
    return traj, meta


@task(name="dp-measure", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def measure_kmeans(spec: ReleaseSpec, release_id: str, run: RunPaths, normalised: StageOutput) -> Measured:
    """Charge the ledger, then run DP k-means on dask and commit its trajectory ONCE.

    A retried or resumed attempt finds the committed measurements and returns them: fresh noise for the
    same release would be a second, unaccounted release.
    """
    log = get_run_logger()
    p = spec.release
    if p.k > normalised.rows:
        raise InputError(f"k={p.k} clusters requested but the dataset has only {normalised.rows} rows")
    ledger = PrivacyLedger(spec.ledger_path)
    charge = ledger.charge(dataset_id=spec.dataset.id, release_id=release_id, kind=p.kind,
                           fingerprint=spec.fingerprint(),
                           event=dpkmeans.privacy_event(epsilon=p.epsilon, iterations=p.iterations),
                           budget=(spec.ledger.lifetime_epsilon, spec.ledger.lifetime_delta))
    log.info("privacy ledger: release %s costs epsilon=%.4g (%s); dataset '%s' total epsilon=%.4g of %.4g",
             release_id, charge.release.epsilon, "already charged" if not charge.new else "charged",
             spec.dataset.id, charge.total.epsilon, charge.budget_epsilon)
    reused = run.measurements.exists()
    if reused:
        _, meta = read_trajectory(run.measurements)
        if meta["fingerprint"] != spec.fingerprint():
            raise ReleaseConflict(f"stored measurements of release '{release_id}' were made with other "
                                  f"parameters ({meta['fingerprint']} != {spec.fingerprint()})")
        log.info("reusing the measurements committed at %s (no new noise drawn)", run.measurements)
    else:
        traj, min_distance = _run_dp_kmeans(spec, normalised, log)
        meta = {"release_id": release_id, "dataset_id": spec.dataset.id, "kind": p.kind,
                "fingerprint": spec.fingerprint(), "columns": spec.dataset.columns,
                "min_centroid_distance": min_distance, "event": accounting.event_to_json(
                    dpkmeans.privacy_event(epsilon=p.epsilon, iterations=p.iterations))}
        if not commit_once(run.measurements, lambda tmp: write_trajectory(tmp, traj, meta)):
            raise ReleaseConflict(f"measurements of release '{release_id}' were committed concurrently by "
                                  f"another run; rerun to use them")
        log.info("committed the noisy trajectory (T=%d, K=%d) to %s", p.iterations, p.k, run.measurements)
    if ledger.status(release_id) == "charged":
        ledger.mark(release_id, "measured")
    return Measured(str(run.measurements), reused, charge.release, charge.total,
                    (charge.budget_epsilon, charge.budget_delta))


def _run_dp_kmeans(spec: ReleaseSpec, normalised: StageOutput, log) -> tuple[dpkmeans.Trajectory, float]:
    from distributed import get_client

    p = spec.release
    rng = make_rng(spec)
    d = len(spec.dataset.columns)
    # Initial centroids depend only on (K, d) and fresh randomness: data-independent, so they cost nothing.
    initial, min_distance = dpkmeans.data_independent_centroids(p.k, d, rng, min_distance=p.min_centroid_distance)
    points = PartitionedPoints(get_client(), parquet_files(normalised.path), spec.dataset.columns)
    try:
        traj = dpkmeans.dp_kmeans(lambda C: points.reduce(dpkmeans.cluster_stats, C), initial,
                                  epsilon=p.epsilon, iterations=p.iterations, rng=rng,
                                  on_iteration=lambda t, _: log.info("DP k-means iteration %d/%d", t, p.iterations))
    finally:
        points.close()
    return traj, min_distance


@task(name="postprocess", cache_policy=NO_CACHE)
def postprocess_kmeans(spec: ReleaseSpec, measured: Measured, staging: Path) -> list[str]:
    """Release products from the measurements ONLY (plus public bounds): the final centroids in the
    normalised space and in original units, and a copy of the noisy trajectory."""
    traj, _ = read_trajectory(measured.path)
    cols = spec.dataset.columns
    C = traj.final_centroids
    lower = [spec.dataset.bounds[c][0] for c in cols]
    upper = [spec.dataset.bounds[c][1] for c in cols]
    cluster = np.arange(C.shape[0], dtype=np.int32)
    pq.write_table(pa.table({"cluster": cluster, **{c: C[:, j] for j, c in enumerate(cols)}}), staging / CENTROIDS)
    # Original units: the inverse of the public min-max scaling (the L1 projection is not inverted).
    raw = domain.unscale_from_unit_box(C, lower, upper)
    pq.write_table(pa.table({"cluster": cluster, **{c: raw[:, j] for j, c in enumerate(cols)}}),
                   staging / CENTROIDS_ORIGINAL)
    (staging / "measurements").mkdir()
    for name in (TRAJECTORY, META):
        shutil.copy2(Path(measured.path) / name, staging / "measurements" / name)
    return [CENTROIDS, CENTROIDS_ORIGINAL, f"measurements/{TRAJECTORY}", f"measurements/{META}"]


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_kmeans(spec: ReleaseSpec, run: RunPaths, normalised: StageOutput) -> dict:
    """Internal utility report (raw-derived, never published): WCSS of the released centroids and of every
    DP iteration, against scikit-learn's k-means++ (best of 10) on the same normalised points."""
    from distributed import get_client

    log = get_run_logger()
    traj, _ = read_trajectory(run.release / "measurements")
    released = pq.read_table(run.release / CENTROIDS).to_pandas()[spec.dataset.columns].to_numpy()
    out = run.internal / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    points = PartitionedPoints(get_client(), parquet_files(normalised.path), spec.dataset.columns)
    try:
        per_iteration = [points.reduce(metrics.wcss, C) for C in traj.centroids]
        released_wcss = points.reduce(metrics.wcss, released)
        sample = points.sample(REFERENCE_MAX_ROWS, normalised.rows, seed=0)
    finally:
        points.close()
    ref_wcss, _ = metrics.kmeans_reference(sample, spec.release.k, seed=0)
    sample_wcss = metrics.wcss(sample, released)
    report = {"rows": normalised.rows, "wcss": released_wcss, "wcss_per_iteration": per_iteration,
              "reference": "sklearn KMeans k-means++ best of 10", "reference_rows": int(sample.shape[0]),
              "wcss_ratio_to_kmeanspp": sample_wcss / ref_wcss if ref_wcss > 0 else float("nan")}
    (out / "evaluation.json").write_text(json.dumps(report, indent=2))
    _plot(per_iteration, ref_wcss * normalised.rows / sample.shape[0], out / "wcss.png")
    log.info("evaluation: WCSS=%.4g, WCSS / k-means++ = %.3f", report["wcss"], report["wcss_ratio_to_kmeanspp"])
    return report


def _plot(per_iteration: list[float], reference: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(range(1, len(per_iteration) + 1), per_iteration, "o-", label="DP k-means")
    ax.axhline(reference, color="k", ls="--", label="k-means++ (non-private)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("WCSS")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
