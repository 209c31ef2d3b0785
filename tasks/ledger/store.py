"""Where the ledger's tables live, and its transactions: a SQLite file on the machine that runs releases (the
embedded default), or a PostgreSQL database that every host running releases shares (the operator's `ledger`
setting is a postgresql:// URL: `tasks.ledger.postgres`).

Both backends hold the tables of `tasks.ledger.schema` and run the same statements, written once in SQLAlchemy Core
(SQLAlchemy renders each for its dialect). Each backend keeps a pool of connections per process (an engine): a
transaction borrows one and gives it back. A write transaction (`immediate`) serialises every writer of the ledger,
so two releases started at once cannot both pass the budget check, and a run's lease to draw is a compare-and-set
inside one: SQLite's `BEGIN IMMEDIATE`; on PostgreSQL, a lock on the ledger's tables taken before anything is read
(see `tasks.ledger.postgres`). A SQLite file and the folder the ledger creates for it are readable by their owner
only: the ledger names every dataset, its data's location and its spends (a review found it created world-readable).

Opening a ledger brings its schema to the newest revision this code knows (`tasks.ledger.versions`, alembic), as
Prefect's server migrates its database when it starts; `dprelease ledger upgrade` does it on its own and says from
which revision to which. A ledger at a revision this code does not know is refused in one line.

A transaction that fails for a reason that passes is a `LedgerUnreachable` (the database could not be reached or
the connection was lost) or a `LedgerBusy` (SQLite's lock still held by another process after the busy timeout;
PostgreSQL's serialisation failure or deadlock): the transaction was rolled back, or its commit's answer was lost,
and the ledger retries the whole method (`tasks.ledger.__init__`), each written to change nothing more when it
repeats one that committed.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from dpalgos.lazy import module
from tasks.errors import LedgerBusy, ReleaseError
from tasks.ledger.engines import LOCK_WAIT_SECONDS, pooled
from tasks.ledger.schema import HEAD, VERSION_TABLE
from tasks.settings import is_database, masked

sa = module("sqlalchemy")

#: alembic, loaded only to migrate (`versions`).
versions = module("tasks.ledger.versions")

#: SQLite's result codes of a lock held by another connection (SQLITE_BUSY, SQLITE_LOCKED).
_SQLITE_BUSY = (5, 6)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """The store of a ledger, a SQLite file or a PostgreSQL database (`location`: a path or a postgresql:// URL);
    `_transaction` is what every part of the ledger reads and writes through. `name`: the location as messages show
    it, a URL's password masked."""

    def __init__(self, location: str | Path):
        self._db = backend(location)
        self.name = self._db.shown
        with self._transaction() as db:
            held = held_revision(db)
        if held != HEAD:
            upgrade_schema(self._db)

    def _transaction(self, immediate: bool = False, keep: bool = True):
        """A transaction (a context manager) yielding a SQLAlchemy connection that runs the ledger's statements.
        immediate: a write transaction, taken at once (serialises the writers). keep=False: every check runs as it
        would, and nothing is written (a dry run)."""
        return transaction(self._db, "write" if immediate else "read", keep)


def backend(location: str | Path):
    """The backend of a ledger's location: a `SQLiteFile` or a `postgres.Database`."""
    if not is_database(location):
        return SQLiteFile(Path(location))
    url = str(location)
    try:
        # Deferred: psycopg is an optional dependency, and the CLI's checks of a SQLite ledger need not load it.
        from tasks.ledger.postgres import Database
    except ImportError as exc:
        if not (exc.name or "").startswith("psycopg"):
            raise
        raise ReleaseError(f"the privacy ledger {masked(url)} is a PostgreSQL database, and its client is not "
                           f"installed: pip install 'dprelease[postgres]'") from None
    return Database(url)


def held_revision(db: sa.Connection) -> str | None:
    """The schema revision the ledger is at (None: a new ledger, or one written before schema versions)."""
    if not sa.inspect(db).has_table(VERSION_TABLE):
        return None
    return db.execute(sa.select(sa.column("version_num")).select_from(sa.table(VERSION_TABLE))).scalar()


def upgrade_schema(store) -> tuple[str | None, str]:
    """Bring a ledger's schema to the newest revision, in one schema transaction (its lock held: hosts opening a
    new ledger at once create its tables once). store: a backend. Returns (from, to) revisions."""
    with transaction(store, "schema") as db:
        held = held_revision(db)  # again, under the lock: another host may have migrated it meanwhile
        return held, versions.upgraded(db, held, store.shown)


@contextmanager
def transaction(store, mode: str, keep: bool = True):
    """A transaction of `mode` (read, write, schema: the backend's `opening` statements start it) on a connection of
    the backend's pool; a database's error is the backend's one line (`failed`)."""
    try:
        conn = store.engine().connect()
    except sa.exc.DBAPIError as exc:
        raise store.cannot_open(exc.orig) from None
    try:
        with conn.begin() as tx:
            for statement in store.opening[mode]:
                conn.exec_driver_sql(statement)
            yield conn
            if not keep:
                tx.rollback()
    except sa.exc.DBAPIError as exc:
        raise store.failed(exc) from None
    finally:
        conn.close()


class SQLiteFile:
    """A ledger in a SQLite file (owner-only)."""

    #: The statements that open a transaction: a reader's, a writer's (the writers' lock), a schema change's.
    opening = {"read": ("BEGIN",), "write": ("BEGIN IMMEDIATE",), "schema": ("BEGIN IMMEDIATE",)}

    def __init__(self, path: Path):
        self.path = path
        self.shown = str(path)
        _owner_only(path)

    def engine(self) -> sa.Engine:
        return pooled(("sqlite", str(self.path)), self._engine)

    def _engine(self) -> sa.Engine:
        # isolation_level=None: the driver begins no transaction of its own; `opening` begins each, as it should be.
        engine = sa.create_engine("sqlite://", poolclass=sa.pool.QueuePool, creator=lambda: sqlite3.connect(
            self.path, timeout=LOCK_WAIT_SECONDS, isolation_level=None, check_same_thread=False))
        sa.event.listen(engine, "connect", self._remember_file)
        sa.event.listen(engine, "checkout", self._same_file)
        return engine

    def _remember_file(self, dbapi_connection, record) -> None:
        record.info["file"] = _identity(self.path)

    def _same_file(self, dbapi_connection, record, proxy) -> None:
        """A pooled connection is to the file at the ledger's path now: one moved aside or replaced since (an
        operator's restore) is closed, and the pool opens the file that is there (as a connection per transaction
        did)."""
        if record.info.get("file") != _identity(self.path):
            raise sa.exc.DisconnectionError()

    def cannot_open(self, exc: BaseException) -> ReleaseError:
        return ReleaseError(f"cannot open privacy ledger {self.path}: {exc}")

    def failed(self, exc: sa.exc.DBAPIError) -> ReleaseError:
        if getattr(exc.orig, "sqlite_errorcode", None) in _SQLITE_BUSY or "database is locked" in str(exc.orig):
            return LedgerBusy(f"privacy ledger {self.path} is locked by another process: {exc.orig}")
        return ReleaseError(f"privacy ledger {self.path} is unusable: {exc.orig}")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino


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
