"""How wrong a released value may be: the noise law of a plan entry (standard deviation, exact two-sided
intervals, public draws for a parametric bootstrap) and the percentile intervals of bootstrap replicates.

Everything here is post-processing: it reads a plan entry's public distribution and scale, or replicate values,
never data and never the secret noise stream. The draws of `NoiseLaw.sample` come from a numpy generator the
caller seeds from public values: they simulate the plan's noise for the bootstrap, they never noise a release.

Exact intervals of the production samplers (`dpalgos.noise.ExactNoise`):
  laplace, integer    OpenDP's discrete Laplace, P(k) ~ exp(-|k|/b) on the integers: the half-width is the
                      smallest integer h with P(|Z| <= h) >= c (OpenDP's `discrete_laplacian_scale_to_accuracy`,
                      floored, as its documentation allows), checked against the closed form
                      P(|Z| > h) = 2 q^(h+1) / (1 + q), q = e^(-1/b). Standard deviation sqrt(2q) / (1 - q).
  laplace, real       the float Laplace (an exact discrete Laplace on the 2^-1074 grid, indistinguishable from
                      the continuous law at double precision): h = b ln(1/(1 - c)), std sqrt(2) b.
  gaussian, integer   the discrete Gaussian, P(k) ~ exp(-k^2 / (2 s^2)): h from its exact CDF by summation (OpenDP's
                      accuracy function for it is a bound, wider than the exact quantile); std by summation for
                      s < 2, s otherwise (the difference is below s^2 e^(-2 pi^2 s^2) < 1e-30 s^2).
  gaussian, real      h = s Phi^-1((1 + c) / 2), std s.
An integer measurement and its true value are integers, so [y - h, y + h] covers the truth exactly when |Z| <= h:
the atoms make the coverage `attained` >= c (equal to c for the real laws); `randomised_half_widths` makes it exactly
c with a public coin per value (h or h - 1), the published direct intervals' rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpalgos.plan import Mechanism

#: Below this scale the discrete Gaussian's normaliser and variance are summed term by term.
_DG_SUMMED_BELOW = 2.0


@dataclass(frozen=True)
class NoiseLaw:
    """The noise of one draw: the plan entry's distribution on the integers or the reals, at `scale` (Laplace b,
    Gaussian standard deviation)."""
    distribution: Literal["laplace", "gaussian"]
    integer: bool
    scale: float

    def __post_init__(self):
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"a noise scale must be positive and finite, got {self.scale}")

    @classmethod
    def of(cls, mechanism: Mechanism, scale: float | None = None) -> NoiseLaw:
        """The law of a plan entry's draws (at `scale`, for an entry whose bound is chosen during the release).
        DP-SGD's per-step numpy Gaussian is continuous; every other integer entry draws from a discrete sampler."""
        integer = mechanism.integer and not mechanism.per_step_generator
        return cls(mechanism.distribution, integer, float(mechanism.scale if scale is None else scale))

    def std(self) -> float:
        b = self.scale
        if self.distribution == "laplace":
            if not self.integer:
                return math.sqrt(2.0) * b
            q = math.exp(-1.0 / b)
            return math.sqrt(2.0 * q) / (1.0 - q)
        if not self.integer or b >= _DG_SUMMED_BELOW:
            return b
        k, w = _dg_weights(b)
        return math.sqrt(float((w * k * k).sum() / w.sum()))

    def half_width(self, confidence: float) -> float:
        """The smallest h (an integer for integer laws) with P(|Z| <= h) >= confidence."""
        _check_confidence(confidence)
        from opendp import accuracy

        b = self.scale
        if self.distribution == "laplace" and not self.integer:
            return float(accuracy.laplacian_scale_to_accuracy(b, 1.0 - confidence))
        if self.distribution == "gaussian" and not self.integer:
            return float(accuracy.gaussian_scale_to_accuracy(b, 1.0 - confidence))
        if self.distribution == "laplace":
            h = max(math.floor(accuracy.discrete_laplacian_scale_to_accuracy(b, 1.0 - confidence)), 0)
            while self.coverage(h) < confidence:  # the closed form decides a float tie at the boundary
                h += 1
            while h > 0 and self.coverage(h - 1) >= confidence:
                h -= 1
            return float(h)
        return float(_dg_half_width(b, confidence))

    def coverage(self, h: float) -> float:
        """P(|Z| <= h)."""
        b = self.scale
        if self.distribution == "laplace" and not self.integer:
            return -math.expm1(-h / b)
        if self.distribution == "gaussian" and not self.integer:
            return math.erf(h / (b * math.sqrt(2.0)))
        h = math.floor(h)
        if self.distribution == "laplace":
            q = math.exp(-1.0 / b)
            return 1.0 - 2.0 * q ** (h + 1) / (1.0 + q)
        return _dg_mass(b, h)

    def attained(self, confidence: float) -> float:
        """The coverage of the interval of half-width `half_width(confidence)`: >= confidence (equal for real laws)."""
        return self.coverage(self.half_width(confidence))

    def randomised_half_widths(self, confidence: float, coins: np.ndarray) -> np.ndarray:
        """Half-widths whose interval covers with probability exactly `confidence`, for integer laws too: h =
        `half_width(confidence)` where a value's coin (uniform on [0, 1), public, independent of the noise) is below
        p = (c - P(|Z| <= h - 1)) / (P(|Z| <= h) - P(|Z| <= h - 1)), else h - 1; then P(cover) = p P(|Z| <= h) +
        (1 - p) P(|Z| <= h - 1) = c. At b = 1 (a count at epsilon 1) the fixed interval +-3 covers 97.3 %, +-2 92.7 %:
        this one 95.0 %. Real laws: h for every value (it is exact already)."""
        h = self.half_width(confidence)
        coins = np.asarray(coins, dtype=np.float64)
        if not self.integer or h == 0:
            return np.full(coins.shape, h)
        below, at = self.coverage(h - 1), self.coverage(h)
        p = (confidence - below) / (at - below)
        return np.where(coins < p, h, h - 1.0)

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Draws of this law from a public generator (the bootstrap's simulated noise: never a release's)."""
        b = self.scale
        if self.distribution == "gaussian":
            return _discrete_gaussian(rng, b, shape) if self.integer else rng.normal(0.0, b, shape)
        if not self.integer:
            return rng.laplace(0.0, b, shape)
        return _discrete_laplace(rng, b, shape)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _discrete_laplace(rng: np.random.Generator, b: float, shape) -> np.ndarray:
    """P(k) ~ q^|k|: the difference of two geometric variables of success probability 1 - q (same support shift)."""
    p = -math.expm1(-1.0 / b)
    return (rng.geometric(p, shape) - rng.geometric(p, shape)).astype(np.float64)


def _discrete_gaussian(rng: np.random.Generator, s: float, shape) -> np.ndarray:
    """Canonne, Kamath & Steinke (2020) Algorithm 3, vectorised: Y ~ discrete Laplace of scale t = floor(s) + 1,
    accepted with probability exp(-(|Y| - s^2/t)^2 / (2 s^2)); the accepted Y are exactly discrete Gaussian."""
    n = int(np.prod(shape))
    t = math.floor(s) + 1.0
    out = np.empty(0)
    while out.size < n:
        y = _discrete_laplace(rng, t, (2 * (n - out.size) + 16,))
        keep = rng.random(y.size) < np.exp(-((np.abs(y) - s * s / t) ** 2) / (2.0 * s * s))
        out = np.concatenate([out, y[keep]])
    return out[:n].reshape(shape)


def _dg_weights(s: float) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(-math.ceil(40 * s) - 2, math.ceil(40 * s) + 3, dtype=np.float64)
    return k, np.exp(-k * k / (2.0 * s * s))


def _dg_normaliser(s: float) -> float:
    """sum_k exp(-k^2 / 2s^2): summed for small s, by Poisson summation otherwise (s sqrt(2 pi) times
    1 + 2 e^(-2 pi^2 s^2) + ..., the next term below e^(-8 pi^2 s^2))."""
    if s < _DG_SUMMED_BELOW:
        return float(_dg_weights(s)[1].sum())
    return s * math.sqrt(2.0 * math.pi) * (1.0 + 2.0 * math.exp(-2.0 * math.pi ** 2 * s * s))


def _dg_mass(s: float, h: int) -> float:
    """P(|Z| <= h) of the discrete Gaussian, the central terms summed in order."""
    k = np.arange(1, h + 1, dtype=np.float64)
    central = 1.0 + 2.0 * math.fsum(np.exp(-k * k / (2.0 * s * s)).tolist())
    return min(central / _dg_normaliser(s), 1.0)


def _dg_half_width(s: float, confidence: float) -> int:
    """The smallest integer h with P(|Z| <= h) >= confidence: from two below the continuous quantile (near the
    answer), up until the mass suffices, then down while it still does."""
    from statistics import NormalDist

    h = max(math.floor(NormalDist().inv_cdf(0.5 + confidence / 2.0) * s) - 2, 0)
    while _dg_mass(s, h) < confidence:
        h += 1
    while h > 0 and _dg_mass(s, h - 1) >= confidence:
        h -= 1
    return h


def replicate_ranks(replicates: int, confidence: float) -> tuple[int, int]:
    """0-based positions (lo, hi) of the interval's ends among `replicates` sorted bootstrap values: the k-th
    smallest and the k-th largest, k = floor((B + 1)(1 - c) / 2). If the released error and the B replicate errors
    are exchangeable (the bootstrap is exact), the truth lies below the k-th smallest with probability
    k / (B + 1) <= (1 - c) / 2, so the interval covers with probability >= c (exactly c when (B + 1)(1 - c) / 2 is
    an integer: B = 39, 79, 199 at c = 0.95)."""
    _check_confidence(confidence)
    k = math.floor((replicates + 1) * (1.0 - confidence) / 2.0 + 1e-9)
    if k < 1:
        raise ValueError(f"{replicates} replicates are too few for a {confidence:g} interval: at least "
                         f"{min_replicates(confidence)}")
    return k - 1, replicates - k


def min_replicates(confidence: float) -> int:
    """The fewest replicates that give a `confidence` interval (k = 1): 39 at 0.95, 19 at 0.9, 199 at 0.99."""
    _check_confidence(confidence)
    return math.ceil(2.0 / (1.0 - confidence) - 1e-9) - 1


def percentile_interval(replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) over axis 0 of a (B, ...) array of replicate values (`replicate_ranks`)."""
    lo, hi = replicate_ranks(replicates.shape[0], confidence)
    ordered = np.sort(replicates, axis=0)
    return ordered[lo], ordered[hi]
