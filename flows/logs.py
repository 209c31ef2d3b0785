"""Logging of one `dprelease run`: the terminal gets one line per record (tracebacks only with --debug), the
run's log file gets everything, tracebacks included (third-party error texts may quote raw values: the file
is internal, readable by its owner only). It sits in <output_dir>/.logs/, beside the run folders, never under
release/.

Only the pipeline's own records reach the terminal and Prefect's API: those of Prefect's loggers (the flow and
task run loggers the stages write to) and of the pipeline's packages. A library's records (dask's
`distributed.worker` logs a failed task with the exception's text, which quotes the value a parser could not
read; tornado, asyncio, a Python warning) go to the run's log file only, with --debug too, and the terminal gets a
fixed line naming the library once. This holds whatever loggers the operator hands to Prefect
(PREFECT_LOGGING_EXTRA_LOGGERS) and for a library logger that has a terminal handler of its own. A local dask
cluster's worker processes (`dask: processes: true`) write their records to their own stderr, the CLI's
terminal: while the run lasts they are configured (through the environment they inherit) to write every record,
and their Python warnings, to the same log file instead, unless the operator configured dask's logging for
distributed (`distributed.logging` or `distributed.logging-file-config`), which then decides. The workers of a
cluster at `dask: address:` log where that cluster's operator sends them.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: Loggers whose texts the pipeline writes or vets (and their children): Prefect's (the stages log through its
#: flow- and task-run loggers; the exceptions it reports are the pipeline's, tasks/retry.py) and the pipeline's
#: own packages. Every other logger is a library's.
PIPELINE_LOGGERS = ("prefect", "dprelease", "flows", "tasks", "dpalgos", "data_contracts")

#: The dask setting that worker processes of a local cluster read when distributed is imported (before they run
#: anything): a `logging.config.dictConfig` schema, given as a Python literal in the environment they inherit.
WORKER_LOGGING_ENV = "DASK_DISTRIBUTED__LOGGING"

_FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_WORKER_FORMAT = "%(asctime)s %(levelname)s %(name)s [worker process %(process)d]: %(message)s"


def _pipeline(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PIPELINE_LOGGERS)


class _NoTraceback(logging.Formatter):
    """The wrapped formatter, on a copy of the record without its exception and stack (the record itself is
    shared with the file handler, which keeps them)."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        bare = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None, "stack_info": None})
        return self.inner.format(bare)


#: The internal log (tasks/retry.py INTERNAL_LOG): its INFO records (the dask scheduler's address) go to the run's
#: log file only; its warnings and errors (a stage failed) also reach the terminal, without traceback.
INTERNAL = "dprelease.internal"


class _PipelineOnly(logging.Filter):
    """Lets through the pipeline's records only (on the terminal's and Prefect's API handlers), the internal log's
    below WARNING excepted."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _pipeline(record.name) and not (record.name == INTERNAL and record.levelno < logging.WARNING)


class _LibraryNotice(logging.Handler):
    """On the root logger: the first warning or error of each library puts a fixed line on the terminal (the
    library's name, never its text), so that the operator knows the log file has more."""

    def __init__(self, consoles: list[logging.Handler]):
        super().__init__(logging.WARNING)
        self.consoles = consoles
        self.noted: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if _pipeline(record.name):
            return
        library = "Python warnings" if record.name == "py.warnings" else record.name.partition(".")[0]
        if library in self.noted:
            return
        self.noted.add(library)
        what = "an error" if record.levelno >= logging.ERROR else "a warning"
        notice = logging.LogRecord("dprelease", logging.WARNING, __file__, 0,
                                   "%s logged %s; its text is kept out of the terminal (a library's text may quote "
                                   "raw values) and is in the run's log", (library, what), None)
        for h in self.consoles:
            h.handle(notice)


def _terminal_stream(handler: logging.Handler) -> bool:
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and getattr(handler, "stream", None) in {sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__})


def worker_file_handler(filename: str) -> logging.Handler:
    """The log handler of a local cluster's worker process (built by its logging configuration): the run's log
    file, which also receives the process's Python warnings (they would go to its stderr, the CLI's terminal)."""
    handler = logging.FileHandler(filename)
    handler.setFormatter(logging.Formatter(_WORKER_FORMAT))
    logging.captureWarnings(True)
    return handler


def worker_logging_config(log_file: Path) -> dict:
    """The logging configuration of the worker processes: every record at WARNING or above (distributed's,
    tornado's, asyncio's, any library's) to the run's log file, none to their stderr."""
    return {"version": 1, "disable_existing_loggers": False,
            "handlers": {"run_log": {"()": f"{__name__}.worker_file_handler", "filename": str(log_file)}},
            "root": {"level": "WARNING", "handlers": ["run_log"]}}


def _operator_configured_dask_logging() -> bool:
    import dask.config

    return bool(dask.config.get("distributed.logging", None) or dask.config.get("distributed.logging-file-config",
                                                                                None))


def log_path(output_dir: str | Path, release_id: str) -> Path:
    """A run's internal log file (absolute: a line that names it is read from anywhere)."""
    return Path(output_dir).resolve() / ".logs" / f"{release_id}.log"


