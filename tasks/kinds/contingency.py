"""The `contingency` release kind: a contingency table consistent with public marginals (Algorithm 2)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from tasks.errors import InputError
from tasks.kinds.base import Draw, Footprint, ReleaseKind, dense_footprint, noise_footprint
from tasks.kinds.uncertainty import (
    Direct,
    Predicted,
    UncertaintyParams,
    bootstrap_planned,
    exact,
)
from tasks.ledger import PrivacyLedger, configured_ledger, public_copy
from tasks.params import ConsistencyBase
from tasks.run import committed_plan

pd = module("pandas")
contingency = module("dpalgos.contingency")
counts = module("tasks.kinds.counts")


class ContingencyParams(ConsistencyBase, UncertaintyParams):
    """Contingency table of the categorical columns (Algorithm 2): Laplace noise on every cell, made
    consistent with PUBLIC marginal counts and non-negative by ADMM or by the empirical-Bayes estimator."""
    kind: Literal["contingency"] = Field("contingency", description="the release kind")
    estimator: Literal["admm", "empirical_bayes"] = Field(
        "admm", description="admm: maximum likelihood (penalty, alpha, rho); empirical_bayes: posterior mean of "
                            "each cell under log-linear priors fitted to the noisy cells and the public marginals, "
                            "averaged by their likelihood, down to the max-entropy table itself (lower cell MSE on "
                            "the paper's tables; post-processing like ADMM)")
    public_marginals: str | None = Field(
        None, description="CSV of public marginal counts: one column per attribute (empty = summed out) and "
                          "`count`; e.g. M0 is one row of empty attributes and the total")
    public_marginals_source: str | None = Field(
        None, description="where the public marginals come from (a census, an earlier DP release...): required "
                          "with public_marginals, recorded in the manifest")

    @model_validator(mode="after")
    def _source_stated(self):
        if self.public_marginals and not (self.public_marginals_source or "").strip():
            raise ValueError("public_marginals need public_marginals_source: say where these counts come from (they "
                             "are released exactly; marginals of the private data itself are not public)")
        return self


NOISY = "noisy_cells.parquet"
TABLE = "table.parquet"
CONSISTENCY = "consistency.json"
#: Seconds of one least-squares estimate per cell (a product with the marginals' pseudo-inverse): the bootstrap's
#: default B comes from it.
SECONDS_PER_LS_CELL = 1e-7


def table_of(spec) -> contingency.Table:
    cats = spec.dataset.categories
    return contingency.Table(tuple(cats), tuple(tuple(v) for v in cats.values()))


def read_public_marginals(path: str | Path, table: contingency.Table, ledger: PrivacyLedger | None = None
                          ) -> tuple[list[dict], np.ndarray]:
    """The public marginals file: one column per attribute (an empty value sums the attribute out) and
    `count`. Returns the marginal cells as {attribute: level} and their counts. Read from a private copy
    checked against the operator's declaration (`public_copy`; `ledger` None: test mode)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            frame = pd.read_csv(public_copy(str(path), Path(tmp), ledger), dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"cannot read the public marginals {path}: {exc}") from None
    unknown = [c for c in frame.columns if c != "count" and c not in table.names]
    if "count" not in frame.columns or unknown:
        raise InputError(f"public marginals {path} need a `count` column and attribute columns only "
                         f"(unknown: {unknown})")
    rows, values = [], []
    for i, rec in frame.iterrows():
        fixed = {c: rec[c] for c in frame.columns if c != "count" and rec[c] != ""}
        for c, lv in fixed.items():
            if lv not in table.levels[table.names.index(c)]:
                raise InputError(f"public marginals {path}, row {i + 2}: {c}={lv!r} is not a public level")
        try:
            value = float(rec["count"])
        except ValueError:
            raise InputError(f"public marginals {path}, row {i + 2}: count {rec['count']!r} is not a number") from None
        if not np.isfinite(value) or value < 0:
            raise InputError(f"public marginals {path}, row {i + 2}: count must be a non-negative number")
        rows.append(fixed)
        values.append(value)
    return rows, np.array(values)


def write_marginals(path: str | Path, table: contingency.Table, marginals: list[dict], values: np.ndarray) -> None:
    """Write marginal cells in the public-marginals format (used to publish known marginals, and by tests)."""
    frame = pd.DataFrame([{c: m.get(c, "") for c in table.names} for m in marginals])
    frame["count"] = values
    frame.to_csv(path, index=False)


def _level_columns(table: contingency.Table) -> dict[str, np.ndarray]:
    cells = table.cell_levels()
    return {name: np.array([c[j] for c in cells]) for j, name in enumerate(table.names)}


