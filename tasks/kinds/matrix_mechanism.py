"""The `matrix_mechanism` release kind: Laplace answers to a strategy matrix over a histogram, the histogram
reconstructed by L1 (Algorithm 4) or least squares, the workload answered from it."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from tasks.kinds import planning
from tasks.kinds.base import Draw, ReleaseKind, dense_footprint, noise_footprint
from tasks.kinds.uncertainty import Direct, Product, UncertaintyParams, bootstrap_planned, exact
from tasks.params import ConsistencyBase, is_power
from tasks.run import committed_plan

hierarchy = module("dpalgos.hierarchy")
mm = module("dpalgos.matrix_mechanism")
counts = module("tasks.kinds.counts")
replicates = module("tasks.replicates")

class MatrixMechanismParams(ConsistencyBase, UncertaintyParams):
    """Matrix mechanism (Algorithm 4): Laplace answers to a strategy matrix over a histogram of the column,
    the histogram reconstructed by L1 (ADMM) or least squares, then the workload answered from it."""
    kind: Literal["matrix_mechanism"] = Field("matrix_mechanism", description="the release kind")
    bins: int = Field(ge=2, le=2 ** 31 - 1, description="number of equal-width bins of the column's public bounds (the "
                                                          "machine must hold the strategy, the workload and the "
                                                          "reconstruction: the admission estimates them, `footprint`)")
    workload: Literal["identity", "predicate", "all_range", "plus_minus_one"] = Field(
        "all_range", description="the queries answered: identity (every bin), predicate (random 0/1 rows), all_range "
                                 "(every interval of bins), plus_minus_one (random +-1 rows); their answers are in "
                                 "workload_answers.parquet, except all_range's n(n+1)/2, which are sums of "
                                 "estimate.parquet's bins (differences of its prefix sums)")
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
#: Seconds of one L1 reconstruction (measured on 2 shared cores, hierarchical strategy: ADMM 11 ms at 128 bins,
#: 0.47 s at 1,024, about 0.2 us per strategy entry and 10 ms per call) and of one least-squares estimate applied
#: to a replicate (a matrix-vector product with the strategy's pseudo-inverse, or the tree inference): the
#: accuracy planner's simulations and the bootstrap's default B come from them.
SECONDS_PER_L1_ENTRY, SECONDS_PER_L1_CALL = 2.2e-7, 1e-2
SECONDS_PER_LS_ENTRY, SECONDS_PER_LS_CALL = 2e-9, 1e-4
#: Workloads of counting queries (non-negative weights): their answers are sums of counts, cut at zero.
COUNTING = ("identity", "predicate", "all_range")


def workload_of(spec) -> mm.Workload:
    p = spec.release
    return mm.workload(p.workload, p.bins, queries=p.workload_queries, seed=p.workload_seed)


def _workload_rows(p) -> int:
    """The rows of the workload matrix as the kind builds it (all_range: none, its answers are prefix sums)."""
    return {"identity": p.bins, "predicate": p.workload_queries, "plus_minus_one": p.workload_queries,
            "all_range": 0}[p.workload]


def _strategy_rows(p) -> int:
    return {"identity": p.bins, "hierarchical": 2 * p.bins - 1, "workload": _workload_rows(p)}[p.strategy]


def strategy_of(spec):
    return mm.strategy(spec.release.strategy, workload_of(spec))


def least_squares(spec, A=None):
    """The signed least-squares estimate x = A^+ r~ as a function of the noisy answers r~ (linear: every sum of bins
    it answers is unbiased when the sum's weights lie in the row space of the strategy, which they always do for
    the identity and hierarchical strategies); the tree inference for the hierarchical strategy (the projection
    onto consistent binary trees, which least squares on its indicator rows is), one pseudo-inverse otherwise (of the
    strategy A, when built already)."""
    p = spec.release
    if p.strategy == "identity":
        return lambda r: np.asarray(r, dtype=np.float64)
    if p.strategy == "hierarchical":
        tree = hierarchy.Tree(p.bins, 2)
        return lambda r: tree.leaves_of(tree.htree(r))
    pinv = mm.pseudo_inverse(strategy_of(spec) if A is None else A)
    return lambda r: pinv @ r


class MatrixMechanismKind(ReleaseKind):
    name = "matrix_mechanism"
    Params = MatrixMechanismParams
    shape = "values"
    prepared_stage = "encoded"
    summary = ("Laplace answers to a strategy matrix (hierarchical, identity, or the workload); the histogram "
               "reconstructed by L1 (ADMM, Lee, Wang & Kifer Algorithm 4) or least squares; workload answers from "
               "the signed least-squares estimate")

    bootstraps = True

    def example(self):
        return {"kind": "matrix_mechanism", "bins": 16, "workload": "all_range", "epsilon": 1.0}

    @cached_property
    def workload(self) -> mm.Workload:
        return workload_of(self.spec)

    @cached_property
    def strategy(self):
        """The strategy matrix A (public: from the spec's sizes and workload)."""
        return mm.strategy(self.spec.release.strategy, self.workload)

    @cached_property
    def least_squares(self):
        """`least_squares` of the spec: noisy answers -> the signed estimate."""
        return least_squares(self.spec, self.strategy)

    @cached_property
    def footprint(self):
        """The workload matrix (built whole: the identity as a dense n x n), the noisy strategy answers, and the
        estimates: least squares on the dense strategy (its pseudo-inverse) unless the strategy is the identity or
        the tree, and the L1 reconstruction, whose ADMM factorises A'A, dense n x n for every strategy but the
        identity."""
        p = self.spec.release
        n = p.bins
        workload_rows, rows = _workload_rows(p), _strategy_rows(p)
        fp = dense_footprint(workload_rows, n, 2.0 * workload_rows * n,
                             f"the {p.workload} workload matrix ({workload_rows:,} x {n:,})")
        fp += noise_footprint(rows, "laplace", True, f"the {rows:,} noisy strategy answers")
        if p.strategy == "workload":
            fp += dense_footprint(rows, n, 2.0 * rows * n * n,
                                  f"the pseudo-inverse of the dense {rows:,} x {n:,} strategy matrix")
        if p.reconstruction == "l2" or p.strategy == "identity":
            return fp
        return fp + dense_footprint(n, n, n ** 3 / 3.0, f"the factorisation of the {n:,} x {n:,} normal matrix A'A")

    @cached_property
    def plan(self):
        p = self.spec.release
        return mm.strategy_plan(self.strategy, epsilon=p.epsilon, name=p.strategy,
                                unit_weight=self.spec.dataset.unit_weight)

    def prepare(self, ingested, run, log):
        return counts.encode_bins(self.spec, run, ingested, self.spec.release.bins, log)

    @cached_property
    def prepared_contract(self):
        return suites.encoded("bin", self.spec.release.bins, "weight" if self.spec.dataset.weight_column else None)

    def draw(self, prepared, measure, public_rng, log):
        p, A = self.spec.release, self.strategy
        noisy = measure("strategy", A @ counts.count(self.spec, prepared, "bin", p.bins))
        meta = {"bins": p.bins, "strategy": p.strategy, "strategy_queries": int(A.shape[0])}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY, "query", {"noisy_answer": noisy}),
                    meta=meta)

    @cached_property
    def measurements_contract(self):
        return NOISY, suites.indexed_table("measurements", "query", self.strategy.shape[0], ["noisy_answer"])

    def postprocess(self, measurements, staging, internal, log):
        """The histogram twice (the reconstruction's non-negative counts, the signed least-squares estimate),
        then the workload's answers from the estimate (all_range answers are prefix-sum differences of the
        estimate and are not written out)."""
        p = self.spec.release
        noisy = counts.read_column(measurements / NOISY, "noisy_answer")
        estimate = self.least_squares(noisy)
        x, info = self._reconstruct(noisy, committed_plan(measurements)["strategy"].scale, estimate)
        (column, (lo, hi)), = self.spec.dataset.bounds.items()
        edges = lo + (hi - lo) * np.arange(p.bins + 1) / p.bins
        counts.write_vector(staging / ESTIMATE, "bin", {"count": x, "estimate": estimate}, lower=edges[:-1],
                            upper=edges[1:])
        files = [ESTIMATE, RECONSTRUCTION]
        if p.workload != "all_range":
            counts.write_vector(staging / ANSWERS, "query", {"answer": self._answers(estimate)})
            files.append(ANSWERS)
        (staging / RECONSTRUCTION).write_text(json.dumps({**info, "workload": p.workload,
                                                          "workload_queries": self.workload.queries}, indent=2))
        return files

    @cached_property
    def release_contract(self):
        intervals = ["estimate", "count"] if bootstrap_planned(self) else []
        return ESTIMATE, suites.indexed_table("release", "bin", self.spec.release.bins, ["count", "estimate"],
                                              nonnegative=["count"], other_columns=["lower", "upper"],
                                              intervals=intervals)

    def direct_values(self, measurements, plan):
        return [Direct(NOISY, "noisy_answer", "strategy", NoiseLaw.of(plan["strategy"]))]

    @cached_property
    def replicate_values(self):
        """The estimate's bins, and the workload's answers where they are published (not for all_range)."""
        p = self.spec.release
        return float(p.bins + (p.workload_queries if p.workload in ("predicate", "plus_minus_one") else
                               p.bins if p.workload == "identity" else 0))

    def replicate_seconds(self, measurements=None):
        # The strategy's shape from the public sizes (`_strategy_rows`): building it to read its shape cost the
        # admission a dense matrix.
        p = self.spec.release
        return SECONDS_PER_LS_CALL + SECONDS_PER_LS_ENTRY * _strategy_rows(p) * p.bins

    def bootstrap(self, measurements, staging, plan):
        """Around the released signed estimate (`counts.signed_bootstrap`): the strategy's answers on it are the
        noiseless measurement it implies; the workload's answers (not for all_range) follow the estimate's."""
        A, ls = self.strategy, self.least_squares
        estimate = counts.read_column(staging / ESTIMATE, "estimate")
        answered = self.spec.release.workload != "all_range"

        def solve(y):
            x = ls(y)
            return {ESTIMATE: x[:, None], **({ANSWERS: self._answers(x)[:, None]} if answered else {})}
        return counts.signed_bootstrap(
            ESTIMATE, "bin", "strategy", NoiseLaw.of(plan["strategy"]), A @ estimate, solve,
            also=(Product(ANSWERS, "query", ("answer",), replicates=False),) if answered else (),
            notes=("the workload answers' intervals come from the estimate's replicates",))

    def accuracy(self, records=None):
        """A noisy strategy answer (exact); range sums and the workload's queries from the signed least-squares
        estimate (exact); the released per-bin count for counts far from zero: exact for least squares,
        simulated for L1."""
        p = self.spec.release
        A, law = self.strategy, NoiseLaw.of(self.plan["strategy"])
        rows = [exact("noisy strategy answer (measurements)", law, p.confidence)]
        families = planning.range_families(p.bins)
        W = self.workload.matrix if p.workload != "all_range" else None
        pinv_t = np.linalg.pinv(A.toarray() if hasattr(A, "toarray") else np.asarray(A)).T
        sums = planning.linear_rows(lambda q: pinv_t @ q, p.bins, law, families[1:], p.confidence,
                                    "least squares: the signed estimate", W)
        if p.reconstruction == "l1":
            seconds = SECONDS_PER_L1_CALL + SECONDS_PER_L1_ENTRY * A.shape[0] * A.shape[1]
            unit = planning.simulated_rows(lambda y: self._reconstruct(y, law.scale)[0], lambda x: A @ x, p.bins,
                                           law, planning.runs_for(seconds), families[:1], p.confidence)
        else:
            unit = planning.linear_rows(lambda q: pinv_t @ q, p.bins, law, families[:1], p.confidence,
                                        "least squares")
        return rows + unit + sums

    def evaluate(self, run, prepared, log):
        """Internal: the workload MSE of the published answers (from the signed estimate, cut at zero for counting
        queries) and of the reconstruction's counts, and the counts' per-bin MSE."""
        W = self.workload
        exact = counts.count(self.spec, prepared, "bin", self.spec.release.bins)
        table = replicates.published(run.release, ESTIMATE)
        count, estimate = table.column("count"), table.column("estimate")
        published = self._published_mse(estimate, exact)
        counted = W.mse(count, exact)
        return {"records": float(exact.sum()), "workload": self.spec.release.workload, "workload_mse": published,
                "workload_mse_of_counts": counted, "unit_mse_of_counts": float(np.mean((count - exact) ** 2)),
                "headline": f"{self.spec.release.workload} workload MSE {published:.4g} (from the reconstruction's "
                            f"counts: {counted:.4g})"}


    def _published_mse(self, estimate: np.ndarray, exact: np.ndarray) -> float:
        """The workload MSE of the answers as published: W @ estimate, cut at zero for counting queries (all_range:
        every range, from prefix sums)."""
        W = self.workload
        if W.kind != "all_range":
            return float(np.mean((self._answers(estimate) - W.answer(exact)) ** 2))
        lo, hi = np.triu_indices(W.n + 1, 1)
        cs_e, cs_t = (np.concatenate([[0.0], np.cumsum(v)]) for v in (estimate, exact))
        return float(np.mean((replicates.sum_answer(cs_e[hi] - cs_e[lo], True) - (cs_t[hi] - cs_t[lo])) ** 2))

    def _reconstruct(self, noisy: np.ndarray, scale: float,
                     estimate: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """The non-negative histogram from the noisy answers, the committed plan's scale and the spec's public
        parameters: L1 (Algorithm 4), or the least-squares estimate (given, or computed) cut at zero."""
        p = self.spec.release
        if p.reconstruction == "l1":
            res = mm.reconstruct_l1(self.strategy, noisy, noise_scale=scale, penalty=p.penalty, alpha=p.alpha,
                                    rho=p.rho)
            return np.maximum(res.x, 0.0), {"method": "MM(l1): Lee, Wang & Kifer Algorithm 4", "iterations":
                                            res.iterations, "converged": res.converged, "penalty": p.penalty,
                                            "alpha": p.alpha, "rho": p.rho}
        x = self.least_squares(noisy) if estimate is None else estimate
        return np.maximum(x, 0.0), {"method": "MM(l2): least squares, negatives set to 0"}

    def _answers(self, x: np.ndarray) -> np.ndarray:
        """The workload's answers from the signed estimate, as published: counting queries' answers cut at zero."""
        return replicates.sum_answer(self.workload.answer(x), self.spec.release.workload in COUNTING)


KIND = MatrixMechanismKind()
