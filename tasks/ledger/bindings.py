"""Dataset bindings: the data a dataset id stands for, how it is read, and what its content was when bound.

One data source is one dataset (one budget): the same records released under two ids would compose outside
either budget, so a source inside or around another dataset's is refused, and so is a source whose content is
byte for byte another dataset's (a review bound a copy of a dataset, under another path, to a fresh budget). How
the data is parsed and what one record is (`tasks.params.READING_FIELDS`) are bound with it: a spec choosing them
would make the data's refusals answer its questions, or redefine the neighbouring relation.
"""

from __future__ import annotations

import json

from dpalgos.lazy import module
from tasks import storage
from tasks.errors import ReleaseConflict
from tasks.example_data import BUILTIN_PREFIX
from tasks.ledger import schema

sa = module("sqlalchemy")


class Bindings:
    """The ledger's dataset bindings (a part of `PrivacyLedger`; see the module docstring)."""

    def bind(self, dataset_id: str, source: str, reading: dict | None) -> None:
        """Bind a dataset with no source or reading yet to these, committed at once: a run's check before it reads
        the data, so that a run refused while reading (never charged) still fixes how the dataset is read (an audit
        probed the data with one delimiter after another until a release first succeeded). Refuses as `charge` would
        for a dataset bound otherwise."""
        digest = source_digest(data_source(source)) if self.source(dataset_id) is None else None
        with self._transaction(immediate=True) as db:
            self._budget_locked(db, dataset_id)
            self._bind_locked(db, dataset_id, data_source(source), reading, digest)

    def source(self, dataset_id: str) -> str | None:
        """The data source the dataset id is bound to (None: not yet)."""
        c = schema.budgets.c
        with self._transaction() as db:
            return db.execute(sa.select(c.source).where(c.dataset_id == dataset_id)).scalar()

    def sources(self) -> list[str]:
        """Every bound data source."""
        c = schema.budgets.c
        with self._transaction() as db:
            return list(db.execute(sa.select(c.source).where(c.source.is_not(None))).scalars())

    def reading(self, dataset_id: str) -> dict | None:
        """How the dataset's data is read, as the operator or its first release bound it (None: not yet)."""
        c = schema.budgets.c
        with self._transaction() as db:
            reading = db.execute(sa.select(c.reading).where(c.dataset_id == dataset_id)).scalar()
        return json.loads(reading) if reading else None

    def _bind_locked(self, db, dataset_id: str, source: str, reading: dict | None, digest: str | None) -> None:
        row = db.execute(sa.select(schema.budgets.c.source, schema.budgets.c.reading)
                         .where(schema.budgets.c.dataset_id == dataset_id)).mappings().one()
        if row["source"] is not None and not within(source, row["source"]):
            raise ReleaseConflict(source_conflict_message(dataset_id, row["source"], source))
        if row["source"] is None:
            self._one_id_per_source_locked(db, dataset_id, source, digest)
        check_reading(dataset_id, json.loads(row["reading"]) if row["reading"] else None, reading, source)
        c = schema.budgets.c
        db.execute(sa.update(schema.budgets).where(c.dataset_id == dataset_id).values(
            source=sa.func.coalesce(c.source, source),
            source_digest=sa.func.coalesce(c.source_digest, digest if row["source"] is None else None),
            reading=sa.func.coalesce(c.reading, None if reading is None else json.dumps(unit_fields(reading),
                                                                                        sort_keys=True))))

    @staticmethod
    def _one_id_per_source_locked(db, dataset_id: str, source: str, digest: str | None) -> None:
        """One data source is one dataset (one budget), whether it is named by a path around or inside another
        dataset's, or is a byte-identical copy of one."""
        c = schema.budgets.c
        for row in db.execute(sa.select(c.dataset_id, c.source, c.source_digest)
                              .where(c.source.is_not(None), c.dataset_id != dataset_id)).mappings():
            if within(source, row["source"]) or within(row["source"], source):
                raise ReleaseConflict(f"the data {source} is dataset '{row['dataset_id']}''s ({row['source']}): one "
                                      f"data source has one budget (its releases under another id would compose "
                                      f"outside it); release it as '{row['dataset_id']}'. Nothing was run")
            if digest is not None and row["source_digest"] == digest:
                raise ReleaseConflict(f"the data {source} holds the same content as dataset '{row['dataset_id']}''s "
                                      f"({row['source']}): one data source has one budget, whatever its path; "
                                      f"release it as '{row['dataset_id']}'. Nothing was run")

    @staticmethod
    def _check_rebinding_locked(db, dataset_id: str, reading: dict) -> None:
        c = schema.budgets.c
        row = db.execute(sa.select(c.reading).where(c.dataset_id == dataset_id)).mappings().first()
        if row is None or row["reading"] is None:
            return
        bound = json.loads(row["reading"])
        if unit_fields(bound) == unit_fields(reading):
            return  # the privacy unit is unchanged (the path stays inside the bound source)
        s = schema.spends.c
        if db.execute(sa.select(s.release_id).where(s.dataset_id == dataset_id).limit(1)).first():
            raise ReleaseConflict(reading_conflict_message(
                dataset_id, unit_fields(bound), unit_fields(reading), asker="the new reading",
                outcome="The dataset has releases, whose privacy unit is the bound reading's: nothing was changed"))


