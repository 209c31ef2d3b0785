"""Postprocessing of the DP k-means trajectory: Lee & Kifer, "Postprocessing for Iterative Differentially
Private Algorithms" §3.2 (consistency) and §3.3 (MCMC simulation).

Everything here reads only the released trajectory (noisy counts and sums of every iteration, the centroids
the algorithm used) and public parameters: it is postprocessing and costs no privacy.

Consistency (§3.2): find n^_k^(t), s^_k^(t) closest to the noisy ones in the maximum-likelihood sense (L1,
Laplace noise of the same scale b on every value) such that sum_k s^_k^(t) and sum_k n^_k^(t) do not depend
on t and n^ >= 0, by ADMM (Lee, Wang & Kifer Algorithm 1).

MCMC (§3.3): Metropolis-Hastings over datasets D of points in the unit L1 ball with target

    pi(D) ~ exp(- sum_t sum_k ||s~_k^(t) - S_k(D, theta_{t-1})||_1 / b_S + |n~_k^(t) - N_k(D, theta_{t-1})| / b_N),

S_k, N_k the sum and count of the points of D nearest to centroid k of theta_{t-1} (the centroids iteration t
used) and s~, n~ the (consistent) noisy statistics. A move replaces a uniformly chosen point x by x' from the
Gaussian mixture of eq. (1): t uniform in 1..T, z ~ Cat(omega^(t)), x' ~ N(c_z^(t), delta_z^(t) I). The
paper uses one delta (0.001); here each component's variance is the uncertainty of the noisy centroid it sits
on, (b / n~_z^(t))^2 (sum noise over count), clamped to [delta_min, delta_max] (see `component_variances`).
The proposal does not depend on the current point, so the Metropolis-Hastings ratio is
pi(D')/pi(D) * q(x)/q(x') with q the full mixture density (the paper's formula keeps only the generating
component). A proposal outside the domain has target probability 0 and is rejected (projecting it would
give the proposal a singular part on the boundary and break the correction). The best-scoring dataset is
kept and non-private k-means (k-means++ restarts) on it gives the refined centroids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numba
import numpy as np

from dpalgos import admm
from dpalgos.domain import project_l1_ball
from dpalgos.dpkmeans import Trajectory

#: Range of the proposal components' variances: the paper's delta = 0.001 up to ten times it.
DELTA_MIN, DELTA_MAX = 0.001, 0.01
#: Default temperature: the chain targets pi^(1/temperature), i.e. it concentrates on datasets of high
#: likelihood (the best-scoring one is kept); temperature 1 samples pi itself.
TEMPERATURE = 1.0 / 64
#: Chain length: the paper's 30,000, or STEPS_PER_POINT moves per point of the simulated dataset if more
#: (WCSS stopped improving between 30 and 60 moves per point on S1, Adult and a Gowalla-like set).
PAPER_STEPS = 30_000
STEPS_PER_POINT = 30


@dataclass(frozen=True)
class ConsistentStatistics:
    """The trajectory's statistics after consistency: counts (T, K) >= 0 and sums (T, K, d) whose totals over
    clusters are the same at every iteration."""
    counts: np.ndarray
    sums: np.ndarray
    iterations: int = 0
    converged: bool = True


def consistency_constraints(T: int, K: int, d: int) -> np.ndarray:
    """A (p, T*K*(d+1)) with A x = 0 iff the cluster totals of counts and of every sum coordinate are equal
    across iterations; x = [counts (T, K) raveled, sums (T, K, d) raveled]."""
    n_counts = T * K
    rows = []
    for t in range(1, T):
        r = np.zeros(n_counts + T * K * d)
        r[t * K:(t + 1) * K] = 1.0
        r[0:K] = -1.0
        rows.append(r)
        for j in range(d):
            r = np.zeros(n_counts + T * K * d)
            r[n_counts + t * K * d + j: n_counts + (t + 1) * K * d: d] = 1.0
            r[n_counts + j: n_counts + K * d: d] = -1.0
            rows.append(r)
    return np.array(rows).reshape(-1, n_counts + T * K * d)


def consistent_statistics(traj: Trajectory, *, penalty: admm.Penalty = "l1", alpha: float = admm.ALPHA,
                          rho: float = admm.RHO) -> ConsistentStatistics:
    """§3.2: the maximum-likelihood consistent counts and sums of the trajectory (ADMM, Algorithm 1)."""
    T, K, d = traj.noisy_sums.shape
    x_tilde = np.concatenate([traj.noisy_counts.ravel(), traj.noisy_sums.ravel()])
    if T == 1:
        return ConsistentStatistics(np.maximum(traj.noisy_counts, 0.0), traj.noisy_sums.copy())
    A = consistency_constraints(T, K, d)
    mask = np.zeros(x_tilde.size, dtype=bool)
    mask[:T * K] = True
    res = admm.solve_linear(x_tilde, A, np.zeros(A.shape[0]), penalty=penalty, alpha=alpha, rho=rho, nonneg=mask,
                            scale=traj.noise_scale)
    return ConsistentStatistics(res.x[:T * K].reshape(T, K), res.x[T * K:].reshape(T, K, d), res.iterations,
                                res.converged)


def consistent_centroids(stats: ConsistentStatistics, traj: Trajectory) -> np.ndarray:
    """Centroids from the consistent last iteration, with DP k-means' rule for small counts."""
    from dpalgos.dpkmeans import update_centroids

    return update_centroids(stats.sums[-1], stats.counts[-1], traj.centroids[-2] if traj.iterations > 1
                            else traj.initial_centroids)


