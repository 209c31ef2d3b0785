"""Plans, noise sources and accounting: the privacy facts stated once, drawn exactly, composed correctly."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from scipy import stats

from dpalgos import accounting
from dpalgos.noise import ExactNoise, Measure, PlanViolation, SeededNoise
from dpalgos.plan import Mechanism, Plan

#: The samplers draw from OS randomness, so a KS test fails at its level by chance: 1e-6, not 1e-3, keeps the suite
#: from failing one run in a few hundred, while the wrong family at the same variance (p ~ 1e-77 at n = 20,000) and
#: a wrong scale (also caught by the moment checks) still fail.
KS_LEVEL = 1e-6


def _mech(distribution="laplace", integer=False, sensitivity=2.0, multiplier=2.0, **kw):
    return Mechanism("m", "a test query", distribution, sensitivity, "by construction", multiplier,
                     integer=integer, **kw)


@pytest.mark.parametrize("integer", [True, False])
def test_exact_laplace_has_the_plan_scale(integer):
    m = _mech(integer=integer)  # scale 4
    noisy = Measure(Plan((m,)), ExactNoise())("m", np.zeros(20_000))
    if integer:
        assert np.array_equal(noisy, np.rint(noisy))
        # discrete Laplace: P(k) ~ exp(-|k| / 4); E|k| = 2 e^(-1/4) / (1 - e^(-1/2))
        assert np.mean(np.abs(noisy)) == pytest.approx(2 * math.exp(-0.25) / (1 - math.exp(-0.5)), rel=0.04)
    else:
        assert stats.kstest(noisy, stats.laplace(scale=4.0).cdf).pvalue > KS_LEVEL


@pytest.mark.parametrize("integer", [True, False])
def test_exact_gaussian_has_the_plan_scale(integer):
    m = _mech("gaussian", integer=integer, sensitivity=3.0, multiplier=5.0)  # std 15
    noisy = Measure(Plan((m,)), ExactNoise())("m", np.full(20_000, 7.0))
    assert np.array_equal(noisy, np.rint(noisy)) == integer
    assert stats.kstest(noisy - 7.0, stats.norm(scale=15.0).cdf).pvalue > KS_LEVEL or integer
    assert np.std(noisy) == pytest.approx(15.0, rel=0.03)


def test_exact_noise_comes_from_the_os_and_seeded_noise_from_the_seed():
    plan = Plan((_mech(repetitions=2),))
    a, b = Measure(plan, ExactNoise()), Measure(plan, ExactNoise())
    assert not np.array_equal(a("m", np.zeros(50)), b("m", np.zeros(50)))
    s1, s2 = Measure(plan, SeededNoise(3)), Measure(plan, SeededNoise(3))
    assert np.array_equal(s1("m", np.zeros(50)), s2("m", np.zeros(50)))
    assert not SeededNoise(3).private and ExactNoise().private


def test_measure_refuses_noise_the_plan_does_not_describe():
    measure = Measure(Plan((_mech(repetitions=2),)), SeededNoise(0))
    measure("m", np.zeros(3))
    measure("m", np.zeros(3))
    with pytest.raises(PlanViolation, match="the plan allows 2"):
        measure("m", np.zeros(3))
    with pytest.raises(KeyError):
        measure("other", np.zeros(3))
    with pytest.raises(PlanViolation, match="non-integer"):
        Measure(Plan((_mech(integer=True),)), ExactNoise())("m", np.array([0.5]))


def test_a_bound_chosen_during_the_release_sets_the_scale():
    m = _mech("gaussian", sensitivity=None, multiplier=2.0, bound_multiple=1.5)
    assert m.scale is None and m.scale_for(4.0) == pytest.approx(12.0)
    with pytest.raises(ValueError):
        m.scale_for(None)
    noisy = Measure(Plan((m,)), SeededNoise(1))("m", np.zeros(50_000), bound=4.0)
    assert np.std(noisy) == pytest.approx(12.0, rel=0.02)


def test_first_draw_is_reported_once():
    seen = []
    measure = Measure(Plan((_mech(repetitions=3),)), SeededNoise(0), on_first_draw=lambda: seen.append(1))
    assert not measure.drawn
    for _ in range(3):
        measure("m", np.zeros(2))
    assert seen == [1] and measure.drawn


@pytest.mark.parametrize("m", [_mech(), _mech(integer=True), _mech("gaussian"), _mech("gaussian", integer=True),
                               _mech("gaussian", sensitivity=None, multiplier=3.0)])
def test_plan_matches_opendp_privacy_map(m):
    """The plan's epsilon (Laplace) or rho (Gaussian) equals OpenDP's privacy map of the same noise."""
    meas = m.opendp_measurement(size=5, scale=m.scale if m.sensitivity is not None else m.scale_for(1.0))
    d_in = (int(m.sensitivity) if m.integer else m.sensitivity) if m.sensitivity is not None else 1.0
    claimed = m.manifest().get("epsilon_each", m.manifest().get("rho_each"))
    assert meas.map(d_in) == pytest.approx(claimed, rel=1e-9)


def test_events_follow_the_distribution():
    assert isinstance(_mech(integer=True).event(), dpe.DiscreteLaplaceDpEvent)
    assert isinstance(_mech().event(), dp_accounting.LaplaceDpEvent)
    assert _mech("gaussian").event() == dpe.ZCDpEvent(1 / (2 * 4.0))
    sgd = _mech("gaussian", sensitivity=None, per_step_generator=True, sampling_rate=0.01, repetitions=7)
    assert sgd.event() == dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(2.0)), 7)


def test_pure_laplace_events_compose_to_the_sum_of_epsilons():
    plan = Plan(tuple(Mechanism(f"m{i}", "q", "laplace", 1.0, "a", 10.0, integer=i % 2 == 0) for i in range(10)))
    g = accounting.release_guarantee(plan.event(), delta=1e-6)
    assert g.epsilon == pytest.approx(1.0, rel=1e-12) and g.delta == 0.0
    # At delta > 0 the PLD accountant may prove slightly less, never more than basic composition.
    assert accounting.epsilon_at(plan.event(), 1e-6).epsilon <= 1.0 + 1e-12


def test_discrete_laplace_composes_with_zcdp_through_rdp():
    """PLD cannot take zCDP, RDP cannot take the discrete Laplace: the discrete Laplace enters RDP as the
    (eps^2/2)-zCDP it implies, which is never better than its pure epsilon alone."""
    lap = dpe.DiscreteLaplaceDpEvent(0.5, 1)
    mixed = dp_accounting.ComposedDpEvent([lap, dpe.ZCDpEvent(0.01)])
    g = accounting.epsilon_at(mixed, 1e-6)
    assert g.method == "dp_accounting RDP" and 0.5 < g.epsilon < math.inf
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dpe.ZCDpEvent(0.5 ** 2 / 2 + 0.01))
    assert g.epsilon == pytest.approx(rdp.get_epsilon(1e-6), rel=1e-9)


def test_gaussian_composition_matches_dp_accounting():
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(5.0), 20)
    g = accounting.epsilon_at(event, 1e-5)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(event)
    assert 0 < g.epsilon <= rdp.get_epsilon(1e-5) + 1e-12
    assert g.delta == 1e-5


def test_events_round_trip_through_json():
    event = dp_accounting.ComposedDpEvent([
        dp_accounting.LaplaceDpEvent(3.0), dpe.DiscreteLaplaceDpEvent(0.2, 3),
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 7),
        dpe.ZCDpEvent(0.1)])
    assert accounting.event_from_json(accounting.event_to_json(event)) == event


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_mechanisms_refuse_bad_multipliers(bad):
    with pytest.raises(ValueError):
        _mech(multiplier=bad)


def test_counts_beyond_32_and_64_bits_get_their_noise():
    """A weighted table's cell of 3e9 failed inside OpenDP's 32-bit domain after the charge; the noise of a zero
    vector added in unbounded integers takes any count the data can hold."""
    m = _mech(integer=True, sensitivity=1.0, multiplier=1.0)
    exact = np.array([3e9, 2.0 ** 70, 5.0])
    noisy = Measure(Plan((m,)), ExactNoise())("m", exact)
    assert np.all(np.abs(noisy - exact) < 200 + exact * 1e-15)
    draws = Measure(Plan((_mech(integer=True, repetitions=1, sensitivity=1.0, multiplier=1e12),)),
                    ExactNoise())("m", np.zeros(200))
    assert np.max(np.abs(draws)) > 2 ** 31  # a 32-bit domain saturated the noise of large scales at 2^31 - 1


@pytest.mark.parametrize("name", ["kmeans", "histogram", "contingency", "matrix_mechanism", "kernel_kmeans",
                                  "synthetic", "mean", "friendly_kmeans"])
def test_every_kind_plan_round_trips_through_json_and_the_manifest(name, tmp_path):
    from tasks.kinds import REGISTRY
    from tasks.spec import parse_spec
    from tests import conformance as C

    kind = REGISTRY[name]
    plan = kind.bind(parse_spec(C.spec_for(kind, tmp_path))).plan
    assert Plan.from_json(plan.to_json()) == plan
    legacy = Plan.from_manifest(plan.manifest(), plan.extra_delta, plan.extra_delta_argument)
    assert [(m.name, m.scale, m.noise_multiplier, m.bound_multiple) for m in legacy] == \
        [(m.name, m.scale, m.noise_multiplier, m.bound_multiple) for m in plan]
    assert legacy.event() == plan.event()


def _random_plan(rng) -> Plan:
    """Laplace, zCDP and (rarely: dp_accounting's PLD of them is slow) sampled Gaussian entries."""
    mechanisms = []
    for i in range(int(rng.integers(1, 4))):
        kind = str(rng.choice(["laplace", "gaussian", "sampled"], p=[0.45, 0.45, 0.1]))
        extra = {"repetitions": int(rng.integers(1, 6 if kind == "laplace" else 30))}
        multiplier = float(10 ** rng.uniform(-1.5, 1.5))
        if kind == "sampled":
            multiplier = float(rng.uniform(2.0, 3.0))
            extra = {"repetitions": 2, "sampling_rate": float(rng.uniform(0.001, 0.02)), "per_step_generator": True}
        mechanisms.append(Mechanism(f"m{i}", "q", "laplace" if kind == "laplace" else "gaussian", 1.0, "-",
                                    multiplier, integer=bool(rng.integers(2)) and kind == "laplace", **extra))
    return Plan(tuple(mechanisms), float(rng.choice([0.0, 1e-9, 1e-7])), "-")


def test_epsilon_floor_never_exceeds_the_accountant_and_is_close_where_exact():
    """The budget check's early refusal (`Plan.epsilon_floor`, ours) is sound: on 40 random plans of Laplace,
    zCDP and sampled entries at deltas from 0 to 1e-3, the floor is never above dp_accounting's epsilon for the
    plan alone or composed with another release; it is the exact Gaussian curve (PLD's epsilon of the same
    Gaussian within its discretisation), and the exact sum of pure Laplace plans at delta 0."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        plan, other = _random_plan(rng), _random_plan(rng)
        for delta in (0.0, 1e-8, 1e-6, 1e-3):
            floor = plan.epsilon_floor(delta)
            assert floor <= plan.guarantee(delta).epsilon
            composed = accounting.compose_events([plan.event(), other.event()])
            assert floor <= accounting.epsilon_at(composed, delta, plan.extra_delta + other.extra_delta).epsilon
    for sigma in (0.3, 1.0, 4.0, 30.0):
        for delta in (1e-9, 1e-5, 1e-2):
            pld = dp_accounting.pld.PLDAccountant()
            pld.compose(dpe.GaussianDpEvent(sigma))
            exact = pld.get_epsilon(delta)
            floor = Plan((_mech("gaussian", sensitivity=1.0, multiplier=sigma),)).epsilon_floor(delta)
            assert exact - 2e-3 <= floor <= exact
    laplace = Plan((_mech(multiplier=0.5, repetitions=3), _mech(integer=True, multiplier=4.0).__class__(
        **{**_mech(integer=True, multiplier=4.0).__dict__, "name": "n"})))
    assert laplace.epsilon_floor(0.0) == pytest.approx(6.25)


def test_budget_check_refuses_from_the_floor_without_dp_accounting(tmp_path):
    """An over-budget pure-DP release is refused by the floor, in a process that never imports dp_accounting."""
    import subprocess
    import sys

    code = f"""
import sys
from dpalgos.plan import Mechanism, Plan
from tasks.errors import BudgetExceeded
from tasks.ledger import PrivacyLedger
ledger = PrivacyLedger({str(tmp_path / "l.sqlite")!r})
ledger.set_budget("d", 1.0, 0.0)
plan = Plan((Mechanism("m", "q", "laplace", 1.0, "-", 0.2),))
try:
    ledger.charge(dataset_id="d", release_id="r", kind="k", fingerprint="f", plan=plan)
except BudgetExceeded as exc:
    print("refused:", exc)
print("dp_accounting" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused:" in out and "at least 5" in out and out.strip().endswith("False")


def _branched() -> Plan:
    """Points (0.02), then one of: coarse 0.49 + leaves 0.49 (adaptive), or 0.98 on every cell (dense)."""
    m = lambda name, eps, branch, integer=True: Mechanism(name, "q", "laplace", 1.0, "one record, one value", 1 / eps,
                                                          integer=integer, branch=branch)
    return Plan((m("points", 0.02, None), m("coarse", 0.49, "adaptive", False), m("leaves", 0.49, "adaptive"),
                 m("dense", 0.98, "dense", False)))


def test_a_plan_with_branches_states_the_common_entries_plus_its_largest_branch():
    """A release draws one branch: the guarantee is the entries always drawn plus the largest branch (not the sum of
    every entry, which would be 1.98), at delta 0 and above; the floor agrees; the event survives the ledger's
    JSON."""
    plan = _branched()
    assert plan.guarantee(0.0).epsilon == pytest.approx(1.0, abs=1e-12)
    assert plan.epsilon_floor(0.0) == pytest.approx(1.0, rel=1e-8) and plan.epsilon_floor(0.0) <= 1.0
    assert accounting.epsilon_at(plan.event(), 1e-6).epsilon <= 1.0 + 1e-12
    assert accounting.event_from_json(accounting.event_to_json(plan.event())) == plan.event()
    assert [e.get("branch") for e in plan.manifest()] == [None, "adaptive", "adaptive", "dense"]
    assert Plan.from_manifest(plan.manifest())["dense"].branch == "dense"


def test_randomized_response_at_epsilon_dominates_an_epsilon_dp_branch():
    """The branch's event, binary randomized response at eps, is the worst eps-DP pair: its hockey-stick delta at
    every epsilon' is at least that of the branches it stands for (Laplace eps; two Laplaces eps/2), and at eps/2
    it would not be (the check can fail)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    rr = lambda eps: pld.from_randomized_response(2.0 / (1.0 + math.exp(eps)), 2)
    laplace = pld.from_laplace_mechanism(1.0)
    two = pld.from_laplace_mechanism(2.0).compose(pld.from_laplace_mechanism(2.0))
    for eps_prime in (0.0, 0.2, 0.5, 0.8, 0.99):
        for branch in (laplace, two):
            assert branch.get_delta_for_epsilon(eps_prime) <= rr(1.0).get_delta_for_epsilon(eps_prime) + 1e-9
    assert laplace.get_delta_for_epsilon(0.2) > rr(0.5).get_delta_for_epsilon(0.2)


def test_a_branched_release_composes_with_gaussian_releases_in_the_ledger():
    """A Gaussian release, then a branched plan (and the other way): finite, by RDP, where randomized response
    enters as (eps^2 / 2)-zCDP; and the branch's stated epsilon is never below its largest branch's."""
    gaussian = Plan((Mechanism("g", "q", "gaussian", 1.0, "one record", 3.0),))
    both = accounting.compose_events([gaussian.event(), _branched().event()])
    total = accounting.epsilon_at(both, 1e-6).epsilon
    assert math.isfinite(total) and total > 1.0
    for eps in (1e-9, 1e-7, 0.3, 1.0, 7.0):
        event = Plan((Mechanism("b", "q", "laplace", 1.0, "a", 1 / eps, branch="x"),)).event()
        assert accounting.pure_epsilon(event) >= eps


def test_a_release_draws_from_one_branch_only():
    plan = _branched()
    measure = Measure(plan, SeededNoise(1))
    measure("points", np.array([10]))
    measure("coarse", np.zeros(4))
    measure("leaves", np.zeros(3, dtype=np.int64))
    assert measure.branch == "adaptive"
    with pytest.raises(PlanViolation, match="a release draws one"):
        measure("dense", np.zeros(4))


def test_branch_entries_must_be_pure_laplace():
    with pytest.raises(ValueError, match="unsampled Laplace"):
        Mechanism("g", "q", "gaussian", 1.0, "a", 2.0, branch="b")
