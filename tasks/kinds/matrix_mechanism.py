"""The `matrix_mechanism` release kind: Laplace answers to a strategy matrix over a histogram, the histogram
reconstructed by L1 (Algorithm 4) or least squares, the workload answered from it."""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from tasks.kinds import planning
from tasks.kinds.base import Draw, ReleaseKind, dense_footprint, noise_footprint
from tasks.kinds.uncertainty import Bootstrap, Center, Direct, Product, UncertaintyParams, bootstrap_planned, exact
from tasks.params import ConsistencyBase, is_power
from tasks.run import committed_plan

mm = module("dpalgos.matrix_mechanism")
counts = module("tasks.kinds.counts")

class MatrixMechanismParams(ConsistencyBase, UncertaintyParams):
    """Matrix mechanism (Algorithm 4): Laplace answers to a strategy matrix over a histogram of the column,
    the histogram reconstructed by L1 (ADMM) or least squares, then the workload answered from it."""
    kind: Literal["matrix_mechanism"] = Field("matrix_mechanism", description="the release kind")
    bins: int = Field(ge=2, le=2 ** 31 - 1, description="number of equal-width bins of the column's public bounds (the "
                                                          "machine must hold the strategy, the workload and the "
                                                          "reconstruction: the admission estimates them, `footprint`)")
    workload: Literal["identity", "predicate", "all_range", "plus_minus_one"] = Field(
        "all_range", description="the queries answered: identity (every bin), predicate (random 0/1 rows), all_range "
                                 "(every interval of bins), plus_minus_one (random +-1 rows)")
    workload_queries: int = Field(512, ge=1, description="queries of the random workloads")
    workload_seed: int = Field(0, description="PUBLIC seed of the random workloads")
    strategy: Literal["identity", "hierarchical", "workload"] = Field(
        "hierarchical", description="the queries measured with noise: every bin, a binary tree of ranges, or the "
                                    "workload itself")
    reconstruction: Literal["l1", "l2"] = Field(
        "l1", description="the histogram from the noisy answers: l1 (ADMM, Algorithm 4) or l2 (least squares)")

    @model_validator(mode="after")
    def _bins_power_of_two(self):
        if self.strategy == "hierarchical" and not is_power(self.bins, 2):
            raise ValueError(f"bins ({self.bins}) must be a power of 2 for the hierarchical strategy")
        if self.strategy == "workload" and self.workload == "all_range":
            raise ValueError("the all_range workload is kept implicit (its n(n+1)/2 rows): use the hierarchical or "
                             "identity strategy with it")
        return self



NOISY = "noisy_answers.parquet"
ESTIMATE = "estimate.parquet"
ANSWERS = "workload_answers.parquet"
RECONSTRUCTION = "reconstruction.json"
#: Seconds of one reconstruction (measured on 2 shared cores, hierarchical strategy: L1 by ADMM 11 ms at 128
#: bins, 0.47 s at 1,024, about 0.2 us per strategy entry and 10 ms per call; least squares by a dense SVD): the
#: bootstrap's default B comes from them.
SECONDS_PER_ENTRY = {"l1": 2.2e-7, "l2": 2e-8}
SECONDS_PER_CALL = 1e-2


def workload_of(spec) -> mm.Workload:
    p = spec.release
    return mm.workload(p.workload, p.bins, queries=p.workload_queries, seed=p.workload_seed)


def strategy_of(spec):
    return mm.strategy(spec.release.strategy, workload_of(spec))


