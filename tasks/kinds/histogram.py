"""The `histogram` release kind: counts over public equal-width bins of one numeric column.

Measurement (`strategy`, chosen by the public `workload`): the Laplace mechanism on every node of a k-ary tree over
the bins (Hay et al.; the measurement of Lee, Wang & Kifer's Algorithm 3), the default for range queries; or on
every bin (the identity strategy, LM), the default for single bins, where each bin gets the whole budget.

Two estimates are published per bin (and per tree node), because no single one is good for both uses:
  estimate  the signed least-squares consistent estimate (Hay et al.'s tree inference; the noisy bins themselves for
            the identity strategy): linear in the noise, so every sum of bins is unbiased and its bootstrap interval
            holds at its confidence. Range sums, `dprelease query` and the replicates are answered from it (a sum's
            answer is cut at zero, which only brings it closer to a truth that is >= 0).
  count     a non-negative value per bin for display: the tree's maximum-likelihood consistent estimate by ADMM
            (Lee, Wang & Kifer Algorithm 3, Htree projection), least squares or the noisy leaves, negatives set to 0.
            Near zero it is biased upward, and summing it sums the bias: it is for reading bin by bin. Its interval
            is the estimate's cut at zero and widened to hold it (`tasks.kinds.uncertainty.bounded_interval`).
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
replicates = module("tasks.replicates")


class HistogramParams(ConsistencyBase, UncertaintyParams):
    """Histogram of one numeric column over `bins` equal-width bins of its public bounds: the noisy nodes of a
    k-ary tree (ranges) or the noisy bins (single bins), published as a signed estimate for sums and a
    non-negative count per bin."""
    kind: Literal["histogram"] = Field("histogram", description="the release kind")
    bins: int = Field(ge=2, le=2 ** 31 - 1, description="number of equal-width bins; with the tree strategy a power of "
                                                          "the branching factor (the machine must hold the tree: the "
                                                          "admission estimates it, `footprint`)")
    branching: int = Field(16, ge=2, description="tree branching factor k (tree strategy)")
    workload: Literal["ranges", "unit"] = Field(
        "ranges", description="the queries the release is for (public): ranges of bins, or single bins; it chooses "
                              "the default strategy (STRATEGY_FOR_WORKLOAD)")
    strategy: Literal["tree", "identity"] | None = Field(
        None, description="what is measured: tree (every node of the k-ary tree, for ranges) or identity (every "
                          "bin with the whole budget, for single bins). Default: tree for ranges, identity for unit "
                          "queries; tree whenever `consistency` is given")
    consistency: Literal["admm", "htree", "none"] | None = Field(
        None, description="the tree strategy's non-negative per-bin counts: admm (maximum likelihood, the penalty's; "
                          "the default), htree (least squares, negatives set to 0) or none (the noisy leaves, "
                          "negatives set to 0). Sums are answered from the signed least-squares estimate whatever "
                          "this says")

    @property
    def strategy_used(self) -> str:
        if self.strategy is not None:
            return self.strategy
        return "tree" if self.consistency is not None else STRATEGY_FOR_WORKLOAD[self.workload]

    @property
    def consistency_method(self) -> str:
        return self.consistency or "admm"

    @model_validator(mode="after")
    def _tree_fields(self):
        if self.strategy_used == "identity" and self.consistency is not None:
            raise ValueError("consistency applies to the tree strategy only (the identity strategy measures every "
                             "bin once: nothing to make consistent)")
        if self.strategy_used == "tree" and not is_power(self.bins, self.branching):
            raise ValueError(f"bins ({self.bins}) must be a power of the branching factor ({self.branching}) for "
                             f"the tree strategy")
        return self


#: The default strategy per public workload, one rule for every histogram (docs/explanation-peers.md, measured with
#: tests/benchmarks/histogram_mse.py on the corpus of shapes): the identity strategy gives every bin the whole
#: budget, which no tree estimate beats on single bins; a tree measures every range with a few nodes.
STRATEGY_FOR_WORKLOAD = {"ranges": "tree", "unit": "identity"}

NOISY_TREE = "noisy_tree.parquet"
NOISY_BINS = "noisy_bins.parquet"
HISTOGRAM = "histogram.parquet"
TREE = "tree.parquet"
CONSISTENCY = "consistency.json"
VALUES = ["count", "estimate"]
RANGES_PER_LENGTH = 1000
#: Seconds per tree node of one bootstrap replicate (Htree: 0.02 us/node measured on 2 shared cores), plus a fixed
#: cost per call: the bootstrap's default B comes from them.
SECONDS_PER_NODE = 3e-8
SECONDS_PER_CALL = 1e-4


def tree_of(spec) -> hierarchy.Tree:
    return hierarchy.Tree(spec.release.bins, spec.release.branching)


def is_tree(spec) -> bool:
    return spec.release.strategy_used == "tree"


def noisy_file(spec) -> str:
    return NOISY_TREE if is_tree(spec) else NOISY_BINS


def node_columns(tree: hierarchy.Tree) -> dict[str, np.ndarray]:
    """Level and leaf interval [first_bin, end_bin) of every node, breadth-first."""
    level = np.repeat(np.arange(tree.levels, dtype=np.int32), np.diff(tree.offsets))
    width = tree.branching ** (tree.depth - level.astype(np.int64))
    pos = np.arange(tree.size) - tree.offsets[level]
    return {"level": level, "first_bin": pos * width, "end_bin": (pos + 1) * width}


def signed_leaves(tree: hierarchy.Tree, noisy: np.ndarray) -> np.ndarray:
    """The estimate for sums: the least-squares consistent tree's leaves (Hay et al.), linear in the noise."""
    return tree.leaves_of(tree.htree(noisy))


