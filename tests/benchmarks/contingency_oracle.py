"""How much any estimator could gain over the zero-budget max-entropy table, per (public marginals, epsilon):
the best linear shrinkage of the noisy residual toward max-entropy, told the truth's distance from it (an oracle).

With d = x - maxent (in the df directions the public marginals leave free) and the Laplace noise's 2/eps^2 per
cell there, maxent + c P(noisy - maxent) has MSE (1 - c)^2 |d|^2 + c^2 df 2/eps^2, lowest at
c = |d|^2 / (|d|^2 + df 2/eps^2), where it gains |d|^4 / (|d|^2 + df 2/eps^2) over max-entropy's |d|^2.
Where that gain is a small fraction of max-entropy's MSE, winning the cell is down to the runs' noise.

    python tests/benchmarks/contingency_oracle.py --data ../shared/data/contingency/edwards_mildew.csv
Prints per cell: RESULT dataset=... known=M<h> eps=... maxent_mse=... oracle_gain_pct=...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="flattened table CSVs (attribute columns, `count`)")
    ap.add_argument("--eps", default=",".join(f"{0.1 * i:.1f}" for i in range(1, 11)))
    ap.add_argument("--orders", default="0,1,2", help="public marginals M_h")
    args = ap.parse_args()
    from dpalgos import contingency
    from tasks.experiments.contingency import load_table

    for path in args.data:
        table, x = load_table(path)
        for order in map(int, args.orders.split(",")):
            A = table.constraint_matrix(table.marginals(order))
            d2 = float(((x - contingency.max_entropy(A, A @ x)) ** 2).sum())
            df = x.size - np.linalg.matrix_rank(A.toarray())
            for eps in map(float, args.eps.split(",")):
                gain = d2 ** 2 / (d2 + df * 2.0 / eps ** 2)
                print(f"RESULT dataset={Path(path).stem} known=M{order} eps={eps:g} maxent_mse={d2 / x.size:.4g} "
                      f"oracle_gain_pct={100 * gain / d2:.3g}")


if __name__ == "__main__":
    main()
