"""Friendly k-means by k-tuple aggregation (docs/friendlycore.md §9): the tuple predicate, the non-private k-means++
of every subset, the parameters, plan and release."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpalgos.friendlycore.constants import (
    SEPARATION_FACTOR,
    SHRINK,
    TUPLE_MEAN_SENSITIVITY_MULTIPLE,
    TUPLE_WEIGHT_SENSITIVITY,
    check_radius,
)
from dpalgos.friendlycore.core import (
    PTR_ARGUMENT,
    check_budget,
    check_radius_choice,
    checked_split,
    ptr_delta,
    ptr_lower_bound,
    soft_weights,
    total_weight,
    weighted_mean,
    zcdp_nm,
)
from dpalgos.friendlycore.friends import sq_dist_pairs, within
from dpalgos.friendlycore.radius import RadiusGrid, binary_search_radius
from dpalgos.noise import Measure
from dpalgos.plan import Mechanism, Plan


class TupleFriends:
    """The k-tuple predicate (§9.3) on tuples (m, k, d) (a tuple with a non-finite value has no friends):

        f_r(T, Z) = sep(T) > 6r  and  sep(Z) > 6r  and  pi = nearest-centre map T -> Z is a bijection
                    and  sum_i ||t_i - z_pi(i)||^2 <= r^2,

    sep(T) = min_{i != j} ||t_i - t_j|| (inf for k = 1). Floating point (§12): squared distances by
    `sq_dist_pairs`, the k mate distances summed in sorted order (so f_r(T, Z) == f_r(Z, T) bit for bit),
    thresholds r^2 (1 - 1e-9) and 36 r^2 (1 + 1e-9). With the separations, the nearest-centre map is the only
    matching within r, so f_r is "some matching within r in Frobenius norm".

    `proxy_counts` drops the separation condition: a predicate that is monotone in r, used only to choose r
    (any pair predicate gives |dW| < 3 under replacement, Lemma 9.2).
    """

    def __init__(self, tuples, *, cache_bytes: int = 64 << 20, block_bytes: int = 32 << 20):
        T = np.asarray(tuples, dtype=np.float64)
        if T.ndim != 3:
            raise ValueError("tuples must be (m, k, d)")
        self.n, self.k, self.d = T.shape
        self._T = T
        self.valid = np.all(np.isfinite(T), axis=(1, 2))
        sep = np.full(self.n, np.inf)
        for i in range(self.k):
            for j in range(i + 1, self.k):
                sep = np.minimum(sep, sq_dist_pairs(T[:, i], T[:, j]))
        sep[~self.valid] = np.nan
        self.sep_sq = sep
        self._rows = max(1, int(block_bytes // (8 * max(self.n, 1) * self.k * self.k * 3)))
        self._cost = self._cost_rows(0, self.n) if self.n * self.n * 8 <= cache_bytes else None

    def _cost_rows(self, a0, a1):
        out = np.empty((a1 - a0, self.n))
        T = self._T
        for b0 in range(a0, a1, self._rows):
            b1 = min(a1, b0 + self._rows)
            D = sq_dist_pairs(T[b0:b1, None, :, None, :], T[None, :, None, :, :])  # (b, m, k, k)
            nn = np.argmin(D, axis=-1)
            mate = np.take_along_axis(D, nn[..., None], axis=-1)[..., 0]
            bij = np.all(np.sort(nn, axis=-1) == np.arange(self.k), axis=-1)
            mate = np.sort(mate, axis=-1)
            cost = np.zeros(mate.shape[:-1])
            for i in range(self.k):
                cost += mate[..., i]
            cost[~bij] = np.inf
            cost[~self.valid[b0:b1]] = np.inf
            cost[:, ~self.valid] = np.inf
            out[b0 - a0:b1 - a0] = cost
        return out

    def _count(self, r, separated):
        r = check_radius(r)
        t = r * r * SHRINK
        ok = self.valid.copy()
        if separated:
            s = SEPARATION_FACTOR * float(r)
            ok &= self.sep_sq > s * s * (1.0 + 1e-9)
        out = np.zeros(self.n, dtype=np.int64)
        step = self.n if self._cost is not None else max(1, self._rows)
        for a0 in range(0, self.n, step):
            a1 = min(self.n, a0 + step)
            C = self._cost[a0:a1] if self._cost is not None else self._cost_rows(a0, a1)
            F = within(C, t) & ok[None, :] & ok[a0:a1, None]
            out[a0:a1] = F.sum(axis=1)
        return out

    def counts(self, r: float) -> np.ndarray:
        return self._count(r, separated=True)

    def proxy_counts(self, r: float) -> np.ndarray:
        return self._count(r, separated=False)


def align_tuples(tuples: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Relabel every tuple's centres by the nearest centre of `reference` (the bucketing of §9.4). Raises if the
    labelling of some tuple is not a bijection (impossible for core tuples, Lemma 9.5)."""
    T = np.asarray(tuples, dtype=np.float64)
    R = np.asarray(reference, dtype=np.float64)
    k = R.shape[0]
    lab = np.argmin(sq_dist_pairs(T[:, :, None, :], R[None, None, :, :]), axis=-1)  # (s, k)
    if not np.all(np.sort(lab, axis=-1) == np.arange(k)):
        raise RuntimeError("a core tuple's bucketing is not a bijection: Lemma 9.5 violated (bug)")
    out = np.empty_like(T)
    np.put_along_axis(out, lab[..., None], T, axis=1)
    return out


