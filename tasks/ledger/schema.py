"""The ledger's schema, in SQL both of its backends run (`tasks.ledger.store`: a SQLite file or a PostgreSQL
database)."""

#: The tables, in SQL both backends run (DOUBLE PRECISION: PostgreSQL's REAL has 24 bits of mantissa).
SCHEMA = (
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

#: Every table, with the key that orders its rows (a budget's history is in the order of `seq`).
TABLES = {"budgets": "dataset_id", "budget_changes": "seq", "spends": "release_id", "public_inputs": "path"}

#: Columns added since the first ledgers were written: (table, column, declaration).
ADDED = (("spends", "attempts", "INTEGER NOT NULL DEFAULT 1"), ("spends", "location", "TEXT"),
         ("spends", "extra_delta", "DOUBLE PRECISION NOT NULL DEFAULT 0"), ("spends", "owner", "TEXT"),
         ("budgets", "source", "TEXT"), ("budgets", "reading", "TEXT"), ("budgets", "source_digest", "TEXT"),
         ("budget_changes", "seq", "INTEGER"))
