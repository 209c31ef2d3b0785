"""The ledger's schema versions (tasks/ledger/versions.py, tasks/ledger/migrations/): a ledger written by the code
before schema versions, on SQLite and on PostgreSQL, is upgraded by `dprelease ledger upgrade` (the CLI's entry
point, in a process of its own) with every row kept, and its releases go on; so is a ledger of the first schema,
before the columns the old code added by hand; a ledger newer than the code is refused in one line; the tables the
statements are written against are the schema the migrations make."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from dpalgos import dpkmeans
from tasks.errors import ReleaseError
from tasks.ledger import PrivacyLedger
from tasks.ledger.schema import HEAD, METADATA, TABLES, VERSION_TABLE
from tasks.ledger.store import transaction
from tasks.ledger.versions import scripts
from tests.conftest import first_schema_ledger

ROOT = Path(__file__).resolve().parents[1]
#: The last commit whose ledger had no schema versions (its columns added from a hand-kept list): its own code
#: writes the ledgers these tests upgrade.
BEFORE_VERSIONS = "417095c413b01f87160f89cd5b56b83bef1c19f8"

#: Run by the code before schema versions: a ledger with budgets and their history (a reason among them), a binding
#: with a reading, a public input, and releases in every status, one charged twice (a draw that failed before its
#: commit). Prints the composed spend of each dataset, as that code computes it.
_OLD_LEDGER = """
import json, sys
from dpalgos import dpkmeans
from tasks.ledger import PrivacyLedger
location, data = sys.argv[1], sys.argv[2]
ledger = PrivacyLedger(location)
reading = {"format": "csv", "header": True, "delimiter": ",", "user_column": None, "weight_column": None,
           "weights_count_records": False}
ledger.set_budget("a", 2.0, 1e-6, source=data + "/a.csv", reading=reading)
ledger.set_budget("b", 5.0, 1e-5)
kw = dict(kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.4, iterations=5), redraw=True)
for release_id, status in (("a1", "published"), ("a2", "measured"), ("a3", "drawing")):
    ledger.charge(dataset_id="a", release_id=release_id, owner=release_id, location="/runs/" + release_id, **kw)
    ledger.begin_draw(release_id, release_id)
    if status != "drawing":
        ledger.mark(release_id, status)
ledger.charge(dataset_id="a", release_id="a3", owner="retry", location="/runs/a3", **kw)
ledger.set_budget("a", 3.0, 1e-6, reason="approved by the data owner")
ledger.charge(dataset_id="b", release_id="b1", owner="b1", **kw)
open(data + "/m.csv", "w").write("a,count\\nu,1\\n")
ledger.register_public(data + "/m.csv", "census 2021")
print(json.dumps({d: ledger.spent(d).epsilon for d in ("a", "b")}))
"""


@pytest.fixture(scope="module")
def old_code(tmp_path_factory) -> Path:
    """The packages of the commit before schema versions, from the repository's history."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", BEFORE_VERSIONS, "tasks", "dpalgos",
                              "data_contracts"], capture_output=True)
    if archive.returncode != 0:
        pytest.fail(f"the repository's history has no commit {BEFORE_VERSIONS[:7]} (a shallow clone?): "
                    f"{archive.stderr.decode()[-300:]}")
    where = tmp_path_factory.mktemp("before-versions")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(where, filter="data")
    return where


