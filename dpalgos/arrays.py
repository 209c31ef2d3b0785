"""Array helpers shared by the set-valued paths (ingest, synthesis, baselines, generators)."""

from __future__ import annotations

import numpy as np


def distinct(keys: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D array: np.unique(keys) by a sort and a comparison. numpy 2.4's
    np.unique of int64 measured 5.3 s for 5 million keys where this takes 0.05 s (42 s against 1.5 s on the
    28 million keys of a CDR-scale baseline)."""
    out = np.sort(keys)
    if out.size:
        out = out[np.concatenate([[True], out[1:] != out[:-1]])]
    return out
