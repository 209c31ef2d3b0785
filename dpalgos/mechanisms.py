"""Additive noise mechanisms. The caller states the sensitivity; nothing here looks at data.

Randomness comes from a `numpy.random.Generator` passed in: production code passes one seeded from OS
entropy (`np.random.default_rng()`), tests may pass a seeded one. Accounting is not done here (see
`dpalgos.accounting`): these functions only draw noise.

Note: these are floating-point samplers (numpy's inverse-CDF Laplace, Box-Muller-type normal). Mironov
(CCS 2012) shows textbook floating-point Laplace can leak through the low-order bits of the output; the
published values here are further processed (divided, projected, rounded) but no snapping is applied.
"""

from __future__ import annotations

import numpy as np


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


def laplace_mechanism(value, *, sensitivity: float, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """value + Lap(sensitivity / epsilon), coordinate-wise: epsilon-DP when the L1 sensitivity of value
    (over neighbouring datasets) is at most `sensitivity`."""
    scale = _check_positive("sensitivity", sensitivity) / _check_positive("epsilon", epsilon)
    value = np.asarray(value, dtype=np.float64)
    return value + rng.laplace(0.0, scale, size=value.shape)


def gaussian_mechanism(value, *, sensitivity: float, noise_multiplier: float,
                       rng: np.random.Generator) -> np.ndarray:
    """value + N(0, (noise_multiplier * sensitivity)^2), coordinate-wise, for an L2 sensitivity
    `sensitivity`. Its privacy is `dp_accounting.GaussianDpEvent(noise_multiplier)`."""
    std = _check_positive("sensitivity", sensitivity) * _check_positive("noise_multiplier", noise_multiplier)
    value = np.asarray(value, dtype=np.float64)
    return value + rng.normal(0.0, std, size=value.shape)
