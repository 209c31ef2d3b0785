"""The Prefect API of one `dprelease run`: the operator's server when PREFECT_API_URL names one, else a
temporary local server started here, as Prefect's ephemeral mode runs one (uvicorn serving Prefect's server
app on loopback, UI off; flows/api_server.py), and guarded by flows/guard.py from the moment its process exists,
so that no server outlives the run, however the run ends.

The CLI launches the server once the admission has passed the run (`TemporaryServer.launch`, which imports nothing
of Prefect): its process boots (2-3 s of CPU) on the other core while the CLI imports the flow (Prefect, dask,
great-expectations: about as long), and the run waits for it only then (`prefect_api`).

Why not Prefect's own ephemeral server: Prefect starts it when the flow first needs the API, after those imports,
and the run waits for its whole boot. Measured 2026-11-26 on the 2-core machine (load 3 to 4), `dprelease run
--example --no-evaluate` alternating (tests/benchmarks/api_server.py): 16.9 s median with this launcher, 21.3 s
with Prefect's ephemeral server. The server is the one Prefect's ephemeral server runs
(`prefect.server.api.server:create_app` under uvicorn, the same environment flags); it is the part of Prefect this
project depends on most closely, checked on every Prefect minor the project allows (docs/reference/pins.md).

Three things keep the server off the run's critical path. Its process loads Prefect with the garbage collector
paused (flows/api_server.py). A thread of the CLI sends the server its first requests (`WARM_UP`: reads only) as
soon as it answers, while the CLI is still importing: a new server's first answers are slow (0.4 s for the first,
0.3 s for the first write, measured), and the flow's own first requests would wait for them. And a finished run
does not wait for the server's shutdown (0.4-0.6 s): it sends the signal and leaves, the server finishes shutting
down on its own, and the guard (flows/guard.py), re-parented, stops it if it hangs. The server's output goes to a
temporary file, not the CLI's streams, so that a caller reading the CLI's pipes to their end does not wait for the
server either; its last line is in the error when it fails to start, the rest in the run's log."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator

from tasks.errors import ServiceUnavailable

#: Exit code of uvicorn when its port is taken (Prefect's ephemeral server retries on another port too).
PORT_TAKEN = 3
#: The first requests of a run's flow, made read-only (GET, or POST to a filter endpoint), sent to a new server as
#: soon as it is healthy: the version check every client starts with, then the flow and flow-run tables.
WARM_UP = (("GET", "/admin/version", None), ("POST", "/flows/filter", b'{"limit": 1}'),
           ("POST", "/flow_runs/filter", b'{"limit": 1}'))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TemporaryServer:
    """One temporary API server process and its guard; `stop` is idempotent and also runs at exit."""

    def __init__(self):
        self.process = self.guard = None
        self._start()
        atexit.register(self.stop)

    @classmethod
    def launch(cls) -> TemporaryServer | None:
        """A server process booting now, unless the environment names the operator's API (a Prefect profile
        naming one is found later, by `prefect_api`, which then stops this one)."""
        return None if os.environ.get("PREFECT_API_URL") else cls()

    def _start(self) -> None:
        self.port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        self.output = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", "flows.api_server", str(self.port)], env=env,
                                        stdin=subprocess.DEVNULL, stdout=self.output, stderr=subprocess.STDOUT)
        self.guard = subprocess.Popen([sys.executable, "-m", "flows.guard", str(os.getpid()), str(self.process.pid)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        threading.Thread(target=self._warm_up, args=(self.process, self.api_url), daemon=True,
                         name="prefect-server-warm-up").start()

    @staticmethod
    def _warm_up(process: subprocess.Popen, api_url: str, timeout: float = 60.0) -> None:
        """`WARM_UP` once the server answers; gives up when the process has exited or after `timeout`."""
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if _healthy(api_url):
                for method, path, body in WARM_UP:
                    request = urllib.request.Request(api_url + path, data=body, method=method,
                                                     headers={"Content-Type": "application/json"})
                    try:
                        urllib.request.urlopen(request, timeout=10).close()
                    except OSError:
                        return
                return
            time.sleep(0.1)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code == PORT_TAKEN:
                self.stop()
                self._start()
            elif code is not None:
                raise ServiceUnavailable(f"the temporary Prefect API server exited with code {code} while starting"
                                         f"{self._last_output()}; nothing was charged or drawn")
            if _healthy(self.api_url):
                return
            time.sleep(0.1)
        self.stop()
        raise ServiceUnavailable(f"the temporary Prefect API server did not start within {timeout:g} s "
                                 f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS; a loaded machine needs more): "
                                 f"nothing was charged or drawn, run it again")

    def output_lines(self) -> list[str]:
        """What the server has printed (its log records at level error and above, uvicorn's start-up errors)."""
        if self.process is None:
            return []
        self.output.seek(0)
        return [line.strip() for line in self.output.read().decode(errors="replace").splitlines() if line.strip()]

    def _last_output(self) -> str:
        lines = self.output_lines()
        return f": {lines[-1]}" if lines else ""

    def stop(self, wait: bool = True) -> None:
        """Stop the server; with `wait=False` (the end of a finished run) send the signal and leave its shutdown to
        the server and the guard."""
        if self.process is not None:
            self.process.terminate()
            if wait:
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
                self.guard.wait(10)  # it exits when the server is gone
            self.process = self.guard = None
            self.output.close()


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def prefect_api(server: TemporaryServer | None) -> Iterator[str]:
    """The API URL for the run: the operator's, or the launched server's once healthy; stopped on exit."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    from tasks.retry import INTERNAL_LOG

    if PREFECT_API_URL.value():
        if server is not None:
            server.stop()
        yield PREFECT_API_URL.value()
        return
    server = server or TemporaryServer()
    server.wait_healthy(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    logging.getLogger("dprelease").info("temporary Prefect API server at %s", server.api_url)
    try:
        # No flow-run heartbeats to a temporary server: they let a server mark a run whose process died as
        # crashed, and this server dies with the process; their thread sleeps in 1 s steps, so the end of every
        # flow waited for it (0 to 1 s, 0.7 s measured).
        with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            try:
                yield server.api_url
            finally:
                # Events (a failure's too) and log records still queued must reach the server before it stops:
                # queued for a stopped server, they keep the process alive at exit, retrying, for over a minute.
                EventsWorker.drain_all(timeout=30, at_exit=False)
                APILogWorker.drain_all(timeout=30, at_exit=False)
    finally:
        for line in server.output_lines():  # to the run's log file, as the terminal showed them before
            INTERNAL_LOG.warning("prefect server: %s", line)
        server.stop(wait=False)
