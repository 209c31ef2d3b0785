"""Modules imported on first use.

The checks that refuse a release before anything runs read a spec, its kind's public parameters and the ledger; a
schema error must come back in a fraction of a second. The numeric stack behind the kinds (dp_accounting, scipy's
signal and stats modules, numba, pandas, Prefect) takes seconds to import, so the modules on that path name their
heavy dependencies with `module(...)`: a stand-in whose first attribute read imports the module (on the draw, never
on a refusal).

The stand-in is not put in `sys.modules` (the standard library's `LazyLoader` does that): every other import of the
module gets the module itself, and the import happens under the interpreter's import lock, so threads that reach it
at once (dask's worker threads) never see a half-executed module (`LazyLoader` before Python 3.12 let them, and a
worker read an attribute that was not defined yet).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["module"]


class _Deferred:
    """Stands for a module until one of its attributes is read."""

    def __init__(self, name: str):
        self.__dict__["_name"] = name

    def __getattr__(self, attribute: str):
        real = importlib.import_module(self.__dict__["_name"])  # once imported, a dictionary lookup
        return getattr(real, attribute)

    def __repr__(self) -> str:
        return f"<module {self.__dict__['_name']!r}, imported on first use>"


def module(name: str) -> ModuleType:
    """`name`, imported when one of its attributes is first read. Use it as `hierarchy = module("dpalgos.hierarchy")`,
    then `hierarchy.Tree(...)`, never with `from ... import`."""
    return _Deferred(name)  # type: ignore[return-value]
