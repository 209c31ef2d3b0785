"""A test session killed outright (a CI job's timeout) leaves no server behind: the Prefect server and the test
harness's, PostgreSQL, the dask scheduler and its workers all stop (tests/reaper.py). Before, a `.ci/run` killed by a
timeout left the suite's Prefect server running."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tasks.processes import alive
from tests.processes import REPO, python_path

pytestmark = pytest.mark.operations


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow  # 40-90 s a signal: a session starting a Prefect server, the harness, PostgreSQL and dask
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_session_leaves_no_server(tmp_path, sig):
    servers = tmp_path / "servers.json"
    env = {**os.environ, "SERVERS_FILE": str(servers), "PYTHONPATH": python_path()}
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
                                "tests/operations/servers_of_a_session.py"], cwd=REPO, env=env,
                               stdout=open(tmp_path / "session.log", "w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        deadline = time.time() + 300
        while not servers.exists() or not servers.read_text().strip():
            assert session.poll() is None and time.time() < deadline, (tmp_path / "session.log").read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(0.5)
        found = json.loads(servers.read_text())
        pids = [found["prefect_server"], found["harness"], found["postgres"]]
        assert all(alive(p) for p in pids) and _listening(found["dask_port"]) and _listening(found["prefect_port"])
        os.kill(session.pid, sig)  # the session's process alone, as a timeout kills a job's
        session.wait(120)
        deadline = time.time() + 90
        while time.time() < deadline and (any(alive(p) for p in pids) or _listening(found["dask_port"])
                                          or _listening(found["prefect_port"])):
            time.sleep(1)
        assert not [name for name in ("prefect_server", "harness", "postgres") if alive(found[name])]
        assert not _listening(found["dask_port"]) and not _listening(found["prefect_port"])
    finally:
        if session.poll() is None:
            os.killpg(session.pid, signal.SIGKILL)
