"""Mapping raw attributes into the unit L1 ball, the domain every DP k-means sensitivity bound assumes.

Lee & Kifer (§4): "the domain of each attribute is normalized to [-1,1] and then projected onto L1-ball".
The bounds of the scaling are PUBLIC inputs of the release spec: reading them off the data would leak it.
"""

from __future__ import annotations

import numpy as np


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

    X : array (n, d) or (d,). Returns an array of the same shape, float64.
    """
    if radius <= 0:
        raise ValueError(f"radius must be positive, got {radius}")
    X = np.asarray(X, dtype=np.float64)
    single = X.ndim == 1
    X2 = X.reshape(1, -1) if single else X
    out = X2.copy()
    absx = np.abs(X2)
    outside = absx.sum(axis=1) > radius
    if np.any(outside):
        a = absx[outside]
        u = -np.sort(-a, axis=1)
        css = np.cumsum(u, axis=1) - radius
        j = np.arange(1, a.shape[1] + 1)
        # The condition holds for a prefix j = 1..rho, so rho is the count of True.
        rho = np.count_nonzero(u - css / j > 0, axis=1)
        theta = css[np.arange(a.shape[0]), rho - 1] / rho
        out[outside] = np.sign(X2[outside]) * np.maximum(a - theta[:, None], 0.0)
    return out.reshape(X.shape)


def to_unit_l1_ball(X, lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """Scale to [-1, 1] with public bounds, then project onto the unit L1 ball.

    Returns (points (n, d) with ||x||_1 <= 1, clipped counts (d,)).
    """
    Y, clipped = scale_to_unit_box(X, lower, upper)
    return project_l1_ball(Y), clipped
