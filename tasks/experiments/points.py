"""Point datasets of the k-means experiments (Lee & Kifer Table 1) from ../shared/data."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tasks.sources import delimiter_of, split

#: A first line of these only is data. The experiments' own rule, older than a release's reader (`tasks.sources`):
#: nan and inf are no numbers here, so a first line holding one is taken for a header.
_FINITE_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")

GOWALLA_POINTS = 107_021


def gowalla_like(grid_path: str | Path, n: int = GOWALLA_POINTS, seed: int = 0) -> np.ndarray:
    """A Gowalla-like point set: n check-ins drawn from the 256 x 256 check-in histogram (cells with
    probability proportional to their count), each jittered uniformly inside its cell. (n, 2) in [0, 256)."""
    counts = np.load(grid_path).astype(np.float64)
    rng = np.random.default_rng(seed)
    cells = rng.choice(counts.size, size=n, p=(counts / counts.sum()).ravel())
    rows, cols = np.unravel_index(cells, counts.shape)
    return np.column_stack([rows, cols]).astype(np.float64) + rng.random((n, 2))


def load_points(path: str | Path) -> np.ndarray:
    """A numeric CSV (headerless or headed; comma, tab or whitespace separated) as an array (n, d)."""
    path = Path(path)
    with open(path) as fh:
        first = next(line for line in fh if line.strip()).strip()
    sep = delimiter_of(first)
    header = not all(_FINITE_NUMBER.match(t.strip('"')) for t in split(first, sep))
    X = np.loadtxt(path, delimiter=sep, skiprows=1 if header else 0, ndmin=2)
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{path}: non-finite values")
    return X
