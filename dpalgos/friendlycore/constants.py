"""The constants proven in docs/friendlycore.md: sensitivities, the tuple separation, the largest public radius
and its check."""

from __future__ import annotations

import math

#: L2 sensitivity of W under add/remove (Corollary 3.2: |dW| <= (2n+1)/(n+1) < 2).
WEIGHT_SENSITIVITY = 2.0
#: ||M(D') - M(D)|| <= MEAN_SENSITIVITY_MULTIPLE * r / max(W, W') under add/remove (Theorem 5.1).
MEAN_SENSITIVITY_MULTIPLE = 4.0
#: Sensitivity of the count n (add/remove).
COUNT_SENSITIVITY = 1.0
#: Under replacement of one element (k-means tuples, m even): |dW| < 3 and ||dM|| < 8 r / max(W, W'') (Thm 9.3).
TUPLE_WEIGHT_SENSITIVITY = 3.0
TUPLE_MEAN_SENSITIVITY_MULTIPLE = 8.0
#: Tuples must be more than SEPARATION_FACTOR * r separated for the tuple predicate (Lemma 9.5 needs > 6r).
SEPARATION_FACTOR = 6.0
#: Thresholds are shrunk by this factor so that a floating-point "yes" implies the exact inequality (§12).
SHRINK = 1.0 - 1e-9
#: The largest public radius: every threshold the predicates compare with, (SEPARATION_FACTOR r)^2 (1 + 1e-9) the
#: largest, must be a finite double. Above about 1.3e154 r^2 overflows to inf and `inf <= inf` made a record at
#: 1e300 everyone's friend (an attacker's review released a mean of 5e296 with it, 9e152 without it).
MAX_RADIUS = 1e150


def check_radius(r: float, what: str = "r") -> float:
    """A public radius whose thresholds are finite: 0 < r <= MAX_RADIUS (a ValueError otherwise)."""
    if not (math.isfinite(r) and 0 < r <= MAX_RADIUS):
        raise ValueError(f"{what} must be in (0, {MAX_RADIUS:g}] (its square, times the predicates' factors, must "
                         f"be a finite number)")
    return float(r)

PREDICATES = ("distance", "grid")
