"""Empirical coverage of the published intervals (not named coverage.py: a script's folder is first on sys.path, and
numba imports the `coverage` package if it finds one): simulate many releases of one kind on a fixed dataset whose
truth is known (the exact statistic of every noise call is recorded), each through the kind's own draw with the
production samplers, its postprocessing and the uncertainty step, and count how often each published interval
holds the truth: direct measurements (analytic), postprocessed values (bootstrap), and random range or linear
queries answered through the published replicates (`tasks.replicates`).

    python tests/benchmarks/interval_coverage.py --kind histogram [--runs 500] [--queries 100] [--set epsilon=0.5 ...]

Kinds: histogram, contingency, matrix_mechanism, kmeans, mean. Last line:
RESULT kind=K nominal=0.95 direct=... postprocessed=... queries=... runs=N B=B. Detail lines give, per published
column, the pooled coverage, the worst and best single value, and the coverage of the values whose truth is within
two standard deviations of zero (where non-negativity biases the postprocessed counts) and of the others.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _simulate import Simulated, Simulator, local_client  # noqa: E402

from tasks.replicates import Replicates  # noqa: E402


class Case:
    """A kind's fixed dataset and release, and where each published interval's truth comes from."""
    release: ClassVar[dict]
    product: ClassVar[str]  # the product whose replicates answer the queries

    def data(self, folder: Path) -> dict:
        raise NotImplementedError

    def direct(self, sim: Simulated) -> dict:
        """{(file, column): truth per row} of the direct measurements."""
        raise NotImplementedError

    def post(self, sim: Simulated) -> dict:
        """{(file, column): truth per row} of the postprocessed values, rows as released."""
        return {}

    def query_truth(self, sim: Simulated) -> np.ndarray:
        """The truth of the queries' product, (rows, columns) as released."""
        raise NotImplementedError

    def queries(self, rng: np.random.Generator, shape: tuple, count: int) -> list[np.ndarray]:
        """Random range sums of the first column (ordered bins); other cases override."""
        out = []
        for _ in range(count):
            lo, hi = np.sort(rng.choice(shape[0] + 1, 2, replace=False))
            w = np.zeros(shape)
            w[lo:hi, 0] = 1.0
            out.append(w)
        return out


def _values(folder: Path, n: int, seed: int = 0) -> dict:
    """One numeric column on [0, 64): a skewed histogram (gamma) whose upper bins are sparse or empty."""
    v = np.minimum(np.random.default_rng(seed).gamma(2.0, 6.0, n), 63.999)
    pq.write_table(pa.table({"v": v}), folder / "values.parquet")
    return {"id": "coverage", "path": str(folder / "values.parquet"), "bounds": {"v": [0, 64]}}


class Histogram(Case):
    release: ClassVar = {"kind": "histogram", "bins": 64, "branching": 4, "epsilon": 1.0}
    product = "histogram.parquet"

    def data(self, folder):
        return _values(folder, 3000)

    def direct(self, sim):
        return {("noisy_tree.parquet", "noisy_count"): sim.noise.exact("tree")[0]}

    def post(self, sim):
        tree = sim.noise.exact("tree")[0]
        return {("histogram.parquet", "count"): tree[-64:], ("tree.parquet", "count"): tree}

    def query_truth(self, sim):
        return sim.noise.exact("tree")[0][-64:, None]


class MatrixMechanism(Case):
    release: ClassVar = {"kind": "matrix_mechanism", "bins": 32, "workload": "all_range", "strategy": "hierarchical",
               "epsilon": 1.0}
    product = "estimate.parquet"

    def data(self, folder):
        return _values(folder, 3000)

    def direct(self, sim):
        return {("noisy_answers.parquet", "noisy_answer"): sim.noise.exact("strategy")[0]}

    def _bins(self, sim):
        return sim.noise.exact("strategy")[0][-32:]  # the hierarchical strategy's last 32 rows are the bins

    def post(self, sim):
        return {("estimate.parquet", "count"): self._bins(sim)}

    def query_truth(self, sim):
        return self._bins(sim)[:, None]


class Contingency(Case):
    release: ClassVar = {"kind": "contingency", "epsilon": 1.0}
    product = "table.parquet"
    levels: ClassVar = {"a": ["p", "q"], "b": ["x", "y", "z"], "c": ["1", "2", "3", "4"]}

    def data(self, folder):
        rng = np.random.default_rng(0)
        n = 2000
        cols = {name: rng.choice(lv, n, p=np.array([3.0 ** -i for i in range(len(lv))]) / sum(
            3.0 ** -i for i in range(len(lv)))) for name, lv in self.levels.items()}
        pq.write_table(pa.table(cols), folder / "cells.parquet")
        return {"id": "coverage", "path": str(folder / "cells.parquet"), "categories": self.levels}

    def direct(self, sim):
        return {("noisy_cells.parquet", "noisy_count"): sim.noise.exact("cells")[0]}

    def post(self, sim):
        return {("table.parquet", "count"): sim.noise.exact("cells")[0]}

    def query_truth(self, sim):
        return sim.noise.exact("cells")[0][:, None]

    def queries(self, rng, shape, count):
        """Random sums of cells (each cell in with probability 1/2): marginal-like counting queries."""
        return [(rng.random(shape) < 0.5).astype(np.float64) for _ in range(count)]


