"""The Prefect API of one `dprelease run`: the operator's server when PREFECT_API_URL names one, else a
temporary local server started here (as Prefect's ephemeral mode does) and guarded by flows/guard.py, so that
no server outlives the run, however the run ends."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings


@contextmanager
def prefect_api() -> Iterator[str]:
    if PREFECT_API_URL.value():
        yield PREFECT_API_URL.value()
        return
    server = SubprocessASGIServer()
    server.start(timeout=PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    guard = subprocess.Popen([sys.executable, "-m", "flows.guard", str(os.getpid()), str(server.server_process.pid)])
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
        guard.wait(10)
