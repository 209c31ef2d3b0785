"""The ledger's two stores (tasks/ledger/store.py): a SQLite file and a PostgreSQL database on a server the session
starts (tests/postgres.py). What is the same on both is tested once per backend in tests/test_ledger.py (the races
too); here: what only a database URL has (its password never shown, its errors one line), older ledgers' columns,
and `dprelease ledger migrate`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from dpalgos import dpkmeans
from flows.cli import main
from tasks.errors import NoBudget, ReleaseError
from tasks.ledger import LEDGER_ENV, PrivacyLedger, configured_location
from tasks.ledger.schema import VERSION_TABLE
from tests.conftest import blobs, first_schema_ledger, spec_dict, write_csv

PASSWORD = "s3cret-Pa55"


@pytest.fixture
def cli(capsys):
    """`dprelease ARGS...` in this process (the budget and ledger commands import nothing the tests have not):
    its exit code, stdout and stderr."""
    def run(*args) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return run


def _with_password(url: str) -> str:
    """The URL with a password (the test server trusts loopback: it is not checked, and must never be shown)."""
    return url.replace("postgresql://dprelease@", f"postgresql://dprelease:{PASSWORD}@")


def test_the_password_of_a_database_url_is_never_shown(postgres, tmp_path, monkeypatch, cli):
    url = _with_password(postgres.new_database())
    monkeypatch.setenv(LEDGER_ENV, url)
    assert PASSWORD not in configured_location() and "dprelease:***@" in configured_location()
    with pytest.raises(NoBudget) as refused:
        PrivacyLedger(url).charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f",
                                  plan=dpkmeans.plan(epsilon=0.1, iterations=1))
    assert "dprelease:***@" in str(refused.value) and PASSWORD not in str(refused.value)

    (tmp_path / "d.csv").write_text("x,y\n1,2\n")
    spec = spec_dict(tmp_path, tmp_path / "d.csv")
    for name, dataset_id in (("s.yaml", "d"), ("unset.yaml", "unset")):
        (tmp_path / name).write_text(yaml.safe_dump({**spec, "dataset": {**spec["dataset"], "id": dataset_id}}))
    (tmp_path / "m.csv").write_text("a,count\nu,1\n")
    outputs = [cli("budget", "set", "d", "--epsilon", "1", "--source", str(tmp_path / "d.csv"), "--reading-from",
                   str(tmp_path / "s.yaml")),
               cli("budget", "show", "d"), cli("budget", "show", "d", "--ledger", url),
               cli("budget", "show", "nothing"),
               cli("public", "register", str(tmp_path / "m.csv"), "--source", "census"), cli("public", "list"),
               cli("spec", "check", str(tmp_path / "unset.yaml"))]
    monkeypatch.setenv(LEDGER_ENV, url.replace(str(postgres.port), "1"))  # no server there
    outputs.append(cli("budget", "show", "d"))
    assert [code for code, _, _ in outputs] == [0, 0, 0, 1, 0, 0, 2, 1]
    assert "in postgresql://dprelease:***@127.0.0.1" in outputs[0][1]
    assert "ledger postgresql://dprelease:***@127.0.0.1" in outputs[1][1] and "sha256" in outputs[5][1]
    assert "has no budget in postgresql://dprelease:***@" in outputs[3][2]
    assert "has no lifetime budget in the ledger postgresql://dprelease:***@" in outputs[6][2]
    assert outputs[7][2].count("\n") == 1 and "error: cannot open privacy ledger" in outputs[7][2]
    assert not [o for o in outputs if PASSWORD in o[1] + o[2] or "Traceback" in o[1] + o[2]]


def test_a_bad_database_is_a_one_line_error_naming_it(postgres, tmp_path):
    for url, problem in ((postgres.url("absent"), 'database "absent" does not exist'),
                         (_with_password(postgres.url("x")).replace(str(postgres.port), "1"), "Connection refused"),
                         (_with_password(postgres.url("x")).replace(PASSWORD, PASSWORD + "%zz"),
                          "invalid percent-encoded token")):  # libpq's parser quotes the password
        with pytest.raises(ReleaseError) as failed:
            PrivacyLedger(url)
        assert str(failed.value).startswith("cannot open privacy ledger postgresql://dprelease")
        assert problem in str(failed.value) and "\n" not in str(failed.value) and PASSWORD not in str(failed.value)


def test_a_database_ledger_without_its_client_installed_is_a_one_line_error(monkeypatch, cli):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the postgres extra were not installed
    monkeypatch.delitem(sys.modules, "tasks.ledger.postgres", raising=False)
    code, _, err = cli("budget", "show", "d", "--ledger", f"postgresql://dprelease:{PASSWORD}@db.internal/ledger")
    assert code == 1 and err == ("error: the privacy ledger postgresql://dprelease:***@db.internal/ledger is a "
                                 "PostgreSQL database, and its client is not installed: pip install "
                                 "'dprelease[postgres]'\n")


def test_an_older_sqlite_ledger_gets_the_columns_added_since_and_keeps_its_history_in_order(tmp_path):
    """The first ledgers had none of the columns added since (the baseline revision adds them, as the code before
    schema versions did from a hand-kept list, on opening); their budget changes were ordered by rowid."""
    path = tmp_path / "old.sqlite"
    first_schema_ledger(path)
    ledger = PrivacyLedger(path)
    ledger.set_budget("d", 1.0, 1e-6)
    assert [h["new_epsilon"] for h in ledger.budget_history("d")] == [3.0, 2.0, 1.0]
    assert ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True, owner="A",
                         plan=dpkmeans.plan(epsilon=0.5, iterations=1)).state == "charged"
    assert [(r["attempts"], r["location"]) for r in ledger.releases("d")] == [(1, None)]


def test_a_sqlite_ledger_restored_under_a_running_process_is_the_one_it_reads(tmp_path):
    """The pool keeps connections open; a file replaced at the ledger's path (an operator restoring a backup) is
    reopened, not read and written through a connection to the file it replaced."""
    path, backup = tmp_path / "l.sqlite", tmp_path / "backup.sqlite"
    ledger = PrivacyLedger(path)
    ledger.set_budget("d", 1.0, 1e-6)
    shutil.copy(path, backup)
    ledger.set_budget("d", 2.0, 1e-6)
    os.replace(backup, path)
    assert ledger.budget("d") == (1.0, 1e-6)
    ledger.set_budget("d", 3.0, 1e-6)
    assert PrivacyLedger(path).budget("d") == (3.0, 1e-6)


def test_a_postgresql_ledger_missing_a_column_gets_it(postgres):
    """A ledger written before schema versions (no version table) and before a column was added: the baseline
    revision adds it (tests/test_ledger_migrations.py migrates the ledgers of main's own code)."""
    url = postgres.new_database()
    PrivacyLedger(url).set_budget("d", 1.0, 1e-6)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE spends DROP COLUMN owner")
        conn.execute("ALTER TABLE budgets DROP COLUMN source_digest")
        conn.execute(f"DROP TABLE {VERSION_TABLE}")
    ledger = PrivacyLedger(url)
    ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True, owner="A",
                  plan=dpkmeans.plan(epsilon=0.5, iterations=1))
    ledger.begin_draw("r", "A")
    assert ledger.status("r") == "drawing" and ledger.budget("d") == (1.0, 1e-6)


