"""Modules loaded on first use (the standard library's `importlib.util.LazyLoader`).

The checks that refuse a release before anything runs read a spec, its kind's public parameters and the ledger; a
schema error must come back in a fraction of a second. The numeric stack behind the kinds (dp_accounting, scipy's
signal and stats modules, numba, pandas, Prefect) takes seconds to import, so the modules on that path name their
heavy dependencies with `module(...)`: the module object exists at once and is executed when an attribute of it is
first read (on the draw, never on a refusal).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

__all__ = ["module"]


def module(name: str) -> ModuleType:
    """`name` imported lazily (or the module itself when it is already imported): its code runs when one of its
    attributes is first read. Use it as `hierarchy = module("dpalgos.hierarchy")`, never with `from ... import`.
    The packages above it are imported at once (finding a submodule imports its package): name a heavy package
    itself (`module("dp_accounting")`), not one of its submodules."""
    if name in sys.modules:
        return sys.modules[name]
    parent, _, child = name.rpartition(".")
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    lazy = importlib.util.module_from_spec(spec)
    sys.modules[name] = lazy
    loader.exec_module(lazy)
    if parent:
        setattr(sys.modules[parent], child, lazy)
    return lazy
