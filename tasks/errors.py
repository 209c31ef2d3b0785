"""Errors the pipeline raises on purpose: each carries a message a data engineer can act on."""


class ReleaseError(Exception):
    """Base class: the CLI prints these without a traceback and exits non-zero."""


class SpecError(ReleaseError, ValueError):
    """A release spec that cannot be used; the message lists every problem."""


class Refused(ReleaseError):
    """A release refused by an admission rule before anything ran (`tasks.admission`): the CLI exits 2."""


class Unreachable(Refused):
    """A store a command must ask before anything runs (a dataset's objects, an output location) did not answer, or
    refused the process's credentials: nothing was run (the CLI exits 2)."""


class LedgerUnreachable(ReleaseError):
    """The ledger's database could not be reached, or the connection to it was lost: an outage that may pass, retried
    by the ledger (`tasks.transient`), then one line. Raised by the PostgreSQL backend and caught by the ledger: it
    lives here, below both, so that the backend imports nothing of the store that loads it."""


class LedgerBusy(ReleaseError):
    """The ledger's lock was still held by another process when the transaction's wait ran out (SQLite), or the
    database rolled the transaction back for another's sake (PostgreSQL's serialisation failure, deadlock): nothing
    was written, and the ledger retries it as it does an outage (`tasks.transient`)."""


class ServiceUnavailable(ReleaseError):
    """A service the run needs (its temporary Prefect API) did not start: nothing was charged or written."""


class InputError(ReleaseError):
    """The sensitive input cannot be used as the spec describes it (missing, corrupt, wrong schema...)."""


class BudgetExceeded(ReleaseError):
    """The release would take the dataset past its lifetime privacy budget; no noise was drawn."""


class NoBudget(ReleaseError):
    """The dataset has no lifetime budget registered by an operator; nothing was run."""


class ReleaseConflict(ReleaseError):
    """A release id is being reused with different parameters, or its stored state is inconsistent."""


class DrawFailed(ReleaseError):
    """The DP measurement failed after drawing noise: never retried (a retry is a second run of the mechanism,
    charged again); its release id may be rerun, which charges it again."""


class StageFailed(Exception):
    """A stage failed with an error the pipeline did not write (a library's, an I/O error): its text may quote
    raw values, so this carries the type and the stage only; the traceback goes to the run's internal log.
    `transient`: the error may pass on a second try (I/O, a lost dask worker), and the stage is retried; a
    deterministic one (a ValueError of the numerics) would fail again, and is not."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def reason(exc: BaseException) -> str:
    """What went wrong reading an input, without the exception's text: parsers quote the offending value
    ("could not convert 'John Doe' to float"), and error messages reach logs and Prefect states."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__
