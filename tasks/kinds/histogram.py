"""The `histogram` release kind: counts over public equal-width bins of one numeric column.

Measurement (`strategy`, chosen by the public `workload` and the number of bins):
  optimized  HDMM's p-Identity strategy optimised for all ranges (McKenna et al. VLDB 2018; `dpalgos/hdmm.py`): the
             bins scaled and n/16 weighted sums of them, Laplace on each; the default for range queries up to
             `tasks.strategies.MAX_BINS` bins (its expected range error is half the tree's at 4,096 bins).
  tree       every node of a k-ary tree over the bins (Hay et al.; the measurement of Lee, Wang & Kifer's
             Algorithm 3): ranges above MAX_BINS bins, or whenever `consistency` is given.
  identity   every bin with the whole budget (LM): the default for single bins, which no other estimate beats.

Two estimates are published per bin (and per tree node), because no single one is good for both uses:
  estimate  the signed least-squares estimate (HDMM's, Hay et al.'s tree inference, or the noisy bins): linear in
            the noise, so every sum of bins is unbiased and its bootstrap interval holds at its confidence. Range
            sums, `dprelease query` and the replicates are answered from it (a sum's answer is cut at zero, which
            only brings it closer to a truth that is >= 0).
  count     a non-negative value per bin for display: for the tree the maximum-likelihood consistent estimate by
            ADMM (Lee, Wang & Kifer Algorithm 3, Htree projection), least squares or the noisy leaves, negatives set
            to 0; otherwise the estimate cut at zero. Near zero it is biased upward, and summing it sums the bias:
            it is for reading bin by bin. Its interval is the estimate's cut at zero and widened to hold it
            (`tasks.kinds.uncertainty.bounded_interval`).

Reading one release's path (docs/explanation/architecture.md): next, tasks/stages.py, where `measure` charges the
ledger with this kind's `plan` and draws through it.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from dpalgos.plan import Mechanism, Plan
from tasks import strategies
from tasks.kinds import planning
from tasks.kinds.base import Draw, Footprint, ReleaseKind, dense_footprint, noise_footprint
from tasks.kinds.uncertainty import Direct, Product, UncertaintyParams, bootstrap_planned, exact
from tasks.params import ConsistencyBase, is_power
from tasks.run import committed_plan

admm = module("dpalgos.admm")
hdmm = module("dpalgos.hdmm")
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
    strategy: Literal["optimized", "tree", "identity"] | None = Field(
        None, description="what is measured: optimized (HDMM's p-Identity strategy for all ranges, up to 4,096 bins), "
                          "tree (every node of the k-ary tree) or identity (every bin with the whole budget). "
                          "Default: optimized for ranges (tree above 4,096 bins), identity for unit queries; tree "
                          "whenever `consistency` is given")
    consistency: Literal["admm", "htree", "none"] | None = Field(
        None, description="the tree strategy's non-negative per-bin counts: admm (maximum likelihood, the penalty's; "
                          "the default), htree (least squares, negatives set to 0) or none (the noisy leaves, "
                          "negatives set to 0). Sums are answered from the signed least-squares estimate whatever "
                          "this says")

    @property
    def strategy_used(self) -> str:
        if self.strategy is not None:
            return self.strategy
        if self.consistency is not None:
            return "tree"
        default = STRATEGY_FOR_WORKLOAD[self.workload]
        return "tree" if default == "optimized" and self.bins > strategies.MAX_BINS else default

    @property
    def consistency_method(self) -> str:
        return self.consistency or "admm"

    @model_validator(mode="after")
    def _tree_fields(self):
        if self.strategy_used != "tree" and self.consistency is not None:
            raise ValueError("consistency applies to the tree strategy only (its per-bin counts); the other "
                             "strategies' counts are their least-squares estimate cut at zero")
        if self.strategy_used == "optimized" and self.bins > strategies.MAX_BINS:
            raise ValueError(f"the optimized strategy is for at most {strategies.MAX_BINS:,} bins (its optimisation "
                             f"grows as bins^3); use strategy: tree")
        if self.strategy_used == "tree" and not is_power(self.bins, self.branching):
            raise ValueError(f"bins ({self.bins}) must be a power of the branching factor ({self.branching}) for "
                             f"the tree strategy")
        return self


#: The default strategy per public workload, one rule for every histogram (docs/explanation-peers.md, measured with
#: tests/benchmarks/histogram_mse.py on the corpus of shapes): the identity strategy gives every bin the whole
#: budget, which no other estimate beats on single bins; HDMM's strategy has half the tree's expected error on
#: all ranges at 4,096 bins (exactly: 8.5e8 against 1.6e9 for the 16-ary tree, in units of 2 / epsilon^2).
STRATEGY_FOR_WORKLOAD = {"ranges": "optimized", "unit": "identity"}

NOISY_TREE = "noisy_tree.parquet"
NOISY_BINS = "noisy_bins.parquet"
NOISY_STRATEGY = "noisy_strategy.parquet"
#: The optimized strategy's matrix B, committed with the measurements (public: it depends on the bins only).
STRATEGY = "strategy.npz"
#: A float strategy's column L1 norms are 1 up to rounding: the plan states this much more (and the draw checks).
SENSITIVITY_MARGIN = 1e-9
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


def entry_of(spec) -> str:
    """The plan entry of the strategy's draw."""
    return {"tree": "tree", "identity": "bins", "optimized": "strategy"}[spec.release.strategy_used]


