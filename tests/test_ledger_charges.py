"""`Spends.charge`'s table of transitions (tasks/ledger/charges.py) decides every charge as the nested conditions it
replaced did: checked by exhaustive search over every status a release can be in and every combination of what a
charge asks that the conditions read (the acts themselves are tested through the ledger, tests/test_ledger.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tasks.ledger.charges import NEW, TRANSITIONS, Ask, decide


@dataclass(frozen=True)
class _Plan:
    """What the rules read of a plan: the least epsilon of the release alone."""
    floor: float

    def epsilon_floor(self, delta: float) -> float:
        return self.floor


def _before(ask: Ask, prior: dict | None) -> str:
    """The decision of `Spends.charge` before the table (the conditions of its body, in their order), as the name of
    the rule that now makes it."""
    if prior is None:
        alone = ask.plan.epsilon_floor(ask.budget_delta) > ask.budget_epsilon * (1 + 1e-12)
        return "its own epsilon over the budget" if alone else "first charge"
    untouched = prior["status"] == "charged" and prior["attempts"] == 1
    if prior["dataset_id"] == ask.dataset_id and prior["fingerprint"] != ask.fingerprint and untouched and ask.redraw:
        return "parameters corrected before any draw"
    if prior["dataset_id"] != ask.dataset_id or prior["fingerprint"] != ask.fingerprint:
        return "release id reused for other data or parameters"
    if ask.location and prior["location"] and prior["location"] != ask.location and prior["status"] != "charged":
        return "drawn in another run folder"
    if ask.redraw and prior["status"] in ("measured", "published"):
        return "committed, its measurements missing"
    if not (ask.redraw and prior["status"] == "drawing"):
        return "taken over by the newest run" if ask.redraw else "already charged"
    return "a failed draw, charged again"


def _ask(redraw: bool, location: str | None, floor: float = 0.5) -> Ask:
    return Ask("d", "r", "kmeans", "f", _Plan(floor), None, redraw, location, "A", 1.0, 1e-6)


def test_the_table_decides_every_charge_as_the_conditions_it_replaced():
    cases = 0
    for floor, redraw, location in itertools.product((0.5, 2.0), (False, True), (None, "/a", "/b")):
        ask = _ask(redraw, location, floor)
        assert decide(ask, None).name == _before(ask, None)
        cases += 1
        for status, dataset, fingerprint, attempts, held in itertools.product(
                ("charged", "drawing", "measured", "published"), ("d", "e"), ("f", "g"), (1, 2), (None, "/a")):
            prior = {"status": status, "dataset_id": dataset, "fingerprint": fingerprint, "attempts": attempts,
                     "location": held}
            assert decide(ask, prior).name == _before(ask, prior), (ask, prior)
            cases += 1
    assert cases == 12 + 12 * 64


def test_every_status_ends_in_a_rule_that_always_applies_and_refusals_change_nothing():
    """Read top to bottom, the table is total: each status's last rule holds whatever is asked; a refusal's
    to-state is None (nothing written)."""
    for status in (NEW, "charged", "drawing", "measured", "published"):
        last = [t for t in TRANSITIONS if status in t.from_states][-1]
        assert last.name in ("first charge", "already charged")
    assert {t.name for t in TRANSITIONS if t.to_state is None} == {
        "its own epsilon over the budget", "release id reused for other data or parameters",
        "drawn in another run folder", "committed, its measurements missing"}
