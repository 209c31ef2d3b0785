"""Mapping raw attributes into the bounded domain a DP k-means sensitivity bound assumes.

Every attribute is first scaled to [-1, 1] with the PUBLIC bounds of the release spec (reading them off the
data would leak it), then each row is projected onto one of three domains:

  l1_ball  the unit L1 ball, as Lee & Kifer (§4): "normalized to [-1,1] and then projected onto L1-ball".
           A point's L1 norm is at most 1, so a cluster-sum query has L1 sensitivity 1, but the projection
           moves every row outside the ball (all of the box but a fraction 1/d! of its volume) and does
           not invert: centroids found there are not the clusters' means in the box.
  box      [-1, 1]^d itself: the scaling's clipping is the only change, so centroids are in true (scaled)
           units and unscale to original units exactly; the sum query's L1 sensitivity is d.
  l2_ball  the unit L2 ball (radial shrinking of the rows outside it, directions kept); L1 sensitivity
           sqrt(d) (||x||_1 <= sqrt(d) ||x||_2). Wins when the data sit in a round region well inside the
           bounds, where the projection moves few rows and the noise is sqrt(d) times the L1 ball's, not d.

`default_domain` picks one from the dimension alone (public): the L2 ball for d <= 2, the box from d = 3 on.
The L1 ball keeps a fraction 1/d! of the box undistorted, the L2 ball pi/4 at d = 2 but about half at d = 3
and a third at d = 4, the box all of it at d times the L1 ball's noise. Measured with the released method
(DP k-means, T = 5, the first round seeding, refinement where expected to help), WCSS on the [-1, 1]-scaled data
over k-means++'s, mean of 10 runs at epsilon = 0.05 / 0.1 / 0.25 / 0.5 / 1
(`tests/benchmarks/kmeans_peers.py --domain D`; diffprivlib 1.71-1.16 on Gowalla-like, 1.97-1.36 on Adult):
    S1 (d = 2)            l1_ball 7.25 6.40 5.13 4.68 3.62   box 5.01 3.76 2.35 2.14 1.34
                          l2_ball 3.76 3.23 2.30 2.10 1.56
    Gowalla-like (d = 2)  l1_ball 1.30 1.28 1.32 1.23 1.21   box 1.24 1.17 1.10 1.07 1.05
                          l2_ball 1.21 1.21 1.11 1.12 1.10
    UCI Adult (d = 6)     box 1.48 1.34 1.25 1.18 1.19 (a single centroid: 2.06); l2_ball 4.30 4.13 4.10 3.88 3.90;
                          l1_ball 8.49 8.48 8.30 8.26 8.25 (both worse than a single centroid)
At d = 2 the box is lower at epsilon = 1 on S1 (by 14 %) and from 0.1 on the Gowalla-like set (by up to 6 %), the
L2 ball at epsilon <= 0.1 on S1 (by 25 and 14 %): no one domain wins at d = 2, and the L2 ball, which avoids the
worst of the box's low-epsilon noise, stays the default there.
The L1 ball stays available for Lee & Kifer's setting (and where the rows are known to be sparse).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Domain = Literal["l1_ball", "box", "l2_ball"]
DOMAINS: tuple[str, ...] = ("l1_ball", "box", "l2_ball")
#: The numba code of each domain (`inside_code`).
DOMAIN_CODES = {name: i for i, name in enumerate(DOMAINS)}
#: From this dimension on the box is the default domain, below it the L2 ball (see the module docstring).
BOX_FROM_DIMENSION = 3


def check_bounds(lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """Validate public per-attribute bounds; returns them as float64 arrays of shape (d,)."""
    lower = np.asarray(lower, dtype=np.float64).reshape(-1)
    upper = np.asarray(upper, dtype=np.float64).reshape(-1)
    if lower.shape != upper.shape:
        raise ValueError(f"bounds have different lengths: {lower.size} lower, {upper.size} upper")
    if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))):
        raise ValueError("bounds must be finite numbers")
    bad = np.flatnonzero(lower >= upper)
    if bad.size:
        raise ValueError(f"bounds need lower < upper; violated for attribute index {bad.tolist()}")
    return lower, upper


def scale_to_unit_box(X, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """Min-max scale each attribute from [lower, upper] to [-1, 1], clipping values outside the bounds.

    Parameters
    ----------
    X : array (n, d), raw attribute values.
    lower, upper : arrays (d,), public bounds.

    Returns
    -------
    Y : array (n, d) float64 in [-1, 1].
    clipped : int64 array (d,), how many values of each attribute fell outside its bounds (raw-derived:
        an internal diagnostic, never part of a release).
    """
    lower, upper = check_bounds(lower, upper)
    X = np.asarray(X, dtype=np.float64)
    clipped = ((X < lower) | (X > upper)).sum(axis=0).astype(np.int64)
    Y = 2.0 * (np.clip(X, lower, upper) - lower) / (upper - lower) - 1.0
    return Y, clipped


def unscale_from_unit_box(Y, lower, upper) -> np.ndarray:
    """Inverse of the min-max scaling (not of the clipping nor of the L1 projection)."""
    lower, upper = check_bounds(lower, upper)
    return lower + (np.asarray(Y, dtype=np.float64) + 1.0) * (upper - lower) / 2.0


def project_l1_ball(X, radius: float = 1.0) -> np.ndarray:
    """Exact Euclidean projection of every row of X onto {x : ||x||_1 <= radius}.

    Duchi, Shalev-Shwartz, Singer & Chandra (ICML 2008), Figure 1, vectorised over rows: rows already
    inside the ball are returned unchanged; for the others, with u the absolute values sorted in
    decreasing order, rho = max{j : u_j - (sum_{r<=j} u_r - radius)/j > 0} and
    theta = (sum_{r<=rho} u_r - radius)/rho, the projection is sign(x) * max(|x| - theta, 0).
    Every row is projected and the inside ones then kept: the work does not depend on how many rows are
    outside (projecting only those made one point outside cost 1.6 ms more per 200,000 rows, in a stage
    whose running time is published).

    X : array (n, d) or (d,). Returns an array of the same shape, float64.
    """
    if radius <= 0:
        raise ValueError(f"radius must be positive, got {radius}")
    X = np.asarray(X, dtype=np.float64)
    single = X.ndim == 1
    X2 = X.reshape(1, -1) if single else X
    a = np.abs(X2)
    outside = a.sum(axis=1) > radius
    u = -np.sort(-a, axis=1)
    css = np.cumsum(u, axis=1) - radius
    j = np.arange(1, a.shape[1] + 1)
    # The condition holds for a prefix j = 1..rho, so rho is the count of True (at least 1: radius > 0).
    rho = np.count_nonzero(u - css / j > 0, axis=1)
    theta = css[np.arange(a.shape[0]), rho - 1] / rho
    out = np.where(outside[:, None], np.sign(X2) * np.maximum(a - theta[:, None], 0.0), X2)
    return out.reshape(X.shape)


def to_unit_l1_ball(X, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """Scale to [-1, 1] with public bounds, then project onto the unit L1 ball.

    Returns (points (n, d) with ||x||_1 <= 1, clipped counts (d,)).
    """
    Y, clipped = scale_to_unit_box(X, lower, upper)
    return project_l1_ball(Y), clipped


def default_domain(d: int) -> str:
    """The domain chosen from the dimension alone, a public parameter (module docstring)."""
    return "box" if d >= BOX_FROM_DIMENSION else "l2_ball"


def check_domain(name: str) -> str:
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}: use one of {', '.join(DOMAINS)}")
    return name


def sum_sensitivity(name: str, d: int) -> float:
    """The largest L1 norm of a point of the domain: the L1 sensitivity of a cluster-sum query under adding
    or removing one point. l1_ball: 1 by definition; box: d, at a vertex (+-1, ..., +-1); l2_ball: sqrt(d),
    by Cauchy-Schwarz ||x||_1 <= sqrt(d) ||x||_2 <= sqrt(d), reached at (+-1, ..., +-1) / sqrt(d)."""
    return {"l1_ball": 1.0, "box": float(d), "l2_ball": float(np.sqrt(d))}[check_domain(name)]


def project(X, name: str) -> np.ndarray:
    """Euclidean projection of every row of X onto the domain."""
    X = np.asarray(X, dtype=np.float64)
    if check_domain(name) == "l1_ball":
        return project_l1_ball(X)
    if name == "box":
        return np.clip(X, -1.0, 1.0)
    norms = np.linalg.norm(X, axis=-1, keepdims=True)
    return X / np.maximum(norms, 1.0)


def gauge(X, name: str) -> np.ndarray:
    """The domain's norm of every row (<= 1 exactly inside): L1, max-abs or L2."""
    X = np.asarray(X, dtype=np.float64)
    order = {"l1_ball": 1, "box": np.inf, "l2_ball": 2}[check_domain(name)]
    return np.linalg.norm(X, ord=order, axis=-1)


