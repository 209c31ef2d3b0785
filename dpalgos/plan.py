"""Mechanism plans: the privacy facts of a release, stated once.

A `Mechanism` is one noise-adding step of a release (possibly repeated): the query it answers, the
neighbouring relation, the norm and sensitivity of the query with the argument for it, the noise
distribution and its scale, how many times it runs, and its sampling rate. A `Plan` is the list of them.
Everything else is derived from the plan and only from it (as OpenDP's measurements carry their privacy map
and Tumult derives its noise description from the measurement):

  * `Plan.event()`      the `dp_accounting` event the ledger charges;
  * `Plan.guarantee()`  the (epsilon, delta) a release states (the ledger, the stages, the conformance suite and
                        the experiments all ask it, so a release's guarantee is computed in one place);
  * `dpalgos.noise`     the noise each draw adds (the scale comes from the plan entry, never recomputed);
  * `Plan.manifest()`   the manifest's mechanism list;
  * `Mechanism.opendp_measurement()`  OpenDP's measurement of the entry: the production sampler draws with it
                        (`dpalgos.noise.ExactNoise`) and the conformance suite compares its privacy map
                        with the plan: the measurement that is checked is the one that draws.
  * `Plan.to_json()` / `Plan.from_json()`  the plan committed with the measurements; postprocessing reads the
                        committed plan back, never the plan the current code would build from the spec.

Noise distributions and their events:
  laplace, integer statistic   OpenDP discrete Laplace (Canonne, Kamath & Steinke 2020) on the integers;
                               `DiscreteLaplaceDpEvent(1/scale, sensitivity)` (epsilon = sensitivity/scale).
  laplace, real statistic      OpenDP's float Laplace: an exact discrete Laplace on the grid 2^-1074 of which
                               every double is a multiple (inputs are not rounded, its privacy map is exactly
                               sensitivity/scale), the sum rounded to the nearest double (post-processing).
                               `LaplaceDpEvent(scale/sensitivity)`: its pure epsilon is exact; where a
                               (epsilon, delta) composition uses the continuous Laplace's privacy-loss
                               distribution for it, the two differ by a total variation of order
                               2^-1074/scale, far below the accountant's own discretisation.
  gaussian (OpenDP)            discrete Gaussian on the integers or on the 2^-1074 grid: rho-zCDP with
                               rho = sensitivity^2 / (2 scale^2) (CKS20 Thm 4); `ZCDpEvent(rho)`.
  gaussian (per-step numpy)    DP-SGD only (see dpalgos.noise.StepNoise): a continuous Gaussian,
                               `GaussianDpEvent(noise_multiplier)`, Poisson-subsampled when sampled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from dpalgos.lazy import module

if TYPE_CHECKING:
    from dp_accounting import dp_event as dpe

    from dpalgos.accounting import Guarantee

#: Loaded on the first event or guarantee (dp_accounting takes most of a second to import): a plan is built, and
#: its sizes read, by the checks before a release runs.
_dp_accounting = module("dp_accounting")
_accounting = module("dpalgos.accounting")

ADD_REMOVE_RECORD = "add or remove one record"
ADD_REMOVE_USER = "add or remove one user (all of a user's items)"
#: The grid of OpenDP's float samplers with their default granularity: every double is on it.
FLOAT_GRID_LOG2 = -1074


@dataclass(frozen=True)
class Mechanism:
    """One noise-adding step, repeated `repetitions` times with the same noise multiplier.

    sensitivity : the query's sensitivity in `norm` over neighbouring datasets, or None when it is
        `bound_multiple` times a bound C chosen during the release (a public or already-noisy clipping
        bound): the noise is then noise_multiplier * bound_multiple * C, and the argument explains why.
    noise_multiplier : scale / sensitivity, the privacy fact (epsilon = 1/multiplier for Laplace, rho =
        1/(2 multiplier^2) for Gaussian).
    integer : the statistic is integer-valued (counts): noise from a sampler on the integers.
    per_step_generator : DP-SGD's Gaussian noise, drawn from a per-step generator seeded from OS entropy
        because OpenDP is too slow for its volume (README, "Noise").
    branch : the entry belongs to one of several alternatives of which a release draws one, chosen from public
        parameters and values already drawn (`Plan.event` says what that costs); None: always drawn.
    """
    name: str
    query: str
    distribution: Literal["laplace", "gaussian"]
    sensitivity: float | None
    argument: str
    noise_multiplier: float
    integer: bool = False
    repetitions: int = 1
    sampling_rate: float | None = None
    relation: str = ADD_REMOVE_RECORD
    per_step_generator: bool = False
    bound_multiple: float = 1.0
    values: int | None = field(default=None, compare=False)  # values per repetition (for the manifest only)
    branch: str | None = None

    def __post_init__(self):
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"mechanism '{self.name}': noise multiplier must be positive and finite, got "
                             f"{self.noise_multiplier}")
        if self.sensitivity is not None and not (math.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise ValueError(f"mechanism '{self.name}': sensitivity must be positive and finite")
        if self.repetitions < 1:
            raise ValueError(f"mechanism '{self.name}': repetitions must be >= 1")
        if self.per_step_generator and self.distribution != "gaussian":
            raise ValueError("only Gaussian noise may come from the per-step generator")
        if self.branch is not None and (self.distribution != "laplace" or self.sampling_rate is not None):
            raise ValueError(f"mechanism '{self.name}': a branch's entries are unsampled Laplace (pure DP)")

    @property
    def epsilon(self) -> float:
        """The pure epsilon of all repetitions of a Laplace entry (sensitivity / scale each)."""
        return self.repetitions / self.noise_multiplier

    @property
    def norm(self) -> str:
        return "l1" if self.distribution == "laplace" else "l2"

    @property
    def scale(self) -> float | None:
        """The noise scale (Laplace b, Gaussian standard deviation), when the sensitivity is fixed."""
        return None if self.sensitivity is None else self.noise_multiplier * self.sensitivity

    def scale_for(self, sensitivity: float | None) -> float:
        """The scale of a draw: the plan's, or noise_multiplier * the bound chosen during the release."""
        if self.sensitivity is not None:
            if sensitivity is not None and sensitivity != self.sensitivity:
                raise ValueError(f"mechanism '{self.name}' has the fixed sensitivity {self.sensitivity}")
            return self.scale
        if sensitivity is None or not (math.isfinite(sensitivity) and sensitivity > 0):
            raise ValueError(f"mechanism '{self.name}' needs the clipping bound of this draw")
        return self.noise_multiplier * self.bound_multiple * sensitivity

    def once(self) -> dpe.DpEvent:
        """The event of one repetition (before sampling)."""
        dpe = _dp_accounting.dp_event
        if self.distribution == "laplace":
            if self.integer and self.sensitivity is not None and float(self.sensitivity).is_integer():
                return dpe.DiscreteLaplaceDpEvent(1.0 / self.scale, int(self.sensitivity))
            return dpe.LaplaceDpEvent(self.noise_multiplier)
        if self.per_step_generator:
            return dpe.GaussianDpEvent(self.noise_multiplier)
        return dpe.ZCDpEvent(1.0 / (2.0 * self.noise_multiplier ** 2))

    def event(self) -> dpe.DpEvent:
        dpe = _dp_accounting.dp_event
        event = self.once()
        if self.sampling_rate is not None:
            event = dpe.PoissonSampledDpEvent(self.sampling_rate, event)
        return event if self.repetitions == 1 else dpe.SelfComposedDpEvent(event, self.repetitions)

    def sampler(self) -> str:
        """The name of the sampler that draws this mechanism's noise in production."""
        if self.per_step_generator:
            return "numpy_gaussian"
        kind = "discrete" if self.integer else "opendp"
        return f"{kind}_{self.distribution}"

    def manifest(self, sampler: str | None = None) -> dict:
        out = {"name": self.name, "query": self.query, "relation": self.relation, "norm": self.norm,
               "sensitivity": self.sensitivity if self.sensitivity is not None else
               f"{self.bound_multiple:g} * C (C chosen during the release)",
               "sensitivity_argument": self.argument, "distribution": sampler or self.sampler(),
               "noise_multiplier": self.noise_multiplier, "scale": self.scale, "repetitions": self.repetitions,
               "sampling_rate": self.sampling_rate, "values_per_repetition": self.values}
        if self.branch is not None:
            out["branch"] = self.branch
        if out["distribution"].startswith("opendp"):
            out["grid_log2"] = FLOAT_GRID_LOG2
            out["grid_accuracy_cost"] = "none: every double is on the grid; outputs are rounded to the nearest double"
        if self.distribution == "laplace":
            out["epsilon_each"] = 1.0 / self.noise_multiplier
        elif not self.per_step_generator:
            out["rho_each"] = 1.0 / (2.0 * self.noise_multiplier ** 2)
        return out

    def opendp_measurement(self, size: int, scale: float | None = None):
        """OpenDP's measurement of this entry's noise on `size` values, at `scale` (default the plan's; an entry
        whose bound is chosen during the release gives the scale of its draw, `scale_for`). The production
        sampler draws with it and the conformance suite checks its privacy map against the plan.

        Integer statistics are 64-bit (OpenDP's `int` is 32-bit and saturates its noise at 2^31 - 1), and the
        sampler draws the noise of a zero vector and adds it to the exact counts in Python's unbounded integers
        (`dpalgos.noise.ExactNoise`): x + Z is the mechanism whatever x, so counts of any size are handled."""
        import opendp.prelude as dp

        dp.enable_features("contrib")
        scale = self.scale if scale is None else scale
        T = "i64" if self.integer else float
        atom = dp.atom_domain(T=T) if self.integer else dp.atom_domain(T=float, nan=False)
        domain = dp.vector_domain(atom, size=size)
        if self.distribution == "laplace":
            return dp.m.make_laplace(domain, dp.l1_distance(T=T), scale=scale)
        return dp.m.make_gaussian(domain, dp.l2_distance(T=T), scale=scale)

    def to_json(self) -> dict:
        return asdict(self)