def _sq_dists(P, C):
    """(m, s, k) squared distances of padded points P (m, s, d) to centres C (m, k, d) (coordinate order)."""
    return sq_dist_pairs(P[:, :, None, :], C[:, None, :, :])


def _seq_sum(A, axis):
    """Sum along `axis` in index order (cumsum): a subset's value then does not depend on how far it is padded
    (the padding adds exact zeros), unlike pairwise summation whose blocking depends on the length (§9.1)."""
    return np.cumsum(A, axis=axis).take(-1, axis=axis) if A.shape[axis] else np.sum(A, axis=axis)


def _nearest(D2):
    """argmin over the last axis (ties to the lowest index) by elementwise comparisons, one centre at a time:
    np.argmin branches on the values, and its time follows how predictable the labels are (on 10,000 points
    with one far record added, 108 instead of 136 us per pass)."""
    best, lab = D2[..., 0].copy(), np.zeros(D2.shape[:-1], dtype=np.int64)
    for j in range(1, D2.shape[-1]):
        closer = D2[..., j] < best
        lab += closer * (j - lab)
        np.minimum(best, D2[..., j], out=best)
    return lab


#: Points per block of `_cluster_sums`: a fixed number, so that a subset's sums do not depend on the batch.
SUM_BLOCK = 4096


def _cluster_sums(P, lab, mask, k):
    """Per subset and centre, the count (m, k) and coordinate sums (m, k, d) of its points, summed in index order
    block by block (blocks at fixed offsets: padding adds exact zeros at the end, so a subset's sums do not
    depend on its padding or on the other subsets, §9.1). Dense and branch-free: np.bincount, adding point by
    point into the label's slot, was slower where consecutive points share a label (one far record turning a
    subset's centres into 1 + 2 clusters made a run 2 % slower)."""
    m, s, d = P.shape
    cnt, sums = np.zeros((m, k)), np.zeros((m, k, d))
    Pt = P.transpose(0, 2, 1)                                                 # (m, d, s): blocks along the last axis
    for i in range(0, s, SUM_BLOCK):
        onehot = ((lab[:, None, i:i + SUM_BLOCK] == np.arange(k)[:, None]) & mask[:, None, i:i + SUM_BLOCK])
        onehot = onehot.astype(np.float64)                                    # (m, k, b)
        cnt += onehot.sum(axis=-1)                                            # integers: exact
        sums += _seq_sum(onehot[:, :, None, :] * Pt[:, None, :, i:i + SUM_BLOCK], -1)
    return cnt, sums


