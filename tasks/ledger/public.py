"""Public inputs: the files (public marginals, public samples) an operator declared public, with where they come
from and their sha256. A spec naming a file does not make it public: a release may read as public only a file
registered here and unchanged since, and reads it from a private copy checked against the registration."""

from __future__ import annotations

import hashlib
from pathlib import Path

from dpalgos.lazy import module
from tasks import storage
from tasks.errors import ReleaseConflict
from tasks.ledger import schema
from tasks.ledger.bindings import data_source, within
from tasks.ledger.store import now

sa = module("sqlalchemy")


class PublicInputs:
    """The ledger's registry of public inputs (a part of `PrivacyLedger`)."""

    def register_public(self, path: str, source: str) -> str:
        """Declare a file (or folder) public, with where it comes from: an operator's decision, as a budget is.
        Refused for the data of a dataset (a bound source, inside one, or a byte-identical copy of a bound file).
        Returns its sha256."""
        where = data_source(path)
        digest = content_sha256(where)  # before the ledger's lock: a folder may take a while to read
        same_bytes = storage.digest(where) if not storage.is_dir(where) else None
        with self._transaction(immediate=True) as db:
            b = schema.budgets.c
            bound = sa.select(b.dataset_id, b.source, b.source_digest).where(b.source.is_not(None))
            for row in db.execute(bound).mappings():
                if within(where, row["source"]) or within(row["source"], where) or \
                        (same_bytes is not None and row["source_digest"] == same_bytes):
                    raise ReleaseConflict(f"{where} holds the data of dataset '{row['dataset_id']}': it cannot "
                                          f"be declared public")
            # Registered again: the new registration replaces the old (under the writers' lock, read then written).
            table = schema.public_inputs
            db.execute(sa.delete(table).where(table.c.path == where))
            db.execute(sa.insert(table).values(path=where, sha256=digest, source=source, registered_at=now()))
        return digest

    def public_inputs(self) -> list[dict]:
        table = schema.public_inputs
        with self._transaction() as db:
            return [dict(r) for r in db.execute(sa.select(table).order_by(table.c.path)).mappings()]


def public_copy(path: str, into: Path, ledger) -> Path:
    """A private local copy of a public input (a local file or folder, or a store's), checked: the bytes a release
    reads are those the operator declared public (the copy's sha256 against the registry of `ledger`, a
    PrivacyLedger; None: test mode, unchecked). Reading the copy and not the path closes the window in which the file
    could be swapped after a check (an audit swapped the registered marginals for the data mid-run and released its
    exact table)."""
    where = data_source(path)
    dst = storage.copy_into(where, into)
    if ledger is not None:
        registered = {r["path"]: r["sha256"] for r in ledger.public_inputs()}
        if registered.get(where) != content_sha256(str(dst)):
            raise ReleaseConflict(f"the public input {where} is not, or no longer, what the operator declared public "
                                  f"(`dprelease public list`); nothing was released")
    return dst


def content_sha256(location: str) -> str:
    """sha256 of a file (its name and bytes), or of a folder's files (their relative paths and bytes, in order), local
    or in a store: what a public input's registration records (public inputs are small: they are read whole)."""
    h = hashlib.sha256()
    single = not storage.is_dir(location)
    for f in storage.files(location):
        h.update((storage.name(f) if single else storage.relative(f, location)).encode())
        h.update(storage.read_bytes(f))
    return h.hexdigest()
