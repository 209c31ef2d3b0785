"""DP k-means (DP-KMEANS, Algorithm 1 of Lee & Kifer, "Postprocessing for Iterative Differentially Private
Algorithms"; originally Blum et al. 2005 / McSherry 2009).

Data live in a bounded domain (the paper's unit L1 ball, the box [-1, 1]^d or the unit L2 ball, see
`dpalgos.domain`). Each of T iterations assigns the points to their nearest current centroid, releases

    n~_j = |B_j| + Lap(T/((1 - f) eps))          and          s~_j = sum_{x in B_j} x + Lap(T Delta_S/(f eps))^d,

Delta_S the largest L1 norm of a point of the domain (1, d, sqrt(d)) and f the sums' share of the budget
(`sum_share`: the paper's 1/2 on the L1 ball), and moves the centroids to c_j = s~_j / n~_j projected onto
the domain. The whole noisy trajectory theta~_1..theta~_T is returned,
because the postprocessing of Lee & Kifer (§3.2-3.3) uses every iteration, not only the last.

Seeding (ours, after Su et al.'s observation that DP Lloyd's quality is decided by its start): Algorithm 1
starts from data-independent centroids, and on clustered data its noisy Lloyd steps settle in the local optimum
nearest to them. With `seeding=True` the first of the T rounds is spent on SEED_MULTIPLE x K data-independent
centroids instead: the same noisy counts and sums (same sensitivities: a point still lands in exactly one
cell), whose noisy means, weighted by their noisy counts, are clustered into K starting centroids by weighted
k-means (post-processing). Algorithm 1 then runs T - 1 iterations from there; its trajectory, the object of
Lee & Kifer's postprocessing, starts at these fixed (already released) centroids.

The algorithm never touches the data directly: it takes a sufficient-statistics callable
`stats(centroids) -> (sums (K, d), counts (K,))`, so the same code runs on an in-memory array
(`array_stats`) or on partitions reduced by dask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from dpalgos import domain as domains
from dpalgos import lloyd
from dpalgos.noise import Measure
from dpalgos.plan import Mechanism, Plan

Stats = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]

#: A cluster whose noisy count is below this keeps its previous centroid (see `update_centroids`).
MIN_NOISY_COUNT = 1.0
#: The seeding round's candidates per cluster (a public constant). WCSS / k-means++ on the [-1, 1]-scaled data,
#: DP k-means without refinement, T = 5, mean of 20-30 runs at eps = 0.05 / 0.25 / 1, unseeded -> x2 / x4 / x8:
#:   Gowalla-like (k = 5)  1.29 1.22 1.20 -> 1.25 1.15 1.14 / 1.26 1.15 1.12 / 1.29 1.07 1.05
#:   S1 (k = 15)           11.6 6.87 2.34 -> 11.4 6.55 2.00 / 11.1 6.11 1.96 / 11.1 6.62 2.09
#:   Adult (k = 5, box)    1.73 1.38 1.26 -> (x4) 1.63 1.19 1.10
SEED_MULTIPLE = 4


@dataclass(frozen=True)
class Seeding:
    """The seeding round: its data-independent candidates (K', d) at pairwise distance >= min_distance, their
    noisy counts (K',) and sums (K', d), the candidates' noisy means (K', d) and the K starting centroids
    clustered from them."""
    candidates: np.ndarray
    min_distance: float
    noisy_counts: np.ndarray
    noisy_sums: np.ndarray
    means: np.ndarray
    initial_centroids: np.ndarray


@dataclass(frozen=True)
class Trajectory:
    """The noisy trajectory of DP k-means: everything it released, and the public values it used.

    initial_centroids : (K, d) c^(0), data-independent.
    noisy_counts      : (T, K) n~^(t).
    noisy_sums        : (T, K, d) s~^(t).
    centroids         : (T, K, d) c^(t), derived from the noisy statistics by `update_centroids`;
                        iteration t assigns points with centroids[t-2] (initial_centroids for t = 1).
    noise_scale       : the Laplace scale b_N = 2T/eps of every count (the plan's).
    domain            : the domain of the points (and of the centroids).
    sum_noise_scale   : the Laplace scale b_S = 2T Delta_S/eps of every sum coordinate (the plan's);
                        None: b_N (the L1 ball, Delta_S = 1).
    """
    initial_centroids: np.ndarray
    noisy_counts: np.ndarray
    noisy_sums: np.ndarray
    centroids: np.ndarray
    noise_scale: float
    domain: str = "l1_ball"
    sum_noise_scale: float | None = None

    @property
    def sum_scale(self) -> float:
        return self.noise_scale if self.sum_noise_scale is None else self.sum_noise_scale

    @property
    def iterations(self) -> int:
        return self.noisy_counts.shape[0]

    @property
    def final_centroids(self) -> np.ndarray:
        return self.centroids[-1]

    def assignment_centroids(self) -> np.ndarray:
        """(T, K, d): the centroids theta~_{t-1} each iteration t assigned points with."""
        return np.concatenate([self.initial_centroids[None], self.centroids[:-1]], axis=0)


def assign(X: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (squared Euclidean, ties to the lowest index) of every row of X (n, d)
    -> int64 (n,)."""
    return lloyd.labels(X, centroids)


def cluster_stats(X: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact (non-private) sufficient statistics of one Lloyd step on X (n, d), in one fused pass.

    Returns sums (K, d) float64 and counts (K,) float64 of the points nearest to each centroid.
    Additive over disjoint parts of the data, so per-partition results can simply be summed.
    """
    return lloyd.stats(X, centroids)


def array_stats(X: np.ndarray) -> Stats:
    """The sufficient-statistics callable of an in-memory dataset X (n, d)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    return lambda centroids: cluster_stats(X, centroids)


def update_centroids(noisy_sums: np.ndarray, noisy_counts: np.ndarray, previous: np.ndarray,
                     domain: str = "l1_ball", sum_scale: float | None = None) -> np.ndarray:
    """c_j = s~_j / n~_j, with the rule for small noisy counts.

    A noisy count below MIN_NOISY_COUNT (in particular n~_j <= 0) carries no usable estimate of the
    cluster's size, and dividing by it would throw the centroid arbitrarily far: such a cluster keeps its
    previous centroid. Every other centroid is brought into the domain, where the true mean of its points
    must lie (every domain is convex): in the box, given the sums' Laplace scale `sum_scale`, by its posterior
    mean under the uniform prior on the box (`box_posterior_mean`); otherwise by projection. The rule reads
    only noisy values and public constants, so it is postprocessing and costs no privacy.
    """
    counts = np.asarray(noisy_counts, dtype=np.float64)
    ok = counts >= MIN_NOISY_COUNT
    out = np.array(previous, dtype=np.float64, copy=True)
    if np.any(ok):
        means = noisy_sums[ok] / counts[ok, None]
        out[ok] = (box_posterior_mean(means, sum_scale / counts[ok, None])
                   if domain == "box" and sum_scale is not None else domains.project(means, domain))
    return out


def box_posterior_mean(y: np.ndarray, beta) -> np.ndarray:
    """E[mu | y] per coordinate for y = mu + Laplace(beta), mu uniform on [-1, 1] (the box's public prior; ours).

    A cluster mean measured as s~/n~ has coordinate noise Laplace(b_S / n) (the count's own noise ignored).
    Projection (clipping) sends a coordinate whose noise dwarfs the box to a face, at squared distance about
    1 + x^2 from a point x; the posterior mean shrinks it toward the centre as the noise grows (0 in the limit,
    distance x^2) and is clip(y) as beta -> 0. The posterior is a Laplace density truncated to [-1, 1]; with
    c = clip(y, -1, 1), its parts left and right of c are exponentials on [-1, c] and [c, 1] of rate 1/beta,
    of masses beta (1 - e^(-a)), beta (1 - e^(-b)), a = (c + 1)/beta, b = (1 - c)/beta, and means
    c - beta + (c + 1)/(e^a - 1) and c + beta - (1 - c)/(e^b - 1) (the mean of an exponential truncated to an
    interval). Checked against numerical integration in tests/test_dpkmeans.py."""
    y = np.asarray(y, dtype=np.float64)
    beta = np.broadcast_to(np.asarray(beta, dtype=np.float64), y.shape)
    c = np.clip(y, -1.0, 1.0)
    a, b = (c + 1.0) / beta, (1.0 - c) / beta
    left, right = -np.expm1(-a), -np.expm1(-b)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # (c + 1)/(e^a - 1) -> beta as a -> 0, and -> 0 once e^a overflows
        mean_left = c - beta + np.where(a > 0, (c + 1.0) / np.expm1(a), beta)
        mean_right = c + beta - np.where(b > 0, (1.0 - c) / np.expm1(b), beta)
    return (left * mean_left + right * mean_right) / (left + right)


def plan(*, epsilon: float, iterations: int, k: int | None = None, d: int | None = None,
         domain: str = "l1_ball", seeding: bool = False) -> Plan:
    """The mechanisms of `dp_kmeans`: the budget eps is split evenly over the T rounds and, within one,
    (1 - f) eps/T to the counts and f eps/T to the sums, f = `sum_share` (1/2 on the L1 ball): counts get
    Laplace noise of scale T/((1 - f) eps) (sensitivity 1), sums T Delta_S/(f eps), Delta_S =
    `domain.sum_sensitivity` (the L1 ball's 1 needs no d). With `seeding` the first round measures the
    SEED_MULTIPLE x K seeding candidates (`seed_counts`, `seed_sums`, the same scales and arguments) and
    Algorithm 1 gets the other T - 1."""
    if not np.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
    if iterations < 1 + seeding:
        raise ValueError(f"iterations must be >= {1 + seeding}{' with seeding' if seeding else ''}, got {iterations}")
    if domain != "l1_ball" and d is None:
        raise ValueError(f"the {domain} domain's sum sensitivity needs the dimension d")
    share = sum_share(domain, d or 1)
    multiplier = iterations / epsilon
    kd = None if k is None or d is None else k * d

    def round_(prefix, what, rounds, clusters, values):
        return (Mechanism(prefix + "counts", f"per-cluster point counts n_j of {what}", "laplace", 1.0,
                          "adding or removing one point changes exactly one cluster's count by 1 (the centroids it is "
                          "assigned with are public or noisy values fixed before the pass): L1 sensitivity 1",
                          multiplier / (1.0 - share), integer=True, repetitions=rounds, values=clusters),
                Mechanism(prefix + "sums", f"per-cluster coordinate sums s_j (clusters x d values) of {what}",
                          "laplace", domains.sum_sensitivity(domain, d or 1),
                          _SUM_ARGUMENTS[domains.check_domain(domain)],
                          multiplier / share, repetitions=rounds, values=values))
    seeds = round_("seed_", "the seeding round (SEED_MULTIPLE x K candidates)", 1,
                   None if k is None else SEED_MULTIPLE * k,
                   None if kd is None else SEED_MULTIPLE * kd) if seeding else ()
    return Plan(seeds + round_("", "each iteration", iterations - seeding, k, kd))


def sum_share(domain: str, d: int) -> float:
    """The sums' share f of each iteration's budget (the counts get 1 - f). As Su et al. (2016), minimise the
    centroid error of c = s~/n~: its variance is about (2/n^2) (d b_S^2 + R^2 b_N^2), R the centroid's norm,
    and with b_S proportional to Delta_S/f, b_N to 1/(1 - f), the optimum is (1 - f)/f = (R^2/(d Delta_S^2))^(1/3).
    R^2 is the mean squared norm of a uniform point of the domain, a public constant (d/3 in the box, d/(d + 2)
    in the L2 ball). The L1 ball keeps the paper's even split (Lee & Kifer's setting, reproduced as such)."""
    if domains.check_domain(domain) == "l1_ball":
        return 0.5
    r2 = d / 3.0 if domain == "box" else d / (d + 2.0)
    return 1.0 / (1.0 + (r2 / (d * domains.sum_sensitivity(domain, d) ** 2)) ** (1.0 / 3.0))


_SUM_ARGUMENTS = {
    "l1_ball": "adding or removing a point x changes one cluster's sum by x, and ||x||_1 <= 1 in the unit L1 ball: "
               "L1 sensitivity 1 for the K*d vector",
    "box": "adding or removing a point x changes one cluster's sum by x; every coordinate is clipped to [-1, 1], so "
           "||x||_1 <= d, with equality at a vertex of the box: L1 sensitivity d for the K*d vector",
    "l2_ball": "adding or removing a point x changes one cluster's sum by x; rows are projected onto the unit L2 ball, "
               "so ||x||_1 <= sqrt(d) ||x||_2 <= sqrt(d) (Cauchy-Schwarz, equality at (+-1, ..., +-1)/sqrt(d)): "
               "L1 sensitivity sqrt(d) for the K*d vector"}


def dp_kmeans(stats: Stats, initial_centroids: np.ndarray, *, iterations: int, measure: Measure,
              domain: str = "l1_ball", on_iteration: Callable[[int, np.ndarray], None] | None = None) -> Trajectory:
    """Run Algorithm 1 for `iterations` (T) steps; the noise of `measure` follows `plan`.

    stats : sufficient-statistics callable on data inside `domain`.
    initial_centroids : (K, d), chosen without looking at the data (`data_independent_centroids`).
    domain : the data's domain; the plan's sum sensitivity must be its own.
    on_iteration : called as on_iteration(t, centroids) after each iteration (progress reporting).
    """
    C = np.array(initial_centroids, dtype=np.float64)
    K, d = C.shape
    if measure.plan["sums"].sensitivity != domains.sum_sensitivity(domain, d):
        raise ValueError(f"the plan's sum sensitivity {measure.plan['sums'].sensitivity} is not the {domain}'s")
    counts_t = np.empty((iterations, K))
    sums_t = np.empty((iterations, K, d))
    cents_t = np.empty((iterations, K, d))
    for t in range(iterations):
        sums, counts = stats(C)
        counts_t[t] = measure("counts", counts)
        sums_t[t] = measure("sums", sums)
        C = update_centroids(sums_t[t], counts_t[t], C, domain, measure.plan["sums"].scale)
        cents_t[t] = C
        if on_iteration is not None:
            on_iteration(t + 1, C)
    return Trajectory(initial_centroids=np.array(initial_centroids, dtype=np.float64),
                      noisy_counts=counts_t, noisy_sums=sums_t, centroids=cents_t,
                      noise_scale=measure.plan["counts"].scale, domain=domain,
                      sum_noise_scale=measure.plan["sums"].scale)


def default_seeding(iterations: int) -> bool:
    """The public default: seed whenever a round is left for Algorithm 1 (T >= 2)."""
    return iterations >= 2


def oversampled_seeds(stats: Stats, k: int, d: int, rng: np.random.Generator, *, measure: Measure,
                      domain: str = "l1_ball") -> Seeding:
    """The seeding round (see the module docstring): SEED_MULTIPLE x K data-independent candidates, their noisy
    counts and sums (`seed_counts`, `seed_sums` of `measure`), their noisy means (`update_centroids`'s rule), and
    K starting centroids from weighted k-means (k-means++, 10 restarts) on the means, each weighted by its noisy
    count clipped at 0. Everything after the measurement is post-processing; `rng` is public randomness."""
    from sklearn.cluster import KMeans

    if measure.plan["seed_sums"].sensitivity != domains.sum_sensitivity(domain, d):
        raise ValueError(f"the plan's seed sum sensitivity {measure.plan['seed_sums'].sensitivity} "
                         f"is not the {domain}'s")
    candidates, min_distance = data_independent_centroids(SEED_MULTIPLE * k, d, rng, domain=domain)
    sums, counts = stats(candidates)
    noisy_counts, noisy_sums = measure("seed_counts", counts), measure("seed_sums", sums)
    means = update_centroids(noisy_sums, noisy_counts, candidates, domain, measure.plan["seed_sums"].scale)
    # A tiny floor keeps every candidate selectable when fewer than K have positive noisy counts.
    weights = np.clip(noisy_counts, 0.0, None) + 1e-9
    km = KMeans(n_clusters=k, init="k-means++", n_init=10, random_state=int(rng.integers(2 ** 31)))
    with threadpool_limits(1):  # a few hundred points: thread start-up would cost 40x the fit
        initial = domains.project(km.fit(means, sample_weight=weights).cluster_centers_, domain)
    return Seeding(candidates, min_distance, noisy_counts, noisy_sums, means, initial)


def data_independent_centroids(k: int, d: int, rng: np.random.Generator, *,
                               min_distance: float | None = None, attempts: int = 20,
                               domain: str = "l1_ball") -> tuple[np.ndarray, float]:
    """K initial centroids in the domain, chosen without looking at the data.

    Sphere packing as in Su et al. ("Differentially Private k-Means Clustering", 2015): centroids at
    Euclidean distance >= a from the domain's boundary and >= 2a from each other. With `min_distance`
    given, 2a = min_distance (a public constant); otherwise a starts at half the domain's inradius, or at the
    largest radius whose K balls fit the domain's volume if that is smaller (no packing exists above it), and
    shrinks by 10% until K centroids fit. Returns (centroids (K, d), the pairwise minimum 2a used).
    """
    if k < 1 or d < 1:
        raise ValueError(f"need k >= 1 and d >= 1, got k={k}, d={d}")
    r = domains.inradius(domain, d)
    a = (min_distance / 2.0) if min_distance is not None else min(0.5 * r, _volume_bound(k, d, domain))
    while a > 1e-9:
        # Every domain is star-shaped about 0 with its inradius at 0: shrinking it by 1 - a / r keeps a
        # distance >= a from the boundary.
        shrink = 1.0 - a / r
        if shrink > 0:
            found = _pack(k, d, a, shrink, rng, attempts, domain)
            if found is not None:
                return found, 2.0 * a
        if min_distance is not None:
            raise ValueError(f"cannot place {k} centroids at pairwise distance >= {min_distance} "
                             f"inside the {d}-dimensional {domain}")
        a *= 0.9
    raise ValueError(f"cannot place {k} distinct initial centroids in dimension {d}")


def _volume_bound(k: int, d: int, domain: str) -> float:
    """The a above which K disjoint balls of radius a, centred at distance >= a from the boundary (so inside
    the domain), cannot fit: K v_d a^d <= vol(domain), v_d the unit ball's volume."""
    log_unit_ball = 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d + 1.0)
    log_volume = {"box": d * math.log(2.0), "l1_ball": d * math.log(2.0) - math.lgamma(d + 1.0),
                  "l2_ball": log_unit_ball}[domains.check_domain(domain)]
    return math.exp((log_volume - math.log(k) - log_unit_ball) / d)


def _pack(k, d, a, shrink, rng, attempts, domain):
    """Random greedy packing: candidates in a random order, each kept when it is at least 2a from every one kept
    before it. Another attempt at the same a is made only when this one came within two standard deviations of a
    Poisson count of K (a greedy packing's count varies little: far below K, more attempts only cost time; a spec's
    large K on any data took minutes here, after its charge)."""
    for _ in range(attempts):
        cands = shrink * domains.uniform(200 * k, d, domain, rng)
        chosen = _greedy_grid(cands, k, a) if d <= 3 else _greedy(cands, k, 4.0 * a * a)
        if chosen.size == k:
            return cands[chosen]
        if chosen.size < k - 2.0 * math.sqrt(k):
            return None
    return None


@numba.njit(cache=True)
def _greedy(cands: np.ndarray, limit: int, min_sq: float) -> np.ndarray:
    """Indices of the candidates kept by the greedy packing, in order, at most `limit` of them."""
    chosen = np.empty(limit, np.int64)
    n = 0
    for i in range(cands.shape[0]):
        far = True
        for j in range(n):
            s = 0.0
            for t in range(cands.shape[1]):
                diff = cands[i, t] - cands[chosen[j], t]
                s += diff * diff
            if s < min_sq:
                far = False
                break
        if far:
            chosen[n] = i
            n += 1
            if n == limit:
                break
    return chosen[:n]


#: At most this many kept points in a grid cell of side 2a (points 2a apart in a square, a cube: 4, 8).
_CELL_CAPACITY = 8


@numba.njit(cache=True)
def _greedy_grid(cands: np.ndarray, limit: int, a: float) -> np.ndarray:
    """`_greedy` for d <= 3 with the kept points bucketed in cells of side 2a over [-1, 1]^d: a candidate is compared
    with the kept points of its cell and the 3^d - 1 around it only (any point closer than 2a is in one of them).
    The same indices as `_greedy`, in the time of one pass over the candidates."""
    d = cands.shape[1]
    side = 2.0 * a
    m = int(2.0 / side) + 1
    cells = np.full((m ** d, _CELL_CAPACITY), -1, np.int64)
    chosen = np.empty(limit, np.int64)
    n = 0
    min_sq = 4.0 * a * a
    cell = np.empty(d, np.int64)
    for i in range(cands.shape[0]):
        for t in range(d):
            cell[t] = min(max(int((cands[i, t] + 1.0) / side), 0), m - 1)
        far = True
        for offset in range(3 ** d):
            flat, code, inside = 0, offset, True
            for t in range(d):
                c = cell[t] + code % 3 - 1
                code //= 3
                if c < 0 or c >= m:
                    inside = False
                flat = flat * m + c
            if not inside:
                continue
            for slot in range(_CELL_CAPACITY):
                j = cells[flat, slot]
                if j < 0:
                    break
                s = 0.0
                for t in range(d):
                    diff = cands[i, t] - cands[j, t]
                    s += diff * diff
                if s < min_sq:
                    far = False
                    break
            if not far:
                break
        if far:
            flat = 0
            for t in range(d):
                flat = flat * m + cell[t]
            for slot in range(_CELL_CAPACITY):
                if cells[flat, slot] < 0:
                    cells[flat, slot] = i
                    break
            chosen[n] = i
            n += 1
            if n == limit:
                break
    return chosen[:n]
