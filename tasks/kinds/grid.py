"""The `grid` release kind: counts over a public 2-D (or 3-D) grid of `cells` equal-width cells per axis over the
public bounds of two (or three) numeric columns: a density map, published per cell and per block of the quadtree
pyramid above the cells, answering rectangle queries (`dprelease query RELEASE --rect x0 x1 y0 y1`).

Measurement (`strategy`, chosen by the public `workload`, one rule for every dataset: STRATEGY_FOR_WORKLOAD):
  kronecker  HDMM's strategy for a product workload (McKenna et al. VLDB 2018 §6): the Kronecker product of the
             p-Identity strategy for all ranges of one axis (`dpalgos.hdmm`, shipped in tasks/strategies/) on every
             axis (`dpalgos.kronecker`), Laplace on each answer: the default for rectangles.
  quadtree   every node of the quadtree over the cells (Cormode et al. ICDE 2012; `dpalgos.quadtree`), Laplace on
             each, as the `histogram` kind's tree.
  identity   every cell with the whole budget: the default for single cells.
  adaptive   (2-D) Qardaji, Yang & Li's adaptive grid (ICDE 2013, AG; `dpalgos.adaptive_grid`) with HDMM's
             Kronecker strategy on its coarse level: the number of points (the public `points`, else a noisy count)
             chooses between every cell (dense for its epsilon: the workload's default strategy) and a coarse grid
             whose side it sets, each coarse cell cut into leaves by its estimate (plan branches). Far more
             accurate where the map is sparse for its epsilon (tests/benchmarks/spatial_peers.py), but a cell's
             value shares its leaf's count by a rule no released value checks: its cells carry no interval; every
             noisy value does (exact, published as `noisy_adaptive.parquet`).

Two estimates are published per cell (and per block), as the `histogram` kind does and for the same reason:
  estimate  the signed least-squares estimate (the Kronecker strategy's, Htree's, or the noisy cells): linear in
            the noise, so every rectangle sum is unbiased and its bootstrap interval holds at its confidence.
            Rectangle sums, `dprelease query --rect` and the replicates are answered from it (cut at zero).
  count     a non-negative value per cell for display (and the heat map): the maximum-likelihood estimate
            consistent with the strategy and >= 0, by the project's ADMM (Lee, Wang & Kifer Algorithm 3; the
            projection onto the strategy's range for kronecker, Htree for the quadtree), or the estimate cut at
            zero (`consistency: none`, and always for identity). Biased upward near zero: not for sums.

The measurement is one pass through dask (`tasks.kinds.counts`): every partition's records are binned into their
row-major cell and counted per cell on the workers; only the per-cell counts reach the driver, where the plan's
exact samplers add the noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from data_contracts import suites
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from dpalgos.plan import Mechanism, Plan
from tasks import strategies
from tasks.kinds.base import Draw, Footprint, Heatmap, ReleaseKind, dense_footprint, noise_footprint
from tasks.kinds.uncertainty import Direct, Product, UncertaintyParams, bootstrap_planned
from tasks.params import ConsistencyBase
from tasks.run import committed_plan

admm = module("dpalgos.admm")
hdmm = module("dpalgos.hdmm")
hierarchy = module("dpalgos.hierarchy")
ag = module("dpalgos.adaptive_grid")
kronecker = module("dpalgos.kronecker")
quadtree = module("dpalgos.quadtree")
counts = module("tasks.kinds.counts")
histogram = module("tasks.kinds.histogram")
replicates = module("tasks.replicates")

#: Axes a grid may have: a map (2) or a small cube (3, e.g. space and hour).
AXES = (2, 3)
#: The default strategy per public workload (docs/explanation/grid.md, measured with
#: tests/benchmarks/spatial_peers.py): the Kronecker product of HDMM's per-axis strategies for rectangles, every
#: cell with the whole budget for single cells.
STRATEGY_FOR_WORKLOAD = {"rectangles": "kronecker", "unit": "identity"}
#: A float strategy's column L1 norms are 1 up to rounding: the plan states this much more (and the draw checks).
SENSITIVITY_MARGIN = 1e-9

NOISY_STRATEGY = "noisy_strategy.parquet"
NOISY_TREE = "noisy_tree.parquet"
NOISY_CELLS = "noisy_cells.parquet"
NOISY_ADAPTIVE = "noisy_adaptive.parquet"
#: The adaptive grid's split of epsilon: the noisy number of points (when `points` is not given), then of the rest
#: the coarse grid's share per workload (AG's alpha: 0.5 for rectangles as in the paper; 0.2 for single cells,
#: whose answers come from the leaves), measured with tests/benchmarks/spatial_peers.py.
POINTS_SHARE = 0.02
COARSE_SHARE = {"rectangles": 0.5, "unit": 0.2}
#: The adaptive grid's Guideline constant c for its coarse side and its dense branch per workload (Qardaji et al.
#: use 10; 14 for rectangles, with HDMM's strategy on the coarse level, measured on both seeds of the corpus).
GUIDELINE_C = {"rectangles": 14.0, "unit": 10.0}
#: The per-axis p-Identity matrix B the Kronecker strategy measured with (public: it depends on `cells` only).
STRATEGY = "strategy.npz"
GRID = "grid.parquet"
LEVELS = "levels.parquet"
#: The grid's public shape, its columns, the strategy and the consistency's diagnostics (read by `query --rect`).
GRID_INFO = "grid.json"
#: The heat map leaves cells below this count blank: a count that rounds to zero is no density.
HEATMAP_FLOOR = 0.5
VALUES = ["count", "estimate"]
#: One bootstrap replicate's cost per measured value and per published value (least squares axis by axis, the
#: pyramid), and per call: the default number of replicates comes from them.
SECONDS_PER_VALUE = 3e-8
SECONDS_PER_CALL = 1e-4
RECTANGLES_PER_EVALUATION = 2000


class GridParams(ConsistencyBase, UncertaintyParams):
    """Counts over `cells` equal-width cells per axis of the public bounds of the dataset's 2 or 3 numeric columns
    (in the order of `bounds`), published as a signed estimate for sums and a non-negative count per cell."""
    kind: Literal["grid"] = Field("grid", description="the release kind")
    cells: int = Field(ge=2, le=4096, description="cells per axis, a power of two (256: a 256 x 256 map); the grid "
                                                   "has cells^d cells for the d columns with bounds (2 or 3)")
    workload: Literal["rectangles", "unit"] = Field(
        "rectangles", description="the queries the release is for (public): axis-aligned rectangles of cells, or "
                                  "single cells; it chooses the default strategy (STRATEGY_FOR_WORKLOAD)")
    strategy: Literal["kronecker", "quadtree", "identity", "adaptive"] | None = Field(
        None, description="what is measured: kronecker (HDMM's per-axis p-Identity strategies, their Kronecker "
                          "product), quadtree (every node of the quadtree), identity (every cell) or adaptive "
                          "(Qardaji et al.'s adaptive grid, 2-D: most accurate on sparse maps, no interval per "
                          "cell). Default: kronecker for rectangles, identity for single cells")
    points: int | None = Field(
        None, ge=1, description="adaptive only: a PUBLIC approximate number of records (e.g. a published subscriber "
                                "or trip total) that sets the coarse grid's side; without it a noisy count with "
                                f"{POINTS_SHARE:g} of epsilon does")
    consistency: Literal["admm", "none"] | None = Field(
        None, description="the non-negative per-cell counts: admm (maximum likelihood consistent with the "
                          "strategy, >= 0; the default for kronecker and quadtree) or none (the signed estimate "
                          "cut at zero). Rectangle sums come from the signed estimate whatever this says")

    @property
    def strategy_used(self) -> str:
        return self.strategy or STRATEGY_FOR_WORKLOAD[self.workload]

    @property
    def consistency_method(self) -> str:
        return "none" if self.strategy_used in ("identity", "adaptive") else (self.consistency or "admm")

    @model_validator(mode="after")
    def _cells_and_consistency(self):
        if self.cells & (self.cells - 1):
            raise ValueError(f"cells ({self.cells}) must be a power of two (the quadtree and the pyramid of levels "
                             f"halve every axis)")
        if self.strategy_used == "kronecker" and self.cells < strategies.SHIPPED[0]:
            raise ValueError(f"the kronecker strategy needs at least {strategies.SHIPPED[0]} cells per axis (HDMM's "
                             f"per-axis strategy degenerates below); use strategy quadtree or identity")
        if self.strategy_used in ("identity", "adaptive") and self.consistency is not None:
            raise ValueError(f"consistency applies to the kronecker and quadtree strategies, not to "
                             f"{self.strategy_used}")
        if self.points is not None and self.strategy_used != "adaptive":
            raise ValueError("points sets the adaptive strategy's coarse grid; the other strategies need no count")
        return self


def axes_of(spec) -> int:
    return len(spec.dataset.bounds)


def shape_of(spec) -> tuple[int, ...]:
    return (spec.release.cells,) * axes_of(spec)


def cells_of(spec) -> int:
    return spec.release.cells ** axes_of(spec)


def entry_of(spec) -> str:
    return {"kronecker": "strategy", "quadtree": "tree", "identity": "cells",
            "adaptive": "leaves"}[spec.release.strategy_used]


def noisy_file(spec) -> str:
    return {"kronecker": NOISY_STRATEGY, "quadtree": NOISY_TREE, "identity": NOISY_CELLS,
            "adaptive": NOISY_ADAPTIVE}[spec.release.strategy_used]


def noisy_index(spec) -> str:
    return {"kronecker": "query", "quadtree": "node", "identity": "cell",
            "adaptive": "node"}[spec.release.strategy_used]


def tree_of(spec):
    return quadtree.quadtree(spec.release.cells, axes_of(spec))


def measured_values(spec) -> int:
    p, d = spec.release, axes_of(spec)
    return {"kronecker": lambda: (p.cells + hdmm.default_rows(p.cells)) ** d, "quadtree": lambda: tree_of(spec).size,
            "identity": lambda: cells_of(spec), "adaptive": lambda: 4 * cells_of(spec) + 1}[p.strategy_used]()


def kronecker_now(cells: int, d: int):
    """The Kronecker strategy for cells per axis (HDMM's p-Identity for all ranges of an axis, on each: shipped,
    cached or optimised now, `tasks.strategies`). Public, data-independent."""
    factor = hdmm.PIdentity.of(strategies.pidentity(cells))
    return kronecker.Kronecker([factor] * d)


def committed_kronecker(measurements: Path, d: int):
    """The Kronecker strategy a release measured with, from its measurements (never recomputed)."""
    with np.load(measurements / STRATEGY) as f:
        return kronecker.Kronecker([hdmm.PIdentity.of(f["B"])] * d)


def kronecker_plan(cells: int, d: int, *, epsilon: float, unit_weight: int = 1) -> Plan:
    """Laplace on every answer of the Kronecker product of HDMM's per-axis p-Identity strategies."""
    rows = (cells + hdmm.default_rows(cells)) ** d
    return Plan((Mechanism(
        "strategy", f"the {rows} answers of the Kronecker product of HDMM's p-Identity strategy for all ranges of "
        f"{cells} cells on each of {d} axes (A = A_1 x ... x A_d, A_k = [I; B] D)", "laplace",
        float(unit_weight) * (1 + SENSITIVITY_MARGIN),
        f"every column of each A_k = [I; B] D has L1 norm (1 + sum_i B_ij) / s_j = 1 (D = diag(1/s), s = 1 + 1'B, "
        f"B >= 0), and a column of A = A_1 x ... x A_d is the Kronecker product of one column of each, whose L1 "
        f"norm is the product of theirs: 1. One privacy unit adds at most {unit_weight} (its capped weight) to one "
        f"cell (values outside the bounds are clipped into the edge cells), moving A x by at most {unit_weight} "
        f"times one column of A in L1; stated {1 + SENSITIVITY_MARGIN:.9f} x that for the rounding of the column "
        f"sums (the draw checks the strategy's computed norms against it)", 1.0 / epsilon, integer=False,
        values=rows),))


