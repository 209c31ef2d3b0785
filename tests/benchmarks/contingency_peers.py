"""Cell MSE of contingency-table estimators against their peers, per (public marginals, epsilon), on the tables
of Lee, Wang & Kifer's Table 2 (Edwards, Czech autoworkers: ../shared/data/contingency).

Ours (post-processing of the same noisy cells, Laplace 1/eps on every cell, with the PUBLIC marginals M_h), each
the `count` column the `contingency` kind publishes under its spec, computed by the kind's own postprocessing
function (`tasks.kinds.contingency.released_table`; `ours`):
    admm_l1          penalty: l1, the maximum-likelihood (true L1) consistent table (Algorithm 2 with the L1 prox)
    admm_elastic     the kind's default (estimator: admm, penalty: elastic, alpha 0.9, rho 2), the elastic net of
                     the paper's experiments (its "ADMM(l1)")
    admm_l2          penalty: l2
    empirical_bayes  estimator: empirical_bayes (the estimator counted below)
Peers:
    lm               the noisy cells, negatives set to 0
    privelet, mwem   as in the paper's figure (MWEM: 10 rounds, the workload of all 1-, 2-way marginals and cells)
    max_entropy      the maximum-entropy table of the public marginals (no budget spent)
    mbi_cells        Private-PGM (`mbi`) fitted to the same noisy cells plus the public marginals (exact)
    mbi_marginals    Private-PGM's own design: Laplace on every marginal of order h+1 (L1 sensitivity C(d, h+1)),
                     a graphical model over those cliques with the public marginals (exact)
    mbi_*_converged  the same two fitted to convergence (--mbi-converged-iters, 20,000 mirror-descent steps):
                     the plain ones stop at 3,000 (MBI_ITERS), where the cells' fit is not converged and acts as a
                     shrinkage toward the maximum-entropy start; converged, mbi_cells is the strong peer at
                     epsilon >= 0.5. Both variants are peers (--mbi-converged-iters 0 leaves the converged out).
mbi runs in its own venv (mbi 2.0.0), created on first use in the benchmarks' cache folder
(tests/benchmarks/_peer_venv.py; --mbi-python names another interpreter, '' leaves mbi out), one process for
all runs, exchanging JSON files. LM and the four tables of ours share each run's noisy cells.
A cell is won when empirical_bayes's mean MSE over the runs is below every peer's; diff_se is the standard error
of its paired (same noisy cells, run by run) difference from the best peer. Last line:
    RESULT wins=<cells won>/<cells> losses_beyond_2se=<cells lost by more than 2 diff_se>
           losses_beyond_2se_over_10pct=<those also lost by more than 10 %> gm_ratio_max=<the largest per table>
           gm_ratio_<table>=<geometric mean over its cells of empirical_bayes's MSE / the best peer's>

    python tests/benchmarks/contingency_peers.py --data ../shared/data/contingency/edwards_mildew.csv --runs 10
    python tests/benchmarks/contingency_peers.py --data loglinear:8:2000:1 loglinear:6:500:2 --runs 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from math import comb
from pathlib import Path

import numpy as np

OURS = ("admm_l1", "admm_elastic", "admm_l2", "empirical_bayes")
PEERS = ("lm", "privelet", "mwem", "max_entropy", "mbi_cells", "mbi_marginals", "mbi_cells_converged",
         "mbi_marginals_converged")
COUNTED = "empirical_bayes"
#: The public marginals enter mbi as measurements this many times tighter than the noisy ones (exact ones would
#: make its loss too ill-conditioned to fit the others); its table is then raked onto them exactly (IPF).
PUBLIC_WEIGHT = 10.0
MBI_ITERS = 3_000


def mbi_worker(jobs_path: str, out_path: str) -> None:
    """In the mbi interpreter: fit every job's measurements, write each job's table (cells in row-major order)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import mbi

    jobs = json.loads(Path(jobs_path).read_text())
    tables = []
    for job in jobs:
        domain = mbi.Domain(tuple(job["attributes"]), tuple(job["shape"]))
        ms = [mbi.LinearMeasurement(np.asarray(m["values"], dtype=float), tuple(m["clique"]), stddev=m["stddev"])
              for m in job["measurements"]]
        model = mbi.estimation.MirrorDescent().estimate(domain, ms, known_total=job["total"],
                                                        iters=int(job.get("iters", MBI_ITERS)))
        tables.append(np.asarray(model.project(tuple(job["attributes"])).datavector(), dtype=float).tolist())
    Path(out_path).write_text(json.dumps(tables))


