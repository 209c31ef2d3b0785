"""What a charge does (`Spends.charge`), as a declared table of transitions read top to bottom: each rule a small
named object with the statuses it starts from, the status it leaves the release in, and its check; the first rule
whose statuses and check match a charge decides it (the model is Prefect's orchestration policies, whose rules
declare their from- and to-states and a check).

A release's statuses in the ledger: NEW (not recorded), charged -> drawing (noise is being drawn, nothing
committed) -> measured -> published. A rule's `act` runs inside the charge's write transaction, the writers' lock
held: it composes and checks the budget where the rule spends, writes the release's row, and returns the `Charge`;
a refusal raises before anything is written, and says that no noise was drawn.

Every rule is safe to repeat (the ledger retries a charge whose commit's answer was lost, `tasks.ledger.__init__`):
a charge that committed finds its own row the second time, in a status from which the same request is
"already charged" (first charge, correction, takeover), or, for a failed draw charged again, back in `charged`,
where it is not charged a third time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Mapping

from dpalgos.lazy import module
from tasks.errors import BudgetExceeded, ReleaseConflict
from tasks.ledger import schema
from tasks.ledger.store import now

sa = module("sqlalchemy")

if TYPE_CHECKING:
    from dpalgos.plan import Plan

#: dp_accounting takes most of a second to load; the checks before a run read budgets and bindings without it.
accounting = module("dpalgos.accounting")
#: Relative slack on the budget comparison, for the floating-point sum of equal shares.
_TOLERANCE = 1e-12

#: The status of a release id the ledger does not hold yet.
NEW = "new"
#: Every status of a recorded release.
RECORDED = frozenset({"charged", "drawing", "measured", "published"})
#: The to-state of a rule that leaves the release as it was.
UNCHANGED = "unchanged"


@dataclass(frozen=True)
class Charge:
    """The outcome of charging a release: its own guarantee, and the dataset's total after it."""
    release_id: str
    state: str
    release: accounting.Guarantee
    total: accounting.Guarantee
    budget_epsilon: float
    budget_delta: float

    @property
    def remaining_epsilon(self) -> float:
        return max(self.budget_epsilon - self.total.epsilon, 0.0)


@dataclass(frozen=True)
class Ask:
    """What a charge asks (`Spends.charge`'s arguments), with its dataset's lifetime budget."""
    dataset_id: str
    release_id: str
    kind: str
    fingerprint: str
    plan: Plan
    release_delta: float | None
    redraw: bool
    location: str | None
    owner: str | None
    budget_epsilon: float
    budget_delta: float

    @cached_property
    def event(self):
        return self.plan.event()

    @cached_property
    def own(self) -> accounting.Guarantee:
        """The release's own guarantee, at its spec's delta, else the budget's."""
        return self.plan.guarantee(self.release_delta or self.budget_delta)

    def within(self, total: accounting.Guarantee) -> bool:
        return total.epsilon <= self.budget_epsilon * (1 + _TOLERANCE)


#: A rule's check: (what is asked, the release's row or None) -> whether the rule applies.
Check = Callable[[Ask, "Mapping | None"], bool]
#: A rule's act: (the ledger, the transaction's connection, what is asked, the release's row) -> the outcome.
Act = Callable[..., Charge]


@dataclass(frozen=True)
class Transition:
    name: str
    from_states: frozenset[str]
    #: The release's status after the rule (None: refused, nothing written; UNCHANGED: as it was).
    to_state: str | None
    check: Check
    act: Act


# ---- the acts ------------------------------------------------------------------------------------------------------
def _composed(ledger, db, ask: Ask, exclude: str | None = None) -> accounting.Guarantee:
    """The dataset's total with this release's event, at the budget's delta (`exclude`: a row it replaces)."""
    events, extra = ledger._events_locked(db, ask.dataset_id, exclude=exclude)
    return accounting.epsilon_at(accounting.compose_events(events + [ask.event]), ask.budget_delta,
                                 extra + ask.plan.extra_delta)