def cells_plan(n: int, *, epsilon: float, unit_weight: int = 1) -> Plan:
    """Laplace on every cell (the identity strategy)."""
    return Plan((Mechanism(
        "cells", f"every cell count of the grid of {n} cells", "laplace", float(unit_weight),
        f"one privacy unit falls in one cell (values outside the bounds are clipped into the edge cells) and adds "
        f"at most {unit_weight} (its capped weight) to it: L1 sensitivity {unit_weight}", 1.0 / epsilon,
        integer=True, values=n),))


def adaptive_budgets(spec) -> dict[str, float]:
    """The adaptive grid's epsilon per plan entry: `points` (none when the spec gives a public count), then the rest
    (`dense`) on the whole grid, or split between the coarse grid and the leaves by COARSE_SHARE."""
    p = spec.release
    points = 0.0 if p.points is not None else POINTS_SHARE * p.epsilon
    rest = p.epsilon - points
    share = COARSE_SHARE[p.workload]
    return {"points": points, "dense": rest, "coarse": share * rest, "leaves": rest - share * rest}


def dense_entry(spec) -> str:
    """The plan entry of the adaptive grid's dense branch: the workload's default strategy over every cell."""
    return {"rectangles": "strategy", "unit": "cells"}[spec.release.workload]


def grid_strategy(side: int):
    """The Kronecker product of HDMM's p-Identity strategies for all ranges of `side` cells on both axes (shipped
    from 16 cells; below, the identity, with one zero row per axis: B = 0). Public, data-independent."""
    B = strategies.pidentity(side) if side >= strategies.SHIPPED[0] else np.zeros((1, side))
    return kronecker.Kronecker([hdmm.PIdentity.of(B)] * 2)