def loglinear_table(spec: str):
    """A held-out table generated from a log-linear model with known interactions: spec
    `loglinear:D:N:SEED` gives D binary attributes, N records drawn multinomially from
    p(x) ~ exp(sum_j a_j x_j + sum_(j,l) b_jl x_j x_l + c x_0 x_1 x_2), main effects a_j ~ N(-0.5, 1), D pairwise
    interactions b_jl ~ N(0, 1.5) on random pairs, one three-way term c ~ N(0, 1) (so the tables are neither
    independent nor exactly of order 2). Returns (name, Table, counts)."""
    import itertools

    from dpalgos import contingency

    _, d, n, seed = spec.split(":")
    d, n, rng = int(d), int(n), np.random.default_rng(int(seed))
    cells = np.array(list(itertools.product((0, 1), repeat=d)), dtype=float)
    logp = cells @ rng.normal(-0.5, 1.0, d)
    pairs = list(itertools.combinations(range(d), 2))
    for j in rng.choice(len(pairs), size=min(d, len(pairs)), replace=False):
        a, b = pairs[j]
        logp += rng.normal(0.0, 1.5) * cells[:, a] * cells[:, b]
    if d >= 3:
        logp += rng.normal(0.0, 1.0) * cells[:, 0] * cells[:, 1] * cells[:, 2]
    p = np.exp(logp - logp.max())
    x = rng.multinomial(n, p / p.sum()).astype(float)
    table = contingency.Table(tuple(f"a{j}" for j in range(d)), tuple(("0", "1") for _ in range(d)))
    return f"loglinear_d{d}_n{n}_s{seed}", table, x


def marginal_measurements(table, x_cells, order: int, stddev: float, values=None) -> list[dict]:
    """Every marginal of `order` as mbi measurements: the exact ones of x, or the given noisy `values`."""
    import itertools

    tensor = np.asarray(x_cells, dtype=float).reshape(table.shape)
    out, start = [], 0
    for subset in itertools.combinations(range(len(table.names)), order):
        other = tuple(j for j in range(len(table.names)) if j not in subset)
        exact = tensor.sum(axis=other).reshape(-1) if other else tensor.reshape(-1)
        vals = exact if values is None else values[start:start + exact.size]
        start += exact.size
        out.append({"clique": [table.names[j] for j in subset], "values": list(map(float, vals)), "stddev": stddev})
    return out


