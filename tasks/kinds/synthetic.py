"""The `synthetic` release kind: DPGM (Acs et al. Algorithm 1) on set-valued records, on dask.

DP measurement (one charge, one (epsilon, delta) for all of it, noise calibrated by `dpgm.calibrate`):
  1. DP kernel k-means of the records (as the `kernel_kmeans` kind);
  2. the Gaussian measurement of the per-cluster item counts and sizes under the final centres;
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
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from data_contracts import suites
from data_contracts.validate import parquet_files
from dpalgos import counting, dpgm
from dpalgos import kernel_kmeans as kk
from tasks.kinds.base import Draw, IngestedAsPrepared
from tasks.kinds.kernel_kmeans import _client, cluster_records, trajectory_contract, write_clustering
from tasks.partitions import Partitioned
from tasks.sets import set_table

MIXTURE, MODELS, TABLE, SYNTHETIC = "mixture.parquet", "models.npz", "cluster_table.npy", "synthetic"
STEP_CHUNK = 25           # DP-SGD steps whose Poisson samples are fetched from the workers at once
RECORDS_PER_PART = 200_000


@lru_cache(maxsize=32)
def _plan(epsilon, delta, iterations, q, steps, shares) -> dpgm.NoisePlan:
    return dpgm.calibrate(epsilon=epsilon, delta=delta, kmeans_iterations=iterations, q=q, steps=steps,
                          shares=shares)


def noise_plan(spec) -> dpgm.NoisePlan:
    p = spec.release
    return _plan(p.epsilon, p.delta, p.iterations, p.q, p.steps, tuple(p.budget_shares))


def sgd_config(spec, plan: dpgm.NoisePlan) -> dpgm.SGDConfig:
    p = spec.release
    return dpgm.SGDConfig(model=p.model, hidden=tuple(p.hidden), steps=p.steps, q=p.q, sigma_grad=plan.sigma_sgd,
                          sigma_norm=plan.sigma_sgd, c_max=p.c_max, bins=p.norm_bins, lr=p.lr)


def _labels(X, rff, clip, centres) -> np.ndarray:
    return kk.nearest(kk.clip_rows(rff.transform(X), clip), centres) if X.shape[0] else np.zeros(0, np.int64)


def partition_cluster_counts(X, rff, clip, centres, k, max_items) -> np.ndarray:
    return dpgm.cluster_counts(X, _labels(X, rff, clip, centres), k, max_items)


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


class SyntheticKind(IngestedAsPrepared):
    name = "synthetic"

    def check_feasible(self, spec, prepared):
        if spec.release.k > prepared.rows:
            from tasks.errors import InputError

            raise InputError(f"k = {spec.release.k} clusters but only {prepared.rows} records")

    def event(self, spec):
        p = spec.release
        return dpgm.privacy_event(noise_plan(spec), kmeans_iterations=p.iterations, q=p.q, steps=p.steps)

    def draw(self, spec, prepared, rng, log):
        p, ds = spec.release, spec.dataset
        plan = noise_plan(spec)
        log.info("noise multipliers: k-means %.4g, marginals %.4g, DP-SGD %.4g", plan.sigma_kmeans,
                 plan.sigma_marginals, plan.sigma_sgd)
        data = Partitioned.sets(_client(), parquet_files(prepared.path), ds.items_column, ds.item_count)
        try:
            rff, gamma, clip, res = cluster_records(spec, data, plan.sigma_kmeans, rng, log)
            table = dpgm.noisy_cluster_table(
                data.reduce(partition_cluster_counts, rff, clip, res.centres, p.k, p.max_items),
                max_items=p.max_items, sigma=plan.sigma_marginals, rng=rng)
            marginals, sizes = dpgm.marginals_and_sizes(table)
            cfg = sgd_config(spec, plan)
            models = [dpgm.make_model(cfg, ds.item_count, rng, marginals[c]) for c in range(p.k)]
            log.info("DP-SGD: %d %s models, %d steps, q=%g, expected batch %.0f records per step", p.k, p.model,
                     p.steps, p.q, p.q * sizes.sum())
            every = max(1, p.steps // 10)
            clips = dpgm.train(models, BatchStream(data, rng, rff, clip, res.centres, p.q, p.steps, p.k), sizes, cfg,
                               rng, progress=lambda s, t: s % every == 0 and log.info("DP-SGD step %d/%d", s, t))
        finally:
            data.close()
        meta = {"k": p.k, "iterations": p.iterations, "features": p.features, "gamma": gamma, "clip": clip,
                "epsilon": p.epsilon, "delta": p.delta, "item_count": ds.item_count, "model": p.model,
                "hidden": list(p.hidden), "steps": p.steps, "q": p.q, "sigma_kmeans": plan.sigma_kmeans,
                "sigma_marginals": plan.sigma_marginals, "sigma_sgd": plan.sigma_sgd,
                "records": int(round(sizes.sum())), "synthesis_seed": int(rng.integers(0, 2 ** 63 - 1)),
                "sgd_mean_clip_per_step": clips}

        def write(folder):
            write_clustering(folder, rff, res)
            np.save(folder / TABLE, table)
            pq.write_table(pa.table({"cluster": np.arange(p.k, dtype=np.int32), "noisy_size": sizes,
                                     "weight": sizes / sizes.sum()}), folder / MIXTURE)
            np.savez(folder / MODELS, **{f"c{c}_{name}": a for c, model in enumerate(models)
                                         for name, a in dpgm.model_arrays(model).items()})
        return Draw(write=write, meta=meta)

    def measurements_contract(self, spec):
        import great_expectations.expectations as gxe

        cols = ["cluster", "noisy_size", "weight"]
        rows = ([gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols)] + suites._finite(gxe, cols)
                + [gxe.ExpectColumnValuesToBeBetween(column="noisy_size", min_value=1),
                   gxe.ExpectColumnValuesToBeBetween(column="weight", min_value=0, max_value=1)])
        return MIXTURE, suites.Contract("measurements", rows=rows, partitioned=False,
                                        table=[gxe.ExpectTableRowCountToEqual(value=spec.release.k)])

    def postprocess(self, spec, measurements, staging, internal, log):
        """Synthetic records from the stored mixture, |D~| = the sum of the noisy cluster sizes."""
        from tasks.stages import read_meta

        meta = read_meta(measurements)
        models = load_models(measurements, meta)
        weights = pq.read_table(measurements / MIXTURE).column("noisy_size").to_numpy()
        rng = np.random.default_rng(meta["synthesis_seed"])
        if spec.release.match_marginals:
            dpgm.match_marginals(models, dpgm.marginals_and_sizes(np.load(measurements / TABLE))[0], rng)
        out = staging / SYNTHETIC
        out.mkdir()
        done = 0
        for i, X in enumerate(dpgm.synthesize_chunks(models, weights, meta["records"], rng, chunk=RECORDS_PER_PART)):
            pq.write_table(set_table(spec.dataset.items_column, X.indptr, X.indices), out / f"part.{i}.parquet")
            done += X.shape[0]
            log.info("synthetic records: %d/%d", done, meta["records"])
        pq.write_table(pq.read_table(measurements / MIXTURE), staging / MIXTURE)
        (staging / "synthetic.json").write_text(json.dumps({
            "records": done, "format": f"Parquet, column '{spec.dataset.items_column}' list<int32> of item ids in "
                                       f"[0, {meta['item_count']}); n_items, min_item, max_item per record",
            "model": meta["model"], "clusters": meta["k"]}, indent=2))
        return [SYNTHETIC, MIXTURE, "synthetic.json"]

    def release_contract(self, spec):
        contract = suites.ingested_sets(spec.dataset.items_column, spec.dataset.item_count)
        contract.stage = "release"
        return SYNTHETIC, contract

    def mechanisms(self, spec):
        p = spec.release
        plan = noise_plan(spec)
        s2 = float(kk.SQRT2)
        return [
            {"mechanism": "Gaussian", "query": "cluster sizes at each k-means iteration", "l2_sensitivity": s2,
             "std": s2 * plan.sigma_kmeans, "noise_multiplier": plan.sigma_kmeans, "repetitions": p.iterations},
            {"mechanism": "Gaussian", "query": "sums of clipped random Fourier features per cluster at each k-means "
                                               "iteration", "l2_sensitivity": "sqrt(2) * C_s",
             "std": f"sqrt(2) * C_s * {plan.sigma_kmeans:.6g}", "noise_multiplier": plan.sigma_kmeans, "repetitions": p.iterations},
            {"mechanism": "Gaussian", "query": f"per-cluster item counts (records weighted to at most "
                                               f"{p.max_items} items) and sizes",
             "l2_sensitivity": float(np.sqrt(p.max_items + 1)), "std": float(np.sqrt(p.max_items + 1))
             * plan.sigma_marginals, "noise_multiplier": plan.sigma_marginals, "repetitions": 1},
            {"mechanism": "Poisson-subsampled Gaussian", "query": "DP-SGD step: histogram of per-example gradient "
                                                                  "norms (DPNorm) and the clipped gradient sum",
             "l2_sensitivity": "1 (histogram), C_s (gradient)",
             "std": f"{plan.sigma_sgd:.6g} (histogram), {plan.sigma_sgd:.6g} * C_s (gradient)",
             "noise_multiplier": plan.sigma_sgd,
             "sampling_rate": p.q, "repetitions": p.steps}]

    def evaluate(self, spec, run, prepared, log):
        """Counting queries (§6.3) on raw vs synthetic records, with the MWEM (linear) and independent-items
        (any-of) baselines at the same epsilon; plot in internal/evaluation/."""
        return evaluate_counting(spec, run, prepared, log)


def load_models(measurements, meta) -> list:
    arrays = np.load(measurements / MODELS)
    return [dpgm.load_model(meta["model"], {name.split("_", 1)[1]: arrays[name] for name in arrays.files
                                            if name.startswith(f"c{c}_")}, tuple(meta["hidden"]))
            for c in range(meta["k"])]


def partition_counting(X, Q, max_items):
    """(item counts, any-of answers, weighted item counts, record-length histogram 1..max_items) of a partition."""
    return (counting.item_counts(X), counting.anyof_answers(X, Q), counting.weighted_item_counts(X, max_items),
            counting.length_histogram(X, max_items))


def partition_synthetic_counting(X, Q):
    """(item counts, any-of answers) of a partition of synthetic records."""
    return counting.item_counts(X), counting.anyof_answers(X, Q)


def evaluate_counting(spec, run, prepared, log, max_items: int = 12, mwem_rounds: int = 50) -> dict:
    from tasks.experiments.plots import line_grid

    p, ds = spec.release, spec.dataset
    rng = np.random.default_rng(0)  # evaluation queries and baselines: internal, not a release
    Q, buckets = counting.random_queries(ds.item_count, p.queries, rng)
    client = _client()
    raw = Partitioned.sets(client, parquet_files(prepared.path), ds.items_column, ds.item_count)
    syn = Partitioned.sets(client, parquet_files(run.release / SYNTHETIC), ds.items_column, ds.item_count)
    try:
        counts, anyof, clipped, lengths = raw.reduce(partition_counting, Q, max_items)
        s_counts, s_anyof = syn.reduce(partition_synthetic_counting, Q)
    finally:
        raw.close()
        syn.close()
    n = int(prepared.rows)
    true_lin = counting.linear_answers(counts, Q)
    err = lambda est, true: counting.by_bucket(counting.relative_errors(true, est, n), buckets)
    mwem = counting.mwem_linear(clipped, Q, epsilon=p.epsilon, max_items=max_items, rounds=mwem_rounds, rng=rng)
    indep = counting.independent_from_stats(clipped, lengths, epsilon=p.epsilon, max_items=max_items, n=n, rng=rng)
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
