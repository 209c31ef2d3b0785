"""The accuracy planner against simulated releases: for each quantity `dprelease accuracy` predicts, its standard
deviation measured over many releases of one kind on a fixed dataset with known truth (the kind's own draw with
the production samplers and its postprocessing, `_simulate.py`), beside the prediction.

    python tests/benchmarks/planner_check.py --kind histogram [--runs 200]

The datasets satisfy the planner's stated assumptions: counts far from zero (histogram, contingency, matrix
mechanism), every record in the friendly core (mean); k-means' centroid row is the planner's formula at each
cluster's own size and coordinate (its default assumption, equal clusters at the domain's mean square coordinate,
is printed beside). Last line: RESULT kind=K worst_ratio=<measured / predicted farthest from 1> rows=<n>.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _simulate import Simulated, Simulator, local_client  # noqa: E402

from dpalgos.intervals import NoiseLaw  # noqa: E402
from tasks.kinds import planning  # noqa: E402
from tasks.kinds.kmeans import centroid_std  # noqa: E402


def _uniform_values(folder: Path, bins: int, per_bin: int) -> dict:
    """Exactly `per_bin` records in every bin of [0, bins): every count far from zero."""
    v = np.repeat(np.arange(bins), per_bin) + np.random.default_rng(0).uniform(0.05, 0.95, bins * per_bin)
    pq.write_table(pa.table({"v": v}), folder / "values.parquet")
    return {"id": "planner", "path": str(folder / "values.parquet"), "bounds": {"v": [0, bins]}}


def _rms_std(errors: list[np.ndarray]) -> float:
    """(runs, values) errors -> the root mean square over values of their standard deviation over runs."""
    return float(np.sqrt(np.mean(np.array(errors).var(axis=0, ddof=1))))


def _ranges(errors: list[np.ndarray], bins: int, branching: int = 2) -> dict:
    """Each planner range family's measured figure: the same public positions, RMS over them of the std."""
    err = np.array(errors)
    cumulative = np.concatenate([np.zeros((err.shape[0], 1)), np.cumsum(err, axis=1)], axis=1)
    out = {}
    for family in planning.range_families(bins, branching):
        out[family.name] = float(np.sqrt(np.mean(np.var(family.errors(cumulative.T).T, axis=0, ddof=1))))
    return out


class Check:
    """A kind's dataset and release, and the measured value of each planner quantity over the runs; `formula`:
    predictions the planner makes from data-dependent values (a cluster's size), evaluated at the data's."""
    release: ClassVar[dict]
    records: int | None = None
    formula: ClassVar[dict] = {}

    def data(self, folder: Path) -> dict:
        raise NotImplementedError

    def measure(self, sims: list[Simulated]) -> dict:
        raise NotImplementedError


class Histogram(Check):
    release: ClassVar = {"kind": "histogram", "bins": 64, "branching": 4, "epsilon": 1.0, "replicates": 0}

    def data(self, folder):
        return _uniform_values(folder, 64, 400)

    def measure(self, sims):
        exact = [s.noise.exact("tree")[0] for s in sims]
        noisy = [s.table("noisy_tree.parquet")["noisy_count"].to_numpy() for s in sims]
        leaves = [s.table("histogram.parquet")["count"].to_numpy() - e[-64:] for s, e in zip(sims, exact)]
        return {"noisy tree node (measurements)": _rms_std([n - e for n, e in zip(noisy, exact)]),
                **_ranges(leaves, 64, 4)}


class MatrixMechanism(Check):
    release: ClassVar = {"kind": "matrix_mechanism", "bins": 32, "workload": "all_range", "strategy": "hierarchical",
               "epsilon": 1.0, "replicates": 0}

    def data(self, folder):
        return _uniform_values(folder, 32, 400)

    def measure(self, sims):
        exact = [s.noise.exact("strategy")[0] for s in sims]
        noisy = [s.table("noisy_answers.parquet")["noisy_answer"].to_numpy() for s in sims]
        bins = [s.table("estimate.parquet")["count"].to_numpy() - e[-32:] for s, e in zip(sims, exact)]
        return {"noisy strategy answer (measurements)": _rms_std([n - e for n, e in zip(noisy, exact)]),
                **_ranges(bins, 32)}


class Contingency(Check):
    release: ClassVar = {"kind": "contingency", "epsilon": 1.0, "replicates": 0}

    def data(self, folder):
        levels = {"a": ["p", "q"], "b": ["x", "y", "z"], "c": ["1", "2", "3", "4"]}
        cells = np.array(np.meshgrid(*levels.values(), indexing="ij")).reshape(3, -1).T
        rows = np.repeat(cells, 300, axis=0)
        pq.write_table(pa.table({k: rows[:, j] for j, k in enumerate(levels)}), folder / "cells.parquet")
        return {"id": "planner", "path": str(folder / "cells.parquet"), "categories": levels}

    def measure(self, sims):
        exact = [s.noise.exact("cells")[0] for s in sims]
        noisy = [s.table("noisy_cells.parquet")["noisy_count"].to_numpy() for s in sims]
        table = [s.table("table.parquet")["count"].to_numpy() for s in sims]
        return {"noisy cell (measurements)": _rms_std([n - e for n, e in zip(noisy, exact)]),
                "released cell": _rms_std([t - e for t, e in zip(table, exact)])}


