"""A release's cost in scans of its data: the release's stage seconds (ingest, contracts, prepare, DP measurement,
postprocess, publish; evaluation off) against a DuckDB scan and a polars scan of the same Parquet files computing
the same counts, in one run, per size; and the peak memory of the process that ran the release.

    python tests/benchmarks/scan_ratio.py --kind histogram --sizes 1e6,1e7,1e8 [--cache DIR] [--partitions 8]

histogram: 1024 public bins of one column; the scans count the records per bin. grid: 256 x 256 public cells of two
columns (the defaults: HDMM's Kronecker strategy, counts by ADMM, the bootstrap); the scans count the records per
cell; its data are the kmeans data (two uniform columns). kmeans: k = 5, 5 rounds; the scans
are 5 passes, each assigning every scaled point to its nearest of 5 centres and summing counts and coordinates per
centre (the release's rounds also project onto the domain and draw noise: the scans are the floor, not a twin).

The data (uniform on [0, 100], `--partitions` Parquet files) are generated once per size into the cache folder and
reused. Each release runs in its own `dprelease run` process (so that its peak resident memory is its own) with a
local dask cluster of two worker threads; the scans run in this process, each the best of `--repeats`, with two
threads (DuckDB's `threads`, polars' pool is the machine's two cores). Per size, one line per stage, then

    RESULT kind=... n=... stages_s=... duckdb_s=... polars_s=... stages_over_scan=... marginal_ratio=... \
peak_mb=... peak_mb_growth=...

With `--external-s3`, per size the same release in one run: as above, then twice on an external dask cluster (a
`dask scheduler` and a `dask worker --nworkers 2 --nthreads 1`, started here, each in an empty folder) with the data,
the scratch and the output on an S3 API server (moto's, on loopback, as the tests use it), the data uploaded there
once per run. The first release on new workers pays their imports (great-expectations' 3.6 s among them, on each
worker process, at its first contract); the second is what a long-lived cluster costs, and the ratio's:

    RESULT kind=... n=... mode=external-s3 local_s=... external_s=... external_over_local=... first_on_new_workers_s=...

(goal, issue 45: at most 1.5 at 10^7 records). The workers' memory is their own processes': not reported.

`stages_over_scan`: the stages' seconds over DuckDB's; `marginal_ratio`: the release's added seconds per added record
over DuckDB's, from the previous size (`marginal_ratio_polars` the same against polars); `peak_mb_growth`: the
release process's peak resident memory over the previous size's. Goals (issue 45): marginal_ratio <= 5 and
peak_mb_growth <= 1.2 from 10^7 to 10^8.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.processes import dask_cluster  # noqa: E402

BINS, CELLS, K, ROUNDS, LOW, HIGH = 1024, 256, 5, 5, 0.0, 100.0
RELEASES = {
    "histogram": {"kind": "histogram", "bins": BINS, "branching": 4, "epsilon": 1.0},
    "kmeans": {"kind": "kmeans", "k": K, "iterations": ROUNDS, "epsilon": 1.0, "postprocess": ["consistency"]},
    "grid": {"kind": "grid", "cells": CELLS, "epsilon": 1.0},
}
COLUMNS = {"histogram": ["x"], "kmeans": ["x", "y"], "grid": ["x", "y"]}
#: The kinds that read another's generated data (the same columns and law).
DATA_OF = {"grid": "kmeans"}


def dataset(cache: Path, kind: str, n: int, partitions: int) -> Path:
    """The Parquet files of `n` records for `kind`, generated on first use (written under a temporary name, then
    renamed: an interrupted generation is not reused)."""
    kind = DATA_OF.get(kind, kind)
    folder = cache / f"{kind}-{n}-{partitions}"
    if folder.exists():
        return folder
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=cache))
    rng = np.random.default_rng(n)
    for p in range(partitions):
        rows = n // partitions + (p < n % partitions)
        pq.write_table(pa.table({c: rng.uniform(LOW, HIGH, rows) for c in COLUMNS[kind]}), tmp / f"part.{p}.parquet")
    tmp.rename(folder)
    return folder


def release(kind: str, data: Path | str, n: int, work: Path, extra_env: dict | None = None) -> tuple[dict, float]:
    """(the release's stage seconds by stage, peak resident MB of the `dprelease run` process); `extra_env`: the
    operator's settings (an external scheduler, a scratch location)."""
    folder = work / f"{kind}-{n}"
    folder.mkdir(parents=True)
    spec = {"dataset": {"id": f"scan-{kind}-{n}", "path": str(data),
                        "bounds": {c: [LOW, HIGH] for c in COLUMNS[kind]}},
            "release": RELEASES[kind], "output_dir": str(folder / "runs"), "evaluate": False,
            "dask": {"n_workers": 1, "threads_per_worker": 2}}
    reading = folder / "spec.json"
    reading.write_text(json.dumps(spec))
    env = {**os.environ, "DPRELEASE_LEDGER": str(folder / "ledger.sqlite"), "XDG_CONFIG_HOME": str(folder / "xdg"),
           "PYTHONPATH": _python_path(), **(extra_env or {})}
    env.pop("DPRELEASE_TEST_MODE", None)
    subprocess.run([sys.executable, "-m", "flows.cli", "budget", "set", spec["dataset"]["id"], "--epsilon", "100",
                    "--source", str(data), "--reading-from", str(reading)], check=True, capture_output=True, env=env,
                   cwd=ROOT)
    out = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "flows.cli", "run", str(reading), "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"the release failed: {out.stdout[-1000:]}\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout[out.stdout.index("{"):])
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
    return summary["timings"], peak_kb / 1024


