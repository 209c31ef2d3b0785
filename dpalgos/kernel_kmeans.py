"""DP kernel k-means with random Fourier features (Acs, Melis, Castelluccia, De Cristofaro, "Differentially
Private Mixture of Generative Neural Networks", §4.1, Algorithm 2), the DPNorm clipping-bound selection
(Algorithm 3) and the plain DP k-means baseline on raw records (Blum et al. 2005).

Records are binary vectors over m items, dense (n, m) or scipy CSR (set-valued records). The RBF kernel
kappa(x, y) = exp(-gamma ||x - y||^2) is approximated by z(x) = sqrt(2/d) cos(W'x + b) with the d columns of W
drawn from its spectral density N(0, 2 gamma I) and b uniform in [0, 2 pi) (Rahimi & Recht); W and b are
public (they do not depend on the data). The norm ||z(x)|| is at most sqrt(2) and 1 in expectation squared
(the paper's Theorem 2), whatever x and d: features clipped to C_s = 1 give noise independent of m and d.

Sensitivities are those of this pipeline's neighbouring relation, add or remove one record (one user): the
paper's neighbours replace a record, which may move between two clusters (sensitivities sqrt 2, sqrt(2) C_s,
sqrt 2); under add/remove the record enters one cluster only (1, C_s, 1). The arguments are in `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp

from dpalgos import accounting, lloyd
from dpalgos.noise import Measure
from dpalgos.plan import ADD_REMOVE_USER, Mechanism, Plan

Stats = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class RandomFourierFeatures:
    """z(x) = sqrt(2/d) cos(x W + b) for the RBF kernel exp(-gamma ||x - y||^2). W: (m, d), b: (d,)."""
    W: np.ndarray
    b: np.ndarray
    gamma: float

    @property
    def dim(self) -> int:
        return self.b.size

    def transform(self, X) -> np.ndarray:
        """Features (n, d) float32 of records X: dense (n, m) or sparse CSR (a sparse-dense product).

        Single precision: the arguments of the cosine are O(1-10) and the features enter sums that get
        Gaussian noise; it makes the pass ~5x faster (numpy's float32 cos is vectorised)."""
        W = self.W.astype(np.float32)
        X = X.astype(np.float32) if sp.issparse(X) else np.asarray(X, dtype=np.float32)
        proj = np.asarray(X @ W)
        proj += self.b.astype(np.float32)
        np.cos(proj, out=proj)
        proj *= np.float32(np.sqrt(2.0 / self.dim))
        return proj


def rbf_features(m: int, d: int, gamma: float, rng: np.random.Generator) -> RandomFourierFeatures:
    """Random Fourier features of the RBF kernel: W columns ~ N(0, 2 gamma I_m), b ~ U[0, 2 pi)^d."""
    if gamma <= 0 or d < 1 or m < 1:
        raise ValueError(f"need gamma > 0, d >= 1, m >= 1; got gamma={gamma}, d={d}, m={m}")
    return RandomFourierFeatures(rng.normal(0.0, np.sqrt(2.0 * gamma), size=(m, d)),
                                 rng.uniform(0.0, 2.0 * np.pi, size=d), float(gamma))


def clip_rows(Z: np.ndarray, bound: float) -> np.ndarray:
    """z / max(1, ||z|| / bound) row-wise: every row's L2 norm at most `bound` (float32 rounding aside,
    which the sensitivity argument absorbs by clipping slightly inside: bound * (1 - 1e-6))."""
    norms = np.linalg.norm(Z, axis=1)
    scale = np.maximum(1.0, norms / (bound * (1.0 - 1e-6))).astype(Z.dtype)
    return Z / scale[:, None]


def norm_histogram(norms: np.ndarray, c_max: float, bins: int) -> np.ndarray:
    """t_j = #{C_{j-1} < ||.|| <= C_j}, C_j = j c_max / bins, j = 1..bins (norms above c_max are not counted)."""
    idx = np.ceil(np.asarray(norms) / (c_max / bins)).astype(np.int64)
    ok = (idx >= 1) & (idx <= bins)
    return np.bincount(idx[ok] - 1, minlength=bins).astype(np.float64)


def dp_norm(histogram: np.ndarray, *, c_max: float, measure: Measure, name: str = "norms") -> float:
    """DPNorm (Algorithm 3): the upper edge of the noisy mode of the norm histogram.

    `histogram` is `norm_histogram` of the records (its sum over the data: additive across partitions).
    """
    noisy = measure(name, histogram)
    return (int(np.argmax(noisy)) + 1) * c_max / histogram.size


def feature_stats(X, rff: RandomFourierFeatures, clip: float, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums (k, d) and counts (k,) of the clipped features of X grouped by nearest centre (one partition):
    clipping, assignment and sums in one fused pass over the features (no clipped copy, no score matrix)."""
    return lloyd.clipped_stats(rff.transform(X), centres, clip)


def grouped_stats(Z: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums (k, d) and counts (k,), float64, of the rows of Z grouped by nearest centre."""
    return lloyd.stats(Z, centres)


def nearest(Z: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Index of the nearest centre of every row (squared Euclidean)."""
    return lloyd.labels(Z, centres)


def feature_norms(X, rff: RandomFourierFeatures) -> np.ndarray:
    return np.linalg.norm(rff.transform(X), axis=1)


@dataclass(frozen=True)
class KernelKMeansResult:
    """centres (k, d): noisy centres in feature space after the last iteration; trajectory (T, k, d);
    noisy_counts (T, k); clip: C_s used."""
    centres: np.ndarray
    trajectory: np.ndarray
    noisy_counts: np.ndarray
    clip: float


#: `dp_lloyd`'s reseeding (DPGM's clustering): a cluster's noisy centre is re-seeded when the expected norm of its
#: noise, sigma C_s sqrt(d) / n~ (the sums' Gaussian over the noisy size), exceeds this fraction of C_s, the radius
#: of the ball every record's features and every true centre lie in. Such a centre is mostly noise and lands away
#: from every record (retail on 64 items, epsilon 1.74, sigma 33: clusters of 300-1,000 records at the first
#: iteration flung to norms 2-20, then empty for good: 2 of 4 clusters dead at seed 0, 1 at seed 3). Chosen once
#: on retail at 64 items (tests/benchmarks/dpgm_ablation.py, variant reseed=), docs/explanation-peers.md §2.2.
RESEED_NOISE = 0.1
#: A re-seeded centre is the largest cluster's noisy centre moved by this fraction of C_s in a public random
#: direction: the next pass splits that cluster's records by a random hyperplane through its centre.
RESEED_STEP = 0.05


def dp_lloyd(stats: Stats, initial: np.ndarray, *, iterations: int, clip: float, measure: Measure,
             on_iteration: Callable[[int], None] | None = None,
             reseed: np.random.Generator | None = None) -> KernelKMeansResult:
    """Lines 6-11 of Algorithm 2 (and Blum et al.'s DP k-means): T noisy Lloyd iterations on vectors whose
    L2 norm is at most `clip`, from centres chosen without the private data; noise from `plan`'s entries
    "sizes" and "sums".

    stats(centres) -> (sums (k, d), counts (k,)) of the clipped vectors grouped by nearest centre.
    A cluster whose noisy size is below 1 keeps its previous centre (it carries no usable estimate). With
    `reseed` (public randomness), a cluster whose centre is mostly noise is re-seeded beside the largest one
    instead (`reseeded`: post-processing of the noisy sizes and sums and the plan's public noise scale).
    """
    C = np.array(initial, dtype=np.float64)
    k, d = C.shape
    traj, counts_t = np.empty((iterations, k, d)), np.empty((iterations, k))
    for t in range(iterations):
        sums, counts = stats(C)
        n_hat = measure("sizes", counts)
        s_hat = measure("sums", sums, bound=clip)
        ok = n_hat >= 1.0
        C[ok] = s_hat[ok] / n_hat[ok, None]
        if reseed is not None:
            C = reseeded(C, n_hat, measure.plan["sums"].noise_multiplier * clip, clip, reseed)
        traj[t], counts_t[t] = C, n_hat
        if on_iteration is not None:
            on_iteration(t + 1)
    return KernelKMeansResult(C, traj, counts_t, float(clip))


def reseeded(C: np.ndarray, n_hat: np.ndarray, noise_sd: float, clip: float, rng: np.random.Generator) -> np.ndarray:
    """Centres C (k, d) with every one whose noise is too large (expected noise norm noise_sd sqrt(d) / n~ above
    RESEED_NOISE clip; n~ below 1 counts as 1) moved beside the cluster of largest remaining noisy size: that
    centre plus RESEED_STEP clip in a uniformly random direction. The donor's size is halved in this bookkeeping,
    so several re-seeded centres spread over the largest clusters. Noisy values, public scales and public
    randomness only: post-processing. Unchanged when no centre is reliable (nothing to split)."""
    d = C.shape[1]
    noisy = noise_sd * np.sqrt(d) / np.maximum(n_hat, 1.0) > RESEED_NOISE * clip
    if not noisy.any() or noisy.all():
        return C
    C, size = C.copy(), np.where(noisy, -np.inf, n_hat)
    for j in np.flatnonzero(noisy):
        donor = int(np.argmax(size))
        u = rng.standard_normal(d)
        C[j] = C[donor] + RESEED_STEP * clip * u / np.linalg.norm(u)
        size[donor] /= 2.0
        size[j] = size[donor]
    return C


def plan(*, iterations: int, sigma: float, dpnorm: bool = False, k: int | None = None,
         features: int | None = None, norm_bins: int | None = None) -> Plan:
    """The Gaussian mechanisms of DP kernel k-means, all with noise multiplier sigma (one calibration)."""
    out = []
    if dpnorm:
        out.append(Mechanism("norms", "histogram of feature norms (DPNorm, Algorithm 3)", "gaussian", 1.0,
                             "adding or removing one record changes one bin of the norm histogram by 1: L2 "
                             "sensitivity 1", sigma, integer=True, relation=ADD_REMOVE_USER, values=norm_bins))
    out.append(Mechanism("sizes", "cluster sizes at each iteration", "gaussian", 1.0,
                         "adding or removing one record changes the size of the one cluster it is assigned to "
                         "(centres fixed before the pass) by 1: L2 sensitivity 1", sigma, integer=True,
                         repetitions=iterations, relation=ADD_REMOVE_USER, values=k))
    out.append(Mechanism("sums", "sums of clipped random Fourier features per cluster at each iteration",
                         "gaussian", None,
                         "adding or removing one record adds its clipped feature vector, of L2 norm at most C_s "
                         "(the public or DPNorm clipping bound), to one cluster's sum: L2 sensitivity C_s", sigma,
                         repetitions=iterations, relation=ADD_REMOVE_USER,
                         values=None if k is None or features is None else k * features))
    return Plan(tuple(out))


def calibrate_sigma(*, epsilon: float, delta: float, iterations: int, dpnorm: bool = False) -> float:
    """The smallest sigma (shared by every Gaussian mechanism of the run) giving (epsilon, delta), by
    dp_accounting's RDP accountant and its calibration search on the plan's event."""
    # The search probes sigma = 0 (no noise, infinite loss): a tiny positive multiplier stands for it.
    make = lambda s: plan(iterations=iterations, sigma=max(s, 1e-9), dpnorm=dpnorm).event()
    return accounting.calibrate(make, epsilon, delta)


def lemma1_log_moment(lam: float, sigma: float) -> float:
    """The paper's Lemma 1: alpha(lambda) = (lambda^2 + lambda) / (4 sigma^2) for one Gaussian mechanism.

    The exact log-moment of the Gaussian privacy loss N(1/(2 sigma^2), 1/sigma) is (lambda^2 + lambda) /
    (2 sigma^2): the lemma is off by a factor 2 (see tests/test_kernel_kmeans.py); accounting here uses
    dp_accounting, which has the exact value."""
    return (lam * lam + lam) / (4.0 * sigma * sigma)


#: A clustering into k >= 2 clusters is degenerate when one cluster holds more than this share of the records
#: (the other k - 1 clusters hold less than a tenth between them: nothing is separated) or when fewer than 2
#: clusters are non-empty. Its feature-WCSS ratio would look reassuring (noise-free Lloyd iterations started
#: from centres that captured nearly everything collapse the same way, ratio ~ 1), so it is a failure instead.
DEGENERATE_SHARE = 0.9


def degeneracy(sizes) -> dict:
    """The degenerate-clustering check on cluster sizes (k,): the largest cluster's share of the records,
    the number of non-empty clusters, and `degenerate` (never for k = 1: one cluster is what was asked)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    total = float(sizes.sum())
    share = float(sizes.max() / total) if total > 0 else 1.0
    nonempty = int(np.count_nonzero(sizes > 0))
    return {"largest_cluster_share": share, "nonempty_clusters": nonempty,
            "degenerate": bool(sizes.size >= 2 and (nonempty < 2 or share > DEGENERATE_SHARE))}


def clustering_accuracy(labels: np.ndarray, truth: np.ndarray) -> float:
    """Unsupervised clustering accuracy: the best one-to-one matching of clusters to classes (Hungarian
    algorithm), as a fraction of records correctly labelled."""
    from scipy.optimize import linear_sum_assignment

    labels, truth = np.asarray(labels), np.asarray(truth)
    k = int(max(labels.max(), truth.max())) + 1
    table = np.zeros((k, k), dtype=np.int64)
    np.add.at(table, (labels, truth), 1)
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / labels.size)
