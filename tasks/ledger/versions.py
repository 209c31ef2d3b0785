"""A ledger's schema versions, by alembic: the revisions are tasks/ledger/migrations/versions/, and a ledger keeps the
one it is at in its `dprelease_ledger_version` table (`schema.VERSION_TABLE`).

Loaded only when a ledger is not at `schema.HEAD` (a new ledger, one written before schema versions or by older
code, one newer than this code): alembic takes a third of a second to import, which every command would pay.
A ledger whose revision this code does not know was migrated by a newer dprelease: it is refused in one line, before
anything is read or written (its tables may mean something this code does not know).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from tasks.errors import ReleaseError
from tasks.ledger.schema import VERSION_TABLE

#: The migrations shipped with the package (env.py and versions/).
MIGRATIONS = Path(__file__).with_name("migrations")


def scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS))


def upgraded(db, held: str | None, shown: str) -> str:
    """Bring the ledger on `db` (a connection in the ledger's schema transaction, its lock held) from revision `held`
    (None: a new ledger, or one written before schema versions) to the newest; returns the newest."""
    script = scripts()
    head = script.get_current_head()
    if held is not None and held not in {s.revision for s in script.walk_revisions()}:
        raise ReleaseError(f"the privacy ledger {shown} is at schema revision {held}, newer than this dprelease knows "
                           f"(its newest is {head}): upgrade dprelease on this host before it uses the ledger")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("version_table", VERSION_TABLE)
    config.attributes["connection"] = db
    command.upgrade(config, "head")
    return head