def adaptive_plan(spec) -> Plan:
    """The number of points (unless public), then one of two branches chosen from it and public parameters: the
    whole grid (`dense`: the workload's default strategy) or the coarse grid's Kronecker answers and the leaves."""
    unit, cells, budgets = spec.dataset.unit_weight, spec.release.cells, adaptive_budgets(spec)
    part = (f"one privacy unit falls in one {{part}} (values outside the bounds are clipped into the edge cells) and "
            f"adds at most {unit} (its capped weight) to it; the {{part}}s partition the grid and were fixed before "
            f"this draw by public parameters and {{fixed}} (adaptive composition): L1 sensitivity {unit}")
    kron = (f"the Kronecker strategy's columns have L1 norm 1 (kronecker_plan's argument) and one privacy unit adds "
            f"at most {unit} (its capped weight) to one {{part}}, a partition fixed before this draw by {{fixed}}: "
            f"L1 sensitivity {unit}, stated {1 + SENSITIVITY_MARGIN:.9f} x for the rounding of the column sums")
    weight = float(unit) * (1 + SENSITIVITY_MARGIN)
    entries = [Mechanism("coarse", "the Kronecker strategy's answers over the coarse grid's counts (HDMM's p-Identity "
                         "per axis; its side from the number of points and epsilon)", "laplace", weight,
                         kron.format(part="coarse cell", fixed="the number of points"), 1 / budgets["coarse"],
                         branch="adaptive"),
               Mechanism("leaves", "the counts of the leaves cutting each coarse cell by its estimated count",
                         "laplace", float(unit), part.format(part="leaf", fixed="the noisy coarse answers"),
                         1 / budgets["leaves"], integer=True, branch="adaptive")]
    if dense_entry(spec) == "strategy":
        entries.append(Mechanism("strategy", f"the Kronecker strategy's answers over all {cells} x {cells} cells",
                                 "laplace", weight, kron.format(part="cell", fixed="public parameters"),
                                 1 / budgets["dense"], branch="dense"))
    else:
        entries.append(Mechanism("cells", f"every cell count of the grid of {cells ** 2} cells", "laplace", float(unit),
                                 part.format(part="cell", fixed="public parameters"), 1 / budgets["dense"],
                                 integer=True, values=cells ** 2, branch="dense"))
    if budgets["points"] > 0:
        entries.insert(0, Mechanism("points", "the number of records (chooses the branch and sizes the coarse grid)",
                                    "laplace", float(unit), f"one privacy unit adds at most {unit} (its capped "
                                    f"weight) to it: L1 sensitivity {unit}", 1 / budgets["points"], integer=True,
                                    values=1))
    return Plan(tuple(entries))


