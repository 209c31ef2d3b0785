"""How fast `dprelease` refuses what the admission refuses before anything runs: the CPU seconds (user + system, of
the command and every process it starts) and the wall seconds of

  missing_input   `dprelease run` of a spec whose data file is missing (rule 4);
  schema_error    `dprelease spec check` of a spec with a schema error (rule 5);
  over_budget     `dprelease run` of a spec whose charge would exceed its dataset's budget (rule 12), a k-means and a
                  histogram spec.

Goals (issue 32): the schema error and the over-budget run under 1 s of CPU, one `error:` line, exit 2 (1 over budget).

    python tests/benchmarks/cli_failfast.py [--repeats 5]

Last line: `RESULT missing_input_cpu_s=... schema_error_cpu_s=... over_budget_cpu_s=... over_budget_histogram_cpu_s=...`
(medians; the wall seconds and exit codes are printed above it).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """dataset:
  id: {id}
  path: {path}
  header: true
  bounds: {{x: [0, 1]}}
release:
  kind: {kind}
  epsilon: {epsilon}
  {extra}
"""


def run(args: list[str], env: dict) -> tuple[float, float, subprocess.CompletedProcess]:
    """(CPU seconds of the command and its children, wall seconds, the completed process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "DPRELEASE_LEDGER": str(tmp / "ledger.sqlite"), "XDG_CONFIG_HOME": str(tmp / "xdg")}
        env.pop("DPRELEASE_TEST_MODE", None)
        data = tmp / "data.csv"
        data.write_text("x\n" + "\n".join(f"{i / 100:.2f}" for i in range(100)) + "\n")
        specs = {
            "missing_input": SPEC.format(id="absent", path=tmp / "absent.csv", kind="kmeans", epsilon=1.0,
                                         extra="k: 2"),
            "schema_error": SPEC.format(id="data", path=data, kind="kmeans", epsilon=1.0, extra="k: -2"),
            "over_budget": SPEC.format(id="data", path=data, kind="kmeans", epsilon=5.0, extra="k: 2"),
            "over_budget_histogram": SPEC.format(id="data", path=data, kind="histogram", epsilon=5.0,
                                                 extra="bins: 16"),
        }
        for name, text in specs.items():
            (tmp / f"{name}.yaml").write_text(text)
        for dataset, source, reading in (("absent", tmp / "absent.csv", "missing_input"),
                                         ("data", data, "over_budget")):
            subprocess.run([sys.executable, "-m", "flows.cli", "budget", "set", dataset, "--epsilon", "1", "--source",
                            str(source), "--reading-from", str(tmp / f"{reading}.yaml")], check=True,
                           capture_output=True, env=env)
        commands = {"missing_input": ["run"], "schema_error": ["spec", "check"], "over_budget": ["run"],
                    "over_budget_histogram": ["run"]}
        for name, command in commands.items():
            cpu, wall, out = [], [], None
            for _ in range(args.repeats):
                c, w, out = run([*command, str(tmp / f"{name}.yaml")], env)
                cpu.append(c)
                wall.append(w)
            lines = [line for line in out.stderr.splitlines() if line.strip()]
            results[name] = statistics.median(cpu)
            print(f"{name}: cpu {statistics.median(cpu):.2f} s, wall {statistics.median(wall):.2f} s, exit "
                  f"{out.returncode}, {len(lines)} stderr line(s): {lines[:1]}")
    print("RESULT " + " ".join(f"{k}_cpu_s={v:.2f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