class KMeans(Case):
    """Three separated blobs of 2,000 points in [0, 100]^2, k = 3, T = 3 (one seeding round), the default domain
    (the unit L2 ball) and postprocessing (the refinement where the noisy trajectory says it helps)."""
    release: ClassVar = {"kind": "kmeans", "k": 3, "iterations": 3, "epsilon": 1.0}
    product = "centroids.parquet"
    columns: ClassVar = ["x", "y"]

    def data(self, folder):
        rng = np.random.default_rng(0)
        centres = np.array([[25.0, 25.0], [75.0, 30.0], [45.0, 75.0]])
        X = np.clip(centres[np.repeat(np.arange(3), 2000)] + rng.normal(0, 6, (6000, 2)), 0, 100)
        pq.write_table(pa.table({"x": X[:, 0], "y": X[:, 1]}), folder / "points.parquet")
        return {"id": "coverage", "path": str(folder / "points.parquet"), "bounds": {"x": [0, 100], "y": [0, 100]}}

    def direct(self, sim):
        iteration = sim.table("trajectory.parquet")["iteration"].to_numpy()
        counts = np.concatenate(sim.noise.exact("seed_counts") + sim.noise.exact("counts"))
        sums = np.concatenate(sim.noise.exact("seed_sums") + sim.noise.exact("sums"))
        assert counts.size == iteration.size
        out = {("trajectory.parquet", "noisy_count"): counts}
        out.update({("trajectory.parquet", f"noisy_sum_{j}"): sums[:, j] for j in range(2)})
        return out

    def _means(self, sim) -> np.ndarray:
        """The means of the clusters the last iteration's assignment defines (what its centroids measure)."""
        return sim.noise.exact("sums")[-1] / np.maximum(sim.noise.exact("counts")[-1], 1.0)[:, None]

    def _aligned(self, sim) -> np.ndarray:
        """The truth in the released centroids' rows: the same clusters for the last iterate, matched (minimum
        squared distance) for a refinement, whose labels are arbitrary."""
        truth = self._means(sim)
        released = sim.table("centroids.parquet")[self.columns].to_numpy()
        if not (released == sim.table("dpkm_centroids.parquet")[self.columns].to_numpy()).all():
            rows, cols = linear_sum_assignment(((released[:, None] - truth[None]) ** 2).sum(-1))
            truth = truth[cols[np.argsort(rows)]]
        return truth

    def post(self, sim):
        truth, aligned = self._means(sim), self._aligned(sim)
        out = {("dpkm_centroids.parquet", c): truth[:, j] for j, c in enumerate(self.columns)}
        out.update({("centroids.parquet", c): aligned[:, j] for j, c in enumerate(self.columns)})
        return out

    def query_truth(self, sim):
        return self._aligned(sim)

    def queries(self, rng, shape, count):
        """Random linear combinations of the centroids' coordinates (a contrast between clusters, a sum)."""
        return [rng.normal(size=shape) for _ in range(count)]


class Mean(Case):
    """500 points around (3, -2) (standard deviation 1), public radius 10: every point is a friend of every other."""
    release: ClassVar = {"kind": "mean", "epsilon": 1.0, "delta": 1e-6, "r": 10.0}
    product = "result.parquet"

    def data(self, folder):
        X = np.random.default_rng(0).normal([3.0, -2.0], 1.0, (500, 2))
        pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1]}), folder / "points.parquet")
        return {"id": "coverage", "path": str(folder / "points.parquet"), "numeric": ["a", "b"]}

    def direct(self, sim):
        m = self._truth(sim)
        return {("result.parquet", "a"): m[:1], ("result.parquet", "b"): m[1:]}

    def query_truth(self, sim):
        return self._truth(sim)[None, :]

    @staticmethod
    def _truth(sim) -> np.ndarray:
        """What the published mean's noise was added to: the friendly mean, or for the refined mean (the default)
        c1 + S / D with S the exact clipped sum: the published value less the clipped sum's noise over D."""
        info = json.loads((sim.release / "friendlycore.json").read_text())
        if not info.get("refined"):
            return sim.noise.exact("fc_mean")[0]
        released = sim.table("result.parquet")[["a", "b"]].to_numpy()[0]
        noise = sim.noise.noisy("fc_refine")[0] - sim.noise.exact("fc_refine")[0]
        return released - noise / max(info["noisy_count"], info["weight_lower_bound"])

    def queries(self, rng, shape, count):
        return [rng.normal(size=shape) for _ in range(count)]


