"""Whether a process is alive, asked of its pid: the one answer the run folder's clean-up (tasks/run.py), the API
server's watchdog (flows/guard.py) and the tests' reapers (tests/reaper.py) share. Standard library only: the
watchdog is a process of its own that must start at once."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and has not exited. A process of another user is alive: signal 0 is refused
    (PermissionError), not answered with ProcessLookupError. A zombie (exited, not yet reaped by its parent) is not:
    it holds no memory or port and will never run again."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return ") Z" not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS), or the process left between the two questions: signal 0 answered
        return True
