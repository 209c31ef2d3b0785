"""A watchdog for the temporary Prefect API server of one `dprelease run`.

    python -m flows.guard PARENT_PID SERVER_PID

The CLI starts it beside the server. If the CLI dies without stopping the server (kill -9, the out-of-memory
killer), the server would live on, holding its port, ~220 MB and the caller's pipes: the guard sees its parent
gone (it is re-parented), stops the server (TERM, then KILL) and exits. It exits too when the server is gone.
It ignores Ctrl-C: the terminal's SIGINT reaches the CLI, which stops the server itself.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tasks.processes import alive

POLL_SECONDS = 0.5


def stop(pid: int, grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):  # gone, or its pid now another user's: nothing of ours to stop
            return
        deadline = time.monotonic() + grace
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def main(parent: int, server: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while alive(server):
        if os.getppid() != parent:
            stop(server)
            return
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
