"""The accuracy planner's shared steps for counts over ordered bins (histogram, matrix mechanism): the expected
error of a released bin, of range sums of several lengths and of other linear queries, from the plan alone.

Where the postprocessing is linear (least squares, or none) the error's standard deviation is exact: the noise
of every measurement is independent with the entry's standard deviation s, so a query's estimate
q . (M y) = (M^T q) . y has standard deviation s ||M^T q||. Where it is not (ADMM), the release's own
postprocessing is run on simulated measurements of a PUBLIC flat histogram whose counts are FAR noise standard
deviations above zero, so that non-negativity never binds: the error then does not depend on the counts. Near
zero the released counts are clipped and their error is smaller. Range positions are drawn uniformly with a
public seed; a query family's figure is the root mean square, over its queries, of each query's standard
deviation.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import NormalDist

import numpy as np

from dpalgos.intervals import NoiseLaw
from tasks.kinds.uncertainty import Predicted

#: Seconds of simulated postprocessing the planner spends per release kind and epsilon (between MIN_RUNS and
#: MAX_RUNS runs).
PLANNER_SECONDS = 3.0
MIN_RUNS, MAX_RUNS = 10, 300
#: The public flat truth: every count this many noise standard deviations above zero.
FAR = 30.0
FAR_FROM_ZERO = "counts far from zero (non-negativity never binds; near zero the error is smaller)"


def runs_for(seconds_per_run: float) -> int:
    return int(np.clip(PLANNER_SECONDS / max(seconds_per_run, 1e-9), MIN_RUNS, MAX_RUNS))


def range_lengths(bins: int, branching: int = 2) -> list[int]:
    """1, then the powers of the branching factor below the number of bins, and half the bins."""
    lengths, L = [1], branching
    while L < bins:
        lengths.append(L)
        L *= branching
    return sorted(set(lengths + ([bins // 2] if bins >= 4 else [])))


def range_starts(bins: int, length: int) -> np.ndarray:
    """Uniform random starts (public seed 0): 100 for up to 2^15 bins, fewer (at least 10) above."""
    count = int(np.clip(2 ** 22 // bins, 10, 100))
    return np.random.default_rng(0).integers(0, bins - length + 1, count)


class RangeFamily:
    """Range sums of one length at public random positions, as a query family."""

    def __init__(self, bins: int, length: int):
        self.length, self.starts = length, range_starts(bins, length)
        self.name = "released bin count" if length == 1 else f"range sum of {length} bins (random position)"

    def errors(self, cumulative: np.ndarray) -> np.ndarray:
        """The family's errors from the cumulative sums (with a leading 0) of one run's bin errors."""
        return cumulative[self.starts + self.length] - cumulative[self.starts]

    def weights(self, bins: int):
        for s in self.starts:
            w = np.zeros(bins)
            w[s:s + self.length] = 1.0
            yield w


def range_families(bins: int, branching: int = 2) -> list[RangeFamily]:
    return [RangeFamily(bins, L) for L in range_lengths(bins, branching)]


def simulated_rows(estimate: Callable[[np.ndarray], np.ndarray], measure: Callable[[np.ndarray], np.ndarray],
                   bins: int, law: NoiseLaw, runs: int, families: list[RangeFamily], confidence: float,
                   workload: np.ndarray | None = None) -> list[Predicted]:
    """Each range family's (and the workload's) error of `estimate` (noisy measurements -> bins) on the flat truth,
    whose noiseless measurements are `measure(truth)`, noise of `law` from a public generator (seed 0)."""
    rng = np.random.default_rng(0)
    truth = np.full(bins, FAR * law.std())
    exact = measure(truth)
    per_family = [[] for _ in families] + ([[]] if workload is not None else [])
    for _ in range(runs):
        err = estimate(exact + law.sample(rng, exact.shape)) - truth
        cumulative = np.concatenate([[0.0], np.cumsum(err)])
        for errors, family in zip(per_family, families):
            errors.append(family.errors(cumulative))
        if workload is not None:
            per_family[-1].append(workload @ err)
    basis = f"simulated: {runs} runs of the release's postprocessing on a public flat histogram"
    names = [f.name for f in families] + (["workload query (RMS over the workload)"] if workload is not None else [])
    return [Predicted(name, _rms_std(np.array(e)), float(np.quantile(np.abs(e), confidence)), basis, FAR_FROM_ZERO)
            for name, e in zip(names, per_family)]


def _rms_std(errors: np.ndarray) -> float:
    """(runs, queries) -> the root mean square over queries of each one's standard deviation over runs."""
    return float(np.sqrt(np.mean(errors.var(axis=0, ddof=1))))


def linear_rows(transform: Callable[[np.ndarray], np.ndarray], bins: int, law: NoiseLaw, families: list[RangeFamily],
                confidence: float, what: str, workload: np.ndarray | None = None) -> list[Predicted]:
    """Exact standard deviations of a linear estimator: `transform(q)` = M^T q for a query q over the bins; the
    interval by the normal approximation of a sum of many independent noises."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    groups = [(f.name, f.weights(bins)) for f in families]
    if workload is not None:
        groups.append(("workload query (RMS over the workload)", iter(workload)))
    rows = []
    for name, weights in groups:
        std = law.std() * float(np.sqrt(np.mean([np.sum(transform(w) ** 2) for w in weights])))
        rows.append(Predicted(name, std, z * std, f"exact ({what}); interval by the normal approximation",
                              FAR_FROM_ZERO))
    return rows
