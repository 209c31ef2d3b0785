"""One release kind over growing data, from the local disk and from an S3 API (moto's server on loopback): the
release's stage time (the sum of its stages, without the CLI's start-up) and the peak memory of the process that runs
it, per size, with the exponent of a power law fitted to the times, and the object store's overhead as a ratio of the
two times at the largest size.

    python tests/benchmarks/scale.py [--kind histogram] [--sizes 100000,1000000,10000000] [--partitions 8]

Last line: `RESULT exponent=<slope of log time on log records, local> s3_overhead=<s3 time / local time, largest>`.
Each release runs in its own `dprelease run` process (its peak memory its own), with a local dask cluster of two
worker threads, the data as Parquet partitions of one column, evaluation off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tasks import storage  # noqa: E402

RELEASES = {
    "histogram": {"kind": "histogram", "bins": 1024, "branching": 4, "epsilon": 1.0},
    "kmeans": {"kind": "kmeans", "k": 5, "iterations": 5, "epsilon": 1.0, "postprocess": ["consistency"]},
}


def write_data(location: str, n: int, partitions: int, columns: list[str]) -> None:
    rng = np.random.default_rng(n)
    for p in range(partitions):
        rows = n // partitions + (p < n % partitions)
        storage.write_table(pa.table({c: rng.uniform(0, 100, rows) for c in columns}),
                            storage.join(location, f"part.{p}.parquet"))


def run(spec: dict, folder: Path, env: dict) -> tuple[float, float]:
    """(the release's stage seconds, peak resident MB of the process that ran it)."""
    (folder / "spec.json").write_text(json.dumps(spec))
    source, reading = spec["dataset"]["path"], str(folder / "spec.json")
    subprocess.run([sys.executable, "-m", "flows.cli", "budget", "set", spec["dataset"]["id"], "--epsilon", "100",
                    "--source", source, "--reading-from", reading], check=True, capture_output=True, env=env)
    out = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "flows.cli", "run", reading, "--json"],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"the release failed: {out.stderr[-2000:]}")
    summary = json.loads(out.stdout[out.stdout.index("{"):])
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))
    return sum(summary["timings"].values()), peak_kb / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", choices=sorted(RELEASES), default="histogram")
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3_env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench",
              "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(s3_env)
    import boto3

    for bucket in ("data", "private", "public"):
        boto3.client("s3").create_bucket(Bucket=bucket)
    columns = ["x"] if args.kind == "histogram" else ["x", "y"]
    rows, times = [], {"local": [], "s3": []}
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for where in ("local", "s3"):
                folder = Path(tmp) / f"{where}-{n}"
                folder.mkdir()
                data = str(folder / "data") if where == "local" else f"s3://data/n{n}"
                write_data(data, n, args.partitions, columns)
                env = {**os.environ, "DPRELEASE_LEDGER": str(folder / "ledger.sqlite"),
                       "XDG_CONFIG_HOME": str(folder / "xdg")}
                env.pop("DPRELEASE_TEST_MODE", None)
                if where == "s3":
                    env.update(DPRELEASE_SCRATCH=f"s3://private/n{n}", DPRELEASE_OUTPUT=f"s3://public/n{n}")
                spec = {"dataset": {"id": f"scale-{where}-{n}", "path": data,
                                    "bounds": {c: [0, 100] for c in columns}},
                        "release": RELEASES[args.kind], "output_dir": str(folder / "runs"), "evaluate": False,
                        "dask": {"n_workers": 1, "threads_per_worker": 2}}
                seconds, peak = run(spec, folder, env)
                times[where].append(seconds)
                rows.append((n, where, seconds, peak))
                print(f"{n:>10,} records  {where:<5}  {seconds:8.2f} s  peak {peak:8.0f} MB", flush=True)
    server.stop()
    exponent = float(np.polyfit(np.log(sizes), np.log(times["local"]), 1)[0])
    overhead = times["s3"][-1] / times["local"][-1]
    print(f"\n{'records':>10}  {'where':<5}  {'seconds':>8}  {'peak MB':>8}")
    for n, where, seconds, peak in rows:
        print(f"{n:>10,}  {where:<5}  {seconds:8.2f}  {peak:8.0f}")
    print(f"RESULT exponent={exponent:.3f} s3_overhead={overhead:.2f} kind={args.kind}")


if __name__ == "__main__":
    main()
