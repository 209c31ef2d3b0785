"""When Prefect may retry a task, and how long a task may run.

Retried: failures that may pass on a second try (I/O, a busy ledger, a lost dask worker). Not retried: a
refused input, spec or budget and a broken contract (they would fail again, and a retry would only repeat the
refusal in the logs), and a timeout (a stage that ran out of time would run out of it again; the next run of
the release id resumes it). Every task is safe to retry: stage outputs are rewritten whole, and the DP
measurement task reuses committed measurements (tasks/stages.py says when a retry is charged).
"""

from __future__ import annotations

import os

from tasks.errors import ReleaseError

#: The longest one stage may take (the operator's DPRELEASE_TASK_TIMEOUT_SECONDS, default 4 hours).
TASK_TIMEOUT_SECONDS = float(os.environ.get("DPRELEASE_TASK_TIMEOUT_SECONDS", 4 * 3600))
RETRIES = {"retries": 2, "retry_delay_seconds": float(os.environ.get("DPRELEASE_TASK_RETRY_DELAY_SECONDS", 2))}


def transient(task, task_run, state) -> bool:
    from data_contracts import ContractViolation

    try:
        state.result()
    except (ReleaseError, ContractViolation, TimeoutError):
        return False
    except Exception:
        return True
    return False


#: The options of every long, retry-safe task.
SAFE = {**RETRIES, "retry_condition_fn": transient, "timeout_seconds": TASK_TIMEOUT_SECONDS}
