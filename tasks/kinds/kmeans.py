"""The `kmeans` release kind: DP k-means, Lee & Kifer's Algorithm 1, on data scaled to [-1, 1] with public bounds
and projected onto a bounded domain (the paper's unit L1 ball, the box [-1, 1]^d or the unit L2 ball; see
`dpalgos.domain` for the sensitivities and when each wins)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import cached_property
from pathlib import Path
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from data_contracts.validate import parquet_files, read_batches
from dpalgos import domain
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from tasks import storage
from tasks.kinds.base import FLOPS, Draw, Footprint, ReleaseKind, noise_footprint
from tasks.kinds.uncertainty import (
    Bootstrap,
    Center,
    Direct,
    Predicted,
    Product,
    UncertaintyParams,
    bootstrap_planned,
    exact,
    matched,
)
from tasks.params import ReleaseBase
from tasks.partitions import Partitioned, Streamed, current_client, table_points
from tasks.run import StageOutput, committed_plan, measurement_content, read_meta, table_content

pa = module("pyarrow")
pq = module("pyarrow.parquet")
dpkmeans = module("dpalgos.dpkmeans")
leekifer = module("dpalgos.leekifer")
metrics = module("dpalgos.metrics")
progress = module("tasks.progress")

class KMeansParams(ReleaseBase, UncertaintyParams):
    """DP k-means (Lee & Kifer, Algorithm 1): K centroids after T noisy Lloyd iterations."""
    kind: Literal["kmeans"] = Field("kmeans", description="the release kind")
    k: int = Field(ge=1, description="number of clusters")
    iterations: int = Field(5, ge=1, description="T, the number of DP Lloyd iterations")
    domain: Literal["l1_ball", "box", "l2_ball"] | None = Field(
        None, description="where the scaled rows are projected: l1_ball (the paper's; sum sensitivity 1), box "
                          "([-1, 1]^d, clipping only; sensitivity d; centroids in true units), l2_ball (sensitivity "
                          "sqrt(d)); default: l2_ball for d <= 2, box from d = 3 on")
    seeding: Literal["oversampled", "none"] | None = Field(
        None, description="oversampled: the first of the T rounds measures 4 x K data-independent candidates and "
                          "weighted k-means on their noisy means gives the starting centroids "
                          "(dpkmeans.oversampled_seeds); "
                          "none: Algorithm 1 from data-independent centroids, as the paper; default: oversampled "
                          "when T >= 2")
    min_centroid_distance: float | None = Field(
        None, gt=0, description="public pairwise minimum distance of data-independent initial centroids (seeding: "
                                "none, the default when it is set); default: Su et al.'s shrinking sphere packing")
    postprocess: list[Literal["consistency", "mcmc"]] = Field(
        ["consistency", "mcmc"], description="Lee & Kifer postprocessing of the trajectory: consistency (§3.2) "
                                            "and MCMC refinement (§3.3), released where the noisy trajectory and "
                                            "the refinement's fit to it say so; [] releases the last noisy iterate")
    mcmc_steps: int | None = Field(None, ge=1, description="chain length; default max(30000, 30 x dataset size)")
    mcmc_temperature: float = Field(1.0 / 64, gt=0, description="the chain targets pi^(1/temperature)")
    mcmc_delta: tuple[float, float] = Field((0.001, 0.01), description="range of the proposal variances")

    @model_validator(mode="after")
    def _seeding_fits(self):
        if self.seeding == "oversampled" and self.iterations < 2:
            raise ValueError("seeding: oversampled spends the first of the T rounds: it needs iterations >= 2")
        if self.seeding == "oversampled" and self.min_centroid_distance is not None:
            raise ValueError("min_centroid_distance spaces data-independent starts: it needs seeding: none")
        return self


TRAJECTORY = "trajectory.parquet"
CENTROIDS = "centroids.parquet"
#: Written for the box domain only: there the centroids are means of points of the box, which the public
#: scaling maps to original units exactly. A projection onto the L1 or L2 ball does not invert: unscaling a
#: centroid of projected points does not give the cluster's mean in original units, so none is released.
CENTROIDS_ORIGINAL = "centroids_original_units.parquet"
DPKM_CENTROIDS = "dpkm_centroids.parquet"
REFINEMENT = "refinement.json"
#: The internal k-means++ reference runs on at most this many points (a uniform sample beyond), its 10 starts on
#: a sample of REFERENCE_START_ROWS of them (the best start then runs on all): a tenth of the work of 10 full starts.
REFERENCE_MAX_ROWS = 200_000
#: One replicate's cost (2 loaded cores, one thread): the last iterate or consistency about 1 ms; Lee & Kifer's
#: refinement about 1.5 us per MCMC step (30,000 steps at 400 points: 50 ms; 150,000 at 5,000: 0.14 s) and
#: 20 ms for the k-means of its best dataset.
SECONDS_PER_STEP, SECONDS_PER_REFINEMENT, SECONDS_UNREFINED = 1.5e-6, 2e-2, 1e-3
#: One DP Lloyd round's floor beside its noise: a pass over the partitions on the dask workers and back, the round's
#: noise calls and its log line (14 ms a round with one partition: 300 rounds in 4.2 s on the loaded 2-core machine,
#: 2026-11-29). Rounds are many passes, not one: 10^6 iterations were estimated at 120 s, then timed out drawing.
SECONDS_PER_ROUND = 0.02
#: Lee & Kifer's consistency (§3.2) is an ADMM over the whole trajectory's n = T K (d + 1) counts and sums with a
#: dense constraint matrix: a peak of about CONSISTENCY_ARRAYS dense n x n float64 arrays (the constraints, A'A + 2I,
#: its Cholesky factor, the triangles the iterations read), the factorisation's ~2 n^3 operations at BLAS_FLOPS, and
#: up to about CONSISTENCY_ITERATIONS iterations of SECONDS_PER_SQUARE per n^2. Measured 2026-11-29 on the loaded
#: 2-core machine: 90 to 1,100 iterations (T = 10..300, K = 3, d = 2); n = 2,700 (T = 300) took 19 s, 1.8 s of them
#: the factorisation, and every bootstrap replicate reruns it (the estimate had left it out: 119 replicates of 24 s);
#: n = 7,500 (K = 500, T = 5) 21 s (156 iterations, 1.2e-9 s per n^2 each) and a peak of 3.0 n^2 float64.
CONSISTENCY_ARRAYS, CONSISTENCY_ITERATIONS, SECONDS_PER_SQUARE, BLAS_FLOPS = 4, 1000, 2e-9, 2e10
#: A replicate's own trajectory: the plan's noise redrawn and the centroids recomputed, per round.
SECONDS_PER_REPLICATE_ROUND = 2e-5
REFERENCE_START_ROWS = 20_000
REFINEMENT_UNITS = 20
REFINEMENT_PHASES = {"consistency": "consistency of the trajectory (ADMM)",
                     "chain": "the simulated dataset's first state", "mcmc": "MCMC over simulated datasets",
                     "kmeans": "k-means on the best simulated dataset"}


def domain_of(spec) -> str:
    """The spec's domain, or the default of its dimension (public)."""
    return spec.release.domain or domain.default_domain(len(spec.dataset.columns))