#: The `level` of each row of noisy_adaptive.parquet.
ADAPTIVE_LEVELS = {"points": 0, "coarse": 1, "leaves": 2, "dense": 3}


@dataclass(frozen=True)
class AdaptiveDraw:
    """The adaptive grid's noisy values: the number of points (noisy, or the public one), the branch drawn, the
    answers over the coarse grid (adaptive) or the whole grid (dense), the leaves and the partition they fixed
    (recomputed from the noisy values), the Kronecker strategy measured (None for single cells' dense branch)."""
    points: float
    noisy_points: bool
    branch: str
    answers: np.ndarray
    strategy: object
    leaves: np.ndarray | None = None
    partition: object = None

    def table(self) -> dict[str, np.ndarray]:
        """One row per noisy value: the points (level 0), the answers (1 coarse or 3 dense), the leaves (2) with
        their parent coarse cell and cell ranges [first, end) per axis (-1 where a row is not a block of cells)."""
        parts = ([("points", np.array([self.points]))] if self.noisy_points else []) + [
            ("coarse" if self.branch == "adaptive" else "dense", self.answers)]
        if self.leaves is not None:
            parts.append(("leaves", self.leaves))
        level = np.concatenate([np.full(v.size, ADAPTIVE_LEVELS[n], np.int8) for n, v in parts])
        out = {"level": level, **{c: np.full(level.size, -1, np.int64)
                                  for c in ("parent", "x_first", "x_end", "y_first", "y_end")}}
        if self.leaves is not None:
            leaf, part = level == 2, self.partition
            for column, values in (("parent", part.parent), ("x_first", part.x_first), ("x_end", part.x_end),
                                   ("y_first", part.y_first), ("y_end", part.y_end)):
                out[column][leaf] = values
        return out | {"noisy_count": np.concatenate([v for _, v in parts]).astype(np.float64)}


def adaptive_layout(spec, strategy, answers: np.ndarray, plan: Plan):
    """The leaves the noisy coarse answers fix (their least squares; the plan's leaves budget): public."""
    coarse = strategy.least_squares(answers).ravel()
    return ag.partition(spec.release.cells, strategy.shape[0], ag.leaf_sides(
        coarse, 1.0 / plan["leaves"].noise_multiplier, spec.dataset.unit_weight))


def _checked(strategy):
    if not strategy.sensitivity() <= 1 + SENSITIVITY_MARGIN:
        raise RuntimeError("the Kronecker strategy's column norms exceed the plan's sensitivity")
    return strategy


def measure_adaptive(spec, grid: np.ndarray, measure) -> AdaptiveDraw:
    """The number of points (public, or drawn), then the dense branch where the guideline's grid is finer than the
    cells, else the coarse grid's Kronecker answers and the leaves their estimate fixes. Every partition and branch
    is chosen from public parameters and values already drawn, before the draw over it."""
    p, plan, unit = spec.release, measure.plan, spec.dataset.unit_weight
    grid, budgets = np.asarray(grid), adaptive_budgets(spec)
    noisy = p.points is None
    points = float(measure("points", np.array([grid.sum()]))[0]) if noisy else float(p.points)
    c = GUIDELINE_C[p.workload]
    if ag.dense(points, budgets["dense"], p.cells, unit, c):
        if dense_entry(spec) == "cells":
            return AdaptiveDraw(points, noisy, "dense", np.asarray(measure("cells", grid.ravel()), float), None)
        strategy = _checked(grid_strategy(p.cells))
        return AdaptiveDraw(points, noisy, "dense", measure("strategy", strategy.answers(grid)), strategy)
    m1 = ag.coarse_side(points, budgets["dense"], p.cells, unit, c)
    strategy = _checked(grid_strategy(m1))
    answers = measure("coarse", strategy.answers(ag.aggregate(grid, ag.coarse_of(p.cells, m1), m1 * m1)))
    part = adaptive_layout(spec, strategy, answers, plan)
    leaves = measure("leaves", ag.aggregate(grid, part.leaf, part.size))
    return AdaptiveDraw(points, noisy, "adaptive", answers, strategy, np.asarray(leaves, np.float64), part)


def read_adaptive(spec, measurements: Path, plan: Plan) -> AdaptiveDraw:
    """The committed adaptive draw: its noisy values, the committed strategy, and the leaves recomputed from the
    noisy coarse answers (checked against the cell ranges written beside them)."""
    table = pq.read_table(measurements / NOISY_ADAPTIVE).to_pandas()
    level, values = table["level"].to_numpy(), table["noisy_count"].to_numpy(np.float64)
    points = float(values[level == 0][0]) if (level == 0).any() else float(spec.release.points)
    strategy = committed_kronecker(measurements, 2) if (measurements / STRATEGY).exists() else None
    if (level == 3).any():
        return AdaptiveDraw(points, (level == 0).any(), "dense", values[level == 3], strategy)
    answers = values[level == 1]
    part = adaptive_layout(spec, strategy, answers, plan)
    draw = AdaptiveDraw(points, (level == 0).any(), "adaptive", answers, strategy, values[level == 2], part)
    if not all(np.array_equal(draw.table()[c], table[c].to_numpy()) for c in ("x_first", "y_first", "parent")):
        raise RuntimeError("the adaptive grid's leaves differ from those its measurements were drawn over")
    return draw


