"""Overhead of the release flow: wall time of the flow beside its stage split, and the time of the dpalgos calls
alone.

Runs the `release` flow (ephemeral Prefect API, local dask cluster, GX contracts, Parquet stages) on a numeric
CSV, or on the built-in example (`--example`: `dprelease run --example`'s spec, 200,000 generated rows), then the
same mathematics in memory with dpalgos only: scaling + projection, DP k-means, and the evaluation (WCSS per
iteration, the k-means++ reference as the kind runs it). The first flow call of a process also pays for starting
the ephemeral Prefect API; it is reported separately. `--cli N` also times `dprelease run --example` N times as a
user runs it (a process each: imports, the temporary API server, the flow), warm (after a first run).

    python tests/benchmarks/flow_overhead.py --example --cli 3
    python tests/benchmarks/flow_overhead.py --data ../shared/data/kmeans/s1.txt --k 15
Last line: RESULT flow_s=<warm flow> dpalgos_s=<math alone> overhead_s=<difference> cold_flow_s=<first call>
    [cli_s=<median of `dprelease run --example`>] stages=<stage:seconds,...> (medians of the warm runs)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import load_numeric_csv, operator_ledger  # noqa: E402

from flows.environment import apply_defaults  # noqa: E402

apply_defaults()  # before Prefect is imported
from dpalgos import domain, dpkmeans, metrics  # noqa: E402
from dpalgos.noise import simulated  # noqa: E402


def dpalgos_alone(X: np.ndarray, k: int, lo, hi, eps: float, T: int, dom: str) -> float:
    from tasks.kinds.kmeans import REFERENCE_START_ROWS

    t0 = time.perf_counter()
    P, _ = domain.normalise(X, lo, hi, dom)
    rng = np.random.default_rng()
    C0, _ = dpkmeans.data_independent_centroids(k, P.shape[1], rng, domain=dom)
    plan = dpkmeans.plan(epsilon=eps, iterations=T, k=k, d=P.shape[1], domain=dom, seeding=False)
    traj = dpkmeans.dp_kmeans(dpkmeans.array_stats(P), C0, iterations=T, measure=simulated(plan, rng), domain=dom)
    B = domain.scale_to_unit_box(X, lo, hi)[0]
    [metrics.wcss(B, C) for C in traj.centroids]
    _, centres = metrics.kmeans_reference(B, k, seed=0, start_rows=REFERENCE_START_ROWS)
    metrics.kmeans_reference(P, k, init=domain.project(centres, dom))
    return time.perf_counter() - t0


def cli_runs(n: int, out: Path) -> list[float]:
    """`dprelease run --example` as a user runs it, warm (one run first, untimed): with Python's bytecode caches,
    so a PYTHONDONTWRITEBYTECODE of the caller's is dropped for these runs (with it every run compiles the project's
    modules anew, as no user's install does)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times = []
    for i in range(n + 1):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "flows.cli", "run", "--example", "--output-dir", str(out)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t0)
    return times[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data")
    ap.add_argument("--example", action="store_true", help="the built-in example release instead of --data")
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cli", type=int, default=0, help="also time `dprelease run --example` this many times")
    args = ap.parse_args()
    if not (args.example or args.data):
        ap.error("give --data or --example")

    from flows.example import example_spec
    from flows.release import release
    from tasks.spec import parse_spec

    out = Path(tempfile.mkdtemp(prefix="flow-overhead-"))
    if args.example:
        base = example_spec(output_dir=str(out)).model_dump()
        X = load_example(out)
        dataset_id = base["dataset"]["id"]
    else:
        X = load_numeric_csv(args.data)
        lo, hi = X.min(axis=0), X.max(axis=0)
        cols = [f"x{j}" for j in range(X.shape[1])]
        base = {"dataset": {"id": "bench", "path": args.data, "header": False,
                            "bounds": {c: [float(a), float(b)] for c, a, b in zip(cols, lo, hi)}},
                "release": {"kind": "kmeans", "k": args.k, "iterations": args.iterations, "epsilon": args.eps},
                "output_dir": str(out)}
        dataset_id = "bench"
    operator_ledger(out, {dataset_id: (100.0, 1e-3)})  # the most a lifetime budget may be
    cols = list(base["dataset"]["bounds"])
    lo = np.array([base["dataset"]["bounds"][c][0] for c in cols])
    hi = np.array([base["dataset"]["bounds"][c][1] for c in cols])

    def flow_once(i: int):
        spec = parse_spec({**base, "release_id": f"bench-{i}"})
        t0 = time.perf_counter()
        s = release(spec=spec)
        return time.perf_counter() - t0, s["timings"]

    cold, _ = flow_once(0)
    warm, stages = zip(*[flow_once(i + 1) for i in range(args.repeats)])
    k, T = base["release"]["k"], base["release"]["iterations"]
    dom = domain.default_domain(len(cols))
    math = [dpalgos_alone(X, k, lo, hi, base["release"]["epsilon"], T, dom) for _ in range(args.repeats)]
    flow_s, math_s = float(np.median(warm)), float(np.median(math))
    split = {name: float(np.median([s[name] for s in stages])) for name in stages[0]}
    print(f"flow stages (median of {args.repeats} warm runs): " + ", ".join(f"{n} {v:.2f}s" for n, v in split.items()))
    print(f"flow wall time: cold {cold:.2f}s (includes starting the ephemeral Prefect API), warm median {flow_s:.2f}s")
    print(f"dpalgos alone: median {math_s:.2f}s")
    result = (f"RESULT flow_s={flow_s:.2f} dpalgos_s={math_s:.2f} overhead_s={flow_s - math_s:.2f} "
              f"cold_flow_s={cold:.2f}")
    if args.cli:
        cli = cli_runs(args.cli, out / "cli")
        print("dprelease run --example: " + ", ".join(f"{t:.2f}s" for t in cli))
        result += f" cli_s={float(np.median(cli)):.2f}"
    print(result + " stages=" + ",".join(f"{re.sub(' ', '_', n)}:{v:.2f}" for n, v in split.items()))


def load_example(folder: Path) -> np.ndarray:
    import pyarrow.parquet as pq

    from tasks.example_data import SENSOR_COLUMNS, example_sensors

    table = pq.read_table(example_sensors(folder / "example-sensors.parquet"))
    return np.column_stack([table.column(c).to_numpy() for c in SENSOR_COLUMNS])


if __name__ == "__main__":
    main()
