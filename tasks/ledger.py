"""The privacy ledger: a durable SQLite record of every release's spend, per dataset, against a lifetime
budget. Spends are stored as `dp_accounting` events and composed with it (`dpalgos.accounting`).

A release is charged BEFORE any noise is drawn, in one write transaction (`BEGIN IMMEDIATE`) that
serialises concurrent releases of the same ledger: two releases started at once cannot both pass the
budget check. Charging the same release id again is a no-op, so retries and resumed runs are charged once,
except when an earlier attempt drew noise and failed before committing it: that attempt counts as a run of
the mechanism, and the retry is charged again (`attempts`; see tasks/stages.py).

Statuses: charged -> drawing (noise is being drawn, nothing committed) -> measured -> published.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from dp_accounting import dp_event as dpe

from dpalgos import accounting
from tasks.errors import BudgetExceeded, ReleaseConflict, ReleaseError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS spends (
    release_id TEXT PRIMARY KEY, dataset_id TEXT NOT NULL, kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
    event TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, status TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 1, location TEXT);
CREATE INDEX IF NOT EXISTS spends_by_dataset ON spends (dataset_id);
"""
#: Relative slack on the budget comparison, for the floating-point sum of equal shares.
_TOLERANCE = 1e-12


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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


class PrivacyLedger:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = self._connect()
        try:
            db.executescript(_SCHEMA)  # runs in its own transaction
            columns = [r[1] for r in db.execute("PRAGMA table_info(spends)")]
            if "attempts" not in columns:  # a ledger written before attempts were recorded
                db.execute("ALTER TABLE spends ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1")
            if "location" not in columns:  # ... or before run folders were recorded
                db.execute("ALTER TABLE spends ADD COLUMN location TEXT")
        except sqlite3.DatabaseError as exc:
            raise ReleaseError(f"privacy ledger {self.path} is unusable: {exc}") from None
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(self.path, timeout=120, isolation_level=None)
        except sqlite3.Error as exc:
            raise ReleaseError(f"cannot open privacy ledger {self.path}: {exc}") from None

    @contextmanager
    def _transaction(self, immediate: bool = False):
        db = self._connect()
        try:
            db.row_factory = sqlite3.Row
            db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            yield db
            db.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            db.rollback()
            raise ReleaseError(f"privacy ledger {self.path} is unusable: {exc}") from None
        except BaseException:
            db.rollback()
            raise
        finally:
            db.close()

    def set_budget(self, dataset_id: str, epsilon: float, delta: float) -> None:
        """Set (or change) a dataset's lifetime budget: an explicit operator decision."""
        if not epsilon > 0 or not 0 <= delta < 1:
            raise ValueError(f"need epsilon > 0 and 0 <= delta < 1, got ({epsilon}, {delta})")
        with self._transaction(immediate=True) as db:
            db.execute("INSERT INTO budgets VALUES (?, ?, ?, ?) ON CONFLICT(dataset_id) DO UPDATE SET "
                       "epsilon=excluded.epsilon, delta=excluded.delta, updated_at=excluded.updated_at",
                       (dataset_id, epsilon, delta, _now()))

    def budget(self, dataset_id: str) -> tuple[float, float] | None:
        with self._transaction() as db:
            row = db.execute("SELECT epsilon, delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        return (row["epsilon"], row["delta"]) if row else None

    def charge(self, *, dataset_id: str, release_id: str, kind: str, fingerprint: str, event: dpe.DpEvent,
               budget: tuple[float, float], release_delta: float | None = None, redraw: bool = False,
               location: str | None = None) -> Charge:
        """Record the spend of `release_id` unless it is recorded already; refuse it if over budget.

        redraw : the measurements are not committed. If an earlier attempt of this release drew noise
        (status 'drawing'), this attempt is charged again.
        location : the run folder whose measurements/ this release id draws into. A release id is drawn in
        one place only: once noise was drawn for it, a run in another folder is refused (it would publish a
        second, independent release under one charge).

        The release's own guarantee is stated at `release_delta` (its spec's target) when given, else at the
        budget's delta; the budget check composes everything at the budget's delta.

        `budget` (epsilon, delta) is registered as the dataset's lifetime budget on its first release;
        a later spec that disagrees with the ledger is refused (change budgets with `set_budget`).
        """
        with self._transaction(immediate=True) as db:
            bud_eps, bud_delta = self._budget_locked(db, dataset_id, budget)
            prior = db.execute("SELECT * FROM spends WHERE release_id=?", (release_id,)).fetchone()
            own = accounting.release_guarantee(event, release_delta or bud_delta)
            if prior is not None:
                if prior["dataset_id"] != dataset_id or prior["fingerprint"] != fingerprint:
                    raise ReleaseConflict(
                        f"release id '{release_id}' was already used (dataset '{prior['dataset_id']}', "
                        f"parameters {prior['fingerprint']}) with different data or parameters "
                        f"({dataset_id}, {fingerprint}); choose a new release id")
                if location and prior["location"] and prior["location"] != location:
                    if prior["status"] != "charged":
                        raise ReleaseConflict(
                            f"release id '{release_id}' was measured in {prior['location']}: it is drawn once, "
                            f"in one place; resume it there (its output_dir), or choose a new release id")
                    db.execute("UPDATE spends SET location=? WHERE release_id=?", (location, release_id))
                if not (redraw and prior["status"] == "drawing"):
                    total = accounting.epsilon_at(accounting.compose_events(self._events_locked(db, dataset_id)),
                                                  bud_delta)
                    return Charge(release_id, "already charged", own, total, bud_eps, bud_delta)
            events = self._events_locked(db, dataset_id) + [event]
            total = accounting.epsilon_at(accounting.compose_events(events), bud_delta)
            if total.epsilon > bud_eps * (1 + _TOLERANCE):
                spent = (accounting.epsilon_at(accounting.compose_events(events[:-1]), bud_delta).epsilon
                         if len(events) > 1 else 0.0)
                raise BudgetExceeded(
                    f"release '{release_id}' (epsilon={own.epsilon:.6g}) would exceed the lifetime budget of "
                    f"dataset '{dataset_id}': spent epsilon={spent:.6g}, composed total would be "
                    f"{total.epsilon:.6g} > budget {bud_eps:.6g} (delta={bud_delta:g}). No noise was drawn.")
            now = _now()
            if prior is not None:
                db.execute("UPDATE spends SET attempts=attempts+1, status='charged', updated_at=? WHERE release_id=?",
                           (now, release_id))
                return Charge(release_id, "charged again: an earlier attempt drew noise and failed before its "
                                          "commit", own, total, bud_eps, bud_delta)
            db.execute("INSERT INTO spends (release_id, dataset_id, kind, fingerprint, event, epsilon, delta, "
                       "status, created_at, updated_at, attempts, location) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, 'charged', ?, ?, 1, ?)",
                       (release_id, dataset_id, kind, fingerprint, json.dumps(accounting.event_to_json(event)),
                        own.epsilon, own.delta, now, now, location))
            return Charge(release_id, "charged", own, total, bud_eps, bud_delta)

    def mark(self, release_id: str, status: str) -> None:
        """Advance a release's status: charged -> measured -> published."""
        with self._transaction(immediate=True) as db:
            n = db.execute("UPDATE spends SET status=?, updated_at=? WHERE release_id=?",
                           (status, _now(), release_id)).rowcount
        if n != 1:
            raise ReleaseConflict(f"release '{release_id}' is not in the ledger {self.path}")

    def status(self, release_id: str) -> str | None:
        with self._transaction() as db:
            row = db.execute("SELECT status FROM spends WHERE release_id=?", (release_id,)).fetchone()
        return row["status"] if row else None

    def releases(self, dataset_id: str) -> list[dict]:
        with self._transaction() as db:
            rows = db.execute("SELECT release_id, kind, epsilon, delta, status, attempts, location, created_at FROM spends "
                              "WHERE dataset_id=? ORDER BY created_at, release_id", (dataset_id,)).fetchall()
        return [dict(r) for r in rows]

    def spent(self, dataset_id: str) -> accounting.Guarantee:
        """The composed guarantee of every release of the dataset, at its budget's delta."""
        with self._transaction() as db:
            events = self._events_locked(db, dataset_id)
            row = db.execute("SELECT delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        if not events:
            return accounting.Guarantee(0.0, 0.0, "no releases")
        return accounting.epsilon_at(accounting.compose_events(events), row["delta"] if row else 0.0)

    @staticmethod
    def _events_locked(db, dataset_id: str) -> list[dpe.DpEvent]:
        rows = db.execute("SELECT event, attempts FROM spends WHERE dataset_id=? ORDER BY created_at", (dataset_id,))
        events = []
        for r in rows:
            event = accounting.event_from_json(json.loads(r["event"]))
            events.append(event if r["attempts"] == 1 else dpe.SelfComposedDpEvent(event, r["attempts"]))
        return events

    @staticmethod
    def _budget_locked(db, dataset_id: str, budget: tuple[float, float]) -> tuple[float, float]:
        row = db.execute("SELECT epsilon, delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        if row is None:
            db.execute("INSERT INTO budgets VALUES (?, ?, ?, ?)", (dataset_id, budget[0], budget[1], _now()))
            return budget
        if (row["epsilon"], row["delta"]) != tuple(budget):
            raise ReleaseConflict(
                f"the ledger holds a lifetime budget of (epsilon={row['epsilon']:g}, delta={row['delta']:g}) for "
                f"dataset '{dataset_id}' but the spec says (epsilon={budget[0]:g}, delta={budget[1]:g}); change "
                f"it explicitly with `dprelease budget set {dataset_id} --epsilon E --delta D`")
        return row["epsilon"], row["delta"]
