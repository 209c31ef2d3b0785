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
