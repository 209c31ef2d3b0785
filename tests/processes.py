"""Servers the tests and benchmarks start as processes on loopback: each in a session of its own (stopped whole by
`stop`) and reaped if the test process is killed (tests/reaper.py); among them the external dask cluster that the
operations tests, the object-storage test and tests/benchmarks/scan_ratio.py release on (`dask_cluster`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.reaper import guard

REPO = Path(__file__).resolve().parents[1]
#: The external cluster's workers (single-threaded processes, as two hosts' would be).
WORKERS = 2


def python_path() -> str:
    """PYTHONPATH for the processes the tests start (the CLI, Prefect workers and the flow runs they start, dask
    workers): this checkout first, whatever the venv's editable install points at."""
    return os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                          if p and p != str(REPO)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    """A process in a session of its own (killed whole by `stop`), stopped too if this test process is killed
    (tests/reaper.py)."""
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.reaper = guard(group=proc.pid)
    return proc


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


def wait_for_scheduler(address: str) -> None:
    """Returns once a client connects to the dask scheduler at `address` (a minute at the most)."""
    from distributed import Client

    with Client(address, timeout="60s"):
        pass


@contextmanager
def dask_cluster(work: Path, env: dict | None = None) -> Iterator[str]:
    """`dask scheduler` and two single-threaded `dask worker` processes on loopback, each started in an empty folder
    of its own (work/scheduler/, work/worker-0/, work/worker-1/: a worker's local directory and TMPDIR are in its
    folder, so that they share no disk and a test sees what each wrote); yields the scheduler's address once both
    workers are up. `env`: added to this process's environment (a store's credentials); the processes import this
    checkout (`python_path`)."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, **(env or {}), "DASK_LOGGING__DISTRIBUTED": "warning", "PYTHONPATH": python_path()}
    dask = str(Path(sys.executable).parent / "dask")
    (work / "scheduler").mkdir(parents=True)
    procs = [start([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address",
                    "127.0.0.1:0"], env, work / "scheduler" / "log", cwd=work / "scheduler")]
    try:
        with Client(address, timeout="60s") as client:  # connecting waits for the scheduler to come up
            for i in range(WORKERS):
                home = work / f"worker-{i}"
                (home / "tmp").mkdir(parents=True)
                procs.append(start([dask, "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                                    "--local-directory", str(home / "tmp"), "--dashboard-address", "127.0.0.1:0"],
                                   {**env, "TMPDIR": str(home / "tmp")}, home / "log", cwd=home))
            client.wait_for_workers(WORKERS, timeout=120)
        yield address
    finally:
        for proc in reversed(procs):  # the workers, then the scheduler
            stop(proc)