def source_digest(source: str) -> str | None:
    """What a bound source holds, whatever its path (`storage.digest`: a file's sha256, a folder's digest manifest, a
    store's manifest of its objects' versions or ETags); None where there is nothing to compare (a built-in dataset, a
    source not written yet, an empty folder)."""
    return None if source.startswith(BUILTIN_PREFIX) else storage.digest(source)


def data_source(path: str) -> str:
    """A dataset's data as the ledger binds it: the canonical location (`storage.canonical`: a local path absolute and
    resolved, or a store's URL), or a built-in dataset's name."""
    return path if path.startswith(BUILTIN_PREFIX) else storage.canonical(path)


def within(source: str, bound: str) -> bool:
    """The release's data is the bound source, or inside the bound folder or prefix."""
    return source == bound or (not bound.startswith(BUILTIN_PREFIX) and storage.within(source, bound))


def unit_fields(reading: dict) -> dict:
    """The fields of a reading that decide how records are parsed and what one is (`tasks.params.READING_FIELDS`)."""
    return {k: v for k, v in reading.items() if k not in ("path", "columns")}


def check_reading(dataset_id: str, bound: dict | None, reading: dict | None, source: str | None) -> None:
    """Refuse a release that reads the dataset otherwise than bound. A reading the operator bound
    (`dprelease budget set --reading-from`) also names the path and the columns, with how each is parsed: its
    releases read exactly that file or folder (an audit read the first line of a note beside the data, in the
    bound folder, through the missing-column refusal), and only those columns (otherwise a spec picks the columns
    whose refusals answer "has any value missing or not a number")."""
    if bound is None:
        return
    if "path" in bound and source is not None and source != bound["path"]:
        # Not echoing the spec's path resolved: a symlink inside the data's folder would show its target.
        raise ReleaseConflict(f"dataset '{dataset_id}' is read as bound to its budget (path={bound['path']!r}); this "
                              f"spec reads another path: its releases read exactly that file or folder (the "
                              f"operator's `dprelease budget set --reading-from`). Nothing was run")
    if reading is None:
        return
    if unit_fields(reading) != unit_fields(bound):
        raise ReleaseConflict(reading_conflict_message(dataset_id, unit_fields(bound), unit_fields(reading)))
    if "columns" in bound:
        asked_columns = reading.get("columns", {})
        other = {c: how for c, how in sorted(asked_columns.items()) if bound["columns"].get(c) != how}
        if other:
            raise ReleaseConflict(
                f"dataset '{dataset_id}' is read as bound to its budget, whose columns are "
                f"{_columns(bound['columns'])}; this spec reads {_columns(other)}: a release reads the columns the "
                f"operator declared (`dprelease budget set --reading-from`), as declared. Nothing was run")


def _columns(columns: dict) -> str:
    return ", ".join(f"{c} ({how})" for c, how in sorted(columns.items()))


def reading_conflict_message(dataset_id: str, bound: dict, reading: dict, asker: str = "this spec",
                             outcome: str = "Nothing was run") -> str:
    changed = {k: reading.get(k) for k in sorted(set(bound) | set(reading)) if bound.get(k) != reading.get(k)}
    was = ", ".join(f"{k}={bound.get(k)!r}" for k in changed)
    asked = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    return (f"dataset '{dataset_id}' is read as bound to its budget ({was}); {asker} asks {asked}: how a "
            f"dataset is parsed and what one record is are fixed for its budget (otherwise a spec's choice of them "
            f"would make the data's refusals answer its questions). {outcome}")


def source_conflict_message(dataset_id: str, bound: str, source: str) -> str:
    return (f"dataset '{dataset_id}' is bound to the data {bound}; this release reads {source}: a dataset id "
            f"spends the budget of its own data only (an operator binds it with `dprelease budget set "
            f"{dataset_id} --epsilon E --source PATH --reading-from SPEC`). Nothing was run")
