"""The privacy ledger: the operator's durable record of every dataset's lifetime budget and every release's spend
against it (`spends`), what data each dataset id stands for and how it is read (`bindings`), and which files are
public (`public`), in one store (`store`). The ledger decides budgets: a release is charged before any noise is
drawn, and refused there when it would exceed its dataset's budget.

Where the ledger is, is the operator's setting (`tasks.settings`: `ledger`), never a spec's or a flow parameter's:
whoever chose the ledger would choose the budget. It is a SQLite file (the embedded default) or a PostgreSQL
database several hosts share (`store`); every caller opens it with `configured_ledger()`.
"""

from __future__ import annotations

from pathlib import Path

from tasks import settings
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
from tasks.ledger.store import Store
from tasks.settings import is_database, masked

__all__ = ["Charge", "LEDGER_ENV", "MAX_LIFETIME_EPSILON", "PrivacyLedger", "check_reading", "configured_ledger",
           "configured_location", "content_sha256", "data_source", "ledger_at", "no_budget_message", "public_copy",
           "reading_conflict_message", "source_conflict_message", "source_digest", "unit_fields", "within"]

#: The operator's setting that names the ledger.
LEDGER_ENV = settings.env_of("ledger")


class PrivacyLedger(Spends, Bindings, PublicInputs, Store):
    """One ledger: its budgets and spends, its dataset bindings and its public inputs, over one store."""


def ledger_at(location: str | Path, create: bool = True) -> PrivacyLedger | None:
    """The ledger at `location`, a SQLite file's path or a postgresql:// URL. create=False, for callers that only
    read: None where nothing was ever recorded (no SQLite file there: a read does not create one)."""
    if not create and not is_database(location) and not Path(location).exists():
        return None
    return PrivacyLedger(location)


def configured_ledger(create: bool = True) -> PrivacyLedger | None:
    """The operator's ledger (`tasks.settings`: $DPRELEASE_LEDGER, else `ledger` in config.toml, else
    $XDG_STATE_HOME/dprelease/privacy-ledger.sqlite: per user, outside any checkout or output folder); `create` as
    `ledger_at`'s."""
    return ledger_at(settings.current().ledger, create)


def configured_location() -> str:
    """The operator's ledger as messages name it (a URL with its password masked)."""
    return masked(settings.current().ledger)