def _python(code_root: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A Python process importing the project's packages from `code_root` only (its working folder has none)."""
    env = {**os.environ, "PYTHONPATH": str(code_root), "PYTHONSAFEPATH": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _rows(location: str) -> dict[str, list[tuple]]:
    """Every row of every table, read with the database's own client (not the ledger's code)."""
    if location.startswith("postgresql://"):
        with psycopg.connect(location) as conn:
            return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY {k}")] for t, k in TABLES.items()}
    with sqlite3.connect(location) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY {k}").fetchall() for t, k in TABLES.items()}


def test_dprelease_ledger_upgrade_migrates_a_ledger_of_the_code_before_versions_without_loss(
        ledger_location, old_code, tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    written = _python(old_code, "-c", _OLD_LEDGER, ledger_location, str(tmp_path), cwd=tmp_path)
    assert written.returncode == 0, written.stderr[-2000:]
    spent_before = json.loads(written.stdout)
    before = _rows(ledger_location)
    assert [len(before[t]) for t in TABLES] == [2, 3, 4, 1]

    upgrade = _python(ROOT, "-m", "flows.cli", "ledger", "upgrade", "--ledger", ledger_location, cwd=tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr[-2000:]
    assert upgrade.stdout.endswith(f"upgraded from schema revision none (a new ledger, or one written before schema "
                                   f"versions) to {HEAD}\n")
    assert _rows(ledger_location) == before
    again = _python(ROOT, "-m", "flows.cli", "ledger", "upgrade", "--ledger", ledger_location, cwd=tmp_path)
    assert again.returncode == 0 and f"at schema revision {HEAD}" in again.stdout and "nothing to do" in again.stdout

    # The releases go on: the same spends composed, a new release charged against them, the failed draw's rerun.
    ledger = PrivacyLedger(ledger_location)
    assert {d: ledger.spent(d).epsilon for d in ("a", "b")} == spent_before
    assert [(r["release_id"], r["status"], r["attempts"]) for r in ledger.releases("a")] == \
        [("a1", "published", 1), ("a2", "measured", 1), ("a3", "charged", 2)]
    assert ledger.charge(dataset_id="b", release_id="b2", kind="kmeans", fingerprint="f",
                         plan=dpkmeans.plan(epsilon=0.4, iterations=5)).state == "charged"
    ledger.begin_draw("a3", "retry")
    ledger.mark("a3", "measured")
    assert ledger.spent("b").epsilon > spent_before["b"] and ledger.status("a3") == "measured"
    assert [h["reason"] for h in ledger.budget_history("a")] == [None, "approved by the data owner"]


def test_a_sqlite_ledger_of_the_first_schema_is_upgraded_with_its_history_in_order(tmp_path):
    """The first ledgers had none of the columns added since (the old code's hand-kept list); their budget changes
    were ordered by rowid."""
    path = tmp_path / "first.sqlite"
    first_schema_ledger(path)
    upgrade = _python(ROOT, "-m", "flows.cli", "ledger", "upgrade", "--ledger", str(path), cwd=tmp_path)
    assert upgrade.returncode == 0 and f"to {HEAD}" in upgrade.stdout, upgrade.stderr[-2000:]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT seq, new_epsilon FROM budget_changes ORDER BY rowid").fetchall() == [(1, 3.0),
                                                                                                      (2, 2.0)]
    ledger = PrivacyLedger(path)
    ledger.set_budget("d", 1.0, 1e-6)
    assert [h["new_epsilon"] for h in ledger.budget_history("d")] == [3.0, 2.0, 1.0]
    ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True, owner="A",
                  plan=dpkmeans.plan(epsilon=0.5, iterations=1))
    assert [(r["attempts"], r["location"]) for r in ledger.releases("d")] == [(1, None)]


def test_a_ledger_newer_than_the_code_is_refused_in_one_line(ledger_location, tmp_path):
    PrivacyLedger(ledger_location).set_budget("d", 1.0, 1e-6)
    ledger = PrivacyLedger(ledger_location)
    with transaction(ledger._db, "write") as db:
        db.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(ReleaseError) as refused:
        PrivacyLedger(ledger_location)
    assert "at schema revision 9999, newer than this dprelease knows" in str(refused.value)
    for command in (("budget", "show", "d"), ("ledger", "upgrade")):
        run = _python(ROOT, "-m", "flows.cli", *command, "--ledger", ledger_location, cwd=tmp_path)
        assert run.returncode == 1 and run.stderr.count("\n") == 1 and "newer than this dprelease" in run.stderr
        assert "Traceback" not in run.stderr


def test_head_is_the_newest_migration():
    assert scripts().get_current_head() == HEAD


def test_the_declared_tables_are_what_the_migrations_make(ledger_location):
    """The statements' tables (schema.py) and a ledger migrated to HEAD agree: a revision without its change of
    schema.py, or the other way round, fails here. On SQLite two differences are SQLite's own and not compared: it
    reports the affinity it gives a declared type (DOUBLE PRECISION is REAL there), and a TEXT PRIMARY KEY that may be
    NULL (SQLite's legacy rule for keys that are not INTEGER; the ledger never writes one)."""
    ledger = PrivacyLedger(ledger_location)
    with transaction(ledger._db, "read") as db:
        sqlite = db.dialect.name == "sqlite"
        context = MigrationContext.configure(db, opts={"compare_type": not sqlite, "version_table": VERSION_TABLE})
        differences = [d for d in compare_metadata(context, METADATA)
                       if not (sqlite and isinstance(d, list) and d[0][0] == "modify_nullable"
                               and METADATA.tables[d[0][2]].c[d[0][3]].primary_key)]
        assert differences == []
        columns = {t: [c["name"] for c in sa.inspect(db).get_columns(t)] for t in TABLES}
    assert columns == {t: [c.name for c in METADATA.tables[t].columns] for t in TABLES}
