"""Privacy accounting with Google's `dp_accounting`, kept apart from the mechanics (as Opacus does).

Every mechanism in `dpalgos` has a function that describes its privacy as a `dp_accounting.DpEvent`;
this module composes events into an (epsilon, delta) guarantee and (de)serialises them so the ledger can
store them. The neighbouring relation throughout is add-or-remove one privacy unit.

Composition takes the smallest of several valid upper bounds at the requested delta:
  * basic composition of pure-DP events (the sum of their epsilons; the only bound valid at delta = 0),
  * the privacy-loss-distribution accountant (pessimistic discretisation, so an upper bound),
  * the Renyi-DP accountant (needed for zCDP events, which PLD does not support). It has no discrete Laplace and no
    randomized response for add-or-remove neighbours: there an epsilon-DP discrete Laplace or randomized response
    enters as (epsilon^2 / 2)-zCDP (Bun & Steinke 2016, Prop. 1.4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import attr
import dp_accounting
from dp_accounting import dp_event as dpe
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

_EVENT_TYPES = {name: getattr(dpe, name) for name in dir(dpe)
                if isinstance(getattr(dpe, name), type) and issubclass(getattr(dpe, name), dpe.DpEvent)}


@dataclass(frozen=True)
class Guarantee:
    """An (epsilon, delta)-DP guarantee and the accountant that proved it."""
    epsilon: float
    delta: float
    method: str


def compose_events(events: Iterable[dpe.DpEvent]) -> dpe.DpEvent:
    events = list(events)
    return events[0] if len(events) == 1 else dpe.ComposedDpEvent(events)


def pure_epsilon(event: dpe.DpEvent) -> float:
    """Epsilon of `event` by basic composition if every part is pure DP, else inf."""
    if isinstance(event, (dpe.NoOpDpEvent,)):
        return 0.0
    if isinstance(event, dpe.LaplaceDpEvent):
        return 1.0 / event.noise_multiplier
    if isinstance(event, dpe.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity
    if isinstance(event, dpe.RandomizedResponseDpEvent):  # k-ary: e^eps = 1 + k (1 - p) / p
        p, k = event.noise_parameter, event.num_buckets
        return math.log1p(k * (1.0 - p) / p) if p > 0 else math.inf
    if isinstance(event, dpe.ComposedDpEvent):
        return math.fsum(pure_epsilon(e) for e in event.events)
    if isinstance(event, dpe.SelfComposedDpEvent):
        return event.count * pure_epsilon(event.event)
    return math.inf


def _accountant_epsilon(accountant, event: dpe.DpEvent, delta: float) -> float:
    try:
        accountant.compose(event)
    except dp_accounting.UnsupportedEventError:
        return math.inf
    return float(accountant.get_epsilon(delta))


def _as_rdp(event: dpe.DpEvent) -> dpe.DpEvent:
    """`event` with every discrete Laplace, and every randomized response (a plan's branch, `Plan.event`), replaced
    by the zCDP event its pure epsilon implies (see module docstring): dp_accounting's RDP accountant has neither
    for add-or-remove neighbours."""
    if isinstance(event, (dpe.DiscreteLaplaceDpEvent, dpe.RandomizedResponseDpEvent)):
        return dpe.ZCDpEvent(pure_epsilon(event) ** 2 / 2.0)
    if isinstance(event, dpe.ComposedDpEvent):
        return dpe.ComposedDpEvent([_as_rdp(e) for e in event.events])
    if isinstance(event, dpe.SelfComposedDpEvent):
        return dpe.SelfComposedDpEvent(_as_rdp(event.event), event.count)
    return event


def epsilon_at(event: dpe.DpEvent, delta: float, extra_delta: float = 0.0) -> Guarantee:
    """The smallest epsilon any of our accountants proves for `event` at `delta`; with `extra_delta` (failure
    probabilities outside the events, `dpalgos.plan.Plan.extra_delta`), the events are composed at
    delta - extra_delta and the guarantee states the total delta."""
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if extra_delta > 0:
        if not delta > extra_delta:
            return Guarantee(epsilon=math.inf, delta=delta, method=f"delta not above the PTR delta {extra_delta:g}")
        g = epsilon_at(event, delta - extra_delta)
        return Guarantee(epsilon=g.epsilon, delta=delta,
                         method=f"{g.method} at delta_0 = {delta - extra_delta:g}, plus delta' = {extra_delta:g}")
    candidates = [(pure_epsilon(event), "basic composition (pure DP)")]
    if delta > 0:
        candidates.append((_accountant_epsilon(PLDAccountant(), event, delta), "dp_accounting PLD"))
        candidates.append((_accountant_epsilon(RdpAccountant(), _as_rdp(event), delta), "dp_accounting RDP"))
    eps, method = min(candidates, key=lambda c: c[0])
    return Guarantee(epsilon=eps, delta=0.0 if method.startswith("basic") else delta, method=method)


class CalibrationError(ValueError):
    """The noise cannot be calibrated to the asked (epsilon, delta): a parameter error, known before any data."""


def calibrate(make_event, epsilon: float, delta: float, **search) -> float:
    """dp_accounting's calibration search with the RDP accountant, checked: the parameter it returns must
    certify between epsilon/2 and epsilon. Below a floor set by delta and the number of mechanisms, RDP's
    conversion certifies no smaller epsilon however large the noise, and the search then fails or returns
    noise that certifies far less than asked (an audit's kernel k-means got sigma = 1e9 for epsilon 0.001 and
    0.01 alike): refused as a parameter error."""
    from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

    refused = CalibrationError(f"the noise cannot be calibrated to epsilon={epsilon:g} at delta={delta:g} (the RDP "
                               f"accountant certifies no epsilon that small for this mechanism): raise epsilon or "
                               f"delta, or run fewer iterations")
    try:
        value = float(dp_accounting.calibrate_dp_mechanism(RdpAccountant, make_event, epsilon, delta,
                                                           bracket_interval=None, **search))
    except NoBracketIntervalFoundError:
        raise refused from None
    accountant = RdpAccountant()
    accountant.compose(make_event(value))
    if not epsilon / 2 <= accountant.get_epsilon(delta) <= epsilon * (1 + 1e-6):
        raise refused
    return value


def release_guarantee(event: dpe.DpEvent, delta: float, extra_delta: float = 0.0) -> Guarantee:
    """The guarantee to state for one release: pure (epsilon, 0) when every part is pure DP (the plainest
    true statement), else the best (epsilon, delta) at `delta` (of which `extra_delta` is outside the event)."""
    pure = pure_epsilon(event)
    if math.isfinite(pure) and extra_delta == 0:
        return Guarantee(epsilon=pure, delta=0.0, method="basic composition (pure DP)")
    return epsilon_at(event, delta, extra_delta)


def zcdp_rho(epsilon: float, delta: float) -> float:
    """The largest rho whose rho-zCDP the RDP accountant converts to at most (epsilon, delta) (bisection)."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({epsilon}, {delta})")
    lo, hi = 0.0, epsilon
    for _ in range(80):
        mid = (lo + hi) / 2
        acc = RdpAccountant()
        acc.compose(dpe.ZCDpEvent(mid))
        lo, hi = (mid, hi) if acc.get_epsilon(delta) <= epsilon else (lo, mid)
    return lo


def event_to_json(event: dpe.DpEvent) -> dict:
    """A JSON-able dict {"type": ClassName, field: value, ...}; nested events are dicts too."""
    def convert(value):
        if isinstance(value, dpe.DpEvent):
            return event_to_json(value)
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        return value
    fields = attr.asdict(event, recurse=False)
    return {"type": type(event).__name__, **{k: convert(v) for k, v in fields.items()}}


def event_from_json(data: dict) -> dpe.DpEvent:
    def convert(value):
        if isinstance(value, dict) and "type" in value:
            return event_from_json(value)
        if isinstance(value, list):
            return [convert(v) for v in value]
        return value
    data = dict(data)
    kind = data.pop("type")
    if kind not in _EVENT_TYPES:
        raise ValueError(f"unknown dp_accounting event type {kind!r}")
    return _EVENT_TYPES[kind](**{k: convert(v) for k, v in data.items()})
