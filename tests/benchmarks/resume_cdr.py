"""Resume of a CDR-scale release killed during postprocessing: is the raw data read again?

    python tests/benchmarks/resume_cdr.py --users 1000000 [--release synthetic|kernel_kmeans]

Generates the synthetic call-detail records (cached, see cdr_scale.py), starts `dprelease run` on them
(production mode, a ledger of its own), kills the CLI's process group with SIGKILL as soon as the
postprocess stage starts, then reruns the same release id. From the two runs' log files (each line
timestamped) it reports how long the first run took to reach postprocessing and how long its ingest and
prepare stages took (what a rerun that re-read the data would repeat), then the rerun's total time and its own
ingest and prepare stage times (reused: near zero), in a last line
    RESULT users=<n> first_to_postprocess_s=<s> first_ingest_prepare_s=<s> rerun_total_s=<s> rerun_ingest_prepare_s=<s>
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cdr_scale import ensure_data  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STAGE = re.compile(r"^(\S+ \S+) INFO prefect\.flow_runs: stage '([^']+)' started")


def _stage_starts(log: Path) -> list[tuple[str, float]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = STAGE.match(line)
        if m:
            out.append((m.group(2), datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()))
    return out


def _span(starts: list[tuple[str, float]], first: str, until: str) -> float:
    times = dict(starts)
    return times[until] - times[first]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--release", choices=["synthetic", "kernel_kmeans"], default="synthetic")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data, public = ensure_data(args.users, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "DPRELEASE_LEDGER": str(tmp / "ledger.sqlite"), "PREFECT_HOME": str(tmp / "home")}
        subprocess.run([sys.executable, "-m", "flows.cli", "budget", "set", "cdr", "--epsilon", "20", "--delta", "1e-6",
                        "--source", str(data)],
                       env=env, cwd=REPO, check=True, capture_output=True)
        release = {"kind": args.release, "k": 10, "iterations": 10, "features": 200, "public_sample": str(public),
                   "epsilon": 1.74, "delta": 1e-7}
        if args.release == "synthetic":
            release.update(model="vae", steps=100, q=0.002, max_items=100)
        spec = {"dataset": {"id": "cdr", "path": str(data), "items_column": "towers", "item_count": 1303},
                "release": release, "output_dir": str(tmp / "runs")}
        (tmp / "spec.yaml").write_text(yaml.safe_dump(spec))
        cmd = [sys.executable, "-m", "flows.cli", "run", str(tmp / "spec.yaml"), "--release-id", "cdr-resume"]
        log = tmp / "runs" / ".logs" / "cdr-resume.log"
        t0 = time.time()
        first = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        while not (log.exists() and "stage 'postprocess' started" in log.read_text(errors="replace")):
            if first.poll() is not None:
                sys.exit(f"the first run ended before postprocessing:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        to_post = time.time() - t0
        starts = _stage_starts(log)
        prepared = next((name for name, _ in starts if name not in ("ingest", "dp measurement", "postprocess")),
                        "no prepare stage")
        first_ip = _span(starts, "ingest", "dp measurement")
        print(f"first run: killed at postprocessing after {to_post:.1f}s; ingest + {prepared}: {first_ip:.1f}s",
              flush=True)
        log.rename(log.with_suffix(".first.log"))
        t0 = time.time()
        rerun = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        total = time.time() - t0
        if rerun.returncode != 0:
            sys.exit(f"the rerun failed: {rerun.stderr[-3000:]}")
        starts = _stage_starts(log)
        rerun_ip = _span(starts, "ingest", "dp measurement")
        reused = log.read_text().count("reusing the validated output")
        print(f"rerun: published in {total:.1f}s; ingest + {prepared}: {rerun_ip:.1f}s ({reused} stages reused)")
    print(f"RESULT users={args.users} first_to_postprocess_s={to_post:.1f} first_ingest_prepare_s={first_ip:.1f} "
          f"rerun_total_s={total:.1f} rerun_ingest_prepare_s={rerun_ip:.1f}")


if __name__ == "__main__":
    main()