def seeded(spec) -> bool:
    """Whether the release spends its first round on oversampled seeding (the spec's choice, or the default
    rule of the public T)."""
    p = spec.release
    if p.seeding:
        return p.seeding == "oversampled"
    return dpkmeans.default_seeding(p.iterations) and p.min_centroid_distance is None


def postprocessing_seed(measurements: Path) -> int:
    """The postprocessing's randomness (MCMC, k-means restarts) is seeded from the measurements' values
    (`tasks.run.table_content`: not the file's bytes, which publishing rewrites with the release's metadata): it
    is not privacy noise, and a rerun on the same measurements, the published copy's included, must reproduce the
    release exactly."""
    return _seed_of(measurement_content(measurements / TRAJECTORY))


def _seed_of(content: bytes) -> int:
    return int(hashlib.sha256(content).hexdigest()[:8], 16)


def _refinement_info(r: leekifer.Refinement, p) -> dict:
    info = {}
    if r.consistent is not None:
        info["consistency"] = {"solver": "ADMM (Lee, Wang & Kifer Algorithm 1), L1",
                               "iterations": r.consistent.iterations,
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


@storage.on_store
def normalise_points(src: str, dst: str, columns, lower, upper, domain_name: str) -> np.ndarray:
    """One partition scaled to [-1, 1] with the public bounds and projected onto the domain, a batch at a time
    (`read_batches`); returns the clipped values per column (internal)."""
    clipped = np.zeros(len(columns), dtype=np.int64)

    def normalised(table: pa.Table) -> pa.Table:
        nonlocal clipped
        Y, c = domain.normalise(table_points(table, columns, order="F"), lower, upper, domain_name)
        clipped = clipped + c
        return pa.table({name: Y[:, j] for j, name in enumerate(columns)})
    storage.write_batches(map(normalised, read_batches(src, list(columns))), dst)
    return clipped


def _in_domain(contract: suites.Contract, domain_name: str, columns, intervals: bool = False) -> suites.Contract:
    """The suites check the unit L1 ball through a derived norm column; for the other domains that column
    holds the domain's own norm (max |x_j| for the box, ||x||_2 for the L2 ball), <= 1 exactly inside. With
    `intervals`, the columns' uncertainty check is derived after it (`suites.interval_check`)."""
    if domain_name == "l1_ball":
        return contract
    cols = list(columns)

    def derive(frame):
        present = [c for c in cols if c in frame.columns]
        return frame.assign(**{suites.L1_NORM: domain.gauge(frame[present].to_numpy(dtype=np.float64), domain_name)})
    checked = suites.interval_check(cols if intervals else [], nullable=True)  # null: a bootstrap skipped
    return dataclasses.replace(contract, derive=suites.compose(derive, checked))


def trajectory_table(traj: dpkmeans.Trajectory, seeding: dpkmeans.Seeding | None = None) -> pa.Table:
    """Every noisy measurement in one table: the seeding round as iteration 0 (its candidates' noisy counts,
    sums and means), then Algorithm 1's iterations 1..T'."""
    T, K, d = traj.noisy_sums.shape
    rounds = [(t + 1, traj.noisy_counts[t], traj.noisy_sums[t], traj.centroids[t]) for t in range(T)]
    if seeding is not None:
        rounds.insert(0, (0, seeding.noisy_counts, seeding.noisy_sums, seeding.means))
    cat = lambda i: np.concatenate([r[i] for r in rounds])
    sums, means = cat(2), cat(3)
    cols = {"iteration": np.concatenate([np.full(len(r[1]), r[0], dtype=np.int32) for r in rounds]),
            "cluster": np.concatenate([np.arange(len(r[1]), dtype=np.int32) for r in rounds]),
            "noisy_count": cat(1)}
    cols.update({f"noisy_sum_{j}": sums[:, j] for j in range(d)})
    cols.update({f"centroid_{j}": means[:, j] for j in range(d)})
    return pa.table(cols)


def write_trajectory(folder: Path, traj: dpkmeans.Trajectory, seeding: dpkmeans.Seeding | None = None) -> None:
    """The measurements file (`trajectory_table`)."""
    pq.write_table(trajectory_table(traj, seeding), folder / TRAJECTORY)


def trajectory_seed(traj: dpkmeans.Trajectory, seeding: dpkmeans.Seeding | None = None) -> int:
    """`postprocessing_seed` of the measurements file `write_trajectory` would write, without writing it (the table
    through a Parquet buffer, as a file stores and reads it back): the benchmarks' in-memory releases use it."""
    sink = pa.BufferOutputStream()
    pq.write_table(trajectory_table(traj, seeding), sink)
    return _seed_of(table_content(pq.read_table(pa.BufferReader(sink.getvalue()))))


def read_trajectory(folder: str | Path, noise_scale: float, sum_noise_scale: float | None = None
                    ) -> tuple[dpkmeans.Trajectory, dict]:
    """Algorithm 1's measurements stored in `folder` (drawn with the plan's Laplace scales: counts
    `noise_scale`, sums `sum_noise_scale`, default the same; the seeding round is not part of the trajectory),
    and their metadata (which names the domain; measurements from before domains were the L1 ball's)."""
    meta = read_meta(folder)
    T, K, d = meta["iterations"], meta["k"], meta["d"]
    table = pq.read_table(Path(folder) / TRAJECTORY).to_pandas()
    table = table[table["iteration"] > 0].sort_values(["iteration", "cluster"])
    arr = lambda prefix: np.stack([table[f"{prefix}_{j}"].to_numpy() for j in range(d)], axis=-1).reshape(T, K, d)
    traj = dpkmeans.Trajectory(initial_centroids=np.asarray(meta["initial_centroids"], dtype=np.float64),
                               noisy_counts=table["noisy_count"].to_numpy().reshape(T, K),
                               noisy_sums=arr("noisy_sum"), centroids=arr("centroid"), noise_scale=noise_scale,
                               domain=meta.get("domain", "l1_ball"), sum_noise_scale=sum_noise_scale)
    return traj, meta


def _reference_text(rows: int) -> str:
    starts = f"k-means++, best of 10 starts of {metrics.REFERENCE_ITERATIONS} Lloyd passes"
    if rows <= REFERENCE_START_ROWS:
        return starts
    return f"{starts} on a sample of {REFERENCE_START_ROWS:,} rows, then {metrics.POLISH_ITERATIONS} on all"


def _box_wcss(X: np.ndarray, C: np.ndarray, lower, upper) -> float:
    return metrics.wcss(domain.scale_to_unit_box(X, lower, upper)[0], C)


def _box_moments(X: np.ndarray, lower, upper) -> tuple[np.ndarray, float]:
    return domain.scale_to_unit_box(X, lower, upper)[0].sum(axis=0), float(X.shape[0])


@dataclasses.dataclass(frozen=True)
class Measured:
    """What the DP measurement of a k-means release drew: Algorithm 1's trajectory, the seeding round (None
    without), and the pairwise minimum distance of the data-independent centroids it started from."""
    trajectory: dpkmeans.Trajectory
    seeding: dpkmeans.Seeding | None
    min_distance: float


def measure_trajectory(spec, stats, measure, public_rng: np.random.Generator, log=None) -> Measured:
    """The release's DP measurement on a sufficient-statistics callable `stats(centroids) -> (sums, counts)` of the
    normalised points: the seeding round when the spec seeds (`seeded`), else data-independent centroids, then
    Algorithm 1 for the remaining rounds, every draw through `measure` (the plan's entries). The draw runs it on
    the dask partitions; the benchmarks on an in-memory array (`dpkmeans.array_stats`)."""
    p, d, dom, seeds = spec.release, len(spec.dataset.columns), domain_of(spec), seeded(spec)
    info = log.info if log is not None else (lambda *a: None)
    if seeds:
        seeding = dpkmeans.oversampled_seeds(stats, p.k, d, public_rng, measure=measure, domain=dom)
        info("DP k-means round 1/%d: seeding from %d candidates", p.iterations, len(seeding.candidates))
        initial, min_distance = seeding.initial_centroids, seeding.min_distance
    else:
        # Data-independent centroids depend only on (K, d, domain) and public randomness: they cost nothing.
        seeding = None
        initial, min_distance = dpkmeans.data_independent_centroids(p.k, d, public_rng, domain=dom,
                                                                    min_distance=p.min_centroid_distance)
    traj = dpkmeans.dp_kmeans(stats, initial, iterations=p.iterations - seeds, measure=measure, domain=dom,
                              on_iteration=lambda t, _: info("DP k-means round %d/%d", t + seeds, p.iterations))
    return Measured(traj, seeding, min_distance)


def released_centroids(spec, traj: dpkmeans.Trajectory, seed: int, log=None
                       ) -> tuple[np.ndarray, leekifer.Refinement | None, float | None]:
    """The centroids a release publishes (centroids.parquet) from its trajectory: Lee & Kifer's refinement with
    the spec's settings where configured and `leekifer.refinement_released` says so (from the noisy trajectory and
    the refinement's fit to the measurements), else the last noisy iterate; the refinement (None when not released);
    and the refinement's `leekifer.misfit` where it ran (else None; NaN without a chain). `seed` is the
    postprocessing's randomness: `postprocessing_seed` of the measurements (`trajectory_seed` of an in-memory
    trajectory)."""
    p = spec.release
    if not _refinement_runs(traj, p):
        return traj.final_centroids, None, None
    refined = _refine(traj, p, seed, log)
    fit = leekifer.misfit(refined, traj)
    if not leekifer.refinement_released(fit, traj):
        return traj.final_centroids, None, fit
    return refined.centroids, refined, fit


class KMeansKind(ReleaseKind):
    name = "kmeans"
    Params = KMeansParams
    shape = "points"
    prepared_stage = "normalised"
    summary = ("DP k-means, Algorithm 1 of Lee & Kifer (Laplace on cluster counts and sums, T iterations, data scaled "
               "to [-1, 1] and projected onto the unit L1 ball, the box or the unit L2 ball), then Lee & Kifer's "
               "refinement of the whole noisy trajectory (consistency by ADMM, MCMC over simulated datasets, k-means "
               "on the best) where the noisy trajectory and the refinement's fit to it say it helps")

    bootstraps = True

    @cached_property
    def domain(self) -> str:
        return domain_of(self.spec)

    @cached_property
    def seeded(self) -> bool:
        return seeded(self.spec)

    @cached_property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The public lower and upper bounds of the columns, in their order."""
        return _bounds(self.spec)

    def example(self):
        return {"kind": "kmeans", "k": 3, "iterations": 3, "epsilon": 1.0, "postprocess": ["consistency"]}

    @cached_property
    def footprint(self):
        """The noisy counts and sums of every round (the seeding round's for SEED_MULTIPLE x K candidates), and the
        weighted k-means of the seeding's noisy means (scikit-learn, 10 starts of at most 100 passes, three
        operations per candidate, centre and coordinate): K large against the data costs its time whatever the data."""
        p, d = self.spec.release, len(self.spec.dataset.columns)
        first = dpkmeans.SEED_MULTIPLE * p.k if self.seeded else p.k
        clusters = first + (p.iterations - 1) * p.k
        fp = (noise_footprint(clusters, "laplace", True, f"the {clusters:,} noisy cluster counts")
              + noise_footprint(clusters * d, "laplace", False, f"the {clusters * d:,} noisy cluster sums"))
        if self.seeded:
            fp += Footprint(8.0 * first * p.k, 10 * 100 * 3.0 * first * p.k * d / FLOPS,
                            f"the weighted k-means of the {first:,} seeds into {p.k:,} clusters")
        fp += Footprint(0.0, p.iterations * SECONDS_PER_ROUND,
                        f"{p.iterations:,} DP Lloyd rounds (each a pass over the partitions)")
        if p.postprocess:  # whether the refinement runs is known after the draw only: counted as if it does
            if "consistency" in p.postprocess:
                fp += consistency_footprint(p.iterations, p.k, d)
            if "mcmc" in p.postprocess:
                fp += Footprint(0.0, _chain_seconds(p), f"the refinement's MCMC ({_chain_steps(p):,} steps)")
        return fp

    @cached_property
    def plan(self):
        p = self.spec.release
        return dpkmeans.plan(epsilon=p.epsilon, iterations=p.iterations, k=p.k, d=len(self.spec.dataset.columns),
                             domain=self.domain, seeding=self.seeded)

    def prepare(self, ingested, run, log):
        """Scale every attribute into [-1, 1] with the PUBLIC bounds and project each row onto the domain,
        partition by partition. Clipping counts go to internal/normalisation.json (raw-derived: never logged)."""
        out = run.stage("normalised")
        storage.remove(out)
        storage.makedirs(out)
        lower, upper = self.bounds
        files = parquet_files(ingested.path)
        futures = current_client().map(normalise_points, files, [storage.join(out, storage.name(f)) for f in files],
                                       columns=self.spec.dataset.columns, lower=lower, upper=upper,
                                       domain_name=self.domain)
        bar = progress.Progress(log, "partitions normalised", len(files))
        clipped = np.sum(progress.gather(current_client(), futures, bar), axis=0)
        report = {"rows": ingested.rows, "clipped_values": dict(zip(self.spec.dataset.columns, map(int, clipped)))}
        (run.internal / "normalisation.json").write_text(json.dumps(report, indent=2))
        # Whether anything was clipped is itself raw-derived: the log points at the counts, always.
        log.info("normalised the rows into the %s; values outside the public bounds were clipped, their counts are "
                 "in %s (internal)", self.domain, run.internal / "normalisation.json")
        return StageOutput(str(out), ingested.rows, len(files))

    @cached_property
    def prepared_contract(self):
        return _in_domain(suites.normalised(self.spec.dataset.columns), self.domain, self.spec.dataset.columns)

    def draw(self, prepared, measure, public_rng, log):
        p = self.spec.release
        points = Streamed(current_client(), parquet_files(prepared.path), self.spec.dataset.columns)
        # Every round is one pass over the partitions: the stage's progress is the partitions reduced (a
        # percentage only; the statistics are not logged: they are not noisy yet).
        bar = progress.Progress(log, "DP k-means (partition passes)", p.iterations * points.n_partitions)
        try:
            m = measure_trajectory(self.spec, lambda C: points.reduce(dpkmeans.cluster_stats, C, progress=bar), measure,
                                   public_rng, log)
        finally:
            points.close()
        traj, seeding = m.trajectory, m.seeding
        meta = {"columns": self.spec.dataset.columns, "min_centroid_distance": m.min_distance, "domain": self.domain,
                "initial_centroids": traj.initial_centroids.tolist(), "iterations": traj.iterations, "k": p.k,
                "d": len(self.spec.dataset.columns),
                "seed_candidates": [] if seeding is None else seeding.candidates.tolist()}
        return Draw(write=lambda folder: write_trajectory(folder, traj, seeding), meta=meta)

    @cached_property
    def measurements_contract(self):
        p = self.spec.release
        d = len(self.spec.dataset.columns)
        seeds = dpkmeans.SEED_MULTIPLE * p.k if self.seeded else 0
        return TRAJECTORY, _in_domain(suites.kmeans_measurements(p.k, p.iterations - bool(seeds), d, seeds),
                                      self.domain,
                                      [f"centroid_{j}" for j in range(d)])

    def trajectory(self, measurements: Path) -> dpkmeans.Trajectory:
        plan = committed_plan(measurements)
        return read_trajectory(measurements, plan["counts"].scale, plan["sums"].scale)[0]

    def postprocess(self, measurements, staging, internal, log):
        """The released centroids (normalised space; original units too for the box domain): Lee & Kifer's
        refinement of the trajectory (consistency, MCMC) when configured and `leekifer.refinement_released` says
        so, else the last noisy iterate, which is also released as dpkm_centroids.parquet. Chain diagnostics go to
        `internal`."""
        traj = self.trajectory(measurements)
        p = self.spec.release
        C, refined, fit = released_centroids(self.spec, traj, postprocessing_seed(measurements), log)
        use_refined = refined is not None
        files = [CENTROIDS, DPKM_CENTROIDS, REFINEMENT]
        self._write_centroids(C, staging / CENTROIDS)
        self._write_centroids(traj.final_centroids, staging / DPKM_CENTROIDS)
        if traj.domain == "box":
            self._write_centroids(domain.unscale_from_unit_box(C, *self.bounds), staging / CENTROIDS_ORIGINAL)
            files.append(CENTROIDS_ORIGINAL)
        info = {"postprocess": list(p.postprocess), "domain": traj.domain,
                "released": "Lee & Kifer §3.2-3.3" if use_refined else "last noisy iterate of DP k-means"}
        if p.postprocess:
            info["centroid_noise"] = leekifer.centroid_noise(traj)
            info["reassigned_fraction"] = leekifer.reassigned_fraction(traj).tolist()
            info["refinement_expected_to_help"] = leekifer.refinement_expected_to_help(traj)
            if fit is not None:  # the refinement ran: how far its simulated dataset is from the measurements
                info["refinement_misfit"] = None if np.isnan(fit) else fit
        if refined is not None:
            info.update(_refinement_info(refined, p))
            if refined.steps:
                _plot_chain(refined, internal / "mcmc_chain.png", "MCMC of " + _title(self.spec, traj.domain))
        (staging / REFINEMENT).write_text(json.dumps(info, indent=2))
        return files

    def _write_centroids(self, C, path):
        cols = self.spec.dataset.columns
        cluster = np.arange(C.shape[0], dtype=np.int32)
        pq.write_table(pa.table({"cluster": cluster, **{c: C[:, j] for j, c in enumerate(cols)}}), path)

    @cached_property
    def release_contract(self):
        intervals, cols = bootstrap_planned(self), self.spec.dataset.columns
        return CENTROIDS, _in_domain(suites.kmeans_release(self.spec.release.k, cols, intervals=intervals),
                                     self.domain, cols, intervals)

    def direct_values(self, measurements, plan):
        """The noisy counts and sums of every round (the seeding round's: iteration 0); the trajectory's
        centroids are derived from them."""
        iteration = pq.read_table(measurements / TRAJECTORY, columns=["iteration"]).column("iteration").to_numpy()
        out = []
        for prefix, rows in (("seed_", iteration == 0), ("", iteration > 0)):
            if rows.any():
                out.append(Direct(TRAJECTORY, "noisy_count", prefix + "counts", NoiseLaw.of(plan[prefix + "counts"]),
                                  rows))
                out += [Direct(TRAJECTORY, f"noisy_sum_{j}", prefix + "sums", NoiseLaw.of(plan[prefix + "sums"]), rows)
                        for j in range(len(self.spec.dataset.columns))]
        return out

    @cached_property
    def replicate_values(self):
        """The released and the last-iterate centroids (and the box's in original units): k x d each."""
        return float(self.spec.release.k * len(self.spec.dataset.columns) * (3 if self.domain == "box" else 2))

    def replicate_seconds(self, measurements=None):
        """The refinement's chain dominates, when it runs: its length from the noisy counts when the measurements
        are known. With MCMC configured every replicate runs the refinement (its misfit is part of the rule);
        without, only where the trajectory calls for it."""
        p = self.spec.release
        rounds = SECONDS_PER_REPLICATE_ROUND * p.iterations
        if not p.postprocess:
            return SECONDS_UNREFINED + rounds
        size = None
        if measurements is not None:
            traj = self.trajectory(measurements)
            if not _refinement_runs(traj, p):
                return SECONDS_UNREFINED + rounds
            size = int(np.rint(np.maximum(traj.noisy_counts[-1], 0.0)).sum())
        seconds = SECONDS_UNREFINED + rounds
        if "consistency" in p.postprocess:
            seconds += consistency_footprint(p.iterations, p.k, len(self.spec.dataset.columns)).seconds
        if "mcmc" in p.postprocess:
            seconds += _chain_seconds(p, size)
        return seconds

    def bootstrap(self, measurements, staging, plan):
        """Around the noisy statistics of the trajectory (counts clipped at zero), its assignment centroids kept:
        the replicates condition on the path the release took. Each reruns the release's rule
        (`leekifer.refinement_released` on the replicate's trajectory and refinement); a refined replicate's clusters
        are matched to the released ones (their labels are arbitrary)."""
        traj = read_trajectory(measurements, plan["counts"].scale, plan["sums"].scale)[0]
        cols = tuple(self.spec.dataset.columns)
        released = pq.read_table(staging / CENTROIDS).to_pandas()[list(cols)].to_numpy()
        released_refined = not np.array_equal(released, traj.final_centroids)

        def rerun(noisy, rng):
            t = _replicate_trajectory(traj, noisy["counts"], noisy["sums"])
            C, refined, _ = released_centroids(self.spec, t, int(rng.integers(2 ** 32)))
            C = matched(released, C) if refined is not None or released_refined else C
            out = {CENTROIDS: C, DPKM_CENTROIDS: t.final_centroids}
            if traj.domain == "box":
                out[CENTROIDS_ORIGINAL] = domain.unscale_from_unit_box(C, *self.bounds)
            return out
        products = (Product(CENTROIDS, "cluster", cols), Product(DPKM_CENTROIDS, "cluster", cols))
        if traj.domain == "box":
            products += (Product(CENTROIDS_ORIGINAL, "cluster", cols, replicates=False),)
        return Bootstrap(products, (Center("counts", np.maximum(traj.noisy_counts, 0.0), NoiseLaw.of(plan["counts"])),
                                    Center("sums", traj.noisy_sums, NoiseLaw.of(plan["sums"]))), rerun,
                         notes=(("conditional on the trajectory's assignment centroids (the seeding round and the "
                                 "centroids each iteration assigned points with are kept); the intervals are for the "
                                 "means of the clusters those centroids define"),
                                ("centroids_original_units.parquet's intervals: the centroids' replicates through "
                                 "the public scaling")))

    def accuracy(self, records=None):
        """Per cluster and iteration: the noisy count and a noisy sum coordinate (exact); a last-iterate centroid
        coordinate (`centroid_std`) per unit of cluster size, and with a public guess of the number of records at
        equal clusters and the domain's mean square coordinate."""
        p, plan = self.spec.release, self.plan
        counts, sums = NoiseLaw.of(plan["counts"]), NoiseLaw.of(plan["sums"])
        z = NormalDist().inv_cdf(0.5 + p.confidence / 2.0)
        rows = [exact("noisy cluster count (every iteration)", counts, p.confidence),
                exact("noisy cluster sum, one coordinate (every iteration)", sums, p.confidence),
                Predicted("last-iterate centroid coordinate x cluster size n", sums.std(),
                          sums.half_width(p.confidence), "first order: the sum's noise over n",
                          "a cluster of n records (divide by n); its coordinate c adds c x the count's noise "
                          "(--records: the figure at equal clusters)")]
        if records:
            n, c2 = records / p.k, _mean_square_coordinate(self.domain, len(self.spec.dataset.columns))
            std = centroid_std(counts, sums, n, np.sqrt(c2))
            rows.append(Predicted("last-iterate centroid coordinate", std, z * std,
                                  "first order in the noise (delta method); interval by the normal approximation",
                                  f"{records} records in {p.k} equal clusters of {n:.4g}, coordinates of the domain's "
                                  f"mean square {c2:.3g}"))
        return rows + [Predicted("refined centroid (Lee & Kifer)", None, None, "not predicted: depends on the data",
                                 "released where the noisy trajectory and the refinement's fit to it say so")]

    def evaluate(self, run, prepared, log):
        """WCSS of the released centroids and of every DP iteration on the points scaled to [-1, 1] with the
        public bounds, before any projection (`wcss`, the honest figure), and in the projected space
        (`wcss_projected`); each against a k-means++ reference (best of 10 starts, chosen on a sample of
        REFERENCE_START_ROWS, then run on all) on the same points (a uniform sample of at most REFERENCE_MAX_ROWS;
        the projected space's reference starts from the scaled one's centres), beside the single-centroid
        baseline (the WCSS of the scaled points' mean). Every figure is computed from the ingested partitions, in
        one load; the work depends on the shapes only (tests/test_data_independent_work.py)."""
        traj = self.trajectory(run.release / "measurements")
        cols, dom, k = self.spec.dataset.columns, traj.domain, self.spec.release.k
        released = pq.read_table(run.release / CENTROIDS).to_pandas()[cols].to_numpy()
        lower, upper = self.bounds
        n, T = max(prepared.rows, 1), len(traj.centroids)
        s = min(n, REFERENCE_MAX_ROWS)
        # Progress in rows gone over: the passes over the partitions, the sample, then the references' passes.
        bar = progress.Progress(log, "evaluation", (T + 5) * n + (metrics.REFERENCE_ITERATIONS + 1) * (
            10 * min(s, REFERENCE_START_ROWS)) + 2 * metrics.POLISH_ITERATIONS * s)
        points = Partitioned.points(current_client(), parquet_files(run.stage("ingested")), cols)
        per_part = _Units(bar, n / max(points.n_partitions, 1))
        try:
            box = lambda fn, *args: points.reduce(fn, *args, lower, upper, progress=per_part)
            per_iteration = [box(_box_wcss, C) for C in traj.centroids]
            wcss, projected_wcss = box(_box_wcss, released), box(_projected_wcss, released, dom)
            total, n_exact = box(_box_moments)
            single = box(_box_wcss, (total / n_exact)[None])
            sample = domain.scale_to_unit_box(points.sample(REFERENCE_MAX_ROWS, int(n_exact), seed=0), lower, upper)[0]
            bar.advance(n)
        finally:
            points.close()
        ref, centres = metrics.kmeans_reference(sample, k, seed=0, start_rows=REFERENCE_START_ROWS,
                                                progress=bar.advance)
        projected_sample = domain.project(sample, dom)
        ref_projected, _ = metrics.kmeans_reference(projected_sample, k, init=domain.project(centres, dom),
                                                    progress=bar.advance)
        scaled = _figures(sample, ref, n_exact, released, traj, wcss, per_iteration, single, total / n_exact)
        projected = {"wcss_projected": projected_wcss,
                     "wcss_projected_ratio_to_kmeanspp": _ratio(projected_sample, ref_projected, released),
                     "dpkm_wcss_projected_ratio_to_kmeanspp": _ratio(projected_sample, ref_projected,
                                                                     traj.final_centroids)}
        out = run.internal / "evaluation"
        out.mkdir(parents=True, exist_ok=True)
        _plot(scaled["wcss_per_iteration"], scaled["kmeanspp_wcss"], scaled["wcss"], scaled["single_centroid_wcss"],
              out / "wcss.png", _title(self.spec, dom))
        beats = bool(scaled["wcss"] < scaled["single_centroid_wcss"])
        bar.update(bar.total)
        return {"rows": prepared.rows, "domain": dom, **scaled, **projected,
                "reference": _reference_text(s),
                "beats_single_centroid": beats, "headline": _headline(scaled, projected, dom, beats)}


class _Units:
    """A partition's share of a pass over the points, in the evaluation's progress units (rows)."""

    def __init__(self, bar, rows_per_partition: float):
        self.bar, self.rows = bar, rows_per_partition

    def advance(self) -> None:
        self.bar.advance(self.rows)


def _ratio(sample: np.ndarray, reference: float, centroids: np.ndarray) -> float:
    return metrics.wcss(sample, centroids) / reference if reference > 0 else float("nan")


def _figures(sample, ref, n, released, traj, wcss, per_iteration, single, mean) -> dict:
    """The scaled space's figures: the reference's WCSS on the sample extrapolated to all points, the ratios on the
    sample."""
    return {"wcss": wcss, "wcss_per_iteration": per_iteration, "kmeanspp_wcss": ref * n / sample.shape[0],
            "reference_rows": int(sample.shape[0]), "wcss_ratio_to_kmeanspp": _ratio(sample, ref, released),
            "dpkm_wcss_ratio_to_kmeanspp": _ratio(sample, ref, traj.final_centroids), "single_centroid_wcss": single,
            "single_centroid_ratio_to_kmeanspp": _ratio(sample, ref, mean[None])}


def _projected_wcss(X: np.ndarray, C: np.ndarray, domain_name: str, lower, upper) -> float:
    """WCSS of a partition of ingested points in the projected space (what the normalised stage holds)."""
    return metrics.wcss(domain.normalise(X, lower, upper, domain_name)[0], C)


def centroid_std(counts: NoiseLaw, sums: NoiseLaw, n: float, c: float) -> float:
    """A last-iterate centroid coordinate s~/n~ of a cluster of n records whose coordinate is c, to first order in
    the noise: sqrt(sd(sum)^2 + c^2 sd(count)^2) / n (the delta method; good where n is many count noises)."""
    return float(np.sqrt(sums.std() ** 2 + c * c * counts.std() ** 2) / n)


def _mean_square_coordinate(domain_name: str, d: int) -> float:
    """E[x_j^2] of a uniform point of the domain (public): 1/3 in the box, 1/(d + 2) in the unit L2 ball,
    2/((d + 1)(d + 2)) in the unit L1 ball."""
    return {"box": 1.0 / 3.0, "l2_ball": 1.0 / (d + 2.0), "l1_ball": 2.0 / ((d + 1.0) * (d + 2.0))}[domain_name]


def consistency_footprint(iterations: int, k: int, d: int) -> Footprint:
    """Lee & Kifer's consistency of a trajectory of T = `iterations` rounds (see CONSISTENCY_ARRAYS)."""
    if iterations < 2:
        return Footprint()
    n = float(iterations * k * (d + 1))
    return Footprint(CONSISTENCY_ARRAYS * 8.0 * n * n,
                     2.0 * n ** 3 / BLAS_FLOPS + CONSISTENCY_ITERATIONS * SECONDS_PER_SQUARE * n * n,
                     f"the consistency of the {iterations:,}-round trajectory (an ADMM over {n:,.0f} values, "
                     f"dense)")


def _chain_steps(p, size: int | None = None) -> int:
    """The refinement's chain length: the spec's, else the default of the noisy record count (the paper's
    minimum before the draw, when that count is not known yet)."""
    return p.mcmc_steps or (leekifer.default_steps(size) if size is not None else leekifer.PAPER_STEPS)


def _chain_seconds(p, size: int | None = None) -> float:
    return SECONDS_PER_REFINEMENT + SECONDS_PER_STEP * _chain_steps(p, size)


def _refinement_runs(traj: dpkmeans.Trajectory, p) -> bool:
    """Whether a release (or a replicate) computes Lee & Kifer's refinement: configured, and with MCMC always (its
    misfit is part of `leekifer.refinement_released`), with consistency alone only where the trajectory calls for it
    (without a chain the trajectory alone decides)."""
    return bool(p.postprocess) and ("mcmc" in p.postprocess or leekifer.refinement_expected_to_help(traj))


def _refine(traj: dpkmeans.Trajectory, p, seed: int, log=None) -> leekifer.Refinement:
    """Lee & Kifer's refinement of the trajectory with the spec's settings. With `log`, progress in units of the
    refinement's phases: consistency 2, the chain's first state 2, the MCMC 14 (1.4 for each tenth of its steps),
    the k-means on its best dataset 2, so that every tenth of the whole gets its line (their totals follow the
    noisy counts: DP outputs, shown in the UI too); the bootstrap's replicates run it silently."""
    phase = advance = bar = None
    if log is not None:
        bar = progress.Progress(log, "refinement", REFINEMENT_UNITS, artifact=True)
        starts = {"consistency": 0, "chain": 2, "mcmc": 4, "kmeans": 18}

        def phase(name):
            log.info("refinement: %s", REFINEMENT_PHASES[name])
            bar.update(starts[name])

        def advance(done, total):
            bar.update(4 + 14 * done / total)
        log.info("refining the trajectory: %s", " + ".join(p.postprocess))
    refined = leekifer.refine(traj, consistency="consistency" in p.postprocess, mcmc="mcmc" in p.postprocess,
                              steps=p.mcmc_steps, temperature=p.mcmc_temperature, delta=tuple(p.mcmc_delta),
                              seed=seed, phase=phase, progress=advance)
    if bar is not None:
        bar.update(REFINEMENT_UNITS)
    return refined


def _replicate_trajectory(traj: dpkmeans.Trajectory, counts: np.ndarray, sums: np.ndarray) -> dpkmeans.Trajectory:
    """The trajectory with simulated statistics and the same assignment centroids (each iteration's statistics
    are of the points nearest to centroids fixed before it); its last centroids follow from the simulated last
    statistics by DP k-means' rule."""
    last = dpkmeans.update_centroids(sums[-1], counts[-1], traj.assignment_centroids()[-1], traj.domain,
                                     traj.sum_scale)
    return dataclasses.replace(traj, noisy_counts=counts, noisy_sums=sums,
                               centroids=np.concatenate([traj.centroids[:-1], last[None]]))


def _headline(scaled: dict, projected: dict, domain_name: str, beats_single_centroid: bool) -> str:
    """The evaluation's one line. Released centroids whose WCSS is not below that of the data's single mean
    describe the data worse than one point does (small data at small epsilon, where the noise dwarfs the
    clusters): reported as a failure, as kernel k-means' degenerate clustering, with the figures."""
    figures = (f"WCSS / k-means++ = {scaled['wcss_ratio_to_kmeanspp']:.3f} on the [-1, 1]-scaled data (last DP "
               f"iterate: {scaled['dpkm_wcss_ratio_to_kmeanspp']:.3f}; single centroid: "
               f"{scaled['single_centroid_ratio_to_kmeanspp']:.3f}); in the {domain_name}: "
               f"{projected['wcss_projected_ratio_to_kmeanspp']:.3f}")
    if beats_single_centroid:
        return figures
    return "FAILED: the released centroids are no better than the data's single mean; " + figures


def _title(spec, domain_name: str) -> str:
    p = spec.release
    seeding = ", seeded" if seeded(spec) else ""
    return f"{spec.dataset.id}: k = {p.k}, epsilon = {p.epsilon:g}, T = {p.iterations}{seeding}, {domain_name}"


def _plot(per_iteration: list[float], reference: float, released: float, single: float, path: Path,
          title: str) -> None:
    """WCSS of every DP iteration, and of the released centroids as a marker past the last iteration (it may lie
    on a reference line), against k-means++ and the single centroid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = len(per_iteration)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(range(1, T + 1), per_iteration, "o-", color="C0", label="DP k-means iterate")
    ax.axhline(reference, color="k", ls="--", lw=1, label="k-means++ (non-private)")
    ax.axhline(single, color="C3", ls=":", lw=1, label="single centroid (non-private)")
    # k-means++'s WCSS is 0 with no more points than clusters (such a release is made, and evaluated).
    versus = f"{released / reference:.3f} x k-means++" if reference > 0 else "k-means++ at 0"
    ax.plot([T + 0.5], [released], marker="*", ms=16, color="C2", ls="none", zorder=5,
            label=f"released centroids ({versus})")
    ax.set_xticks(range(1, T + 1))
    ax.set_xlim(0.5, T + 1)
    ax.set_yscale("log")  # the single centroid is often tens of times k-means++
    ax.set_xlabel("DP k-means iteration (star: the released centroids)")
    ax.set_ylabel("WCSS, data scaled to [-1, 1] (log)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_chain(r: leekifer.Refinement, path: Path, title: str) -> None:
    """Log-likelihood trace of the MCMC and its acceptance rate over each interval between trace points
    (computed from measurements only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    steps = np.linspace(r.steps / len(r.trace), r.steps, len(r.trace))
    accepted = np.diff(np.concatenate([[0.0], r.trace[:, 1]]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.plot(steps, r.trace[:, 0], color="C0", label="log-likelihood")
    a.set_xlabel("MCMC step")
    a.set_ylabel("log-likelihood of the simulated dataset")
    a.legend(fontsize=8)
    b.plot(steps, accepted / np.diff(np.concatenate([[0.0], steps])), color="C1", label="per interval")
    b.plot(steps, r.trace[:, 1] / steps, color="C2", ls="--", label="cumulative")
    b.set_xlabel("MCMC step")
    b.set_ylabel("acceptance rate (accepted / proposed)")
    b.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


KIND = KMeansKind()