class KMeans(Check):
    """Three blobs of 3,000 points, k = 3, T = 3, postprocessing [] (the last iterate is released)."""
    release: ClassVar = {"kind": "kmeans", "k": 3, "iterations": 3, "epsilon": 1.0, "postprocess": [], "replicates": 0}
    records = 9000

    def data(self, folder):
        rng = np.random.default_rng(0)
        centres = np.array([[25.0, 25.0], [75.0, 30.0], [45.0, 75.0]])
        X = np.clip(centres[np.repeat(np.arange(3), 3000)] + rng.normal(0, 6, (9000, 2)), 0, 100)
        pq.write_table(pa.table({"x": X[:, 0], "y": X[:, 1]}), folder / "points.parquet")
        return {"id": "planner", "path": str(folder / "points.parquet"), "bounds": {"x": [0, 100], "y": [0, 100]}}

    def measure(self, sims):
        counts = [np.concatenate(s.noise.exact("counts")) for s in sims]
        sums = [np.concatenate(s.noise.exact("sums")) for s in sims]
        traj = [s.table("trajectory.parquet").query("iteration > 0") for s in sims]
        last_n = np.array([s.noise.exact("counts")[-1] for s in sims])
        truth = np.array([s.noise.exact("sums")[-1] for s in sims]) / last_n[:, :, None]
        released = np.array([s.table("dpkm_centroids.parquet")[["x", "y"]].to_numpy() for s in sims])
        measured = (released - truth).std(axis=0, ddof=1)  # (clusters, coordinates)
        plan = json.loads((sims[0].measurements / "measurements.json").read_text())["plan"]["mechanisms"]
        laws = {m["name"]: NoiseLaw(m["distribution"], m["integer"], m["noise_multiplier"] * m["sensitivity"])
                for m in plan}
        # Per run: the seeding's candidates are public randomness drawn afresh, so a label is not one cluster.
        per_run = np.vectorize(lambda n, c: centroid_std(laws["counts"], laws["sums"], n, c))(last_n[:, :, None], truth)
        formula = np.sqrt(np.mean(per_run ** 2, axis=0))
        print(f"  last-iterate centroid coordinate per cluster and coordinate: measured {np.round(measured, 5)}, the "
              f"planner's formula at each cluster's size and coordinate {np.round(formula, 5)}")
        self.formula = {"last-iterate centroid coordinate": float(np.sqrt(np.mean(formula ** 2)))}
        return {"noisy cluster count (every iteration)":
                _rms_std([t["noisy_count"].to_numpy() - c for t, c in zip(traj, counts)]),
                "noisy cluster sum, one coordinate (every iteration)":
                _rms_std([t[["noisy_sum_0", "noisy_sum_1"]].to_numpy().ravel() - s.ravel()
                          for t, s in zip(traj, sums)]),
                "last-iterate centroid coordinate": float(np.sqrt(np.mean(measured ** 2)))}


class Mean(Check):
    release: ClassVar = {"kind": "mean", "epsilon": 1.0, "delta": 1e-6, "r": 10.0, "replicates": 0}
    records = 500

    def data(self, folder):
        X = np.random.default_rng(0).normal([3.0, -2.0], 1.0, (500, 2))
        pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1]}), folder / "points.parquet")
        return {"id": "planner", "path": str(folder / "points.parquet"), "numeric": ["a", "b"]}

    def measure(self, sims):
        truth = [s.noise.exact("fc_mean")[0] for s in sims]
        released = [s.table("result.parquet")[["a", "b"]].to_numpy()[0] for s in sims]
        weight = [json.loads((s.release / "friendlycore.json").read_text())["noisy_core_weight"]
                  - s.noise.exact("fc_weight")[0][0] for s in sims]
        return {"noisy core weight (friendlycore.json)": float(np.std(weight, ddof=1)),
                "released mean coordinate": _rms_std([r - t for r, t in zip(released, truth)])}


CHECKS = {"histogram": Histogram, "matrix_mechanism": MatrixMechanism, "contingency": Contingency, "kmeans": KMeans,
          "mean": Mean}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", required=True, choices=sorted(CHECKS))
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    check = CHECKS[args.kind]()
    folder = Path(tempfile.mkdtemp(prefix="planner-check-"))
    cluster, client = local_client()
    try:
        simulator = Simulator({"dataset": check.data(folder), "release": check.release}, folder)
        predicted = {r.quantity: r.std for r in simulator.kind.accuracy(check.records)}
        sims = [simulator.release(folder / f"run{i}") for i in range(args.runs)]
        measured = check.measure(sims)
    finally:
        client.close()
        cluster.close()
    ratios = {}
    print(f"kind {args.kind}, release {check.release}, {args.runs} runs")
    for name, value in measured.items():
        expected = check.formula.get(name, predicted[name])
        ratios[name] = value / expected
        note = (f" (the planner's formula at each cluster's size and coordinate; at --records {check.records}, equal "
                f"clusters and the domain's mean square coordinate, it says {predicted[name]:.5g})"
                if name in check.formula else "")
        print(f"  {name:58s} predicted {expected:10.5g} measured {value:10.5g} ratio {ratios[name]:.4f}{note}")
    worst = max(ratios.values(), key=lambda r: abs(r - 1))
    print(f"RESULT kind={args.kind} worst_ratio={worst:.4f} rows={len(ratios)} runs={args.runs}")


if __name__ == "__main__":
    main()
