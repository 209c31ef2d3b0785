"""Budgets and spends: every dataset's lifetime (epsilon, delta), its history of changes, and every release's
spend, composed with Google's `dp_accounting` (`dpalgos.accounting`).

A release is charged BEFORE any noise is drawn, in one write transaction that serialises concurrent releases of the
ledger: two releases started at once cannot both pass the budget check. Charging the same release id again is a
no-op, so retries and resumed runs are charged once, except when an earlier attempt drew noise and failed before
committing it: that attempt counts as a run of the mechanism, and the retry is charged again (`attempts`; see
tasks/stages.py). Statuses: charged -> drawing (noise is being drawn, nothing committed) -> measured -> published.

A budget is an operator's decision, and every change of it is kept (`budget_changes`: when, the old and new
budget, the spend at the time, the operator's reason); raising the budget of a dataset that has spent any of it
needs a reason (a review raised an exhausted budget and nothing showed it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpalgos.lazy import module
from tasks.errors import BudgetExceeded, NoBudget, ReleaseConflict
from tasks.ledger.bindings import data_source, source_digest
from tasks.ledger.store import now

if TYPE_CHECKING:
    from dp_accounting import dp_event as dpe

    from dpalgos.plan import Plan

#: dp_accounting takes most of a second to load; the checks before a run read budgets and bindings without it.
accounting = module("dpalgos.accounting")
#: Relative slack on the budget comparison, for the floating-point sum of equal shares.
_TOLERANCE = 1e-12
#: The largest lifetime epsilon a dataset may be given: beyond it a guarantee says nothing (e^100 ~ 10^43) and a
#: typo (1e308 was accepted) would leave the ledger without a limit. Releases are capped alike (tasks.params).
MAX_LIFETIME_EPSILON = 100.0


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


class Spends:
    """Budgets, their history and the spends of releases (a part of `PrivacyLedger`)."""

    def set_budget(self, dataset_id: str, epsilon: float, delta: float, source: str | None = None,
                   reading: dict | None = None, reason: str | None = None) -> None:
        """Set (or change) a dataset's lifetime budget: an explicit operator decision, recorded in the budget's
        history with `reason`, which is required to raise the budget of a dataset that has spent any of it.
        `source` binds the dataset id to its data (`data_source`; None keeps the bound one; a budget bound to none
        is bound by its first release) with its content digest; `reading` (`tasks.params.dataset_reading`, with the
        exact `path` releases read: see `bindings.check_reading`) binds how its data is read, else its first
        release does. Its fields may differ from the bound ones only while the dataset has no release: a release's
        privacy unit is what the reading makes one record, and releases of two units do not compose."""
        if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_LIFETIME_EPSILON) or not 0 <= delta < 1:
            raise ValueError(f"need 0 < epsilon <= {MAX_LIFETIME_EPSILON:g} and 0 <= delta < 1, got ({epsilon}, "
                             f"{delta})")
        where = None if source is None else data_source(source)
        digest = None if where is None else source_digest(where)  # before the lock: a folder takes a while to read
        with self._transaction(immediate=True) as db:
            old = db.execute("SELECT epsilon, delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
            spent = self._total_locked(db, dataset_id, old["delta"]).epsilon if old else 0.0
            if old and (epsilon > old["epsilon"] or delta > old["delta"]) and spent > 0 and not (reason or "").strip():
                raise ReleaseConflict(f"dataset '{dataset_id}' has spent epsilon={spent:.6g} of its budget "
                                      f"epsilon={old['epsilon']:g}, delta={old['delta']:g}: raising it needs a reason "
                                      f"(`dprelease budget set {dataset_id} ... --reason TEXT`), kept in its history. "
                                      f"Nothing was changed")
            if where is not None:
                self._one_id_per_source_locked(db, dataset_id, where, digest)
            if reading is not None:
                self._check_rebinding_locked(db, dataset_id, reading)
            db.execute("INSERT INTO budgets (dataset_id, epsilon, delta, updated_at, source, reading, source_digest) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(dataset_id) DO UPDATE SET epsilon=excluded.epsilon, "
                       "delta=excluded.delta, updated_at=excluded.updated_at, "
                       "source=COALESCE(excluded.source, budgets.source), "
                       "source_digest=COALESCE(excluded.source_digest, budgets.source_digest), "
                       "reading=COALESCE(excluded.reading, budgets.reading)",
                       (dataset_id, epsilon, delta, now(), where,
                        None if reading is None else json.dumps(reading, sort_keys=True), digest))
            # seq orders a budget's history (one after the last, under the writers' lock)
            db.execute("INSERT INTO budget_changes (seq, dataset_id, changed_at, old_epsilon, old_delta, new_epsilon, "
                       "new_delta, spent_epsilon, reason) VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM "
                       "budget_changes), ?, ?, ?, ?, ?, ?, ?, ?)",
                       (dataset_id, now(), old["epsilon"] if old else None, old["delta"] if old else None, epsilon,
                        delta, spent, (reason or "").strip() or None))

    def budget(self, dataset_id: str) -> tuple[float, float] | None:
        with self._transaction() as db:
            row = db.execute("SELECT epsilon, delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        return (row["epsilon"], row["delta"]) if row else None

    def budget_history(self, dataset_id: str) -> list[dict]:
        """Every change of the dataset's budget, oldest first."""
        with self._transaction() as db:
            return [dict(r) for r in db.execute(
                "SELECT dataset_id, changed_at, old_epsilon, old_delta, new_epsilon, new_delta, spent_epsilon, reason "
                "FROM budget_changes WHERE dataset_id=? ORDER BY seq", (dataset_id,))]

    def charge(self, *, dataset_id: str, release_id: str, kind: str, fingerprint: str, plan: Plan,
               release_delta: float | None = None, redraw: bool = False, location: str | None = None,
               owner: str | None = None, dry_run: bool = False, source: str | None = None,
               reading: dict | None = None) -> Charge:
        """Record the spend of `release_id` (its plan's event) unless it is recorded already; refuse it if over budget.

        redraw : the measurements are not committed here. If an earlier attempt drew noise and did not commit
        (status 'drawing'), this attempt is charged again. If the release was measured or published, its noise
        was committed once: there is nothing to redraw, the run is refused.
        location : the run folder whose measurements/ this release id draws into. Once noise was drawn for the
        id, a run in another folder is refused (it would publish a second, independent release under one charge).
        owner : the run that may draw (see `begin_draw`): a release that nothing has drawn yet is taken over by
        the newest run; an older run that then reaches its first draw is refused before drawing.

        The release's own guarantee is its plan's (`Plan.guarantee`) at `release_delta` (its spec's target) when
        given, else at the budget's delta; the budget check composes everything at the budget's delta, less the sum
        of the releases' extra deltas (`Plan.extra_delta`). The dataset's lifetime budget is the one an operator set
        (`set_budget`); a dataset without one is refused.

        dry_run : every check and refusal of the charge, nothing recorded (a run's check before it reads data).
        source : the data the release reads (`data_source`): it must be the dataset's bound source or inside it;
        a dataset bound to none is bound to it here. Without it (the ledger's own tests) nothing is checked.
        reading : how the release reads the data and what one record is (`tasks.params.dataset_reading`): bound
        by the operator (`set_budget`) or else by the dataset's first release, then the same for every release.
        """
        extra_delta = plan.extra_delta
        digest = source_digest(data_source(source)) if source is not None and self.source(dataset_id) is None else None
        with self._transaction(immediate=True, keep=not dry_run) as db:
            bud_eps, bud_delta = self._budget_locked(db, dataset_id)
            if source is not None:
                self._bind_locked(db, dataset_id, data_source(source), reading, digest)
            if release_delta and release_delta > bud_delta:
                raise BudgetExceeded(f"release '{release_id}' asks delta={release_delta:g}, above the lifetime delta "
                                     f"{bud_delta:g} of dataset '{dataset_id}'. No noise was drawn.")
            prior = db.execute("SELECT * FROM spends WHERE release_id=?", (release_id,)).fetchone()
            if prior is None and plan.epsilon_floor(bud_delta) > bud_eps * (1 + _TOLERANCE):
                raise BudgetExceeded(
                    f"release '{release_id}' would exceed the lifetime budget of dataset '{dataset_id}': its own "
                    f"epsilon at delta={bud_delta:g} is at least {plan.epsilon_floor(bud_delta):.6g} > budget "
                    f"{bud_eps:.6g}. No noise was drawn.")
            event, own = plan.event(), plan.guarantee(release_delta or bud_delta)
            if prior is not None:
                untouched = prior["status"] == "charged" and prior["attempts"] == 1
                if prior["dataset_id"] == dataset_id and prior["fingerprint"] != fingerprint and untouched and redraw:
                    # Charged once, never drawn: the rerun corrects a parameter or a public input. The charge is
                    # for the release, not the typo: its event is replaced, against the budget.
                    return self._recharge_locked(db, prior, dataset_id, fingerprint, event, own, extra_delta,
                                                 location, owner, bud_eps, bud_delta)
                if prior["dataset_id"] != dataset_id or prior["fingerprint"] != fingerprint:
                    raise ReleaseConflict(
                        f"release id '{release_id}' was already used (dataset '{prior['dataset_id']}', "
                        f"parameters {prior['fingerprint']}) with different data or parameters "
                        f"({dataset_id}, {fingerprint}); choose a new release id")
                if location and prior["location"] and prior["location"] != location and prior["status"] != "charged":
                    raise ReleaseConflict(
                        f"release id '{release_id}' was measured in {prior['location']}: it is drawn once, "
                        f"in one place; resume it there (its output_dir), or choose a new release id")
                if redraw and prior["status"] in ("measured", "published"):
                    raise ReleaseConflict(
                        f"release id '{release_id}' was measured (its noise committed) but its measurements are not "
                        f"in {location}: it is drawn once; restore its run folder, or choose a new release id")
                if not (redraw and prior["status"] == "drawing"):
                    if redraw:  # nothing drawn yet: this run takes the release over (see `begin_draw`)
                        db.execute("UPDATE spends SET location=?, owner=? WHERE release_id=?",
                                   (location or prior["location"], owner, release_id))
                    return Charge(release_id, "already charged", own, self._total_locked(db, dataset_id, bud_delta),
                                  bud_eps, bud_delta)
            events, extra = self._events_locked(db, dataset_id)
            total = accounting.epsilon_at(accounting.compose_events(events + [event]), bud_delta, extra + extra_delta)
            if total.epsilon > bud_eps * (1 + _TOLERANCE):
                spent = self._total_locked(db, dataset_id, bud_delta).epsilon
                raise BudgetExceeded(
                    f"release '{release_id}' (epsilon={own.epsilon:.6g}) would exceed the lifetime budget of "
                    f"dataset '{dataset_id}': spent epsilon={spent:.6g}, composed total would be "
                    f"{total.epsilon:.6g} > budget {bud_eps:.6g} (delta={bud_delta:g}). No noise was drawn.")
            stamp = now()
            if prior is not None:
                db.execute("UPDATE spends SET attempts=attempts+1, extra_delta=extra_delta+?, status='charged', "
                           "owner=?, updated_at=? WHERE release_id=?", (extra_delta, owner, stamp, release_id))
                return Charge(release_id, "charged again: an earlier attempt drew noise and failed before its "
                                          "commit", own, total, bud_eps, bud_delta)
            db.execute("INSERT INTO spends (release_id, dataset_id, kind, fingerprint, event, epsilon, delta, "
                       "status, created_at, updated_at, attempts, location, extra_delta, owner) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, 'charged', ?, ?, 1, ?, ?, ?)",
                       (release_id, dataset_id, kind, fingerprint, json.dumps(accounting.event_to_json(event)),
                        own.epsilon, own.delta, stamp, stamp, location, extra_delta, owner))
            return Charge(release_id, "charged", own, total, bud_eps, bud_delta)

    def _recharge_locked(self, db, prior, dataset_id, fingerprint, event, own, extra_delta, location, owner,
                         bud_eps, bud_delta) -> Charge:
        events, extra = self._events_locked(db, dataset_id, exclude=prior["release_id"])
        total = accounting.epsilon_at(accounting.compose_events(events + [event]), bud_delta, extra + extra_delta)
        if total.epsilon > bud_eps * (1 + _TOLERANCE):
            raise BudgetExceeded(f"release '{prior['release_id']}' with its new parameters would exceed the lifetime "
                                 f"budget of dataset '{dataset_id}'. No noise was drawn.")
        db.execute("UPDATE spends SET fingerprint=?, event=?, epsilon=?, delta=?, extra_delta=?, location=?, owner=?, "
                   "updated_at=? WHERE release_id=?",
                   (fingerprint, json.dumps(accounting.event_to_json(event)), own.epsilon, own.delta, extra_delta,
                    location or prior["location"], owner, now(), prior["release_id"]))
        return Charge(prior["release_id"], "charged (parameters corrected before any noise was drawn)", own, total,
                      bud_eps, bud_delta)

    def begin_draw(self, release_id: str, owner: str | None) -> None:
        """The lease to draw: status charged -> drawing, only for the run that holds the release (compare and
        set). Called before the first noise draw; a run that lost the release to a newer one is refused here,
        before it draws anything. Repeated by the same run (a retry after a commit whose answer was lost: the
        lease is already its own), it changes nothing and succeeds."""
        with self._transaction(immediate=True) as db:
            n = db.execute("UPDATE spends SET status='drawing', updated_at=? WHERE release_id=? AND "
                           "status IN ('charged', 'drawing') AND owner IS ?",
                           (now(), release_id, owner)).rowcount
        if n != 1:
            raise ReleaseConflict(f"release '{release_id}' was taken over by another run before this one drew any "
                                  f"noise; nothing was drawn here")

    def mark(self, release_id: str, status: str) -> None:
        """Advance a release's status: charged -> measured -> published."""
        with self._transaction(immediate=True) as db:
            n = db.execute("UPDATE spends SET status=?, updated_at=? WHERE release_id=?",
                           (status, now(), release_id)).rowcount
        if n != 1:
            raise ReleaseConflict(f"release '{release_id}' is not in the ledger {self.name}")

    def status(self, release_id: str) -> str | None:
        with self._transaction() as db:
            row = db.execute("SELECT status FROM spends WHERE release_id=?", (release_id,)).fetchone()
        return row["status"] if row else None

    def releases(self, dataset_id: str) -> list[dict]:
        with self._transaction() as db:
            rows = db.execute("SELECT release_id, kind, epsilon, delta, status, attempts, location, created_at "
                              "FROM spends WHERE dataset_id=?", (dataset_id,)).fetchall()
        return sorted((dict(r) for r in rows), key=_in_order)

    def every_release(self, dataset_id: str | None = None) -> list[dict]:
        """Every release of the ledger (or of one dataset), with what reconciling it needs: its dataset, kind, status,
        where it was drawn and when its status last changed; in the order they were charged."""
        with self._transaction() as db:
            columns = ("SELECT release_id, dataset_id, kind, epsilon, delta, status, attempts, location, created_at, "
                       "updated_at FROM spends")
            rows = (db.execute(columns).fetchall() if dataset_id is None else
                    db.execute(columns + " WHERE dataset_id=?", (dataset_id,)).fetchall())
        return sorted((dict(r) for r in rows), key=_in_order)

    def spent(self, dataset_id: str) -> accounting.Guarantee:
        """The composed guarantee of every release of the dataset, at its budget's delta."""
        with self._transaction() as db:
            row = db.execute("SELECT delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
            return self._total_locked(db, dataset_id, row["delta"] if row else 0.0)

    @staticmethod
    def _events_locked(db, dataset_id: str, exclude: str | None = None) -> tuple[list[dpe.DpEvent], float]:
        """Every spend of the dataset (each attempt that drew noise counts) and the sum of their extra deltas."""
        rows = sorted(db.execute("SELECT release_id, created_at, event, attempts, extra_delta FROM spends WHERE "
                                 "dataset_id=? AND release_id IS NOT ?", (dataset_id, exclude)), key=_in_order)
        events = []
        for r in rows:
            event = accounting.event_from_json(json.loads(r["event"]))
            events.append(event if r["attempts"] == 1 else accounting.dpe.SelfComposedDpEvent(event, r["attempts"]))
        return events, math.fsum(r["extra_delta"] for r in rows)

    def _total_locked(self, db, dataset_id: str, delta: float) -> accounting.Guarantee:
        events, extra = self._events_locked(db, dataset_id)
        if not events:
            return accounting.Guarantee(0.0, 0.0, "no releases")
        return accounting.epsilon_at(accounting.compose_events(events), delta, extra)

    def _budget_locked(self, db, dataset_id: str) -> tuple[float, float]:
        row = db.execute("SELECT epsilon, delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        if row is None:
            raise NoBudget(no_budget_message(dataset_id, self.name))
        return row["epsilon"], row["delta"]


def _in_order(row) -> tuple[str, str]:
    """Releases in the order they were charged, the same on every backend and collation (the composition's
    floating-point sums then are too: a migration compares them)."""
    return row["created_at"], row["release_id"]


def no_budget_message(dataset_id: str, where) -> str:
    return (f"dataset '{dataset_id}' has no lifetime budget in the ledger {where}: an operator sets one with "
            f"`dprelease budget set {dataset_id} --epsilon E --delta D --source DATA --reading-from SPEC` (the data "
            f"the id stands for, and the specs whose reading of it they reviewed). Nothing was run")
