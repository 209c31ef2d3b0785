"""One answer to "is this process alive" (tasks/processes.py), and the API server's watchdog that relies on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from flows import guard
from tasks.processes import alive


def test_a_running_process_is_alive_and_a_reaped_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert alive(os.getpid()) and not alive(child.pid)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="zombies are told apart through /proc")
def test_a_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while alive(child.pid) and time.monotonic() < deadline:  # exited, not reaped: a zombie
            time.sleep(0.05)
        assert not alive(child.pid)
    finally:
        child.wait()


def _refused(pid, sig):
    raise PermissionError(1, "Operation not permitted")


def test_a_process_of_another_user_is_alive(monkeypatch):
    monkeypatch.setattr(os, "kill", _refused)
    assert alive(12345)


def test_the_guard_survives_a_server_pid_it_may_not_signal(monkeypatch):
    """The guard's own copy of the check let PermissionError through: a server pid taken over by another user's
    process crashed the watchdog with a traceback instead of letting it finish."""
    monkeypatch.setattr(os, "kill", _refused)
    guard.main(parent=-1, server=12345)  # the parent is gone: the guard stops the server, here nothing of ours
