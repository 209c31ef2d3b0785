"""DPGM: a differentially private mixture of generative models (Acs et al. Algorithm 1, §4.4, §5).

The records are first clustered by DP kernel k-means (`dpalgos.kernel_kmeans`); then one generative model per
cluster is trained with DP-SGD (`dpalgos.dpsgd`), and synthetic records are drawn from the mixture with the
clusters' noisy sizes as weights. Beyond the paper, each record's length comes first, from its cluster's DP
length histogram (measured with the marginals; an empty record is a length of its own), then its items from
its model given that length, and each model's records are raked to its cluster's DP item marginals: the
mixture keeps the data's counts and length profile, the models add which items go together.

Training schedule (a deliberate deviation from Algorithm 1, for a rigorous accounting): Algorithm 1 updates
ONE model per step, chosen with probability |D_s|/|D|, on a batch sampled at rate L/|D_s| from its cluster.
With every iterate public, the chosen cluster is visible, so a record of cluster s is exposed at rate
L/|D_s| in the steps that pick s, not at the L/|D| of the paper's analysis. Here every step updates EVERY
cluster's model, each on a Poisson sample of its own cluster at the common rate q: each record is then
exposed exactly as in a Poisson-subsampled Gaussian mechanism of rate q (the clusters are disjoint, so the k
updates of a step compose in parallel), the standard `dp_accounting` event. Per record and per unit of
privacy, the signal-to-noise of a model update is the same as Algorithm 1's under an exact accounting.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from dpalgos.lazy import module
from dpalgos.plan import ADD_REMOVE_USER, Mechanism, Plan

if TYPE_CHECKING:
    from dpalgos.noise import Measure

# Deferred: the release kind reads this module's public defaults (DEFAULT_K, ...) when a spec is parsed, which must
# not pay for dp_accounting, numba or the models.
accounting = module("dpalgos.accounting")
counting = module("dpalgos.counting")
dpsgd = module("dpalgos.dpsgd")
kk = module("dpalgos.kernel_kmeans")
generative = module("dpalgos.generative")

ModelKind = Literal["vae", "rbm"]


@dataclass(frozen=True)
class SGDConfig:
    model: ModelKind = "vae"
    hidden: tuple[int, ...] = (200,)
    steps: int = 300
    q: float = 0.01                  # Poisson sampling rate of every record at every step
    c_max: float = 10.0              # the paper's C_max and w (Algorithm 3)
    bins: int = 100
    lr: float | None = None          # default: Adam 0.001 (VAE), 0.01 (RBM, the paper)


@dataclass(frozen=True)
class NoisePlan:
    """Noise multipliers of the three parts of DPGM (std / L2 sensitivity)."""
    sigma_kmeans: float
    sigma_marginals: float
    sigma_sgd: float


def plan(noise: NoisePlan, *, kmeans_iterations: int, q: float, steps: int, max_items: int, k: int | None = None,
         items: int | None = None, features: int | None = None, min_length: int = 1) -> Plan:
    """Clustering (sizes and sums per iteration), per-cluster marginals, sizes and record-length histograms
    (one Gaussian), DP-SGD (one Poisson-subsampled Gaussian per step)."""
    clustering = kk.plan(iterations=kmeans_iterations, sigma=noise.sigma_kmeans, k=k, features=features)
    return Plan(clustering.mechanisms + (
        marginals_entry(noise.sigma_marginals, max_items=max_items, k=k, items=items, min_length=min_length),
        Mechanism("sgd", "DP-SGD step: histogram of per-example gradient norms (DPNorm) and the clipped gradient "
                         "sum of every cluster's model, on a Poisson sample", "gaussian", None,
                  "one record is in one cluster's batch with probability q; it adds 1 to one bin of the norm "
                  "histogram (noise multiplier sqrt 2 x this one) and a clipped gradient of L2 norm <= C_s (the "
                  "step's DPNorm bound; multiplier sqrt 2 x this one); two Gaussian mechanisms on the same sample "
                  "compose exactly into one of multiplier (2 / (sqrt 2 sigma)^2)^(-1/2) = sigma",
                  noise.sigma_sgd / np.sqrt(2.0), sampling_rate=q, repetitions=steps, relation=ADD_REMOVE_USER,
                  per_step_generator=True)))


def marginals_entry(sigma: float, *, max_items: int, k: int | None, items: int | None,
                    min_length: int = 1) -> Mechanism:
    """The plan entry of the `cluster_counts` table of k clusters (one Gaussian, multiplier sigma); k = 1 is the
    independent-items baseline's (`independent_plan`)."""
    bins = max_items - min_length + 1
    a = TOTAL_WEIGHT
    return Mechanism("marginals", f"per-cluster item counts (records weighted to at most {max_items} items), sizes "
                                  f"and histograms of record lengths {min_length}..{max_items} (longer records in "
                                  f"the last bin), and, for few items, two rows of present/absent counts, size and "
                                  f"length histogram over all records (`cluster_counts`)",
                     "gaussian", marginals_sensitivity(max_items, items, bins),
                     f"one record is in one cluster's row only: it adds its weights w_i = min(1, {max_items}/|x|) to "
                     f"its |x| items (L2 norm sqrt(|x|) w <= sqrt({max_items})), 1 to the size and 1 to one length "
                     f"bin: L2 norm sqrt({max_items} + 2); when m + 2 <= 4 (bins + 1) (`present_absent`; assumed "
                     f"when m is unknown) it adds to the rows of all records 1 to m item cells (present or absent), "
                     f"the size and one length bin times {a:g} sqrt((bins + 1) / (m + 2)), L2 norm {a:g} "
                     f"sqrt(bins + 1) <= {a:g} sqrt({max_items} + 2): L2 sensitivity sqrt((1 + {a:g}^2) ({max_items} "
                     f"+ 2)), otherwise (rows of all records zero) sqrt({max_items} + 2)", sigma,
                     relation=ADD_REMOVE_USER,
                     values=None if k is None or items is None else (k + 2) * (items + 1 + bins))