def rake(table, order: int, estimate: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """An mbi table raked onto the public marginals M_order (the truth's, which are public here)."""
    from dpalgos import contingency

    A = table.constraint_matrix(table.marginals(order))
    return contingency.ipf(A, A @ truth, estimate)


def run_mbi(python: str, jobs: list[dict]) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        jobs_path, out_path = Path(tmp) / "jobs.json", Path(tmp) / "tables.json"
        jobs_path.write_text(json.dumps(jobs))
        subprocess.run([python, __file__, "--mbi-worker", str(jobs_path), str(out_path)], check=True)
        return [np.asarray(t) for t in json.loads(out_path.read_text())]


def ours(table, x, order: int, eps: float, rng, methods=OURS) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One draw of the `contingency` kind's noisy cells (its plan's noise, simulated from `rng`) and, from them,
    the table each of our specs publishes (`count`, by the kind's own postprocessing function; their release
    sections are OURS of tasks/experiments/contingency.py: admm_elastic is the kind's default release)."""
    from tasks.experiments import contingency as E

    marginals = table.marginals(order)
    b = table.constraint_matrix(marginals) @ x
    noisy = E.noisy_cells(E.contingency_spec(table, eps), x, rng)
    return noisy, {m: E.released_count(E.contingency_spec(table, eps, **E.OURS[m]), noisy, marginals, b)
                   for m in methods}


def one_run(table, x, order, eps, rng, mbi_jobs) -> dict[str, np.ndarray]:
    from dpalgos import baselines, contingency
    from tasks.experiments.contingency import MWEM_ROUNDS

    marginals = table.marginals(order)
    A = table.constraint_matrix(marginals)
    b = A @ x
    noisy, out = ours(table, x, order, eps, rng)
    out.update({"lm": np.maximum(noisy, 0.0), "max_entropy": contingency.max_entropy(A, b),
                "privelet": np.maximum(baselines.privelet(x, epsilon=eps, rng=rng), 0.0),
                "mwem": baselines.mwem(x, contingency.mwem_workload(table), epsilon=eps, rounds=MWEM_ROUNDS,
                                       total=float(x.sum()), rng=rng)})
    job = {"attributes": list(table.names), "shape": list(table.shape), "total": float(x.sum())}
    cells = {"clique": list(table.names), "values": list(map(float, noisy)), "stddev": float(np.sqrt(2) / eps)}
    mbi_jobs.append({**job, "measurements": marginal_measurements(table, x, order, cells["stddev"] / PUBLIC_WEIGHT)
                     + [cells], "method": "mbi_cells"})
    if order < len(table.names):
        # One record is in one cell of each of the C(d, h+1) marginals: L1 sensitivity C(d, h+1).
        scale = comb(len(table.names), order + 1) / eps
        exact = np.concatenate([m["values"] for m in marginal_measurements(table, x, order + 1, 1.0)])
        noisy_marginals = exact + rng.laplace(0.0, scale, exact.size)
        stddev = float(np.sqrt(2) * scale)
        mbi_jobs.append({**job, "method": "mbi_marginals", "measurements": marginal_measurements(
            table, x, order, stddev / PUBLIC_WEIGHT)
            + marginal_measurements(table, x, order + 1, stddev, noisy_marginals)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", help="flattened table CSVs (attribute columns, `count`), or "
                    "generated held-out tables loglinear:D:N:SEED (`loglinear_table`)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--eps", default=",".join(f"{0.1 * i:.1f}" for i in range(1, 11)))
    ap.add_argument("--orders", default="0,1,2", help="public marginals M_h")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mbi-python", default=None,
                    help="an interpreter with `mbi` installed (default: the cached venv, created on first use); "
                         "'' to leave mbi out")
    ap.add_argument("--mbi-converged-iters", type=int, default=20_000,
                    help="mirror-descent steps of the converged mbi peers (0: leave them out)")
    ap.add_argument("--runs-csv", help="also write every run's MSE per method here (dataset, known, epsilon, "
                    "method, run, mse): which runs carry a cell's mean")
    ap.add_argument("--mbi-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mbi_worker:
        return mbi_worker(*args.mbi_worker)
    import pandas as pd

    from tasks.experiments.contingency import load_table

    rows, jobs, tables, t0 = [], [], {}, time.perf_counter()
    for path in args.data:
        if path.startswith("loglinear:"):
            name, table, x = loglinear_table(path)
        else:
            name = Path(path).stem
            table, x = load_table(path)
        tables[name] = table
        rng = np.random.default_rng(args.seed)
        for order in map(int, args.orders.split(",")):
            for eps in map(float, args.eps.split(",")):
                for run in range(args.runs):
                    start = len(jobs)
                    for method, est in one_run(table, x, order, eps, rng, jobs).items():
                        rows.append((name, f"M{order}", eps, method, run, float(np.mean((est - x) ** 2))))
                    for job in jobs[start:]:
                        job.update(key=(name, f"M{order}", eps, job["method"], run), order=order,
                                   truth=list(map(float, x)))
    print(f"ours and the in-process peers: {time.perf_counter() - t0:.1f}s")
    if args.mbi_converged_iters:
        jobs += [{**j, "method": j["method"] + "_converged", "iters": args.mbi_converged_iters,
                  "key": (*j["key"][:3], j["method"] + "_converged", j["key"][4])} for j in jobs]
    if args.mbi_python != "":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _peer_venv import interpreter

        python = interpreter("mbi", args.mbi_python)
        t1 = time.perf_counter()
        fits = run_mbi(python, [{k: v for k, v in j.items() if k not in ("key", "truth", "order")} for j in jobs])
        for job, est in zip(jobs, fits):
            est = rake(tables[job["key"][0]], job["order"], np.maximum(est, 0.0), np.asarray(job["truth"]))
            rows.append((*job["key"], float(np.mean((est - np.asarray(job["truth"])) ** 2))))
        print(f"mbi ({len(jobs)} fits): {time.perf_counter() - t1:.1f}s")
    frame = pd.DataFrame(rows, columns=["dataset", "known", "epsilon", "method", "run", "mse"])
    if args.runs_csv:
        frame.to_csv(args.runs_csv, index=False)
    report(frame)


def report(frame) -> None:
    """The mean MSE table, and per cell the paired difference from the best peer over the runs (the runs share
    their noisy cells): a loss more than two standard errors above zero is one the runs' noise does not explain."""
    keys = ["dataset", "known", "epsilon"]
    runs = frame.set_index(keys + ["run", "method"])["mse"].unstack("method")
    means = runs.groupby(level=keys).mean()
    peers = [p for p in PEERS if p in means.columns]
    means = means[[m for m in OURS + PEERS if m in means.columns]]
    best = means[peers].idxmin(axis=1)
    best_of_run = [row[best[key[:3]]] for key, row in runs.iterrows()]  # the cell's best peer, in each run
    grouped = (runs[COUNTED] - best_of_run).groupby(level=keys)
    means["best_peer"] = best
    means["won"] = means[COUNTED] < means[peers].min(axis=1)
    means["diff_se"] = grouped.std(ddof=1) / np.sqrt(grouped.count())
    clear = (~means["won"]) & (means[COUNTED] - means[peers].min(axis=1) > 2 * means["diff_se"])
    means["ratio"] = means[COUNTED] / means[peers].min(axis=1)
    # A loss "by more than 10 %" beyond two standard errors: the bar for a cell.
    means["bad_loss"] = clear & (means["ratio"] > 1.10)
    with __import__("pandas").option_context("display.width", 250, "display.max_rows", 500):
        print(means.to_string(float_format=lambda v: f"{v:.4g}"))
    gm = np.exp(np.log(means["ratio"]).groupby(level="dataset").mean())
    for name, value in gm.items():
        print(f"{name}: geometric mean of {COUNTED}'s MSE over the best peer's {value:.3f}; "
              f"won {int(means.loc[name, 'won'].sum())}/{len(means.loc[name])}")
    print(f"RESULT wins={int(means['won'].sum())}/{len(means)} losses_beyond_2se={int(clear.sum())} "
          f"losses_beyond_2se_over_10pct={int(means['bad_loss'].sum())} "
          f"gm_ratio_max={gm.max():.4g} " + " ".join(f"gm_ratio_{k}={v:.4g}" for k, v in gm.items()))


if __name__ == "__main__":
    sys.exit(main())
