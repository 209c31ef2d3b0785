"""`dprelease experiment` (a paper figure's sweep, flows/experiments.py) and `dprelease generate` (synthetic
set-valued records, tasks/generators.py): the commands of the reference experiments, not of releases."""

from __future__ import annotations

import sys
from pathlib import Path

from flows.cli.arguments import DEFAULT_OUTPUT, positive_int


def add_parsers(sub) -> None:
    exp = sub.add_parser("experiment", help="reproduce a paper figure on the reference datasets",
                         description="Run a paper-reproduction experiment (a Prefect flow): sweep epsilon over "
                                     "the methods, write a Parquet table and PNG plots into "
                                     "<output_dir>/experiments/<name>-<time>/internal/.")
    exp.add_argument("name", choices=["kmeans", "contingency", "histogram", "matrix_mechanism", "mnist_clustering",
                                      "friendlycore_mean", "friendlycore_kmeans"],
                     help="kmeans: Lee-Kifer Fig 1 (DPKM vs consistency vs MCMC); contingency: Lee-Wang-Kifer "
                          "Fig 5.1.1; histogram: Figs 5.2.1-5.2.2; matrix_mechanism: Figs 5.3.1-5.3.2; "
                          "mnist_clustering: Acs et al. Fig 3; friendlycore_mean: FriendlyCore blog, averaging vs "
                          "CoinPress (error vs R and vs d); friendlycore_kmeans: FriendlyCore blog, k-means cost vs n "
                          "(friendly k-means vs DP k-means and Lee-Kifer). The friendlycore_* experiments generate "
                          "their data and fix rho = 0.5 (no --epsilons); friendlycore_kmeans with --runs <= 2 "
                          "runs quick settings (n <= 5e4)")
    exp.add_argument("--runs", type=int, default=10, help="runs per setting (default 10)")
    exp.add_argument("--seed", type=int, default=0, help="seed of the experiment's noise (default 0)")
    exp.add_argument("--epsilons", help="comma-separated epsilons (default 0.05,0.1,0.25,0.5,1.0 for kmeans, "
                                        "0.1,0.2,...,1.0 otherwise)")
    exp.add_argument("--data-dir", default="../shared/data", help="reference datasets (default ../shared/data)")
    exp.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"default {DEFAULT_OUTPUT}")
    exp.set_defaults(func=cmd_experiment)

    gen = sub.add_parser("generate", help="generate synthetic call-detail or transit records",
                         description="Write realistic synthetic set-valued records (Acs et al.'s CDR: 1,303 towers, "
                                     "~11.4 per subscriber; TRANSIT: 342 stations, ~5.3 per passenger) as "
                                     "partitioned Parquet with a list<int32> column. Deterministic given --seed.")
    gen.add_argument("model", choices=["cdr", "transit"])
    gen.add_argument("--users", type=positive_int, required=True,
                     help="number of records (4400000 for the paper's CDR)")
    gen.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--workers", type=positive_int, default=2, help="dask worker processes")
    gen.set_defaults(func=cmd_generate)


def cmd_experiment(args) -> int:
    import pandas as pd

    from flows.experiments import experiment

    eps = [float(e) for e in args.epsilons.split(",")] if args.epsilons else None
    result = experiment(name=args.name, data_dir=args.data_dir, output_dir=args.output_dir, runs=args.runs,
                        seed=args.seed, epsilons=eps)
    print(f"\nExperiment {args.name}: tables and plots in {result['internal_dir']} (internal: not for publication)")
    for table in result["tables"]:
        frame = pd.read_parquet(table)
        keys = [c for c in ("dataset", "known", "workload", "panel", "dimension", "R", "n", "epsilon", "range_length")
                if c in frame.columns]
        metric = next(c for c in ("ratio", "accuracy", "mse", "l2_error") if c in frame.columns)
        # Tables with a 'released' column count a failed release as +inf: their mean would be +inf, so the median.
        agg = "median" if "released" in frame.columns else "mean"
        summary = frame.groupby(keys + ["method"])[metric].agg(agg).unstack("method")
        label = {"ratio": "WCSS / k-means++", "accuracy": "clustering accuracy", "mse": "MSE",
                 "l2_error": "L2 error"}[metric]
        print(f"\n{Path(table).name} ({agg} {label} over runs)\n"
              f"{summary.to_string(float_format=lambda v: f'{v:.4g}')}")
    return 0


def cmd_generate(args) -> int:
    from distributed import Client, LocalCluster

    from tasks import generators

    model = generators.MODELS[args.model]
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} is not empty", file=sys.stderr)
        return 1
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        paths = generators.generate(model, out, users=args.users, seed=args.seed, client=client)
    print(f"wrote {args.users} {args.model} records ({model.items} items, column '{model.item_column}') in "
          f"{len(paths)} partitions to {out}")
    return 0