def as_strategy(spec, strategy: str):
    """The spec with another strategy (the adaptive grid's dense branch is estimated as that strategy is)."""
    return spec.model_copy(update={"release": spec.release.model_copy(update={"strategy": strategy,
                                                                              "points": None})})


def adaptive_estimates(spec, draw: AdaptiveDraw, plan: Plan, signed_only: bool = False):
    """(non-negative counts, signed estimate, diagnostics) per cell. Dense: as the workload's default strategy.
    Adaptive: the leaves' generalised least squares over both levels (signed), flattened where even
    (`adaptive_grid.flatten_even`), each shared among its cells by `adaptive_grid.smooth`; counts: that estimate
    cut at zero."""
    if draw.branch == "dense":
        default = as_strategy(spec, STRATEGY_FOR_WORKLOAD[spec.release.workload])
        if signed_only:
            return None, signed_estimate(default, draw.answers, draw.strategy), {}
        count, estimate, info = estimates(default, draw.answers, plan[dense_entry(spec)].scale, draw.strategy)
        return count, estimate, {**info, "branch": "dense: the whole grid by the workload's default strategy"}
    var = {name: 2.0 * plan[name].scale ** 2 for name in ("coarse", "leaves")}
    x = ag.leaves_gls(draw.strategy, draw.answers, var["coarse"], draw.leaves, var["leaves"], draw.partition)
    estimate = ag.smooth(ag.flatten_even(x, draw.partition, var["leaves"]), draw.partition)
    return np.maximum(estimate, 0.0), estimate, {
        "branch": "adaptive", "method": "adaptive grid (Qardaji et al. AG, HDMM's Kronecker strategy on the coarse "
                                        "level): leaves by generalised least squares over both levels, even where "
                                        "their noise explains their spread (dpalgos.adaptive_grid.flatten_even), "
                                        "each shared among its cells as its neighbours lean "
                                        "(dpalgos.adaptive_grid.smooth); counts: the estimate cut at zero",
        "coarse_side": draw.strategy.shape[0], "leaves": draw.partition.size}


def measure_grid(spec, grid: np.ndarray, measure, strategy=None) -> tuple[np.ndarray, dict]:
    """(noisy measurements, meta) of the exact grid of counts by the spec's strategy through `measure` (the plan's
    entries): the DP measurement after the data pass, shared by `draw` and the benchmarks. For the adaptive grid
    the measurements are an `AdaptiveDraw`."""
    p = spec.release
    if p.strategy_used == "adaptive":
        draw = measure_adaptive(spec, grid, measure)
        return draw, {"branch": draw.branch, **({"coarse_side": draw.strategy.shape[0], "leaves": draw.partition.size}
                                                if draw.branch == "adaptive" else {})}
    if p.strategy_used == "identity":
        return measure("cells", np.asarray(grid).ravel()), {}
    if p.strategy_used == "kronecker":
        if not strategy.sensitivity() <= 1 + SENSITIVITY_MARGIN:
            raise RuntimeError("the Kronecker strategy's column norms exceed the plan's sensitivity")
        # Sensitivity 1 (x the unit's weight): every column of A has L1 norm 1 (the plan entry's argument).
        return measure("strategy", strategy.answers(grid)), {"strategy_rows": strategy.rows}
    tree = tree_of(spec)
    leaves = np.asarray(grid, dtype=np.float64).ravel()[quadtree.morton(p.cells, axes_of(spec))]
    return measure("tree", tree.aggregate(leaves)), {"levels": tree.levels, "branching": tree.branching}


def _row_major(spec, morton_leaves: np.ndarray) -> np.ndarray:
    out = np.empty(morton_leaves.size)
    out[quadtree.morton(spec.release.cells, axes_of(spec))] = morton_leaves
    return out.reshape(shape_of(spec))


def signed_estimate(spec, noisy: np.ndarray, strategy=None) -> np.ndarray:
    """The signed least-squares estimate per cell (a grid), linear in the noisy measurements. `strategy`: the
    committed Kronecker strategy (kronecker), the committed plan (adaptive)."""
    p = spec.release
    if p.strategy_used == "adaptive":
        return adaptive_estimates(spec, noisy, strategy, signed_only=True)[1]
    if p.strategy_used == "identity":
        return np.asarray(noisy, dtype=np.float64).reshape(shape_of(spec))
    if p.strategy_used == "kronecker":
        return strategy.least_squares(noisy)
    return _row_major(spec, histogram.signed_leaves(tree_of(spec), noisy))


