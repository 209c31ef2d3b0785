"""The ledger's migration environment (alembic). Run by `tasks.ledger.versions` on the connection of a schema
transaction the ledger opened, its lock held (SQLite's BEGIN IMMEDIATE, PostgreSQL's advisory lock: the hosts that
open a ledger at once migrate it once), never on a URL of its own: an operator runs it as `dprelease ledger upgrade
[--ledger URL]`, which opens the ledger as every release does (its password masked in every message)."""

from alembic import context

from tasks.ledger.schema import METADATA, VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise SystemExit("the ledger's migrations run through `dprelease ledger upgrade [--ledger URL]`, which takes the "
                     "ledger's lock first")
# The transaction is the ledger's (already begun): alembic's begin_transaction joins it, and the ledger commits.
context.configure(connection=connection, target_metadata=METADATA, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
