"""The `matrix_mechanism` release kind: Laplace answers to a strategy matrix over a histogram, the histogram
reconstructed by L1 (Algorithm 4) or least squares, the workload answered from it."""

from __future__ import annotations

import json

import numpy as np

from data_contracts import suites
from dpalgos import accounting
from dpalgos import matrix_mechanism as mm
from tasks.kinds import counts
from tasks.kinds.base import Draw, ReleaseKind

NOISY = "noisy_answers.parquet"
ESTIMATE = "estimate.parquet"
ANSWERS = "workload_answers.parquet"
RECONSTRUCTION = "reconstruction.json"


def workload_of(spec) -> mm.Workload:
    p = spec.release
    return mm.workload(p.workload, p.bins, queries=p.workload_queries, seed=p.workload_seed)


def strategy_of(spec):
    return mm.strategy(spec.release.strategy, workload_of(spec))


class MatrixMechanismKind(ReleaseKind):
    name = "matrix_mechanism"
    prepared_stage = "encoded"

    def prepare(self, spec, ingested, run, log):
        return counts.encode_bins(spec, run, ingested, spec.release.bins, log)

    def prepared_contract(self, spec):
        return suites.encoded("bin", spec.release.bins, "weight" if spec.dataset.weight_column else None)

    def event(self, spec):
        return accounting.laplace_event(sensitivity=mm.sensitivity(strategy_of(spec)), epsilon=spec.release.epsilon)

    def draw(self, spec, prepared, rng, log):
        A = strategy_of(spec)
        noisy = mm.measure(A, counts.count(spec, prepared, "bin", spec.release.bins), epsilon=spec.release.epsilon,
                           rng=rng)
        delta = mm.sensitivity(A)
        log.info("%s strategy: %d queries, sensitivity %g", spec.release.strategy, A.shape[0], delta)
        meta = {"bins": spec.release.bins, "strategy": spec.release.strategy, "strategy_queries": int(A.shape[0]),
                "sensitivity": delta, "noise_scale": delta / spec.release.epsilon, "epsilon": spec.release.epsilon}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY, "query", {"noisy_answer": noisy}),
                    meta=meta)

    def measurements_contract(self, spec):
        return NOISY, suites.indexed_table("measurements", "query", strategy_of(spec).shape[0], ["noisy_answer"])

    def postprocess(self, spec, measurements, staging, internal, log):
        """The histogram estimate from the noisy strategy answers, then the workload's answers (all_range
        answers are prefix-sum differences of the estimate and are not written out)."""
        from tasks.stages import read_meta

        p = spec.release
        A = strategy_of(spec)
        noisy = counts.read_column(measurements / NOISY, "noisy_answer")
        if p.reconstruction == "l1":
            res = mm.reconstruct_l1(A, noisy, noise_scale=read_meta(measurements)["noise_scale"], penalty=p.penalty,
                                    alpha=p.alpha, rho=p.rho)
            x, info = res.x, {"method": "MM(l1): Lee, Wang & Kifer Algorithm 4", "iterations": res.iterations,
                              "converged": res.converged, "penalty": p.penalty, "alpha": p.alpha, "rho": p.rho}
        else:
            x, info = mm.reconstruct_l2(A, noisy), {"method": "MM(l2): least squares"}
        (column, (lo, hi)), = spec.dataset.bounds.items()
        edges = lo + (hi - lo) * np.arange(p.bins + 1) / p.bins
        # Counts are never negative: negative cells of the least-squares estimate are set to 0 (as the paper).
        counts.write_vector(staging / ESTIMATE, "bin", {"count": np.maximum(x, 0.0)}, lower=edges[:-1],
                            upper=edges[1:])
        files = [ESTIMATE, RECONSTRUCTION]
        W = workload_of(spec)
        if p.workload != "all_range":
            answers = W.answer(x)
            if p.workload != "plus_minus_one":  # counting queries: negative answers are replaced by 0
                answers = np.maximum(answers, 0.0)
            counts.write_vector(staging / ANSWERS, "query", {"answer": answers})
            files.append(ANSWERS)
        (staging / RECONSTRUCTION).write_text(json.dumps({**info, "workload": p.workload,
                                                          "workload_queries": W.queries}, indent=2))
        return files

    def release_contract(self, spec):
        return ESTIMATE, suites.indexed_table("release", "bin", spec.release.bins, ["count"], nonnegative=["count"],
                                              other_columns=["lower", "upper"])

    def mechanisms(self, spec):
        A = strategy_of(spec)
        delta = mm.sensitivity(A)
        return [{"mechanism": "Laplace", "query": f"{spec.release.strategy} strategy ({A.shape[0]} linear queries "
                                                  f"over {spec.release.bins} bins)",
                 "l1_sensitivity": delta, "scale": delta / spec.release.epsilon,
                 "epsilon_each": spec.release.epsilon, "repetitions": 1}]

    def evaluate(self, spec, run, prepared, log):
        W = workload_of(spec)
        exact = counts.count(spec, prepared, "bin", spec.release.bins)
        estimate = counts.read_column(run.release / ESTIMATE, "count")
        mse = W.mse(estimate, exact)
        return {"records": float(exact.sum()), "workload": spec.release.workload, "workload_mse": mse,
                "headline": f"{spec.release.workload} workload MSE {mse:.4g}"}


KIND = MatrixMechanismKind()
