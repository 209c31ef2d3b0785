"""The `grid` release kind: counts over a public 2-D (or 3-D) grid of `cells` equal-width cells per axis over the
public bounds of two (or three) numeric columns: a density map, published per cell and per block of the quadtree
pyramid above the cells, answering rectangle queries (`dprelease query RELEASE --rect x0 x1 y0 y1`).

Measurement (`strategy`, chosen by the public `workload`, one rule for every dataset: STRATEGY_FOR_WORKLOAD):
  kronecker  HDMM's strategy for a product workload (McKenna et al. VLDB 2018 §6): the Kronecker product of the
             p-Identity strategy for all ranges of one axis (`dpalgos.hdmm`, shipped in tasks/strategies/) on every
             axis (`dpalgos.kronecker`), Laplace on each answer: the default for rectangles.
  quadtree   every node of the quadtree over the cells (Cormode et al. ICDE 2012; `dpalgos.quadtree`), Laplace on
             each, as the `histogram` kind's tree.
  identity   every cell with the whole budget: the default for single cells, which no other estimate beats.

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
from tasks.kinds.base import Draw, Footprint, Heatmap, ReleaseKind, dense_footprint, noise_footprint
from tasks.kinds.uncertainty import Direct, Product, UncertaintyParams, bootstrap_planned
from tasks.params import ConsistencyBase
from tasks.run import committed_plan

admm = module("dpalgos.admm")
hdmm = module("dpalgos.hdmm")
hierarchy = module("dpalgos.hierarchy")
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
    strategy: Literal["kronecker", "quadtree", "identity"] | None = Field(
        None, description="what is measured: kronecker (HDMM's per-axis p-Identity strategies, their Kronecker "
                          "product), quadtree (every node of the quadtree) or identity (every cell). Default: "
                          "kronecker for rectangles, identity for single cells")
    consistency: Literal["admm", "none"] | None = Field(
        None, description="the non-negative per-cell counts: admm (maximum likelihood consistent with the "
                          "strategy, >= 0; the default for kronecker and quadtree) or none (the signed estimate "
                          "cut at zero). Rectangle sums come from the signed estimate whatever this says")

    @property
    def strategy_used(self) -> str:
        return self.strategy or STRATEGY_FOR_WORKLOAD[self.workload]

    @property
    def consistency_method(self) -> str:
        return "none" if self.strategy_used == "identity" else (self.consistency or "admm")

    @model_validator(mode="after")
    def _cells_and_consistency(self):
        if self.cells & (self.cells - 1):
            raise ValueError(f"cells ({self.cells}) must be a power of two (the quadtree and the pyramid of levels "
                             f"halve every axis)")
        if self.strategy_used == "kronecker" and self.cells < strategies.SHIPPED[0]:
            raise ValueError(f"the kronecker strategy needs at least {strategies.SHIPPED[0]} cells per axis (HDMM's "
                             f"per-axis strategy degenerates below); use strategy quadtree or identity")
        if self.strategy_used == "identity" and self.consistency is not None:
            raise ValueError("consistency applies to the kronecker and quadtree strategies; the identity strategy's "
                             "counts are its noisy cells cut at zero")
        return self


def axes_of(spec) -> int:
    return len(spec.dataset.bounds)


def shape_of(spec) -> tuple[int, ...]:
    return (spec.release.cells,) * axes_of(spec)


def cells_of(spec) -> int:
    return spec.release.cells ** axes_of(spec)


def entry_of(spec) -> str:
    return {"kronecker": "strategy", "quadtree": "tree", "identity": "cells"}[spec.release.strategy_used]


def noisy_file(spec) -> str:
    return {"kronecker": NOISY_STRATEGY, "quadtree": NOISY_TREE, "identity": NOISY_CELLS}[spec.release.strategy_used]


def noisy_index(spec) -> str:
    return {"kronecker": "query", "quadtree": "node", "identity": "cell"}[spec.release.strategy_used]


def tree_of(spec):
    return quadtree.quadtree(spec.release.cells, axes_of(spec))


def measured_values(spec) -> int:
    p, d = spec.release, axes_of(spec)
    return {"kronecker": lambda: (p.cells + hdmm.default_rows(p.cells)) ** d, "quadtree": lambda: tree_of(spec).size,
            "identity": lambda: cells_of(spec)}[p.strategy_used]()


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


def measure_grid(spec, grid: np.ndarray, measure, strategy=None) -> tuple[np.ndarray, dict]:
    """(noisy measurements, meta) of the exact grid of counts by the spec's strategy through `measure` (the plan's
    entries): the DP measurement after the data pass, shared by `draw` and the benchmarks."""
    p = spec.release
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
    """The signed least-squares estimate per cell (a grid), linear in the noisy measurements."""
    p = spec.release
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
               "Kronecker strategy (rectangles), a quadtree or every cell (single cells); a signed least-squares "
               "estimate for rectangle sums and non-negative consistent counts per cell by ADMM (Lee, Wang & Kifer)")
    bootstraps = True

    def example(self):
        """16 cells per axis: the conformance suite's empirical audit finds a halved Laplace scale on a record's few
        coordinates (HDMM's strategy for 16 cells is the identity); at 32 cells a record moves 9 answers by
        fractions, which its draws cannot resolve. tests/test_grid.py checks the larger strategies' every column."""
        return {"kind": "grid", "cells": 16, "epsilon": 1.0}

    @cached_property
    def axes(self) -> int:
        return axes_of(self.spec)

    @cached_property
    def cells(self) -> int:
        return cells_of(self.spec)

    @cached_property
    def grid_shape(self) -> tuple[int, ...]:
        return shape_of(self.spec)

    @cached_property
    def tree(self):
        return tree_of(self.spec)

    @cached_property
    def entry(self) -> str:
        return entry_of(self.spec)

    def check_dataset(self, dataset):
        super().check_dataset(dataset)
        if len(dataset.bounds) not in AXES:
            raise ValueError("grid releases need 2 or 3 numeric columns with bounds (the axes of the grid)")

    @cached_property
    def footprint(self):
        """One noisy value per measured row, the estimates and the ADMM over them (about 600 bytes and 20 us per
        row), the published cells and pyramid; the per-axis strategy's optimisation where it is not shipped."""
        p = self.spec.release
        rows = measured_values(self.spec)
        fp = (noise_footprint(rows, "laplace", p.strategy_used != "kronecker", f"the {rows:,} noisy measurements")
              + Footprint(600.0 * rows, 2e-5 * rows, f"the consistency of {rows:,} measurements"))
        if p.strategy_used == "kronecker":
            k = hdmm.default_rows(p.cells)
            fp += dense_footprint(4 * k, p.cells, strategies.optimise_seconds(p.cells) * 1e9,
                                  f"HDMM's {k:,} x {p.cells:,} per-axis strategy and its optimisation")
        return fp

    @cached_property
    def plan(self):
        p, unit = self.spec.release, self.spec.dataset.unit_weight
        if p.strategy_used == "kronecker":
            return kronecker_plan(p.cells, self.axes, epsilon=p.epsilon, unit_weight=unit)
        if p.strategy_used == "quadtree":
            return hierarchy.tree_plan(self.tree, epsilon=p.epsilon, unit_weight=unit)
        return cells_plan(self.cells, epsilon=p.epsilon, unit_weight=unit)

    def prepare(self, ingested, run, log):
        out = counts.encode_grid(self.spec, run, ingested, self.spec.release.cells, log)
        log.info("binned the records into a public grid of %d cells", self.cells)
        return out

    @cached_property
    def prepared_contract(self):
        return suites.encoded("cell", self.cells, "weight" if self.spec.dataset.weight_column else None)

    def draw(self, prepared, measure, public_rng, log):
        p = self.spec.release
        strategy = kronecker_now(p.cells, self.axes) if p.strategy_used == "kronecker" else None  # public
        grid = counts.count(self.spec, prepared, "cell", self.cells).reshape(self.grid_shape)
        noisy, meta = measure_grid(self.spec, grid, measure, strategy)
        meta = {**meta, "cells": p.cells, "axes": self.axes, "strategy": p.strategy_used}

        def write(folder):
            extra = histogram.node_columns(self.tree) if p.strategy_used == "quadtree" else {}
            counts.write_vector(folder / noisy_file(self.spec), noisy_index(self.spec), {"noisy_count": noisy}, **extra)
            if strategy is not None:
                np.savez_compressed(folder / STRATEGY, B=strategy.factors[0].B)
        return Draw(write=write, meta={**meta, "strategy_seed": strategies.SEED})

    @cached_property
    def measurements_contract(self):
        spec = self.spec
        other = ["level", "first_bin", "end_bin"] if spec.release.strategy_used == "quadtree" else []
        return noisy_file(spec), suites.indexed_table("measurements", noisy_index(spec), measured_values(spec),
                                                      ["noisy_count"], other_columns=other)

    def _strategy(self, measurements):
        return committed_kronecker(measurements, self.axes) if self.spec.release.strategy_used == "kronecker" else None

    def postprocess(self, measurements, staging, internal, log):
        spec, p = self.spec, self.spec.release
        noisy = counts.read_column(measurements / noisy_file(spec), "noisy_count")
        scale = committed_plan(measurements)[self.entry].scale
        count, estimate, info = estimates(spec, noisy, scale, self._strategy(measurements))
        counts.write_vector(staging / GRID, "cell", {"count": count.ravel(), "estimate": estimate.ravel()},
                            **_cell_columns(spec))
        counts.write_vector(staging / LEVELS, "node", {"count": quadtree.pyramid(count),
                                                       "estimate": quadtree.pyramid(estimate)}, **_level_columns(spec))
        (staging / GRID_INFO).write_text(json.dumps({
            "columns": list(spec.dataset.bounds), "cells": p.cells, "shape": list(self.grid_shape),
            "bounds": {c: list(b) for c, b in spec.dataset.bounds.items()}, "strategy": p.strategy_used,
            "consistency": info}, indent=2))
        return [GRID, LEVELS, GRID_INFO]

    @cached_property
    def release_contract(self):
        intervals = ["estimate", "count"] if bootstrap_planned(self) else []
        return GRID, suites.indexed_table("release", "cell", self.cells, VALUES, nonnegative=["count"],
                                          other_columns=list(_cell_columns(self.spec)), intervals=intervals)

    def direct_values(self, measurements, plan):
        return [Direct(noisy_file(self.spec), "noisy_count", self.entry, NoiseLaw.of(plan[self.entry]))]

    def replicate_seconds(self, measurements=None):
        return SECONDS_PER_CALL + SECONDS_PER_VALUE * (measured_values(self.spec) + self.replicate_values)

    @cached_property
    def replicate_values(self):
        """The cells and the blocks of their pyramid."""
        return float(self.cells + quadtree.pyramid_size(self.spec.release.cells, self.axes))

    def bootstrap(self, measurements, staging, plan):
        """Around the released signed estimate (`counts.signed_bootstrap`): the measurements it implies are the
        strategy's answers, its quadtree, or itself."""
        estimate = counts.read_column(staging / GRID, "estimate").reshape(self.grid_shape)
        strategy, entry = self._strategy(measurements), self.entry
        law = NoiseLaw.of(plan[entry])
        implied = {"kronecker": lambda: strategy.answers(estimate),
                   "quadtree": lambda: self.tree.aggregate(
                       estimate.ravel()[quadtree.morton(self.spec.release.cells, self.axes)]),
                   "identity": lambda: estimate.ravel()}[self.spec.release.strategy_used]()

        def solve(y):
            cells = signed_estimate(self.spec, y, strategy)
            return {GRID: cells.reshape(-1, 1), LEVELS: quadtree.pyramid(cells)[:, None]}
        return counts.signed_bootstrap(
            GRID, "cell", entry, law, implied, solve,
            also=(Product(LEVELS, "node", ("estimate",), replicates=False, bounded=(("count", "estimate"),)),),
            notes=("levels.parquet's intervals come from the cells' replicates' block sums",))

    def heatmap(self, release):
        count = counts.read_column(release / GRID, "count").reshape(self.grid_shape)
        return picture(count, self.spec.dataset.bounds,
                       f"released counts ({self.spec.release.strategy_used}, epsilon {self.spec.release.epsilon:g})")

    def evaluate(self, run, prepared, log):
        """Internal: the MSE of the published answers to random rectangles (sums of the signed estimate, cut at
        zero) and of the published per-cell counts (unit queries), against the exact grid."""
        exact = counts.count(self.spec, prepared, "cell", self.cells).reshape(self.grid_shape)
        table = replicates.published(run.release, GRID)
        estimate, count = (table.column(c).reshape(self.grid_shape) for c in ("estimate", "count"))
        flat = lambda g: g.sum(axis=tuple(range(2, g.ndim))) if g.ndim > 2 else g
        rects = random_rectangles(self.spec.release.cells, RECTANGLES_PER_EVALUATION, np.random.default_rng(0))
        rect = float(np.mean((rectangle_sums(flat(estimate), rects) - rectangle_sums(flat(exact), rects)) ** 2))
        unit = float(np.mean((count - exact) ** 2))
        return {"records": float(exact.sum()), "rectangle_query_mse": rect, "unit_query_mse": unit,
                "strategy": self.spec.release.strategy_used,
                "headline": f"random-rectangle MSE {rect:.4g}; unit-query MSE {unit:.4g}"}


def random_rectangles(cells: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """(count, 4) rectangles [x0, x1) x [y0, y1) with uniform corners, each side at least one cell."""
    ends = np.sort(rng.integers(0, cells + 1, (count, 2, 2)), axis=2)
    ends[:, :, 1] = np.maximum(ends[:, :, 1], ends[:, :, 0] + 1)
    ends[:, :, 0] = np.minimum(ends[:, :, 0], cells - 1)
    ends[:, :, 1] = np.minimum(ends[:, :, 1], cells)
    return ends.reshape(count, 4)


KIND = GridKind()
