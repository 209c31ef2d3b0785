"""The ledger's retries on errors that pass, each caused for real (no mock): the PostgreSQL backend of a pooled
connection terminated between two transactions and in the middle of a charge's write, and a SQLite file locked by
another process beyond the busy timeout. A retried charge is charged once."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from dpalgos import dpkmeans
from tasks.errors import LedgerBusy
from tasks.ledger import PrivacyLedger, store
from tasks.transient import riding_out

OUTAGE_ENV = "DPRELEASE_OUTAGE_RETRY_SECONDS"


def _charge(ledger: PrivacyLedger, release_id: str):
    return ledger.charge(dataset_id="d", release_id=release_id, kind="kmeans", fingerprint="f", redraw=True,
                         owner="A", location="/runs/a", plan=dpkmeans.plan(epsilon=0.5, iterations=5))


def _backends(url: str) -> list[int]:
    """The server processes of the ledger's connections (its application_name), this test's own excluded."""
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'dprelease' "
                                           "AND datname = current_database() AND pid <> pg_backend_pid()")]


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]


def test_a_pooled_connection_whose_backend_was_terminated_is_replaced_unseen(postgres):
    """Between two transactions: the pool checks a connection before lending it, so even an operator's command
    (no retries) does not see it."""
    url = postgres.new_database()
    ledger = PrivacyLedger(url)
    ledger.set_budget("d", 10.0, 1e-6)
    pooled = _backends(url)
    assert len(pooled) == 1  # one idle connection, kept by the pool
    _terminate(url, pooled[0])
    assert _charge(ledger, "r").state == "charged"
    assert _backends(url) not in ([], pooled)


def test_a_charge_whose_backend_is_terminated_mid_write_is_retried_and_charged_once(postgres, monkeypatch, caplog):
    """The backend is terminated after the charge's INSERT ran and before its commit (a trigger holds the INSERT
    for a while): the transaction is rolled back by the server, the ledger retries the charge on a new connection,
    and the release is charged once."""
    url = postgres.new_database()
    ledger = PrivacyLedger(url)
    ledger.set_budget("d", 10.0, 1e-6)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION slow() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(30); RETURN NEW; END $$ "
                     "LANGUAGE plpgsql")
        conn.execute("CREATE TRIGGER slow_insert BEFORE INSERT ON spends FOR EACH ROW EXECUTE FUNCTION slow()")
    monkeypatch.setenv(OUTAGE_ENV, "60")
    outcome = {}
    charging = threading.Thread(target=lambda: outcome.update(charge=_riding_out(lambda: _charge(ledger, "r"))))
    caplog.set_level(logging.WARNING, logger="dprelease.internal")
    charging.start()
    try:
        _terminate(url, _inserting(url))
        with psycopg.connect(url, autocommit=True) as conn:  # before the retry (backoff 0.5 s) takes the lock again
            conn.execute("DROP TRIGGER slow_insert ON spends")
    finally:
        charging.join(timeout=120)
    assert outcome["charge"].state == "charged"
    assert [(r["release_id"], r["attempts"], r["status"]) for r in ledger.releases("d")] == [("r", 1, "charged")]
    assert any("connection was lost" in r.getMessage() and "try 1" in r.getMessage() for r in caplog.records)


def _riding_out(fn):
    with riding_out():
        return fn()


def _inserting(url: str, timeout: float = 60) -> int:
    """The backend of the ledger's connection whose INSERT into spends is running (polled until one is)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            found = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'dprelease' AND "
                                 "datname = current_database() AND state = 'active' AND "
                                 "query LIKE 'INSERT INTO spends%'").fetchone()
            if found:
                return found[0]
            time.sleep(0.05)
    raise AssertionError(f"the charge ran no INSERT within {timeout} s")


_HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def test_a_sqlite_ledger_locked_by_another_process_is_waited_for(tmp_path, monkeypatch, caplog):
    """Another process holds the file's lock beyond the busy timeout: a release's charge retries until it is
    free, and is charged once; an operator's command (no retries) fails with one line."""
    path = tmp_path / "l.sqlite"
    monkeypatch.setattr(store, "LOCK_WAIT_SECONDS", 0.5)  # the busy timeout of the connections its pool opens
    ledger = PrivacyLedger(path)
    ledger.set_budget("d", 10.0, 1e-6)

    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(path), "1.5"], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline() == "locked\n"
    with pytest.raises(LedgerBusy) as refused:
        _charge(ledger, "r")
    assert str(refused.value).count("\n") == 0 and "is locked by another process" in str(refused.value)
    holder.wait(timeout=60)

    monkeypatch.setenv(OUTAGE_ENV, "60")
    caplog.set_level(logging.WARNING, logger="dprelease.internal")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(path), "3"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    t0 = time.monotonic()
    assert _riding_out(lambda: _charge(ledger, "r")).state == "charged"
    assert time.monotonic() - t0 >= 1.5
    holder.wait(timeout=60)
    assert [(r["release_id"], r["attempts"]) for r in ledger.releases("d")] == [("r", 1)]
    assert any("is locked by another process" in r.getMessage() for r in caplog.records)