def noisy_file(spec) -> str:
    return {"tree": NOISY_TREE, "identity": NOISY_BINS, "optimized": NOISY_STRATEGY}[spec.release.strategy_used]


def noisy_index(spec) -> str:
    return {"tree": "node", "identity": "bin", "optimized": "query"}[spec.release.strategy_used]


def measured_values(spec) -> int:
    p = spec.release
    return {"tree": lambda: tree_of(spec).size, "identity": lambda: p.bins,
            "optimized": lambda: p.bins + hdmm.default_rows(p.bins)}[p.strategy_used]()


def optimized_plan(bins: int, *, epsilon: float, unit_weight: int = 1) -> Plan:
    """Laplace on every answer of HDMM's p-Identity strategy A = [I; B] D (`dpalgos.hdmm`)."""
    rows = bins + hdmm.default_rows(bins)
    return Plan((Mechanism(
        "strategy", f"the {rows} answers of HDMM's p-Identity strategy for all ranges over {bins} bins (the bins "
        f"scaled by D, and {rows - bins} weighted sums of them)", "laplace",
        float(unit_weight) * (1 + SENSITIVITY_MARGIN),
        f"every column of A = [I; B] D has L1 norm (1 + sum_i B_ij) / s_j = 1 (D = diag(1/s), s = 1 + 1'B, B >= 0): "
        f"one privacy unit adds at most {unit_weight} (its capped weight) to one bin, moving A x by at most "
        f"{unit_weight} in L1; stated {1 + SENSITIVITY_MARGIN:.9f} x that for the rounding of the column sums (the "
        f"draw checks the strategy's computed norms against it)", 1.0 / epsilon, integer=False, values=rows),))


def committed_strategy(measurements: Path):
    """The p-Identity strategy a release measured with, from its measurements (never recomputed)."""
    with np.load(measurements / STRATEGY) as f:
        return hdmm.PIdentity.of(f["B"])


def strategy_now(spec):
    """The p-Identity strategy for the spec's bins (shipped, cached or optimised now: `tasks.strategies`)."""
    return hdmm.PIdentity.of(strategies.pidentity(spec.release.bins))


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


