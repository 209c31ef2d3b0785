"""Real processes on loopback for the operations tests: a Prefect server (temporary PREFECT_HOME), a process
work pool and worker, dask scheduler and workers, and the `dprelease` CLI as the flow process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.reaper import guard

REPO = Path(__file__).resolve().parents[2]


def python_path() -> str:
    """PYTHONPATH for the processes the tests start (the CLI, Prefect workers and the flow runs they start, dask
    workers): this checkout first, whatever the venv's editable install points at."""
    return os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                          if p and p != str(REPO)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """Prefect workers ignore the first SIGTERM: TERM, wait, TERM again, then KILL (the whole group)."""
    try:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            if proc.poll() is not None:
                return
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
    finally:
        reaper = getattr(proc, "reaper", None)
        if reaper is not None:
            reaper.release()


def start(args: list[str], env: dict, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    """A process in a session of its own (killed whole by `stop`), stopped too if this test process is killed
    (tests/reaper.py)."""
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.reaper = guard(group=proc.pid)
    return proc


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


@contextmanager
def dask_cluster(tmp: Path):
    """`dask scheduler` and two `dask worker` processes on loopback; yields the scheduler address."""
    port = free_port()
    env = {**os.environ, "DASK_LOGGING__DISTRIBUTED": "warning", "PYTHONPATH": python_path()}
    bin_dir = Path(sys.executable).parent
    scheduler = start([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                       "--dashboard-address", "127.0.0.1:0"], env, tmp / "scheduler.log")
    workers = None
    try:
        address = f"tcp://127.0.0.1:{port}"
        from distributed import Client

        deadline = time.time() + 60
        while True:
            try:
                Client(address, timeout=2).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        workers = start([str(bin_dir / "dask"), "worker", address, "--nworkers", "2", "--nthreads", "1",
                         "--host", "127.0.0.1"], env, tmp / "workers.log")
        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        if workers is not None:
            stop(workers)
        stop(scheduler)
