"""The ledger's connection pools: one SQLAlchemy engine per ledger location and process, shared by every
`PrivacyLedger` of that location the process opens (each command, stage and check opens its own), so that a
transaction borrows a connection instead of opening one (a PostgreSQL connection costs a round trip, its
authentication and a backend process)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable

from dpalgos.lazy import module

sa = module("sqlalchemy")

#: How long a writer waits for the ledger's lock before its transaction fails (SQLite's busy timeout; PostgreSQL's
#: lock_timeout is the same).
LOCK_WAIT_SECONDS = 120
#: Engines kept per process (each holds its idle connections): a process opens one ledger, a test process many.
ENGINES_KEPT = 8

_ENGINES: OrderedDict[tuple, sa.Engine] = OrderedDict()
_LOCK = threading.Lock()


def pooled(key: tuple, make: Callable[[], sa.Engine]) -> sa.Engine:
    """The process's engine for `key` (made once; a forked child makes its own: a pool's connections are not to be
    shared across processes). The least recently used beyond `ENGINES_KEPT` is disposed of (its idle connections
    closed; a transaction in flight on it finishes on its own connection)."""
    key = (os.getpid(), *key)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = make()
            while len(_ENGINES) > ENGINES_KEPT:
                _ENGINES.popitem(last=False)[1].dispose()
        _ENGINES.move_to_end(key)
    return engine
