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
from typing import TYPE_CHECKING

from dpalgos.lazy import module
from tasks.errors import BudgetExceeded, NoBudget, ReleaseConflict
from tasks.ledger import schema
from tasks.ledger.bindings import data_source, source_digest
from tasks.ledger.charges import Ask, Charge, accounting, decide
from tasks.ledger.store import now

sa = module("sqlalchemy")

if TYPE_CHECKING:
    from dp_accounting import dp_event as dpe

    from dpalgos.plan import Plan

__all__ = ["Charge", "MAX_LIFETIME_EPSILON", "Spends", "no_budget_message"]

#: The largest lifetime epsilon a dataset may be given: beyond it a guarantee says nothing (e^100 ~ 10^43) and a
#: typo (1e308 was accepted) would leave the ledger without a limit. Releases are capped alike (tasks.params).
MAX_LIFETIME_EPSILON = 100.0


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
            budgets = schema.budgets
            old = db.execute(sa.select(budgets).where(budgets.c.dataset_id == dataset_id)).mappings().first()
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
            # A source, digest or reading not given keeps the bound one (read above, under the writers' lock).
            row = {"epsilon": epsilon, "delta": delta, "updated_at": now(), "source": where, "source_digest": digest,
                   "reading": None if reading is None else json.dumps(reading, sort_keys=True)}
            row = {k: v for k, v in row.items() if v is not None or old is None}
            db.execute(sa.insert(budgets).values(dataset_id=dataset_id, **row) if old is None else
                       sa.update(budgets).where(budgets.c.dataset_id == dataset_id).values(**row))
            # seq orders a budget's history (one after the last, under the writers' lock)
            last = db.execute(sa.select(sa.func.coalesce(sa.func.max(schema.budget_changes.c.seq), 0))).scalar()
            db.execute(sa.insert(schema.budget_changes).values(
                seq=last + 1, dataset_id=dataset_id, changed_at=now(), old_epsilon=old["epsilon"] if old else None,
                old_delta=old["delta"] if old else None, new_epsilon=epsilon, new_delta=delta, spent_epsilon=spent,
                reason=(reason or "").strip() or None))

    def budget(self, dataset_id: str) -> tuple[float, float] | None:
        with self._transaction() as db:
            row = db.execute(sa.select(schema.budgets.c.epsilon, schema.budgets.c.delta)
                             .where(schema.budgets.c.dataset_id == dataset_id)).first()
        return (row.epsilon, row.delta) if row else None

    def budget_history(self, dataset_id: str) -> list[dict]:
        """Every change of the dataset's budget, oldest first."""
        c = schema.budget_changes.c
        with self._transaction() as db:
            return [dict(r) for r in db.execute(
                sa.select(c.dataset_id, c.changed_at, c.old_epsilon, c.old_delta, c.new_epsilon, c.new_delta,
                          c.spent_epsilon, c.reason).where(c.dataset_id == dataset_id).order_by(c.seq)).mappings()]

    def charge(self, *, dataset_id: str, release_id: str, kind: str, fingerprint: str, plan: Plan,
               release_delta: float | None = None, redraw: bool = False, location: str | None = None,
               owner: str | None = None, dry_run: bool = False, source: str | None = None,
               reading: dict | None = None) -> Charge:
        """Record the spend of `release_id` (its plan's event) unless it is recorded already; refuse it if over budget.
        What a charge does with a release the ledger holds in a given status is `charges.TRANSITIONS`, a table
        read top to bottom (the first rule whose statuses and check match decides).

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
        digest = source_digest(data_source(source)) if source is not None and self.source(dataset_id) is None else None
        with self._transaction(immediate=True, keep=not dry_run) as db:
            bud_eps, bud_delta = self._budget_locked(db, dataset_id)
            if source is not None:
                self._bind_locked(db, dataset_id, data_source(source), reading, digest)
            if release_delta and release_delta > bud_delta:
                raise BudgetExceeded(f"release '{release_id}' asks delta={release_delta:g}, above the lifetime delta "
                                     f"{bud_delta:g} of dataset '{dataset_id}'. No noise was drawn.")
            ask = Ask(dataset_id, release_id, kind, fingerprint, plan, release_delta, redraw, location, owner,
                      bud_eps, bud_delta)
            table = schema.spends
            prior = db.execute(sa.select(table).where(table.c.release_id == release_id)).mappings().first()
            return decide(ask, prior).act(self, db, ask, prior)

    def begin_draw(self, release_id: str, owner: str | None) -> None:
        """The lease to draw: status charged -> drawing, only for the run that holds the release (compare and
        set). Called before the first noise draw; a run that lost the release to a newer one is refused here,
        before it draws anything. Repeated by the same run (a retry after a commit whose answer was lost: the
        lease is already its own), it changes nothing and succeeds."""
        c = schema.spends.c
        with self._transaction(immediate=True) as db:
            n = db.execute(sa.update(schema.spends).where(c.release_id == release_id,
                                                          c.status.in_(("charged", "drawing")),
                                                          c.owner.is_not_distinct_from(owner))
                           .values(status="drawing", updated_at=now())).rowcount
        if n != 1:
            raise ReleaseConflict(f"release '{release_id}' was taken over by another run before this one drew any "
                                  f"noise; nothing was drawn here")

    def mark(self, release_id: str, status: str) -> None:
        """Advance a release's status: charged -> measured -> published."""
        with self._transaction(immediate=True) as db:
            n = db.execute(sa.update(schema.spends).where(schema.spends.c.release_id == release_id)
                           .values(status=status, updated_at=now())).rowcount
        if n != 1:
            raise ReleaseConflict(f"release '{release_id}' is not in the ledger {self.name}")

    def status(self, release_id: str) -> str | None:
        c = schema.spends.c
        with self._transaction() as db:
            return db.execute(sa.select(c.status).where(c.release_id == release_id)).scalar()

    def releases(self, dataset_id: str) -> list[dict]:
        c = schema.spends.c
        with self._transaction() as db:
            rows = db.execute(sa.select(c.release_id, c.kind, c.epsilon, c.delta, c.status, c.attempts, c.location,
                                        c.created_at).where(c.dataset_id == dataset_id)).mappings().all()
        return sorted((dict(r) for r in rows), key=_in_order)

    def every_release(self, dataset_id: str | None = None) -> list[dict]:
        """Every release of the ledger (or of one dataset), with what reconciling it needs: its dataset, kind, status,
        where it was drawn and when its status last changed; in the order they were charged."""
        c = schema.spends.c
        query = sa.select(c.release_id, c.dataset_id, c.kind, c.epsilon, c.delta, c.status, c.attempts, c.location,
                          c.created_at, c.updated_at)
        if dataset_id is not None:
            query = query.where(c.dataset_id == dataset_id)
        with self._transaction() as db:
            rows = db.execute(query).mappings().all()
        return sorted((dict(r) for r in rows), key=_in_order)

    def spent(self, dataset_id: str) -> accounting.Guarantee:
        """The composed guarantee of every release of the dataset, at its budget's delta."""
        c = schema.budgets.c
        with self._transaction() as db:
            delta = db.execute(sa.select(c.delta).where(c.dataset_id == dataset_id)).scalar()
            return self._total_locked(db, dataset_id, 0.0 if delta is None else delta)

    @staticmethod
    def _events_locked(db, dataset_id: str, exclude: str | None = None) -> tuple[list[dpe.DpEvent], float]:
        """Every spend of the dataset (each attempt that drew noise counts) and the sum of their extra deltas."""
        c = schema.spends.c
        query = sa.select(c.release_id, c.created_at, c.event, c.attempts, c.extra_delta).where(
            c.dataset_id == dataset_id)
        if exclude is not None:
            query = query.where(c.release_id != exclude)
        rows = sorted(db.execute(query).mappings(), key=_in_order)
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
        row = db.execute(sa.select(schema.budgets.c.epsilon, schema.budgets.c.delta)
                         .where(schema.budgets.c.dataset_id == dataset_id)).first()
        if row is None:
            raise NoBudget(no_budget_message(dataset_id, self.name))
        return row.epsilon, row.delta


def _in_order(row) -> tuple[str, str]:
    """Releases in the order they were charged, the same on every backend and collation (the composition's
    floating-point sums then are too: a migration compares them)."""
    return row["created_at"], row["release_id"]


def no_budget_message(dataset_id: str, where) -> str:
    return (f"dataset '{dataset_id}' has no lifetime budget in the ledger {where}: an operator sets one with "
            f"`dprelease budget set {dataset_id} --epsilon E --delta D --source DATA --reading-from SPEC` (the data "
            f"the id stands for, and the specs whose reading of it they reviewed). Nothing was run")
