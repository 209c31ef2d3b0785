"""CoinPress mean estimation (Biswas, Dong, Kamath & Ullman, "CoinPress: Practical Private Mean and Covariance
Estimation", NeurIPS 2020): the averaging baseline of FriendlyCore, implemented from the description of the
authors' code in ../shared/papers/coinpress-spec.md (their repository twistedcubic/coin-press, algos.py).

One step with budget rho_i (zCDP), centre c, radius r, data X (n x d), beta = 0.01:
    gamma = sqrt(d + 2 sqrt(d ln(1/beta)) + 2 ln(1/beta))           (a Gaussian norm tail bound)
    clip  = min(sqrt(r^2 + 6r + gamma^2), r + gamma)
    every point farther than clip from c is moved onto the sphere of radius clip around c (in place: later steps
    see the clipped data, as in the authors' code; `coinpress_mean` works on a copy of X)
    c <- mean(X) + N(0, sigma^2 I),  sigma = (2 clip / n) / sqrt(2 rho_i)
    r <- sqrt(1/n + sigma^2) gamma
t steps with budgets rho_1..rho_t (zCDP composes additively); prior c = 0 (or a public centre), r = R.

Privacy model (theirs): n is public and neighbours REPLACE one record; the mean of points inside a ball of
radius clip then moves by at most 2 clip / n (both the old and the new point lie in the ball). Under add/remove
with an unknown n this sensitivity does not hold; the baseline is used as its authors define it.
"""

from __future__ import annotations

import math

import numpy as np

from dpalgos.noise import Measure
from dpalgos.plan import Mechanism, Plan

#: The authors' budget splits (fractions of rho) for t steps.
SPLITS = {1: (1.0,), 2: (0.25, 0.75), 3: (0.125, 0.125, 0.75), 4: (1 / 12, 1 / 12, 1 / 12, 0.75),
          10: (1 / 36,) * 9 + (0.75,)}
REPLACE_ONE = "replace one record (n public)"


def gamma(d: int, beta: float = 0.01) -> float:
    """sqrt(d + 2 sqrt(d ln(1/beta)) + 2 ln(1/beta))."""
    lb = math.log(1.0 / beta)
    return math.sqrt(d + 2.0 * math.sqrt(d * lb) + 2.0 * lb)


def budget_split(rho: float, t: int, split=None) -> tuple[float, ...]:
    fr = tuple(split) if split is not None else SPLITS.get(t)
    if fr is None or len(fr) != t:
        raise ValueError(f"no budget split for t = {t}; give one of length t")
    if abs(sum(fr) - 1.0) > 1e-9 or min(fr) <= 0:
        raise ValueError("split fractions must be positive and sum to 1")
    return tuple(rho * f for f in fr)


def coinpress_plan(rho: float, t: int = 2, split=None) -> Plan:
    """One Gaussian entry per step: sensitivity 2 * clip / n, with clip / n passed as the bound of the draw."""
    rhos = budget_split(rho, t, split)
    return Plan(tuple(
        Mechanism(name=f"coinpress_step_{i + 1}", query=f"mean of the clipped data, CoinPress step {i + 1} of {t}",
                  distribution="gaussian", sensitivity=None, bound_multiple=2.0,
                  noise_multiplier=1.0 / math.sqrt(2.0 * rho_i), relation=REPLACE_ONE,
                  argument="all points lie in the ball of radius clip around the current centre after clipping "
                           "(clip and the centre are public or earlier noisy outputs); replacing one of the n "
                           "points moves their mean by at most 2 clip / n; C = clip / n")
        for i, rho_i in enumerate(rhos)))


def clip_to_ball(X: np.ndarray, c: np.ndarray, radius: float) -> None:
    """Move every row of X farther than `radius` from c onto the sphere of that radius around c (in place)."""
    diff = X - c
    norms = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    far = norms > radius
    if np.any(far):
        X[far] = c + diff[far] * (radius / norms[far])[:, None]


def coinpress_mean(X, *, R: float, measure: Measure, t: int | None = None, c0=None, beta: float = 0.01,
                   return_trajectory: bool = False):
    """CoinPress mean of the rows of X with prior ball (c0 or 0, R); t defaults to the plan's number of steps.

    Returns the last centre (d,), or (centre, [(c_i, r_i), ...]) with return_trajectory.
    """
    Xc = np.array(X, dtype=np.float64, copy=True)  # the steps clip this copy in place (the authors' behaviour)
    n, d = Xc.shape
    steps = [m.name for m in measure.plan if m.name.startswith("coinpress_step_")]
    t = len(steps) if t is None else t
    if t != len(steps):
        raise ValueError(f"the plan has {len(steps)} steps, not {t}")
    c = np.zeros(d) if c0 is None else np.asarray(c0, dtype=np.float64).copy()
    r = float(R)
    g = gamma(d, beta)
    traj = []
    for i in range(t):
        clip = min(math.sqrt(r * r + 6.0 * r + g * g), r + g)
        clip_to_ball(Xc, c, clip)
        # Sensitivity 2 * clip / n under replacement (n public): every point is within clip of c.
        plan_entry = measure.plan[steps[i]]
        c = np.asarray(measure(steps[i], Xc.mean(axis=0), bound=clip / n), dtype=np.float64)
        sigma = plan_entry.scale_for(clip / n)
        r = math.sqrt(1.0 / n + sigma * sigma) * g
        traj.append((c.copy(), r))
    return (c, traj) if return_trajectory else c
