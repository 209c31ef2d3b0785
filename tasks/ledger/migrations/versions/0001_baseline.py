"""baseline: the ledger's tables as they were when schema versions began

Revision ID: 0001
Revises:
Create Date: 2026-11-29

A new ledger gets its tables here; a ledger written before schema versions (no `dprelease_ledger_version` table)
gets the columns added to it since the first ledgers, each column once, as the code of that time added them
(`tasks/ledger/schema.py`'s hand-kept list, frozen here): its rows are kept as they are, and a SQLite ledger's budget
changes, ordered by rowid before `seq` existed, keep that order. The statements are those of that code, written out
(not the tables of schema.py, which move on with later revisions).
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

#: The tables as the code before schema versions created them (DOUBLE PRECISION: PostgreSQL's REAL has 24 bits).
TABLES = (
    "CREATE TABLE IF NOT EXISTS budgets (dataset_id TEXT PRIMARY KEY, epsilon DOUBLE PRECISION NOT NULL, "
    "delta DOUBLE PRECISION NOT NULL, updated_at TEXT NOT NULL, source TEXT, reading TEXT, source_digest TEXT)",
    "CREATE TABLE IF NOT EXISTS budget_changes (dataset_id TEXT NOT NULL, changed_at TEXT NOT NULL, "
    "old_epsilon DOUBLE PRECISION, old_delta DOUBLE PRECISION, new_epsilon DOUBLE PRECISION NOT NULL, "
    "new_delta DOUBLE PRECISION NOT NULL, spent_epsilon DOUBLE PRECISION NOT NULL, reason TEXT, seq INTEGER)",
    "CREATE TABLE IF NOT EXISTS spends (release_id TEXT PRIMARY KEY, dataset_id TEXT NOT NULL, kind TEXT NOT NULL, "
    "fingerprint TEXT NOT NULL, event TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, "
    "delta DOUBLE PRECISION NOT NULL, status TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, "
    "attempts INTEGER NOT NULL DEFAULT 1, location TEXT, extra_delta DOUBLE PRECISION NOT NULL DEFAULT 0, "
    "owner TEXT)",
    "CREATE INDEX IF NOT EXISTS spends_by_dataset ON spends (dataset_id)",
    "CREATE TABLE IF NOT EXISTS public_inputs (path TEXT PRIMARY KEY, sha256 TEXT NOT NULL, source TEXT NOT NULL, "
    "registered_at TEXT NOT NULL)",
)

#: Columns added after the first ledgers were written: (table, column, declaration).
ADDED = (("spends", "attempts", "INTEGER NOT NULL DEFAULT 1"), ("spends", "location", "TEXT"),
         ("spends", "extra_delta", "DOUBLE PRECISION NOT NULL DEFAULT 0"), ("spends", "owner", "TEXT"),
         ("budgets", "source", "TEXT"), ("budgets", "reading", "TEXT"), ("budgets", "source_digest", "TEXT"),
         ("budget_changes", "seq", "INTEGER"))


def upgrade() -> None:
    bind = op.get_bind()
    for statement in TABLES:
        op.execute(statement)
    inspector = sa.inspect(bind)
    held = {table: {c["name"] for c in inspector.get_columns(table)} for table, _, _ in ADDED}
    for table, column, declaration in ADDED:
        if column not in held[table]:
            op.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            if (table, column) == ("budget_changes", "seq") and bind.dialect.name == "sqlite":
                # Ledgers written before `seq` are SQLite files (the PostgreSQL ledger began with it).
                op.execute("UPDATE budget_changes SET seq = rowid")


def downgrade() -> None:
    raise NotImplementedError("the baseline is not undone: it would drop every budget and spend of the ledger")