def calibrate(*, epsilon: float, delta: float, kmeans_iterations: int, q: float, steps: int, max_items: int = 30,
              shares: tuple[float, float, float] = (0.15, 0.35, 0.5)) -> NoisePlan:
    """Noise multipliers meeting (epsilon, delta) in total.

    Each part is first calibrated alone to its share of epsilon (at delta/3); composing them is then
    tighter than the sum of the shares, so all three multipliers are scaled down by one common factor
    until the plan's whole event is (epsilon, delta) under the RDP accountant (the OpenDP discrete Gaussians
    of the clustering and the marginals are zCDP events, which the PLD accountant does not take)."""
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
    cal = lambda make, eps: accounting.calibrate(make, eps, delta / 3)
    # The searches probe multipliers of 0 (no noise, infinite loss): a tiny positive one stands for it.
    alone = lambda t, s: plan(NoisePlan(*(max(s, 1e-9) if i == t else 1.0 for i in range(3))),
                              kmeans_iterations=kmeans_iterations, q=q, steps=steps, max_items=max_items)
    parts = {0: ("sizes", "sums"), 1: ("marginals",), 2: ("sgd",)}
    base = NoisePlan(*(cal(lambda s, t=t: _event(alone(t, s), parts[t]), shares[t] * epsilon) for t in range(3)))
    scaled = lambda t: NoisePlan(*(max(s * t, 1e-9) for s in (base.sigma_kmeans, base.sigma_marginals, base.sigma_sgd)))
    make = lambda t: plan(scaled(t), kmeans_iterations=kmeans_iterations, q=q, steps=steps, max_items=max_items).event()
    t = accounting.calibrate(make, epsilon, delta, tol=0.002)
    return scaled(t)


def _event(p: Plan, names: tuple[str, ...]):
    from dp_accounting import dp_event as dpe

    events = [p[n].event() for n in names]
    return events[0] if len(events) == 1 else dpe.ComposedDpEvent(events)


def _quiet_rdp(fn):
    """The RDP accountant logs a warning for every fractional order it drops while the search probes small
    noise multipliers; the orders it keeps still give a valid bound."""
    def wrapper(*args, **kwargs):
        from absl import logging as absl_logging

        level = absl_logging.get_verbosity()
        absl_logging.set_verbosity(absl_logging.ERROR)
        try:
            return fn(*args, **kwargs)
        finally:
            absl_logging.set_verbosity(level)
    return wrapper


calibrate = _quiet_rdp(calibrate)


def cluster_counts(X: sp.csr_matrix, labels: np.ndarray, k: int, max_items: int, min_length: int = 1) -> np.ndarray:
    """(k + 2, m + 1 + bins) table. Rows 0..k-1, per cluster: its item counts with every record weighted by
    min(1, max_items / |record|), its number of records, and its number of records of every length min_length ..
    max_items (bins = max_items - min_length + 1; longer records in the last bin, shorter ones in the first).
    Rows k and k + 1, under `present_absent` (few items), over all records scaled by a = `total_scale`: row k
    every item's count unweighted, the number of records and its length histogram, row k + 1 every item's
    absences (n - count); `reconciled` combines them with the sum of the cluster rows: no clipping bias, two
    measurements of every count. Otherwise rows k and k + 1 are zero.

    One record adds to one cluster row only: at most sqrt(min(|x|, max_items)) <= sqrt(max_items) in L2 to the
    item counts, 1 to the record count and 1 to one length bin, L2 norm sqrt(max_items + 2); to rows k, k + 1
    (present/absent) 1 to each of m item cells, to the size and to one length bin times a = TOTAL_WEIGHT
    sqrt((bins + 1) / (m + 2)), L2 norm TOTAL_WEIGHT sqrt(bins + 1) <= TOTAL_WEIGHT sqrt(max_items + 2). The
    table has L2 sensitivity sqrt((1 + TOTAL_WEIGHT^2) (max_items + 2)) under present/absent, sqrt(max_items + 2)
    otherwise (`marginals_sensitivity`)."""
    X = X.tocsr()
    m, bins = X.shape[1], max_items - min_length + 1
    member = sp.csr_matrix((counting.record_weights(X, max_items), (labels, np.arange(X.shape[0]))),
                           shape=(k, X.shape[0]))
    table = np.zeros((k + 2, m + 1 + bins))
    table[:k, :m] = (member @ X).toarray()
    table[:k, m] = np.bincount(labels, minlength=k)
    lengths = np.clip(np.diff(X.indptr), min_length, max_items) - min_length
    np.add.at(table, (labels, m + 1 + lengths), 1.0)
    table[k] = table[:k].sum(axis=0)   # the weighted item counts, size and length histogram of all records
    if present_absent(m, bins):
        table[k, :m] = counting.item_counts(X)
        table[k + 1, :m] = X.shape[0] - table[k, :m]
    table[k:] *= total_scale(m, bins)
    return table


