"""The ledger's tables in a PostgreSQL database that every host running releases shares (the operator's `ledger`
setting is a postgresql:// URL; psycopg 3, the `postgres` extra).

The same schema and SQL as the SQLite file (`tasks.ledger.store`), translated: `?` placeholders become psycopg's
`%s`, and `IS ?` (SQLite's comparison that matches NULL) becomes `IS NOT DISTINCT FROM %s`.

Serialising the writers: a write transaction runs at READ COMMITTED and takes `LOCK TABLE <every ledger table> IN
EXCLUSIVE MODE` before it reads anything. That is SQLite's `BEGIN IMMEDIATE` here: the writers queue one behind the
other, and readers (plain SELECTs) go on. Each statement after the lock sees every transaction committed before the
lock was granted, so a charge's read-compose-write runs on the latest spends, as on SQLite. Chosen over
`pg_advisory_xact_lock`: a table lock also holds against a writer that does not know the lock's number (an
operator's psql session, a migration), and as the statement that takes it is not a query it takes no snapshot (a
lock taken by a SELECT at REPEATABLE READ would run the charge on the snapshot taken before the wait). Chosen over
SERIALIZABLE with retries: every writer would need a retry loop, and a charge would have to prove it composes the
same events whatever the retry. Readers run at REPEATABLE READ, READ ONLY: a consistent view across their
statements, and a write outside the writers' lock is refused by the server.

A connection or database error is the one-line `ReleaseError` the SQLite file gives, with the password masked. A
server that cannot be reached, or a connection lost (the server stopped or restarted, the network dropped), is a
`LedgerUnreachable`, which the ledger retries with backoff for the operator's `outage_retry_seconds`
(`tasks.transient`); a lock wait that timed out, a refused role, a constraint are not retried.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from functools import lru_cache
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from tasks.errors import LedgerUnreachable, ReleaseError
from tasks.ledger.schema import TABLES
from tasks.settings import masked

#: How long a writer waits for the ledger's lock before its transaction fails (SQLite's busy timeout is the same).
LOCK_WAIT_SECONDS = 120
#: How long opening a connection may take: an unreachable server is an error, not a hang.
CONNECT_TIMEOUT_SECONDS = 10
#: The advisory lock that serialises creating the tables and adding columns (hosts opening a new ledger at once:
#: CREATE TABLE IF NOT EXISTS is not safe against a concurrent one, and there is no table to lock yet). Any number
#: no other application of the database uses: b"dpreleas".
_SCHEMA_LOCK = 0x6470_7265_6C65_6173


#: The statements that open a transaction: a reader's, a writer's (the writers' lock), a schema change's.
_READ = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",)
_WRITE = ("BEGIN ISOLATION LEVEL READ COMMITTED", f"SET LOCAL lock_timeout = '{LOCK_WAIT_SECONDS}s'",
          f"LOCK TABLE {', '.join(TABLES)} IN EXCLUSIVE MODE")
_SCHEMA_CHANGE = ("BEGIN ISOLATION LEVEL READ COMMITTED", f"SET LOCAL lock_timeout = '{LOCK_WAIT_SECONDS}s'",
                  f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")


class Database:
    """A ledger in a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str):
        self.shown = masked(url)
        self._secrets = _passwords(url)
        try:
            self._params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise ReleaseError(f"cannot open privacy ledger {self.shown}: {self._line(exc)}") from None
        self._params.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
        self._params.setdefault("application_name", "dprelease")

    def transaction(self, immediate: bool = False, keep: bool = True):
        return self._session(_WRITE if immediate else _READ, keep)

    def schema_transaction(self):
        return self._session(_SCHEMA_CHANGE)

    @contextmanager
    def _session(self, opening: tuple[str, ...], keep: bool = True):
        conn = self._connect()
        try:
            for statement in opening:
                conn.execute(statement)
            yield Connection(conn)
            conn.execute("COMMIT" if keep else "ROLLBACK")
        except psycopg.Error as exc:
            if _connection_lost(exc, conn):
                raise LedgerUnreachable(f"privacy ledger {self.shown}: the connection was lost "
                                        f"({self._line(exc)})") from None
            raise ReleaseError(f"privacy ledger {self.shown} is unusable: {self._line(exc)}") from None
        finally:
            conn.close()  # a transaction left open (by an exception) is rolled back by the server

    def _connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(**self._params, autocommit=True, row_factory=dict_row)
        except psycopg.OperationalError as exc:  # no server, refused, timed out, shutting down: may pass
            raise LedgerUnreachable(f"cannot open privacy ledger {self.shown}: {self._line(exc)}") from None
        except psycopg.Error as exc:
            raise ReleaseError(f"cannot open privacy ledger {self.shown}: {self._line(exc)}") from None

    @staticmethod
    def columns(db: Connection, table: str) -> list[str]:
        return [r["column_name"] for r in db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ?", (table,))]

    @staticmethod
    def fill(db: Connection, table: str, column: str) -> None:
        """Nothing to fill: a PostgreSQL ledger was created with every column of `schema.SCHEMA` (a column added
        later says here how its existing rows are filled)."""

    def _line(self, exc: BaseException) -> str:
        """An error as one line, without the password (libpq's connection errors do not quote it; its URL parser may,
        e.g. a bad %-escape in it)."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return masked(text)


#: SQLSTATEs of a server going away: connection exceptions (class 08) and operator intervention (admin shutdown,
#: crash shutdown, cannot connect now).
_GONE = ("08", "57P01", "57P02", "57P03")


def _connection_lost(exc: psycopg.Error, conn: psycopg.Connection) -> bool:
    """The error is the connection's, not the statement's: the client lost it (no SQLSTATE, the connection closed or
    broken) or the server said it is going away. A lock timeout (55P03), a serialisation failure, a constraint are
    the statement's."""
    state = getattr(exc, "sqlstate", None)
    if state is None:
        return conn.closed or conn.broken or isinstance(exc, psycopg.OperationalError)
    return state.startswith(_GONE)


def _passwords(url: str) -> list[str]:
    """The password of a URL (user information or `password=` parameter), as written and decoded, longest first."""
    userinfo = re.match(r"[^:]*://([^/?#]*)@", url)
    found = [userinfo.group(1).split(":", 1)[1]] if userinfo and ":" in userinfo.group(1) else []
    found += re.findall(r"[?&]password=([^&#]*)", url)
    return sorted({s for f in found for s in (f, unquote(f)) if s}, key=len, reverse=True)


class Connection:
    """A psycopg connection in a transaction, running the ledger's SQL as written for SQLite; rows are dicts."""

    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    def execute(self, sql: str, params: tuple = ()) -> psycopg.Cursor:
        return self._conn.execute(translated(sql), tuple(params))

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        self._conn.cursor().executemany(translated(sql), rows)


@lru_cache(maxsize=512)
def translated(sql: str) -> str:
    """The ledger's SQL (no `?` or `%` inside a literal) with psycopg's placeholders."""
    sql = sql.replace("%", "%%")
    sql = re.sub(r"\bIS NOT \?", "IS DISTINCT FROM %s", sql)
    sql = re.sub(r"\bIS \?", "IS NOT DISTINCT FROM %s", sql)
    return sql.replace("?", "%s")

