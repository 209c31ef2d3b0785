"""The ledger's races (tests/test_ledger.py), run by racer processes: each racer is one host's run, with its own
connections to the ledger, and a barrier starts every trial in every racer at once. The racers are spawned once (as
independent of the test process as another host, and each imports the accounting: ~1.5 s of CPU) and run every
trial of every race, on either backend."""

from __future__ import annotations

import multiprocessing as mp
import threading

from dpalgos import dpkmeans
from tasks.errors import BudgetExceeded, ReleaseConflict
from tasks.ledger import PrivacyLedger

#: Each racer's start line, shared by the racers of one `Racers`.
_barrier: threading.Barrier | None = None


def _start(barrier) -> None:
    global _barrier
    _barrier = barrier
    import dpalgos.accounting  # noqa: F401 - loaded before the first trial, so that it starts as tight as the rest


def one_budget(location: str, trials: int, racer: int) -> list[str]:
    """Trial t: dataset b{t} has a budget (epsilon 1) for one release of epsilon 0.6; each racer charges a release
    of its own against it. "won": charged; "refused": over the budget."""
    ledger, outcomes = PrivacyLedger(location), []
    for t in range(trials):
        _barrier.wait(timeout=120)
        try:
            ledger.charge(dataset_id=f"b{t}", release_id=f"b{t}-{racer}", kind="kmeans", fingerprint="f",
                          plan=dpkmeans.plan(epsilon=0.6, iterations=5))
            outcomes.append("won")
        except BudgetExceeded:
            outcomes.append("refused")
    return outcomes


def one_release_id(location: str, trials: int, racer: int) -> list[str]:
    """Trial t: each racer is a run of release i{t} in a folder of its own (two hosts): charged with nothing measured
    yet (redraw), then asks the lease to draw (`begin_draw`). "won": it may draw; "refused": the charge or the lease
    refused it, before any noise."""
    ledger, outcomes, me = PrivacyLedger(location), [], f"host-{racer}"
    for t in range(trials):
        _barrier.wait(timeout=120)
        try:
            ledger.charge(dataset_id=f"i{t}", release_id=f"i{t}", kind="kmeans", fingerprint="f",
                          plan=dpkmeans.plan(epsilon=0.6, iterations=5), redraw=True, location=f"/runs/{me}",
                          owner=me)
            ledger.begin_draw(f"i{t}", me)
            outcomes.append("won")
        except ReleaseConflict:
            outcomes.append("refused")
    return outcomes


def open_each(locations: list[str], trials: int, racer: int) -> list[str]:
    """Trial t: every racer opens the new, empty database locations[t] at once (each creates the tables it finds
    missing)."""
    outcomes = []
    for t in range(trials):
        _barrier.wait(timeout=120)
        PrivacyLedger(locations[t])
        outcomes.append("opened")
    return outcomes


class Racers:
    """`n` racer processes. A race runs one task per racer: each task waits at the barrier before its first trial,
    so no process takes two tasks."""

    def __init__(self, n: int = 2):
        ctx = mp.get_context("spawn")
        self.n = n
        self._pool = ctx.Pool(n, initializer=_start, initargs=(ctx.Barrier(n),))

    def race(self, race, location: str | list[str], trials: int) -> list[list[str]]:
        """Per trial, every racer's outcome."""
        per_racer = self._pool.starmap(race, [(location, trials, racer) for racer in range(self.n)], chunksize=1)
        return [list(outcomes) for outcomes in zip(*per_racer)]

    def close(self) -> None:
        """Ends the racers, idle by then (a clean exit of each, unloading the accounting, took seconds)."""
        self._pool.terminate()
        self._pool.join()
