"""Servers a test session starts stop when the session is killed.

The fixtures stop their servers when the session ends, however a test ends; a session killed outright (a CI job's
timeout sends SIGTERM or SIGKILL to pytest) runs no fixture's teardown, and a server in a process group or session of
its own (the Prefect server, a worker, a dask scheduler, PostgreSQL's postmaster, which daemonises) outlived it: a
`.ci/run` killed by a timeout left the suite's Prefect server running, holding its port and memory.

Two layers:
- SIGTERM to the session (and to each xdist worker) becomes a KeyboardInterrupt (`stop_on_sigterm`, installed by
  tests/conftest.py): pytest then stops and runs every fixture's teardown, as after Ctrl-C.
- for SIGKILL, each server gets a reaper (`guard`): a small process in a session of its own that watches the test
  process and, when it is gone, stops the server (its whole process group: TERM, then KILL) or PostgreSQL (`pg_ctl
  stop -m immediate`, its folder removed). A server stopped normally releases its reaper first.

    python -m tests.reaper WATCHED_PID [--group PID] [--pgdata BIN DATA UID GID] [--rmtree DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tasks.processes import alive

POLL_SECONDS = 0.5


def _stop_group(pid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 8.0), (signal.SIGTERM, 4.0), (signal.SIGKILL, 4.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + wait
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive(pid):
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("watched", type=int)
    parser.add_argument("--group", type=int)
    parser.add_argument("--pgdata", nargs=4, metavar=("BIN", "DATA", "UID", "GID"))
    parser.add_argument("--rmtree")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    released = []
    signal.signal(signal.SIGTERM, lambda *_: released.append(True))  # the server was stopped normally
    while not released and alive(args.watched):
        if args.group and not alive(args.group):
            return
        time.sleep(POLL_SECONDS)
    if released:
        return
    if args.group:
        _stop_group(args.group)
    if args.pgdata:
        bin_dir, data, uid, gid = args.pgdata
        user = {"user": int(uid), "group": int(gid), "extra_groups": []} if int(uid) != os.geteuid() else {}
        subprocess.run([str(Path(bin_dir) / "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60, **user)
    if args.rmtree:
        shutil.rmtree(args.rmtree, ignore_errors=True)


class Guard:
    """A reaper running for one server; `release()` when the server was stopped normally."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def guard(*, group: int | None = None, pgdata: tuple | None = None, rmtree: str | None = None) -> Guard:
    """Start a reaper for a server of this process: its process group (`group`, the pid of a process started with
    a session of its own), a PostgreSQL data folder (`pgdata`: bin folder, data folder, uid, gid), a folder."""
    args = [sys.executable, "-m", "tests.reaper", str(os.getpid())]
    if group:
        args += ["--group", str(group)]
    if pgdata:
        args += ["--pgdata", *map(str, pgdata)]
    if rmtree:
        args += ["--rmtree", str(rmtree)]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    return Guard(subprocess.Popen(args, cwd=root, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def stop_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt in this process (pytest then runs its teardowns, as after Ctrl-C)."""
    def interrupt(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM ends the process at once
        raise KeyboardInterrupt("SIGTERM")
    signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    main()
