"""DPGM end to end on in-memory set-valued records, for benchmarks and experiments: DP kernel k-means,
DP-SGD mixture (VAE or RBM), synthetic records, counting-query errors against MWEM and independent items.

The privacy budget (epsilon, delta) is split: `cluster_share` of epsilon to the clustering (k-means
iterations, sigma calibrated with dp_accounting), the rest to DP-SGD (sigma calibrated for the q and steps
given); the total reported is dp_accounting's composition of both events at delta.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from dp_accounting import calibrate_dp_mechanism
from dp_accounting.rdp import RdpAccountant

from dpalgos import accounting, counting, dpgm, dpsgd
from dpalgos import kernel_kmeans as kk


@dataclass
class DPGMSettings:
    epsilon: float = 1.74
    delta: float = 1e-6
    cluster_share: float = 0.2
    k: int = 10
    kmeans_iterations: int = 10
    features: int = 200
    gamma: float = 0.05
    init_items: int = 10
    sgd: dpgm.SGDConfig = field(default_factory=dpgm.SGDConfig)


def calibrate_sgd(q: float, steps: int, epsilon: float, delta: float) -> float:
    """sigma_grad = sigma_norm = s such that `steps` DP-SGD steps at rate q are (epsilon, delta)-DP."""
    make = lambda s: dpsgd.training_event(q=q, steps=steps, sigma_grad=s, sigma_norm=s)
    return float(calibrate_dp_mechanism(RdpAccountant, make, epsilon, delta, bracket_interval=None))


def cluster(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator):
    """DP kernel k-means of the records; returns (feature map, noisy centres, noisy sizes, labels, sigma_K)."""
    eps_k = settings.cluster_share * settings.epsilon
    sigma = kk.calibrate_sigma(epsilon=eps_k, delta=settings.delta / 2, iterations=settings.kmeans_iterations)
    rff = kk.rbf_features(X.shape[1], settings.features, settings.gamma, rng)
    rows = np.repeat(np.arange(settings.k), settings.init_items)
    cols = np.concatenate([rng.choice(X.shape[1], settings.init_items, replace=False) for _ in range(settings.k)])
    init = rff.transform(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(settings.k, X.shape[1])))
    Z = kk.clip_rows(rff.transform(X), 1.0)
    res = kk.dp_lloyd(lambda C: kk.grouped_stats(Z, C), init, iterations=settings.kmeans_iterations, sigma=sigma,
                      clip=1.0, rng=rng)
    labels = kk.nearest(Z, res.centres)
    return rff, res.centres, np.maximum(res.noisy_counts[-1], 1.0), labels, sigma


def run(X: sp.csr_matrix, settings: DPGMSettings, rng: np.random.Generator):
    """Train the mixture; returns (synthetic records, guarantee, diagnostics)."""
    rff, centres, sizes, labels, sigma_k = cluster(X, settings, rng)
    cfg = settings.sgd
    sigma = calibrate_sgd(cfg.q, cfg.steps, (1 - settings.cluster_share) * settings.epsilon, settings.delta / 2)
    cfg = dpgm.SGDConfig(**{**cfg.__dict__, "sigma_grad": sigma, "sigma_norm": sigma})
    members = [np.flatnonzero(labels == c) for c in range(settings.k)]
    models = [dpgm.make_model(cfg, X.shape[1], rng) for _ in range(settings.k)]

    def batches(step):
        return [X[idx[rng.random(idx.size) < cfg.q]] for idx in members]
    dpgm.train(models, batches, sizes, cfg, rng)
    synthetic = dpgm.synthesize(models, sizes, X.shape[0], rng)
    event = accounting.compose_events([kk.privacy_event(iterations=settings.kmeans_iterations, sigma=sigma_k),
                                       dpsgd.training_event(q=cfg.q, steps=cfg.steps, sigma_grad=sigma,
                                                            sigma_norm=sigma)])
    guarantee = accounting.epsilon_at(event, settings.delta)
    return synthetic, guarantee, {"sigma_kmeans": sigma_k, "sigma_sgd": sigma, "cluster_sizes": sizes.tolist()}


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
    indep = counting.independent_records(X, epsilon=settings.epsilon, max_items=max_items, n=n, rng=rng)
    out["independent_anyof"] = counting.by_bucket(counting.relative_errors(true_any, counting.anyof_answers(indep, Q),
                                                                           n), buckets)
    return out
