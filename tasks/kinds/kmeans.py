"""The `kmeans` release kind: DP k-means, Lee & Kifer's Algorithm 1, on data in the unit L1 ball."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from data_contracts import suites
from data_contracts.validate import parquet_files
from dpalgos import domain, dpkmeans, leekifer, metrics
from tasks.errors import InputError
from tasks.ingest import StageOutput
from tasks.kinds.base import Draw, ReleaseKind
from tasks.params import ReleaseBase
from tasks.partitions import Partitioned, current_client, normalise_partition
from tasks.progress import Progress, gather
from tasks.run import RunPaths, read_meta

class KMeansParams(ReleaseBase):
    """DP k-means (Lee & Kifer, Algorithm 1): K centroids after T noisy Lloyd iterations."""
    kind: Literal["kmeans"] = "kmeans"
    k: int = Field(ge=1, le=10_000, description="number of clusters")
    iterations: int = Field(5, ge=1, le=1000, description="T, the number of DP Lloyd iterations")
    min_centroid_distance: float | None = Field(
        None, gt=0, description="public pairwise minimum distance of the initial centroids; default: "
                                "Su et al.'s shrinking sphere packing")
    postprocess: list[Literal["consistency", "mcmc"]] = Field(
        ["consistency", "mcmc"], description="Lee & Kifer postprocessing of the trajectory: consistency (§3.2) "
                                            "and MCMC refinement (§3.3); [] releases the last noisy iterate")
    mcmc_steps: int | None = Field(None, ge=1, description="chain length; default max(30000, 30 x dataset size)")
    mcmc_temperature: float = Field(1.0 / 64, gt=0, description="the chain targets pi^(1/temperature)")
    mcmc_delta: tuple[float, float] = Field((0.001, 0.01), description="range of the proposal variances")




TRAJECTORY = "trajectory.parquet"
CENTROIDS = "centroids.parquet"
CENTROIDS_ORIGINAL = "centroids_original_units.parquet"
DPKM_CENTROIDS = "dpkm_centroids.parquet"
REFINEMENT = "refinement.json"
#: The internal k-means++ reference runs on at most this many points (a uniform sample beyond).
REFERENCE_MAX_ROWS = 200_000


def postprocessing_seed(measurements: Path) -> int:
    """The postprocessing's randomness (MCMC, k-means restarts) is seeded from the measurements' bytes: it is
    not privacy noise, and a rerun on the same measurements must reproduce the release exactly."""
    return int(hashlib.sha256((measurements / TRAJECTORY).read_bytes()).hexdigest()[:8], 16)


def _refinement_info(r: leekifer.Refinement, p) -> dict:
    info = {}
    if r.consistent is not None:
        info["consistency"] = {"solver": "ADMM (Lee, Wang & Kifer Algorithm 1), L1", "iterations": r.consistent.iterations,
                               "converged": r.consistent.converged}
    if r.steps:
        info["mcmc"] = {"steps": r.steps, "simulated_dataset_size": r.dataset_size,
                        "acceptance_rate": r.acceptance_rate, "best_log_likelihood": r.best_loglik,
                        "temperature": p.mcmc_temperature, "proposal_variance_range": list(p.mcmc_delta),
                        "final_step": "k-means (k-means++, 10 restarts) on the best simulated dataset"}
    return info


def _bounds(spec) -> tuple[np.ndarray, np.ndarray]:
    cols = spec.dataset.columns
    return (np.array([spec.dataset.bounds[c][0] for c in cols]), np.array([spec.dataset.bounds[c][1] for c in cols]))


def write_trajectory(folder: Path, traj: dpkmeans.Trajectory) -> None:
    T, K, d = traj.noisy_sums.shape
    cols = {"iteration": np.repeat(np.arange(1, T + 1, dtype=np.int32), K),
            "cluster": np.tile(np.arange(K, dtype=np.int32), T),
            "noisy_count": traj.noisy_counts.reshape(-1)}
    cols.update({f"noisy_sum_{j}": traj.noisy_sums[:, :, j].reshape(-1) for j in range(d)})
    cols.update({f"centroid_{j}": traj.centroids[:, :, j].reshape(-1) for j in range(d)})
    pq.write_table(pa.table(cols), folder / TRAJECTORY)


def read_trajectory(folder: str | Path, noise_scale: float) -> tuple[dpkmeans.Trajectory, dict]:
    """The DP k-means measurements stored in `folder` (drawn with the plan's Laplace scale), and their
    metadata."""
    meta = read_meta(folder)
    T, K, d = meta["iterations"], meta["k"], meta["d"]
    table = pq.read_table(Path(folder) / TRAJECTORY).to_pandas().sort_values(["iteration", "cluster"])
    arr = lambda prefix: np.stack([table[f"{prefix}_{j}"].to_numpy() for j in range(d)], axis=-1).reshape(T, K, d)
    traj = dpkmeans.Trajectory(initial_centroids=np.asarray(meta["initial_centroids"], dtype=np.float64),
                               noisy_counts=table["noisy_count"].to_numpy().reshape(T, K),
                               noisy_sums=arr("noisy_sum"), centroids=arr("centroid"), noise_scale=noise_scale)
    return traj, meta


class KMeansKind(ReleaseKind):
    name = "kmeans"
    Params = KMeansParams
    shape = "points"
    prepared_stage = "normalised"
    summary = ("DP k-means, Algorithm 1 of Lee & Kifer (Laplace on cluster counts and sums, T iterations, data in "
               "the unit L1 ball), then Lee & Kifer's refinement of the whole noisy trajectory (consistency by "
               "ADMM, MCMC over simulated datasets, k-means on the best)")

    def example(self):
        return {"kind": "kmeans", "k": 3, "iterations": 3, "epsilon": 1.0, "postprocess": ["consistency"]}

    def check_feasible(self, spec, prepared):
        if spec.release.k > prepared.rows:
            raise InputError(f"k={spec.release.k} clusters requested but the dataset has fewer rows than clusters")

    def plan(self, spec):
        p = spec.release
        return dpkmeans.plan(epsilon=p.epsilon, iterations=p.iterations, k=p.k, d=len(spec.dataset.columns))

    def prepare(self, spec, ingested, run, log):
        """Scale every attribute into [-1, 1] with the PUBLIC bounds and project each row onto the unit L1
        ball, partition by partition. Clipping counts go to internal/normalisation.json (raw-derived: never
        logged)."""
        out = run.internal / "normalised"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        lower, upper = _bounds(spec)
        files = parquet_files(ingested.path)
        futures = current_client().map(normalise_partition, [str(f) for f in files], [str(out / f.name) for f in files],
                                   columns=spec.dataset.columns, lower=lower, upper=upper)
        clipped = np.sum(gather(current_client(), futures, Progress(log, "partitions normalised", len(files))), axis=0)
        report = {"rows": ingested.rows, "clipped_values": dict(zip(spec.dataset.columns, map(int, clipped)))}
        (run.internal / "normalisation.json").write_text(json.dumps(report, indent=2))
        # Whether anything was clipped is itself raw-derived: the log points at the counts, always.
        log.info("normalised the rows into the unit L1 ball; values outside the public bounds were clipped, their "
                 "counts are in %s (internal)", run.internal / "normalisation.json")
        return StageOutput(str(out), ingested.rows, len(files))

    def prepared_contract(self, spec):
        return suites.normalised(spec.dataset.columns)

    def draw(self, spec, prepared, measure, public_rng, log):
        p = spec.release
        d = len(spec.dataset.columns)
        # Initial centroids depend only on (K, d) and public randomness: data-independent, they cost nothing.
        initial, min_distance = dpkmeans.data_independent_centroids(p.k, d, public_rng,
                                                                    min_distance=p.min_centroid_distance)
        points = Partitioned.points(current_client(), parquet_files(prepared.path), spec.dataset.columns)
        try:
            traj = dpkmeans.dp_kmeans(lambda C: points.reduce(dpkmeans.cluster_stats, C), initial,
                                      iterations=p.iterations, measure=measure,
                                      on_iteration=lambda t, _: log.info("DP k-means iteration %d/%d", t, p.iterations))
        finally:
            points.close()
        meta = {"columns": spec.dataset.columns, "min_centroid_distance": min_distance,
                "initial_centroids": traj.initial_centroids.tolist(), "iterations": p.iterations, "k": p.k, "d": d}
        return Draw(write=lambda folder: write_trajectory(folder, traj), meta=meta)

    def measurements_contract(self, spec):
        p = spec.release
        return TRAJECTORY, suites.kmeans_measurements(p.k, p.iterations, len(spec.dataset.columns))

    def postprocess(self, spec, measurements, staging, internal, log):
        """The released centroids, in the normalised space and in original units (inverse public scaling):
        Lee & Kifer's refinement of the trajectory (consistency, MCMC) when configured, else the last noisy
        iterate, which is also released as dpkm_centroids.parquet. Chain diagnostics go to `internal`."""
        traj, _ = read_trajectory(measurements, self.plan(spec)["counts"].scale)
        p = spec.release
        refined = None
        if p.postprocess:
            bar = Progress(log, "MCMC steps", 1)

            def progress(done, total):
                bar.total = total
                bar.update(done)
            log.info("refining the trajectory: %s", " + ".join(p.postprocess))
            refined = leekifer.refine(traj, consistency="consistency" in p.postprocess, mcmc="mcmc" in p.postprocess,
                                      steps=p.mcmc_steps, temperature=p.mcmc_temperature, delta=tuple(p.mcmc_delta),
                                      seed=postprocessing_seed(measurements), progress=progress)
        C = refined.centroids if refined is not None else traj.final_centroids
        files = [CENTROIDS, CENTROIDS_ORIGINAL, DPKM_CENTROIDS, REFINEMENT]
        self._write_centroids(spec, C, staging / CENTROIDS, staging / CENTROIDS_ORIGINAL)
        self._write_centroids(spec, traj.final_centroids, staging / DPKM_CENTROIDS)
        info = {"postprocess": list(p.postprocess), "method": "Lee & Kifer §3.2-3.3" if p.postprocess else
                "last noisy iterate of DP k-means"}
        if refined is not None:
            info.update(_refinement_info(refined, p))
            if refined.steps:
                _plot_chain(refined, internal / "mcmc_chain.png")
        (staging / REFINEMENT).write_text(json.dumps(info, indent=2))
        return files

    @staticmethod
    def _write_centroids(spec, C, path, original_path=None):
        cols = spec.dataset.columns
        cluster = np.arange(C.shape[0], dtype=np.int32)
        pq.write_table(pa.table({"cluster": cluster, **{c: C[:, j] for j, c in enumerate(cols)}}), path)
        if original_path is not None:
            # Original units: the inverse of the public min-max scaling (the L1 projection is not inverted).
            raw = domain.unscale_from_unit_box(C, *_bounds(spec))
            pq.write_table(pa.table({"cluster": cluster, **{c: raw[:, j] for j, c in enumerate(cols)}}), original_path)

    def release_contract(self, spec):
        return CENTROIDS, suites.kmeans_release(spec.release.k, spec.dataset.columns)

    def evaluate(self, spec, run, prepared, log):
        """WCSS of the released centroids and of every DP iteration, against scikit-learn's k-means++ (best
        of 10) on the same normalised points (a uniform sample of at most REFERENCE_MAX_ROWS)."""
        traj, _ = read_trajectory(run.release / "measurements", self.plan(spec)["counts"].scale)
        cols = spec.dataset.columns
        released = pq.read_table(run.release / CENTROIDS).to_pandas()[cols].to_numpy()
        points = Partitioned.points(current_client(), parquet_files(prepared.path), spec.dataset.columns)
        try:
            per_iteration = [points.reduce(metrics.wcss, C) for C in traj.centroids]
            released_wcss = points.reduce(metrics.wcss, released)
            sample = points.sample(REFERENCE_MAX_ROWS, prepared.rows, seed=0)
        finally:
            points.close()
        ref_wcss, _ = metrics.kmeans_reference(sample, spec.release.k, seed=0)
        ratio = metrics.wcss(sample, released) / ref_wcss if ref_wcss > 0 else float("nan")
        dpkm_ratio = metrics.wcss(sample, traj.final_centroids) / ref_wcss if ref_wcss > 0 else float("nan")
        out = run.internal / "evaluation"
        out.mkdir(parents=True, exist_ok=True)
        scale = prepared.rows / sample.shape[0]
        _plot(per_iteration, ref_wcss * scale, released_wcss, out / "wcss.png")
        return {"rows": prepared.rows, "wcss": released_wcss, "wcss_per_iteration": per_iteration,
                "reference": "sklearn KMeans k-means++ best of 10", "reference_rows": int(sample.shape[0]),
                "wcss_ratio_to_kmeanspp": ratio, "dpkm_wcss_ratio_to_kmeanspp": dpkm_ratio,
                "headline": f"WCSS={released_wcss:.5g}, WCSS / k-means++ = {ratio:.3f} "
                            f"(last DP iterate: {dpkm_ratio:.3f})"}


def _plot(per_iteration: list[float], reference: float, released: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(range(1, len(per_iteration) + 1), per_iteration, "o-", label="DP k-means")
    ax.axhline(released, color="C2", ls="-", label="released (refined) centroids")
    ax.axhline(reference, color="k", ls="--", label="k-means++ (non-private)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("WCSS")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_chain(r: leekifer.Refinement, path: Path) -> None:
    """Log-likelihood trace and running acceptance rate of the MCMC (computed from measurements only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    steps = np.linspace(r.steps / len(r.trace), r.steps, len(r.trace))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    a.plot(steps, r.trace[:, 0])
    a.set_xlabel("step")
    a.set_ylabel("log-likelihood of the simulated dataset")
    b.plot(steps, r.trace[:, 1] / steps)
    b.set_xlabel("step")
    b.set_ylabel("acceptance rate")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


KIND = KMeansKind()