def estimates(spec, noisy: np.ndarray, scale: float, strategy=None) -> tuple[np.ndarray, np.ndarray, dict]:
    """(non-negative counts, signed estimate, diagnostics), grids of `shape_of(spec)`, from the noisy measurements,
    the committed plan's scale, the committed strategy (kronecker) and the spec's public parameters: what the
    release publishes, and what the benchmarks score."""
    p = spec.release
    if p.strategy_used == "adaptive":
        return adaptive_estimates(spec, noisy, strategy)
    estimate = signed_estimate(spec, noisy, strategy)
    if p.consistency_method == "none":
        return np.maximum(estimate, 0.0), estimate, {"method": f"{p.strategy_used} (least squares; counts: the "
                                                               f"signed estimate with negatives set to 0)"}
    if p.strategy_used == "quadtree":
        leaves, info = histogram.consistent_leaves(tree_of(spec), noisy, "admm", noise_scale=scale,
                                                   penalty=p.penalty, alpha=p.alpha, rho=p.rho)
        return _row_major(spec, leaves), estimate, {**info, "estimate": "htree (least squares, Hay et al.), signed"}
    res = admm.solve_projection(noisy, strategy.project, penalty=p.penalty, alpha=p.alpha, rho=p.rho, scale=scale,
                                x0=strategy.project(noisy))
    count = np.maximum(strategy.least_squares(res.x), 0.0)
    return count, estimate, {
        "method": "admm (Lee, Wang & Kifer Algorithm 3: the measurements projected onto the Kronecker strategy's "
                  "range, >= 0; counts: their least-squares cells)", "penalty": p.penalty, "alpha": p.alpha,
        "rho": p.rho, "iterations": res.iterations, "converged": res.converged,
        "residuals": {k: float(v) for k, v in res.residuals.items()},
        "estimate": "least squares of the Kronecker strategy, signed"}


def rectangle_sums(estimate: np.ndarray, rects: np.ndarray) -> np.ndarray:
    """The published answers to rectangles (m, 4) of cell ranges [x0, x1) x [y0, y1) of a 2-D signed estimate:
    its sums, cut at zero as every count query's answer is (`tasks.replicates.sum_answer`)."""
    cs = np.zeros((estimate.shape[0] + 1, estimate.shape[1] + 1))
    cs[1:, 1:] = np.cumsum(np.cumsum(estimate, axis=0), axis=1)
    x0, x1, y0, y1 = np.asarray(rects, dtype=np.int64).T
    return np.maximum(cs[x1, y1] - cs[x0, y1] - cs[x1, y0] + cs[x0, y0], 0.0)


def _cell_columns(spec) -> dict[str, np.ndarray]:
    """Each cell's index and [lower, upper) on every axis, row-major."""
    cells, out = spec.release.cells, {}
    index = np.indices(shape_of(spec)).reshape(axes_of(spec), -1)
    for k, (column, (lo, hi)) in enumerate(spec.dataset.bounds.items()):
        edges = lo + (hi - lo) * np.arange(cells + 1) / cells
        out |= {f"{column}_cell": index[k].astype(np.int32), f"{column}_lower": edges[index[k]],
                f"{column}_upper": edges[index[k] + 1]}
    return out


def _level_columns(spec) -> dict[str, np.ndarray]:
    """Each pyramid block's level and its cells [first, end) on every axis."""
    made, names = quadtree.pyramid_columns(spec.release.cells, axes_of(spec)), list(spec.dataset.bounds)
    return {"level": made["level"], **{f"{c}_first": made[f"first_{k}"] for k, c in enumerate(names)},
            **{f"{c}_end": made[f"end_{k}"] for k, c in enumerate(names)}}


def picture(count: np.ndarray, bounds: dict, title: str) -> Heatmap:
    """The released per-cell counts as the report's heat map (3-D grids: summed over the last axis), log-scaled,
    placed by the public bounds: released values and public bounds only."""
    shown = count.sum(axis=tuple(range(2, count.ndim))) if count.ndim > 2 else count
    (xc, (x0, x1)), (yc, (y0, y1)) = list(bounds.items())[:2]
    return Heatmap(shown.T, (), (), yc, xc, title, extent=(x0, x1, y0, y1), log_floor=HEATMAP_FLOOR)


