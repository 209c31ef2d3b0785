"""The embedded default release: DP k-means with Lee & Kifer's refinement on the built-in sensor dataset."""

from __future__ import annotations

from tasks.example_data import BUILTIN_PREFIX, SENSOR_BOUNDS, SENSOR_REGIMES
from tasks.spec import ReleaseSpec, parse_spec


def example_spec(output_dir: str = "dprelease-runs", **overrides) -> ReleaseSpec:
    """The default release: DP k-means (K=6, T=5, epsilon=1) on the built-in sensor readings."""
    spec = {
        "dataset": {"id": "example-sensors", "path": f"{BUILTIN_PREFIX}example-sensors",
                    "bounds": {c: list(b) for c, b in SENSOR_BOUNDS.items()}},
        "release": {"kind": "kmeans", "k": SENSOR_REGIMES, "iterations": 5, "epsilon": 1.0},
        "output_dir": output_dir,
    }
    spec.update({k: v for k, v in overrides.items() if v is not None})
    return parse_spec(spec, source="built-in example")