def consistent_leaves(tree: hierarchy.Tree, noisy: np.ndarray, method: str, *, noise_scale: float, penalty: str,
                      alpha: float, rho: float) -> tuple[np.ndarray, dict]:
    """Non-negative leaves of the consistent estimate (the per-bin counts), and solver diagnostics."""
    if method == "none":
        return np.maximum(tree.leaves_of(noisy), 0.0), {"method": "none (LM(H) leaves, negatives set to 0)"}
    if method == "htree":
        return np.maximum(signed_leaves(tree, noisy), 0.0), {"method": "htree (least squares, Hay et al.)"}
    res = admm.solve_projection(noisy, tree.projection(), penalty=penalty, alpha=alpha, rho=rho, scale=noise_scale,
                                x0=tree.htree(noisy))
    return np.maximum(tree.leaves_of(res.x), 0.0), {
        "method": "admm (Lee, Wang & Kifer Algorithm 3, Htree projection)", "penalty": penalty, "alpha": alpha,
        "rho": rho, "iterations": res.iterations, "converged": res.converged,
        "residuals": {k: float(v) for k, v in res.residuals.items()}}


def estimates(spec, noisy: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray, dict]:
    """(per-bin counts, signed estimate, diagnostics) from the noisy measurements, the committed plan's scale and
    the spec's public parameters: what the release publishes, and what every benchmark scores."""
    if not is_tree(spec):
        return np.maximum(noisy, 0.0), np.asarray(noisy, dtype=np.float64), {
            "method": "identity (LM: the noisy bins; counts: negatives set to 0)"}
    p, tree = spec.release, tree_of(spec)
    count, info = consistent_leaves(tree, noisy, p.consistency_method, noise_scale=scale, penalty=p.penalty,
                                    alpha=p.alpha, rho=p.rho)
    return count, signed_leaves(tree, noisy), {**info, "estimate": "htree (least squares, Hay et al.), signed"}