@numba.njit(cache=True)
def _seed(seed):
    np.random.seed(seed)


@numba.njit(cache=True, inline="always")
def _nearest(x, C):
    best, arg = np.inf, 0
    for k in range(C.shape[0]):
        s = 0.0
        for j in range(C.shape[1]):
            diff = x[j] - C[k, j]
            s += diff * diff
        if s < best:
            best, arg = s, k
    return arg


@numba.njit(cache=True)
def _log_q(x, prop_c, log_w, inv_2var):
    """log sum_t sum_k omega_k^(t) N(x; c_k^(t), var_k^(t) I), up to a constant; log_w holds
    log omega - (d/2) log var. Terms more than 40 below the largest are dropped (relative weight < e^-40)."""
    T, K, d = prop_c.shape
    e = np.empty(T * K)
    m = -np.inf
    for t in range(T):
        for k in range(K):
            s = 0.0
            for j in range(d):
                diff = x[j] - prop_c[t, k, j]
                s += diff * diff
            v = log_w[t, k] - s * inv_2var[t, k]
            e[t * K + k] = v
            if v > m:
                m = v
    if m == -np.inf:
        return -np.inf
    acc = 0.0
    for i in range(T * K):
        if e[i] > m - 40.0:
            acc += math.exp(e[i] - m)
    return m + math.log(acc)


