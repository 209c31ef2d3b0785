"""Reading the benchmarks' numeric CSV inputs (headerless or headed, comma / tab / whitespace separated)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def load_numeric_csv(path: str | Path) -> np.ndarray:
    path = Path(path)
    with open(path) as fh:
        first = next(line for line in fh if line.strip()).strip()
    sep = "," if "," in first else "\t" if "\t" in first else None
    tokens = first.split(sep)
    header = not all(_NUMBER.match(t.strip().strip('"')) for t in tokens)
    X = np.loadtxt(path, delimiter=sep, skiprows=1 if header else 0, ndmin=2)
    if not np.all(np.isfinite(X)):
        raise SystemExit(f"{path}: non-finite values")
    return X


def operator_ledger(folder: str | Path, budgets: dict[str, tuple[float, float]]) -> Path:
    """A benchmark acts as its own operator: a ledger in `folder` (set as this process's ledger) holding the
    given lifetime budgets."""
    import os

    from tasks.ledger import LEDGER_ENV, PrivacyLedger

    path = Path(folder).resolve() / "operator-ledger.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ[LEDGER_ENV] = str(path)
    for dataset, (epsilon, delta) in budgets.items():
        PrivacyLedger(path).set_budget(dataset, epsilon, delta)
    return path
