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

import hashlib
import json
import math
import shutil
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.errors import BudgetExceeded, NoBudget, ReleaseConflict, ReleaseError
from tasks.example_data import BUILTIN_PREFIX
from tasks import settings

if TYPE_CHECKING:
    from dp_accounting import dp_event as dpe

    from dpalgos import accounting


def _accounting():
    """dpalgos.accounting, imported on first use: dp_accounting takes ~0.6 s to load, and the CLI's checks before
    a run read the ledger (budget, bindings) without accounting anything."""
    from dpalgos import accounting

    return accounting


#: The operator's setting that names the ledger. The ledger is configuration of the machine that runs releases,
#: never a spec field nor a flow parameter: a spec or a UI user choosing the ledger would choose the budget.
LEDGER_ENV = settings.env_of("ledger")


def configured_path() -> Path:
    """The ledger of this machine (`tasks.settings`: $DPRELEASE_LEDGER, else `ledger` in config.toml, else
    $XDG_STATE_HOME/dprelease/privacy-ledger.sqlite: per user, outside any checkout or output folder)."""
    return Path(settings.current().ledger)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS spends (
    release_id TEXT PRIMARY KEY, dataset_id TEXT NOT NULL, kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
    event TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, status TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 1, location TEXT,
    extra_delta REAL NOT NULL DEFAULT 0, owner TEXT);
