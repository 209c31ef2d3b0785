"""Shared fixtures. Flow tests use one Prefect test harness (a temporary local API) for the session; ledger tests
run on a SQLite file and on a PostgreSQL server the session starts once (`postgres`, `ledger_location`)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.environment import apply_defaults
from tests import postgres as pg
from tests.reaper import guard, stop_on_sigterm

apply_defaults()  # the CLI's process settings, before prefect is imported
stop_on_sigterm()  # a session killed by a CI timeout still stops its servers (tests/reaper.py)
os.environ.setdefault("DPRELEASE_TASK_RETRY_DELAY_SECONDS", "0")  # retries at once: the tests force failures

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def prefect_api():
    """A temporary Prefect API for the whole session (heartbeats off: they add ~1 s per flow call)."""
    os.environ.pop("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", None)
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        server = SubprocessASGIServer._instances.get(None)
        process = getattr(server, "server_process", None)
        reaper = guard(group=process.pid) if process is not None else None
        try:
            yield
        finally:
            if reaper is not None:
                reaper.release()


@pytest.fixture(autouse=True)
def operator_ledger(tmp_path, monkeypatch) -> Path:
    """Every test runs against a ledger of its own, configured as an operator configures one."""
    from tasks.ledger import LEDGER_ENV

    path = tmp_path / "operator-ledger.sqlite"
    monkeypatch.setenv(LEDGER_ENV, str(path))
    monkeypatch.setenv("DPRELEASE_TEST_MODE", "allowed")  # a test machine: seeded runs on test data
    # The machine's own settings stay out: test data must not go to an operator's dask scheduler.
    monkeypatch.delenv("DPRELEASE_DASK_ADDRESS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return path


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the session (tests/postgres.py), started when a test first asks for it and stopped at
    the end, whatever happened."""
    bin_dir = pg.binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on the PATH or in /usr/lib/postgresql/*/bin: "
                    "install Debian's postgresql package (.ci/run does)")
    server = pg.Server.start(bin_dir)
    user = server.user
    reaper = guard(pgdata=(bin_dir, server.data, user.pw_uid if user else os.geteuid(),
                           user.pw_gid if user else os.getegid()), rmtree=server.dir)
    try:
        yield server
    finally:
        server.stop()
        reaper.release()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_location(request, tmp_path, monkeypatch) -> str:
    """A ledger of the test's own on each backend (a SQLite file, or a fresh database on the session's server),
    configured as the operator's."""
    from tasks.ledger import LEDGER_ENV

    if request.param == "sqlite":
        location = str(tmp_path / "l.sqlite")
    else:
        location = request.getfixturevalue("postgres").new_database()
    monkeypatch.setenv(LEDGER_ENV, location)
    return location


def budget(dataset_id: str, epsilon: float = 10.0, delta: float = 1e-6) -> None:
    """Register a dataset's lifetime budget in the configured ledger, as `dprelease budget set` does."""
    ledger().set_budget(dataset_id, epsilon, delta)


def flow_run_logs(client, flow_run_id) -> list[str]:
    """The messages of one flow run's logs (the API returns 200 logs a call, of every run unless filtered: a session's
    shared server holds thousands)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    found, offset = [], 0
    while True:
        page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                offset=offset)
        found += [log.message for log in page]
        if len(page) < 200:
            return found
        offset += len(page)


def ledger():
    from tasks.ledger import configured_ledger

    return configured_ledger()


def first_schema_ledger(path: Path) -> Path:
    """A SQLite ledger as the first code wrote it, before schema versions: none of the columns added since (the
    old code's hand-kept list), budget changes ordered by rowid; dataset 'd' at epsilon 2, after 3."""
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE budgets (dataset_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL,
                                  updated_at TEXT NOT NULL);
            CREATE TABLE budget_changes (dataset_id TEXT NOT NULL, changed_at TEXT NOT NULL, old_epsilon REAL,
                old_delta REAL, new_epsilon REAL NOT NULL, new_delta REAL NOT NULL, spent_epsilon REAL NOT NULL,
                reason TEXT);
            CREATE TABLE spends (release_id TEXT PRIMARY KEY, dataset_id TEXT NOT NULL, kind TEXT NOT NULL,
                fingerprint TEXT NOT NULL, event TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL,
                status TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
            CREATE TABLE public_inputs (path TEXT PRIMARY KEY, sha256 TEXT NOT NULL, source TEXT NOT NULL,
                registered_at TEXT NOT NULL);
            INSERT INTO budgets VALUES ('d', 2.0, 1e-6, '2025-01-01T00:00:00+00:00');
            INSERT INTO budget_changes VALUES ('d', '2025-01-01T00:00:00+00:00', NULL, NULL, 3.0, 1e-6, 0, NULL);
            INSERT INTO budget_changes VALUES ('d', '2025-01-01T00:00:00+00:00', 3.0, 1e-6, 2.0, 1e-6, 0, NULL);
        """)
    return path


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference datasets not found at {SHARED_DATA} (a fresh clone has no ../shared)")
    return SHARED_DATA


def blobs(n: int, seed: int = 0) -> np.ndarray:
    """n points from 3 well-separated Gaussian blobs, raw units in [0, 100]^2."""
    rng = np.random.default_rng(seed)
    centres = np.array([[25.0, 25.0], [75.0, 30.0], [45.0, 75.0]])
    return np.clip(centres[rng.integers(0, 3, n)] + rng.normal(0, 4, (n, 2)), 0, 100)


def write_csv(path: Path, X: np.ndarray, header=("x", "y")) -> Path:
    lines = ([",".join(header)] if header else []) + [",".join(v if isinstance(v, str) else f"{v:.6f}" for v in row)
                                                        for row in X]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def spec_dict(tmp_path: Path, data: Path, **release) -> dict:
    """A small kmeans release spec as a dict (tests tweak it before parsing); registers the budget of its dataset
    ('blobs': epsilon 10, delta 1e-6) in the test's ledger unless one is there."""
    if ledger().budget("blobs") is None:
        budget("blobs")
    return {
        "dataset": {"id": "blobs", "path": str(data), "bounds": {"x": [0, 100], "y": [0, 100]}},
        "release": {"kind": "kmeans", "k": 3, "iterations": 5, "epsilon": 1.0, **release},
        "output_dir": str(tmp_path / "runs"),
        "dask": {"n_workers": 1, "threads_per_worker": 2},
    }
