"""The soft core and the friendly average (docs/friendlycore.md §2-§6, §8): weights, the weighted mean, the
propose-test-release bound and what both release plans share (the noise multiplier, the PTR delta')."""

from __future__ import annotations

import math

import numpy as np

from dpalgos.friendlycore.constants import check_radius
from dpalgos.plan import Mechanism


def total_weight(weights: np.ndarray) -> float:
    """W = sum of the weights, correctly rounded (math.fsum): its error stays below the slack of Corollary 3.2
    (§12)."""
    return math.fsum(np.asarray(weights, dtype=np.float64).tolist())


def soft_weights(counts: np.ndarray, n=None) -> np.ndarray:
    """w(x) = clip(2 deg(x)/n - 1, 0, 1) (§2): 0 for points with at most n/2 friends, 1 for friends of all.
    n (default: the number of counts) may be an array broadcasting against `counts` (n = 0 gives weight 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    n = np.asarray(counts.size if n is None else n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.clip(2.0 * counts / n - 1.0, 0.0, 1.0)
    return np.where(n > 0, w, 0.0)


def weighted_mean(points: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
    """M = sum w x / W, computed relative to the heaviest point (so its rounding error is of order
    n u * 2r / W + ulp(M), §12); None when W = 0."""
    points = np.asarray(points, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    W = total_weight(w)
    if not W > 0:
        return None
    ref = points[int(np.argmax(w))]
    sel = w > 0
    return ref + (w[sel] @ (points[sel] - ref)) / W


def gaussian_tail_z(delta_ptr: float) -> float:
    """z with P[X >= z sigma] <= delta' for X ~ N(0, sigma^2) AND for the discrete Gaussian on any grid
    (sub-Gaussian with variance proxy sigma^2: Canonne, Kamath & Steinke 2020, Cor. 9): z = sqrt(2 ln(1/delta'))."""
    if not 0.0 < delta_ptr < 1.0:
        raise ValueError(f"delta' must be in (0, 1), got {delta_ptr}")
    return math.sqrt(2.0 * math.log(1.0 / delta_ptr))


def ptr_lower_bound(noisy_weight, sigma_weight: float, delta_ptr: float):
    """L = W^ - z sigma_W, lowered by a relative 1e-9 so that floating-point rounding (of W^ by the sampler and
    of this subtraction) cannot raise it (§6, §12). P[L > W] <= delta'. Vectorised over `noisy_weight`."""
    z = gaussian_tail_z(delta_ptr)
    w = np.asarray(noisy_weight, dtype=np.float64)
    return w - z * sigma_weight * (1.0 + 1e-9) - 1e-9 * np.abs(w)


def mean_noise_scale(plan_entry: Mechanism, r: float, L) -> np.ndarray:
    """The standard deviation the plan gives the mean's noise for radius r and test value L (vectorised in L):
    noise_multiplier * bound_multiple * (r / L)."""
    return plan_entry.noise_multiplier * plan_entry.bound_multiple * (float(r) / np.asarray(L, dtype=np.float64))


def zcdp_nm(rho: float) -> float:
    """Gaussian noise multiplier for rho-zCDP: sigma / sensitivity = 1 / sqrt(2 rho)."""
    return 1.0 / math.sqrt(2.0 * rho)


#: Why a FriendlyCore plan's extra delta (`Plan.extra_delta`) is its PTR delta'.
PTR_ARGUMENT = ("the propose-test-release test passes with L above the true core weight with probability at most "
                "delta' (docs/friendlycore.md Theorem 6.1, §8)")


def ptr_delta(params) -> float:
    """delta' of the release (params: a `MeanParams` or a `KMeansParams`): the probability that its PTR test passes
    with L above the true weight. One test per release (the mean's, or the k-means centres'). A release charges
    (eps, delta_0 + ptr_delta(params)) with eps = epsilon of `plan.event()` at delta_0 (`Plan.guarantee`, docs §8)."""
    return float(params.delta_ptr)


# The checks of the public parameters both releases share (`MeanParams`, `KMeansParams`), in the order each asks
# them: a spec wrong in several ways gets the same first error as before the two were written once.
def check_radius_choice(params, min_weight: float, theorem: str) -> None:
    """Exactly one of a public radius and a radius grid, the radius in range, min_weight >= the release's weight
    sensitivity (its PTR theorem needs max(W, W') >= it), the search's target a fraction."""
    if (params.r is None) == (params.grid is None):
        raise ValueError("give exactly one of a public radius r and a radius grid")
    if params.r is not None:
        check_radius(params.r)
    if params.min_weight < min_weight:
        raise ValueError(f"min_weight must be >= {min_weight:g} ({theorem})")
    if not 0 < params.target <= 1:
        raise ValueError("target must be in (0, 1]")


def check_budget(params) -> None:
    """delta' in (0, 1), and the split of rho: the keys of the release's default, positive fractions summing to 1."""
    gaussian_tail_z(params.delta_ptr)
    s = params.budget_split()
    if any(v <= 0 for v in s.values()) or abs(sum(s.values()) - 1) > 1e-9:
        raise ValueError(f"split fractions must be positive and sum to 1, got {s}")


def checked_split(split: dict | None, default: dict) -> dict:
    """The spec's split of rho, else the release's default; its keys must be the default's."""
    s = dict(split or default)
    if set(s) != set(default):
        raise ValueError(f"split keys must be {sorted(default)}, got {sorted(s)}")
    return s