@numba.njit(cache=True)
def _chain(steps, points, assign, S, N, logq, tgt_s, tgt_n, inv_bs, inv_bn, assign_c, prop_c, cum_w, log_w,
           var, state, best_points, journal_idx, journal_pts, trace, trace_every):
    """`steps` Metropolis-Hastings moves. state = [loglik, best_loglik, accepted, journal_len, overflow,
    trace_len]. The best dataset is kept in best_points, updated from a journal of accepted moves."""
    n, d = points.shape
    T, K = N.shape
    sd = np.sqrt(var)
    inv_2var = 0.5 / var
    xp = np.empty(d)
    new_assign = np.empty(T, dtype=np.int64)
    cap = journal_idx.size
    for step in range(steps):
        i = np.random.randint(n)
        # x' from the mixture: t uniform, z ~ Cat(omega^(t)), x' ~ N(c_z^(t), delta I).
        tp = np.random.randint(T)
        u = np.random.random() * cum_w[tp, K - 1]
        z = 0
        while z < K - 1 and cum_w[tp, z] < u:
            z += 1
        l1 = 0.0
        for j in range(d):
            xp[j] = prop_c[tp, z, j] + sd[tp, z] * np.random.standard_normal()
            l1 += abs(xp[j])
        if l1 > 1.0:  # outside the domain: pi(D') = 0
            continue
        delta_ll = 0.0
        for t in range(T):
            a = assign[t, i]
            b = _nearest(xp, assign_c[t])
            new_assign[t] = b
            ds = 0.0
            if a == b:
                for j in range(d):
                    old = S[t, a, j]
                    new = old + xp[j] - points[i, j]
                    ds += abs(tgt_s[t, a, j] - new) - abs(tgt_s[t, a, j] - old)
                delta_ll -= ds * inv_bs
            else:
                for j in range(d):
                    sa, sb = S[t, a, j], S[t, b, j]
                    ds += (abs(tgt_s[t, a, j] - (sa - points[i, j])) - abs(tgt_s[t, a, j] - sa)
                           + abs(tgt_s[t, b, j] - (sb + xp[j])) - abs(tgt_s[t, b, j] - sb))
                na, nb = N[t, a], N[t, b]
                dn = (abs(tgt_n[t, a] - (na - 1.0)) - abs(tgt_n[t, a] - na)
                      + abs(tgt_n[t, b] - (nb + 1.0)) - abs(tgt_n[t, b] - nb))
                delta_ll -= ds * inv_bs + dn * inv_bn
        lq_new = _log_q(xp, prop_c, log_w, inv_2var)
        log_ratio = delta_ll + logq[i] - lq_new
        if log_ratio >= 0.0 or np.random.random() < math.exp(log_ratio):
            for t in range(T):
                a, b = assign[t, i], new_assign[t]
                for j in range(d):
                    S[t, a, j] -= points[i, j]
                    S[t, b, j] += xp[j]
                N[t, a] -= 1.0
                N[t, b] += 1.0
                assign[t, i] = b
            for j in range(d):
                points[i, j] = xp[j]
            logq[i] = lq_new
            state[0] += delta_ll
            state[2] += 1
            jl = int(state[3])
            if jl < cap:
                journal_idx[jl] = i
                for j in range(d):
                    journal_pts[jl, j] = xp[j]
                state[3] = jl + 1
            else:
                state[4] = 1.0
            if state[0] > state[1]:
                if state[4] > 0:
                    best_points[:, :] = points
                else:
                    for m in range(int(state[3])):
                        for j in range(d):
                            best_points[journal_idx[m], j] = journal_pts[m, j]
                state[1] = state[0]
                state[3] = 0
                state[4] = 0.0
        if trace_every > 0 and (step + 1) % trace_every == 0 and int(state[5]) < trace.shape[0]:
            trace[int(state[5]), 0] = state[0]
            trace[int(state[5]), 1] = state[2]
            state[5] += 1


