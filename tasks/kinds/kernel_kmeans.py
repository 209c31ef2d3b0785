"""The `kernel_kmeans` release kind: DP kernel k-means of set-valued records (Acs et al. Algorithm 2) on dask.

Every pass recomputes the random Fourier features of each partition from its sparse records (the N x d
feature matrix of 4.4M records would not fit), so only per-cluster sums and counts leave the workers.
Released: the noisy centres in feature space and the public feature map (W, b) with the clipping bound: the
assignment rule of a record x is argmin_j || clip(z(x)) - c_j ||. The assignment of every private record is
raw-derived and stays in internal/.
"""

from __future__ import annotations

import json
import tempfile
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from data_contracts.validate import parquet_files
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from tasks import storage
from tasks.errors import InputError
from tasks.kinds.base import Draw, Footprint, ReleaseKind, noise_footprint
from tasks.kinds.uncertainty import (
    Bootstrap,
    Center,
    Direct,
    Predicted,
    Product,
    UncertaintyParams,
    bootstrap_planned,
    exact,
)
from tasks.ledger import configured_ledger, public_copy
from tasks.params import ReleaseBase
from tasks.partitions import Partitioned, current_client
from tasks.run import read_meta
from tasks.sets import ROWS_PER_PART, ingest_sets, read_sets

pa = module("pyarrow")
pq = module("pyarrow.parquet")
sp = module("scipy.sparse")
kk = module("dpalgos.kernel_kmeans")
lloyd = module("dpalgos.lloyd")

class KernelKMeansParams(ReleaseBase, UncertaintyParams):
    """DP kernel k-means of set-valued records (Acs et al. Algorithm 2): random Fourier features of an RBF
    kernel, T noisy Lloyd iterations with the Gaussian mechanism, sigma calibrated to (epsilon, delta)."""
    kind: Literal["kernel_kmeans"] = Field("kernel_kmeans", description="the release kind")
    k: int = Field(10, ge=1, description="number of clusters")
    iterations: int = Field(20, ge=1, description="T, the number of DP Lloyd iterations")
    delta: float = Field(1e-6, gt=0, lt=1, description="delta of this release's (epsilon, delta) target")
    features: int = Field(200, ge=1, description="d, the number of random Fourier features")
    gamma: float | None = Field(None, gt=0, description="RBF width exp(-gamma ||x - y||^2); default: median "
                                                       "heuristic on the public sample")
    public_sample: str | None = Field(None, description="PUBLIC records (same format) for the initial centres")
    random_init_items: int = Field(10, ge=1, description="without a public sample: initial centres are the "
                                                        "features of random sets of this many items")
    clip: float | Literal["dpnorm"] = Field(1.0, description="feature clipping bound C_s (1 for RBF, the paper's "
                                                             "choice) or 'dpnorm' (Algorithm 3)")

    @model_validator(mode="after")
    def _gamma_source(self):
        if self.gamma is None and self.public_sample is None:
            raise ValueError("give gamma, or a public_sample to choose it by the median heuristic")
        return self




TRAJECTORY = "trajectory.parquet"
W_FILE, B_FILE = "rff_W.npy", "rff_b.npy"
CENTRES = "centres.parquet"
RULE = "assignment_rule.json"
NORM_C_MAX, NORM_BINS = 2.0, 100  # RFF norms are at most sqrt(2)
REFERENCE_ROWS = 50_000


def clustering_footprint(p, items: int) -> Footprint:
    """The feature map (a dense items x features matrix), every iteration's noisy cluster sizes and feature sums
    (k x features Gaussian values, OpenDP's slowest sampler), and the random Fourier features of one partition,
    computed whole on its worker (a dense records x features array, twice over while the cosine is taken)."""
    sums = p.iterations * p.k * p.features
    return (Footprint(8.0 * items * p.features, 0.0, f"the feature map ({items:,} items x {p.features:,} features)")
            + noise_footprint(p.iterations * p.k, "gaussian", False, "the noisy cluster sizes")
            + noise_footprint(sums, "gaussian", False, f"the {sums:,} noisy feature sums")
            + Footprint(2 * 8.0 * ROWS_PER_PART * p.features, 0.0, f"the random Fourier features of one partition "
                                                                   f"({ROWS_PER_PART:,} records x {p.features:,})"))


