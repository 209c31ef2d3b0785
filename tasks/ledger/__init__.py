"""The privacy ledger: the operator's durable record of every dataset's lifetime budget and every release's spend
against it (`spends`), what data each dataset id stands for and how it is read (`bindings`), and which files are
public (`public`), in one store (`store`). The ledger decides budgets: a release is charged before any noise is
drawn, and refused there when it would exceed its dataset's budget.

Where the ledger is, is the operator's setting (`tasks.settings`: `ledger`), never a spec's or a flow parameter's:
whoever chose the ledger would choose the budget. It is a SQLite file (the embedded default) or a PostgreSQL
database several hosts share (`store`); every caller opens it with `configured_ledger()`.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

from tasks import settings
from tasks.errors import LedgerBusy, LedgerUnreachable
from tasks.ledger.bindings import (
    Bindings,
    check_reading,
    data_source,
    reading_conflict_message,
    source_conflict_message,
    source_digest,
    unit_fields,
    within,
)
from tasks.ledger.public import PublicInputs, content_sha256, public_copy
from tasks.ledger.spends import MAX_LIFETIME_EPSILON, Charge, Spends, no_budget_message
from tasks.ledger.store import Store, backend, upgrade_schema
from tasks.settings import is_database, masked
from tasks.transient import retried

__all__ = ["Charge", "LEDGER_ENV", "MAX_LIFETIME_EPSILON", "PrivacyLedger", "check_reading", "configured_ledger",
           "configured_location", "content_sha256", "data_source", "ledger_at", "no_budget_message", "public_copy",
           "reading_conflict_message", "source_conflict_message", "source_digest", "unit_fields", "upgrade_ledger",
           "within"]

#: The operator's setting that names the ledger.
LEDGER_ENV = settings.env_of("ledger")


def _passing(exc: BaseException) -> bool:
    """A ledger error that passes: its database out of reach or its connection lost, its lock held by another
    process beyond the wait, a transaction the database rolled back for another's sake (`tasks.ledger.store`)."""
    return isinstance(exc, (LedgerUnreachable, LedgerBusy))


def _outages_retried(cls):
    """Every public method of the ledger (and opening it) retried while its error passes (`_passing`), with backoff,
    for the operator's `outage_retry_seconds` (`tasks.transient`): a PostgreSQL server restarted under a running
    release, its backend terminated, a SQLite file locked by another process delay the release instead of failing
    it. Each method is one transaction, rolled back by such an error or committed with its answer lost, and written
    so that repeating it after a commit changes nothing more (`Spends.charge`, `Spends.begin_draw`, `Spends.mark`):
    a repeated charge finds its own row and charges nothing twice."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            where = getattr(self, "name", None) or "the privacy ledger"
            return retried(lambda: fn(self, *args, **kwargs), f"the privacy ledger {where}", _passing)
        return call

    for base in (Spends, Bindings, PublicInputs):
        for name, member in vars(base).items():
            if not name.startswith("_") and inspect.isfunction(member):
                setattr(cls, name, wrap(member))
    opening = Store.__init__

    @functools.wraps(opening)
    def __init__(self, location):
        retried(lambda: opening(self, location), f"the privacy ledger {masked(str(location))}", _passing)
    cls.__init__ = __init__
    return cls


@_outages_retried
class PrivacyLedger(Spends, Bindings, PublicInputs, Store):
    """One ledger: its budgets and spends, its dataset bindings and its public inputs, over one store."""


def ledger_at(location: str | Path, create: bool = True) -> PrivacyLedger | None:
    """The ledger at `location`, a SQLite file's path or a postgresql:// URL. create=False, for callers that only
    read: None where nothing was ever recorded (no SQLite file there: a read does not create one)."""
    if not create and not is_database(location) and not Path(location).exists():
        return None
    return PrivacyLedger(location)


def upgrade_ledger(location: str | Path) -> tuple[str | None, str]:
    """Bring the ledger at `location` to the newest schema revision this code knows (`dprelease ledger upgrade`):
    (the revision it was at, None for a new ledger or one written before schema versions; the revision it is at)."""
    return upgrade_schema(backend(location))


def configured_ledger(create: bool = True) -> PrivacyLedger | None:
    """The operator's ledger (`tasks.settings`: $DPRELEASE_LEDGER, else `ledger` in config.toml, else
    $XDG_STATE_HOME/dprelease/privacy-ledger.sqlite: per user, outside any checkout or output folder); `create` as
    `ledger_at`'s."""
    return ledger_at(settings.current().ledger, create)


def configured_location() -> str:
    """The operator's ledger as messages name it (a URL with its password masked)."""
    return masked(settings.current().ledger)
