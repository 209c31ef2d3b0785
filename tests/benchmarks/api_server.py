"""What the CLI's own temporary Prefect API server buys (flows/api.py) against Prefect's ephemeral server.

`dprelease run --example --no-evaluate` alternately as shipped (the server launched before the flow's imports, booting
meanwhile on the other core) and with Prefect's ephemeral server (started by Prefect when the flow first needs the
API), --runs times each, in a temporary folder (the example's own ledger, a PREFECT_HOME of the benchmark's). Per run:
the seconds from the process start to the flow's first line ("Beginning flow run") and to its exit.

    python tests/benchmarks/api_server.py --runs 3
Last line: RESULT own_s=<median total> ephemeral_s=<median total> own_start_s=... ephemeral_start_s=...
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EPHEMERAL = """
import contextlib
import flows.api

flows.api.TemporaryServer.launch = classmethod(lambda cls: None)


@contextlib.contextmanager
def no_server(server):
    yield None


flows.api.prefect_api = no_server
"""


def one(variant: str, out: Path, env: dict) -> tuple[float, float]:
    code = (f"import sys; sys.argv = ['dprelease', 'run', '--example', '--no-evaluate', '--output-dir', '{out}']\n"
            + (EPHEMERAL if variant == "ephemeral" else "") + "from flows.cli import entry_point; entry_point()")
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    total = time.time() - t0
    if done.returncode:
        sys.exit(f"{variant}: exit {done.returncode}\n{done.stderr[-2000:]}")
    found = re.search(r"^(\d\d):(\d\d):(\d\d\.\d+) \| INFO .*Beginning flow run", done.stdout + done.stderr, re.M)
    day = datetime.datetime.fromtimestamp(t0).replace(hour=int(found.group(1)), minute=int(found.group(2)), second=0,
                                                      microsecond=0)
    return day.timestamp() + float(found.group(3)) - t0, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="api-server-"))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp / "prefect-home")
    one("own", tmp / "runs", env)  # warm-up: the Prefect database, numba's and Jinja's caches
    times: dict[str, list[tuple[float, float]]] = {"own": [], "ephemeral": []}
    for _ in range(args.runs):
        for variant in times:
            began, ended = one(variant, tmp / "runs", env)
            times[variant].append((began, ended))
            print(f"{variant}: flow began after {began:.2f} s, exited after {ended:.2f} s", flush=True)
    med = {v: (statistics.median(s for s, _ in t), statistics.median(e for _, e in t)) for v, t in times.items()}
    print(f"RESULT own_s={med['own'][1]:.2f} ephemeral_s={med['ephemeral'][1]:.2f} own_start_s={med['own'][0]:.2f} "
          f"ephemeral_start_s={med['ephemeral'][0]:.2f}")


if __name__ == "__main__":
    main()