def _python_path() -> str:
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


@contextlib.contextmanager
def s3_server() -> Iterator[dict]:
    """moto's S3 API server on loopback with the buckets data, private (scratch) and public (output); yields the
    environment its clients need."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)  # this process uploads the data
    import boto3

    for bucket in ("data", "private", "public"):
        boto3.client("s3").create_bucket(Bucket=bucket)
    try:
        yield env
    finally:
        server.stop()


def external_s3(args, cache: Path, work: Path) -> None:
    """`--external-s3`: per size, the release on the local cluster from the local files, then on the external cluster
    with data, scratch and output in the S3 server, in the same minutes."""
    from tasks import storage

    with s3_server() as env, dask_cluster(work / "dask", env) as address:
        for n in [int(float(s)) for s in args.sizes.split(",")]:
            data = dataset(cache, args.kind, n, args.partitions)
            remote = f"s3://data/{data.name}"
            storage.upload(data, remote)
            local, _ = release(args.kind, data, n, work / "local")
            runs = [release(args.kind, remote, n, work / f"external-{i}", {
                **env, "DPRELEASE_DASK_ADDRESS": address, "DPRELEASE_SCRATCH": f"s3://private/{i}/{data.name}",
                "DPRELEASE_OUTPUT": f"s3://public/{i}/{data.name}"})[0] for i in ("cold", "warm")]
            load = os.getloadavg()[0]
            for name, timings in zip(("local", "ext. cold", "ext. warm"), [local] + runs):
                print(f"{n:>12,} records  {name:<9}  " + "  ".join(f"{k} {v:.2f}" for k, v in timings.items())
                      + f"  | stages {sum(timings.values()):.2f} s  load {load:.2f}", flush=True)
            cold, warm = (sum(t.values()) for t in runs)
            print(f"RESULT kind={args.kind} n={n} mode=external-s3 local_s={sum(local.values()):.2f} "
                  f"external_s={warm:.2f} external_over_local={warm / sum(local.values()):.2f} "
                  f"first_on_new_workers_s={cold:.2f} load={load:.2f}", flush=True)


def _centres(kind: str) -> np.ndarray:
    """K fixed centres in the scaled space [-1, 1]^2 (the scans' work does not depend on where they are)."""
    return np.random.default_rng(0).uniform(-0.5, 0.5, size=(K, len(COLUMNS[kind])))


def duckdb_scan(kind: str, data: Path):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads TO 2")
    files = f"read_parquet('{data}/*.parquet')"
    if kind == "histogram":
        return lambda: con.execute(
            f"SELECT least(greatest(floor((x - {LOW}) / {HIGH - LOW} * {BINS}), 0), {BINS - 1})::INTEGER AS b, "
            f"count(*) FROM {files} GROUP BY b").fetchall()
    if kind == "grid":
        cell = lambda c: f"least(greatest(floor(({c} - {LOW}) / {HIGH - LOW} * {CELLS}), 0), {CELLS - 1})::INTEGER"
        return lambda: con.execute(f"SELECT {cell('x')} * {CELLS} + {cell('y')} AS cell, count(*) FROM {files} "
                                   f"GROUP BY cell").fetchall()
    scaled = ", ".join(f"2 * ({c} - {LOW}) / {HIGH - LOW} - 1 AS {c}" for c in COLUMNS[kind])
    C = _centres(kind)
    dist = [" + ".join(f"({c} - {float(C[j, i])!r}) * ({c} - {float(C[j, i])!r})"
                       for i, c in enumerate(COLUMNS[kind])) for j in range(K)]
    nearest = "CASE " + " ".join(
        f"WHEN {' AND '.join(f'd{j} <= d{o}' for o in range(K) if o != j)} THEN {j}" for j in range(K - 1)) + \
        f" ELSE {K - 1} END"
    sums = ", ".join(f"sum({c})" for c in COLUMNS[kind])
    query = (f"WITH s AS (SELECT {scaled} FROM {files}), d AS (SELECT *, "
             + ", ".join(f"{e} AS d{j}" for j, e in enumerate(dist)) +
             f" FROM s) SELECT {nearest} AS cluster, count(*), {sums} FROM d GROUP BY cluster")
    return lambda: [con.execute(query).fetchall() for _ in range(ROUNDS)]


def polars_scan(kind: str, data: Path):
    import polars as pl

    files = str(data / "*.parquet")
    if kind == "histogram":
        b = ((pl.col("x") - LOW) / (HIGH - LOW) * BINS).floor().clip(0, BINS - 1).cast(pl.Int32).alias("b")
        return lambda: pl.scan_parquet(files).select(b).group_by("b").len().collect()
    if kind == "grid":
        cell = lambda c: ((pl.col(c) - LOW) / (HIGH - LOW) * CELLS).floor().clip(0, CELLS - 1).cast(pl.Int32)
        index = (cell("x") * CELLS + cell("y")).alias("cell")
        return lambda: pl.scan_parquet(files).select(index).group_by("cell").len().collect()
    scaled = [(2 * (pl.col(c) - LOW) / (HIGH - LOW) - 1).alias(c) for c in COLUMNS[kind]]
    C = _centres(kind)
    dist = [sum((pl.col(c) - C[j, i]) ** 2 for i, c in enumerate(COLUMNS[kind])) for j in range(K)]
    m = pl.min_horizontal(*[pl.col(f"d{j}") for j in range(K)])
    nearest = pl.when(pl.col("d0") == m).then(0)
    for j in range(1, K - 1):
        nearest = nearest.when(pl.col(f"d{j}") == m).then(j)
    nearest = nearest.otherwise(K - 1).alias("cluster")
    query = (pl.scan_parquet(files).select(scaled).with_columns(*[d.alias(f"d{j}") for j, d in enumerate(dist)])
             .with_columns(nearest).group_by("cluster")
             .agg(pl.len(), *[pl.col(c).sum() for c in COLUMNS[kind]]))
    return lambda: [query.collect() for _ in range(ROUNDS)]


def best_of(fn, repeats: int) -> float:
    fn()  # the first run reads the files into the page cache, as the release's reads find them
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", choices=sorted(RELEASES), default="histogram")
    parser.add_argument("--sizes", default="1e6,1e7", help="records, comma-separated (1e8 accepted)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "dprelease-bench" / "scan_ratio"))
    parser.add_argument("--external-s3", action="store_true",
                        help="the release on the local cluster and on an external one with its data in S3 (moto)")
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if args.external_s3:
        with tempfile.TemporaryDirectory(prefix="scan-ratio-") as work:
            external_s3(args, cache, Path(work))
        return
    previous = None
    with tempfile.TemporaryDirectory(prefix="scan-ratio-") as work:
        for n in [int(float(s)) for s in args.sizes.split(",")]:
            data = dataset(cache, args.kind, n, args.partitions)
            timings, peak = release(args.kind, data, n, Path(work))
            stages = sum(timings.values())
            duck = best_of(duckdb_scan(args.kind, data), args.repeats)
            polar = best_of(polars_scan(args.kind, data), args.repeats)
            load = os.getloadavg()[0]
            print(f"{n:>12,} records  " + "  ".join(f"{k} {v:.2f}" for k, v in timings.items())
                  + f"  | stages {stages:.2f} s  duckdb {duck:.3f} s  polars {polar:.3f} s  peak {peak:.0f} MB"
                  f"  load {load:.2f}", flush=True)
            fields = {"kind": args.kind, "n": n, "stages_s": f"{stages:.2f}", "duckdb_s": f"{duck:.3f}",
                      "polars_s": f"{polar:.3f}", "stages_over_scan": f"{stages / duck:.1f}",
                      "stages_over_polars": f"{stages / polar:.1f}"}
            if previous is not None:
                p_n, p_stages, p_duck, p_polar, p_peak = previous
                fields["marginal_ratio"] = f"{(stages - p_stages) / max(duck - p_duck, 1e-9):.1f}"
                fields["marginal_ratio_polars"] = f"{(stages - p_stages) / max(polar - p_polar, 1e-9):.1f}"
                fields["release_us_per_record"] = f"{1e6 * (stages - p_stages) / (n - p_n):.3f}"
            fields["peak_mb"] = f"{peak:.0f}"
            if previous is not None:
                fields["peak_mb_growth"] = f"{peak / previous[4]:.2f}"
            fields["load"] = f"{load:.2f}"
            print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
            previous = (n, stages, duck, polar, peak)


if __name__ == "__main__":
    main()
