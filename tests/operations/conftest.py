"""Real processes on loopback for the operations tests: a Prefect server (temporary PREFECT_HOME), a process
work pool and worker, dask scheduler and workers, and the `dprelease` CLI as the flow process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.processes import REPO, free_port, python_path, start, stop


def wait_http(url: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout}s")


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect server on loopback; yields the environment that points clients at it."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1",
           "DPRELEASE_REPO": str(REPO), "PREFECT_WORKER_QUERY_SECONDS": "2",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90", "PYTHONPATH": python_path()}
    env.pop("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", None)
    server = start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
                    "--analytics-off"], env, home / "server.log")
    env["TEST_PREFECT_SERVER_PID"] = str(server.pid)  # (tests/operations/test_session_kill.py)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/health", 90)
        yield env
    finally:
        stop(server)


def dprelease_proc(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """The CLI as a flow process of its own (its own process group, so it can be killed whole)."""
    return start([sys.executable, "-m", "flows.cli", *args], env, log)


def run_cli(args: list[str], env: dict, log: Path, timeout: float = 300) -> int:
    proc = dprelease_proc(args, env, log)
    try:
        return proc.wait(timeout)
    finally:
        stop(proc)