def _randomized_response(epsilon: float) -> dpe.DpEvent:
    """Binary randomized response whose stated epsilon is at least `epsilon`: p = 2 / (1 + e^eps), stepped down
    past the float rounding of e^eps and back (a smaller p is a larger epsilon)."""
    p = 2.0 / (1.0 + math.exp(epsilon))
    while math.log1p(2.0 * (1.0 - p) / p) < epsilon:
        p = math.nextafter(p, 0.0)
    return _dp_accounting.dp_event.RandomizedResponseDpEvent(p, 2)


@dataclass(frozen=True)
class Plan:
    """The mechanisms of one release, in the order they run.

    extra_delta : a failure probability outside the mechanisms' events (a propose-test-release test that may
        pass when it should not): the release is (eps, delta_0 + extra_delta)-DP for every (eps, delta_0) its
        event gives, and releases compose at delta_total - sum of their extra_deltas. The argument says why."""
    mechanisms: tuple[Mechanism, ...]
    extra_delta: float = 0.0
    extra_delta_argument: str = ""

    def __post_init__(self):
        names = [m.name for m in self.mechanisms]
        if len(set(names)) != len(names):
            raise ValueError(f"mechanism names must be unique, got {names}")
        if not names:
            raise ValueError("a plan needs at least one mechanism")

    def __getitem__(self, name: str) -> Mechanism:
        for m in self.mechanisms:
            if m.name == name:
                return m
        raise KeyError(f"no mechanism '{name}' in the plan ({[m.name for m in self.mechanisms]})")

    def __iter__(self):
        return iter(self.mechanisms)

    def branches(self) -> dict[str, tuple[Mechanism, ...]]:
        """The alternatives' entries by branch name (empty: every entry is always drawn)."""
        names = dict.fromkeys(m.branch for m in self.mechanisms if m.branch is not None)
        return {b: tuple(m for m in self.mechanisms if m.branch == b) for b in names}

    def branch_epsilon(self) -> float:
        """The largest pure epsilon of one branch (0 without branches)."""
        return max((math.fsum(m.epsilon for m in ms) for ms in self.branches().values()), default=0.0)

    def event(self) -> dpe.DpEvent:
        """The composition of the entries always drawn and, where the plan has branches, of the choice among them.

        Ours. A release draws the entries of one branch, chosen from public parameters and values already drawn;
        each branch is pure eps_b-DP (its entries are unsampled Laplace, composed), so whichever is chosen, given
        the earlier outputs, is max_b eps_b-DP. Binary randomized response at that epsilon is a dominating pair
        for every mechanism that is epsilon-DP (Kairouz, Oh & Viswanath 2015), and dominating pairs compose
        adaptively (Zhu, Dong & Wang 2022): so the choice enters the composition as
        RandomizedResponseDpEvent(p = 2 / (1 + e^eps), 2 buckets), whose pure epsilon is log((2 - p) / p) = eps."""
        dpe = _dp_accounting.dp_event
        events = [m.event() for m in self.mechanisms if m.branch is None]
        if self.branches():
            events.append(_randomized_response(self.branch_epsilon()))
        return events[0] if len(events) == 1 else dpe.ComposedDpEvent(events)

    def guarantee(self, delta: float) -> Guarantee:
        """The (epsilon, delta) the release states at the spec's `delta` (`accounting.release_guarantee`: pure
        epsilon when every entry is pure DP, else the best epsilon at delta, of which `extra_delta` is outside the
        event)."""
        return _accounting.release_guarantee(self.event(), delta, self.extra_delta)

    def epsilon_floor(self, delta: float) -> float:
        """A lower bound, computed without dp_accounting, on the epsilon at `delta` that any sound accountant gives
        this plan's event, alone or composed with anything: the budget check refuses a release whose floor
        already exceeds the budget before loading dp_accounting (most of a second).

        Ours. An accountant's epsilon for a composition is at least the exact epsilon of the composition's
        event, which is at least the exact epsilon of any part of it (a part is a post-processing of the
        whole), which is decreasing in delta. Parts used, each exact for the event as `Mechanism.event` states
        it: (a) the entries that are rho-zCDP events (OpenDP Gaussians, unsampled): their composition is
        (sum rho)-zCDP, and the Gaussian mechanism with mu = sqrt(2 rho) is (sum rho)-zCDP, so no conversion
        of a zCDP event to (epsilon, delta) can state less than that Gaussian's exact curve (Balle & Wang
        2018, Theorem 8, `_gaussian_epsilon`); (b) at delta = 0, the Laplace entries: their privacy losses are
        bounded by their epsilons and reach the sum of them together with positive probability, so their
        exact epsilon at delta = 0 is the sum. Sampled and per-step entries are left out (any part gives a
        floor). With `extra_delta` the events compose at delta - extra_delta or below (more releases' extra
        deltas): the floor is taken at delta - extra_delta. Checked against dp_accounting in
        tests/test_plan_noise.py."""
        if self.extra_delta > 0 and not delta > self.extra_delta:
            return math.inf
        delta0 = delta - self.extra_delta
        plain = [m for m in self.mechanisms
                 if m.sampling_rate is None and not m.per_step_generator and m.branch is None]
        rho = math.fsum(m.repetitions / (2.0 * m.noise_multiplier ** 2) for m in plain if m.distribution == "gaussian")
        floors = [_gaussian_epsilon(math.sqrt(2.0 * rho), delta0) if rho > 0 else 0.0]
        if delta0 == 0:  # a branch's part is its largest branch's epsilon (`event`)
            floors.append(math.fsum([m.epsilon for m in plain if m.distribution == "laplace"]
                                    + [self.branch_epsilon()]))
        return max(floors) * (1.0 - 1e-9)  # float rounding in the formula may not lift the floor above the bound

    def to_json(self) -> dict:
        return {"mechanisms": [m.to_json() for m in self.mechanisms], "extra_delta": self.extra_delta,
                "extra_delta_argument": self.extra_delta_argument}

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        return cls(tuple(Mechanism(**m) for m in data["mechanisms"]), data["extra_delta"], data["extra_delta_argument"])

    @classmethod
    def from_manifest(cls, entries: list[dict], extra_delta: float = 0.0, argument: str = "") -> "Plan":
        """The plan of measurements committed before plans were stored whole (their manifest list only): every
        fact postprocessing reads (names, scales, multipliers, sensitivities) is in it."""
        def mechanism(e: dict) -> Mechanism:
            fixed = not isinstance(e["sensitivity"], str)
            return Mechanism(
                name=e["name"], query=e["query"], relation=e["relation"], argument=e["sensitivity_argument"],
                distribution="laplace" if e["norm"] == "l1" else "gaussian",
                sensitivity=e["sensitivity"] if fixed else None, noise_multiplier=e["noise_multiplier"],
                bound_multiple=1.0 if fixed else float(e["sensitivity"].split()[0]),
                integer=e["distribution"].startswith("discrete"), repetitions=e["repetitions"],
                sampling_rate=e["sampling_rate"], per_step_generator=e["distribution"] == "numpy_gaussian"
                and e["sampling_rate"] is not None, values=e.get("values_per_repetition"), branch=e.get("branch"))
        return cls(tuple(mechanism(e) for e in entries), extra_delta, argument)

    def manifest(self, samplers: dict[str, str] | None = None) -> list[dict]:
        samplers = samplers or {}
        return [m.manifest(samplers.get(m.name)) for m in self.mechanisms]

    def scaled(self, name: str, factor: float) -> "Plan":
        """A copy with one entry's sensitivity claim multiplied by `factor` (its noise then scales with it):
        how the conformance suite shows that an understated sensitivity is caught."""
        out = []
        for m in self.mechanisms:
            if m.name == name:
                change = ({"sensitivity": m.sensitivity * factor} if m.sensitivity is not None
                          else {"bound_multiple": m.bound_multiple * factor})
                m = Mechanism(**{**m.__dict__, **change})
            out.append(m)
        return Plan(tuple(out), self.extra_delta, self.extra_delta_argument)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """A lower bound on the exact epsilon at delta of the Gaussian mechanism of sensitivity 1 and sigma 1 / mu,
    whose curve is delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) (Balle & Wang 2018, Theorem 8):
    bisection on a curve never above the exact one (the subtracted term bounded above where it underflows), so
    the eps found is never above the exact one."""
    if delta <= 0:
        return math.inf

    def curve(eps: float) -> float:
        return _normal_cdf(mu / 2 - eps / mu) - math.exp(min(eps + _log_normal_cdf_upper(-mu / 2 - eps / mu), 0.0))

    if curve(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while curve(hi) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if curve(mid) > delta else (lo, mid)
    return lo


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _log_normal_cdf_upper(x: float) -> float:
    """log Phi(x), or above it: for x < -30 (where erfc underflows) the Mills-ratio bound Phi(x) <= phi(x)/|x|."""
    if x >= -30:
        return math.log(_normal_cdf(x))
    return -x * x / 2 - math.log(-x * math.sqrt(2 * math.pi))
