"""What the intervals and replicates cost: one production release per kind through the real flow with the default
replicates and one with `replicates: 0` (direct intervals only, which cost milliseconds), on generated data shaped
like the shipped specs, with the stage times. Each pair runs back to back in one process, after an untimed release
of the same kind (numba's compilation, caches).

    python tests/benchmarks/uncertainty_cost.py [--kinds histogram,kmeans] [--out DIR]

Last line: RESULT <kind>=<total with / total without>[B] ... (B the default number of replicates).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import operator_ledger  # noqa: E402


def _values(folder: Path, n: int, upper: float) -> Path:
    v = np.minimum(np.random.default_rng(0).gamma(2.0, upper / 12, n), upper * 0.9999)
    pq.write_table(pa.table({"v": v}), folder / "values.parquet")
    return folder / "values.parquet"


def _points(folder: Path, n: int, k: int) -> Path:
    rng = np.random.default_rng(0)
    centres = rng.uniform(10, 90, (k, 2))
    X = np.clip(centres[rng.integers(0, k, n)] + rng.normal(0, 3, (n, 2)), 0, 100)
    pq.write_table(pa.table({"x": X[:, 0], "y": X[:, 1]}), folder / "points.parquet")
    return folder / "points.parquet"


def _cells(folder: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({c: rng.choice(["y", "n"], n, p=[0.3, 0.7]) for c in "abcdef"}), folder / "cells.parquet")
    return folder / "cells.parquet"


def _sets(folder: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    records = [sorted(set(rng.choice(40, rng.integers(1, 8), replace=False).tolist())) for _ in range(n)]
    pq.write_table(pa.table({"items": pa.array(records, type=pa.list_(pa.int32()))}), folder / "sets.parquet")
    return folder / "sets.parquet"


def _numeric(folder: Path) -> Path:
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(-10, 1, (1500, 2)), rng.normal(10, 1, (1500, 2))])
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1]}), folder / "numeric.parquet")
    return folder / "numeric.parquet"


def specs(folder: Path) -> dict:
    """{kind: (dataset, release)}, each kind its own data and dataset id, shaped like the shipped specs: Adult's
    capital-loss histogram (4,096 bins, 16-ary) and age ranges (128 bins), the Czech table (2^6 cells), S1's k-means
    (5,000 points, k = 15); the FriendlyCore and set-valued kinds at the conformance suite's sizes."""
    def place(kind: str) -> Path:
        (folder / kind).mkdir(parents=True, exist_ok=True)
        return folder / kind

    def numeric(kind):
        return {"id": f"cost-{kind}", "path": str(_numeric(place(kind))), "numeric": ["a", "b"]}

    def sets(kind):
        return {"id": f"cost-{kind}", "path": str(_sets(place(kind), 2000)), "items_column": "items",
                "item_count": 40}
    return {
        "histogram": ({"id": "cost-histogram", "path": str(_values(place("histogram"), 50_000, 4096)),
                       "bounds": {"v": [0, 4096]}},
                      {"kind": "histogram", "bins": 4096, "branching": 16, "epsilon": 0.5}),
        "matrix_mechanism": ({"id": "cost-matrix_mechanism",
                              "path": str(_values(place("matrix_mechanism"), 50_000, 128)), "bounds": {"v": [0, 128]}},
                             {"kind": "matrix_mechanism", "bins": 128, "epsilon": 0.5}),
        "contingency": ({"id": "cost-contingency", "path": str(_cells(place("contingency"), 1841)),
                         "categories": {c: ["y", "n"] for c in "abcdef"}}, {"kind": "contingency", "epsilon": 0.5}),
        "kmeans": ({"id": "cost-kmeans", "path": str(_points(place("kmeans"), 5000, 15)),
                    "bounds": {"x": [0, 100], "y": [0, 100]}}, {"kind": "kmeans", "k": 15, "iterations": 5,
                                                                "epsilon": 0.5}),
        "mean": (numeric("mean"), {"kind": "mean", "epsilon": 1.0, "delta": 1e-6, "r_min": 0.5, "r_max": 64.0}),
        "friendly_kmeans": (numeric("friendly_kmeans"), {"kind": "friendly_kmeans", "k": 2, "subsets": 100,
                                                         "epsilon": 8.0, "delta": 1e-6, "r_min": 0.25, "r_max": 32.0}),
        "kernel_kmeans": (sets("kernel_kmeans"), {"kind": "kernel_kmeans", "k": 3, "iterations": 3, "features": 20,
                                                  "gamma": 0.05, "epsilon": 1.0, "delta": 1e-6}),
        "synthetic": (sets("synthetic"), {"kind": "synthetic", "k": 2, "iterations": 2, "features": 20, "gamma": 0.05,
                                          "steps": 4, "q": 0.2, "hidden": [8], "max_items": 10, "epsilon": 2.0,
                                          "delta": 1e-6}),
    }


def release_seconds(dataset: dict, release: dict, out: Path, release_id: str) -> tuple[float, dict, int]:
    from flows.release import release as run
    from tasks.spec import parse_spec

    spec = {"dataset": dataset, "release": release, "output_dir": str(out), "evaluate": False, "release_id": release_id,
            "dask": {"n_workers": 1, "threads_per_worker": 2}}
    start = time.perf_counter()
    summary = run(spec=parse_spec(spec))
    total = time.perf_counter() - start
    manifest = json.loads((Path(summary["release_dir"]) / "manifest.json").read_text())
    return total, summary["timings"], manifest["uncertainty"]["bootstrap"]["replicates"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default=None, help="comma-separated subset")
    ap.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="uncertainty-cost-"))
    out.mkdir(parents=True, exist_ok=True)
    cases = specs(out)
    wanted = args.kinds.split(",") if args.kinds else list(cases)
    operator_ledger(out, {cases[k][0]["id"]: (10_000.0, 1e-3) for k in wanted})
    results = {}
    for kind in wanted:
        dataset, release = cases[kind]
        # A first release of the kind compiles its numba code and warms the caches: not timed.
        release_seconds(dataset, {**release, "replicates": 0}, out / "runs", f"{kind}-warm-up")
        without, t0, _ = release_seconds(dataset, {**release, "replicates": 0}, out / "runs", f"{kind}-without")
        with_, t1, count = release_seconds(dataset, release, out / "runs", f"{kind}-with")
        results[kind] = (with_ / without, count)
        print(f"{kind:17s} with B={count:3d}: {with_:6.2f} s (postprocess {t1['postprocess']:.2f} s); without: "
              f"{without:6.2f} s (postprocess {t0['postprocess']:.2f} s); ratio {with_ / without:.2f}", flush=True)
    print("RESULT " + " ".join(f"{k}={r:.2f}[{b}]" for k, (r, b) in results.items()))


if __name__ == "__main__":
    main()
