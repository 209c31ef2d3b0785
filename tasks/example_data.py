"""Built-in public synthetic datasets, so that a fresh clone (or a deployment) can make a real release with no
data of its own. A spec selects one with `dataset.path: builtin:<name>`; it is generated on the fly."""

from __future__ import annotations

import numpy as np

from tasks import storage

BUILTIN_PREFIX = "builtin:"
SENSOR_COLUMNS = ("temperature", "humidity", "noise_db")
SENSOR_BOUNDS = {"temperature": (-20.0, 50.0), "humidity": (0.0, 100.0), "noise_db": (20.0, 120.0)}
SENSOR_ROWS = 200_000
SENSOR_REGIMES = 6


def example_sensors(location: str, rows: int = SENSOR_ROWS, seed: int = 20261122) -> str:
    """Sensor readings from 6 regimes (a Gaussian mixture) inside the public bounds, as Parquet at `location` (a local
    path or a store's URL: the run's scratch location, which every dask worker reads).

    The seed fixes the synthetic data, not any privacy noise."""
    rng = np.random.default_rng(seed)
    # Regime centres in the normalised space, well inside the unit L1 ball, mapped back to raw units.
    centres = np.array([[0.3, 0.3, 0.2], [-0.3, 0.3, -0.2], [0.3, -0.3, -0.2],
                        [-0.3, -0.3, 0.2], [0.0, 0.0, 0.6], [0.0, 0.0, -0.6]])
    z = rng.integers(0, SENSOR_REGIMES, size=rows)
    scaled = np.clip(centres[z] + rng.normal(0.0, 0.06, size=(rows, len(SENSOR_COLUMNS))), -1, 1)
    lo = np.array([SENSOR_BOUNDS[c][0] for c in SENSOR_COLUMNS])
    hi = np.array([SENSOR_BOUNDS[c][1] for c in SENSOR_COLUMNS])
    raw = lo + (scaled + 1.0) * (hi - lo) / 2.0
    import pyarrow as pa

    storage.makedirs(storage.parent(location))
    storage.write_table(pa.table({c: raw[:, j] for j, c in enumerate(SENSOR_COLUMNS)}), location)
    return location


BUILTINS = {"example-sensors": example_sensors}


def is_builtin(path: str) -> bool:
    return path.startswith(BUILTIN_PREFIX)


def materialise(path: str, folder: str) -> str:
    """Generate the built-in dataset `path` (builtin:<name>) into the location `folder`; returns its Parquet file."""
    name = path[len(BUILTIN_PREFIX):]
    if name not in BUILTINS:
        raise ValueError(f"unknown built-in dataset {path!r}; available: {sorted(BUILTINS)}")
    return BUILTINS[name](storage.join(folder, f"{name}.parquet"))
