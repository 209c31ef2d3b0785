"""great-expectations data contracts: one suite per stage output, and the Parquet validator.

great-expectations costs seconds to import (scipy.stats, altair, its SQL layer): a release starts importing it on a
thread (`preload`) while its cluster starts and ingest reads, and every use here waits for that import to end
(`loaded`) rather than import it alongside: importing one package from two threads at once can fail half-way (a
name imported from a module the other thread has not finished).
"""

from __future__ import annotations

import sys
import threading

from data_contracts.validate import ContractViolation, validate_parquet

__all__ = ["ContractViolation", "loaded", "preload", "validate_parquet"]

_loading: threading.Thread | None = None


def preload() -> None:
    """Import great-expectations on a thread of its own (once per process)."""
    global _loading
    if _loading is not None or "great_expectations" in sys.modules:
        return

    def load() -> None:
        try:
            import great_expectations.expectations  # noqa: F401
        except Exception:  # the first use imports it again and reports what failed
            pass
    _loading = threading.Thread(target=load, name="import-great-expectations", daemon=True)
    _loading.start()


def loaded() -> None:
    """Wait for a `preload` in flight, if any; then great-expectations may be imported here."""
    if _loading is not None:
        _loading.join()