@lru_cache(maxsize=32)
def sigma_of(epsilon: float, delta: float, iterations: int, dpnorm: bool) -> float:
    """Noise multiplier of every Gaussian mechanism of the run, calibrated with dp_accounting."""
    return kk.calibrate_sigma(epsilon=epsilon, delta=delta, iterations=iterations, dpnorm=dpnorm)


def _sigma(spec) -> float:
    p = spec.release
    return sigma_of(p.epsilon, p.delta, p.iterations, p.clip == "dpnorm")


def check_public_sample(spec) -> None:
    """A public sample that is missing, unreadable or empty is refused before anything is charged: it is read
    here in full, as the release will read it after the charge (an audit had a malformed sample refused after
    it, the charge kept)."""
    if not spec.release.public_sample:
        return
    if not Path(spec.release.public_sample).exists():
        raise InputError(f"public_sample {spec.release.public_sample} does not exist")
    if public_records(spec).shape[0] == 0:
        raise InputError(f"public_sample {spec.release.public_sample} has no records")


def public_records(spec, limit: int = 20_000) -> sp.csr_matrix:
    """The PUBLIC sample of the spec as CSR (first `limit` records)."""
    ds = spec.dataset
    with tempfile.TemporaryDirectory() as tmp:
        # a private copy checked against the operator's declaration (test mode: unchecked)
        src = public_copy(spec.release.public_sample, Path(tmp) / "source",
                          None if spec.test_mode else configured_ledger())
        fmt = "parquet" if src.is_dir() or src.suffix == ".parquet" else "transactions"
        ingest_sets(src, fmt, ds.items_column, Path(tmp) / "public", item_count=ds.item_count)
        parts = [read_sets(f, ds.items_column, ds.item_count) for f in parquet_files(Path(tmp) / "public")]
    X = sp.vstack(parts).tocsr()
    return X[:limit]


def median_gamma_sets(X: sp.csr_matrix, pairs: int = 5000, seed: int = 0) -> float:
    """gamma = 1 / median ||x - y||^2 over random pairs of public binary records (|x| + |y| - 2 |x & y|)."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, X.shape[0], pairs), rng.integers(0, X.shape[0], pairs)
    sizes = np.asarray(X.sum(axis=1)).ravel()
    inter = np.asarray(X[i].multiply(X[j]).sum(axis=1)).ravel()
    d2 = sizes[i] + sizes[j] - 2 * inter
    return 1.0 / float(np.median(d2[d2 > 0]))


def partition_norm_histogram(X, rff, c_max: float, bins: int) -> np.ndarray:
    return kk.norm_histogram(kk.feature_norms(X, rff), c_max, bins)


def partition_assignment(X, rff, clip: float, centres: np.ndarray) -> np.ndarray:
    return lloyd.clipped_labels(rff.transform(X), centres, clip).astype(np.int32)


def cluster_records(spec, data: Partitioned, measure, public_rng: np.random.Generator, log, reseed: bool = False):
    """DP kernel k-means of the records in `data` (DPNorm first if the spec asks): returns (feature map,
    gamma, clipping bound, dp_lloyd result). Nothing noisy is logged (it is not committed yet). `reseed`: centres
    that are mostly noise are re-seeded (`kk.reseeded`; DPGM's clustering)."""
    return clustering(spec, public_records(spec) if spec.release.public_sample else None, data, measure, public_rng,
                      log, reseed)


def clustering(spec, public: sp.csr_matrix | None, data, measure, public_rng: np.random.Generator, log=None,
               reseed: bool = False):
    """`cluster_records` given the spec's public sample as records (None: none): the release's clustering on
    `data`, the dask partitions (`Partitioned`) or, in benchmarks, one in-memory partition
    (`tasks.partitions.InMemory`)."""
    p, ds = spec.release, spec.dataset
    info = log.info if log is not None else (lambda *a: None)
    gamma = p.gamma if p.gamma is not None else median_gamma_sets(public)
    # The feature map and the initial centres use public randomness and public records only.
    rff = kk.rbf_features(ds.item_count, p.features, gamma, public_rng)
    if public is not None:
        init = rff.transform(public[public_rng.choice(public.shape[0], p.k, replace=public.shape[0] < p.k)])
    else:
        rows = np.repeat(np.arange(p.k), p.random_init_items)
        cols = np.concatenate([public_rng.choice(ds.item_count, p.random_init_items, replace=False)
                               for _ in range(p.k)])
        init = rff.transform(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(p.k, ds.item_count)))
    if p.clip == "dpnorm":
        clip = kk.dp_norm(data.reduce(partition_norm_histogram, rff, NORM_C_MAX, NORM_BINS), c_max=NORM_C_MAX,
                          measure=measure)
    else:
        clip = float(p.clip)
    info("DP kernel k-means: k=%d, d=%d, %d iterations", p.k, p.features, p.iterations)
    res = kk.dp_lloyd(lambda C: data.reduce(kk.feature_stats, rff, clip, C), init, iterations=p.iterations,
                      clip=clip, measure=measure,
                      on_iteration=lambda t: info("DP kernel k-means iteration %d/%d", t, p.iterations),
                      reseed=public_rng if reseed else None)
    return rff, gamma, clip, res