def _over_budget(ledger, db, ask: Ask, total: accounting.Guarantee) -> BudgetExceeded:
    spent = ledger._total_locked(db, ask.dataset_id, ask.budget_delta).epsilon
    return BudgetExceeded(
        f"release '{ask.release_id}' (epsilon={ask.own.epsilon:.6g}) would exceed the lifetime budget of "
        f"dataset '{ask.dataset_id}': spent epsilon={spent:.6g}, composed total would be "
        f"{total.epsilon:.6g} > budget {ask.budget_epsilon:.6g} (delta={ask.budget_delta:g}). No noise was drawn.")


def _refuse_alone(ledger, db, ask: Ask, prior) -> Charge:
    floor = ask.plan.epsilon_floor(ask.budget_delta)
    raise BudgetExceeded(
        f"release '{ask.release_id}' would exceed the lifetime budget of dataset '{ask.dataset_id}': its own "
        f"epsilon at delta={ask.budget_delta:g} is at least {floor:.6g} > budget {ask.budget_epsilon:.6g}. "
        f"No noise was drawn.")


def _first(ledger, db, ask: Ask, prior) -> Charge:
    total = _composed(ledger, db, ask)
    if not ask.within(total):
        raise _over_budget(ledger, db, ask, total)
    stamp = now()
    db.execute(sa.insert(schema.spends).values(
        release_id=ask.release_id, dataset_id=ask.dataset_id, kind=ask.kind, fingerprint=ask.fingerprint,
        event=json.dumps(accounting.event_to_json(ask.event)), epsilon=ask.own.epsilon, delta=ask.own.delta,
        status="charged", created_at=stamp, updated_at=stamp, attempts=1, location=ask.location,
        extra_delta=ask.plan.extra_delta, owner=ask.owner))
    return Charge(ask.release_id, "charged", ask.own, total, ask.budget_epsilon, ask.budget_delta)


def _correct(ledger, db, ask: Ask, prior) -> Charge:
    """Charged once, never drawn: the rerun corrects a parameter or a public input. The charge is for the release,
    not the typo: its event is replaced, against the budget."""
    total = _composed(ledger, db, ask, exclude=ask.release_id)
    if not ask.within(total):
        raise BudgetExceeded(f"release '{ask.release_id}' with its new parameters would exceed the lifetime "
                             f"budget of dataset '{ask.dataset_id}'. No noise was drawn.")
    db.execute(sa.update(schema.spends).where(schema.spends.c.release_id == ask.release_id).values(
        fingerprint=ask.fingerprint, event=json.dumps(accounting.event_to_json(ask.event)), epsilon=ask.own.epsilon,
        delta=ask.own.delta, extra_delta=ask.plan.extra_delta, location=ask.location or prior["location"],
        owner=ask.owner, updated_at=now()))
    return Charge(ask.release_id, "charged (parameters corrected before any noise was drawn)", ask.own, total,
                  ask.budget_epsilon, ask.budget_delta)


def _refuse_reused(ledger, db, ask: Ask, prior) -> Charge:
    raise ReleaseConflict(
        f"release id '{ask.release_id}' was already used (dataset '{prior['dataset_id']}', parameters "
        f"{prior['fingerprint']}) with different data or parameters ({ask.dataset_id}, {ask.fingerprint}); "
        f"choose a new release id")


def _refuse_elsewhere(ledger, db, ask: Ask, prior) -> Charge:
    raise ReleaseConflict(
        f"release id '{ask.release_id}' was measured in {prior['location']}: it is drawn once, in one place; "
        f"resume it there (its output_dir), or choose a new release id")


def _refuse_lost(ledger, db, ask: Ask, prior) -> Charge:
    raise ReleaseConflict(
        f"release id '{ask.release_id}' was measured (its noise committed) but its measurements are not in "
        f"{ask.location}: it is drawn once; restore its run folder, or choose a new release id")