def estimates(spec, noisy: np.ndarray, scale: float, strategy=None) -> tuple[np.ndarray, np.ndarray, dict]:
    """(per-bin counts, signed estimate, diagnostics) from the noisy measurements, the committed plan's scale, the
    committed strategy (optimized) and the spec's public parameters: what the release publishes, and what every
    benchmark scores."""
    if spec.release.strategy_used == "identity":
        return np.maximum(noisy, 0.0), np.asarray(noisy, dtype=np.float64), {
            "method": "identity (LM: the noisy bins; counts: negatives set to 0)"}
    if spec.release.strategy_used == "optimized":
        estimate = strategy.least_squares(noisy)
        return np.maximum(estimate, 0.0), estimate, {
            "method": "optimized (HDMM p-Identity for all ranges, least squares; counts: negatives set to 0)",
            "strategy_rows": int(strategy.rows), "expected_range_loss": strategy.loss}
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
    bootstraps = True

    def example(self):
        return {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0}

    @cached_property
    def tree(self) -> hierarchy.Tree:
        return tree_of(self.spec)

    @cached_property
    def entry(self) -> str:
        """The plan entry of the strategy's draw."""
        return entry_of(self.spec)

    @cached_property
    def strategy(self):
        """The optimized strategy's p-Identity matrix for the spec's bins (public: shipped, cached or optimised)."""
        return strategy_now(self.spec)

    @cached_property
    def footprint(self):
        """One noisy count per measured row, then the estimates over them (about 600 bytes and 10 us per row for the
        arrays, the projection, the Parquet files and their contracts, tests/benchmarks/footprint.py); the optimized
        strategy's p x n matrix and, where it is neither shipped nor cached, its optimisation."""
        p = self.spec.release
        rows = measured_values(self.spec)
        what = {"tree": "tree nodes", "identity": "bins", "optimized": "strategy answers"}[p.strategy_used]
        fp = (noise_footprint(rows, "laplace", p.strategy_used != "optimized", f"the {rows:,} noisy {what}")
              + Footprint(600.0 * rows, 1e-5 * rows, f"the consistency of {rows:,} {what}"))
        if p.strategy_used == "optimized":
            k = hdmm.default_rows(p.bins)
            fp += dense_footprint(4 * k, p.bins, strategies.optimise_seconds(p.bins) * 1e9,
                                  f"HDMM's {k:,} x {p.bins:,} strategy and its optimisation")
        return fp

    @cached_property
    def plan(self):
        p, unit = self.spec.release, self.spec.dataset.unit_weight
        if p.strategy_used == "optimized":
            return optimized_plan(p.bins, epsilon=p.epsilon, unit_weight=unit)
        if p.strategy_used == "tree":
            return hierarchy.tree_plan(self.tree, epsilon=p.epsilon, unit_weight=unit)
        return hierarchy.bins_plan(p.bins, epsilon=p.epsilon, unit_weight=unit)

    def prepare(self, ingested, run, log):
        out = counts.encode_bins(self.spec, run, ingested, self.spec.release.bins, log)
        log.info("binned the records into %d public bins", self.spec.release.bins)
        return out

    @cached_property
    def prepared_contract(self):
        return suites.encoded("bin", self.spec.release.bins, "weight" if self.spec.dataset.weight_column else None)

    def draw(self, prepared, measure, public_rng, log):
        p = self.spec.release
        if p.strategy_used == "optimized":
            strategy = self.strategy  # public, data-independent: before the data is read
        bins = counts.count(self.spec, prepared, "bin", p.bins)
        if p.strategy_used == "identity":
            noisy = measure("bins", bins)
            return Draw(write=lambda folder: counts.write_vector(folder / NOISY_BINS, "bin", {"noisy_count": noisy}),
                        meta={"bins": p.bins, "strategy": "identity"})
        if p.strategy_used == "optimized":
            if not strategy.sensitivity() <= 1 + SENSITIVITY_MARGIN:
                raise RuntimeError("the optimized strategy's column norms exceed the plan's sensitivity")
            # Sensitivity 1 (x the unit's weight): every column of A has L1 norm 1 (the plan entry's argument).
            noisy = measure("strategy", strategy.answers(bins))

            def write(folder):
                counts.write_vector(folder / NOISY_STRATEGY, "query", {"noisy_count": noisy})
                np.savez_compressed(folder / STRATEGY, B=strategy.B)
            return Draw(write=write, meta={"bins": p.bins, "strategy": "optimized", "strategy_rows": strategy.p,
                                           "strategy_seed": strategies.SEED})
        tree = self.tree
        noisy = measure("tree", tree.aggregate(bins))
        meta = {"bins": tree.leaves, "branching": tree.branching, "levels": tree.levels, "strategy": "tree"}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY_TREE, "node", {"noisy_count": noisy},
                                                             **node_columns(tree)), meta=meta)

    @cached_property
    def measurements_contract(self):
        if is_tree(self.spec):
            return NOISY_TREE, suites.indexed_table("measurements", "node", self.tree.size, ["noisy_count"],
                                                    other_columns=["level", "first_bin", "end_bin"])
        return noisy_file(self.spec), suites.indexed_table("measurements", noisy_index(self.spec),
                                                           measured_values(self.spec), ["noisy_count"])

    def postprocess(self, measurements, staging, internal, log):
        spec, p = self.spec, self.spec.release
        noisy = counts.read_column(measurements / noisy_file(spec), "noisy_count")
        strategy = committed_strategy(measurements) if p.strategy_used == "optimized" else None
        count, estimate, info = estimates(spec, noisy, committed_plan(measurements)[self.entry].scale, strategy)
        (_column, (lo, hi)), = spec.dataset.bounds.items()
        edges = lo + (hi - lo) * np.arange(p.bins + 1) / p.bins
        counts.write_vector(staging / HISTOGRAM, "bin", {"count": count, "estimate": estimate}, lower=edges[:-1],
                            upper=edges[1:])
        (staging / CONSISTENCY).write_text(json.dumps(info, indent=2))
        if not is_tree(spec):
            return [HISTOGRAM, CONSISTENCY]
        tree = self.tree
        counts.write_vector(staging / TREE, "node", {"count": tree.aggregate(count),
                                                     "estimate": tree.aggregate(estimate)}, **node_columns(tree))
        return [HISTOGRAM, TREE, CONSISTENCY]

    @cached_property
    def release_contract(self):
        intervals = ["estimate", "count"] if bootstrap_planned(self) else []
        return HISTOGRAM, suites.indexed_table("release", "bin", self.spec.release.bins, VALUES, nonnegative=["count"],
                                               other_columns=["lower", "upper"], intervals=intervals)

    def direct_values(self, measurements, plan):
        return [Direct(noisy_file(self.spec), "noisy_count", self.entry, NoiseLaw.of(plan[self.entry]))]

    def replicate_seconds(self, measurements=None):
        p = self.spec.release
        if p.strategy_used == "optimized":  # least squares: two products with the p x n matrix
            return SECONDS_PER_CALL + 4e-9 * p.bins * hdmm.default_rows(p.bins)
        return SECONDS_PER_CALL + SECONDS_PER_NODE * measured_values(self.spec)

    def bootstrap(self, measurements, staging, plan):
        """Around the released signed estimate (`counts.signed_bootstrap`): the measurements it implies are its tree
        of sums, the strategy's answers on it, or itself."""
        estimate = counts.read_column(staging / HISTOGRAM, "estimate")
        entry = self.entry
        law = NoiseLaw.of(plan[entry])
        if self.spec.release.strategy_used == "identity":
            return counts.signed_bootstrap(HISTOGRAM, "bin", entry, law, estimate,
                                           lambda y: {HISTOGRAM: y[:, None]})
        if self.spec.release.strategy_used == "optimized":
            strategy = committed_strategy(measurements)
            return counts.signed_bootstrap(HISTOGRAM, "bin", entry, law, strategy.answers(estimate),
                                           lambda y: {HISTOGRAM: strategy.least_squares(y)[:, None]})
        tree = self.tree

        def solve(y):
            leaves = signed_leaves(tree, y)
            return {HISTOGRAM: leaves[:, None], TREE: tree.aggregate(leaves)[:, None]}
        return counts.signed_bootstrap(
            HISTOGRAM, "bin", "tree", law, tree.aggregate(estimate), solve,
            also=(Product(TREE, "node", ("estimate",), replicates=False, bounded=(("count", "estimate"),)),),
            notes=("tree.parquet's intervals come from the bins' replicates' sums",))

    def accuracy(self, records=None):
        """A noisy measurement (exact); range sums of several lengths at random positions from the signed estimate
        (exact: it is linear); the released per-bin count for counts far from zero (where non-negativity never
        binds): exact except for the tree's `admm`, simulated on a public flat histogram."""
        spec, p = self.spec, self.spec.release
        law = NoiseLaw.of(self.plan[self.entry])
        what = {"tree": "tree node", "identity": "bin", "optimized": "strategy answer"}[p.strategy_used]
        rows = [exact(f"noisy {what} (measurements)", law, p.confidence)]
        families = planning.range_families(p.bins, p.branching if is_tree(spec) else 2)
        if p.strategy_used == "identity":
            return rows + planning.linear_rows(lambda q: q, p.bins, law, families, p.confidence, "noisy bins")
        if p.strategy_used == "optimized":
            return rows + planning.linear_rows(self.strategy.estimate_weights, p.bins, law, families, p.confidence,
                                               "least squares, HDMM's strategy: the signed estimate")
        unit, ranges = families[:1], families[1:]
        tree = self.tree
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

    def evaluate(self, run, prepared, log):
        """Internal: the MSE of the published per-bin counts (unit queries) and of the published answers to random
        ranges per length (sums of the signed estimate, cut at zero), with the noisy measurements' for reference."""
        exact = counts.count(self.spec, prepared, "bin", self.spec.release.bins)
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
                  "strategy": self.spec.release.strategy_used,
                  "headline": f"unit-query MSE {unit:.4g}; random-range MSE "
                              f"{np.mean(list(range_mse.values())) if range_mse else float('nan'):.4g}"}
        _plot(range_mse, run.internal / "evaluation" / "range_mse.png")
        return report


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
