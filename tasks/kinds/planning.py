"""The accuracy planner's shared steps for counts over ordered bins (histogram, matrix mechanism): the expected
error of a released bin and of range sums of several lengths, from the plan alone.

Where the postprocessing is linear (least squares, or none) the error's standard deviation is exact: the noise
of every measurement is independent with the entry's standard deviation s, so a range's estimate
r . (M y) = (M^T r) . y has standard deviation s ||M^T r||. Where it is not (ADMM), the release's own
postprocessing is run on simulated measurements of a PUBLIC flat histogram whose counts are FAR noise standard
deviations above zero, so that non-negativity never binds: the error then does not depend on the counts. Near
zero the released counts are clipped and their error is smaller. Range positions are drawn uniformly with a
public seed; a range's figure is the root mean square over positions of the standard deviation at each.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dpalgos.intervals import NoiseLaw
from tasks.kinds.uncertainty import Predicted

#: Seconds of simulated postprocessing the planner spends per release kind and epsilon (between MIN_RUNS and
#: MAX_RUNS runs).
PLANNER_SECONDS = 3.0
MIN_RUNS, MAX_RUNS = 30, 300
#: The public flat truth: every count this many noise standard deviations above zero.
FAR = 30.0
#: Random positions per range length (public seed 0).
POSITIONS = 100


def runs_for(seconds_per_run: float) -> int:
    return int(np.clip(PLANNER_SECONDS / max(seconds_per_run, 1e-9), MIN_RUNS, MAX_RUNS))


def range_lengths(bins: int, branching: int = 2) -> list[int]:
    """1, then the powers of the branching factor below the number of bins, and half the bins."""
    lengths, L = [1], branching
    while L < bins:
        lengths.append(L)
        L *= branching
    return sorted(set(lengths + ([bins // 2] if bins >= 4 else [])))


def positions(bins: int, length: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, bins - length + 1, POSITIONS)


def simulated_errors(estimate: Callable[[np.ndarray], np.ndarray], measure: Callable[[np.ndarray], np.ndarray],
                     bins: int, law: NoiseLaw, runs: int) -> np.ndarray:
    """(runs, bins) errors of `estimate` (noisy measurements -> bins) on the flat truth, whose noiseless
    measurements are `measure(truth)`, with noise of `law` from a public generator (seed 0)."""
    rng = np.random.default_rng(0)
    truth = np.full(bins, FAR * law.std())
    exact = measure(truth)
    return np.stack([estimate(exact + law.sample(rng, exact.shape)) - truth for _ in range(runs)])


def range_rows(errors: np.ndarray, lengths: list[int], confidence: float) -> list[Predicted]:
    runs, bins = errors.shape
    cumulative = np.concatenate([np.zeros((runs, 1)), np.cumsum(errors, axis=1)], axis=1)
    rows = []
    for L in lengths:
        start = positions(bins, L)
        err = cumulative[:, start + L] - cumulative[:, start]
        std = float(np.sqrt(np.mean(err.var(axis=0, ddof=1))))
        rows.append(Predicted(_name(L), std, float(np.quantile(np.abs(err), confidence)),
                              f"simulated: {runs} runs of the release's postprocessing on a public flat histogram",
                              _FAR_FROM_ZERO))
    return rows


def linear_range_rows(transform: Callable[[np.ndarray], np.ndarray], bins: int, lengths: list[int],
                      law: NoiseLaw, confidence: float, what: str) -> list[Predicted]:
    """Exact standard deviations of a linear estimator, `transform(r)` = M^T r for a range indicator r over the
    bins; the interval by the normal approximation of a sum of many independent noises."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    rows = []
    for L in lengths:
        variances = []
        for s in positions(bins, L):
            r = np.zeros(bins)
            r[s:s + L] = 1.0
            variances.append(float(np.sum(transform(r) ** 2)))
        std = law.std() * float(np.sqrt(np.mean(variances)))
        rows.append(Predicted(_name(L), std, z * std, f"exact ({what}); interval by the normal approximation",
                              _FAR_FROM_ZERO))
    return rows


_FAR_FROM_ZERO = "counts far from zero (non-negativity never binds; near zero the error is smaller)"


def _name(length: int) -> str:
    return "released bin count" if length == 1 else f"range sum of {length} bins (random position)"
