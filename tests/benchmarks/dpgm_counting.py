"""Counting-query relative errors of DPGM synthetic records (Acs et al. §6.3) against MWEM (linear class) and
independent items from DP marginals (any-of class), on a transactions file. 1,000 random queries in 5
length buckets; the same epsilon for every method. Last line:
    RESULT epsilon=<e> dpgm_rel_err=<5 buckets> mwem_rel_err=<...> dpgm_anyof_rel_err=<...>
           independent_anyof_rel_err=<...>
(dpgm_* for the first --model; other models are printed above it.)

    python tests/benchmarks/dpgm_counting.py --data ../shared/data/transactions/BMS1.dat
    python tests/benchmarks/dpgm_counting.py --data ../shared/data/transactions/retail.dat.gz --model vae,rbm
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpalgos import dpgm
from tasks.experiments import dpgm as E


def fmt(values) -> str:
    return ",".join(f"{v:.4g}" for v in values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="transactions file (.dat or .dat.gz)")
    ap.add_argument("--epsilon", type=float, default=1.74, help="total budget (the paper's MNIST figure)")
    ap.add_argument("--delta", type=float, default=None, help="default: 1 / number of records")
    ap.add_argument("--model", default="vae", help="vae, rbm, or a comma-separated list")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--q", type=float, default=0.02, help="Poisson sampling rate of DP-SGD")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the model's)")
    ap.add_argument("--max-items", type=int, default=30,
                    help="DPGM's per-cluster marginals weight records to at most this many items (the baselines "
                         "clip to 12, as the paper configures MWEM)")
    ap.add_argument("--shares", default="0.15,0.35,0.5", help="starting split of epsilon: clustering, marginals, SGD")
    ap.add_argument("--no-match-marginals", action="store_true", help="skip matching the VAE to the DP marginals")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    X = E.load_transactions(args.data)
    print(f"{X.shape[0]} records, {X.shape[1]} items, {X.nnz / X.shape[0]:.2f} items per record "
          f"(loaded in {time.perf_counter() - t0:.1f}s)", flush=True)
    delta = args.delta or 1.0 / X.shape[0]
    results = {}
    for model in args.model.split(","):
        rng = np.random.default_rng(args.seed)
        settings = E.DPGMSettings(epsilon=args.epsilon, delta=delta, k=args.k, max_items=args.max_items,
                                  shares=tuple(float(x) for x in args.shares.split(",")),
                                  match_marginals=not args.no_match_marginals,
                                  sgd=dpgm.SGDConfig(model=model, steps=args.steps, q=args.q, lr=args.lr))
        t0 = time.perf_counter()
        synthetic, guarantee, diag = E.run(X, settings, rng)
        train_s = time.perf_counter() - t0
        ev = E.evaluate(X, synthetic, settings, rng)
        results[model] = (guarantee, ev)
        print(f"{model}: ({guarantee.epsilon:.3f}, {delta:.2g})-DP by {guarantee.method}; trained and sampled in "
              f"{train_s:.1f}s; {synthetic.nnz / synthetic.shape[0]:.2f} items per synthetic record; {diag['plan']}")
        for name, v in ev.items():
            print(f"  {name:18s} {fmt(v)}", flush=True)
    guarantee, ev = results[args.model.split(",")[0]]
    print(f"RESULT epsilon={guarantee.epsilon:.4g} dpgm_rel_err={fmt(ev['dpgm'])} mwem_rel_err={fmt(ev['mwem'])} "
          f"dpgm_anyof_rel_err={fmt(ev['dpgm_anyof'])} independent_anyof_rel_err={fmt(ev['independent_anyof'])}")


if __name__ == "__main__":
    main()