CASES = {"histogram": Histogram, "matrix_mechanism": MatrixMechanism, "contingency": Contingency, "kmeans": KMeans,
         "mean": Mean}


class Tally:
    """Per published column: hits per value over runs, and the truths and standard deviations seen."""

    def __init__(self):
        self.hits, self.truth, self.std = {}, {}, {}

    def add(self, sim: Simulated, truths: dict) -> None:
        for (name, column), truth in truths.items():
            t = sim.table(name)
            hit = ((t[f"{column}_lo"] <= truth) & (truth <= t[f"{column}_hi"])).to_numpy()
            key = f"{name}:{column}"
            self.hits.setdefault(key, []).append(hit)
            self.truth.setdefault(key, []).append(np.asarray(truth, dtype=np.float64))
            self.std.setdefault(key, []).append(t[f"{column}_std"].to_numpy())

    def pooled(self) -> float:
        return float(np.mean(np.concatenate([np.ravel(h) for h in self.hits.values()]))) if self.hits else float("nan")

    def lines(self) -> list[str]:
        out = []
        for key, hits in self.hits.items():
            h, truth, std = np.array(hits), np.array(self.truth[key]), np.array(self.std[key])
            per_value = h.mean(axis=0)
            near = np.abs(truth) <= 2 * std
            split = (f"; truth within 2 std of 0: {h[near].mean():.4f} ({near.mean():.0%} of values), others: "
                     f"{h[~near].mean():.4f}" if near.any() and (~near).any() else "")
            worst = int(np.argmin(per_value))
            out.append(f"  {key}: {h.mean():.4f} over {h.size} intervals; per value min {per_value.min():.3f} (row "
                       f"{worst}, truth {truth[:, worst].mean():.4g}) max {per_value.max():.3f}{split}")
        return out


def attained(sim: Simulated) -> float:
    """The direct intervals' exact coverage (>= nominal for integer laws), averaged over the published values."""
    files = json.loads((sim.release / "uncertainty.json").read_text())["direct"]["files"]
    drawn = [(name, law) for name, columns in files.items() for entries in columns.values() for law in entries
             if "attained_coverage" in law]
    laws = [law for _, law in drawn]
    rows = [sim.table(name).shape[0] if law["rows"] == "all" else law["rows"] for name, law in drawn]
    return float(np.average([law["attained_coverage"] for law in laws], weights=rows))


def query_hits(case: Case, sim: Simulated, weights: list[np.ndarray]) -> np.ndarray:
    replicates = Replicates.open(sim.release, case.product)
    truth = case.query_truth(sim)
    hits = []
    for w in weights:
        answer = replicates.answer(lambda v, w=w: float((v * w).sum()))
        hits.append(answer.lo <= float((truth * w).sum()) <= answer.hi)
    return np.array(hits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", required=True, choices=sorted(CASES))
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--queries", type=int, default=100, help="random queries per run through the replicates")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override release fields (YAML values), e.g. epsilon=0.5 replicates=99")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random queries (public)")
    args = ap.parse_args()
    case = CASES[args.kind]()
    case.release = {**case.release, **{k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}}
    folder = Path(tempfile.mkdtemp(prefix="coverage-"))
    cluster, client = local_client()
    try:
        spec = {"dataset": case.data(folder), "release": case.release}
        simulator = Simulator(spec, folder)
        confidence = simulator.spec.release.confidence
        rng = np.random.default_rng(args.seed)
        direct, post, queries, start, count = Tally(), Tally(), [], time.perf_counter(), 0
        for run in range(args.runs):
            sim = simulator.release(folder / "run")
            direct.add(sim, case.direct(sim))
            post.add(sim, case.post(sim))
            shape = case.query_truth(sim).shape
            queries.append(query_hits(case, sim, case.queries(rng, shape, args.queries)))
            count = Replicates.open(sim.release, case.product).replicates.shape[0]
            if (run + 1) % 50 == 0:
                print(f"{run + 1} runs, {time.perf_counter() - start:.0f} s", flush=True)
    finally:
        client.close()
        cluster.close()
    print(f"kind {args.kind}, release {case.release}, {args.runs} runs, B = {count}, confidence {confidence}")
    print("direct measurements (analytic intervals):", *direct.lines(), sep="\n")
    print("postprocessed values (bootstrap intervals):", *post.lines(), sep="\n")
    q = np.concatenate(queries)
    print(f"queries through the replicates: {q.mean():.4f} over {q.size} ({args.queries} per run)")
    print(f"attained coverage of the direct intervals (exact, from their noise laws): {attained(sim):.4f}")
    print(f"RESULT kind={args.kind} nominal={confidence} direct={direct.pooled():.4f} "
          f"postprocessed={post.pooled():.4f} queries={q.mean():.4f} runs={args.runs} B={count}")


if __name__ == "__main__":
    main()
