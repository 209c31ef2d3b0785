"""CoinPress baseline (dpalgos/coinpress.py) against ../shared/papers/coinpress-spec.md and its authors' stored
results (../shared/data/coinpress-results/): a fast subset of experiments 1 and 2 (the full curves are run by
`python tests/benchmarks/friendlycore_mean.py --coinpress-check`).

Comparison rule: both sides are 10%-trimmed means of the l2 error over trials (theirs: 100 trials). Our standard
error comes from the winsorised variance (Tukey & McLaughlin), theirs is taken as ours scaled to 100 trials; a
point agrees when |ours - theirs| <= 4 sqrt(se_ours^2 + se_theirs^2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.stats.mstats import winsorize

from dpalgos import coinpress as cp
from dpalgos.noise import Measure, NoiseSource, SeededNoise

D = 50
RHO = 0.5


def _trimmed_with_se(errors, cut=0.1):
    errors = np.asarray(errors)
    tm = stats.trim_mean(errors, cut)
    sw = np.std(np.asarray(winsorize(errors, limits=(cut, cut))), ddof=1)
    return tm, sw / ((1 - 2 * cut) * math.sqrt(errors.size))


def _errors(n, R, t, trials, seed):
    rng = np.random.default_rng(seed)
    plan = cp.coinpress_plan(RHO, t)
    out = []
    for k in range(trials):
        X = rng.normal(size=(n, D))
        est = cp.coinpress_mean(X, R=R, measure=Measure(plan, SeededNoise(seed * 10_000 + k)))
        out.append(np.linalg.norm(est))          # mu = 0
    return out


def _stored(shared_data, name):
    return np.loadtxt(shared_data / "coinpress-results" / name)


@pytest.mark.parametrize("t,index", [(1, 0), (2, 0), (2, 5), (2, 11), (4, 0), (4, 11)])
def test_experiment_1_error_vs_n(shared_data, t, index):
    n = int(round(_stored(shared_data, "ns-1.txt")[index]))
    theirs = _stored(shared_data, f"t{t}-1.txt")[index]
    trials = 200 if n <= 5000 else 100
    ours, se = _trimmed_with_se(_errors(n, 10 * math.sqrt(D), t, trials, seed=index + 10 * t))
    assert abs(ours - theirs) <= 4 * math.hypot(se, se * math.sqrt(trials / 100))


@pytest.mark.parametrize("t,index", [(1, 3), (2, 0), (2, 4), (2, 9), (3, 9), (4, 9), (10, 9)])
def test_experiment_2_error_vs_prior_radius(shared_data, t, index):
    R = _stored(shared_data, "rs-2.txt")[index]
    theirs = _stored(shared_data, f"t{t}-2.txt")[index]
    ours, se = _trimmed_with_se(_errors(1000, R, t, 200, seed=100 + index + 10 * t))
    assert abs(ours - theirs) <= 4 * math.hypot(se, se * math.sqrt(200 / 100))


def test_plan_splits_the_budget_as_the_authors():
    for t, fr in cp.SPLITS.items():
        plan = cp.coinpress_plan(0.5, t)
        rhos = [1 / (2 * m.noise_multiplier ** 2) for m in plan]
        assert rhos == pytest.approx([0.5 * f for f in fr])
        assert all(m.sensitivity is None and m.bound_multiple == 2 and m.relation == cp.REPLACE_ONE for m in plan)


def test_gamma_and_clipping():
    assert cp.gamma(50) == pytest.approx(math.sqrt(50 + 2 * math.sqrt(50 * math.log(100)) + 2 * math.log(100)))
    X = np.array([[0.0, 0.0], [3.0, 4.0], [0.6, 0.8]])
    cp.clip_to_ball(X, np.zeros(2), 1.0)
    np.testing.assert_allclose(X, [[0, 0], [0.6, 0.8], [0.6, 0.8]])


class _Recorder(NoiseSource):
    description, private = "recorder", False

    def __init__(self):
        self.scales = []

    def add(self, mechanism, values, scale):
        self.scales.append(scale)
        return np.asarray(values, dtype=np.float64)

    def step_generator(self):
        raise NotImplementedError


def test_each_step_draws_sigma_two_clip_over_n_and_updates_the_radius():
    rng = np.random.default_rng(0)
    n, d, R = 500, 10, 100.0
    X = rng.normal(size=(n, d))
    X[0] = 1e6                                   # clipped by the first step
    before = X.copy()
    rec = _Recorder()
    plan = cp.coinpress_plan(RHO, 2)
    _, traj = cp.coinpress_mean(X, R=R, measure=Measure(plan, rec), return_trajectory=True)
    g = cp.gamma(d)
    r = R
    for i, (rho_i, scale) in enumerate(zip([RHO / 4, 3 * RHO / 4], rec.scales)):
        clip = min(math.sqrt(r * r + 6 * r + g * g), r + g)
        assert scale == pytest.approx(2 * clip / n / math.sqrt(2 * rho_i))
        r = math.sqrt(1 / n + scale ** 2) * g
        assert traj[i][1] == pytest.approx(r)
    assert np.array_equal(X, before)             # the steps clip a copy, never the caller's data
