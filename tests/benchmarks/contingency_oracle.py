"""How much any estimator could gain over the zero-budget max-entropy table, per (public marginals, epsilon):
the best linear shrinkage of the noisy residual toward max-entropy, told the truth's distance from it (an oracle),
and how often even that oracle wins the cell in a benchmark of --runs runs (contingency_peers.py's criterion:
its mean MSE strictly below max-entropy's).

With d = x - maxent (in the df directions the public marginals leave free, P the projection onto them) and the
Laplace noise's variance v = 2 s^2 per cell (s the cells plan's scale, 1/eps), maxent + c P(noisy - maxent) has
MSE (1 - c)^2 |d|^2 + c^2 df v, lowest at c = |d|^2 / (|d|^2 + df v), where it gains |d|^4 / (|d|^2 + df v) over
max-entropy's |d|^2. Its squared error in one run is (1 - c)^2 |d|^2 + c^2 |P e|^2 - 2 c (1 - c) <d, e>: the
gain is of order c |d|^2, the run-to-run spread of order 2 c |d| sqrt(v), so where |d|^2 is below about
4 v / runs the oracle wins the cell little more often than a coin. The oracle projected (L2) onto the tables
that are nonnegative and keep the public marginals is at least as close to the truth in every run (the truth is
in that convex set, and projection onto it does not increase distances): it adds what nonnegativity and the
upper bounds the marginals put on each cell can tell. Neither bounds every estimator; both are told the truth's
distance from max-entropy, which the noisy cells estimate only to within about sqrt(2 df) v.

    python tests/benchmarks/contingency_oracle.py --data ../shared/data/contingency/edwards_mildew.csv
Prints per cell: RESULT dataset=... known=M<h> eps=... maxent_mse=... oracle_gain_pct=... oracle_win_pct=...
    projected_win_pct=...
then RESULT cells=<cells printed> oracle_wins_all_pct=... projected_wins_all_pct=... (the replicas in which
each won every one of them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.linalg import null_space


def oracle_wins(table, x, A, maxent, eps, runs: int, replicas: int, rng) -> tuple[float, np.ndarray, np.ndarray]:
    """(the oracle's expected gain as a fraction of max-entropy's MSE, per replica whether it won the cell, and
    whether the projected oracle did)."""
    from dpalgos import contingency
    from dpalgos.noise import simulated

    plan = contingency.cells_plan(table, epsilon=eps)
    mechanism = plan.mechanisms[0]
    v = 2.0 * (mechanism.sensitivity * mechanism.noise_multiplier) ** 2
    free = null_space(A.toarray()) if A.shape[0] else np.eye(x.size)
    d2 = float(((x - maxent) ** 2).sum())
    c = d2 / (d2 + free.shape[1] * v)
    b = A @ x
    won = np.empty((2, replicas), dtype=bool)
    for r in range(replicas):
        errors = []
        for _ in range(runs):
            oracle = maxent + c * free @ (free.T @ (simulated(plan, rng)("cells", x) - maxent))
            # The L2 ADMM table of `oracle` is its projection (noise_scale only sets ADMM's stopping rule).
            projected = contingency.consistent_table(oracle, A, b, noise_scale=1.0, penalty="l2").x
            errors.append([float(((t - x) ** 2).sum()) for t in (oracle, projected)])
        won[:, r] = np.mean(errors, axis=0) < d2
    return c, won[0], won[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="flattened table CSVs (attribute columns, `count`)")
    ap.add_argument("--eps", default=",".join(f"{0.1 * i:.1f}" for i in range(1, 11)))
    ap.add_argument("--orders", default="0,1,2", help="public marginals M_h")
    ap.add_argument("--runs", type=int, default=10, help="runs per cell in one benchmark (contingency_peers')")
    ap.add_argument("--replicas", type=int, default=300,
                    help="benchmarks simulated per cell (300: about 7 s per cell here)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from dpalgos import contingency
    from tasks.experiments.contingency import load_table

    rng = np.random.default_rng(args.seed)
    all_won = np.ones((2, args.replicas), dtype=bool)
    cells = 0
    for path in args.data:
        table, x = load_table(path)
        for order in map(int, args.orders.split(",")):
            A = table.constraint_matrix(table.marginals(order))
            maxent = contingency.max_entropy(A, A @ x)
            d2 = float(((x - maxent) ** 2).sum())
            for eps in map(float, args.eps.split(",")):
                gain, won, projected = oracle_wins(table, x, A, maxent, eps, args.runs, args.replicas, rng)
                all_won &= [won, projected]
                cells += 1
                print(f"RESULT dataset={Path(path).stem} known=M{order} eps={eps:g} maxent_mse={d2 / x.size:.4g} "
                      f"oracle_gain_pct={100 * gain:.3g} oracle_win_pct={100 * won.mean():.1f} "
                      f"projected_win_pct={100 * projected.mean():.1f}", flush=True)
    print(f"RESULT cells={cells} oracle_wins_all_pct={100 * all_won[0].mean():.1f} "
          f"projected_wins_all_pct={100 * all_won[1].mean():.1f}")


if __name__ == "__main__":
    main()
