"""The ledger's tables, declared once in SQLAlchemy Core: every statement of the ledger is written against these, and
SQLAlchemy renders it for SQLite or PostgreSQL (`tasks.ledger.store`).

How a ledger's tables came to be what these declare is the migrations' (tasks/ledger/migrations/, alembic): the
baseline creates them, or brings a ledger written before schema versions to them; a later change of a table is a
new revision there AND a change here (tests/test_ledger_migrations.py compares the two on both backends).
"""

from __future__ import annotations

import threading

from dpalgos.lazy import module

sa = module("sqlalchemy")

#: The revision of tasks/ledger/migrations/ these tables are (the newest): a ledger at it is opened without loading
#: alembic (a second of imports on every command); tests/test_ledger_migrations.py checks it is the scripts' head.
HEAD = "0001"
#: The table where a ledger keeps its revision. Not alembic's default `alembic_version`: an operator may give the
#: ledger a database that another alembic-versioned application (Prefect's server) keeps its own revision in.
VERSION_TABLE = "dprelease_ledger_version"

#: Every table, with the key that orders its rows (a budget's history is in the order of `seq`).
TABLES = {"budgets": "dataset_id", "budget_changes": "seq", "spends": "release_id", "public_inputs": "path"}

#: The tables (and their METADATA), declared on the first read of any of them (`__getattr__`): SQLAlchemy takes a
#: tenth of a second to import, which every command paid at import, even one that never reads a ledger or that the
#: admission refuses before its ledger rule (a spec nested too deeply).
_DECLARED: dict = {}
_LOCK = threading.Lock()


def __getattr__(name: str):
    """`schema.budgets`, `schema.spends`, ... and `schema.METADATA`."""
    if name != "METADATA" and name not in TABLES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _LOCK:
        if not _DECLARED:
            _DECLARED.update(_declare())
    return _DECLARED[name]


def _declare() -> dict:
    metadata = sa.MetaData()
    budgets = sa.Table(
        "budgets", metadata,
        sa.Column("dataset_id", sa.Text, primary_key=True),
        sa.Column("epsilon", sa.Double, nullable=False),
        sa.Column("delta", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.Column("source", sa.Text),
        sa.Column("reading", sa.Text),
        sa.Column("source_digest", sa.Text),
    )

    # A budget's history, in the order of `seq` (no key: one row per change, never updated).
    budget_changes = sa.Table(
        "budget_changes", metadata,
        sa.Column("dataset_id", sa.Text, nullable=False),
        sa.Column("changed_at", sa.Text, nullable=False),
        sa.Column("old_epsilon", sa.Double),
        sa.Column("old_delta", sa.Double),
        sa.Column("new_epsilon", sa.Double, nullable=False),
        sa.Column("new_delta", sa.Double, nullable=False),
        sa.Column("spent_epsilon", sa.Double, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("seq", sa.Integer),
    )

    spends = sa.Table(
        "spends", metadata,
        sa.Column("release_id", sa.Text, primary_key=True),
        sa.Column("dataset_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.Text, nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("epsilon", sa.Double, nullable=False),
        sa.Column("delta", sa.Double, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
        sa.Column("location", sa.Text),
        sa.Column("extra_delta", sa.Double, nullable=False, server_default="0"),
        sa.Column("owner", sa.Text),
        sa.Index("spends_by_dataset", "dataset_id"),
    )

    public_inputs = sa.Table(
        "public_inputs", metadata,
        sa.Column("path", sa.Text, primary_key=True),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("registered_at", sa.Text, nullable=False),
    )
    return {"METADATA": metadata, "budgets": budgets, "budget_changes": budget_changes, "spends": spends,
            "public_inputs": public_inputs}