#: The release's defaults (the `synthetic` kind, the experiments and tests/benchmarks/dpgm_counting.py): one
#: configuration for every dataset, public constants never tuned on a released dataset. k = 4 clusters, 4 DP
#: kernel k-means iterations and the split (clustering, marginals, SGD) = (0.15, 0.8, 0.05): the marginals table
#: (its rows of all records) carries the linear queries and the clusters' item structure carries the any-of ones;
#: at epsilon ~1.7 every one of 4 clusters keeps more signal than one of 10, and DP-SGD at a 0.05 share adds
#: little that `match_marginals` does not (BMS1, 64 items: any-of 0.017 against 0.026 with 10 and 10; linear
#: 0.0018 against 0.0052 with the former defaults 10, 10, (0.15, 0.35, 0.5) on a held-out click-stream set).
#: Checked on retail (not used to choose them): tests/benchmarks/dpgm_counting.py, docs/explanation-peers.md. A
#: deployment may set its own (the CDR spec keeps k = 10, 10 iterations and (0.15, 0.35, 0.5), measured on CDR).
#: The number of clusters grows with the items (`default_k`): one cluster per ITEMS_PER_CLUSTER items, at least
#: DEFAULT_K and at most DEFAULT_K_MANY. BMS1 at all 497 items, seeds 0-1, any-of 0.0126, 0.0112, 0.0156 (seed 0) at
#: k = 4, 8, 16, against 0.0158 for independent items; at 64 items, once DP kernel k-means re-seeds the centres that
#: are mostly noise (`kernel_kmeans.RESEED_NOISE`), 8 clusters against 4, paired with independent items over 5
#: seeds: retail -0.0018 +/- 0.0004 against -0.0011 +/- 0.0003, BMS1 -0.0037 +/- 0.0006 against -0.0027 +/- 0.0013;
#: at 16 items 4 and 8 are level on any-of (retail -0.0053 / -0.0050, BMS1 -0.0067 / -0.0061) and 8 costs BMS1's
#: linear error (0.0019 against 0.0014) (tests/benchmarks/dpgm_ablation.py, docs/explanation-peers.md §2.1, §2.2).
DEFAULT_K = 4
DEFAULT_K_MANY = 8
ITEMS_PER_CLUSTER = 8
DEFAULT_ITERATIONS = 4
DEFAULT_SHARES = (0.15, 0.8, 0.05)

#: Weight of the rows of all records in the marginals table against the cluster rows: the item totals (all
#: that linear queries see) get variance about (1 + a^2) / (1/k + 2 a^2 (bins + 1) / (m + 2)) of one cluster
#: row's instead of k times it, each cluster row (1 + a^2) times. At 5 the rows of all records carry 25/26 of
#: the table's squared sensitivity (at 2, 4/5): the item totals' noise is within 4 % of all of it spent on
#: them, and the cluster rows, 2.3x noisier than at 2, are reconciled to those totals (`reconciled`). Chosen
#: once on BMS1 at 16 items (epsilon 1.74, k = 4; per-item RMSE of the DP totals over 40 seeds 8.55 at 2, 7.82
#: at 5, 7.53 at 10 with 0.9 of the budget; any-of error 0.0268 at 2, 0.0273 at 5 over 10 seeds), checked on
#: BMS1 at 64 items and retail (docs/explanation-peers.md §2).
TOTAL_WEIGHT = 5.0
#: Weight of a row of all records (the weighted item counts, size and length histogram, reconciled with the cluster
#: rows as the present/absent rows are) where the items are many (not `present_absent`): none. Measured on BMS1 at
#: all 497 items (tests/benchmarks/dpgm_ablation.py, variants many=A, seeds 0-1): any-of 0.0126 at 0, 0.0119 at 2,
#: 0.0130 at 5 with 4 clusters, 0.0112 at 0 and 0.0113 at 2 with 8; linear 0.032-0.041 throughout (the clip at
#: max_items sets it there, not the noise). The number of clusters (`default_k`) is what moves the any-of error.
TOTAL_WEIGHT_MANY = 0.0


