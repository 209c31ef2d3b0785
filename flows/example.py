"""The embedded default release: a generated (public, synthetic) point dataset and its spec, so that a fresh
clone can make a real release with no data of its own and no server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.spec import ReleaseSpec, parse_spec

COLUMNS = ("temperature", "humidity", "noise_db")
BOUNDS = {"temperature": (-20.0, 50.0), "humidity": (0.0, 100.0), "noise_db": (20.0, 120.0)}
ROWS = 200_000
K = 6


def generate_points(path: Path, rows: int = ROWS, seed: int = 20261122) -> Path:
    """Sensor readings from K regimes (a Gaussian mixture) inside the public bounds, as Parquet.

    The seed fixes the synthetic data, not any privacy noise."""
    rng = np.random.default_rng(seed)
    # Regime centres in the normalised space, well inside the unit L1 ball, mapped back to raw units.
    centres = np.array([[0.3, 0.3, 0.2], [-0.3, 0.3, -0.2], [0.3, -0.3, -0.2],
                        [-0.3, -0.3, 0.2], [0.0, 0.0, 0.6], [0.0, 0.0, -0.6]])
    z = rng.integers(0, K, size=rows)
    scaled = np.clip(centres[z] + rng.normal(0.0, 0.06, size=(rows, len(COLUMNS))), -1, 1)
    lo = np.array([BOUNDS[c][0] for c in COLUMNS])
    hi = np.array([BOUNDS[c][1] for c in COLUMNS])
    raw = lo + (scaled + 1.0) * (hi - lo) / 2.0
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({c: raw[:, j] for j, c in enumerate(COLUMNS)}), path)
    return path


def example_spec(output_dir: str = "dprelease-runs", **overrides) -> ReleaseSpec:
    """The default release: DP k-means (K=6, T=5, epsilon=1) on the generated sensor readings."""
    data = Path(output_dir) / "example-data" / "sensors.parquet"
    if not data.exists():
        generate_points(data)
    spec = {
        "dataset": {"id": "example-sensors", "path": str(data), "bounds": {c: list(b) for c, b in BOUNDS.items()}},
        "release": {"kind": "kmeans", "k": K, "iterations": 5, "epsilon": 1.0},
        "ledger": {"lifetime_epsilon": 10.0, "lifetime_delta": 1e-6},
        "output_dir": output_dir,
    }
    spec.update({k: v for k, v in overrides.items() if v is not None})
    return parse_spec(spec, source="built-in example")