def noisy_sizes(plan) -> list[Direct]:
    """The trajectory's noisy cluster sizes, drawn by the plan's `sizes` entry (the centres are derived: noisy
    sums over noisy sizes)."""
    return [Direct(TRAJECTORY, "noisy_count", "sizes", NoiseLaw.of(plan["sizes"]))]


def write_clustering(folder, rff, res) -> None:
    """The noisy trajectory (TRAJECTORY) and the public feature map (W_FILE, B_FILE)."""
    T, k, d = res.trajectory.shape
    cols = {"iteration": np.repeat(np.arange(1, T + 1, dtype=np.int32), k),
            "cluster": np.tile(np.arange(k, dtype=np.int32), T),
            "noisy_count": res.noisy_counts.reshape(-1)}
    cols.update({f"f_{j}": res.trajectory[:, :, j].reshape(-1) for j in range(d)})
    pq.write_table(pa.table(cols), folder / TRAJECTORY)
    np.save(folder / W_FILE, rff.W)
    np.save(folder / B_FILE, rff.b)


class KernelKMeansKind(ReleaseKind):
    name = "kernel_kmeans"
    Params = KernelKMeansParams
    shape = "sets"
    prepared_stage = None
    summary = ("DP kernel k-means of set-valued records (Acs et al. Algorithm 2): random Fourier features of an "
               "RBF kernel, Gaussian noise on cluster sizes and feature sums calibrated to (epsilon, delta); "
               "optional DPNorm (Algorithm 3). Released: noisy centres, sizes, the public feature map")
    bootstraps = True

    def example(self):
        return {"kind": "kernel_kmeans", "k": 3, "iterations": 3, "features": 20, "gamma": 0.05,
                "epsilon": 1.0, "delta": 1e-6, "clip": "dpnorm"}

    def check_feasible(self):
        check_public_sample(self.spec)

    @cached_property
    def footprint(self):
        return clustering_footprint(self.spec.release, self.spec.dataset.item_count)

    @cached_property
    def plan(self):
        p = self.spec.release
        return kk.plan(iterations=p.iterations, sigma=_sigma(self.spec), dpnorm=p.clip == "dpnorm", k=p.k,
                       features=p.features, norm_bins=NORM_BINS)

    def draw(self, prepared, measure, public_rng, log):
        p = self.spec.release
        data = Partitioned.sets(current_client(), parquet_files(prepared.path), self.spec.dataset.items_column,
                                self.spec.dataset.item_count)
        try:
            rff, gamma, clip, res = cluster_records(self.spec, data, measure, public_rng, log)
        finally:
            data.close()
        meta = {"k": p.k, "iterations": p.iterations, "features": p.features, "gamma": gamma, "clip": clip,
                "item_count": self.spec.dataset.item_count}
        return Draw(write=lambda folder: write_clustering(folder, rff, res), meta=meta)

    @cached_property
    def measurements_contract(self):
        p = self.spec.release
        return TRAJECTORY, suites.feature_trajectory(p.k, p.iterations, p.features)

    def postprocess(self, measurements, staging, internal, log):
        """The last iteration's noisy centres and noisy cluster sizes, and the assignment rule."""
        meta = read_meta(measurements)
        traj = pq.read_table(measurements / TRAJECTORY).to_pandas()
        last = traj[traj["iteration"] == meta["iterations"]].sort_values("cluster")
        feats = [f"f_{j}" for j in range(meta["features"])]
        pq.write_table(pa.table({"cluster": last["cluster"].to_numpy(),
                                 "noisy_size": np.maximum(last["noisy_count"].to_numpy(), 0.0),
                                 **{f: last[f].to_numpy() for f in feats}}), staging / CENTRES)
        (staging / RULE).write_text(json.dumps({
            "features": f"z(x) = sqrt(2/d) cos(x W + b), W = measurements/{W_FILE} (item_count x d), "
                        f"b = measurements/{B_FILE} (d), x the binary item vector of a record",
            "clip": meta["clip"], "assign": "argmin_j || z(x) / max(1, ||z(x)|| / clip) - c_j ||^2, c_j in "
                                            f"{CENTRES}", "gamma": meta["gamma"], "d": meta["features"]}, indent=2))
        return [CENTRES, RULE]

    @cached_property
    def release_contract(self):
        return CENTRES, suites.feature_centres(self.spec.release.k, self.spec.release.features,
                                               intervals=bootstrap_planned(self))

    def direct_values(self, measurements, plan):
        return noisy_sizes(plan)

    @cached_property
    def replicate_values(self):
        """Each cluster's noisy size and centre in feature space."""
        return float(self.spec.release.k * (1 + self.spec.release.features))

    def bootstrap(self, measurements, staging, plan):
        """Around the last iteration: the sums its noisy centres and sizes imply (centre x size), redrawn with the
        plan's Gaussian at the committed clipping bound, the sizes likewise; a replicate's centre is its sum over
        its size (the previous iteration's centre below a size of 1, as DP Lloyd), its size clipped at 0."""
        meta = read_meta(measurements)
        traj = pq.read_table(measurements / TRAJECTORY).to_pandas().sort_values(["iteration", "cluster"])
        feats = [f"f_{j}" for j in range(meta["features"])]
        T = meta["iterations"]
        last = traj[traj["iteration"] == T]
        before = traj[traj["iteration"] == T - 1][feats].to_numpy() if T > 1 else None
        sizes, centres = last["noisy_count"].to_numpy(), last[feats].to_numpy()
        sums_law = NoiseLaw.of(plan["sums"], plan["sums"].scale_for(meta["clip"]))

        def rerun(noisy, rng):
            n, s = noisy["sizes"], noisy["sums"]
            ok = n >= 1.0
            out = centres.copy() if before is None else before.copy()
            out[ok] = s[ok] / n[ok, None]
            return {CENTRES: np.column_stack([np.maximum(n, 0.0), out])}
        return Bootstrap((Product(CENTRES, "cluster", ("noisy_size", *feats)),),
                         (Center("sizes", np.maximum(sizes, 0.0), NoiseLaw.of(plan["sizes"])),
                          Center("sums", centres * np.maximum(sizes, 1.0)[:, None], sums_law)), rerun,
                         notes=(("conditional on the last iteration's assignment (the centres it used are kept); "
                                 "without the first iterations' noise, whose effect is through which records each "
                                 "centre's cluster holds"),))

    def accuracy(self, records=None):
        """A noisy cluster size (exact); a centre's feature coordinate per unit of cluster size (the feature sum's
        noise, first order), at the public clipping bound (per unit of it with DPNorm)."""
        p, plan = self.spec.release, self.plan
        clip, unit = (float(p.clip), "") if p.clip != "dpnorm" else (1.0, " per unit of the DPNorm bound")
        sums = NoiseLaw.of(plan["sums"], plan["sums"].scale_for(clip))
        return [exact("noisy cluster size (every iteration)", NoiseLaw.of(plan["sizes"]), p.confidence),
                Predicted("centre feature coordinate x cluster size n" + unit, sums.std(),
                          sums.half_width(p.confidence), "first order: the feature sum's noise over n",
                          "a cluster of n records (divide by n)")]

    def evaluate(self, run, prepared, log):
        """Internal: every record's final cluster (internal/assignments/), exact vs noisy cluster sizes, the
        degenerate-clustering check and, for a clustering that is not degenerate, the feature-space WCSS of the
        released centres against noise-free Lloyd iterations started from them (on a sample of at most
        REFERENCE_ROWS records). Nothing of it is logged: all of it is raw-derived."""
        ds = self.spec.dataset
        folder = run.release / "measurements"
        meta = read_meta(folder)
        rff = kk.RandomFourierFeatures(np.load(folder / W_FILE), np.load(folder / B_FILE), meta["gamma"])
        centres_tab = pq.read_table(run.release / CENTRES).to_pandas()
        centres = centres_tab[[f"f_{j}" for j in range(meta["features"])]].to_numpy()
        files = parquet_files(prepared.path)
        data = Partitioned.sets(current_client(), files, ds.items_column, ds.item_count)
        try:
            labels = data.map(partition_assignment, rff, meta["clip"], centres)
            sample = data.sample(REFERENCE_ROWS, prepared.rows, seed=0)
        finally:
            data.close()
        write_assignments(run.internal / "assignments", files, labels)
        exact = np.bincount(np.concatenate(labels), minlength=meta["k"])
        return clustering_evaluation(exact, centres_tab["noisy_size"].to_numpy(),
                                     kk.clip_rows(rff.transform(sample), meta["clip"]), centres, meta["iterations"])


