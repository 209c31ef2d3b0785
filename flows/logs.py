"""Logging of one `dprelease run`: the terminal gets one line per record (tracebacks only with --debug), the
run's log file gets everything, tracebacks included (third-party error texts may quote raw values: the file
is internal, readable by its owner only). It sits in <output_dir>/.logs/, beside the run folders, never under
release/."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class _NoTraceback(logging.Formatter):
    """The wrapped formatter, on a copy of the record without its exception and stack (the record itself is
    shared with the file handler, which keeps them)."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        bare = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None, "stack_info": None})
        return self.inner.format(bare)


@contextmanager
def run_logging(log_file: Path, debug: bool = False) -> Iterator[Path]:
    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    setup_logging()
    root = logging.getLogger()
    log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_file.touch(mode=0o600)  # internal: tracebacks may quote raw values
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    file_handler.setLevel(logging.INFO)
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    saved = [h.formatter for h in consoles]
    if not debug:
        for h in consoles:
            h.setFormatter(_NoTraceback(h.formatter))
    root.addHandler(file_handler)
    try:
        yield log_file
    finally:
        root.removeHandler(file_handler)
        file_handler.close()
        for h, formatter in zip(consoles, saved):
            h.setFormatter(formatter)
