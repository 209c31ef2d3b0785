"""Simulation noise for the BASELINES of the experiments and of the internal evaluations (LM, Privelet, EFPA,
MWEM, independent items): numpy's floating-point samplers from a caller's generator, so that a paper figure
is reproducible from a seed. Never used for a published value: releases draw every noise through a plan
entry and `dpalgos.noise` (OpenDP's exact samplers). The caller states the sensitivity.
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

