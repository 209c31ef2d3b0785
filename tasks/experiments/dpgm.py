"""DPGM end to end on in-memory set-valued records, for benchmarks and experiments: the `synthetic` kind's own
release (DP kernel k-means, per-cluster marginals, DP-SGD mixture, synthesis) of these records under its spec, and
counting-query errors against MWEM and independent items.

`run` makes the release as the kind makes it: its measurement functions (`tasks.kinds.synthetic.measure_marginals`,
`train_mixture`) on the records held in memory (`tasks.partitions.InMemory`), its plan's noise simulated (seeded
numpy, not private), its measurements written as the draw writes them and synthesised by its postprocessing's own
functions (`synthesis`, `synthetic_records`): the synthetic records a release of these records would publish. The
noise of the three parts (clustering, per-cluster marginals, DP-SGD) is calibrated together (`dpgm.calibrate`) so
that the whole is (epsilon, delta)-DP; the baselines get the same epsilon.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dpalgos import accounting, counting, dpgm
from dpalgos.noise import simulated


@dataclass
class DPGMSettings:
    """The release's settings (the `synthetic` kind's spec fields, `release_spec`)."""
    epsilon: float = 1.74
    delta: float = 1e-6
    k: int | None = None             # None: the release's default (`dpgm.default_k` of the item count)
    kmeans_iterations: int = dpgm.DEFAULT_ITERATIONS
    features: int = 200
    gamma: float = 0.05
    init_items: int = 10
    max_items: int = 30
    match_marginals: bool = True
    shares: tuple[float, float, float] = dpgm.DEFAULT_SHARES
    sgd: dpgm.SGDConfig = field(default_factory=dpgm.SGDConfig)


def release_spec(settings: DPGMSettings, items: int):
    """The `synthetic` release spec of these settings on records over `items` items (the kind's defaults for the
    rest: clip 1, no public sample, the initial centres random sets of `init_items` items)."""
    from tasks.spec import parse_spec

    cfg = settings.sgd
    return parse_spec({
        "dataset": {"id": "experiment", "path": "experiment.parquet", "items_column": "items", "item_count": items},
        "release": {"kind": "synthetic", "epsilon": settings.epsilon, "delta": settings.delta,
                    "iterations": settings.kmeans_iterations, "features": settings.features, "gamma": settings.gamma,
                    "random_init_items": settings.init_items, "max_items": settings.max_items,
                    "match_marginals": settings.match_marginals, "budget_shares": list(settings.shares),
                    "model": cfg.model, "hidden": list(cfg.hidden), "steps": cfg.steps, "q": cfg.q, "lr": cfg.lr,
                    "c_max": cfg.c_max, "norm_bins": cfg.bins} | ({} if settings.k is None else {"k": settings.k})})


def measured_table(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator) -> np.ndarray:
    """The noisy marginals table of a release of X (its clustering and the table's measurement only, as `run`
    draws them)."""
    from tasks.kinds.synthetic import KIND, measure_marginals
    from tasks.partitions import InMemory

    spec = release_spec(settings, X.shape[1])
    return measure_marginals(spec, InMemory(X), simulated(KIND.bind(spec).plan, rng), rng).table


def run(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator):
    """The synthetic records a `synthetic` release of X publishes (see the module docstring); `rng` seeds the plan's
    noise (its first draw) and is the public randomness. Returns (synthetic records, guarantee, diagnostics)."""
    from tasks.kinds import synthetic as kind
    from tasks.partitions import InMemory
    from tasks.run import META

    spec = release_spec(settings, X.shape[1])
    plan = kind.KIND.bind(spec).plan
    measure, data = simulated(plan, rng), InMemory(X)
    clustered = kind.measure_marginals(spec, data, measure, rng)
    trained = kind.train_mixture(spec, data, clustered, measure, rng)
    draw = kind.mixture_draw(spec, clustered, trained, rng)
    with tempfile.TemporaryDirectory() as tmp:
        draw.write(Path(tmp))
        (Path(tmp) / META).write_text(json.dumps({"plan": plan.to_json(), **draw.meta}))
        synthetic = kind.synthetic_records(kind.synthesis(spec, Path(tmp)))
    guarantee = accounting.epsilon_at(plan.event(), settings.delta)
    return synthetic, guarantee, {"plan": kind.noise_plan(spec), "cluster_sizes": trained.sizes.tolist()}


def evaluate(X: sp.csr_matrix, synthetic: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator,
             max_items: int = 12, mwem_rounds: int = 50) -> dict:
    """Relative errors by query-length bucket: DPGM (linear, any-of), MWEM (linear; pure epsilon-DP, records
    clipped to `max_items` as the paper configures it), independent items (linear, any-of; `independent`). The baselines
    get the same total epsilon as DPGM."""
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
    indep = independent(X, settings, rng)
    out["independent"] = counting.by_bucket(counting.relative_errors(
        true_lin, counting.linear_answers(counting.item_counts(indep), Q), n), buckets)
    out["independent_anyof"] = counting.by_bucket(counting.relative_errors(true_any, counting.anyof_answers(indep, Q),
                                                                           n), buckets)
    return out


def independent(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator) -> sp.csr_matrix:
    """The independent-items baseline of a release of X under `settings` (`dpgm.independent_items`): the table of
    all records as DPGM measures it (the release's max_items and present/absent rule, min length 1), its
    Gaussian noise calibrated to the release's (epsilon, delta) (`dpgm.independent_plan`, simulated as `run`'s)."""
    m = X.shape[1]
    plan = dpgm.independent_plan(epsilon=settings.epsilon, delta=settings.delta, max_items=settings.max_items,
                                 items=m)
    table = dpgm.cluster_counts(X, np.zeros(X.shape[0], np.int64), 1, settings.max_items)
    return dpgm.independent_items(simulated(plan, rng)("marginals", table), m, rng)


def restrict_items(X: sp.csr_matrix, items: int) -> sp.csr_matrix:
    """The records over their `items` most frequent items (a benchmark's fixed restriction, as the paper takes
    the item universe from the file: not a release, whose items come from its spec). Records left without an item
    are dropped: a release's records are non-empty (the ingest contract), and what is scored is what a release of
    these records publishes."""
    top = np.sort(np.argsort(-counting.item_counts(X), kind="stable")[:items])
    Y = X[:, top].tocsr()
    return Y[np.diff(Y.indptr) > 0]


def load_transactions(path) -> sp.csr_matrix:
    """A transactions file (one record per line, items as space-separated integers, optionally gzipped) as a
    binary CSR matrix over the item ids that occur in it, renumbered 0..m-1.

    Benchmark convenience: taking the item universe from the file is what the paper does with its datasets;
    a release takes `item_count` from its spec instead."""
    from tasks.sets import ingest_sets, read_sets

    with tempfile.TemporaryDirectory() as tmp:
        ingest_sets(Path(path), "transactions", "items", Path(tmp) / "sets")
        parts = sorted((Path(tmp) / "sets").glob("*.parquet"), key=lambda f: int(f.stem.split(".")[1]))
        import pyarrow.parquet as pq

        top = max(int(pq.read_table(f, columns=["max_item"]).column("max_item").to_numpy().max()) for f in parts)
        X = sp.vstack([read_sets(str(f), "items", top + 1) for f in parts]).tocsr()
    used = np.flatnonzero(np.diff(X.tocsc().indptr) > 0)
    return X[:, used].tocsr()