class ContingencyKind(ReleaseKind):
    name = "contingency"
    Params = ContingencyParams
    shape = "categories"
    prepared_stage = "encoded"
    summary = ("Laplace on every cell of the table of the categorical columns, made non-negative and consistent "
               "with PUBLIC marginal counts (a CSV) by ADMM (Lee, Wang & Kifer Algorithm 2) or empirical Bayes; sums "
               "of cells from the signed least-squares table consistent with them")
    bootstraps = True

    @cached_property
    def table(self) -> contingency.Table:
        """The table's attributes and levels, in cell order (a kind built on this one may order them its way)."""
        return table_of(self.spec)

    def example(self):
        """The conformance suite's release: the empirical-Bayes estimator (the ADMM one is the default, run by the
        release-kind tests), so that both postprocessing paths are checked."""
        return {"kind": "contingency", "epsilon": 1.0, "estimator": "empirical_bayes"}

    def check_feasible(self):
        """The public marginals are read and checked before anything is charged (a typo must not burn budget)."""
        self.marginals  # raises on a bad file

    @cached_property
    def marginals(self):
        """The public marginals (cells and counts) and their constraint matrix, read and checked once."""
        p, table = self.spec.release, self.table
        ledger = None if self.spec.test_mode else configured_ledger()
        marginals, values = (read_public_marginals(p.public_marginals, table, ledger) if p.public_marginals
                             else ([], np.zeros(0)))
        A = table.constraint_matrix(marginals)
        try:
            contingency.check_marginals(A, values)
        except ValueError as exc:
            raise InputError(f"{p.public_marginals}: {exc}") from None
        return marginals, values, A

    @cached_property
    def footprint(self):
        """A noisy count per cell, then the estimator: ADMM over the cells with the sparse marginal constraints
        (about 300 bytes per cell, up to its 20,000 iterations), or the empirical-Bayes fit, whose log-linear
        candidates hold the constraints of the one- and two-way marginals as dense rows over the cells."""
        sizes = [len(levels) for levels in self.spec.dataset.categories.values()]
        cells = int(np.prod(sizes, dtype=np.float64))
        fp = noise_footprint(cells, "laplace", True, f"the {cells:,} noisy cells")
        if self.spec.release.estimator == "admm":
            return fp + Footprint(300.0 * cells, 5e-5 * cells, f"ADMM over {cells:,} cells")
        rows = min(cells, sum(sizes) + sum(a * b for i, a in enumerate(sizes) for b in sizes[i + 1:]))
        return fp + dense_footprint(rows, cells, float(cells) * rows * rows,
                                    f"the empirical-Bayes candidates' dense {rows:,} x {cells:,} constraints")

    @cached_property
    def plan(self):
        return contingency.cells_plan(self.table, epsilon=self.spec.release.epsilon,
                                      unit_weight=self.spec.dataset.unit_weight)

    def prepare(self, ingested, run, log):
        out = counts.encode_cells(self.spec, run, ingested, log)
        log.info("encoded the rows into the %d cells of the table", self.table.size)
        return out

    @cached_property
    def prepared_contract(self):
        return suites.encoded("cell", self.table.size, "weight" if self.spec.dataset.weight_column else None)

    def draw(self, prepared, measure, public_rng, log):
        table = self.table
        noisy = measure("cells", counts.count(self.spec, prepared, "cell", table.size))
        meta = {"attributes": list(table.names), "levels": [list(lv) for lv in table.levels]}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY, "cell", {"noisy_count": noisy},
                                                             **_level_columns(table)), meta=meta)

    @cached_property
    def measurements_contract(self):
        t = self.table
        return NOISY, suites.indexed_table("measurements", "cell", t.size, ["noisy_count"], other_columns=t.names)

    def postprocess(self, measurements, staging, internal, log):
        """The table twice: the estimator's non-negative cells (`count`) and the signed least-squares table
        consistent with the public marginals (`estimate`, whose sums are unbiased: queries are answered from it)."""
        table = self.table
        noisy = counts.read_column(measurements / NOISY, "noisy_count")
        marginals, values, _A = self.marginals
        released = released_table(self.spec.release, table, noisy, marginals, values,
                                  committed_plan(measurements)["cells"].scale)
        counts.write_vector(staging / TABLE, "cell", {"count": released.count, "estimate": released.estimate},
                            **_level_columns(table))
        (staging / CONSISTENCY).write_text(json.dumps(released.info, indent=2))
        return [TABLE, CONSISTENCY]

    @cached_property
    def release_contract(self):
        t = self.table
        intervals = ["estimate", "count"] if bootstrap_planned(self) else []
        return TABLE, suites.indexed_table("release", "cell", t.size, ["count", "estimate"], nonnegative=["count"],
                                           other_columns=t.names, intervals=intervals)

    def direct_values(self, measurements, plan):
        return [Direct(NOISY, "noisy_count", "cells", NoiseLaw.of(plan["cells"]))]

    @cached_property
    def replicate_values(self):
        return float(self.table.size)  # the table's cells

    def replicate_seconds(self, measurements=None):
        return 1e-4 + SECONDS_PER_LS_CELL * self.table.size

    def bootstrap(self, measurements, staging, plan):
        """Around the released signed estimate (`counts.signed_bootstrap`): a cell's noiseless measurement is its
        estimated cell (consistent with the marginals)."""
        _marginals, values, A = self.marginals
        ls = contingency.least_squares_table(A, values)
        estimate = counts.read_column(staging / TABLE, "estimate")
        return counts.signed_bootstrap(TABLE, "cell", "cells", NoiseLaw.of(plan["cells"]), estimate,
                                       lambda y: {TABLE: ls(y)[:, None]},
                                       notes=("the public marginals are the same in every replicate",))

    def accuracy(self, records=None):
        """A noisy cell (exact); the released cell by ADMM without public marginals is the noisy cell clipped at
        zero, with the same error away from zero. With public marginals or the empirical-Bayes estimator the
        released cell's error depends on the data (shrinkage toward the marginals' table): not predicted, the
        noisy cell's is its reference."""
        p = self.spec.release
        law = NoiseLaw.of(self.plan["cells"])
        rows = [exact("noisy cell (measurements)", law, p.confidence)]
        if p.estimator == "admm" and not p.public_marginals:
            return rows + [exact("released cell", law, p.confidence,
                                 "counts far from zero (the clip at zero only makes the error smaller)")]
        return rows + [Predicted("released cell", None, None, "not predicted: the error depends on the data",
                                 "consistency with public marginals or empirical-Bayes shrinkage; the noisy "
                                 "cell's error is its reference")]

    def evaluate(self, run, prepared, log):
        table = self.table
        exact = counts.count(self.spec, prepared, "cell", table.size)
        released = counts.read_column(run.release / TABLE, "count")
        noisy = np.maximum(counts.read_column(run.release / "measurements" / NOISY, "noisy_count"), 0.0)
        mse, mse_lm = float(np.mean((released - exact) ** 2)), float(np.mean((noisy - exact) ** 2))
        return {"records": float(exact.sum()), "cell_mse": mse, "cell_mse_noisy_clipped": mse_lm,
                "headline": f"cell MSE {mse:.4g} (noisy cells, negatives set to 0: {mse_lm:.4g})"}