def _a_ledger_with_everything(path: Path, data: Path) -> PrivacyLedger:
    """Budgets with a history (a reason among them), bindings with a reading, public inputs, and releases in every
    status, one of them charged twice (a draw that failed before its commit)."""
    ledger = PrivacyLedger(path)
    reading = {"format": "csv", "header": True, "delimiter": ",", "user_column": None, "weight_column": None,
               "weights_count_records": False}
    ledger.set_budget("a", 2.0, 1e-6, source=str(data / "a.csv"), reading=reading)
    ledger.set_budget("b", 5.0, 1e-5)
    kw = dict(kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.4, iterations=5), redraw=True)
    for release_id, status in (("a1", "published"), ("a2", "measured"), ("a3", "drawing")):
        ledger.charge(dataset_id="a", release_id=release_id, owner=release_id, location=f"/runs/{release_id}", **kw)
        ledger.begin_draw(release_id, release_id)
        if status != "drawing":
            ledger.mark(release_id, status)
    ledger.charge(dataset_id="a", release_id="a3", owner="retry", location="/runs/a3", **kw)  # charged again
    ledger.set_budget("a", 3.0, 1e-6, reason="approved by the data owner")
    ledger.charge(dataset_id="b", release_id="b1", owner="b1", **kw)
    (data / "m.csv").write_text("a,count\nu,1\n")
    ledger.register_public(str(data / "m.csv"), "census 2021")
    return ledger