class HistogramKind(ReleaseKind):
    name = "histogram"
    Params = HistogramParams
    shape = "values"
    prepared_stage = "encoded"
    summary = ("Laplace on every node of a k-ary tree over public equal-width bins (Hay et al.; for ranges) or on "
               "every bin (for single bins); a signed least-squares estimate for sums and non-negative counts per "
               "bin, made consistent by ADMM (Lee, Wang & Kifer Algorithm 3, Htree projection)")

    def example(self):
        return {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0}

    def footprint(self, spec):
        """One noisy count per measured node, then the consistency pass over them (about 300 bytes and 10 us per
        node for the arrays, the projection, the Parquet files and their contracts, tests/benchmarks/footprint.py)."""
        b, bins = spec.release.branching, spec.release.bins
        nodes, what = ((bins * b - 1) // (b - 1), "tree nodes") if is_tree(spec) else (bins, "bins")
        return (noise_footprint(nodes, "laplace", True, f"the {nodes:,} noisy {what}")
                + Footprint(300.0 * nodes, 1e-5 * nodes, f"the consistency of {nodes:,} {what}"))

    def plan(self, spec):
        p, unit = spec.release, spec.dataset.unit_weight
        if is_tree(spec):
            return hierarchy.tree_plan(tree_of(spec), epsilon=p.epsilon, unit_weight=unit)
        return hierarchy.bins_plan(p.bins, epsilon=p.epsilon, unit_weight=unit)

    def prepare(self, spec, ingested, run, log):
        out = counts.encode_bins(spec, run, ingested, spec.release.bins, log)
        log.info("binned the records into %d public bins", spec.release.bins)
        return out

    def prepared_contract(self, spec):
        return suites.encoded("bin", spec.release.bins, "weight" if spec.dataset.weight_column else None)

    def draw(self, spec, prepared, measure, public_rng, log):
        bins = counts.count(spec, prepared, "bin", spec.release.bins)
        if not is_tree(spec):
            noisy = measure("bins", bins)
            return Draw(write=lambda folder: counts.write_vector(folder / NOISY_BINS, "bin", {"noisy_count": noisy}),
                        meta={"bins": spec.release.bins, "strategy": "identity"})
        tree = tree_of(spec)
        noisy = measure("tree", tree.aggregate(bins))
        meta = {"bins": tree.leaves, "branching": tree.branching, "levels": tree.levels, "strategy": "tree"}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY_TREE, "node", {"noisy_count": noisy},
                                                             **node_columns(tree)), meta=meta)

    def measurements_contract(self, spec):
        if not is_tree(spec):
            return NOISY_BINS, suites.indexed_table("measurements", "bin", spec.release.bins, ["noisy_count"])
        return NOISY_TREE, suites.indexed_table("measurements", "node", tree_of(spec).size, ["noisy_count"],
                                                other_columns=["level", "first_bin", "end_bin"])

    def postprocess(self, spec, measurements, staging, internal, log):
        p = spec.release
        noisy = counts.read_column(measurements / noisy_file(spec), "noisy_count")
        count, estimate, info = estimates(spec, noisy, _scale(spec, committed_plan(measurements)))
        (_column, (lo, hi)), = spec.dataset.bounds.items()
        edges = lo + (hi - lo) * np.arange(p.bins + 1) / p.bins
        counts.write_vector(staging / HISTOGRAM, "bin", {"count": count, "estimate": estimate}, lower=edges[:-1],
                            upper=edges[1:])
        (staging / CONSISTENCY).write_text(json.dumps(info, indent=2))
        if not is_tree(spec):
            return [HISTOGRAM, CONSISTENCY]
        tree = tree_of(spec)
        counts.write_vector(staging / TREE, "node", {"count": tree.aggregate(count),
                                                     "estimate": tree.aggregate(estimate)}, **node_columns(tree))
        return [HISTOGRAM, TREE, CONSISTENCY]

    def release_contract(self, spec):
        intervals = ["estimate", "count"] if bootstrap_planned(self, spec) else []
        return HISTOGRAM, suites.indexed_table("release", "bin", spec.release.bins, VALUES, nonnegative=["count"],
                                               other_columns=["lower", "upper"], intervals=intervals)

    def direct_values(self, spec, measurements, plan):
        entry = "tree" if is_tree(spec) else "bins"
        return [Direct(noisy_file(spec), "noisy_count", entry, NoiseLaw.of(plan[entry]))]

    def bootstraps(self, spec):
        return True

    def replicate_seconds(self, spec, measurements=None):
        return SECONDS_PER_CALL + SECONDS_PER_NODE * (tree_of(spec).size if is_tree(spec) else spec.release.bins)

    def bootstrap(self, spec, measurements, staging, plan):
        """Around the released signed estimate: its tree of sums (the noiseless measurement it implies) plus the
        plan's noise, estimated again. The estimate is linear, so each replicate's error has exactly the
        release's law: the intervals of every sum hold at their confidence, on any data."""
        estimate = counts.read_column(staging / HISTOGRAM, "estimate")
        bounded = (("count", "estimate"),)
        histogram = Product(HISTOGRAM, "bin", ("estimate",), bounded=bounded)
        notes = ("queries are answered from `estimate` (signed, unbiased sums); `count` (non-negative per bin) gets "
                 "the estimate's interval cut at zero and widened to hold it",)
        if not is_tree(spec):
            return Bootstrap((histogram,), (Center("bins", estimate, NoiseLaw.of(plan["bins"])),),
                             lambda noisy, rng: {HISTOGRAM: noisy["bins"][:, None]}, notes=notes)
        tree = tree_of(spec)

        def rerun(noisy, rng):
            leaves = signed_leaves(tree, noisy["tree"])
            return {HISTOGRAM: leaves[:, None], TREE: tree.aggregate(leaves)[:, None]}
        return Bootstrap(products=(histogram, Product(TREE, "node", ("estimate",), replicates=False, bounded=bounded)),
                         centers=(Center("tree", tree.aggregate(estimate), NoiseLaw.of(plan["tree"])),),
                         rerun=rerun, notes=notes + ("tree.parquet's intervals come from the bins' replicates' "
                                                     "sums",))

    def accuracy(self, spec, records=None):
        """A noisy count (exact); range sums of several lengths at random positions from the signed estimate
        (exact: it is linear); the released per-bin count for counts far from zero (where non-negativity never
        binds): exact for the identity strategy, `none` and `htree`, simulated on a public flat histogram for
        `admm`."""
        p = spec.release
        entry = "tree" if is_tree(spec) else "bins"
        law = NoiseLaw.of(self.plan(spec)[entry])
        rows = [exact(f"noisy {'tree node' if is_tree(spec) else 'bin'} (measurements)", law, p.confidence)]
        families = planning.range_families(p.bins, p.branching if is_tree(spec) else 2)
        unit, ranges = families[:1], families[1:]
        if not is_tree(spec):
            return rows + planning.linear_rows(lambda q: q, p.bins, law, families, p.confidence, "noisy bins")
        tree = tree_of(spec)
        below = np.zeros(tree.size - tree.leaves)
        htree = lambda q: tree.htree(np.concatenate([below, q]))
        if p.consistency_method == "admm":
            unit_rows = planning.simulated_rows(lambda y: estimates(spec, y, law.scale)[0], tree.aggregate,
                                                tree.leaves, law, planning.runs_for(2e-3 + 6e-7 * tree.size), unit,
                                                p.confidence)
        else:
            transform = htree if p.consistency_method == "htree" else (lambda q: q)
            unit_rows = planning.linear_rows(transform, tree.leaves, law, unit, p.confidence,
                                             p.consistency_method)
        return rows + unit_rows + planning.linear_rows(htree, tree.leaves, law, ranges, p.confidence,
                                                       "least squares, Htree: the signed estimate")

    def evaluate(self, spec, run, prepared, log):
        """Internal: the MSE of the published per-bin counts (unit queries) and of the published answers to random
        ranges per length (sums of the signed estimate, cut at zero), with the noisy measurements' for reference."""
        exact = counts.count(spec, prepared, "bin", spec.release.bins)
        table = replicates.published(run.release, HISTOGRAM)
        bins = exact.size
        rng = np.random.default_rng(0)
        lengths = [2 ** j for j in range(1, int(np.log2(bins)) - 1)]
        cs_true = np.concatenate([[0], np.cumsum(exact)])
        range_mse = {}
        for L in lengths:
            start = rng.integers(0, bins - L + 1, RANGES_PER_LENGTH)
            err = table.range_sums(start, start + L) - (cs_true[start + L] - cs_true[start])
            range_mse[L] = float(np.mean(err ** 2))
        unit = float(np.mean((table.column("count") - exact) ** 2))
        report = {"records": float(exact.sum()), "unit_query_mse": unit, "range_query_mse": range_mse,
                  "strategy": spec.release.strategy_used,
                  "headline": f"unit-query MSE {unit:.4g}; random-range MSE "
                              f"{np.mean(list(range_mse.values())) if range_mse else float('nan'):.4g}"}
        _plot(range_mse, run.internal / "evaluation" / "range_mse.png")
        return report


def _scale(spec, plan) -> float:
    return plan["tree" if is_tree(spec) else "bins"].scale


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