def default_k(items: int) -> int:
    """The release's number of clusters, a rule of the public item count: items // ITEMS_PER_CLUSTER, at least
    `DEFAULT_K` and at most `DEFAULT_K_MANY` (4 up to 39 items, 8 from 64). More items hold more of which items go
    together for clusters to keep; the noise of every cluster row bounds how many pay (measured figures beside the
    constants)."""
    return int(min(DEFAULT_K_MANY, max(DEFAULT_K, items // ITEMS_PER_CLUSTER)))


def present_absent(items: int, bins: int) -> bool:
    """Whether the table has rows of all records, holding present/absent counts (a rule of public sizes): when
    the items are few against the clip, m + 2 <= 4 (bins + 1), an item's count is then measured twice at
    variance (m + 2) / (bins + 1) / a^2 each, at most 2 x the variance of a weighted count, and without
    clipping bias. With many items the rows' (1 + a^2) x noise on every cluster row costs the per-cluster
    structure more than the item totals gain (CDR, 1M users, 1,303 towers, k = 10, with weighted rows of all
    records at a = 2: any-of error 0.00196 -> 0.00265 averaged over the buckets, linear 0.00075 -> 0.00047)."""
    return items + 2 <= 4 * (bins + 1)


def total_scale(items: int, bins: int) -> float:
    """The factor a of the rows of all records (see `cluster_counts`); 0 without them."""
    if present_absent(items, bins):
        return TOTAL_WEIGHT * float(np.sqrt((bins + 1) / (items + 2)))
    return TOTAL_WEIGHT_MANY


def marginals_sensitivity(max_items: int, items: int | None, bins: int) -> float:
    """L2 sensitivity of `cluster_counts` (see there); for unknown items, the larger one."""
    a = max(TOTAL_WEIGHT, TOTAL_WEIGHT_MANY) if items is None else \
        (TOTAL_WEIGHT if present_absent(items, bins) else TOTAL_WEIGHT_MANY)
    return float(np.sqrt((1 + a ** 2) * (max_items + 2)))


def reconciled(noisy_table: np.ndarray, items: int) -> np.ndarray:
    """A noisy `cluster_counts` table whose cluster rows are made consistent with its rows of all records
    (post-processing): every column's total `column_totals` is shared among the clusters in proportion to their
    nonnegative parts (items: in proportion to the cluster's rate per record, its row projected onto the
    nonnegative vectors of its noisy total (`project_simplex`) over its size and at most 1, times its
    reconciled size). Least squares would add the same amount to every cluster, and a cluster of few records
    would take items it has no records to hold. The item totals then have about the variance of the rows of
    all records, not k times a cluster row's, and hold the long records the cluster rows weight down. A table
    without rows of all records (not `present_absent`) is returned as it is."""
    k = noisy_table.shape[0] - 2
    if total_scale(items, noisy_table.shape[1] - items - 1) == 0:
        return noisy_table.copy()
    C, total = noisy_table[:k], column_totals(noisy_table, items)
    out = noisy_table.copy()
    out[:k] = total * _shares(np.maximum(C, 0.0))
    rates = np.array([project_simplex(row, row.sum()) if row.sum() > 0 else np.zeros(items) for row in C[:, :items]])
    out[:k, :items] = _capped_shares(total[:items], np.minimum(rates / np.maximum(C[:, items], 1.0)[:, None], 1.0)
                                     * out[:k, items, None], out[:k, items])
    return out


def _capped_shares(total: np.ndarray, weights: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Every column's total shared among the rows in proportion to weights (k, w), no row above its cap (k,): a
    row's share above its cap goes to the other rows, in proportion, or equally if they have no weight (a
    cluster holds an item at most once per record, so its count is at most its size; retail on 16 items: a
    cluster of the records holding one item got 46 more of it than its size, which synthesis could not hold)."""
    full = np.zeros(weights.shape, dtype=bool)
    for _ in range(weights.shape[0]):
        rest = total - np.where(full, cap[:, None], 0.0).sum(axis=0)
        free = np.where(full, 0.0, weights)
        none = free.sum(axis=0) == 0
        free[:, none] = ~full[:, none]
        out = np.where(full, cap[:, None], rest * _shares(free))
        over = out > cap[:, None]
        if not over.any():
            break
        full |= over
    return out


def _shares(weights: np.ndarray) -> np.ndarray:
    """Every column of weights (k, w) over its sum; equal shares where a column is all zero."""
    weights = weights.copy()
    weights[:, weights.sum(axis=0) == 0] = 1.0
    return weights / weights.sum(axis=0)


def column_totals(noisy_table: np.ndarray, items: int) -> np.ndarray:
    """Least-squares totals of the columns of a noisy `cluster_counts` table with present/absent rows over its k
    clusters. Every cell carries the same noise: a cluster cell has variance 1, the total G of its column from
    the rows of all records (over a) variance V, and T = sum_s c_s + k (G - sum_s c_s) / (k + V). With u the
    present, v the absent counts and g the size of row k, over a: n solves min sum_j (u_j - c_j)^2 +
    (v_j - n + c_j)^2 + (g - n)^2, so n = (sum_j (u_j + v_j) / 2 + g) / (m / 2 + 1) (V = 1 / (a^2 (m / 2 + 1))),
    an item's G_j = (u_j + n - v_j) / 2 (V = 1 / (2 a^2)), a length bin's G its cell (V = 1 / a^2). The items'
    T are projected onto the nonnegative vectors of their sum (clipping would add the positive half of the
    noise of every absent item, as in `marginals_and_sizes`)."""
    k, bins = noisy_table.shape[0] - 2, noisy_table.shape[1] - items - 1
    a = total_scale(items, bins)
    C = noisy_table[:k].sum(axis=0)
    G, V = noisy_table[k] / a, np.full(noisy_table.shape[1], 1.0 / a ** 2)
    if present_absent(items, bins):
        u, v = G[:items], noisy_table[k + 1, :items] / a
        n = (0.5 * (u + v).sum() + G[items]) / (items / 2 + 1)
        G[:items], G[items] = 0.5 * (u + n - v), n
        V[:items], V[items] = 1.0 / (2 * a ** 2), 1.0 / (a ** 2 * (items / 2 + 1))
    total = C + k * (G - C) / (k + V)
    items_total = total[:items].sum()
    total[:items] = project_simplex(total[:items], items_total) if items_total > 0 else 0.0
    return total


def split_table(table: np.ndarray, items: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item counts (k, m), sizes (k,), length histograms (k, bins)) of the cluster rows of a `cluster_counts`
    table."""
    return table[:-2, :items], table[:-2, items], table[:-2, items + 1:]


def project_simplex(v: np.ndarray, total: float) -> np.ndarray:
    """Euclidean projection of v (m,) onto {x >= 0, sum x = total} (Duchi et al. 2008)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - total
    rho = np.flatnonzero(u - css / np.arange(1, v.size + 1) > 0)[-1]
    return np.maximum(v - css[rho] / (rho + 1), 0.0)


def marginals_and_sizes(noisy_table: np.ndarray, items: int) -> tuple[np.ndarray, np.ndarray]:
    """Item probabilities (k, m) and cluster sizes (k,) from the noisy table (post-processing).

    Clipping negative noisy counts at zero would add the positive half of the noise of every rare item and
    inflate the expected record length many times over when items are many and records few; instead every
    row of counts is projected onto the nonnegative vectors with the row's noisy total (which is unbiased).
    Rates are not kept off 0 and 1 here (`make_model` does that for the models' logits): synthesis rakes to
    them, and a floor of 1e-4 gave an item a cluster does not hold 5 occurrences in a cluster of 50,000
    records (BMS1 on 16 items: one item total 5 high)."""
    counts, sizes, _ = split_table(reconciled(noisy_table, items), items)
    sizes = np.maximum(sizes, 1.0)
    counts = np.array([project_simplex(row, max(row.sum(), 1.0)) for row in counts])
    return np.clip(counts / sizes[:, None], 0.0, 1.0), sizes


def make_model(config: SGDConfig, m: int, rng: np.random.Generator, marginals: np.ndarray | None = None):
    """A fresh model; with `marginals` (m,), it starts as the independent-items model of those marginals."""
    if config.model == "vae":
        # Adam moves every weight by about lr per step whatever the gradient's size, so under DP noise a
        # larger rate random-walks the 200 x m output layer and inflates the rare items' probabilities
        # (CDR 600k: 15.4 items per synthetic record at 0.01, 10.7 at 0.001, against 11.4).
        model = generative.VAE(m, rng, hidden=config.hidden, lr=config.lr or 0.001)
    else:
        model = generative.RBM(m, rng, hidden=config.hidden[0], lr=config.lr or 0.01)
    if marginals is not None:
        model.start_at(np.clip(marginals, 1e-4, 1 - 1e-4), rng)   # finite logits
    return model


#: Draws the N(0, 1) gradient noise of a step while the models' gradients are computed.
_NOISE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsgd-noise")
#: The cluster models' gradients of a step, one model per thread (BLAS and numpy release the GIL; the
#: release's library pools run one thread each, `tasks.threads`): the cores the process may use.
_MODEL_THREADS = ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)), thread_name_prefix="dpsgd-model")


def train(models: list, batches: Callable[[int], list], expected_sizes: np.ndarray, config: SGDConfig,
          measure: Measure, progress: Callable[[int, int], None] | None = None) -> list[float]:
    """DP-SGD on every cluster model at every step, the noise of the plan entry "sgd".

    batches(step) -> one batch (CSR, possibly empty) per cluster: a Poisson sample of rate q of its records.
    expected_sizes : PUBLIC (noisy) cluster sizes; a batch's gradient is divided by q * size.
    Every step's noise, and the VAEs' latent draws, come from that step's secret generator: independent
    streams spawned from it, one for the gradient noise of all models at once (drawn on another thread), one
    per model for its DPNorm noise, latents and update (the models' steps run in parallel).
    Returns the mean clipping bound C_s per step (a diagnostic of public values).
    """
    # The step's two Gaussian draws each have multiplier sqrt 2 x the entry's (see `plan`).
    sigma = measure.plan["sgd"].noise_multiplier * np.sqrt(2.0)
    bounds = np.cumsum([0] + [model.params.size for model in models])
    z, sums = np.empty(bounds[-1]), [np.empty(model.params.size) for model in models]
    zs = [z[a:b] for a, b in itertools.pairwise(bounds)]
    expected = [max(config.q * size, 1.0) for size in expected_sizes]
    clips = []
    with threadpool_limits(limits=1, user_api="blas"):  # one model per core, one BLAS thread per model
        for step in range(config.steps):
            clips.append(_step(models, batches(step), config, sigma, measure, z, zs, sums, expected))
            if progress is not None:
                progress(step + 1, config.steps)
    return clips


def _step(models: list, batches: list, config: SGDConfig, sigma: float, measure: Measure, z: np.ndarray,
          zs: list, sums: list, expected: list) -> float:
    """One DP-SGD step of every model; returns its mean DPNorm bound."""
    noise_rng, *model_rngs = measure.step_generator("sgd").spawn(1 + len(models))
    noise = _NOISE_THREAD.submit(noise_rng.standard_normal, out=z)
    clips = list(_MODEL_THREADS.map(_clipped_sum, models, batches, [config] * len(models), [sigma] * len(models),
                                    model_rngs, sums))
    noise.result()
    list(_MODEL_THREADS.map(_noisy_update, models, sums, zs, sigma * np.array(clips), expected, model_rngs))
    return float(np.mean(clips))


def _clipped_sum(model, batch, config: SGDConfig, sigma: float, rng: np.random.Generator, out: np.ndarray) -> float:
    """The model's clipped gradient sum on its batch, into `out`; returns the step's DPNorm bound C_s."""
    layers = model.gradients(batch, rng) if batch.shape[0] else _empty_layers(model)
    _, clip = dpsgd.clip_and_sum(layers, sigma_norm=sigma, c_max=config.c_max, bins=config.bins, rng=rng, out=out)
    return clip


def _noisy_update(model, grad_sum: np.ndarray, z: np.ndarray, noise_scale: float, expected: float,
                  rng: np.random.Generator) -> None:
    model.noisy_update(grad_sum, z, noise_scale, expected, rng)


def _empty_layers(model) -> list[dpsgd.LayerGrad]:
    """Zero-example layers with the model's shapes (an empty Poisson batch still gets its noise)."""
    layers = model.gradients(sp.csr_matrix((1, model.m), dtype=np.float64), np.random.default_rng(0))
    return [dpsgd.LayerGrad(None if l.a is None else l.a[:0], l.delta[:0], l.bias) for l in layers]


def length_distributions(noisy_table: np.ndarray, items: int, min_length: int) -> np.ndarray:
    """Per-cluster distributions (k, bins) of the record length (post-processing of noisy values only).

    The histogram h of a cluster, its noisy size n and its noisy item total T (the sum of its item counts,
    records weighted to at most max_items items, i.e. sum_l l h_l with the last bin at its lower end) measure
    the same records with the same noise scale. The estimate is the nonnegative least-squares fit of h under
    sum h = n and sum l h_l = T (rows of weight `tie`): synthesis then holds T items per cluster, the total its
    item counts are raked to (`rake_items`). Without T, the noise of the empty bins of a cluster of short (or
    empty) records projects into a spurious tail of long records (CDR, 200k: total items 0.67 % high).

    Lengths above the number of items (public) are impossible: their bins (max_items > items, e.g. 16 items and
    max_items 30) hold noise only, and are left out of the fit. Fitted in, they took part of T, and synthesis,
    which cannot put more than `items` distinct items in a record, lost it: every item total came out about
    0.3 % low (BMS1 on 16 items), a flat relative error of every linear query whatever its length.

    A record holds an item at most once, so a cluster has at least as many records that are not empty as its
    most frequent item's count: with empty records (min_length 0) the fit keeps at most size - that count empty
    (`_fit_lengths`). Without the bound, the noise of the empty bin could leave fewer records than a saturated
    item (every record of the cluster holds it) needs, and synthesis lost the rest (retail on 16 items, seed 0:
    42 occurrences of one item)."""
    counts, sizes, hist = split_table(reconciled(noisy_table, items), items)
    bins, tie = hist.shape[1], 1e3
    values = np.arange(min_length, min_length + bins, dtype=np.float64)
    possible = np.flatnonzero(values <= max(items, min_length))
    A = np.vstack([np.eye(possible.size), tie * np.ones(possible.size), tie * values[possible]])
    out = np.zeros(hist.shape)
    for c in range(hist.shape[0]):
        b = np.concatenate([hist[c, possible], tie * np.array([sizes[c], counts[c].sum()])])
        empty = max(sizes[c] - counts[c].max(), 0.0) if min_length == 0 else np.inf
        h = _fit_lengths(A, b, empty)
        out[c, possible] = h / h.sum() if h.sum() > 0 else 1.0 / possible.size
    return out


def _fit_lengths(A: np.ndarray, b: np.ndarray, empty: float) -> np.ndarray:
    """argmin ||A h - b|| over h >= 0 with h_0 <= empty. A holds an identity block (strictly convex): if the fit
    without the bound breaks it, the bound is active at the bounded optimum, h_0 = empty and the rest is a
    nonnegative fit of what remains."""
    from scipy.optimize import nnls

    h = nnls(A, b)[0]
    if h[0] > empty:
        h = np.concatenate([[empty], nnls(A[:, 1:], b - A[:, 0] * empty)[0]])
    return h


def draw_lengths(probs: np.ndarray, n: int, min_length: int, rng: np.random.Generator) -> np.ndarray:
    """n lengths from the distribution `probs` over min_length .. min_length + bins - 1 (the last bin, "that
    long or longer", is synthesised at its lower end: max_items should be near a high percentile of the
    record length)."""
    return min_length + rng.choice(probs.size, size=n, p=probs)


def match_marginals(models: list, marginals: np.ndarray, length_probs: np.ndarray, min_length: int,
                    rng: np.random.Generator, keys: int = 4_000_000, rounds: int = 8) -> None:
    """Post-processing: every VAE's output biases shifted so that its records, drawn with DP lengths
    (`synthesize_chunks`), hold every item as often as its cluster's DP marginals (k, m) say.

    DP-SGD clips long records' gradients more (C_s is the mode of the norms), which biases what the model
    learns of long records; the marginals were measured without that bias. Fixed point on a fixed sample of
    latents, lengths and race keys: shift_j += log(p_j / f_j), f_j the item's frequency in the sample. The shift
    fits that sample's noise too, so the sample holds `keys` race keys (at least 10,000 records): BMS1 on 64
    items, linear-query error 0.0095 with 10,000 records, 0.0066 with 60,000. RBMs are left as they are (a bias
    shift also changes their Gibbs chains)."""
    for model, p, probs in zip(models, marginals, length_probs):
        if not isinstance(model, generative.VAE):
            continue
        samples = max(10_000, keys // model.m)
        logits = model.logits(samples, rng)
        lengths = draw_lengths(probs, samples, min_length, rng)
        exp_keys = generative.log_exponentials(logits.shape, rng)
        shift, floor = np.zeros(model.m, dtype=np.float32), 1.0 / samples
        for _ in range(rounds):
            freq = np.asarray(generative.race(logits + shift - exp_keys, lengths).mean(axis=0)).ravel()
            shift += np.log((p + floor) / (freq + floor)).astype(np.float32)
        model.dec[-1][1][:] += shift


def rounded(x: np.ndarray, total: int) -> np.ndarray:
    """Nonnegative integers summing to `total` within 1 of x * total / sum(x) (largest remainders)."""
    share = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
    share = total * share / share.sum()
    out = np.floor(share).astype(np.int64)
    out[np.argsort(out - share, kind="stable")[:total - out.sum()]] += 1
    return out


def length_counts(probs: np.ndarray, count: int, min_length: int) -> np.ndarray:
    """Records of every length min_length .. min_length + bins - 1 for `count` records of the distribution
    probs: the `rounded` shares n_l of count, whose items sum_l l n_l may miss the target round(count sum_l l
    p_l) by up to the longest length per bin (a record of length 30 rounded up is 30 items); records are then
    moved to a neighbouring length, one item at a time, from the bin rounded up most to the one rounded down
    most, until sum_l l n_l is the target, never past the longest length of positive probability (lengths above
    the item count are impossible, `length_distributions`). Synthesis then holds the items the length distribution
    was fitted to (`length_distributions`: the reconciled item total) and not the rounding's error."""
    share = count * probs / probs.sum()
    out = rounded(probs, count)
    values = np.arange(min_length, min_length + probs.size)
    gap = int(round(share @ values)) - int(out @ values)  # noqa: RUF046 (numpy scalars)
    top = int(np.flatnonzero(probs > 0)[-1]) if np.any(probs > 0) else probs.size - 1  # no move past the support
    while gap and top > 0:
        step = 1 if gap > 0 else -1
        src = np.arange(top) if step > 0 else np.arange(1, top + 1)
        surplus = out - share
        score = np.where(out[src] > 0, surplus[src] - surplus[src + step], -np.inf)
        i = src[int(np.argmax(score))]
        out[i] -= 1
        out[i + step] += 1
        gap -= step
    return out


def record_plan(weights: np.ndarray, length_probs: np.ndarray, min_length: int, n: int, rng: np.random.Generator,
                part: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cluster, length) of each of n records: the clusters' shares of n rounded to integers, and every cluster's
    records of each length by `length_counts` (no sampling noise on the cluster sizes, record lengths and item
    totals); in random order within consecutive parts of at most `part` records (default: one part), every part
    holding its share of each cluster's records of each length within one record (`_dealt`). Each part is
    synthesised and raked on its own, to its share of the cluster's items (`rake_items`): parts drawn at random
    could give a cluster's records in a part more items per record than the cluster, and an item that nearly every
    record holds more occurrences than the part has records (retail on 16 items: 33 of one item lost in a part
    of 10,415 records)."""
    sizes = rounded(weights, n)
    clusters = np.repeat(np.arange(sizes.size), sizes)
    bins = np.arange(min_length, min_length + length_probs.shape[1])
    lengths = np.concatenate([np.repeat(bins, length_counts(p, int(c), min_length)) if c else np.zeros(0, np.int64)
                              for c, p in zip(sizes, length_probs)])
    order = _dealt(n, part or n, rng)
    return clusters[order], lengths[order]


def _dealt(n: int, part: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation of 0..n-1 into consecutive parts of at most `part`: position r goes to the part whose next
    place is due first, place i of a part of size s due at (i + 1/2) / s (so every run of consecutive positions is
    shared among the parts in proportion to their sizes, within one), and each part is shuffled."""
    sizes = np.diff(np.append(np.arange(0, n, part), n))
    due = np.concatenate([(np.arange(s) + 0.5) / s for s in sizes])
    deal = np.repeat(np.arange(sizes.size), sizes)[np.argsort(due, kind="stable")]
    return np.concatenate([rng.permutation(np.flatnonzero(deal == j)) for j in range(sizes.size)])


def rake_items(S: sp.csr_matrix, p: np.ndarray, rng: np.random.Generator, rounds: int = 5) -> sp.csr_matrix:
    """The records S with their item counts moved to the rounding of p in proportion (lengths unchanged):
    random occurrences of items in surplus become items in deficit, unless the record holds that item already
    (those stay; `rounds` passes), then `_fill_deficits` moves what those passes could not. Post-processing: p
    are DP marginals; it removes the sampling noise of the item counts (as MST's synthesis rounds its
    marginals)."""
    return raked(S, _targets(S, p), rng, rounds)


def _targets(S: sp.csr_matrix, p: np.ndarray) -> np.ndarray:
    """Integer item counts of the records S in proportion to p (`rounded`)."""
    return rounded(p, S.nnz) if S.nnz else np.zeros(S.shape[1], np.int64)


def raked(S: sp.csr_matrix, target: np.ndarray, rng: np.random.Generator, rounds: int = 5) -> sp.csr_matrix:
    """`rake_items` to integer item counts `target` (summing to S's occurrences)."""
    S = S.tocoo()
    rows, cols, m = S.row.astype(np.int64), S.col.astype(np.int64).copy(), S.shape[1]
    for _ in range(rounds):
        gap = np.bincount(cols, minlength=m) - target
        freed = _at_most(np.arange(cols.size), cols, np.maximum(gap, 0), rng)
        if freed.size == 0:
            break
        new = cols.copy()
        new[freed] = rng.permutation(np.repeat(np.arange(m), np.maximum(-gap, 0)))
        clash = freed[_duplicated(rows * m + new)[freed]]
        new[clash] = cols[clash]
        cols = new
    cols = _fill_deficits(rows, cols, target, S.shape[0], rng)
    return sp.csr_matrix((np.ones(cols.size, dtype=np.float32), (rows, cols)), shape=S.shape)


def _fill_deficits(rows: np.ndarray, cols: np.ndarray, target: np.ndarray, n: int,
                   rng: np.random.Generator) -> np.ndarray:
    """cols with every item d still short of its target given occurrences of items in surplus in records without
    d, or, where none is left, through an item c at its target (`_via`): c -> d in records without d, surplus ->
    c in records without c (distinct records, as these hold c). The random passes of `rake_items` cannot fill an
    item that most records hold: a random occurrence is nearly always in such a record (records of 6 of 8 items,
    one in 97 % of them: 348 of its 2,910 left short, tests/test_dpgm.py; retail on 16 items, seed 0, once the
    targets are feasible: 1 of 88,000)."""
    cols, m = cols.copy(), target.size
    gap = lambda: np.bincount(cols, minlength=m) - target
    for d in rng.permutation(np.flatnonzero(gap() < 0)):
        cols[_movable(d, np.maximum(gap(), 0), rows, cols, n, rng)[:max(-gap()[d], 0)]] = d
        for c in _via(d, gap(), rows, cols, n):
            need = -gap()[d]
            if need <= 0:
                break
            into_d = _movable(d, np.eye(1, m, c, dtype=np.int64)[0] * need, rows, cols, n, rng)
            into_c = _movable(c, np.maximum(gap(), 0), rows, cols, n, rng)
            k = min(into_d.size, into_c.size)
            cols[into_d[:k]], cols[into_c[:k]] = d, c
    return cols


def _via(d: int, gap: np.ndarray, rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """The items at their target through which d can be filled, most held first: held by records without d, with
    occurrences of items in surplus in records without them (so each try moves something, and an item no record
    without it can take costs nothing)."""
    lacking = np.ones(n, dtype=bool)
    lacking[rows[cols == d]] = False
    held = np.bincount(cols[lacking[rows]], minlength=gap.size) * (gap == 0)
    surplus = np.bincount(rows, weights=gap[cols] > 0, minlength=n)     # per record
    elsewhere = surplus.sum() - np.bincount(cols, weights=surplus[rows], minlength=gap.size)
    via = np.flatnonzero((held > 0) & (elsewhere > 0))
    return via[np.argsort(-held[via], kind="stable")]


def _movable(d: int, cap: np.ndarray, rows: np.ndarray, cols: np.ndarray, n: int,
             rng: np.random.Generator) -> np.ndarray:
    """Occurrences that may become item d, in random order: at most cap[c] of every item c, in distinct records
    that do not hold d."""
    holds = np.zeros(n, dtype=bool)
    holds[rows[cols == d]] = True
    movable = np.flatnonzero((cap[cols] > 0) & ~holds[rows])
    return rng.permutation(_at_most(_at_most(movable, rows, np.ones(n, np.int64), rng), cols, cap, rng))


def _at_most(index: np.ndarray, keys: np.ndarray, limit: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random subset of `index` holding at most limit[key] entries of every key (keys[index])."""
    order = index[np.lexsort((rng.random(index.size), keys[index]))]
    key = keys[order]
    rank = np.arange(order.size) - np.searchsorted(key, key)
    return order[rank < limit[key]]


def _duplicated(keys: np.ndarray) -> np.ndarray:
    """True where a key occurs more than once (keys nearly sorted: a stable sort is fast)."""
    order = np.argsort(keys, kind="stable")
    same = keys[order][1:] == keys[order][:-1]
    out = np.zeros(keys.size, dtype=bool)
    out[order[1:][same]] = True
    out[order[:-1][same]] = True
    return out


def synthesize_chunks(models: list, weights: np.ndarray, length_probs: np.ndarray, marginals: np.ndarray,
                      min_length: int, n: int, rng: np.random.Generator,
                      chunk: int = 50_000) -> Iterator[sp.csr_matrix]:
    """n synthetic records (§4.4) in chunks of at most `chunk`: model s draws a share weights_s / sum(weights)
    of them, with lengths from its cluster's DP length distribution (`record_plan`), then `synthesize_part`.
    Empty records (min_length 0) are kept: they are a length of their own, and dropping them would shrink
    every count."""
    clusters, lengths = record_plan(weights, length_probs, min_length, n, rng, chunk)
    for start in range(0, n, chunk):
        yield synthesize_part(models, marginals, clusters[start:start + chunk], lengths[start:start + chunk], rng)


def synthesize_part(models: list, marginals: np.ndarray, clusters: np.ndarray, lengths: np.ndarray,
                    rng: np.random.Generator) -> sp.csr_matrix:
    """The records of one slice of the record plan, in its order: a record's items come from its cluster's
    model given its length (`generative.records_of_lengths`), then each model's items are raked to its
    cluster's DP marginals (`rake_items`), and the slice to the sum of the clusters' targets: a cluster's
    targets can be more than its lengths hold (an item in nearly all its records, yet many records of length 1:
    BMS1 on 16 items, seed 3, 29 occurrences of one item and 17 of another left over in one cluster, the item
    totals' error 8.0 -> 12.1), and the other clusters' records take the rest. Slices are independent given
    their generators (parallel parts)."""
    rows = [np.flatnonzero(clusters == s) for s in range(len(models))]
    drawn = [generative.records_of_lengths(model.logits(r.size, rng), lengths[r], rng)
             for model, r in zip(models, rows)]
    targets = [_targets(S, p) for S, p in zip(drawn, marginals)]
    parts = [raked(S, t, rng) for S, t in zip(drawn, targets)]
    return raked(sp.vstack(parts).tocsr(), np.sum(targets, axis=0), rng)[np.argsort(np.concatenate(rows),
                                                                                      kind="stable")]


def synthesize(models: list, weights: np.ndarray, length_probs: np.ndarray, marginals: np.ndarray, min_length: int,
               n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """All of `synthesize_chunks` in one matrix."""
    return sp.vstack(list(synthesize_chunks(models, weights, length_probs, marginals, min_length, n, rng))).tocsr()


def independent_plan(*, epsilon: float, delta: float, max_items: int, items: int, min_length: int = 1) -> Plan:
    """The plan of the independent-items baseline (`independent_items`): DPGM's marginals entry for one cluster
    (`marginals_entry`, k = 1: the table of all records, with the same sensitivity argument), its multiplier
    calibrated alone to (epsilon, delta) by the accountant that calibrates DPGM's (`accounting.calibrate`). The
    baseline spends all of the budget on the item totals and lengths that DPGM spends 0.8 of (less the gain of
    composition) beside its clustering and DP-SGD: the same (epsilon, delta), accounted the same way."""
    make = lambda s: Plan((marginals_entry(max(s, 1e-9), max_items=max_items, k=1, items=items,
                                           min_length=min_length),))
    return make(_quiet_rdp(accounting.calibrate)(lambda s: make(s).event(), epsilon, delta))


def independent_items(noisy_table: np.ndarray, items: int, rng: np.random.Generator, min_length: int = 1,
                      cells: int = 20_000_000) -> sp.csr_matrix:
    """The independent-items baseline's records from its noisy one-cluster `cluster_counts` table
    (post-processing, `independent_plan`): DPGM's synthesis with one cluster and no model. As many records as the
    noisy size, their lengths from the DP length distribution (`length_distributions`, `record_plan`), their
    items drawn without replacement in proportion to the odds of the DP rates (`generative.records_of_lengths`,
    rows in chunks of about `cells` odds), then raked to the DP item totals (`rake_items`). It differs from DPGM
    only in what the clusters and their models add: which items go together."""
    marg, sizes = marginals_and_sizes(noisy_table, items)
    _, lengths = record_plan(sizes, length_distributions(noisy_table, items, min_length), min_length,
                             int(round(sizes.sum())), rng)  # noqa: RUF046
    p = np.clip(marg[0], 1e-9, 1 - 1e-6)  # finite logits; an item of rate 0 is drawn only where nothing else fits
    logit = np.log(p / (1 - p)).astype(np.float32)
    rows = max(1, cells // items)
    parts = [generative.records_of_lengths(np.broadcast_to(logit, (chunk.size, items)), chunk, rng)
             for chunk in np.array_split(lengths, max(1, -(-lengths.size // rows)))]
    return rake_items(sp.vstack(parts).tocsr(), marg[0], rng)


def load_model(kind: ModelKind, arrays: dict[str, np.ndarray], hidden: tuple[int, ...] = (200,)):
    """A model rebuilt from `model_arrays` (for sampling; the optimiser state is not kept)."""
    m = arrays["b"].size if kind == "rbm" else arrays["enc0_W"].shape[0]
    model = make_model(SGDConfig(model=kind, hidden=tuple(hidden)), m, np.random.default_rng(0))
    for name, target in _parameters(model).items():
        target[...] = arrays[name]
    return model


def _parameters(model) -> dict[str, np.ndarray]:
    if isinstance(model, generative.RBM):
        return {"W": model.W, "b": model.b, "c": model.c}
    out = {}
    for name, layers in (("enc", model.enc), ("dec", model.dec)):
        for i, (W, b) in enumerate(layers):
            out[f"{name}{i}_W"], out[f"{name}{i}_b"] = W, b
    out["mu_W"], out["mu_b"] = model.mu
    out["logvar_W"], out["logvar_b"] = model.logvar
    return out


def model_arrays(model) -> dict[str, np.ndarray]:
    """The released parameters of a model, by name (copies)."""
    return {name: a.copy() for name, a in _parameters(model).items()}
