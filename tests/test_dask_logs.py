"""A library's log records (dask's worker logs a failed task with the exception's text, which quotes the value a
parser could not read) reach the run's internal log file only: never the CLI's terminal, never Prefect's API."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.conftest import blobs, spec_dict, write_csv

SECRET = "SECRET4242"


def _cli(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(cwd / ".prefect-home"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def _csv_with_a_planted_value(path: Path) -> Path:
    """2-column numeric CSV whose row 14,900 of 15,000 holds the secret in `x`: past the 256 kB dask reads to
    infer the column types (the file is ~300 kB), so the column is typed numeric and the value fails to parse
    only when a dask worker reads the partition."""
    rows = [[f"{x:.6f}", f"{y:.6f}"] for x, y in blobs(15_000)]
    rows[14_900][0] = SECRET
    return write_csv(path, rows)


@pytest.mark.parametrize("processes", [False, pytest.param(True, marks=pytest.mark.slow)],  # 14 s each
                         ids=["threaded-worker", "worker-process"])
def test_a_value_quoted_by_a_dask_worker_reaches_the_internal_log_only(tmp_path, processes):
    d = spec_dict(tmp_path, _csv_with_a_planted_value(tmp_path / "b.csv"))
    d["dask"] = {"n_workers": 1, "threads_per_worker": 1, "processes": processes}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    out = _cli("run", str(tmp_path / "s.yaml"), "--release-id", "planted", cwd=tmp_path)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1, out.stderr[-3000:]
    assert "a value that is not a number in a numeric column" in errors[0]
    assert SECRET not in out.stdout + out.stderr
    log = tmp_path / "runs" / ".logs" / "planted.log"
    # The run did reach dask's failure log, whose text quotes the value: in the internal file, mode 0600.
    assert SECRET in log.read_text() and "distributed.worker" in log.read_text()
    assert log.stat().st_mode & 0o777 == 0o600
    if not processes:  # in this process: a fixed line names the library
        assert "distributed logged an error; its text is kept out of the terminal" in out.stderr


def test_library_records_and_warnings_reach_neither_the_terminal_nor_prefects_api(tmp_path):
    """With the operator handing dask's loggers to Prefect's API (PREFECT_LOGGING_EXTRA_LOGGERS) and a library
    logger with a terminal handler of its own, in a fresh process as the CLI runs."""
    script = textwrap.dedent(f"""
        import logging, sys, warnings
        from pathlib import Path
        from flows.environment import apply_defaults
        apply_defaults()
        from prefect.logging.handlers import APILogHandler
        from flows.logs import run_logging

        sent = []
        APILogHandler.emit = lambda self, record: sent.append((record.name, record.getMessage()))
        logging.getLogger("tornado.application").addHandler(logging.StreamHandler(sys.stderr))
        logging.getLogger("tornado.application").propagate = False
        with run_logging(Path(sys.argv[1])):
            logging.getLogger("distributed.worker").error("Compute Failed: %s", "{SECRET}-1")
            logging.getLogger("distributed.scheduler").warning("%s", "{SECRET}-2")
            logging.getLogger("tornado.application").error("%s", "{SECRET}-3")
            logging.getLogger("asyncio").error("%s", "{SECRET}-4")
            warnings.warn("{SECRET}-5")
            logging.getLogger("prefect.flow_runs").info("the pipeline's line")
            logging.getLogger("dprelease").warning("the pipeline's warning")
        print(sent)
    """)
    log = tmp_path / ".logs" / "r.log"
    out = subprocess.run([sys.executable, "-c", script, str(log)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PREFECT_LOGGING_EXTRA_LOGGERS": "distributed,tornado,asyncio",
                              "PREFECT_HOME": str(tmp_path / ".prefect-home")})
    assert out.returncode == 0, out.stderr[-3000:]
    assert SECRET not in out.stdout + out.stderr
    assert "('prefect.flow_runs', \"the pipeline's line\")" in out.stdout  # the API still gets the pipeline's
    assert "the pipeline's warning" in out.stderr
    for library in ("distributed logged an error", "tornado logged an error", "asyncio logged an error",
                    "Python warnings logged a warning"):
        assert library in out.stderr
    assert out.stderr.count("distributed logged") == 1  # once per library
    text = log.read_text()
    assert all(f"{SECRET}-{i}" in text for i in range(1, 6))


def test_a_flow_run_started_without_the_cli_splits_its_logs_the_same_way(tmp_path):
    """As a Prefect worker starts it (the flow function in a flow-run process, no CLI around it): the library's
    record and the traceback go to the run's internal log, not to the process's console."""
    from tests.conftest import budget

    budget("blobs")
    d = {**spec_dict(tmp_path, _csv_with_a_planted_value(tmp_path / "b.csv")), "release_id": "by-worker",
         "dask": {"n_workers": 1, "threads_per_worker": 1, "processes": False}}
    script = textwrap.dedent(f"""
        from flows.release import release
        from tasks.spec import parse_spec
        try:
            release(spec=parse_spec({d!r}))
        except Exception as exc:
            print("failed:", type(exc).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect-home")})
    assert "failed: InputError" in out.stdout, out.stderr[-2000:]
    assert SECRET not in out.stdout + out.stderr
    log = tmp_path / "runs" / ".logs" / "by-worker.log"
    assert SECRET in log.read_text() and oct(log.stat().st_mode & 0o777) == "0o600"