class DatasetChain:
    """The Metropolis-Hastings chain over simulated datasets for one DP k-means trajectory.

    traj : the released trajectory (its centroids define the partitions and the proposal).
    stats : the target statistics (consistent or raw noisy counts and sums).
    size : number of simulated points (default: sum of the last iteration's counts, rounded).
    """

    def __init__(self, traj: Trajectory, stats: ConsistentStatistics, *, delta: tuple[float, float] =
                 (DELTA_MIN, DELTA_MAX), temperature: float = TEMPERATURE, seed: int = 0, journal: int = 1 << 16):
        T, K, d = traj.noisy_sums.shape
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.assign_c = np.ascontiguousarray(traj.assignment_centroids())
        self.prop_c = np.ascontiguousarray(traj.centroids)
        w = np.maximum(stats.counts, 0.0)
        self.cum_w = np.cumsum(w, axis=1)
        if np.any(self.cum_w[:, -1] <= 0):
            raise ValueError("the proposal needs positive counts at every iteration")
        self.var = component_variances(stats.counts, traj.noise_scale, *delta)
        with np.errstate(divide="ignore"):
            self.log_w = np.log(w / self.cum_w[:, -1:]) - 0.5 * d * np.log(self.var)
        self.tgt_s, self.tgt_n = np.ascontiguousarray(stats.sums), np.ascontiguousarray(stats.counts)
        # b_S = b_N = b: every count and sum coordinate had Lap(2T/eps); the chain targets pi^(1/temperature).
        self.inv_b = 1.0 / (traj.noise_scale * temperature)
        self.temperature = float(temperature)
        # Initial state: round(n^_k^(T)) points at c_k^(T).
        reps = np.rint(np.maximum(stats.counts[-1], 0.0)).astype(np.int64)
        if reps.sum() == 0:
            raise ValueError("the last iteration's counts round to an empty dataset")
        self.points = np.repeat(traj.centroids[-1], reps, axis=0)
        self.assign = np.empty((T, self.points.shape[0]), dtype=np.int64)
        self.S, self.N = np.zeros((T, K, d)), np.zeros((T, K))
        for t in range(T):
            self.assign[t] = _assign_all(self.points, self.assign_c[t])
            self.N[t] = np.bincount(self.assign[t], minlength=K)
            for j in range(d):
                self.S[t, :, j] = np.bincount(self.assign[t], weights=self.points[:, j], minlength=K)
        self.logq = np.array([_log_q(p, self.prop_c, self.log_w, 0.5 / self.var) for p in self.points])
        self.state = np.array([self.full_loglik(), 0.0, 0.0, 0.0, 0.0, 0.0])
        self.state[1] = self.state[0]
        self.best_points = self.points.copy()
        self.journal_idx = np.empty(journal, dtype=np.int64)
        self.journal_pts = np.empty((journal, d))
        self.steps = 0
        _seed(seed)

    @property
    def size(self) -> int:
        return self.points.shape[0]

    @property
    def loglik(self) -> float:
        """log pi(D) of the current dataset (the untempered target), up to a constant."""
        return float(self.state[0]) * self.temperature

    @property
    def best_loglik(self) -> float:
        return float(self.state[1]) * self.temperature

    @property
    def accepted(self) -> int:
        return int(self.state[2])

    def full_loglik(self) -> float:
        """log pi(D)^(1/temperature) up to a constant, recomputed from scratch (the chain keeps it incrementally)."""
        ll = 0.0
        for t in range(self.assign.shape[0]):
            a = _assign_all(self.points, self.assign_c[t])
            K = self.N.shape[1]
            n = np.bincount(a, minlength=K)
            s = np.stack([np.bincount(a, weights=self.points[:, j], minlength=K) for j in range(self.points.shape[1])],
                         axis=1)
            ll -= (np.abs(self.tgt_s[t] - s).sum() + np.abs(self.tgt_n[t] - n).sum()) * self.inv_b
        return float(ll)

    def run(self, steps: int, trace_every: int = 0) -> np.ndarray:
        """Advance the chain; returns (log-likelihood, accepted so far) every `trace_every` steps."""
        trace = np.empty((steps // trace_every if trace_every else 0, 2))
        self.state[5] = 0
        _chain(steps, self.points, self.assign, self.S, self.N, self.logq, self.tgt_s, self.tgt_n, self.inv_b,
               self.inv_b, self.assign_c, self.prop_c, self.cum_w, self.log_w, self.var, self.state,
               self.best_points, self.journal_idx, self.journal_pts, trace, trace_every)
        self.steps += steps
        out = trace[:int(self.state[5])]
        out[:, 0] *= self.temperature  # report log pi, not the tempered target
        return out


def component_variances(counts: np.ndarray, noise_scale: float, delta_min: float = DELTA_MIN,
                        delta_max: float = DELTA_MAX) -> np.ndarray:
    """Variance (T, K) of each proposal component: the squared uncertainty of its noisy centroid, sum noise
    over count (b / n~)^2, clamped to [delta_min, delta_max]: wide where the centroid is poorly known (small
    counts or epsilon), the paper's tight delta where it is precise."""
    return np.clip((noise_scale / np.maximum(counts, 1.0)) ** 2, delta_min, delta_max)


def _assign_all(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    from dpalgos.dpkmeans import assign

    return assign(X, C)


def default_steps(size: int) -> int:
    return max(PAPER_STEPS, STEPS_PER_POINT * size)


@dataclass
class Refinement:
    """centroids (K, d): the refined release; dpkm_centroids: the last noisy iterate; consistent: the
    consistent statistics (None without consistency); chain diagnostics when MCMC ran."""
    centroids: np.ndarray
    dpkm_centroids: np.ndarray
    consistent: ConsistentStatistics | None = None
    steps: int = 0
    dataset_size: int = 0
    acceptance_rate: float = float("nan")
    best_loglik: float = float("nan")
    trace: np.ndarray = field(default_factory=lambda: np.empty((0, 2)))


def refine(traj: Trajectory, *, consistency: bool = True, mcmc: bool = True, steps: int | None = None,
           delta: tuple[float, float] = (DELTA_MIN, DELTA_MAX), temperature: float = TEMPERATURE,
           n_init: int = 10, seed: int = 0, trace_points: int = 200,
           progress: Callable[[int, int], None] | None = None) -> Refinement:
    """Lee & Kifer's postprocessing of a DP k-means trajectory (measurements and public parameters only).

    consistency : impose §3.2's constraints first (the MCMC then targets the consistent statistics).
    mcmc : run §3.3's chain for `steps` moves (default `default_steps`), then k-means (k-means++, `n_init`
        restarts) on the best dataset; without it the centroids are the (consistent) last iterate's.
    delta : (min, max) variance of the proposal components (`component_variances`).
    temperature : the chain targets pi^(1/temperature) (1: the paper's chain; lower: closer to the
        maximum-likelihood dataset the paper seeks).
    seed : the chain's and k-means' randomness (postprocessing: not privacy noise; fixed so that a rerun on
        the same measurements reproduces the release).
    progress : called as progress(steps done, total steps) after each tenth of the chain.
    """
    stats = consistent_statistics(traj) if consistency else ConsistentStatistics(traj.noisy_counts, traj.noisy_sums)
    base = consistent_centroids(stats, traj) if consistency else traj.final_centroids
    out = Refinement(centroids=base, dpkm_centroids=traj.final_centroids,
                     consistent=stats if consistency else None)
    if not mcmc:
        return out
    try:
        chain = DatasetChain(traj, stats, delta=delta, temperature=temperature, seed=seed)
    except ValueError:
        return out  # nothing to simulate (all counts ~ 0): keep the centroids above
    n_steps = default_steps(chain.size) if steps is None else steps
    every = max(n_steps // trace_points, 1)
    chunk = max(every * max(n_steps // (10 * every), 1), 1)
    traces, done = [], 0
    while done < n_steps:
        todo = min(chunk, n_steps - done)
        traces.append(chain.run(todo, trace_every=every))
        done += todo
        if progress is not None:
            progress(done, n_steps)
    trace = np.concatenate(traces) if traces else np.empty((0, 2))
    K = traj.noisy_counts.shape[1]
    out.steps, out.dataset_size, out.trace = n_steps, chain.size, trace
    out.acceptance_rate, out.best_loglik = chain.accepted / max(n_steps, 1), chain.best_loglik
    if np.unique(chain.best_points, axis=0).shape[0] >= K:
        from sklearn.cluster import KMeans

        km = KMeans(n_clusters=K, init="k-means++", n_init=n_init, random_state=seed).fit(chain.best_points)
        out.centroids = project_l1_ball(km.cluster_centers_)
    return out


