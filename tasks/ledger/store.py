"""Where the ledger's tables live, and its transactions: one SQLite file on the machine that runs releases.

A write transaction (`BEGIN IMMEDIATE`) serialises every writer of the ledger, so two releases started at once
cannot both pass the budget check, and a run's lease to draw is a compare-and-set inside one. The file and the
folder the ledger creates for it are readable by their owner only: the ledger names every dataset, its data's
location and its spends (a review found it created world-readable).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from tasks.errors import ReleaseError

SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL, updated_at TEXT NOT NULL,
    source TEXT, reading TEXT, source_digest TEXT);
CREATE TABLE IF NOT EXISTS budget_changes (
    dataset_id TEXT NOT NULL, changed_at TEXT NOT NULL, old_epsilon REAL, old_delta REAL,
    new_epsilon REAL NOT NULL, new_delta REAL NOT NULL, spent_epsilon REAL NOT NULL, reason TEXT);
CREATE TABLE IF NOT EXISTS spends (
    release_id TEXT PRIMARY KEY, dataset_id TEXT NOT NULL, kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
    event TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, status TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 1, location TEXT,
    extra_delta REAL NOT NULL DEFAULT 0, owner TEXT);
CREATE INDEX IF NOT EXISTS spends_by_dataset ON spends (dataset_id);
CREATE TABLE IF NOT EXISTS public_inputs (
    path TEXT PRIMARY KEY, sha256 TEXT NOT NULL, source TEXT NOT NULL, registered_at TEXT NOT NULL);
"""

#: Columns added since the first ledgers were written: (table, column, declaration).
_ADDED = (("spends", "attempts", "INTEGER NOT NULL DEFAULT 1"), ("spends", "location", "TEXT"),
          ("spends", "extra_delta", "REAL NOT NULL DEFAULT 0"), ("spends", "owner", "TEXT"),
          ("budgets", "source", "TEXT"), ("budgets", "reading", "TEXT"), ("budgets", "source_digest", "TEXT"))


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """The SQLite file of a ledger; `_transaction` is what every part of the ledger reads and writes through."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        _owner_only(self.path)
        db = self._connect()
        try:
            db.executescript(SCHEMA)  # runs in its own transaction
            for table, column, declaration in _ADDED:  # a ledger written by an earlier version
                if column not in [r[1] for r in db.execute(f"PRAGMA table_info({table})")]:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
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
        """immediate: a write transaction, taken at once (serialises the writers). keep=False: every check runs as
        it would, and nothing is written (a dry run)."""
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


def _owner_only(path: Path) -> None:
    """Create the ledger's folder (0700) and file (0600) for their owner alone; an existing file of ours that others
    may read is closed to them (SQLite gives its journal the file's mode)."""
    if not path.parent.exists():
        previous = os.umask(0o077)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        finally:
            os.umask(previous)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            path.chmod(0o600)
    except OSError as exc:
        raise ReleaseError(f"cannot create privacy ledger {path}: {exc.strerror or type(exc).__name__}") from None