def write_assignments(folder: Path, files, labels) -> None:
    """One Parquet file (record, cluster) per partition, records numbered across partitions."""
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for f, lab in zip(files, labels):
        pq.write_table(pa.table({"record": np.arange(start, start + lab.size, dtype=np.int64), "cluster": lab}),
                       folder / storage.name(f))
        start += lab.size


def feature_wcss_ratio(Z: np.ndarray, centres: np.ndarray, iterations: int) -> float:
    """Feature WCSS of `centres` on the clipped features Z over that of noise-free Lloyd iterations started
    from them."""
    ref = np.array(centres, dtype=np.float64)
    for _ in range(iterations):
        s, n = kk.grouped_stats(Z, ref)
        ok = n > 0
        ref[ok] = s[ok] / n[ok, None]
    return lloyd.wcss(Z, centres) / lloyd.wcss(Z, ref)


def clustering_evaluation(exact: np.ndarray, noisy_sizes: np.ndarray, Z: np.ndarray, centres: np.ndarray,
                          iterations: int) -> dict:
    """The evaluation report from the exact cluster sizes of all records and the clipped features Z of a
    sample. A degenerate clustering (`kk.degeneracy`) is reported as a failure, without a WCSS ratio; the ratio
    is computed either way, since the evaluation's running time is published (leaving it out took 0.57 s less
    on 50,000 records when one record could tip the clustering into degenerate)."""
    check = kk.degeneracy(exact)
    ratio = feature_wcss_ratio(Z, centres, iterations)
    out = {"records": int(exact.sum()), "cluster_sizes": exact.tolist(),
           "noisy_size_mean_abs_error": float(np.abs(np.asarray(noisy_sizes) - exact).mean()), **check}
    sizes = f"sizes {sorted(exact.tolist(), reverse=True)[:5]}..."
    if check["degenerate"]:
        out["feature_wcss_ratio_to_noise_free_lloyd"] = None
        out["headline"] = (f"FAILED: degenerate clustering, the largest of {exact.size} clusters holds "
                           f"{check['largest_cluster_share']:.1%} of the records ({check['nonempty_clusters']} "
                           f"non-empty; failure above {kk.DEGENERATE_SHARE:.0%}), {sizes}; no WCSS ratio")
        return out
    out["feature_wcss_ratio_to_noise_free_lloyd"] = ratio
    out["headline"] = f"{exact.size} clusters, {sizes}, feature WCSS / noise-free Lloyd = {ratio:.3f}"
    return out


KIND = KernelKMeansKind()
