"""How a task may fail: when Prefect may retry it, how long it may run, and what its failure may say.

Retried: failures that may pass on a second try, I/O (an OSError) and a lost dask worker. Not retried, since they
would fail the same way again: a refused input, spec or budget, a broken contract, a deterministic error of the
numerics (a ValueError deep in a library), a timeout (the next run of the release id resumes the stage), and any
failure of the DP measurement after it drew noise (`DrawFailed`: a retry would be a second run of the mechanism,
charged again). Every task is safe to retry: stage outputs are rewritten whole, and the DP measurement task reuses
committed measurements (tasks/stages.py says when a retry is charged).
"""

from __future__ import annotations

import functools
import logging

from prefect.flow_engine import FlowRunTimeoutError
from prefect.task_engine import TaskRunTimeoutError

from data_contracts import ContractViolation
from tasks import cluster, settings
from tasks.errors import DrawFailed, ReleaseError, StageFailed
from tasks.transient import connection_error

#: Records of this logger reach the run's log file (the CLI's file handler on the root logger), never Prefect's
#: API: Prefect sends only its flow- and task-run loggers.
INTERNAL_LOG = logging.getLogger("dprelease.internal")

#: The longest one stage may take, and the pause before a retry: the operator's settings (`tasks.settings`), read
#: when the tasks are defined.
TASK_TIMEOUT_SECONDS = settings.current().task_timeout_seconds
#: Two retries, the second after four times the first's pause (exponential backoff).
RETRIES = {"retries": 2, "retry_delay_seconds": [settings.current().task_retry_delay_seconds,
                                                 4 * settings.current().task_retry_delay_seconds]}


def transient(task, task_run, state) -> bool:
    """Prefect retries a failed task only when its error may pass on a second try (`StageFailed.transient`)."""
    try:
        state.result()
    except StageFailed as exc:
        return exc.transient
    except Exception:
        return False
    return False


def may_pass(exc: BaseException) -> bool:
    """I/O (an OSError: a file system, a connection; an object store's connection refused or dropped, which its
    client raises as its own error) and a lost dask worker may pass on a second try; any other error of a stage is
    the same on every try (a ValueError of the numerics failed twice more, each retry of a draw charged again: a
    review's weighted table)."""
    return isinstance(exc, OSError) or type(exc).__name__ == "KilledWorker" or connection_error(exc)


def ours(exc: BaseException) -> bool:
    """Errors whose text the pipeline (or Prefect's timeouts) wrote, vetted to carry no raw value."""
    return isinstance(exc, (ReleaseError, ContractViolation, StageFailed, TaskRunTimeoutError, FlowRunTimeoutError))


def sanitised(fn):
    """Run a task body so that a failure leaves the process with a text the pipeline wrote: any other error
    (whose text may quote a raw value, and which Prefect would log, send to its API and keep as the state
    message) is logged with its traceback to the internal log only and replaced by StageFailed.

    A failure while the dask cluster was in trouble (its scheduler lost, no worker left: `tasks.cluster`), whatever
    error it surfaced as, waits for the cluster within the operator's `dask_wait_seconds`: back, the stage is retried;
    not, `ClusterLost`, one line. A DP measurement that drew noise is never retried (`DrawFailed` passes as it is)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = cluster.episodes()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if isinstance(exc, DrawFailed):
                raise
            trouble = cluster.trouble(before)
            if trouble == cluster.BACK:
                INTERNAL_LOG.warning("stage '%s' failed while the dask cluster was in trouble; it is back: the stage "
                                     "is retried", fn.__name__, exc_info=True)
                raise StageFailed(f"{type(exc).__name__} in stage '{fn.__name__}' while the dask cluster was "
                                  f"interrupted (it is back)", transient=True) from None
            if trouble is not None:
                INTERNAL_LOG.error("stage '%s' failed: the dask cluster was lost", fn.__name__, exc_info=True)
                raise cluster.ClusterLost(trouble) from None
            if ours(exc):
                raise
            INTERNAL_LOG.error("stage '%s' failed", fn.__name__, exc_info=True)
            # An OSError's strerror is the system's text ("No space left on device"), never the data's or a path.
            said = f" ({exc.strerror})" if isinstance(exc, OSError) and exc.strerror else ""
            raise StageFailed(f"{type(exc).__name__}{said} in stage '{fn.__name__}' (details in the run's internal "
                              f"log)", transient=may_pass(exc)) from None
    return wrapper


#: The options of every long, retry-safe task.
SAFE = {**RETRIES, "retry_condition_fn": transient, "timeout_seconds": TASK_TIMEOUT_SECONDS,
        "persist_result": False}  # task results hold exact row counts: never written to result storage
