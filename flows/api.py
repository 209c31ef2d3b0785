"""The Prefect API of one `dprelease run`: the operator's server when PREFECT_API_URL names one, else a
temporary local server started here, as Prefect's ephemeral mode runs one (uvicorn serving Prefect's server
app on loopback, UI off), and guarded by flows/guard.py from the moment its process exists, so that no
server outlives the run, however the run ends.

The CLI launches the server before it loads the spec (`TemporaryServer.launch`, which imports nothing of
Prefect): its process boots (3-4 s of CPU) on the other core while the CLI imports the release kinds and the
flow (Prefect, dask, great-expectations: about as long), and the run waits for it only then
(`prefect_api`). A run refused before that stops it on the way out (an exit handler, and the guard).

Why not Prefect's own ephemeral server: Prefect starts it when the flow first needs the API, after those imports,
and the run waits for its whole boot. Measured 2026-11-26 on the 2-core machine (load 3 to 4), `dprelease run
--example --no-evaluate` alternating (tests/benchmarks/api_server.py): 16.9 s median with this launcher, 21.3 s
with Prefect's ephemeral server. The command line is the one Prefect's ephemeral server runs
(`prefect.server.api.server:create_app` under uvicorn, the same environment flags); it is the part of Prefect this
project depends on most closely, checked on every Prefect minor the project allows (docs/reference/pins.md)."""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: Exit code of uvicorn when its port is taken (Prefect's ephemeral server retries on another port too).
PORT_TAKEN = 3


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
        prefect_dir = Path(importlib.util.find_spec("prefect").submodule_search_locations[0])
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"], env=env)
        self.guard = subprocess.Popen([sys.executable, "-m", "flows.guard", str(os.getpid()), str(self.process.pid)])

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code == PORT_TAKEN:
                self.stop()
                self._start()
            elif code is not None:
                raise RuntimeError(f"the temporary Prefect API server exited with code {code} while starting")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the temporary Prefect API server did not start within {timeout:g} s "
                           f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self.guard is not None:
            self.guard.wait(10)  # it exits when the server is gone
            self.guard = None


@contextmanager
def prefect_api(server: TemporaryServer | None) -> Iterator[str]:
    """The API URL for the run: the operator's, or the launched server's once healthy; stopped on exit."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    if PREFECT_API_URL.value():
        if server is not None:
            server.stop()
        yield PREFECT_API_URL.value()
        return
    server = server or TemporaryServer()
    server.wait_healthy(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    logging.getLogger("dprelease").info("temporary Prefect API server at %s", server.api_url)
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            try:
                yield server.api_url
            finally:
                # Events (a failure's too) and log records still queued must reach the server before it stops:
                # queued for a stopped server, they keep the process alive at exit, retrying, for over a minute.
                EventsWorker.drain_all(timeout=30, at_exit=False)
                APILogWorker.drain_all(timeout=30, at_exit=False)
    finally:
        server.stop()
