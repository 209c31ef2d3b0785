"""Where the ledger's tables live, and its transactions: a SQLite file on the machine that runs releases (the
embedded default), or a PostgreSQL database that every host running releases shares (the operator's `ledger`
setting is a postgresql:// URL: `tasks.ledger.postgres`).

Both backends hold the same schema and run the same SQL, written once (SQLite's `?` placeholders; the PostgreSQL
backend translates them). A write transaction (`immediate`) serialises every writer of the ledger, so two releases
started at once cannot both pass the budget check, and a run's lease to draw is a compare-and-set inside one:
SQLite's `BEGIN IMMEDIATE`; on PostgreSQL, a lock on the ledger's tables taken before anything is read (see
`tasks.ledger.postgres`). A SQLite file and the folder the ledger creates for it are readable by their owner only: the
ledger names every dataset, its data's location and its spends (a review found it created world-readable).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from tasks.errors import ReleaseError
from tasks.ledger.schema import ADDED, SCHEMA, TABLES
from tasks.settings import is_database, masked


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """The store of a ledger, a SQLite file or a PostgreSQL database (`location`: a path or a postgresql:// URL);
    `_transaction` is what every part of the ledger reads and writes through. `name`: the location as messages show
    it, a URL's password masked."""

    def __init__(self, location: str | Path):
        if is_database(location):
            self._db = _database(str(location))
        else:
            self._db = SQLiteFile(Path(location))
        self.name = self._db.shown
        self._create()

    def _create(self) -> None:
        """The tables, and the columns added since the first ledgers were written, where any is missing (asked
        first, in a read: creating them waits for the writers)."""
        wanted = list(TABLES.items()) + [(table, column) for table, column, _ in ADDED]
        with self._transaction() as db:
            held = {table: self._db.columns(db, table) for table in TABLES}
        if all(column in held[table] for table, column in wanted):
            return
        with self._db.schema_transaction() as db:
            for statement in SCHEMA:
                db.execute(statement)
            for table, column, declaration in ADDED:
                if column not in self._db.columns(db, table):
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                    self._db.fill(db, table, column)

    def _transaction(self, immediate: bool = False, keep: bool = True):
        """A transaction (a context manager) yielding a connection whose `execute(sql, params)` runs the ledger's SQL
        and whose rows are addressable by column name. immediate: a write transaction, taken at once (serialises
        the writers). keep=False: every check runs as it would, and nothing is written (a dry run)."""
        return self._db.transaction(immediate, keep)


def _database(url: str):
    try:
        # Deferred: psycopg is an optional dependency, and the CLI's checks of a SQLite ledger need not load it.
        from tasks.ledger.postgres import Database
    except ImportError as exc:
        if not (exc.name or "").startswith("psycopg"):
            raise
        raise ReleaseError(f"the privacy ledger {masked(url)} is a PostgreSQL database, and its client is not "
                           f"installed: pip install 'dprelease[postgres]'") from None
    return Database(url)


class SQLiteFile:
    """A ledger in a SQLite file (owner-only)."""

    def __init__(self, path: Path):
        self.path = path
        self.shown = str(path)
        _owner_only(path)

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(self.path, timeout=120, isolation_level=None)
        except sqlite3.Error as exc:
            raise ReleaseError(f"cannot open privacy ledger {self.path}: {exc}") from None

    @contextmanager
    def transaction(self, immediate: bool = False, keep: bool = True):
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

    def schema_transaction(self):
        return self.transaction(immediate=True)

    @staticmethod
    def columns(db, table: str) -> list[str]:
        return [r["name"] for r in db.execute(f"PRAGMA table_info({table})")]

    @staticmethod
    def fill(db, table: str, column: str) -> None:
        """A column added to an older ledger's rows: a budget's changes were ordered by their rowid before `seq`
        (a ledger written before `seq` is a SQLite file: the PostgreSQL ledger began with it)."""
        if (table, column) == ("budget_changes", "seq"):
            db.execute("UPDATE budget_changes SET seq = rowid")


def _owner_only(path: Path) -> None:
    """Create the ledger's folder (0700) and file (0600) for their owner alone; an existing file of ours that others
    may read is closed to them (SQLite gives its journal the file's mode)."""
    if not path.parent.exists():
        previous = os.umask(0o077)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # /proc/x/ledger.sqlite, a read-only mount: one line, not a traceback
            raise ReleaseError(f"cannot create privacy ledger {path}: {exc.strerror or type(exc).__name__}") from None
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