@dataclass(frozen=True)
class Released:
    """The released table's columns (table.parquet) and its consistency.json."""
    count: np.ndarray
    estimate: np.ndarray
    info: dict


def released_table(p, table: contingency.Table, noisy: np.ndarray, marginals: list[dict], values: np.ndarray,
                   scale: float) -> Released:
    """The released table from the noisy cells, the public marginals (cells and counts) and the plan's noise scale
    only: `count`, the spec's estimator's non-negative cells (ADMM with its penalty, alpha and rho, or empirical
    Bayes), and `estimate`, the signed least-squares table consistent with the marginals (sums of cells are
    answered from it). `p` is the spec's release section (its defaults are the kind's). The postprocessing and the
    benchmarks both call it."""
    A = table.constraint_matrix(marginals)
    x, info = _estimate(p, table, noisy, marginals, values, A, scale)
    estimate = contingency.least_squares_table(A, values)(noisy)
    info.update({"public_marginal_cells": len(marginals),
                 "max_constraint_violation": float(np.abs(A @ x - values).max()) if len(values) else 0.0,
                 "estimate": "least squares consistent with the public marginals, signed"})
    return Released(x, estimate, info)


def _estimate(p, table, noisy, marginals, values, A, scale) -> tuple[np.ndarray, dict]:
    """The released table from the noisy cells, the public marginals and the plan's noise scale only."""
    if p.estimator == "empirical_bayes":
        est = contingency.empirical_bayes_table(noisy, table, marginals, values, noise_scale=scale)
        return est.x, {"method": "empirical Bayes (posterior means under prior-only, negative-binomial and gamma "
                                 "priors on log-linear models, tilted onto the public marginals, Akaike-weighted)",
                       "weight": est.weight, "aic": est.aic, "dispersion": est.dispersion}
    res = contingency.consistent_table(noisy, A, values, noise_scale=scale, penalty=p.penalty, alpha=p.alpha, rho=p.rho)
    return res.x, {"method": "admm (Lee, Wang & Kifer Algorithm 2)", "penalty": p.penalty, "alpha": p.alpha,
                   "rho": p.rho, "iterations": res.iterations, "converged": res.converged}


KIND = ContingencyKind()
