"""An origin-destination release at CDR scale through the real flow (Prefect's ephemeral API, a local dask cluster in
this process, so that the peak RSS covers the flow and its workers): N generated trips of N / 5 users between 50
public zones (Parquet files of 10^6 trips, cached between runs), each user's trips bounded to k = 3 (the shuffle of
trips by user into buckets, the keyed choice, the counts), Laplace, ADMM, the bootstrap. Run it at two sizes, each in
its own process, to see the peak memory stay flat in N (it follows the partition, 10^6 trips, not the total):

    python tests/benchmarks/od_scale.py --trips 1000000
    python tests/benchmarks/od_scale.py --trips 10000000

Last line: RESULT trips=<n> users=<u> seconds=<s> encode_s=<s> dp_s=<s> peak_rss_gb=<g>
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flows.environment import apply_defaults  # noqa: E402

apply_defaults()  # the CLI's process settings (no telemetry, quiet dask) before Prefect is imported
from _data import operator_ledger  # noqa: E402

CACHE = Path(os.environ.get("DPRELEASE_BENCH_CACHE", Path(tempfile.gettempdir()) / "dprelease-bench"))
ZONES = [f"z{i:02d}" for i in range(50)]
PER_FILE = 1_000_000


def ensure_trips(trips: int, seed: int) -> Path:
    """N trips in files of PER_FILE: user ids u<i> with i uniform over N / 5 users (so a user's trips spread over
    every file, as a day's records would), origins from heavy-tailed zone sizes, destinations near them (outside the
    zones for 1%)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = CACHE / f"od-{trips}-{seed}"
    if (folder / "_complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    size = rng.pareto(1.2, len(ZONES)) + 0.1
    names = np.array(ZONES + ["elsewhere"])
    t0 = time.perf_counter()
    for part, start in enumerate(range(0, trips, PER_FILE)):
        n = min(PER_FILE, trips - start)
        users = rng.integers(0, max(trips // 5, 1), n)
        origin = rng.choice(len(ZONES), n, p=size / size.sum())
        destination = (origin + rng.geometric(0.3, n) * rng.choice([-1, 1], n)) % len(ZONES)
        destination[rng.random(n) < 0.01] = len(ZONES)
        pq.write_table(pa.table({"user": pa.array(np.char.add("u", users.astype(str))), "origin": names[origin],
                                 "destination": names[destination]}), folder / f"part-{part:04d}.parquet")
    (folder / "_complete").write_text("ok")
    print(f"generated {trips} trips in {time.perf_counter() - t0:.1f}s -> {folder}", flush=True)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trips", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=3, help="trips_per_user")
    args = ap.parse_args()
    data = ensure_trips(args.trips, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="od-scale-"))
    from flows.release import release
    from tasks.spec import parse_spec

    operator_ledger(tmp, {"od-bench": (10.0, 1e-6)})
    spec = parse_spec({
        "dataset": {"id": "od-bench", "path": str(data), "user_column": "user",
                    "categories": {"origin": ZONES, "destination": ZONES}},
        "release": {"kind": "od", "epsilon": 1.0, "origin": "origin", "trips_per_user": args.k},
        "output_dir": str(tmp / "runs"), "evaluate": False,
        "dask": {"n_workers": 1, "threads_per_worker": 2}})
    t0 = time.perf_counter()
    summary = release(spec=spec)
    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    timings = summary["timings"]
    print(json.dumps(timings, indent=1))
    print(f"{args.trips} trips, {args.trips // 5} users, k = {args.k}: flow {total:.0f}s; peak RSS (flow and its "
          f"in-process workers) {peak:.2f} GB")
    encode, dp = timings.get("encoded", 0), timings.get("dp measurement", 0)
    print(f"RESULT trips={args.trips} users={args.trips // 5} seconds={total:.0f} encode_s={encode:.0f} "
          f"dp_s={dp:.0f} peak_rss_gb={peak:.2f}")


if __name__ == "__main__":
    main()
