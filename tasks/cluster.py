"""A release's dask cluster, watched: a lost scheduler or every worker gone is a one-line failure after a bounded wait,
never a silent wait until the stage's timeout (hours).

`Watch` runs beside the release's client (`tasks.partitions.dask_client`) and looks at it every second: the
scheduler reachable (the client connected) and at least one worker connected to it. A cluster in trouble for the
operator's `dask_wait_seconds` (default 3 minutes) is lost: the watch closes the client, which ends every wait on it
(a computation, a gather), and the stage fails with `ClusterLost`, one line naming what was lost. The release is
resumable: its next run reuses the validated stage outputs and the committed measurements.

A stage that fails while the cluster is in trouble (the scheduler's loss cancels every computation at once) waits,
within the same bound, for it to come back: back (the operator restarted the scheduler and its workers), the stage
is retried (`StageFailed`, transient); not back, `ClusterLost`. A failure of the DP measurement after it drew noise
is never retried (tasks/stages.py), whatever the cluster did.

The client reconnects to a restarted scheduler for as long as the same bound (its `timeout`), so the wait and the
reconnection end together.
"""

from __future__ import annotations

import logging
import threading
import time

from tasks.errors import ReleaseError

_LOG = logging.getLogger("dprelease.internal")
POLL_SECONDS = 1.0
#: `trouble` when the cluster came back within the bound.
BACK = "back"


class ClusterLost(ReleaseError):
    """The release's dask scheduler was unreachable, or no worker was connected to it, for the operator's
    `dask_wait_seconds`: the release failed and can be resumed (rerun its release id once the cluster is back)."""


class Watch:
    """The health of one client's cluster, looked at every `poll` seconds on a thread of its own (see the module
    docstring). `shown`: the scheduler as messages name it (not its address: messages reach the Prefect API, which
    whoever opens the UI reads; the address is in the run's internal log)."""

    def __init__(self, client, shown: str, seconds: float, poll: float = POLL_SECONDS):
        self.client, self.shown, self.seconds, self.poll = client, shown, seconds, poll
        self.lost: str | None = None
        self.problem: str | None = None
        self.since: float | None = None  # when the current trouble began (monotonic), None while healthy
        self.episodes = 0  # how many times trouble began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dprelease-cluster-watch", daemon=True)

    def start(self) -> "Watch":
        _ACTIVE.append(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10)

    def look(self) -> str | None:
        """What is wrong with the cluster now (None: nothing), as a phrase."""
        client = self.client
        if client.status != "running":
            return f"{self.shown} cannot be reached"
        try:
            workers = client.scheduler_info().get("workers", {})
        except Exception as exc:  # the scheduler went away between the two looks
            return f"{self.shown} cannot be reached ({type(exc).__name__})"
        if not workers:
            return f"no dask worker is connected to {self.shown}"
        return None

    def update(self) -> str | None:
        """Look now, record the result, and declare the cluster lost once in trouble for the bound."""
        problem = self.look()
        with self._lock:
            now = time.monotonic()
            if problem is None:
                if self.since is not None:
                    _LOG.warning("the dask cluster is back after %.0f s", now - self.since)
                self.problem, self.since = None, None
                return None
            if self.since is None:
                self.since, self.episodes = now, self.episodes + 1
                _LOG.warning("%s: waiting up to %g s for it", problem, self.seconds)
            self.problem = problem
            if self.lost is None and now - self.since >= self.seconds:
                self.lost = (f"{problem} for {self.seconds:g} s (the operator's dask_wait_seconds): the release was "
                             f"stopped; rerun its release id once the scheduler and its workers are back (what was "
                             f"validated or committed is reused)")
                _LOG.error("%s", self.lost)
                threading.Thread(target=self._close, daemon=True).start()
            return problem

    def _close(self) -> None:
        """Close the client: every wait on it ends (a computation, a gather) with an error."""
        try:
            self.client.close(timeout=10)
        except Exception:
            _LOG.debug("closing the dask client after its cluster was lost", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self.update()
            if self.lost is not None:
                return

    def trouble(self, episodes_before: int) -> str | None:
        """After a stage failed: None if the cluster was healthy throughout (since `episodes_before` was read) and
        is now; else wait, within the bound, for it to be healthy again: `BACK`, or the line saying it was lost."""
        if self.lost is not None:
            return self.lost
        if self.update() is None and self.episodes == episodes_before:
            return None
        while self.lost is None:
            if self.update() is None:
                return BACK
            time.sleep(self.poll)
        return self.lost


#: The watches of the clusters open in this process (one per running release).
_ACTIVE: list[Watch] = []


def episodes() -> int:
    """The count of trouble episodes of the open cluster (0 without one): read when a stage starts."""
    return _ACTIVE[-1].episodes if _ACTIVE else 0


def trouble(episodes_before: int) -> str | None:
    """`Watch.trouble` of the open cluster; None without one."""
    return _ACTIVE[-1].trouble(episodes_before) if _ACTIVE else None


def lost() -> str | None:
    """The line saying the open cluster was lost, or None."""
    return _ACTIVE[-1].lost if _ACTIVE else None