def _contents(ledger: PrivacyLedger) -> dict:
    return {d: (ledger.budget(d), ledger.budget_history(d), ledger.releases(d), ledger.spent(d), ledger.source(d),
                ledger.reading(d)) for d in ("a", "b")} | {"public": ledger.public_inputs()}


def test_ledger_migrate_copies_a_sqlite_ledger_into_postgresql_and_refuses_a_second_copy(postgres, tmp_path, cli):
    path, url = tmp_path / "team.sqlite", _with_password(postgres.new_database())
    source = _a_ledger_with_everything(path, tmp_path)
    before = path.read_bytes()
    code, out, err = cli("ledger", "migrate", "--from", str(path), "--to", url)
    assert code == 0, err
    assert "budgets 2 rows, budget_changes 3 rows, spends 4 rows, public_inputs 1 rows" in out
    assert "dataset 'a': lifetime epsilon=3 delta=1e-06" in out and PASSWORD not in out
    target = PrivacyLedger(url)
    assert _contents(target) == _contents(source) and path.read_bytes() == before
    assert [r["attempts"] for r in target.releases("a")] == [1, 1, 2]

    code, _, err = cli("ledger", "migrate", "--from", str(path), "--to", url)
    assert code == 1 and "is not empty (budgets 2, budget_changes 3, spends 4" in err
    assert _contents(target) == _contents(source)
    # The copy is a ledger like any other: it goes on from where the file stopped.
    target.charge(dataset_id="b", release_id="b2", kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.4,
                                                                                                     iterations=5))
    assert [r["release_id"] for r in target.releases("b")] == ["b1", "b2"] and source.releases("b")[-1]["release_id"] \
        == "b1"


def test_ledger_migrate_refuses_what_it_does_not_copy(postgres, tmp_path, monkeypatch, cli):
    url = postgres.new_database()
    usage = "ledger migrate copies a SQLite file"
    for args, message in ((("--from", str(tmp_path / "l.sqlite"), "--to", str(tmp_path / "b.sqlite")), usage),
                          (("--from", str(tmp_path / "absent.sqlite"), "--to", url), "no privacy ledger at")):
        code, _, err = cli("ledger", "migrate", *args)
        assert code == 2 and message in err, err
    monkeypatch.setenv(LEDGER_ENV, url)  # no --from: the setting, a database already
    code, _, err = cli("ledger", "migrate", "--to", postgres.new_database())
    assert code == 2 and usage in err
    assert not (tmp_path / "absent.sqlite").exists()


@pytest.mark.slow  # one CLI release, its own Prefect API: ~40 s
def test_a_release_on_a_postgresql_ledger(postgres, tmp_path, monkeypatch):
    """The whole path on a database: admission, charge, lease, marks, manifest, report and artifacts; the password in
    no output and no file of the run (its log included)."""
    url = _with_password(postgres.new_database())
    monkeypatch.setenv(LEDGER_ENV, url)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec_dict(tmp_path, write_csv(tmp_path / "b.csv", blobs(2000)))))
    run = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(tmp_path / "s.yaml"), "--release-id", "pg-1",
                          "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect-home")})
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["status"] == "published"
    assert [(r["release_id"], r["status"], r["attempts"]) for r in PrivacyLedger(url).releases("blobs")] == \
        [("pg-1", "published", 1)]
    assert PASSWORD not in run.stdout + run.stderr
    assert not [f for f in (tmp_path / "runs").rglob("*") if f.is_file() and PASSWORD.encode() in f.read_bytes()]
