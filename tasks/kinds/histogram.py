"""The `histogram` release kind: a hierarchical histogram (Lee, Wang & Kifer Algorithm 3).

Measurement: the Laplace mechanism on every node of a k-ary tree over the bins (Hay et al.), budget split
evenly over the levels. Postprocessing: maximum-likelihood consistency by ADMM with Hay et al.'s tree
inference as the projection (or least squares alone, or none). The released histogram is non-negative and
exactly consistent: the tree is re-aggregated from the non-negative leaves, so every range query is answered
by summing leaves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from tasks.kinds import planning
from tasks.kinds.base import Draw, Footprint, ReleaseKind, noise_footprint
from tasks.kinds.uncertainty import Bootstrap, Center, Direct, Product, UncertaintyParams, bootstrap_planned, exact
from tasks.params import ConsistencyBase, is_power
from tasks.run import committed_plan

admm = module("dpalgos.admm")
hierarchy = module("dpalgos.hierarchy")
counts = module("tasks.kinds.counts")


class HistogramParams(ConsistencyBase, UncertaintyParams):
    """Hierarchical histogram (Algorithm 3): noisy k-ary tree over `bins` equal-width bins of the column's
    public bounds, made consistent by ADMM with Hay et al.'s tree inference as the projection."""
    kind: Literal["histogram"] = Field("histogram", description="the release kind")
    bins: int = Field(ge=2, le=2 ** 31 - 1, description="number of equal-width bins: a power of the branching factor "
                                                          "(the machine must hold the tree: the admission estimates "
                                                          "it, `footprint`)")
    branching: int = Field(16, ge=2, description="tree branching factor k")
    workload: Literal["ranges", "unit"] = Field(
        "ranges", description="the queries the release is for (public): ranges of bins, or single bins; it chooses "
                              "the default consistency (CONSISTENCY_FOR_WORKLOAD)")
    consistency: Literal["admm", "htree", "none"] | None = Field(
        None, description="admm: maximum likelihood (the penalty's, elastic net by default); htree: least squares "
                          "(Hay et al.); none: LM(H). Default: htree for ranges, admm for unit queries")

    @property
    def consistency_method(self) -> str:
        return self.consistency or CONSISTENCY_FOR_WORKLOAD[self.workload]

    @model_validator(mode="after")
    def _bins_power_of_branching(self):
        if not is_power(self.bins, self.branching):
            raise ValueError(f"bins ({self.bins}) must be a power of the branching factor ({self.branching})")
        return self



#: The default consistency per public workload, one rule for every histogram (docs/explanation-peers.md, measured
#: with tests/benchmarks/histogram_mse.py on the six DPBench histograms, epsilon 0.1 and 1, 16-ary tree). Random
#: ranges: HTree best in 9 of 12 (histogram, epsilon) cells and at most 1.66x the best, the elastic ADMM at most
#: 3.1x, the true L1 ADMM up to 24x (its non-negative leaves bias long ranges of sparse histograms). Unit queries:
#: ADMM (elastic) the best tree estimate, or within 0.5 % of it (bids, dense: HTree 0.2-0.5 % ahead), in all 12;
#: HTree up to 19x behind it on sparse histograms.
CONSISTENCY_FOR_WORKLOAD = {"ranges": "htree", "unit": "admm"}

NOISY = "noisy_tree.parquet"
HISTOGRAM = "histogram.parquet"
TREE = "tree.parquet"
CONSISTENCY = "consistency.json"
RANGES_PER_LENGTH = 1000
#: Seconds per tree node of one postprocessing (measured on 2 shared cores: ADMM 0.55 us/node at 4,369 and
#: 69,905 nodes; Htree 0.02 us/node), plus a fixed cost per call: the bootstrap's default B comes from them.
SECONDS_PER_NODE = {"admm": 6e-7, "htree": 3e-8, "none": 1e-8}
SECONDS_PER_CALL = 1e-4


def tree_of(spec) -> hierarchy.Tree:
    return hierarchy.Tree(spec.release.bins, spec.release.branching)


def node_columns(tree: hierarchy.Tree) -> dict[str, np.ndarray]:
    """Level and leaf interval [first_bin, end_bin) of every node, breadth-first."""
    level = np.repeat(np.arange(tree.levels, dtype=np.int32), np.diff(tree.offsets))
    width = tree.branching ** (tree.depth - level.astype(np.int64))
    pos = np.arange(tree.size) - tree.offsets[level]
    return {"level": level, "first_bin": pos * width, "end_bin": (pos + 1) * width}