def consoles_outlive_their_reader() -> None:
    """A console handler whose reader is gone goes quiet, for the rest of this process, instead of ending it.

    rich, under Prefect's console handler, raises SystemExit when a write meets a broken pipe
    (`rich.console.Console.on_broken_pipe`), and the handler lets it through. A flow-run process that a Prefect
    worker started writes its console to a pipe the worker reads: a worker killed alone (kill -9, the out-of-memory
    killer, a restart) ended every run it had started at their next log line, Crashed, a run in its noisy draw
    charged again on its rerun. So does a CLI whose terminal went away (a closed ssh session, `| head`). The run's log
    file and Prefect's API keep every record; the console's file descriptor is pointed at /dev/null so that nothing
    else writing to it (Python's warnings, the interpreter's last flush) meets the broken pipe either."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [lg for lg in list(logging.root.manager.loggerDict.values())
                                       if isinstance(lg, logging.Logger)]
    for handler in {h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)}:
        console = handler.console
        if getattr(console.on_broken_pipe, "_outlives_its_reader", False):
            continue

        def go_quiet(console=console) -> None:
            console.quiet = True
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, console.file.fileno())
                finally:
                    os.close(devnull)
            except (OSError, ValueError, AttributeError):  # a stream without a file descriptor: quiet is enough
                pass

        go_quiet._outlives_its_reader = True  # type: ignore[attr-defined]
        console.on_broken_pipe = go_quiet


def api_without_tracebacks() -> None:
    """Prefect's API handlers never send a traceback, for the rest of this process: a flow-run process that a Prefect
    worker started (one run per process), where Prefect's engine, after the flow returned its Failed state, logs
    the failure again with the exception's traceback ("Engine execution exited with unexpected exception"), past
    the flow's own `run_logging`. The worker's console keeps it."""
    from prefect.logging.handlers import APILogHandler

    loggers = [logging.getLogger()] + [lg for lg in list(logging.root.manager.loggerDict.values())
                                       if isinstance(lg, logging.Logger)]
    for handler in {h for lg in loggers for h in lg.handlers if isinstance(h, APILogHandler)}:
        if not isinstance(handler.formatter, _NoTraceback):
            handler.setFormatter(_NoTraceback(handler.formatter))


#: How many `run_logging` contexts are open in this process (the CLI opens one before the flow starts; a flow
#: run that a Prefect worker started has none, and the flow opens its own).
_open = 0


def in_run_logging() -> bool:
    return _open > 0


@contextmanager
def run_logging(log_file: Path, debug: bool = False, configure: bool = True) -> Iterator[Path]:
    """configure=False: inside a running flow, whose logging Prefect has set up already."""
    global _open
    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import APILogHandler, PrefectConsoleHandler

    # dask's configuration is read from the environment when dask is imported: this process's is read now,
    # before the worker processes' setting is put there (it is theirs; here it would replace the root handlers).
    operator_dask_logging = _operator_configured_dask_logging()
    if configure:
        setup_logging()
    root = logging.getLogger()
    log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_file.touch(mode=0o600)  # internal: tracebacks may quote raw values
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    file_handler.setLevel(logging.INFO)
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    consoles_outlive_their_reader()
    pipeline_only = _PipelineOnly()
    loggers = [root] + [lg for lg in list(logging.root.manager.loggerDict.values()) if isinstance(lg, logging.Logger)]
    # Prefect's API handler: on its run loggers, and on any logger listed in PREFECT_LOGGING_EXTRA_LOGGERS. It never
    # gets a traceback (the run's log file has them): a failure in the UI is the pipeline's one line.
    api = {h for lg in loggers for h in lg.handlers if isinstance(h, APILogHandler)}
    filtered = consoles + list(api)
    bare = list(api) + ([] if debug else consoles)
    saved = [h.formatter for h in bare]
    for h in bare:
        h.setFormatter(_NoTraceback(h.formatter))
    # A library logger with a terminal handler of its own and no propagation (distributed sets one up when it is
    # imported before any root handler exists) goes through the root logger's handlers for the run.
    rerouted = [(lg, lg.propagate, [h for h in lg.handlers if _terminal_stream(h)]) for lg in loggers[1:]
                if not _pipeline(lg.name) and any(_terminal_stream(h) for h in lg.handlers)]
    for h in filtered:
        h.addFilter(pipeline_only)
    for lg, _, handlers in rerouted:
        for h in handlers:
            lg.removeHandler(h)
        lg.propagate = True
    notice = _LibraryNotice(consoles)
    internal, internal_level = logging.getLogger(INTERNAL), logging.getLogger(INTERNAL).level
    internal.setLevel(logging.INFO)  # the root logger's level (WARNING) dropped its INFO records before any handler
    root.addHandler(file_handler)
    root.addHandler(notice)
    warnings_were_captured = logging._warnings_showwarning is not None  # type: ignore[attr-defined]
    logging.captureWarnings(True)  # a library's warning is a library's text (it may quote a value or a count)
    previous_env = os.environ.get(WORKER_LOGGING_ENV)
    if not operator_dask_logging:
        os.environ[WORKER_LOGGING_ENV] = repr(worker_logging_config(log_file.resolve()))
    _open += 1
    try:
        yield log_file
    finally:
        _open -= 1
        if not operator_dask_logging:
            if previous_env is None:
                os.environ.pop(WORKER_LOGGING_ENV, None)
            else:
                os.environ[WORKER_LOGGING_ENV] = previous_env
        logging.captureWarnings(warnings_were_captured)
        internal.setLevel(internal_level)
        root.removeHandler(notice)
        root.removeHandler(file_handler)
        file_handler.close()
        for lg, propagate, handlers in rerouted:
            lg.propagate = propagate
            for h in handlers:
                lg.addHandler(h)
        for h in filtered:
            h.removeFilter(pipeline_only)
        for h, formatter in zip(bare, saved):
            h.setFormatter(formatter)