def inradius(name: str, d: int) -> float:
    """Radius of the largest Euclidean ball inside the domain."""
    return 1.0 / np.sqrt(d) if check_domain(name) == "l1_ball" else 1.0


def boundary_distance(X, name: str) -> np.ndarray:
    """Euclidean distance from every row (inside the domain) to the domain's boundary: (1 - ||x||_1) / sqrt(d)
    for the L1 ball (its facets have normals (+-1, ..., +-1) / sqrt(d)), 1 - ||x||_inf for the box,
    1 - ||x||_2 for the L2 ball."""
    X = np.asarray(X, dtype=np.float64)
    g = 1.0 - gauge(X, name)
    return g / np.sqrt(X.shape[-1]) if name == "l1_ball" else g


def uniform(n: int, d: int, name: str, rng: np.random.Generator) -> np.ndarray:
    """n points drawn uniformly from the domain."""
    if check_domain(name) == "box":
        return rng.uniform(-1.0, 1.0, size=(n, d))
    if name == "l2_ball":
        g = rng.normal(size=(n, d))
        return g / np.linalg.norm(g, axis=1, keepdims=True) * rng.random((n, 1)) ** (1.0 / d)
    # The first d coordinates of a uniform point of the (d+1)-simplex, with random signs, are uniform in
    # the d-dimensional L1 ball.
    e = rng.exponential(size=(n, d + 1))
    return (e[:, :d] / e.sum(axis=1, keepdims=True)) * rng.choice([-1.0, 1.0], size=(n, d))


def normalise(X, lower, upper, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Scale to [-1, 1] with public bounds, then project onto the domain: (points (n, d), clipped counts (d,))."""
    Y, clipped = scale_to_unit_box(X, lower, upper)
    return project(Y, name), clipped
