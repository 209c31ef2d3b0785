"""The Prefect API of one `dprelease run`: the operator's server when PREFECT_API_URL names one, else a
temporary local server started here (as Prefect's ephemeral mode does) and guarded by flows/guard.py, so that
no server outlives the run, however the run ends.

`start_api()` starts the temporary server from a background thread: its process boots (3-4 s of CPU) on the
other core while the CLI imports the flow (Prefect, dask, great-expectations: about as long), instead of
after it."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator


def start_api() -> Future:
    """A future of the temporary server (None when the operator's PREFECT_API_URL names one)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefect-api")
    starting = pool.submit(_start)
    pool.shutdown(wait=False)  # returns at once; the thread ends when the server has started
    return starting


def _start():
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    if PREFECT_API_URL.value():
        return None
    server = SubprocessASGIServer()
    server.start(timeout=PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    # The guard watches from the moment the server runs, before the caller waits for it.
    guard = subprocess.Popen([sys.executable, "-m", "flows.guard", str(os.getpid()), str(server.server_process.pid)])
    return server, guard


@contextmanager
def prefect_api(starting: Future | None = None) -> Iterator[str]:
    """The API URL for the run, from a server `start_api()` started (or starts now); stopped on exit."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    started = (starting or start_api()).result()
    if started is None:
        yield PREFECT_API_URL.value()
        return
    server, guard = started
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
