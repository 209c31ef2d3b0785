"""The `synthetic` release kind: DPGM (Acs et al. Algorithm 1) on set-valued records, on dask.

DP measurement (one charge, one (epsilon, delta) for all of it, noise calibrated by `dpgm.calibrate`):
  1. DP kernel k-means of the records (as the `kernel_kmeans` kind);
  2. the Gaussian measurement of the per-cluster item counts, sizes and record-length histograms under the
     final centres;
  3. DP-SGD of one generative model per cluster, every step on Poisson samples (rate q) drawn on the workers.
The trained models (a function of the noisy gradients and public randomness) are stored as the measurement;
the synthetic records are post-processing: drawn from the mixture with a seed kept in the measurements, so a
retried postprocess writes the same records.

Released: `synthetic/` (Parquet, list<int32> items, the ingest format: it feeds any set-valued pipeline) and
`mixture.parquet` (cluster weights). Internal: counting-query evaluation against raw data with MWEM and
independent-items baselines, and its plot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from data_contracts.validate import parquet_files
from dpalgos.lazy import module
from tasks import settings, storage
from tasks.errors import ReleaseConflict
from tasks.kinds.base import FLOPS, Draw, Footprint, ReleaseKind, noise_footprint
from tasks.kinds.kernel_kmeans import (
    KernelKMeansParams,
    check_public_sample,
    cluster_records,
    clustering_footprint,
    noisy_sizes,
    write_clustering,
)
from tasks.partitions import Partitioned, current_client
from tasks.run import RunPaths, read_meta
from tasks.sets import set_table

pa = module("pyarrow")
pq = module("pyarrow.parquet")
sp = module("scipy.sparse")
counting = module("dpalgos.counting")
dpgm = module("dpalgos.dpgm")
kk = module("dpalgos.kernel_kmeans")
noise_sources = module("dpalgos.noise")

class SyntheticParams(KernelKMeansParams):
    """DPGM (Acs et al. Algorithm 1): DP kernel k-means into k clusters, one generative model per cluster
    trained with DP-SGD, synthetic set-valued records sampled from the mixture. epsilon and delta cover all of
    it (clustering, per-cluster marginals, DP-SGD), the noise calibrated together with dp_accounting."""
    kind: Literal["synthetic"] = Field("synthetic", description="the release kind")  # type: ignore[assignment]
    k: int = Field(dpgm.DEFAULT_K, ge=1, description="clusters (one generative model each); default from the "
                                                      "public item_count (`dpgm.default_k`): item_count // "
                                                      f"{dpgm.ITEMS_PER_CLUSTER}, at least {dpgm.DEFAULT_K}, at "
                                                      f"most {dpgm.DEFAULT_K_MANY}")
    iterations: int = Field(dpgm.DEFAULT_ITERATIONS, ge=1, description="DP kernel k-means iterations")
    model: Literal["vae", "rbm"] = Field("vae", description="generative model of every cluster")
    hidden: list[Annotated[int, Field(ge=1)]] = Field([200], min_length=1, max_length=2,
                                                      description="hidden units: [200] is the paper's "
                                                                  "VAE, [200, 200] its appendix variant")
    steps: int = Field(300, ge=1, description="DP-SGD steps (every step updates every cluster model)")
    q: float = Field(0.02, gt=0, le=1, description="Poisson sampling rate of every record at every step")
    lr: float | None = Field(None, gt=0, description="learning rate; default Adam 0.001 (VAE), 0.01 (RBM, the "
                                                     "paper's)")
    max_items: int = Field(30, ge=1, description="per-cluster item marginals: records weighted to at most this "
                                                 "many items (the marginals table's L2 sensitivity is "
                                                 "sqrt(max_items + 2), sqrt(5 (max_items + 2)) with the all-records "
                                                 "rows of small item sets: dpgm.marginals_sensitivity)")
    c_max: float = Field(10.0, gt=0, description="DPNorm range (0, c_max] of per-example gradient norms")
    norm_bins: int = Field(100, ge=2, description="DPNorm histogram bins")
    budget_shares: tuple[float, float, float] = Field(
        dpgm.DEFAULT_SHARES, description="starting split of epsilon (clustering, marginals, SGD) before the common "
                                         "rescaling to the exact total (the defaults: dpgm.DEFAULT_SHARES)")
    match_marginals: bool = Field(True, description="VAE: shift the output biases so the mixture's item "
                                                    "frequencies equal the DP marginals (post-processing)")
    queries: int = Field(1000, ge=5, description="random counting queries of the internal evaluation")

    @model_validator(mode="after")
    def _shares(self):
        if min(self.budget_shares) <= 0 or abs(sum(self.budget_shares) - 1.0) > 1e-9:
            raise ValueError("budget_shares must be three positive numbers summing to 1")
        if self.clip == "dpnorm":
            raise ValueError("synthetic releases take a numeric clip (DPNorm is used inside DP-SGD)")
        return self




MIXTURE, MODELS, TABLE, SYNTHETIC = "mixture.parquet", "models.npz", "cluster_table.npy", "synthetic"
#: Ingested records are non-empty (the ingest contract): length histograms start at 1.
MIN_LENGTH = 1
STEP_CHUNK = 25           # DP-SGD steps whose Poisson samples are fetched from the workers at once
RECORDS_PER_PART = 200_000


@lru_cache(maxsize=32)
def _calibrated(epsilon, delta, iterations, q, steps, max_items, shares) -> dpgm.NoisePlan:
    return dpgm.calibrate(epsilon=epsilon, delta=delta, kmeans_iterations=iterations, q=q, steps=steps,
                          max_items=max_items, shares=shares)


def noise_plan(spec) -> dpgm.NoisePlan:
    p = spec.release
    return _calibrated(p.epsilon, p.delta, p.iterations, p.q, p.steps, p.max_items, tuple(p.budget_shares))


def sgd_config(spec) -> dpgm.SGDConfig:
    p = spec.release
    return dpgm.SGDConfig(model=p.model, hidden=tuple(p.hidden), steps=p.steps, q=p.q, c_max=p.c_max,
                          bins=p.norm_bins, lr=p.lr)


def _labels(X, rff, clip, centres) -> np.ndarray:
    return kk.nearest(kk.clip_rows(rff.transform(X), clip), centres) if X.shape[0] else np.zeros(0, np.int64)


def partition_cluster_counts(X, rff, clip, centres, k, max_items) -> np.ndarray:
    return dpgm.cluster_counts(X, _labels(X, rff, clip, centres), k, max_items, MIN_LENGTH)


def partition_batches(X, seed, rff, clip, centres, q, first_step, n_steps):
    """Poisson samples of rate q of this partition for steps first_step .. first_step + n_steps - 1:
    (rows CSR, step of every row, cluster of every row). Drawn as Binomial(n, q) records uniformly without
    replacement, which is the same distribution as independent Bernoulli(q) inclusions."""
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    picks = [rng.choice(n, rng.binomial(n, q), replace=False) for _ in range(n_steps)]
    steps = np.repeat(np.arange(first_step, first_step + n_steps), [p.size for p in picks])
    rows = X[np.concatenate(picks)] if picks else X[:0]
    return rows, steps, _labels(rows, rff, clip, centres)


class BatchStream:
    """batches(step) -> the Poisson batch of every cluster, fetched from the workers STEP_CHUNK steps at once."""

    def __init__(self, data: Partitioned, rng, rff, clip, centres, q: float, steps: int, k: int):
        self.data, self.rng, self.args, self.steps, self.k = data, rng, (rff, clip, centres, q), steps, k
        self.first = -1

    def _fetch(self, first: int) -> None:
        count = min(STEP_CHUNK, self.steps - first)
        parts = self.data.map_seeded(partition_batches, self.rng, *self.args, first, count)
        rows = sp.vstack([p[0] for p in parts]).tocsr()
        key = np.concatenate([p[1] for p in parts]) * self.k + np.concatenate([p[2] for p in parts])
        order = np.argsort(key, kind="stable")
        self.rows, self.first = rows[order], first
        self.bounds = np.searchsorted(key[order], np.arange(first * self.k, (first + count) * self.k + 1))

    def __call__(self, step: int) -> list[sp.csr_matrix]:
        if self.first < 0 or step >= self.first + STEP_CHUNK:
            self._fetch(step)
        base = (step - self.first) * self.k
        return [self.rows[self.bounds[base + c]:self.bounds[base + c + 1]] for c in range(self.k)]


class SyntheticKind(ReleaseKind):
    name = "synthetic"
    Params = SyntheticParams
    shape = "sets"
    prepared_stage = None
    summary = ("DPGM (Acs et al. Algorithm 1): DP kernel k-means, Gaussian per-cluster item marginals, one "
               "generative model per cluster (VAE or RBM) trained by DP-SGD with DPNorm clipping; synthetic "
               "set-valued records drawn from the mixture")

    def example(self):
        # budget_shares explicit: with the default (0.15, 0.8, 0.05) at these sizes no Gaussian entry leaves the
        # conformance audit enough power to be run (its margin would exceed the claim); the replay checks all.
        return {"kind": "synthetic", "k": 2, "iterations": 2, "features": 20, "gamma": 0.05, "steps": 4,
                "q": 0.2, "hidden": [8], "max_items": 10, "epsilon": 2.0, "delta": 1e-6, "queries": 20,
                "budget_shares": [0.15, 0.35, 0.5]}

    def public_defaults(self, release, dataset):
        """k from the public item count when the spec leaves it out (`dpgm.default_k`)."""
        items = dataset.get("item_count")
        if "k" in release or not (isinstance(items, int) and not isinstance(items, bool) and items >= 1):
            return release   # set, or left to validation to refuse
        return {**release, "k": dpgm.default_k(items)}

    def check_feasible(self):
        check_public_sample(self.spec)

    @cached_property
    def footprint(self):
        """The clustering's (`clustering_footprint`), the per-cluster marginals' noisy values, and the k models:
        every model's weights with their gradient, update and Adam moments (five float64 copies), trained for
        `steps` steps (about twenty operations per weight and step besides the batch's, whose size is private)."""
        p, m = self.spec.release, self.spec.dataset.item_count
        cells = (p.k + 2) * (m + 1 + p.max_items - MIN_LENGTH + 1)
        h = p.hidden
        weights = m * h[0] if p.model == "rbm" else 2 * m * h[0] + sum(a * b for a, b in zip(h, h[1:])) * 2
        return (clustering_footprint(p, m)
                + noise_footprint(cells, "gaussian", False, f"the {cells:,} noisy per-cluster marginals")
                + Footprint(5 * 8.0 * p.k * weights, 20.0 * p.steps * p.k * weights / FLOPS,
                            f"the {p.k} models of {weights:,} weights each"))

    @cached_property
    def plan(self):
        p = self.spec.release
        return dpgm.plan(noise_plan(self.spec), kmeans_iterations=p.iterations, q=p.q, steps=p.steps,
                         max_items=p.max_items, k=p.k, items=self.spec.dataset.item_count, features=p.features)

    def draw(self, prepared, measure, public_rng, log):
        ds = self.spec.dataset
        data = Partitioned.sets(current_client(), parquet_files(prepared.path), ds.items_column, ds.item_count)
        try:
            clustered = measure_marginals(self.spec, data, measure, public_rng, log)
            trained = train_mixture(self.spec, data, clustered, measure, public_rng, log)
        finally:
            data.close()
        return mixture_draw(self.spec, clustered, trained, public_rng)

    @cached_property
    def measurements_contract(self):
        return MIXTURE, suites.mixture(self.spec.release.k)

    def postprocess(self, measurements, staging, internal, log):
        """Synthetic records from the stored mixture, |D~| = the sum of the noisy cluster sizes."""
        spec = self.spec
        plan = synthesis(spec, measurements)
        out = staging / SYNTHETIC
        # The workers write the parts where every worker can: the run's scratch when it is a store (workers on other
        # hosts share no disk with this one), then they are copied here.
        parts = RunPaths.of(spec.output_dir, plan.meta["release_id"]).stage(SYNTHETIC) if settings.current().scratch \
            else str(out)
        storage.remove(parts)
        storage.makedirs(parts)
        done = write_synthetic(parts, spec.dataset.items_column, plan, log)
        if parts != str(out):
            storage.download(parts, out)
        meta = plan.meta
        pq.write_table(pq.read_table(measurements / MIXTURE), staging / MIXTURE)
        (staging / "synthetic.json").write_text(json.dumps({
            "records": done, "format": f"Parquet, column '{spec.dataset.items_column}' list<int32> of item ids in "
                                       f"[0, {meta['item_count']}); n_items, min_item, max_item per record",
            "model": meta["model"], "clusters": meta["k"]}, indent=2))
        return [SYNTHETIC, MIXTURE, "synthetic.json"]

    @cached_property
    def release_contract(self):
        return SYNTHETIC, suites.synthetic_sets(self.spec.dataset.items_column, self.spec.dataset.item_count)

    def direct_values(self, measurements, plan):
        """The clustering's noisy sizes; the synthetic records have no interval (docs/uncertainty.md)."""
        return noisy_sizes(plan)

    def evaluate(self, run, prepared, log):
        """Counting queries (§6.3) on raw vs synthetic records, with the MWEM (linear) and independent-items
        (any-of) baselines at the same epsilon; plot in internal/evaluation/."""
        return evaluate_counting(self.spec, run, prepared, log)


def write_synthetic(out, column: str, plan: "Synthesis", log) -> int:
    """The synthesis's parts synthesised and written as Parquet parts on the dask workers, in parallel (each part its
    own generator, seeded by `synthesis`); returns the number of records."""
    from distributed import as_completed

    client = current_client()
    [mixture] = client.scatter([(plan.models, plan.marginals)], broadcast=True)
    futures = client.map(write_synthetic_part, [storage.join(out, f"part.{i}.parquet") for i in range(len(plan.parts))],
                         [c for c, _, _ in plan.parts], [n for _, n, _ in plan.parts], [s for _, _, s in plan.parts],
                         mixture=mixture, column=column)
    done, total = 0, sum(c.size for c, _, _ in plan.parts)
    for future in as_completed(futures):
        done += future.result()
        log.info("synthetic records: %d/%d", done, total)
    return done


def write_synthetic_part(path: str, clusters: np.ndarray, lengths: np.ndarray, seed: int, mixture: tuple,
                         column: str) -> int:
    models, marginals = mixture
    X = dpgm.synthesize_part(models, marginals, clusters, lengths, np.random.default_rng(seed))
    storage.write_table(set_table(column, X.indptr, X.indices), path)
    return X.shape[0]


@dataclass(frozen=True)
class Clustered:
    """The first two measurements of a DPGM release: the DP kernel k-means (feature map, gamma, clipping bound,
    result) and the noisy per-cluster marginals table under its final centres."""
    rff: object
    gamma: float
    clip: float
    result: object
    table: np.ndarray


@dataclass(frozen=True)
class Trained:
    """The DP-SGD measurement: the cluster models, the noisy cluster sizes that weight them, the mean clip per
    step."""
    models: list
    sizes: np.ndarray
    clips: list


def measure_marginals(spec, data, measure, public_rng: np.random.Generator, log=None) -> Clustered:
    """DP kernel k-means of the records in `data` (as the `kernel_kmeans` kind), then the Gaussian measurement of
    the per-cluster item counts, sizes and length histograms under its final centres. `data`: the dask partitions
    (`Partitioned`) or, in benchmarks, one in-memory partition (`tasks.partitions.InMemory`)."""
    p = spec.release
    rff, gamma, clip, res = cluster_records(spec, data, measure, public_rng, log, reseed=True)
    table = measure("marginals", data.reduce(partition_cluster_counts, rff, clip, res.centres, p.k, p.max_items))
    return Clustered(rff, gamma, clip, res, table)


def train_mixture(spec, data, clustered: Clustered, measure, public_rng: np.random.Generator, log=None) -> Trained:
    """One generative model per cluster, started from its noisy marginals, trained by DP-SGD on Poisson samples of
    the records of `data` (the samples' seeds from the noise source's secret generator: who is sampled stays
    secret, amplification by sampling)."""
    p, ds = spec.release, spec.dataset
    marginals, sizes = dpgm.marginals_and_sizes(clustered.table, ds.item_count)
    cfg = sgd_config(spec)
    models = [dpgm.make_model(cfg, ds.item_count, public_rng, marginals[c]) for c in range(p.k)]
    every = max(1, p.steps // 10)
    if log is not None:
        log.info("DP-SGD: %d %s models, %d steps, q=%g", p.k, p.model, p.steps, p.q)
    batches = BatchStream(data, measure.secret_generator(), clustered.rff, clustered.clip, clustered.result.centres,
                          p.q, p.steps, p.k)
    clips = dpgm.train(models, batches, sizes, cfg, measure,
                       progress=lambda s, t: log is not None and s % every == 0 and log.info("DP-SGD step %d/%d", s, t))
    return Trained(models, sizes, clips)


def mixture_draw(spec, clustered: Clustered, trained: Trained, public_rng: np.random.Generator) -> Draw:
    """The measurements' files (the clustering, the marginals table, the mixture's weights, the models) and their
    metadata, with the synthesis seed (public randomness: the synthetic records are post-processing)."""
    p, ds = spec.release, spec.dataset
    sizes, models = trained.sizes, trained.models
    records = int(round(sizes.sum()))  # noqa: RUF046 (a numpy scalar)
    meta = {"k": p.k, "iterations": p.iterations, "features": p.features, "gamma": clustered.gamma,
            "clip": clustered.clip, "item_count": ds.item_count, "model": p.model, "hidden": list(p.hidden),
            "steps": p.steps, "q": p.q, "records": records,
            "synthesis_seed": int(public_rng.integers(0, 2 ** 63 - 1)), "sgd_mean_clip_per_step": trained.clips}

    def write(folder):
        write_clustering(folder, clustered.rff, clustered.result)
        np.save(folder / TABLE, clustered.table)
        pq.write_table(pa.table({"cluster": np.arange(p.k, dtype=np.int32), "noisy_size": sizes,
                                 "weight": sizes / sizes.sum()}), folder / MIXTURE)
        np.savez(folder / MODELS, **{f"c{c}_{name}": a for c, model in enumerate(models)
                                     for name, a in dpgm.model_arrays(model).items()})
    return Draw(write=write, meta=meta)


@dataclass(frozen=True)
class Synthesis:
    """What the postprocessing synthesises from the measurements: the models (matched to the marginals when the
    spec says so), the marginals, and the parts of the record plan, each (clusters, lengths, seed of its generator)
    of at most RECORDS_PER_PART records; `meta` the measurements' metadata."""
    models: list
    marginals: np.ndarray
    parts: list
    meta: dict


def synthesis(spec, measurements) -> Synthesis:
    """The synthesis of a release from its measurements and public parameters only (the postprocessing's first
    step; its parts are then synthesised on the workers, `write_synthetic`, or in memory, `synthetic_records`)."""
    meta = read_meta(measurements)
    models = load_models(measurements, meta)
    weights = pq.read_table(measurements / MIXTURE).column("noisy_size").to_numpy()
    rng = np.random.default_rng(meta["synthesis_seed"])
    table, items = stored_table(measurements, meta, spec.release.max_items), meta["item_count"]
    lengths = dpgm.length_distributions(table, items, MIN_LENGTH)
    marginals = dpgm.marginals_and_sizes(table, items)[0]
    if spec.release.match_marginals:
        dpgm.match_marginals(models, marginals, lengths, MIN_LENGTH, rng)
    clusters, record_lengths = dpgm.record_plan(weights, lengths, MIN_LENGTH, meta["records"], rng, RECORDS_PER_PART)
    starts = range(0, clusters.size, RECORDS_PER_PART)
    seeds = rng.integers(0, 2 ** 63 - 1, len(starts))
    parts = [(clusters[a:a + RECORDS_PER_PART], record_lengths[a:a + RECORDS_PER_PART], seed)
             for a, seed in zip(starts, seeds)]
    return Synthesis(models, marginals, parts, meta)


def synthetic_records(plan: Synthesis) -> sp.csr_matrix:
    """The released synthetic records of a synthesis, synthesised part by part in this process (the parts the
    workers write, in part order): for benchmarks that score what a release publishes without a dask cluster."""
    return sp.vstack([dpgm.synthesize_part(plan.models, plan.marginals, c, n, np.random.default_rng(seed))
                      for c, n, seed in plan.parts]).tocsr()


def stored_table(measurements, meta, max_items: int) -> np.ndarray:
    """The noisy marginals table, refused when its layout is not the one this version writes (`cluster_counts`:
    measurements drawn by an older version, before the rows of all records, would be misread, not redrawn)."""
    table = np.load(measurements / TABLE)
    expected = (meta["k"] + 2, meta["item_count"] + 1 + max_items - MIN_LENGTH + 1)
    if table.shape != expected:
        raise ReleaseConflict(f"the stored marginals table is {table.shape[0]} x {table.shape[1]} where this version "
                              f"reads {expected[0]} x {expected[1]}: the measurements were drawn by another version "
                              f"of the pipeline; postprocess them with that version")
    return table


def load_models(measurements, meta) -> list:
    arrays = np.load(measurements / MODELS)
    return [dpgm.load_model(meta["model"], {name.split("_", 1)[1]: arrays[name] for name in arrays.files
                                            if name.startswith(f"c{c}_")}, tuple(meta["hidden"]))
            for c in range(meta["k"])]


def partition_counting(X, Q, max_items, table_max_items):
    """(item counts, any-of answers, item counts weighted to max_items, the one-cluster `cluster_counts` table at
    table_max_items) of a partition."""
    return (counting.item_counts(X), counting.anyof_answers(X, Q), counting.weighted_item_counts(X, max_items),
            dpgm.cluster_counts(X, np.zeros(X.shape[0], np.int64), 1, table_max_items, MIN_LENGTH))


def partition_synthetic_counting(X, Q):
    """(item counts, any-of answers) of a partition of synthetic records."""
    return counting.item_counts(X), counting.anyof_answers(X, Q)


def evaluate_counting(spec, run, prepared, log, max_items: int = 12, mwem_rounds: int = 50) -> dict:
    from tasks.experiments.plots import line_grid

    p, ds = spec.release, spec.dataset
    rng = np.random.default_rng(0)  # evaluation queries and baselines: internal, not a release
    Q, buckets = counting.random_queries(ds.item_count, p.queries, rng)
    client = current_client()
    raw = Partitioned.sets(client, parquet_files(prepared.path), ds.items_column, ds.item_count)
    syn = Partitioned.sets(client, parquet_files(run.release / SYNTHETIC), ds.items_column, ds.item_count)
    try:
        counts, anyof, clipped, table = raw.reduce(partition_counting, Q, max_items, p.max_items)
        s_counts, s_anyof = syn.reduce(partition_synthetic_counting, Q)
    finally:
        raw.close()
        syn.close()
    n = int(prepared.rows)
    true_lin = counting.linear_answers(counts, Q)
    err = lambda est, true: counting.by_bucket(counting.relative_errors(true, est, n), buckets)
    mwem = counting.mwem_linear(clipped, Q, epsilon=p.epsilon, max_items=max_items, rounds=mwem_rounds, rng=rng)
    # The independent-items baseline of the release's (epsilon, delta) and max_items (`dpgm.independent_plan`).
    plan = dpgm.independent_plan(epsilon=p.epsilon, delta=p.delta, max_items=p.max_items, items=ds.item_count,
                                 min_length=MIN_LENGTH)
    indep = dpgm.independent_items(noise_sources.simulated(plan, rng)("marginals", table), ds.item_count, rng,
                                   MIN_LENGTH)
    errors = {"dpgm_linear": err(counting.linear_answers(s_counts, Q), true_lin),
              "mwem_linear": err(counting.linear_answers(mwem, Q), true_lin),
              "dpgm_anyof": err(s_anyof, anyof),
              "independent_anyof": err(counting.anyof_answers(indep, Q), anyof)}
    out = run.internal / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    line_grid(error_frame(errors), x="query length (% of items, bucket upper end)", y="relative error",
              cols="query class", path=out / "counting_queries.png",
              title=f"{ds.id}: {p.model} mixture vs baselines, epsilon = {p.epsilon:g}")
    fmt = lambda v: ", ".join(f"{x:.3g}" for x in v)
    return {"records": n, "synthetic_records": int(syn_rows(run)), "queries": p.queries,
            "relative_error_by_length_bucket": {k: v.tolist() for k, v in errors.items()},
            "headline": f"linear queries: DPGM {fmt(errors['dpgm_linear'])} vs MWEM {fmt(errors['mwem_linear'])}; "
                        f"any-of: DPGM {fmt(errors['dpgm_anyof'])} vs independent "
                        f"{fmt(errors['independent_anyof'])}"}


def error_frame(errors: dict[str, np.ndarray]):
    """Long table (method, query class, bucket upper end in %, relative error) of `method_class` keys."""
    import pandas as pd

    return pd.DataFrame([{"method": key.rsplit("_", 1)[0], "query class": key.rsplit("_", 1)[1],
                          "query length (% of items, bucket upper end)": 100 * (b + 1) // counting.BUCKETS,
                          "relative error": float(v)} for key, vals in errors.items() for b, v in enumerate(vals)])


def syn_rows(run) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in parquet_files(run.release / SYNTHETIC))


KIND = SyntheticKind()
