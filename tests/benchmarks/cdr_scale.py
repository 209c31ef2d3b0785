"""CDR-scale release through the real flow: generate the synthetic call-detail records (4.4M subscribers,
1,303 towers; cached between runs), then run a release with Prefect's ephemeral API and dask (a local
cluster, or --distributed: a `dask scheduler` and two `dask worker` processes started on loopback):
  * `--release kernel_kmeans` (d = 200, k = 10, 20 iterations), last line
        RESULT users=<n> seconds_per_iteration=<s> peak_rss_gb=<g>
  * `--release synthetic` (DPGM: kernel k-means as above with 10 iterations, 10 VAEs trained by DP-SGD,
    4.4M synthetic records, counting-query evaluation), last line
        RESULT users=<n> total_s=<s> peak_rss_gb=<g> sgd_ms_per_model_step=<ms> floor_ms=<ms>
  * `--release sgd`: the DP-SGD steps alone (10 VAEs, batches of the expected size q * users / 10 from the
    generated records), last line RESULT users=<n> sgd_ms_per_model_step=<ms> floor_ms=<ms>
Peak RSS covers the flow process and the dask workers. Every figure is printed beside its limit: 5 minutes and
8 GB for the synthetic release (issue 17), and for DP-SGD the FLOP floor measured in the same run: the three
dense products of the 200 x 1,303 output layer that a model-step cannot avoid (forward, back-propagation,
weight gradient), timed alone on one core at the same batch size, divided by the number of cores (the
models' steps run in parallel, one per core).

    python tests/benchmarks/cdr_scale.py --users 4400000
    python tests/benchmarks/cdr_scale.py --users 4400000 --distributed
    python tests/benchmarks/cdr_scale.py --users 4400000 --release synthetic
    python tests/benchmarks/cdr_scale.py --users 4400000 --release sgd --steps 20
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flows.environment import apply_defaults  # noqa: E402

apply_defaults()  # the CLI's process settings (no telemetry, quiet dask) before Prefect is imported
from _data import operator_ledger  # noqa: E402

import tasks  # noqa: E402,F401

CACHE = Path(os.environ.get("DPRELEASE_BENCH_CACHE", Path(tempfile.gettempdir()) / "dprelease-bench"))


def ensure_data(users: int, seed: int) -> tuple[Path, Path]:
    from tasks import generators

    data, public = CACHE / f"cdr-{users}-{seed}", CACHE / f"cdr-public-{seed + 1}"
    for path, n, s in ((data, users, seed), (public, 20_000, seed + 1)):
        if not (path / "_complete").exists():
            t0 = time.perf_counter()
            from distributed import Client, LocalCluster

            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                              dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
                generators.generate(generators.CDR, path, users=n, seed=s, client=client)
            (path / "_complete").write_text("ok")
            print(f"generated {n} CDR records in {time.perf_counter() - t0:.1f}s -> {path}", flush=True)
    return data, public


def start_cluster(tmp: Path):
    bin_dir = Path(sys.executable).parent
    port = 8786 + os.getpid() % 1000
    env = {**os.environ, "DASK_LOGGING__DISTRIBUTED": "warning"}
    procs = [subprocess.Popen([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", "127.0.0.1:0"], env=env, stdout=open(tmp / "s.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)]
    time.sleep(3)
    procs.append(subprocess.Popen([str(bin_dir / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "2",
                                   "--nthreads", "1", "--host", "127.0.0.1", "--memory-limit", "0"], env=env,
                                  stdout=open(tmp / "w.log", "w"), stderr=subprocess.STDOUT, start_new_session=True))
    from distributed import Client

    with Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:
        c.wait_for_workers(2, timeout=120)
    return f"tcp://127.0.0.1:{port}", procs


def worker_peak_gb(address: str) -> float:
    from distributed import Client

    with Client(address) as c:
        peaks = c.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return sum(peaks.values()) / 1024 ** 2


def sgd_figures(data: Path, users: int, q: float, steps: int, k: int = 10, items: int = 1303) -> tuple[float, float]:
    """(ms per model-step of `dpgm.train`, ms of the FLOP floor) at the batch size q * users / k."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from dpalgos import dpgm
    from dpalgos.noise import Measure, SeededNoise
    from tasks.kinds.synthetic import sgd_config
    from tasks.sets import read_sets
    from tasks.spec import parse_spec

    batch = max(int(q * users / k), 1)
    X = read_sets(str(sorted(data.glob("*.parquet"))[0]), "towers", items)
    rng = np.random.default_rng(0)
    # The models and DP-SGD settings of a `synthetic` release with these steps and q (the kind's defaults otherwise).
    cfg = sgd_config(parse_spec({"dataset": {"id": "cdr-bench", "path": str(data), "items_column": "towers",
                                             "item_count": items},
                                 "release": {"kind": "synthetic", "k": k, "epsilon": 1.74, "gamma": 0.05,
                                             "steps": steps, "q": q}}))
    plan = dpgm.plan(dpgm.NoisePlan(1.0, 1.0, 1.0), kmeans_iterations=1, q=q, steps=steps + 1, max_items=100)
    models = [dpgm.make_model(cfg, items, rng, np.full(items, 0.01)) for _ in range(k)]
    batches = [X[rng.choice(X.shape[0], batch, replace=False)] for _ in range(k)]
    measure, sizes = Measure(plan, SeededNoise(0)), np.full(k, users / k)
    dpgm.train(models, lambda s: batches, sizes, dataclasses.replace(cfg, steps=1), measure)  # numba compile, caches
    t0 = time.perf_counter()
    dpgm.train(models, lambda s: batches, sizes, cfg, measure)
    per_step = (time.perf_counter() - t0) / (steps * k) * 1e3
    h, W, d = rng.random((batch, 200)), rng.random((200, items)), rng.random((batch, items))
    with threadpool_limits(1):
        t0 = time.perf_counter()
        for _ in range(steps):
            h @ W, d @ W.T, h.T @ d
        one_core = (time.perf_counter() - t0) / steps * 1e3
    return per_step, one_core / len(os.sched_getaffinity(0))  # dpgm.train runs one model per core


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=4_400_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--release", choices=["kernel_kmeans", "synthetic", "sgd"], default="kernel_kmeans")
    ap.add_argument("--epsilon", type=float, default=None, help="default: 1.0 (kernel_kmeans), 1.74 (synthetic)")
    ap.add_argument("--model", choices=["vae", "rbm"], default="vae", help="synthetic: generative model")
    ap.add_argument("--steps", type=int, default=300, help="synthetic: DP-SGD steps")
    ap.add_argument("--q", type=float, default=0.002, help="synthetic: DP-SGD sampling rate")
    ap.add_argument("--distributed", action="store_true", help="run on a dask scheduler + 2 worker processes")
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()
    data, public = ensure_data(args.users, args.seed)
    if args.release == "sgd":
        per_step, floor = sgd_figures(data, args.users, args.q, args.steps)
        print(f"DP-SGD: {per_step:.1f} ms per model-step (FLOP floor {floor:.1f} ms, same run)")
        print(f"RESULT users={args.users} sgd_ms_per_model_step={per_step:.2f} floor_ms={floor:.2f}")
        return
    tmp = Path(tempfile.mkdtemp(prefix="cdr-scale-"))
    procs, dask, address = [], {"n_workers": 1, "threads_per_worker": 2}, None
    if args.distributed:
        address, procs = start_cluster(tmp)
        os.environ["DPRELEASE_DASK_ADDRESS"] = address  # the operator's setting (a spec cannot name a scheduler)
    from flows.release import release
    from tasks.spec import parse_spec

    release_params = {"kind": "kernel_kmeans", "k": 10, "iterations": args.iterations,
                      "epsilon": args.epsilon or 1.0, "delta": 1e-7, "features": 200, "public_sample": str(public)}
    if args.release == "synthetic":
        release_params.update(kind="synthetic", iterations=10, epsilon=args.epsilon or 1.74, model=args.model,
                              steps=args.steps, q=args.q, max_items=100)
    operator_ledger(tmp, {"cdr-bench": (1000.0, 1e-6)}, public=[public])
    spec = parse_spec({
        "dataset": {"id": "cdr-bench", "path": str(data), "items_column": "towers", "item_count": 1303},
        "release": release_params,
        "output_dir": str(tmp / "runs"),
        "dask": dask})
    try:
        t0 = time.perf_counter()
        summary = release(spec=spec)
        total = time.perf_counter() - t0
        workers_gb = worker_peak_gb(address) if args.distributed else 0.0
    finally:
        for p in reversed(procs):
            p.terminate()
    flow_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    print(json.dumps(summary["timings"], indent=1))
    if args.release == "synthetic":
        per_step, floor = sgd_figures(data, args.users, args.q, 5)
        print(f"{args.users} records; flow {total:.0f}s (limit 300 s); peak RSS flow {flow_gb:.2f} GB + dask "
              f"workers {workers_gb:.2f} GB (limit 8 GB); ({summary['epsilon']:.3g}, {summary['delta']:g})-DP; "
              f"DP-SGD {per_step:.1f} ms per model-step (FLOP floor {floor:.1f} ms, same run)")
        print(json.loads(Path(summary["evaluation"]).read_text())["headline"] if summary["evaluation"] else "")
        print(f"RESULT users={args.users} total_s={total:.0f} peak_rss_gb={flow_gb + workers_gb:.2f} "
              f"sgd_ms_per_model_step={per_step:.2f} floor_ms={floor:.2f}")
        return
    dp = summary["timings"]["dp measurement"]
    per_iteration = dp / args.iterations
    print(f"{args.users} records; flow {total:.0f}s; DP stage {dp:.1f}s = {per_iteration:.2f}s per iteration; "
          f"feature pass {args.users / per_iteration:.3g} records/s; peak RSS flow {flow_gb:.2f} GB + dask workers "
          f"{workers_gb:.2f} GB; {summary['evaluation']['headline'] if summary['evaluation'] else ''}")
    print(f"RESULT users={args.users} seconds_per_iteration={per_iteration:.2f} peak_rss_gb={flow_gb + workers_gb:.2f}")


if __name__ == "__main__":
    main()