CREATE INDEX IF NOT EXISTS spends_by_dataset ON spends (dataset_id);
CREATE TABLE IF NOT EXISTS public_inputs (
    path TEXT PRIMARY KEY, sha256 TEXT NOT NULL, source TEXT NOT NULL, registered_at TEXT NOT NULL);
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
            if "extra_delta" not in columns:  # ... or before PTR failure probabilities were
                db.execute("ALTER TABLE spends ADD COLUMN extra_delta REAL NOT NULL DEFAULT 0")
            if "owner" not in columns:
                db.execute("ALTER TABLE spends ADD COLUMN owner TEXT")
            budget_columns = [r[1] for r in db.execute("PRAGMA table_info(budgets)")]
            if "source" not in budget_columns:  # before data sources were bound
                db.execute("ALTER TABLE budgets ADD COLUMN source TEXT")
            if "reading" not in budget_columns:  # ... or how they are read
                db.execute("ALTER TABLE budgets ADD COLUMN reading TEXT")
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
    def _transaction(self, immediate: bool = False, keep: bool = True):
        """keep=False: every check runs as it would, and nothing is written (a dry run)."""
        db = self._connect()
        try:
            db.row_factory = sqlite3.Row
            db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            yield db
            db.execute("COMMIT" if keep else "ROLLBACK")
        except sqlite3.DatabaseError as exc:
            db.rollback()
            raise ReleaseError(f"privacy ledger {self.path} is unusable: {exc}") from None
        except BaseException:
            db.rollback()
            raise
        finally:
            db.close()

    def set_budget(self, dataset_id: str, epsilon: float, delta: float, source: str | None = None,
                   reading: dict | None = None) -> None:
        """Set (or change) a dataset's lifetime budget: an explicit operator decision. `source` binds the dataset
        id to its data (`data_source`; None keeps the bound one; a budget bound to none is bound by its first
        release); `reading` (`tasks.params.dataset_reading`, with the exact `path` releases read: see
        `check_reading`) binds how its data is read, else its first release does. Its fields may differ from the
        bound ones only while the dataset has no release: a release's privacy unit is what the reading makes one
        record, and releases of two units do not compose (releases recorded before readings were leave no bound
        reading: the operator's is then their statement of how those were read)."""
        if not (math.isfinite(epsilon) and epsilon > 0) or not 0 <= delta < 1:
            raise ValueError(f"need a finite epsilon > 0 and 0 <= delta < 1, got ({epsilon}, {delta})")
        with self._transaction(immediate=True) as db:
            if source is not None:
                self._one_id_per_source_locked(db, dataset_id, data_source(source))
            if reading is not None:
                self._check_rebinding_locked(db, dataset_id, reading)
            db.execute("INSERT INTO budgets (dataset_id, epsilon, delta, updated_at, source, reading) "
                       "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(dataset_id) DO UPDATE SET epsilon=excluded.epsilon, "
                       "delta=excluded.delta, updated_at=excluded.updated_at, "
                       "source=COALESCE(excluded.source, budgets.source), "
                       "reading=COALESCE(excluded.reading, budgets.reading)",
                       (dataset_id, epsilon, delta, _now(), None if source is None else data_source(source),
                        None if reading is None else json.dumps(reading, sort_keys=True)))

    @staticmethod
    def _check_rebinding_locked(db, dataset_id: str, reading: dict) -> None:
        row = db.execute("SELECT reading FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        if row is None or row["reading"] is None:
            return
        bound = json.loads(row["reading"])
        if unit_fields(bound) == unit_fields(reading):
            return  # the privacy unit is unchanged (the path stays inside the bound source)
        if db.execute("SELECT 1 FROM spends WHERE dataset_id=? LIMIT 1", (dataset_id,)).fetchone():
            raise ReleaseConflict(reading_conflict_message(
                dataset_id, unit_fields(bound), unit_fields(reading), asker="the new reading",
                outcome="The dataset has releases, whose privacy unit is the bound reading's: nothing was changed"))

    def register_public(self, path: str, source: str) -> str:
        """Declare a file (or folder) public, with where it comes from: an operator's decision, as a budget is.
        Refused for the data of a dataset (a bound source, or inside one). Returns its sha256."""
        where = data_source(path)
        digest = content_sha256(Path(where))  # before the ledger's lock: a folder may take a while to read
        with self._transaction(immediate=True) as db:
            for row in db.execute("SELECT dataset_id, source FROM budgets WHERE source IS NOT NULL"):
                if within(where, row["source"]) or within(row["source"], where):
                    raise ReleaseConflict(f"{where} holds the data of dataset '{row['dataset_id']}': it cannot "
                                          f"be declared public")
            db.execute("INSERT INTO public_inputs VALUES (?, ?, ?, ?) ON CONFLICT(path) DO UPDATE SET "
                       "sha256=excluded.sha256, source=excluded.source, registered_at=excluded.registered_at",
                       (where, digest, source, _now()))
        return digest

    def public_inputs(self) -> list[dict]:
        with self._transaction() as db:
            return [dict(r) for r in db.execute("SELECT * FROM public_inputs ORDER BY path")]

    def sources(self) -> list[str]:
        """Every bound data source."""
        with self._transaction() as db:
            return [r["source"] for r in db.execute("SELECT source FROM budgets WHERE source IS NOT NULL")]

    def source(self, dataset_id: str) -> str | None:
        """The data source the dataset id is bound to (None: not yet)."""
        with self._transaction() as db:
            row = db.execute("SELECT source FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        return row["source"] if row else None

    def budget(self, dataset_id: str) -> tuple[float, float] | None:
        with self._transaction() as db:
            row = db.execute("SELECT epsilon, delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        return (row["epsilon"], row["delta"]) if row else None

    def charge(self, *, dataset_id: str, release_id: str, kind: str, fingerprint: str, event: dpe.DpEvent,
               release_delta: float | None = None, redraw: bool = False, location: str | None = None,
               extra_delta: float = 0.0, owner: str | None = None, dry_run: bool = False,
               source: str | None = None, reading: dict | None = None) -> Charge:
        """Record the spend of `release_id` unless it is recorded already; refuse it if over budget.

        redraw : the measurements are not committed here. If an earlier attempt drew noise and did not commit
        (status 'drawing'), this attempt is charged again. If the release was measured or published, its noise
        was committed once: there is nothing to redraw, the run is refused.
        location : the run folder whose measurements/ this release id draws into. Once noise was drawn for the
        id, a run in another folder is refused (it would publish a second, independent release under one charge).
        owner : the run that may draw (see `begin_draw`): a release that nothing has drawn yet is taken over by
        the newest run; an older run that then reaches its first draw is refused before drawing.
        extra_delta : the release's failure probability outside its event (`Plan.extra_delta`); the dataset's
        releases compose at the budget's delta minus the sum of theirs.

        The release's own guarantee is stated at `release_delta` (its spec's target) when given, else at the
        budget's delta; the budget check composes everything at the budget's delta. The dataset's lifetime
        budget is the one an operator set (`set_budget`); a dataset without one is refused.

        dry_run : every check and refusal of the charge, nothing recorded (a run's check before it reads data).
        source : the data the release reads (`data_source`): it must be the dataset's bound source or inside it;
        a dataset bound to none is bound to it here. Without it (the ledger's own tests) nothing is checked.
        reading : how the release reads the data and what one record is (`tasks.params.dataset_reading`): bound
        by the operator (`set_budget`) or else by the dataset's first release, then the same for every release.
        """
        with self._transaction(immediate=True, keep=not dry_run) as db:
            bud_eps, bud_delta = self._budget_locked(db, dataset_id)
            if source is not None:
                self._bind_locked(db, dataset_id, data_source(source), reading)
            if release_delta and release_delta > bud_delta:
                raise BudgetExceeded(f"release '{release_id}' asks delta={release_delta:g}, above the lifetime delta "
                                     f"{bud_delta:g} of dataset '{dataset_id}'. No noise was drawn.")
            prior = db.execute("SELECT * FROM spends WHERE release_id=?", (release_id,)).fetchone()
            accounting = _accounting()
            own = accounting.release_guarantee(event, release_delta or bud_delta, extra_delta)
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
            events.append(event)
            extra += extra_delta
            total = accounting.epsilon_at(accounting.compose_events(events), bud_delta, extra)
            if total.epsilon > bud_eps * (1 + _TOLERANCE):
                spent = self._total_locked(db, dataset_id, bud_delta).epsilon
                raise BudgetExceeded(
                    f"release '{release_id}' (epsilon={own.epsilon:.6g}) would exceed the lifetime budget of "
                    f"dataset '{dataset_id}': spent epsilon={spent:.6g}, composed total would be "
                    f"{total.epsilon:.6g} > budget {bud_eps:.6g} (delta={bud_delta:g}). No noise was drawn.")
            now = _now()
            if prior is not None:
                db.execute("UPDATE spends SET attempts=attempts+1, extra_delta=extra_delta+?, status='charged', "
                           "owner=?, updated_at=? WHERE release_id=?", (extra_delta, owner, now, release_id))
                return Charge(release_id, "charged again: an earlier attempt drew noise and failed before its "
                                          "commit", own, total, bud_eps, bud_delta)
            db.execute("INSERT INTO spends (release_id, dataset_id, kind, fingerprint, event, epsilon, delta, "
                       "status, created_at, updated_at, attempts, location, extra_delta, owner) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, 'charged', ?, ?, 1, ?, ?, ?)",
                       (release_id, dataset_id, kind, fingerprint, json.dumps(accounting.event_to_json(event)),
                        own.epsilon, own.delta, now, now, location, extra_delta, owner))
            return Charge(release_id, "charged", own, total, bud_eps, bud_delta)

    def _recharge_locked(self, db, prior, dataset_id, fingerprint, event, own, extra_delta, location, owner,
                         bud_eps, bud_delta) -> Charge:
        events, extra = self._events_locked(db, dataset_id, exclude=prior["release_id"])
        accounting = _accounting()
        total = accounting.epsilon_at(accounting.compose_events(events + [event]), bud_delta, extra + extra_delta)
        if total.epsilon > bud_eps * (1 + _TOLERANCE):
            raise BudgetExceeded(f"release '{prior['release_id']}' with its new parameters would exceed the lifetime "
                                 f"budget of dataset '{dataset_id}'. No noise was drawn.")
        db.execute("UPDATE spends SET fingerprint=?, event=?, epsilon=?, delta=?, extra_delta=?, location=?, owner=?, "
                   "updated_at=? WHERE release_id=?",
                   (fingerprint, json.dumps(accounting.event_to_json(event)), own.epsilon, own.delta, extra_delta,
                    location or prior["location"], owner, _now(), prior["release_id"]))
        return Charge(prior["release_id"], "charged (parameters corrected before any noise was drawn)", own, total,
                      bud_eps, bud_delta)

    def begin_draw(self, release_id: str, owner: str | None) -> None:
        """The lease to draw: status charged -> drawing, only for the run that holds the release (compare and
        set). Called before the first noise draw; a run that lost the release to a newer one is refused here,
        before it draws anything."""
        with self._transaction(immediate=True) as db:
            n = db.execute("UPDATE spends SET status='drawing', updated_at=? WHERE release_id=? AND status='charged' "
                           "AND owner IS ?", (_now(), release_id, owner)).rowcount
        if n != 1:
            raise ReleaseConflict(f"release '{release_id}' was taken over by another run before this one drew any "
                                  f"noise; nothing was drawn here")

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
            row = db.execute("SELECT delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
            return self._total_locked(db, dataset_id, row["delta"] if row else 0.0)

    @staticmethod
    def _events_locked(db, dataset_id: str, exclude: str | None = None) -> tuple[list[dpe.DpEvent], float]:
        """Every spend of the dataset (each attempt that drew noise counts) and the sum of their extra deltas."""
        rows = db.execute("SELECT event, attempts, extra_delta FROM spends WHERE dataset_id=? AND release_id IS NOT ? "
                          "ORDER BY created_at", (dataset_id, exclude)).fetchall()
        accounting, events = _accounting(), []
        for r in rows:
            event = accounting.event_from_json(json.loads(r["event"]))
            events.append(event if r["attempts"] == 1 else accounting.dpe.SelfComposedDpEvent(event, r["attempts"]))
        return events, math.fsum(r["extra_delta"] for r in rows)

    def _total_locked(self, db, dataset_id: str, delta: float) -> accounting.Guarantee:
        events, extra = self._events_locked(db, dataset_id)
        accounting = _accounting()
        if not events:
            return accounting.Guarantee(0.0, 0.0, "no releases")
        return accounting.epsilon_at(accounting.compose_events(events), delta, extra)

    @staticmethod
    def _one_id_per_source_locked(db, dataset_id: str, source: str) -> None:
        """One data source is one dataset (one budget): the same records under two ids would compose outside
        either budget."""
        for row in db.execute("SELECT dataset_id, source FROM budgets WHERE source IS NOT NULL AND dataset_id != ?",
                              (dataset_id,)):
            if within(source, row["source"]) or within(row["source"], source):
                raise ReleaseConflict(f"the data {source} is dataset '{row['dataset_id']}''s ({row['source']}): one "
                                      f"data source has one budget (its releases under another id would compose "
                                      f"outside it); release it as '{row['dataset_id']}'. Nothing was run")

    def _bind_locked(self, db, dataset_id: str, source: str, reading: dict | None) -> None:
        row = db.execute("SELECT source, reading FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        if row["source"] is not None and not within(source, row["source"]):
            raise ReleaseConflict(source_conflict_message(dataset_id, row["source"], source))
        if row["source"] is None:
            self._one_id_per_source_locked(db, dataset_id, source)
        check_reading(dataset_id, json.loads(row["reading"]) if row["reading"] else None, reading, source)
        db.execute("UPDATE budgets SET source=COALESCE(source, ?), reading=COALESCE(reading, ?) WHERE dataset_id=?",
                   (source, None if reading is None else json.dumps(unit_fields(reading), sort_keys=True),
                    dataset_id))

    def bind(self, dataset_id: str, source: str, reading: dict | None) -> None:
        """Bind a dataset with no source or reading yet to these, committed at once: a run's check before it
        reads the data, so that a run refused while reading (never charged) still fixes how the dataset is read
        (an audit probed the data with one delimiter after another until a release first succeeded). Refuses
        as `charge` would for a dataset bound otherwise."""
        with self._transaction(immediate=True) as db:
            self._budget_locked(db, dataset_id)
            self._bind_locked(db, dataset_id, data_source(source), reading)

    def reading(self, dataset_id: str) -> dict | None:
        """How the dataset's data is read, as the operator or its first release bound it (None: not yet)."""
        with self._transaction() as db:
            row = db.execute("SELECT reading FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        return json.loads(row["reading"]) if row and row["reading"] else None

    def _budget_locked(self, db, dataset_id: str) -> tuple[float, float]:
        row = db.execute("SELECT epsilon, delta FROM budgets WHERE dataset_id=?", (dataset_id,)).fetchone()
        if row is None:
            raise NoBudget(no_budget_message(dataset_id, self.path))
        return row["epsilon"], row["delta"]


def no_budget_message(dataset_id: str, path: Path) -> str:
    return (f"dataset '{dataset_id}' has no lifetime budget in the ledger {path}: an operator sets one with "
            f"`dprelease budget set {dataset_id} --epsilon E --delta D` (nothing was run)")


def require_budget(dataset_id: str, path: Path | None = None, source: str | None = None,
                   reading: dict | None = None) -> tuple[float, float]:
    """The dataset's registered lifetime budget; refuses (before anything runs) a dataset without one, or one
    bound to another data source than `source` or read otherwise than `reading`."""
    path = path or configured_path()
    ledger = PrivacyLedger(path) if path.exists() else None
    budget = ledger.budget(dataset_id) if ledger else None
    if budget is None:
        raise NoBudget(no_budget_message(dataset_id, path))
    bound = ledger.source(dataset_id)
    if source is not None and bound is not None and not within(data_source(source), bound):
        raise ReleaseConflict(source_conflict_message(dataset_id, bound, data_source(source)))
    check_reading(dataset_id, ledger.reading(dataset_id), reading, None if source is None else data_source(source))
    return budget


def unit_fields(reading: dict) -> dict:
    """The fields of a reading that decide how records are parsed and what one is (`tasks.params.READING_FIELDS`)."""
    return {k: v for k, v in reading.items() if k not in ("path", "columns")}


def require_outside_data(output_dir: str, release_id: str, path: Path | None = None) -> None:
    """Refuse a run folder (and its output_dir's .logs/, .quarantine/) inside a dataset's bound data, or around
    it: a run writes there, and clears stale or failed folders of its own (an attacker's review had runs write
    into a dataset's folder, and tell names in it apart by the errors on the way)."""
    path = path or configured_path()
    if not path.exists():
        return
    out, run = data_source(output_dir), data_source(str(Path(output_dir) / release_id))
    for source in PrivacyLedger(path).sources():
        if within(out, source) or within(source, run):
            raise ReleaseConflict(f"the output folder {output_dir} is inside a dataset's data, or its run folder "
                                  f"{release_id} holds one: choose an output_dir outside every dataset's data. "
                                  f"Nothing was run")


def check_reading(dataset_id: str, bound: dict | None, reading: dict | None, source: str | None) -> None:
    """Refuse a release that reads the dataset otherwise than bound. A reading the operator bound
    (`dprelease budget set --reading-from`) also names the path and the columns, with how each is parsed: its
    releases read exactly that file or folder (an audit read the first line of a note beside the data, in the
    bound folder, through the missing-column refusal), and only those columns (otherwise a spec picks the columns
    whose refusals answer "has any value missing or not a number")."""
    if bound is None:
        return
    if "path" in bound and source is not None and source != bound["path"]:
        # Not echoing the spec's path resolved: a symlink inside the data's folder would show its target.
        raise ReleaseConflict(f"dataset '{dataset_id}' is read as bound to its budget (path={bound['path']!r}); this "
                              f"spec reads another path: its releases read exactly that file or folder (the "
                              f"operator's `dprelease budget set --reading-from`). Nothing was run")
    if reading is None:
        return
    if unit_fields(reading) != unit_fields(bound):
        raise ReleaseConflict(reading_conflict_message(dataset_id, unit_fields(bound), unit_fields(reading)))
    if "columns" in bound:
        asked_columns = reading.get("columns", {})
        other = {c: how for c, how in sorted(asked_columns.items()) if bound["columns"].get(c) != how}
        if other:
            raise ReleaseConflict(
                f"dataset '{dataset_id}' is read as bound to its budget, whose columns are {_columns(bound['columns'])}; "
                f"this spec reads {_columns(other)}: a release reads the columns the operator declared (`dprelease "
                f"budget set --reading-from`), as declared. Nothing was run")


def _columns(columns: dict) -> str:
    return ", ".join(f"{c} ({how})" for c, how in sorted(columns.items()))


def reading_conflict_message(dataset_id: str, bound: dict, reading: dict, asker: str = "this spec",
                             outcome: str = "Nothing was run") -> str:
    changed = {k: reading.get(k) for k in sorted(set(bound) | set(reading)) if bound.get(k) != reading.get(k)}
    was = ", ".join(f"{k}={bound.get(k)!r}" for k in changed)
    asked = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    return (f"dataset '{dataset_id}' is read as bound to its budget ({was}); {asker} asks {asked}: how a "
            f"dataset is parsed and what one record is are fixed for its budget (otherwise a spec's choice of them "
            f"would make the data's refusals answer its questions). {outcome}")


def require_public(paths: list[str], path: Path | None = None) -> None:
    """Every public input of a release (public marginals, a public sample) was declared public by the operator
    (`dprelease public register`) and is unchanged since: a spec naming a file "public" does not make it so
    (an audit released a dataset's exact table by naming its own file as the public marginals)."""
    if not paths:
        return
    path = path or configured_path()
    registered = {r["path"]: r for r in PrivacyLedger(path).public_inputs()} if path.exists() else {}
    for p in paths:
        where = data_source(p)
        row = registered.get(where)
        if row is None:
            raise ReleaseConflict(f"the public input {where} was not declared public in the ledger {path}: an "
                                  f"operator declares it with `dprelease public register {where} --source "
                                  f"WHERE-IT-COMES-FROM`. Nothing was run")
        try:
            digest = content_sha256(Path(where))
        except OSError:
            raise ReleaseConflict(f"the public input {where}, declared public, cannot be read. Nothing was run") from None
        if digest != row["sha256"]:
            raise ReleaseConflict(f"the public input {where} changed since it was declared public: an operator "
                                  f"declares it again. Nothing was run")


def public_copy(path: str, into: Path, ledger: Path | None) -> Path:
    """A private copy of a public input, checked: the bytes a release reads are those the operator declared
    public (the copy's sha256 against the registry; `ledger` None: test mode, unchecked). Reading the copy and
    not the path closes the window in which the file could be swapped after a check (an audit swapped the
    registered marginals for the data mid-run and released its exact table)."""
    src = Path(data_source(path))
    into.mkdir(parents=True, exist_ok=True)
    dst = into / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    if ledger is not None:
        registered = {r["path"]: r["sha256"] for r in PrivacyLedger(ledger).public_inputs()} if ledger.exists() else {}
        if registered.get(str(src)) != content_sha256(dst):
            raise ReleaseConflict(f"the public input {src} is not, or no longer, what the operator declared public "
                                  f"(`dprelease public list`); nothing was released")
    return dst


def content_sha256(path: Path) -> str:
    """sha256 of a file, or of a folder's files (their relative paths and contents, in order)."""
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if f.is_file():
            h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def data_source(path: str) -> str:
    """A dataset's data as the ledger binds it: the absolute path (a built-in dataset: its name)."""
    return path if path.startswith(BUILTIN_PREFIX) else str(Path(path).expanduser().resolve())


def within(source: str, bound: str) -> bool:
    """The release's data is the bound source, or inside the bound folder."""
    return source == bound or (not bound.startswith(BUILTIN_PREFIX) and Path(bound) in Path(source).parents)


def source_conflict_message(dataset_id: str, bound: str, source: str) -> str:
    return (f"dataset '{dataset_id}' is bound to the data {bound}; this release reads {source}: a dataset id "
            f"spends the budget of its own data only (an operator binds it with `dprelease budget set "
            f"{dataset_id} --epsilon E --source PATH`). Nothing was run")