def _again(ledger, db, ask: Ask, prior) -> Charge:
    """An earlier attempt drew noise and failed before its commit: it ran the mechanism, and this one runs it once
    more."""
    total = _composed(ledger, db, ask)
    if not ask.within(total):
        raise _over_budget(ledger, db, ask, total)
    c = schema.spends.c
    db.execute(sa.update(schema.spends).where(c.release_id == ask.release_id).values(
        attempts=c.attempts + 1, extra_delta=c.extra_delta + ask.plan.extra_delta, status="charged",
        owner=ask.owner, updated_at=now()))
    return Charge(ask.release_id, "charged again: an earlier attempt drew noise and failed before its commit",
                  ask.own, total, ask.budget_epsilon, ask.budget_delta)


def _take_over(ledger, db, ask: Ask, prior) -> Charge:
    """Nothing drawn yet: this run takes the release over (see `Spends.begin_draw`)."""
    db.execute(sa.update(schema.spends).where(schema.spends.c.release_id == ask.release_id).values(
        location=ask.location or prior["location"], owner=ask.owner))
    return _unchanged(ledger, db, ask, prior)


def _unchanged(ledger, db, ask: Ask, prior) -> Charge:
    return Charge(ask.release_id, "already charged", ask.own,
                  ledger._total_locked(db, ask.dataset_id, ask.budget_delta), ask.budget_epsilon, ask.budget_delta)


# ---- the checks ----------------------------------------------------------------------------------------------------
def _alone_over(ask: Ask, prior) -> bool:
    return ask.plan.epsilon_floor(ask.budget_delta) > ask.budget_epsilon * (1 + _TOLERANCE)


def _always(ask: Ask, prior) -> bool:
    return True


def _corrected(ask: Ask, prior) -> bool:
    return (ask.redraw and prior["dataset_id"] == ask.dataset_id and prior["fingerprint"] != ask.fingerprint
            and prior["attempts"] == 1)


def _reused(ask: Ask, prior) -> bool:
    return prior["dataset_id"] != ask.dataset_id or prior["fingerprint"] != ask.fingerprint


def _elsewhere(ask: Ask, prior) -> bool:
    return bool(ask.location and prior["location"] and prior["location"] != ask.location)


def _redraw(ask: Ask, prior) -> bool:
    return ask.redraw


_DRAWN = frozenset({"drawing", "measured", "published"})
_COMMITTED = frozenset({"measured", "published"})

#: The charge's rules, in the order they are tried.
TRANSITIONS = (
    Transition("its own epsilon over the budget", frozenset({NEW}), None, _alone_over, _refuse_alone),
    Transition("first charge", frozenset({NEW}), "charged", _always, _first),
    Transition("parameters corrected before any draw", frozenset({"charged"}), "charged", _corrected, _correct),
    Transition("release id reused for other data or parameters", RECORDED, None, _reused, _refuse_reused),
    Transition("drawn in another run folder", _DRAWN, None, _elsewhere, _refuse_elsewhere),
    Transition("committed, its measurements missing", _COMMITTED, None, _redraw, _refuse_lost),
    Transition("a failed draw, charged again", frozenset({"drawing"}), "charged", _redraw, _again),
    Transition("taken over by the newest run", frozenset({"charged"}), "charged", _redraw, _take_over),
    Transition("already charged", RECORDED, UNCHANGED, _always, _unchanged),
)


def decide(ask: Ask, prior: Mapping | None, rules: tuple[Transition, ...] = TRANSITIONS) -> Transition:
    """The first rule that starts from the release's status and whose check holds (the last rule of a status
    always holds)."""
    state = NEW if prior is None else prior["status"]
    for rule in rules:
        if state in rule.from_states and rule.check(ask, prior):
            return rule
    raise ReleaseConflict(f"release '{ask.release_id}' has the status '{state}', which this dprelease does not know: "
                          f"nothing was charged")