class GridKind(ReleaseKind):
    name = "grid"
    Params = GridParams
    shape = "points"
    prepared_stage = "encoded"
    summary = ("counts over a public 2-D (or 3-D) grid of equal-width cells of two numeric columns with bounds: HDMM's "
               "Kronecker strategy (rectangles), a quadtree, every cell (single cells) or an adaptive grid (Qardaji et "
               "al.) for sparse maps; a signed least-squares estimate for rectangle sums and non-negative consistent "
               "counts per cell by ADMM (Lee, Wang & Kifer)")

    def example(self):
        """16 cells per axis: the conformance suite's empirical audit finds a halved Laplace scale on a record's few
        coordinates (HDMM's strategy for 16 cells is the identity); at 32 cells a record moves 9 answers by
        fractions, which its draws cannot resolve. tests/test_grid.py checks the larger strategies' every column."""
        return {"kind": "grid", "cells": 16, "epsilon": 1.0}

    def check_dataset(self, dataset):
        super().check_dataset(dataset)
        if len(dataset.bounds) not in AXES:
            raise ValueError("grid releases need 2 or 3 numeric columns with bounds (the axes of the grid)")

    @cached_property
    def footprint(self):
        """One noisy value per measured row, the estimates and the ADMM over them (about 600 bytes and 20 us per
        row), the published cells and pyramid; the per-axis strategy's optimisation where it is not shipped."""
        spec = self.spec
        p = spec.release
        rows = measured_values(spec)
        fp = (noise_footprint(rows, "laplace", p.strategy_used != "kronecker", f"the {rows:,} noisy measurements")
              + Footprint(600.0 * rows, 2e-5 * rows, f"the consistency of {rows:,} measurements"))
        if p.strategy_used == "kronecker":
            k = hdmm.default_rows(p.cells)
            fp += dense_footprint(4 * k, p.cells, strategies.optimise_seconds(p.cells) * 1e9,
                                  f"HDMM's {k:,} x {p.cells:,} per-axis strategy and its optimisation")
        return fp

    @cached_property
    def plan(self):
        spec = self.spec
        p, unit = spec.release, spec.dataset.unit_weight
        if p.strategy_used == "adaptive":
            if axes_of(spec) != 2:
                raise ValueError("the adaptive strategy is for 2-D grids (two columns with bounds)")
            return adaptive_plan(spec)
        if p.strategy_used == "kronecker":
            return kronecker_plan(p.cells, axes_of(spec), epsilon=p.epsilon, unit_weight=unit)
        if p.strategy_used == "quadtree":
            return hierarchy.tree_plan(tree_of(spec), epsilon=p.epsilon, unit_weight=unit)
        return cells_plan(cells_of(spec), epsilon=p.epsilon, unit_weight=unit)

    def prepare(self, ingested, run, log):
        spec = self.spec
        out = counts.encode_grid(spec, run, ingested, spec.release.cells, log)
        log.info("binned the records into a public grid of %d cells", cells_of(spec))
        return out

    @cached_property
    def prepared_contract(self):
        spec = self.spec
        return suites.encoded("cell", cells_of(spec), "weight" if spec.dataset.weight_column else None)

    def draw(self, prepared, measure, public_rng, log):
        spec = self.spec
        p = spec.release
        strategy = kronecker_now(p.cells, axes_of(spec)) if p.strategy_used == "kronecker" else None  # public
        grid = counts.count(spec, prepared, "cell", cells_of(spec)).reshape(shape_of(spec))
        noisy, meta = measure_grid(spec, grid, measure, strategy)
        meta = {**meta, "cells": p.cells, "axes": axes_of(spec), "strategy": p.strategy_used}
        columns = {}
        if p.strategy_used == "quadtree":
            columns = histogram.node_columns(tree_of(spec))
        elif p.strategy_used == "adaptive":
            strategy, columns = noisy.strategy, noisy.table()  # the Kronecker strategy drawn (None: the cells)
            noisy = columns.pop("noisy_count")

        def write(folder):
            counts.write_vector(folder / noisy_file(spec), noisy_index(spec), {"noisy_count": noisy}, **columns)
            if strategy is not None:
                np.savez_compressed(folder / STRATEGY, B=strategy.factors[0].B)
        return Draw(write=write, meta={**meta, "strategy_seed": strategies.SEED})

    @cached_property
    def measurements_contract(self):
        spec = self.spec
        other = {"quadtree": ["level", "first_bin", "end_bin"],
                 "adaptive": ["level", "parent", "x_first", "x_end", "y_first", "y_end"]}.get(
            spec.release.strategy_used, [])
        return noisy_file(spec), suites.indexed_table("measurements", noisy_index(spec), measured_values(spec),
                                                      ["noisy_count"], other_columns=other,
                                                      at_most=spec.release.strategy_used == "adaptive")

    def _strategy(self, measurements):
        """What the estimates need beside the noisy values: the committed Kronecker strategy, or for the adaptive
        grid the committed plan (its budgets fix the leaves)."""
        spec = self.spec
        if spec.release.strategy_used == "adaptive":
            return committed_plan(measurements)
        return committed_kronecker(measurements, axes_of(spec)) if spec.release.strategy_used == "kronecker" else None

    def _noisy(self, measurements, plan):
        spec = self.spec
        if spec.release.strategy_used == "adaptive":
            return read_adaptive(spec, measurements, plan)
        return counts.read_column(measurements / noisy_file(spec), "noisy_count")

    def postprocess(self, measurements, staging, internal, log):
        spec = self.spec
        p = spec.release
        plan = committed_plan(measurements)
        strategy = self._strategy(measurements)
        noisy = self._noisy(measurements, plan)
        count, estimate, info = estimates(spec, noisy, plan[entry_of(spec)].scale, strategy)
        counts.write_vector(staging / GRID, "cell", {"count": count.ravel(), "estimate": estimate.ravel()},
                            **_cell_columns(spec))
        counts.write_vector(staging / LEVELS, "node", {"count": quadtree.pyramid(count),
                                                       "estimate": quadtree.pyramid(estimate)}, **_level_columns(spec))
        (staging / GRID_INFO).write_text(json.dumps({
            "columns": list(spec.dataset.bounds), "cells": p.cells, "shape": list(shape_of(spec)),
            "bounds": {c: list(b) for c, b in spec.dataset.bounds.items()}, "strategy": p.strategy_used,
            "consistency": info}, indent=2))
        if info.get("branch") == "adaptive":
            log.info("adaptive grid: %d x %d coarse cells, %d leaves", info["coarse_side"], info["coarse_side"],
                     info["leaves"])
        elif p.strategy_used == "adaptive":
            log.info("adaptive grid: dense for its epsilon, every cell measured (%s)", dense_entry(spec))
        return [GRID, LEVELS, GRID_INFO]

    @cached_property
    def release_contract(self):
        spec = self.spec
        intervals = ["estimate", "count"] if bootstrap_planned(self) else []
        return GRID, suites.indexed_table("release", "cell", cells_of(spec), VALUES, nonnegative=["count"],
                                          other_columns=list(_cell_columns(spec)), intervals=intervals)

    def direct_values(self, measurements, plan):
        spec = self.spec
        if spec.release.strategy_used == "adaptive":
            level = counts.read_column(measurements / NOISY_ADAPTIVE, "level")
            entry = {0: "points", 1: "coarse", 2: "leaves", 3: dense_entry(spec)}
            return [Direct(NOISY_ADAPTIVE, "noisy_count", entry[lev], NoiseLaw.of(plan[entry[lev]]), rows=level == lev)
                    for lev in np.unique(level)]
        return [Direct(noisy_file(spec), "noisy_count", entry_of(spec), NoiseLaw.of(plan[entry_of(spec)]))]

    @cached_property
    def bootstraps(self):
        """Not for the adaptive grid: its cells' error is mostly the unevenness inside a leaf, which no replicate
        of the noise sees; an interval there would not hold. Its leaves' noisy counts carry exact ones."""
        return self.spec.release.strategy_used != "adaptive"

    @cached_property
    def unreplicated(self):
        if self.spec.release.strategy_used == "adaptive":
            return ("adaptive grid: a cell's error is mostly the unevenness of its leaf, which no replicate of the "
                    "noise sees, so its cells carry no interval; noisy_adaptive.parquet's noisy values carry exact "
                    "ones")
        return None

    def replicate_seconds(self, measurements=None):
        spec = self.spec
        return SECONDS_PER_CALL + SECONDS_PER_VALUE * (measured_values(spec) + self.replicate_values)

    @cached_property
    def replicate_values(self):
        """The cells and the blocks of their pyramid."""
        spec = self.spec
        return float(cells_of(spec) + quadtree.pyramid_size(spec.release.cells, axes_of(spec)))

    def bootstrap(self, measurements, staging, plan):
        """Around the released signed estimate (`counts.signed_bootstrap`): the measurements it implies are the
        strategy's answers, its quadtree, or itself."""
        spec = self.spec
        estimate = counts.read_column(staging / GRID, "estimate").reshape(shape_of(spec))
        strategy, entry = self._strategy(measurements), entry_of(spec)
        law = NoiseLaw.of(plan[entry])
        implied = {"kronecker": lambda: strategy.answers(estimate),
                   "quadtree": lambda: tree_of(spec).aggregate(
                       estimate.ravel()[quadtree.morton(spec.release.cells, axes_of(spec))]),
                   "identity": lambda: estimate.ravel()}[spec.release.strategy_used]()

        def solve(y):
            cells = signed_estimate(spec, y, strategy)
            return {GRID: cells.reshape(-1, 1), LEVELS: quadtree.pyramid(cells)[:, None]}
        return counts.signed_bootstrap(
            GRID, "cell", entry, law, implied, solve,
            also=(Product(LEVELS, "node", ("estimate",), replicates=False, bounded=(("count", "estimate"),)),),
            notes=("levels.parquet's intervals come from the cells' replicates' block sums",))

    def heatmap(self, release):
        spec = self.spec
        count = counts.read_column(release / GRID, "count").reshape(shape_of(spec))
        return picture(count, spec.dataset.bounds,
                       f"released counts ({spec.release.strategy_used}, epsilon {spec.release.epsilon:g})")

    def evaluate(self, run, prepared, log):
        """Internal: the MSE of the published answers to random rectangles (sums of the signed estimate, cut at
        zero) and of the published per-cell counts (unit queries), against the exact grid."""
        spec = self.spec
        exact = counts.count(spec, prepared, "cell", cells_of(spec)).reshape(shape_of(spec))
        table = replicates.published(run.release, GRID)
        estimate, count = (table.column(c).reshape(shape_of(spec)) for c in ("estimate", "count"))
        flat = lambda g: g.sum(axis=tuple(range(2, g.ndim))) if g.ndim > 2 else g
        rects = random_rectangles(spec.release.cells, RECTANGLES_PER_EVALUATION, np.random.default_rng(0))
        rect = float(np.mean((rectangle_sums(flat(estimate), rects) - rectangle_sums(flat(exact), rects)) ** 2))
        unit = float(np.mean((count - exact) ** 2))
        return {"records": float(exact.sum()), "rectangle_query_mse": rect, "unit_query_mse": unit,
                "strategy": spec.release.strategy_used,
                "headline": f"random-rectangle MSE {rect:.4g}; unit-query MSE {unit:.4g}"}


def random_rectangles(cells: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """(count, 4) rectangles [x0, x1) x [y0, y1) with uniform corners, each side at least one cell."""
    ends = np.sort(rng.integers(0, cells + 1, (count, 2, 2)), axis=2)
    ends[:, :, 1] = np.maximum(ends[:, :, 1], ends[:, :, 0] + 1)
    ends[:, :, 0] = np.minimum(ends[:, :, 0], cells - 1)
    ends[:, :, 1] = np.minimum(ends[:, :, 1], cells)
    return ends.reshape(count, 4)


KIND = GridKind()
