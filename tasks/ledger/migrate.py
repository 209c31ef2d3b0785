"""Copying a ledger into another store: how an operator moves a team from a SQLite file to a PostgreSQL database
that every host shares (`dprelease ledger migrate`; docs/how-to/shared-ledger.md).

The copy is row for row, every table, in one write transaction on each side: no release can change the source while
it is read (its writers' lock is held, and nothing is written to it), and none can use the target before the copy
is complete and checked (the target's writers' lock, then one commit). The check, before the commit: each table
holds as many rows in the target as in the source, and every dataset has the same lifetime budget and composes to
the same spend (the same events in the same order: the same floating-point figures, compared exactly). A failed
check leaves the target as it was, empty.
"""

from __future__ import annotations

import sqlalchemy as sa

from tasks.errors import ReleaseConflict, ReleaseError
from tasks.ledger.schema import METADATA, TABLES, budgets


def copy_ledger(source, target) -> dict:
    """Copy every row of `source` into `target` (PrivacyLedgers), which must hold none. Returns the rows copied per
    table and, per dataset, its lifetime (epsilon, delta) and composed spent epsilon, as both ledgers hold them."""
    with source._transaction(immediate=True, keep=False) as src, target._transaction(immediate=True) as dst:
        held = _counts(dst)
        if any(held.values()):
            raise ReleaseConflict(f"the ledger {target.name} is not empty ({_listed(held)}): a migration copies "
                                  f"into a ledger that holds nothing. Nothing was copied")
        for name, key in TABLES.items():
            table = METADATA.tables[name]
            rows = [dict(r) for r in src.execute(sa.select(table).order_by(table.c[key])).mappings()]
            if rows:
                dst.execute(sa.insert(table), rows)
        copied = _counts(src)
        if _counts(dst) != copied:
            raise ReleaseError(f"the copy into {target.name} holds {_listed(_counts(dst))} rows, the source "
                               f"{_listed(copied)}: nothing was copied")
        datasets = {d: _figures(source, src, d) for d in _datasets(src)}
        for dataset_id, figures in datasets.items():
            if _figures(target, dst, dataset_id) != figures:
                raise ReleaseError(f"dataset '{dataset_id}' has another budget or spend in the copy into "
                                   f"{target.name} than in {source.name}: nothing was copied")
    return {"rows": copied, "datasets": datasets}


def _counts(db) -> dict[str, int]:
    return {name: db.execute(sa.select(sa.func.count()).select_from(METADATA.tables[name])).scalar()
            for name in TABLES}


def _listed(counts: dict[str, int]) -> str:
    return ", ".join(f"{table} {n}" for table, n in counts.items())


def _datasets(db) -> list[str]:
    return list(db.execute(sa.select(budgets.c.dataset_id).order_by(budgets.c.dataset_id)).scalars())


def _figures(ledger, db, dataset_id: str) -> tuple[float, float, float]:
    """The dataset's lifetime (epsilon, delta) and the epsilon its releases compose to, at that delta."""
    epsilon, delta = ledger._budget_locked(db, dataset_id)
    return epsilon, delta, ledger._total_locked(db, dataset_id, delta).epsilon