def consistent_leaves(tree: hierarchy.Tree, noisy: np.ndarray, method: str, *, noise_scale: float, penalty: str,
                      alpha: float, rho: float) -> tuple[np.ndarray, dict]:
    """Non-negative leaves of the consistent estimate, and solver diagnostics."""
    if method == "none":
        return np.maximum(tree.leaves_of(noisy), 0.0), {"method": "none (LM(H) leaves, negatives set to 0)"}
    if method == "htree":
        return np.maximum(tree.leaves_of(tree.htree(noisy)), 0.0), {"method": "htree (least squares, Hay et al.)"}
    res = admm.solve_projection(noisy, tree.projection(), penalty=penalty, alpha=alpha, rho=rho, scale=noise_scale,
                                x0=tree.htree(noisy))
    return np.maximum(tree.leaves_of(res.x), 0.0), {
        "method": "admm (Lee, Wang & Kifer Algorithm 3, Htree projection)", "penalty": penalty, "alpha": alpha,
        "rho": rho, "iterations": res.iterations, "converged": res.converged,
        "residuals": {k: float(v) for k, v in res.residuals.items()}}


class HistogramKind(ReleaseKind):
    name = "histogram"
    Params = HistogramParams
    shape = "values"
    prepared_stage = "encoded"
    summary = ("Laplace on every node of a k-ary tree over public equal-width bins (Hay et al.), made consistent "
               "by ADMM (Lee, Wang & Kifer Algorithm 3, Htree projection), least squares, or not at all")

    def example(self):
        return {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0}

    def footprint(self, spec):
        """One noisy count per tree node, then the consistency pass over them (about 300 bytes and 10 us per node
        for the arrays, the projection, the Parquet files and their contracts, tests/benchmarks/footprint.py)."""
        b, bins = spec.release.branching, spec.release.bins
        nodes = (bins * b - 1) // (b - 1)
        return (noise_footprint(nodes, "laplace", True, f"the {nodes:,} noisy tree nodes")
                + Footprint(300.0 * nodes, 1e-5 * nodes, f"the consistency of {nodes:,} tree nodes"))

    def plan(self, spec):
        return hierarchy.tree_plan(tree_of(spec), epsilon=spec.release.epsilon, unit_weight=spec.dataset.unit_weight)

    def prepare(self, spec, ingested, run, log):
        out = counts.encode_bins(spec, run, ingested, spec.release.bins, log)
        log.info("binned the records into %d public bins", spec.release.bins)
        return out

    def prepared_contract(self, spec):
        return suites.encoded("bin", spec.release.bins, "weight" if spec.dataset.weight_column else None)

    def draw(self, spec, prepared, measure, public_rng, log):
        tree = tree_of(spec)
        noisy = measure("tree", tree.aggregate(counts.count(spec, prepared, "bin", tree.leaves)))
        meta = {"bins": tree.leaves, "branching": tree.branching, "levels": tree.levels}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY, "node", {"noisy_count": noisy},
                                                             **node_columns(tree)), meta=meta)

    def measurements_contract(self, spec):
        return NOISY, suites.indexed_table("measurements", "node", tree_of(spec).size, ["noisy_count"],
                                           other_columns=["level", "first_bin", "end_bin"])

    def postprocess(self, spec, measurements, staging, internal, log):
        p = spec.release
        tree = tree_of(spec)
        noisy = counts.read_column(measurements / NOISY, "noisy_count")
        leaves, info = _leaves(spec, noisy, committed_plan(measurements)["tree"].scale)
        (_column, (lo, hi)), = spec.dataset.bounds.items()
        edges = lo + (hi - lo) * np.arange(p.bins + 1) / p.bins
        counts.write_vector(staging / HISTOGRAM, "bin", {"count": leaves}, lower=edges[:-1], upper=edges[1:])
        counts.write_vector(staging / TREE, "node", {"count": tree.aggregate(leaves)}, **node_columns(tree))
        (staging / CONSISTENCY).write_text(json.dumps(info, indent=2))
        return [HISTOGRAM, TREE, CONSISTENCY]

    def release_contract(self, spec):
        return HISTOGRAM, suites.indexed_table("release", "bin", spec.release.bins, ["count"], nonnegative=["count"],
                                               other_columns=["lower", "upper"],
                                               intervals=["count"] if bootstrap_planned(self, spec) else [])

    def direct_values(self, spec, measurements, plan):
        return [Direct(NOISY, "noisy_count", "tree", NoiseLaw.of(plan["tree"]))]

    def bootstraps(self, spec):
        return True

    def replicate_seconds(self, spec, measurements=None):
        return SECONDS_PER_CALL + SECONDS_PER_NODE[spec.release.consistency_method] * tree_of(spec).size

    def bootstrap(self, spec, measurements, staging, plan):
        """Around the released leaves: the tree of their sums is the noiseless measurement they imply."""
        tree, scale = tree_of(spec), plan["tree"].scale
        released = counts.read_column(staging / HISTOGRAM, "count")

        def rerun(noisy, rng):
            leaves = _leaves(spec, noisy["tree"], scale)[0]
            return {HISTOGRAM: leaves[:, None], TREE: tree.aggregate(leaves)[:, None]}
        return Bootstrap(products=(Product(HISTOGRAM, "bin", ("count",)),
                                   Product(TREE, "node", ("count",), replicates=False)),
                         centers=(Center("tree", tree.aggregate(released), NoiseLaw.of(plan["tree"])),),
                         rerun=rerun, notes=("tree.parquet's intervals come from the leaf replicates' sums",))

    def accuracy(self, spec, records=None):
        """A noisy node (exact); the released leaf and range sums of several lengths at random positions, for
        counts far from zero (where non-negativity never binds): exact for `none` and `htree` (linear), simulated
        on a public flat histogram for `admm`."""
        tree, p = tree_of(spec), spec.release
        law = NoiseLaw.of(self.plan(spec)["tree"])
        rows = [exact("noisy tree node (measurements)", law, p.confidence)]
        families = planning.range_families(tree.leaves, tree.branching)
        if p.consistency_method == "admm":
            return rows + planning.simulated_rows(lambda y: _leaves(spec, y, law.scale)[0], tree.aggregate,
                                                  tree.leaves, law, planning.runs_for(self.replicate_seconds(spec)),
                                                  families, p.confidence)
        if p.consistency_method == "htree":
            below = np.zeros(tree.size - tree.leaves)
            return rows + planning.linear_rows(lambda q: tree.htree(np.concatenate([below, q])), tree.leaves, law,
                                               families, p.confidence, "least squares, Htree")
        return rows + planning.linear_rows(lambda q: q, tree.leaves, law, families, p.confidence, "noisy leaves")

    def evaluate(self, spec, run, prepared, log):
        """MSE of unit queries (bins) and of random range queries per length, released vs exact, with the
        unprocessed noisy leaves (LM(H)) for comparison."""
        tree = tree_of(spec)
        exact = counts.count(spec, prepared, "bin", tree.leaves)
        released = counts.read_column(run.release / HISTOGRAM, "count")
        noisy_leaves = np.maximum(tree.leaves_of(counts.read_column(run.release / "measurements" / NOISY,
                                                                    "noisy_count")), 0.0)
        rng = np.random.default_rng(0)
        lengths = [2 ** j for j in range(1, int(np.log2(tree.leaves)) - 1)]
        cs_true, cs_rel = np.concatenate([[0], np.cumsum(exact)]), np.concatenate([[0], np.cumsum(released)])
        range_mse = {}
        for L in lengths:
            start = rng.integers(0, tree.leaves - L + 1, RANGES_PER_LENGTH)
            err = (cs_rel[start + L] - cs_rel[start]) - (cs_true[start + L] - cs_true[start])
            range_mse[L] = float(np.mean(err ** 2))
        unit = float(np.mean((released - exact) ** 2))
        report = {"records": float(exact.sum()), "unit_query_mse": unit,
                  "unit_query_mse_noisy_leaves": float(np.mean((noisy_leaves - exact) ** 2)),
                  "range_query_mse": range_mse,
                  "headline": f"unit-query MSE {unit:.4g} (noisy leaves: "
                              f"{np.mean((noisy_leaves - exact) ** 2):.4g})"}
        _plot(range_mse, run.internal / "evaluation" / "range_mse.png")
        return report


def _leaves(spec, noisy: np.ndarray, scale: float) -> tuple[np.ndarray, dict]:
    """The released leaves from the noisy tree, the committed plan's scale and the spec's public parameters."""
    p = spec.release
    return consistent_leaves(tree_of(spec), noisy, p.consistency_method, noise_scale=scale, penalty=p.penalty,
                             alpha=p.alpha,
                             rho=p.rho)


def _plot(range_mse: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.loglog(list(range_mse), list(range_mse.values()), "o-")
    ax.set_xlabel("range length (bins)")
    ax.set_ylabel("MSE")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


KIND = HistogramKind()
