"""The refinement inside the located ball (docs/friendlycore.md §13, ours): the clip radius, the count beyond it,
the noisy clipped sum."""

from __future__ import annotations

import numpy as np

from dpalgos.noise import Measure


def distances_to(X: np.ndarray, c: np.ndarray) -> np.ndarray:
    """||x - c|| per row, scaled by the row's largest |coordinate| so that nothing overflows; a row whose
    difference is not finite (|x| near the largest double) gets +inf."""
    V = np.asarray(X, dtype=np.float64) - c
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s = np.max(np.abs(V), axis=1) if V.shape[1] else np.zeros(V.shape[0])
        scaled = np.where(s[:, None] > 0, V / np.where(s > 0, s, 1.0)[:, None], 0.0)
        out = s * np.sqrt(np.einsum("ij,ij->i", scaled, scaled))
    return np.where(np.isfinite(out), out, np.inf)


def clipped_sum(X: np.ndarray, c: np.ndarray, C: float) -> np.ndarray:
    """sum over rows of phi_C(x - c), phi_C(v) = v min(1, C (1 - 1e-9) / ||v||) (Lemma 13.1): every term has
    norm <= C, the 1e-9 covering the rounding of the norm and of the product (§13); a row whose difference is not
    finite contributes 0 (also of norm <= C)."""
    V = np.asarray(X, dtype=np.float64) - c
    norms = distances_to(X, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(norms > 0, np.minimum(1.0, C * (1.0 - 1e-9) / norms), 1.0)
    f[~np.isfinite(norms)] = 0.0
    V[~np.isfinite(norms)] = 0.0
    return (f[:, None] * V).sum(axis=0)


def refine_mean(X, c1: np.ndarray, radii: np.ndarray, threshold: float, divisor: float, measure: Measure):
    """§13: C = the smallest radius of `radii` whose noisy count of rows within it of c1 reaches `threshold` (the
    largest if none; a binary search, one `fc_clip` draw per probe), the noisy count of rows beyond C (`fc_outside`),
    then c1 + (noisy clipped sum) / divisor. Returns (C, [(C_j, noisy count), ...], noisy count beyond C, refined
    mean)."""
    d = distances_to(X, c1)
    lo, hi = 0, radii.size - 1
    probes = []
    while lo < hi:
        mid = (lo + hi) // 2
        # Sensitivity 1: one record is within C_j of c1 or not (c1, C_j: earlier outputs and public values).
        noisy = float(measure("fc_clip", np.array([float(np.count_nonzero(d <= radii[mid]))]))[0])
        probes.append((float(radii[mid]), noisy))
        if noisy >= threshold:
            hi = mid
        else:
            lo = mid + 1
    C = float(radii[lo])
    # Sensitivity 1: one record is beyond C of c1 or not (c1, C: earlier outputs and public values).
    outside = float(measure("fc_outside", np.array([float(np.count_nonzero(~(d <= C)))]))[0])
    # Sensitivity C: every clipped term has norm <= C, one record adds or removes one term (Lemma 13.1).
    S = np.asarray(measure("fc_refine", clipped_sum(X, c1, C), bound=C), dtype=np.float64)
    return C, probes, outside, c1 + S / divisor
