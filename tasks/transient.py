"""Outages that pass: the privacy ledger's database unreachable or its connection lost, an object store refusing or
dropping connections. Such an operation is retried with exponential backoff (0.5 s, 1 s, 2 s, ... at most 30 s
between tries) for the operator's `outage_retry_seconds` (default 2 minutes), then fails with one line naming what
could not be reached (`Unavailable`). Nothing else is retried here: a refusal, a budget, a lock wait that timed out,
a missing object, an access denied fail at once, as before.

Every retried operation is safe to repeat: an object written again is the same object, and each ledger method is one
transaction that either committed or not; the ledger's writes are written so that one repeated after a commit whose
answer was lost changes nothing more (`tasks.ledger`: a charge of a release already charged, a lease already held by
the same run, a status already set).

Retries do not nest: an operation that calls another retried one retries as a whole, once, for the whole outage
window, rather than each layer multiplying the wait. They are on while a release runs (`riding_out`, from its
admission to its end): the checks before it, and the operator's commands, fail at once with their one line (nothing
is at stake yet, and a refusal should not wait two minutes).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from tasks import settings
from tasks.errors import ReleaseError

T = TypeVar("T")

#: The internal log (the run's log file, never Prefect's API): each retry is a line there.
_LOG = logging.getLogger("dprelease.internal")
#: The longest pause between two tries.
MAX_DELAY_SECONDS = 30.0
FIRST_DELAY_SECONDS = 0.5

#: Connection errors of the object stores' clients, by (module, class) anywhere in an exception's classes: the
#: libraries are optional (s3fs, gcsfs, adlfs), so they are not imported to be compared with.
_CONNECTION_CLASSES = {
    ("botocore.exceptions", "ConnectionError"),  # EndpointConnectionError, ConnectionClosedError, ConnectTimeout
    ("botocore.exceptions", "ReadTimeoutError"),
    ("botocore.exceptions", "HTTPClientError"),
    ("aiohttp.client_exceptions", "ClientConnectionError"),  # ServerDisconnected, ClientConnectorError
    ("aiohttp.client_exceptions", "ServerTimeoutError"),
    ("fsspec.exceptions", "FSTimeoutError"),
    ("google.auth.exceptions", "TransportError"),
    ("azure.core.exceptions", "ServiceRequestError"),
    ("azure.core.exceptions", "ServiceResponseError"),
}
_CONNECTION_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                      errno.ENETUNREACH, errno.EPIPE}


class Unavailable(ReleaseError):
    """A service the release needs (the ledger's database, an object store) could not be reached for the operator's
    `outage_retry_seconds`: one line naming it. The release is resumable: rerun its release id once it is back."""


def connection_error(exc: BaseException) -> bool:
    """An object store's connection refused, reset, dropped or timed out (the exception, or what it was raised
    from): the kind of error that passes when the store is back."""
    seen = 0
    while exc is not None and seen < 6:
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if isinstance(exc, OSError) and exc.errno in _CONNECTION_ERRNOS:
            return True
        if any((c.__module__, c.__name__) in _CONNECTION_CLASSES for c in type(exc).__mro__):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def written_not_read(exc: BaseException) -> bool:
    """A stage's failure that is its storage's, not its input's: a location full (ENOSPC, EDQUOT) or out of reach
    (`connection_error`). Reported as such, and retried as I/O, rather than as an input that cannot be read."""
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or connection_error(exc)


_STATE = threading.local()
#: How many releases of this process are riding outages out (`riding_out`): process-wide, since Prefect may run a
#: task body on a thread of its own.
_ACTIVE = [0]
_ACTIVE_LOCK = threading.Lock()


@contextmanager
def riding_out() -> Iterator[None]:
    """Outages are retried (`retried`) in this process while the block runs: a release's stages."""
    with _ACTIVE_LOCK:
        _ACTIVE[0] += 1
    try:
        yield
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE[0] -= 1


def retried(fn: Callable[[], T], what: str, transient: Callable[[BaseException], bool]) -> T:
    """`fn()`, retried while it fails with an error `transient` accepts, with exponential backoff, for the operator's
    `outage_retry_seconds`; then `Unavailable`, one line naming `what` (a location as messages may show it: no
    password) and the last error's type. Inside another retried call, or outside `riding_out`, `fn()` runs once."""
    if getattr(_STATE, "depth", 0) or not _ACTIVE[0]:
        return fn()
    window = settings.current().outage_retry_seconds
    deadline = time.monotonic() + window
    delay, tries = FIRST_DELAY_SECONDS, 0
    while True:
        _STATE.depth = 1
        try:
            return fn()
        except Exception as exc:
            if not transient(exc):
                raise
            tries += 1
            left = deadline - time.monotonic()
            if left <= 0:
                said = f"{tries} tr{'y' if tries == 1 else 'ies'}"
                raise Unavailable(f"{what} could not be reached for {window:g} s ({_kind(exc)}; {said}): "
                                  f"the release can be resumed once it is back (rerun its release id)") from None
            _LOG.warning("%s could not be reached (%s): try %d, again in %.1f s", what, _kind(exc), tries,
                         min(delay, left))
            time.sleep(min(delay, left))
            delay = min(delay * 2, MAX_DELAY_SECONDS)
        finally:
            _STATE.depth = 0


def _kind(exc: BaseException) -> str:
    """What failed, without the error's text (a store's error may quote a path of the data; the ledger's is one line
    already and says it itself)."""
    if isinstance(exc, ReleaseError):
        return " ".join(str(exc).split())
    return type(exc).__name__
