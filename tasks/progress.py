"""Progress of long stages: text bars written through the run's logger (so they show on the CLI and in the
Prefect UI's logs alike), the flow's progress artifact moved within the running stage (`stage_listener`) and,
inside a Prefect run and where the total is not raw-derived, a progress artifact of its own moved at the same
ticks."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext, TaskRunContext

#: The running stage's listener (the flow's progress artifact): called with the fraction done at every tick.
_listener: Callable[[float], None] | None = None


@contextmanager
def stage_listener(listener: Callable[[float], None]) -> Iterator[None]:
    """Every `Progress` tick while the block runs also calls `listener(fraction of its work done)`."""
    global _listener
    previous, _listener = _listener, listener
    try:
        yield
    finally:
        _listener = previous


def _artifact(label: str):
    """A progress artifact of the running flow or task run, or None outside Prefect (the conformance suite)."""
    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return None
    return create_progress_artifact(0.0, description=label)


class Progress:
    """Logs `[#####-----]  50% label` each time another `step` fraction of `total` is done."""

    def __init__(self, log, label: str, total: float, step: float = 0.1, width: int = 20, artifact: bool = False,
                 stage: bool = True):
        """`artifact`: also move a progress artifact in the UI; only where the total is public or a DP output
        (an MCMC's length), not where it is raw-derived (the partitions of a CSV follow its size). `stage`: the
        bar is its stage's progress (the flow's artifact follows it); a contract check after the stage's work
        is not."""
        self.log, self.label, self.total, self.step, self.width = log, label, max(total, 1), step, width
        self.stage = stage
        self.done = 0
        self._ticks, self._shown = round(1 / step), 0
        self._artifact = _artifact(label) if artifact else None

    def advance(self, units: float = 1) -> None:
        """`units` more of the total are done."""
        self.update(self.done + units)

    def update(self, done: float) -> None:
        """A line when another tenth is reached, stating the highest tenth reached: a stage whose work comes in
        coarser pieces (12 partitions: 8.3 % each) still has a line for every tenth it passes one at a time."""
        self.done = done
        frac = min(done / self.total, 1.0)
        # Integer chunking lands just below the ticks (0.0999 for 0.1): allow a small slack.
        reached = min(int((frac + 0.01) / self.step + 1e-9), self._ticks)
        if reached <= self._shown:
            return
        self._shown = reached
        shown = min(round(reached * self.step, 6), 1.0)
        filled = int(round(shown * self.width))
        self.log.info("[%s%s] %3d%% %s", "#" * filled, "-" * (self.width - filled), round(100 * shown), self.label)
        if self._artifact is not None:
            update_progress_artifact(self._artifact, 100.0 * shown, description=self.label)
        if _listener is not None and self.stage:
            _listener(shown)


def gather(client, futures, progress: Progress | None = None) -> list:
    """Results of dask futures in submission order, reporting progress as they complete."""
    from distributed import as_completed

    if progress is not None:
        for i, _ in enumerate(as_completed(futures), start=1):
            progress.update(i)
    return client.gather(futures)
