"""DPGM end to end on in-memory set-valued records, for benchmarks and experiments: DP kernel k-means,
DP-SGD mixture (VAE or RBM), synthetic records, counting-query errors against MWEM and independent items.

The noise of the three parts (clustering, per-cluster marginals, DP-SGD) is calibrated together
(`dpgm.calibrate`) so that the whole is (epsilon, delta)-DP; the baselines get the same epsilon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from dpalgos import accounting, counting, dpgm
from dpalgos import kernel_kmeans as kk
from dpalgos.noise import simulated


@dataclass
class DPGMSettings:
    epsilon: float = 1.74
    delta: float = 1e-6
    k: int = dpgm.DEFAULT_K
    kmeans_iterations: int = dpgm.DEFAULT_ITERATIONS
    features: int = 200
    gamma: float = 0.05
    init_items: int = 10
    max_items: int = 30
    match_marginals: bool = True
    empty_records: bool = False      # records may be empty (a length of their own), e.g. after an item restriction
    shares: tuple[float, float, float] = dpgm.DEFAULT_SHARES
    sgd: dpgm.SGDConfig = field(default_factory=dpgm.SGDConfig)


def cluster(X: sp.csr_matrix, settings: DPGMSettings, measure, rng: np.random.Generator):
    """DP kernel k-means of the records; returns (noisy sizes of the last iteration, final labels)."""
    rff = kk.rbf_features(X.shape[1], settings.features, settings.gamma, rng)
    rows = np.repeat(np.arange(settings.k), settings.init_items)
    cols = np.concatenate([rng.choice(X.shape[1], settings.init_items, replace=False) for _ in range(settings.k)])
    init = rff.transform(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(settings.k, X.shape[1])))
    Z = kk.clip_rows(rff.transform(X), 1.0)
    res = kk.dp_lloyd(lambda C: kk.grouped_stats(Z, C), init, iterations=settings.kmeans_iterations, clip=1.0,
                      measure=measure)
    return np.maximum(res.noisy_counts[-1], 1.0), kk.nearest(Z, res.centres)


def measured_table(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator) -> np.ndarray:
    """The noisy marginals table of a run (clustering and the table's measurement only, as `run` draws them)."""
    return _clustered(X, settings, rng).table


class _Clustered(NamedTuple):
    noise: object
    plan: object
    measure: object
    labels: np.ndarray
    table: np.ndarray


def _clustered(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator) -> _Clustered:
    """A run's calibration and plan, its simulated measure, the clustering's labels and the noisy marginals table
    (the draws `run` makes before training, in its order)."""
    cfg, min_length = settings.sgd, 0 if settings.empty_records else 1
    noise = dpgm.calibrate(epsilon=settings.epsilon, delta=settings.delta,
                           kmeans_iterations=settings.kmeans_iterations, q=cfg.q, steps=cfg.steps,
                           max_items=settings.max_items, shares=settings.shares)
    plan = dpgm.plan(noise, kmeans_iterations=settings.kmeans_iterations, q=cfg.q, steps=cfg.steps,
                     max_items=settings.max_items, min_length=min_length)
    measure = simulated(plan, rng)
    _, labels = cluster(X, settings, measure, rng)
    table = measure("marginals", dpgm.cluster_counts(X, labels, settings.k, settings.max_items, min_length))
    return _Clustered(noise, plan, measure, labels, table)


def run(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator):
    """Train the mixture; returns (synthetic records, guarantee, diagnostics)."""
    cfg, min_length = settings.sgd, 0 if settings.empty_records else 1
    noise, plan, measure, labels, table = _clustered(X, settings, rng)
    marg, sizes = dpgm.marginals_and_sizes(table, X.shape[1])
    lengths = dpgm.length_distributions(table, X.shape[1], min_length)
    members = [np.flatnonzero(labels == c) for c in range(settings.k)]
    models = [dpgm.make_model(cfg, X.shape[1], rng, marg[c]) for c in range(settings.k)]

    def batches(step):
        return [X[idx[rng.random(idx.size) < cfg.q]] for idx in members]
    dpgm.train(models, batches, sizes, cfg, measure)
    if settings.match_marginals:
        dpgm.match_marginals(models, marg, lengths, min_length, rng)
    synthetic = dpgm.synthesize(models, sizes, lengths, marg, min_length, int(round(sizes.sum())), rng)  # noqa: RUF046
    guarantee = accounting.epsilon_at(plan.event(), settings.delta)
    return synthetic, guarantee, {"plan": noise, "cluster_sizes": sizes.tolist()}


def evaluate(X: sp.csr_matrix, synthetic: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator,
             max_items: int = 12, mwem_rounds: int = 50) -> dict:
    """Relative errors by query-length bucket: DPGM (linear, any-of), MWEM (linear), independent (any-of).
    The baselines get the same total epsilon as DPGM."""
    Q, buckets = counting.random_queries(X.shape[1], 1000, rng)
    n = X.shape[0]
    true_counts = counting.item_counts(X)
    true_lin = counting.linear_answers(true_counts, Q)
    true_any = counting.anyof_answers(X, Q)
    out = {"dpgm": counting.by_bucket(counting.relative_errors(
        true_lin, counting.linear_answers(counting.item_counts(synthetic), Q), n), buckets)}
    out["dpgm_anyof"] = counting.by_bucket(counting.relative_errors(true_any, counting.anyof_answers(synthetic, Q), n),
                                           buckets)
    clipped = counting.item_counts(counting.clip_records(X, max_items, rng))
    mwem = counting.mwem_linear(clipped, Q, epsilon=settings.epsilon, max_items=max_items, rounds=mwem_rounds, rng=rng)
    out["mwem"] = counting.by_bucket(counting.relative_errors(true_lin, counting.linear_answers(mwem, Q), n), buckets)
    # With empty records (a restriction of the items) the length histogram keeps them as a length of their own,
    # as DPGM does.
    indep = counting.independent_records(X, epsilon=settings.epsilon, max_items=max_items, n=n, rng=rng,
                                         min_length=0 if settings.empty_records else 1)
    out["independent_anyof"] = counting.by_bucket(counting.relative_errors(true_any, counting.anyof_answers(indep, Q),
                                                                           n), buckets)
    return out


def restrict_items(X: sp.csr_matrix, items: int) -> sp.csr_matrix:
    """The records over their `items` most frequent items (a benchmark's fixed restriction, as the paper takes
    the item universe from the file: not a release, whose items come from its spec); records may become
    empty."""
    top = np.sort(np.argsort(-counting.item_counts(X), kind="stable")[:items])
    return X[:, top].tocsr()


def load_transactions(path) -> sp.csr_matrix:
    """A transactions file (one record per line, items as space-separated integers, optionally gzipped) as a
    binary CSR matrix over the item ids that occur in it, renumbered 0..m-1.

    Benchmark convenience: taking the item universe from the file is what the paper does with its datasets;
    a release takes `item_count` from its spec instead."""
    import tempfile
    from pathlib import Path

    from tasks.sets import ingest_sets, read_sets

    with tempfile.TemporaryDirectory() as tmp:
        ingest_sets(Path(path), "transactions", "items", Path(tmp) / "sets")
        parts = sorted((Path(tmp) / "sets").glob("*.parquet"), key=lambda f: int(f.stem.split(".")[1]))
        import pyarrow.parquet as pq

        top = max(int(pq.read_table(f, columns=["max_item"]).column("max_item").to_numpy().max()) for f in parts)
        X = sp.vstack([read_sets(str(f), "items", top + 1) for f in parts]).tocsr()
    used = np.flatnonzero(np.diff(X.tocsc().indptr) > 0)
    return X[:, used].tocsr()