def _kmeanspp(P, mask, sizes, k, rng):
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; 2 + ln k candidates per step, as scikit-learn),
    batched over the subsets; every subset uses only its own row of each random draw."""
    m, _s, d = P.shape
    ar = np.arange(m)
    n_local = 2 + int(np.log(k))
    C = np.empty((m, k, d))
    first = np.minimum((rng.random(m) * sizes).astype(np.int64), sizes - 1)
    C[:, 0] = P[ar, first]
    D2 = sq_dist_pairs(P, C[:, None, 0]) * mask
    for c in range(1, k):
        cs = np.cumsum(D2, axis=1)
        tot = cs[:, -1]
        u = rng.random((m, n_local)) * tot[:, None]
        idx = (cs[:, None, :] < u[:, :, None]).sum(axis=-1)
        uniform = np.minimum((rng.random((m, n_local)) * sizes[:, None]).astype(np.int64), sizes[:, None] - 1)
        idx = np.where(tot[:, None] > 0, np.minimum(idx, sizes[:, None] - 1), uniform)
        cand = P[ar[:, None], idx]                                        # (m, L, d)
        newD2 = np.minimum(D2[:, None, :], sq_dist_pairs(P[:, None, :, :], cand[:, :, None, :])) * mask[:, None, :]
        best = np.argmin(_seq_sum(newD2, -1), axis=1)
        C[:, c] = cand[ar, best]
        D2 = newD2[ar, best]
    return C


#: Lloyd passes per k-means++ start in every subset: always all of them, never "until the labels settle". The
#: subsets hold raw records and the stage's running time is published: stopping when settled let the running
#: time alone tell whether a far record was there (advantage 0.31 to 0.61 of a threshold on the time over runs
#: of tests/benchmarks/timing_channel.py, at m = 2 subsets of 10,000 points, where eps-DP at eps 1 allows 0.46
#: to any test on the output; shipped 0.01 [-0.13, 0.14]). A settled subset is a fixed point of further passes, so
#: subsets that settle within LLOYD_PASSES get the centres a stop would give (same cost ratio on the
#: friendlycore_kmeans benchmark, whose subsets settle within 10; 1.5x its time at n = 200,000).
LLOYD_PASSES = 20


def _batched_kmeans(P, mask, k, rng, restarts, max_iter):
    """k-means++ + exactly max_iter Lloyd passes on every subset at once; best of `restarts` by cost. Returns
    (centres (m,k,d), cost). Each subset's result is bitwise the same as if it were run alone (sequential sums),
    so it depends only on its own points and random draws (§9.1)."""
    m, _s, d = P.shape
    sizes = mask.sum(axis=1)
    best_C = np.full((m, k, d), np.nan)
    best_cost = np.full(m, np.inf)
    for _ in range(restarts):
        C = _kmeanspp(P, mask, sizes, k, rng)
        for _ in range(max_iter):
            lab = _nearest(_sq_dists(P, C))
            cnt, sums = _cluster_sums(P, lab, mask, k)
            C = np.where(cnt[..., None] > 0, sums / np.maximum(cnt, 1.0)[..., None], C)
        cost = _seq_sum(np.where(mask, _sq_dists(P, C).min(axis=-1), 0.0), 1)
        better = cost < best_cost
        best_C[better], best_cost[better] = C[better], cost[better]
    return best_C, best_cost


def subset_tuples(X, k: int, subsets: int, rng: np.random.Generator, *, restarts: int = 3,
                  max_iter: int = LLOYD_PASSES) -> np.ndarray:
    """Non-private part of friendly k-means: each record goes to one of `subsets` subsets by an independent coin
    from `rng` (independent of the data, not published, §9.1), and k-means++ with Lloyd (best of `restarts`)
    runs on every subset. Returns the tuples (m, k, d); a subset with fewer than k points gives a NaN tuple
    (which has no friends).

    Every subset's k-means++ draws from a generator of its own, spawned from `rng` (not from its stream): a
    subset's tuple is then a function of its own records and its own randomness only, so adding a record
    changes one tuple for every fixed draw of the randomness (the coupling of Lemma 9.1). A shared stream
    would not do: how much of it the other subsets consume depends on their contents. The subsets run in
    padded batches (of at most BATCH_FLOATS), which change no bit of any tuple (tests/test_friendlycore.py)."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    coins = rng.integers(0, subsets, size=n)
    streams = rng.spawn(subsets)
    order = np.argsort(coins, kind="stable")
    sizes = np.bincount(coins, minlength=subsets)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out = np.full((subsets, k, d), np.nan)
    run = np.nonzero(sizes >= k)[0]
    width = int(sizes.max()) if n else 0
    # Subsets batched by the public shapes only; within a batch, padding and the other subsets change no bit of
    # a subset's tuple (`_batched_kmeans`), and each draws from its own stream as if run alone (`_RowStreams`).
    per_batch = max(1, BATCH_FLOATS // max(1, width * k * max(d, 1)))
    for b in range(0, run.size, per_batch):
        group = run[b:b + per_batch]
        P, mask = np.zeros((group.size, width, d)), np.arange(width)[None, :] < sizes[group][:, None]
        for row, g in enumerate(group):
            P[row, :sizes[g]] = X[order[starts[g]:starts[g + 1]]]
        out[group] = _batched_kmeans(P, mask, k, _RowStreams([streams[g] for g in group]), restarts, max_iter)[0]
    return out


#: Floats of the largest array a batch of subsets makes (points x centres x coordinates): 512 kB, which stays in
#: the cache (at n = 200,000, k = 8, m = 624: 3.1 s for all subsets against 5.2 s with 128 MB batches).
BATCH_FLOATS = 1 << 16


class _RowStreams:
    """Draws of shape (m, ...) whose row g comes from stream g, in the order and amount a run of subset g alone
    would draw: a subset's k-means++ then depends on its own stream only, however it is batched (Lemma 9.1's
    coupling needs a subset's tuple to be a function of its own records and its own randomness)."""

    def __init__(self, streams):
        self.streams = streams

    def random(self, shape):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return np.stack([s.random(shape[1:]) for s in self.streams])


_KM_SPLIT_GRID = {"radius": 0.10, "weight": 0.10, "centres": 0.80}
_KM_SPLIT_FIXED = {"weight": 0.10, "centres": 0.90}


@dataclass(frozen=True)
class KMeansParams:
    """Public parameters of friendly k-means.

    k, subsets  number of centres and of subsets m (even: Lemma 9.2). Choose m from PUBLIC knowledge of the
                data size (e.g. ~ n / (k * 40)): the subsets should each hold enough points per cluster for
                k-means++ to find the clusters.
    rho, r, grid, delta_ptr, split, target, min_weight  as in MeanParams (split keys radius/weight/centres);
                target is a fraction of m (public); min_weight >= 3 (Theorem 9.6).
    restarts, max_iter  the non-private k-means++ per subset.
    """
    rho: float
    k: int
    subsets: int
    r: float | None = None
    grid: RadiusGrid | None = None
    delta_ptr: float = 1e-8
    split: dict | None = None
    target: float = 0.6
    min_weight: float = 3.0
    restarts: int = 3
    max_iter: int = LLOYD_PASSES

    def __post_init__(self):
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError("rho must be positive")
        if self.k < 1:
            raise ValueError("k must be >= 1")
        if self.subsets < 2 or self.subsets % 2:
            raise ValueError("the number of subsets must be even and >= 2 (Lemma 9.2)")
        check_radius_choice(self, TUPLE_WEIGHT_SENSITIVITY, "Theorem 9.6")
        check_budget(self)

    def budget_split(self) -> dict:
        return checked_split(self.split, _KM_SPLIT_GRID if self.grid is not None else _KM_SPLIT_FIXED)


def kmeans_plan(params: KMeansParams) -> Plan:
    """The plan of `friendly_kmeans`, its extra delta the PTR delta' (Theorem 9.6)."""
    s = {key: v * params.rho for key, v in params.budget_split().items()}
    why = ("adding or removing one record changes one subset (coins are independent of the data), hence "
           "replaces one of the m tuples: ")
    mech = []
    if params.grid is not None:
        mech.append(Mechanism(
            name="fck_radius", query="tuple soft-core weight W(r_j) of the proxy predicate (binary-search probe)",
            distribution="gaussian", sensitivity=TUPLE_WEIGHT_SENSITIVITY, repetitions=max(params.grid.probes, 1),
            noise_multiplier=zcdp_nm(s["radius"] / max(params.grid.probes, 1)),
            argument=why + "docs/friendlycore.md Lemma 9.2, |W(D'') - W(D)| <= 2(m-1)/m + 1 < 3 under "
                           "replacement, for any pair predicate"))
    mech.append(Mechanism(
        name="fck_weight", query="tuple soft-core total weight W at the chosen radius (PTR test)",
        distribution="gaussian", sensitivity=TUPLE_WEIGHT_SENSITIVITY, noise_multiplier=zcdp_nm(s["weight"]),
        argument=why + "docs/friendlycore.md Lemma 9.2, |dW| < 3"))
    mech.append(Mechanism(
        name="fck_centres", query="friendly weighted mean of the core tuples aligned by nearest reference centre "
                                  "(k bucket averages, one vector in R^{k d})",
        distribution="gaussian", sensitivity=None, bound_multiple=TUPLE_MEAN_SENSITIVITY_MULTIPLE,
        noise_multiplier=zcdp_nm(s["centres"]),
        argument=why + "docs/friendlycore.md Theorem 9.3 with Lemma 9.5 (consistent matchings, m even): "
                       "||dM|| < 8 r / max(W, W''); C = r / L, L <= max(W, W'') except with probability delta' "
                       "(Theorem 9.6)"))
    return Plan(tuple(mech), ptr_delta(params), PTR_ARGUMENT)


@dataclass(frozen=True)
class KMeansRelease:
    """What `friendly_kmeans` releases (DP output): centres (k, d) sorted lexicographically (the released object
    is the SET of centres, §9.4), or None for "no friendly core"."""
    centres: np.ndarray | None
    radius: float
    noisy_weight: float
    weight_lower_bound: float
    probes: tuple = field(default=())

    @property
    def released(self) -> bool:
        return self.centres is not None


def friendly_kmeans_from_tuples(tuples, params: KMeansParams, measure: Measure, *,
                                friends: TupleFriends | None = None) -> KMeansRelease:
    """The private part of friendly k-means on the m subset tuples (m, k, d) (see `friendly_kmeans`)."""
    T = np.asarray(tuples, dtype=np.float64)
    m, k, d = T.shape
    if m != params.subsets or k != params.k:
        raise ValueError(f"expected {params.subsets} tuples of {params.k} centres, got {T.shape}")
    plan = measure.plan
    friends = friends or TupleFriends(T)
    probes = ()
    if params.grid is not None:
        # Each probe: W of the proxy predicate at r_j, sensitivity < 3 under tuple replacement (Lemma 9.2).
        r, probes = binary_search_radius(lambda rr: total_weight(soft_weights(friends.proxy_counts(rr), m)),
                                         params.grid, params.target * m, measure, "fck_radius")
        probes = tuple(probes)
    else:
        r = float(params.r)
    w = soft_weights(friends.counts(r), m)
    W = total_weight(w)
    # Sensitivity of W < 3 under tuple replacement (Lemma 9.2).
    noisy_weight = float(measure("fck_weight", np.array([W]))[0])
    L = float(ptr_lower_bound(noisy_weight, plan["fck_weight"].scale, params.delta_ptr))
    if not L >= params.min_weight or not W > 0:  # W = 0 with L >= 3 happens only on the PTR failure event
        return KMeansRelease(None, r, noisy_weight, L, probes)
    core = np.nonzero(w > 0)[0]
    reference = T[core[np.argmax(w[core])]]
    aligned = align_tuples(T[core], reference).reshape(core.size, k * d)
    M = weighted_mean(aligned, w[core]).reshape(k, d)
    # Sensitivity 8 r / max(W, W'') <= 8 r / L on the PTR event (Theorem 9.3, Theorem 9.6).
    noisy = np.asarray(measure("fck_centres", M, bound=r / L), dtype=np.float64).reshape(k, d)
    noisy = noisy[np.lexsort(noisy.T[::-1])]
    return KMeansRelease(noisy, r, noisy_weight, L, probes)


def friendly_kmeans(X, params: KMeansParams, measure: Measure, rng: np.random.Generator) -> KMeansRelease:
    """Friendly k-means of the rows of X (n, d): no domain bound needed.

    measure : Measure over `kmeans_plan(params)`.
    rng     : public randomness for the subset coins and the k-means++ seeds; in production seed it from the
              OS and do not publish it (§9.1: the guarantee is over these coins).
    """
    tuples = subset_tuples(X, params.k, params.subsets, rng, restarts=params.restarts, max_iter=params.max_iter)
    return friendly_kmeans_from_tuples(tuples, params, measure)
