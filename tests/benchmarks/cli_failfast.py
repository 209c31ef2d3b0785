"""How fast `dprelease run` refuses a spec whose input file is missing (goal: under 2 s, one line, exit 2). The
dataset has a budget in a temporary ledger: an input's existence is checked once the ledger accepted the spec.

    python tests/benchmarks/cli_failfast.py [--repeats 5]

Prints `RESULT missing_input_s=<median wall seconds> exit=<code> stderr_lines=<n>`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """dataset:
  id: failfast
  path: {path}
  bounds: {{x: [0, 1]}}
release:
  kind: kmeans
  k: 2
  epsilon: 1.0
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DPRELEASE_LEDGER": str(Path(tmp) / "ledger.sqlite")}
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(SPEC.format(path=Path(tmp) / "absent.csv"))
        subprocess.run([sys.executable, "-m", "flows.cli", "budget", "set", "failfast", "--epsilon", "1", "--source",
                        str(Path(tmp) / "absent.csv"), "--reading-from", str(spec)], check=True, capture_output=True,
                       env=env)
        times, out = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(spec)], capture_output=True, text=True,
                                 env=env)
            times.append(time.perf_counter() - t0)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    print(f"stderr: {lines}")
    print(f"RESULT missing_input_s={statistics.median(times):.2f} exit={out.returncode} stderr_lines={len(lines)}")


if __name__ == "__main__":
    main()