class MatrixMechanismKind(ReleaseKind):
    name = "matrix_mechanism"
    Params = MatrixMechanismParams
    shape = "values"
    prepared_stage = "encoded"
    summary = ("Laplace answers to a strategy matrix (hierarchical, identity, or the workload); the histogram "
               "reconstructed by L1 (ADMM, Lee, Wang & Kifer Algorithm 4) or least squares; workload answers")

    def example(self):
        return {"kind": "matrix_mechanism", "bins": 16, "workload": "all_range", "epsilon": 1.0}

    def footprint(self, spec):
        """The workload matrix (built whole: the identity as a dense n x n), the noisy strategy answers, and the
        reconstruction: least squares on the dense strategy, or ADMM's factorisation of A'A, which fills in to a
        dense n x n for every strategy but the identity."""
        p = spec.release
        n, q = p.bins, p.workload_queries
        workload_rows = {"identity": n, "predicate": q, "plus_minus_one": q, "all_range": 0}[p.workload]
        rows = {"identity": n, "hierarchical": 2 * n - 1, "workload": workload_rows}[p.strategy]
        fp = dense_footprint(workload_rows, n, 2.0 * workload_rows * n,
                             f"the {p.workload} workload matrix ({workload_rows:,} x {n:,})")
        fp += noise_footprint(rows, "laplace", True, f"the {rows:,} noisy strategy answers")
        if p.reconstruction == "l2":
            return fp + dense_footprint(rows, n, 2.0 * rows * n * n,
                                        f"least squares on the dense {rows:,} x {n:,} strategy matrix")
        if p.strategy == "identity":
            return fp
        return fp + dense_footprint(n, n, n ** 3 / 3.0, f"the factorisation of the {n:,} x {n:,} normal matrix A'A")

    def plan(self, spec):
        return mm.strategy_plan(strategy_of(spec), epsilon=spec.release.epsilon, name=spec.release.strategy,
                                unit_weight=spec.dataset.unit_weight)

    def prepare(self, spec, ingested, run, log):
        return counts.encode_bins(spec, run, ingested, spec.release.bins, log)

    def prepared_contract(self, spec):
        return suites.encoded("bin", spec.release.bins, "weight" if spec.dataset.weight_column else None)

    def draw(self, spec, prepared, measure, public_rng, log):
        A = strategy_of(spec)
        noisy = measure("strategy", A @ counts.count(spec, prepared, "bin", spec.release.bins))
        meta = {"bins": spec.release.bins, "strategy": spec.release.strategy, "strategy_queries": int(A.shape[0])}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY, "query", {"noisy_answer": noisy}),
                    meta=meta)

    def measurements_contract(self, spec):
        return NOISY, suites.indexed_table("measurements", "query", strategy_of(spec).shape[0], ["noisy_answer"])

    def postprocess(self, spec, measurements, staging, internal, log):
        """The histogram estimate from the noisy strategy answers, then the workload's answers (all_range
        answers are prefix-sum differences of the estimate and are not written out)."""
        p = spec.release
        noisy = counts.read_column(measurements / NOISY, "noisy_answer")
        x, info = _reconstruct(spec, noisy, committed_plan(measurements)["strategy"].scale)
        (column, (lo, hi)), = spec.dataset.bounds.items()
        edges = lo + (hi - lo) * np.arange(p.bins + 1) / p.bins
        # Counts are never negative: negative cells of the least-squares estimate are set to 0 (as the paper).
        counts.write_vector(staging / ESTIMATE, "bin", {"count": np.maximum(x, 0.0)}, lower=edges[:-1],
                            upper=edges[1:])
        files = [ESTIMATE, RECONSTRUCTION]
        if p.workload != "all_range":
            counts.write_vector(staging / ANSWERS, "query", {"answer": _answers(spec, x)})
            files.append(ANSWERS)
        (staging / RECONSTRUCTION).write_text(json.dumps({**info, "workload": p.workload,
                                                          "workload_queries": workload_of(spec).queries}, indent=2))
        return files

    def release_contract(self, spec):
        return ESTIMATE, suites.indexed_table("release", "bin", spec.release.bins, ["count"], nonnegative=["count"],
                                              other_columns=["lower", "upper"],
                                              intervals=["count"] if bootstrap_planned(self, spec) else [])

    def direct_values(self, spec, measurements, plan):
        return [Direct(NOISY, "noisy_answer", "strategy", NoiseLaw.of(plan["strategy"]))]

    def bootstraps(self, spec):
        return True

    def replicate_seconds(self, spec, measurements=None):
        A = strategy_of(spec)
        return SECONDS_PER_CALL + SECONDS_PER_ENTRY[spec.release.reconstruction] * A.shape[0] * A.shape[1]

    def bootstrap(self, spec, measurements, staging, plan):
        """Around the released estimate: the strategy's answers on it are the noiseless measurement it implies."""
        A, scale = strategy_of(spec), plan["strategy"].scale
        released = counts.read_column(staging / ESTIMATE, "count")
        answered = spec.release.workload != "all_range"

        def rerun(noisy, rng):
            x = _reconstruct(spec, noisy["strategy"], scale)[0]
            out = {ESTIMATE: np.maximum(x, 0.0)[:, None]}
            return {**out, ANSWERS: _answers(spec, x)[:, None]} if answered else out
        products = (Product(ESTIMATE, "bin", ("count",)),) + \
            ((Product(ANSWERS, "query", ("answer",), replicates=False),) if answered else ())
        return Bootstrap(products=products, centers=(Center("strategy", A @ released, NoiseLaw.of(plan["strategy"])),),
                         rerun=rerun, notes=("the workload answers' intervals come from the estimate's replicates",))

    def accuracy(self, spec, records=None):
        """A noisy strategy answer (exact); the released bin, range sums of several lengths and the workload's
        queries, for counts far from zero: exact for least squares, simulated for L1 (ADMM)."""
        p = spec.release
        A, law = strategy_of(spec), NoiseLaw.of(self.plan(spec)["strategy"])
        rows = [exact("noisy strategy answer (measurements)", law, p.confidence)]
        families = planning.range_families(p.bins)
        W = workload_of(spec).matrix if p.workload != "all_range" else None
        if p.reconstruction == "l1":
            return rows + planning.simulated_rows(lambda y: _reconstruct(spec, y, law.scale)[0], lambda x: A @ x,
                                                  p.bins, law, planning.runs_for(self.replicate_seconds(spec)),
                                                  families, p.confidence, W)
        pinv_t = np.linalg.pinv(A.toarray() if hasattr(A, "toarray") else np.asarray(A)).T
        return rows + planning.linear_rows(lambda q: pinv_t @ q, p.bins, law, families, p.confidence,
                                           "least squares", W)

    def evaluate(self, spec, run, prepared, log):
        W = workload_of(spec)
        exact = counts.count(spec, prepared, "bin", spec.release.bins)
        estimate = counts.read_column(run.release / ESTIMATE, "count")
        mse = W.mse(estimate, exact)
        return {"records": float(exact.sum()), "workload": spec.release.workload, "workload_mse": mse,
                "headline": f"{spec.release.workload} workload MSE {mse:.4g}"}


def _reconstruct(spec, noisy: np.ndarray, scale: float) -> tuple[np.ndarray, dict]:
    """The histogram estimate (before the clip at zero) from the noisy answers, the committed plan's scale and
    the spec's public parameters."""
    p = spec.release
    A = strategy_of(spec)
    if p.reconstruction == "l1":
        res = mm.reconstruct_l1(A, noisy, noise_scale=scale, penalty=p.penalty, alpha=p.alpha, rho=p.rho)
        return res.x, {"method": "MM(l1): Lee, Wang & Kifer Algorithm 4", "iterations": res.iterations,
                       "converged": res.converged, "penalty": p.penalty, "alpha": p.alpha, "rho": p.rho}
    return mm.reconstruct_l2(A, noisy), {"method": "MM(l2): least squares"}


def _answers(spec, x: np.ndarray) -> np.ndarray:
    """The workload's answers from the estimate; counting queries' negative answers are replaced by 0."""
    answers = workload_of(spec).answer(x)
    return answers if spec.release.workload == "plus_minus_one" else np.maximum(answers, 0.0)


KIND = MatrixMechanismKind()
