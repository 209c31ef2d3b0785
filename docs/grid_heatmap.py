"""Make docs/grid-heatmap.png: the heat map a `grid` release's report shows (`tasks.kinds.grid.picture`, released
counts only), here of the shipped 256 x 256 check-in grid released at epsilon 1 with the defaults (the Kronecker
strategy, counts by ADMM), the noise drawn by the plan's exact samplers (OpenDP).

    python docs/grid_heatmap.py [--out docs/grid-heatmap.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dpalgos.noise import ExactNoise, Measure  # noqa: E402
from tasks.kinds import grid as G  # noqa: E402
from tasks.report import heatmap  # noqa: E402
from tasks.spec import parse_spec  # noqa: E402

CHECKIN = REPO.parent / "shared" / "data" / "spatial" / "checkin_256_256.npy"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "grid-heatmap.png")
    args = ap.parse_args()
    spec = parse_spec({"dataset": {"id": "checkin", "path": str(CHECKIN),
                                   "bounds": {"x": [0, 256], "y": [0, 256]}},
                       "release": {"kind": "grid", "cells": 256, "epsilon": 1.0}})
    plan, strategy = G.KIND.bind(spec).plan, G.kronecker_now(256, 2)
    noisy, _ = G.measure_grid(spec, np.load(CHECKIN).astype(np.float64), Measure(plan, ExactNoise()), strategy)
    count, _, _ = G.estimates(spec, noisy, plan["strategy"].scale, strategy)
    heatmap(G.picture(count, spec.dataset.bounds, "released counts of the check-ins (kronecker, epsilon 1)"), args.out)


if __name__ == "__main__":
    main()
