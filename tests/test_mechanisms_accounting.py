import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from dpalgos import accounting, mechanisms


def test_laplace_noise_has_scale_sensitivity_over_epsilon():
    rng = np.random.default_rng(0)
    noisy = mechanisms.laplace_mechanism(np.zeros(200_000), sensitivity=2.0, epsilon=0.5, rng=rng)
    assert stats.kstest(noisy, stats.laplace(scale=4.0).cdf).pvalue > 1e-3


def test_gaussian_noise_has_std_multiplier_times_sensitivity():
    rng = np.random.default_rng(0)
    noisy = mechanisms.gaussian_mechanism(np.full(200_000, 3.0), sensitivity=2.0, noise_multiplier=1.5, rng=rng)
    assert stats.kstest(noisy, stats.norm(loc=3.0, scale=3.0).cdf).pvalue > 1e-3


@pytest.mark.parametrize("eps", [0.0, -1.0, math.inf, math.nan])
def test_mechanisms_refuse_bad_epsilon(eps):
    with pytest.raises(ValueError):
        mechanisms.laplace_mechanism(1.0, sensitivity=1.0, epsilon=eps, rng=np.random.default_rng())


def test_pure_laplace_events_compose_to_the_sum_of_epsilons():
    events = [accounting.laplace_event(sensitivity=1.0, epsilon=0.1)] * 10
    g = accounting.release_guarantee(accounting.compose_events(events), delta=1e-6)
    assert g.epsilon == pytest.approx(1.0, rel=1e-12) and g.delta == 0.0
    # At delta > 0 the PLD accountant may prove slightly less, never more than basic composition.
    best = accounting.epsilon_at(accounting.compose_events(events), 1e-6)
    assert best.epsilon <= 1.0 + 1e-12


def test_gaussian_composition_matches_dp_accounting():
    event = dp_accounting.SelfComposedDpEvent(accounting.gaussian_event(noise_multiplier=5.0), 20)
    g = accounting.epsilon_at(event, 1e-5)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(event)
    assert 0 < g.epsilon <= rdp.get_epsilon(1e-5) + 1e-12
    assert g.delta == 1e-5


def test_events_round_trip_through_json():
    event = dp_accounting.ComposedDpEvent([
        accounting.laplace_event(sensitivity=1.0, epsilon=0.3),
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 7),
        dp_accounting.ZCDpEvent(0.1)])
    assert accounting.event_from_json(accounting.event_to_json(event)) == event
