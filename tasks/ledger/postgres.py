"""The ledger's tables in a PostgreSQL database that every host running releases shares (the operator's `ledger`
setting is a postgresql:// URL; psycopg 3, the `postgres` extra, under SQLAlchemy's `postgresql+psycopg` dialect).

The URL is read by libpq, as `psql` reads it (`conninfo_to_dict`: every libpq parameter, `sslmode`, a socket folder
as `host`), and each connection of the pool is opened from it by psycopg; SQLAlchemy checks a pooled connection
before lending it (`pool_pre_ping`), so a server restarted between two transactions costs a reconnection, not an
error.

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
server that cannot be reached, or a connection lost (the server stopped or restarted, the backend terminated, the
network dropped), is a `LedgerUnreachable`; a serialisation failure or a deadlock (neither expected under the
writers' lock: an operator's session, a migration) is a `LedgerBusy`: the ledger retries both with backoff for the
operator's `outage_retry_seconds` (`tasks.transient`); a lock wait that timed out, a refused role, a constraint are
not retried.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from tasks.errors import LedgerBusy, LedgerUnreachable, ReleaseError
from tasks.ledger.engines import LOCK_WAIT_SECONDS, pooled
from tasks.ledger.schema import TABLES
from tasks.settings import masked

#: How long opening a connection may take: an unreachable server is an error, not a hang.
CONNECT_TIMEOUT_SECONDS = 10
#: The advisory lock that serialises creating the tables and adding columns (hosts opening a new ledger at once:
#: CREATE TABLE IF NOT EXISTS is not safe against a concurrent one, and there is no table to lock yet). Any number
#: no other application of the database uses: b"dpreleas".
_SCHEMA_LOCK = 0x6470_7265_6C65_6173


#: The statements that open a transaction (SQLAlchemy has begun it): a reader's, a writer's (the writers' lock), a
#: schema change's.
_OPENING = {
    "read": ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",),
    "write": ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", f"SET LOCAL lock_timeout = '{LOCK_WAIT_SECONDS}s'",
              f"LOCK TABLE {', '.join(TABLES)} IN EXCLUSIVE MODE"),
    "schema": ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", f"SET LOCAL lock_timeout = '{LOCK_WAIT_SECONDS}s'",
               f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})"),
}


class Database:
    """A ledger in a PostgreSQL database (see the module docstring)."""

    opening = _OPENING

    def __init__(self, url: str):
        self.shown = masked(url)
        self._secrets = _passwords(url)
        try:
            self._params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise ReleaseError(f"cannot open privacy ledger {self.shown}: {self._line(exc)}") from None
        self._params.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
        self._params.setdefault("application_name", "dprelease")
        self._url = url

    def engine(self) -> sa.Engine:
        return pooled(("postgresql", self._url), self._engine)

    def _engine(self) -> sa.Engine:
        return sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(**self._params),
                                pool_pre_ping=True)

    def cannot_open(self, exc: BaseException) -> ReleaseError:
        if isinstance(exc, psycopg.OperationalError):  # no server, refused, timed out, shutting down: may pass
            return LedgerUnreachable(f"cannot open privacy ledger {self.shown}: {self._line(exc)}")
        return ReleaseError(f"cannot open privacy ledger {self.shown}: {self._line(exc)}")

    def failed(self, exc: sa.exc.DBAPIError) -> ReleaseError:
        state = getattr(exc.orig, "sqlstate", None)
        if exc.connection_invalidated or _connection_lost(exc.orig):
            return LedgerUnreachable(f"privacy ledger {self.shown}: the connection was lost ({self._line(exc.orig)})")
        if state in _BUSY:
            return LedgerBusy(f"privacy ledger {self.shown} is busy: {self._line(exc.orig)}")
        return ReleaseError(f"privacy ledger {self.shown} is unusable: {self._line(exc.orig)}")

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
#: SQLSTATEs of a transaction the server rolled back for another's sake: serialisation failure, deadlock.
_BUSY = ("40001", "40P01")


def _connection_lost(exc: BaseException) -> bool:
    """The error is the connection's, not the statement's: the client lost it (no SQLSTATE, an operational error)
    or the server said it is going away. A lock timeout (55P03), a serialisation failure, a constraint are the
    statement's."""
    state = getattr(exc, "sqlstate", None)
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state.startswith(_GONE)


def _passwords(url: str) -> list[str]:
    """The password of a URL (user information or `password=` parameter), as written and decoded, longest first."""
    userinfo = re.match(r"[^:]*://([^/?#]*)@", url)
    found = [userinfo.group(1).split(":", 1)[1]] if userinfo and ":" in userinfo.group(1) else []
    found += re.findall(r"[?&]password=([^&#]*)", url)
    return sorted({s for f in found for s in (f, unquote(f)) if s}, key=len, reverse=True)
