"""Where DPGM keeps or loses its any-of advantage over independent items: the `synthetic` kind's release (as
tests/benchmarks/dpgm_counting.py scores it) with one design choice changed at a time, paired over seeds with
the independent-items baseline of the same (epsilon, delta) (`tasks.experiments.dpgm.independent`) on the same
queries. Variants (each a change from the release's defaults):

    default            the release's defaults
    many=A             weight A of the row of all records for many items (`dpgm.TOTAL_WEIGHT_MANY`)
    weight=A           weight A of the present/absent rows for few items (`dpgm.TOTAL_WEIGHT`)
    k=K                K clusters
    shares=C,M,S       the split of epsilon: clustering, marginals, SGD
    max_items=N        the per-record clip of the marginals and the last length bin
    steps=T            DP-SGD steps
    iterations=T       DP kernel k-means iterations
    reseed=R           re-seed a centre whose noise norm is above R C_s (`kernel_kmeans.RESEED_NOISE`; inf: never)
    (changes joined by "+": k=8+many=2)

    python tests/benchmarks/dpgm_ablation.py --data ../shared/data/transactions/BMS1.dat --runs 3 \\
        --variants default,many=5,k=2

Per variant a line `RESULT ablation data=... items=... variant=... dpgm_linear=... dpgm_anyof=...
indep_linear=... indep_anyof=... anyof_diff=... anyof_se=... runs=R` (diff = DPGM - independent, paired).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpalgos import counting, dpgm
from dpalgos import kernel_kmeans as kk
from tasks.experiments import dpgm as E


def settings_of(variant: str, base: E.DPGMSettings, many: float) -> tuple[E.DPGMSettings, float]:
    """The settings and the many-items weight of a variant (changes joined by "+")."""
    for change in variant.split("+"):
        if change == "default":
            continue
        key, value = change.split("=", 1)
        if key == "many":
            many = float(value)
        elif key == "weight":
            dpgm.TOTAL_WEIGHT = float(value)
        elif key == "k":
            base = dataclasses.replace(base, k=int(value))
        elif key == "shares":
            base = dataclasses.replace(base, shares=tuple(float(x) for x in value.split(",")))
        elif key == "max_items":
            base = dataclasses.replace(base, max_items=int(value))
        elif key == "reseed":
            kk.RESEED_NOISE = float(value)
        elif key == "iterations":
            base = dataclasses.replace(base, kmeans_iterations=int(value))
        elif key == "steps":
            base = dataclasses.replace(base, sgd=dataclasses.replace(base.sgd, steps=int(value)))
        else:
            sys.exit(f"unknown variant {variant!r}")
    return base, many


def errors(X, S, Q, buckets, true_lin, true_any) -> tuple[float, float]:
    n = X.shape[0]
    lin = counting.relative_errors(true_lin, counting.linear_answers(counting.item_counts(S), Q), n)
    anyof = counting.relative_errors(true_any, counting.anyof_answers(S, Q), n)
    return counting.by_bucket(lin, buckets).mean(), counting.by_bucket(anyof, buckets).mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--items", type=int, default=None)
    ap.add_argument("--epsilon", type=float, default=1.74)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="default", help="variants separated by ';' (or ',' without shares=)")
    args = ap.parse_args()
    X = E.load_transactions(args.data)
    if args.items:
        X = E.restrict_items(X, args.items)
    base = E.DPGMSettings(epsilon=args.epsilon, delta=1.0 / X.shape[0])
    print(f"{X.shape[0]} records, {X.shape[1]} items", flush=True)
    indep, default_many, default_weight = {}, dpgm.TOTAL_WEIGHT_MANY, dpgm.TOTAL_WEIGHT
    default_reseed = kk.RESEED_NOISE
    for variant in args.variants.split(";" if ";" in args.variants else ","):
        dpgm.TOTAL_WEIGHT, kk.RESEED_NOISE = default_weight, default_reseed
        settings, many = settings_of(variant, base, default_many)
        dpgm.TOTAL_WEIGHT_MANY = many
        rows = []
        for seed in range(args.seed, args.seed + args.runs):
            Q, buckets = counting.random_queries(X.shape[1], 1000, np.random.default_rng(seed + 1))
            true_lin, true_any = counting.linear_answers(counting.item_counts(X), Q), counting.anyof_answers(X, Q)
            t0 = time.perf_counter()
            S, guarantee, _ = E.run(X, settings, np.random.default_rng(seed))
            if seed not in indep:   # the baseline of the release's defaults: one per seed
                variant_weights = dpgm.TOTAL_WEIGHT_MANY, dpgm.TOTAL_WEIGHT
                dpgm.TOTAL_WEIGHT_MANY, dpgm.TOTAL_WEIGHT = default_many, default_weight
                indep[seed] = errors(X, E.independent(X, base, np.random.default_rng(10_000 + seed)), Q, buckets,
                                     true_lin, true_any)
                dpgm.TOTAL_WEIGHT_MANY, dpgm.TOTAL_WEIGHT = variant_weights
            rows.append((*errors(X, S, Q, buckets, true_lin, true_any), *indep[seed]))
            print(f"{variant} seed {seed}: ({guarantee.epsilon:.3f})-DP, {time.perf_counter() - t0:.0f}s; dpgm linear "
                  f"{rows[-1][0]:.4g} any-of {rows[-1][1]:.4g}; independent linear {rows[-1][2]:.4g} any-of "
                  f"{rows[-1][3]:.4g}", flush=True)
        r = np.array(rows)
        d = r[:, 1] - r[:, 3]
        se = d.std(ddof=1) / np.sqrt(d.size) if d.size > 1 else float("nan")
        print(f"RESULT ablation data={Path(args.data).name} items={args.items or 'all'} variant={variant} "
              f"dpgm_linear={r[:, 0].mean():.4g} dpgm_anyof={r[:, 1].mean():.4g} indep_linear={r[:, 2].mean():.4g} "
              f"indep_anyof={r[:, 3].mean():.4g} anyof_diff={d.mean():.4g} anyof_se={se:.2g} runs={len(rows)}",
              flush=True)


if __name__ == "__main__":
    main()
