"""The public radius grid and the private choice of a radius on it by a binary search (docs/friendlycore.md §7)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpalgos.friendlycore.constants import check_radius
from dpalgos.noise import Measure


@dataclass(frozen=True)
class RadiusGrid:
    """Public geometric grid r_j = r_min * ratio^j, j = 0..J-1, J = floor(log(r_max/r_min)/log(ratio)) + 1."""
    r_min: float
    r_max: float
    ratio: float = 2.0 ** 0.125

    def __post_init__(self):
        check_radius(self.r_min, "r_min")
        check_radius(self.r_max, "r_max")
        if not (self.r_min <= self.r_max and self.ratio > 1):
            raise ValueError("need r_min <= r_max and ratio > 1")

    @property
    def radii(self) -> np.ndarray:
        J = math.floor(math.log(self.r_max / self.r_min) / math.log(self.ratio) + 1e-9) + 1
        return self.r_min * self.ratio ** np.arange(J)

    @property
    def probes(self) -> int:
        """Number of binary-search probes: ceil(log2 J) (0 for a single radius)."""
        J = self.radii.size
        return math.ceil(math.log2(J)) if J > 1 else 0


#: A binary search's threshold stays this many probe standard deviations below the noisy count: a statistic
#: that saturates at n (W(r), the count within a radius) then passes its probes at large radii, whatever the
#: target. At n = 200 and a target of 0.9 n, probes of W = n failed 1 in 4 times and sent r to 10^3..10^5; with a
#: margin of 3 a first probe failed at 2.7 deviations in 1 of 10 runs at n = 800 (r = 1011 instead of 16, the
#: error 7x); at 4 a probe fails with probability 3e-5.
SEARCH_MARGIN = 4.0


def search_threshold(target: float, noisy_count: float, sigma_probe: float) -> float:
    """min(target * n~, n~ - SEARCH_MARGIN * sigma_probe): a function of a noisy count and public values."""
    return min(target * noisy_count, noisy_count - SEARCH_MARGIN * sigma_probe)


def binary_search_radius(weight_at: Callable[[float], float], grid: RadiusGrid, threshold: float,
                         measure: Measure, name: str) -> tuple[float, list[tuple[float, float]]]:
    """Smallest r_j with noisy W(r_j) >= threshold, assuming W(r) nondecreasing (it is: a larger r has more friends);
    r_max if none. Each probe is one draw of the plan entry `name`. Returns (r, [(r_j, noisy W_j), ...])."""
    radii = grid.radii
    lo, hi = 0, radii.size - 1
    probes: list[tuple[float, float]] = []
    while lo < hi:
        mid = (lo + hi) // 2
        noisy = float(measure(name, np.array([weight_at(float(radii[mid]))]))[0])
        probes.append((float(radii[mid]), noisy))
        if noisy >= threshold:
            hi = mid
        else:
            lo = mid + 1
    return float(radii[lo]), probes
