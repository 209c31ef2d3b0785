"""How a task may fail: when Prefect may retry it, how long it may run, and what its failure may say.

Retried: failures that may pass on a second try (I/O, a busy ledger, a lost dask worker). Not retried: a
refused input, spec or budget and a broken contract (they would fail again, and a retry would only repeat the
refusal in the logs), and a timeout (a stage that ran out of time would run out of it again; the next run of
the release id resumes it). Every task is safe to retry: stage outputs are rewritten whole, and the DP
measurement task reuses committed measurements (tasks/stages.py says when a retry is charged).
"""

from __future__ import annotations

import functools
import logging

from prefect.flow_engine import FlowRunTimeoutError
from prefect.task_engine import TaskRunTimeoutError

from data_contracts import ContractViolation
from tasks import settings
from tasks.errors import ReleaseError, StageFailed

#: Records of this logger reach the run's log file (the CLI's file handler on the root logger), never Prefect's
#: API: Prefect sends only its flow- and task-run loggers.
INTERNAL_LOG = logging.getLogger("dprelease.internal")

#: The longest one stage may take, and the pause before a retry: the operator's settings (`tasks.settings`), read
#: when the tasks are defined.
TASK_TIMEOUT_SECONDS = settings.current().task_timeout_seconds
RETRIES = {"retries": 2, "retry_delay_seconds": settings.current().task_retry_delay_seconds}


def transient(task, task_run, state) -> bool:
    try:
        state.result()
    except (ReleaseError, ContractViolation, TimeoutError):
        return False
    except StageFailed:
        return True
    except Exception:
        return True
    return False


def ours(exc: BaseException) -> bool:
    """Errors whose text the pipeline (or Prefect's timeouts) wrote, vetted to carry no raw value."""
    return isinstance(exc, (ReleaseError, ContractViolation, StageFailed, TaskRunTimeoutError, FlowRunTimeoutError))


def sanitised(fn):
    """Run a task body so that a failure leaves the process with a text the pipeline wrote: any other error
    (whose text may quote a raw value, and which Prefect would log, send to its API and keep as the state
    message) is logged with its traceback to the internal log only and replaced by StageFailed."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if ours(exc):
                raise
            INTERNAL_LOG.error("stage '%s' failed", fn.__name__, exc_info=True)
            raise StageFailed(f"{type(exc).__name__} in stage '{fn.__name__}' (details in the run's internal "
                              f"log)") from None
    return wrapper


#: The options of every long, retry-safe task.
SAFE = {**RETRIES, "retry_condition_fn": transient, "timeout_seconds": TASK_TIMEOUT_SECONDS,
        "persist_result": False}  # task results hold exact row counts: never written to result storage
