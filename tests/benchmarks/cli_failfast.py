"""How fast `dprelease` refuses what the admission refuses before anything runs: the CPU seconds (user + system, of
the command and every process it starts) and the wall seconds of

  missing_input   `dprelease run` of a spec whose data file is missing (rule 4);
  schema_error    `dprelease spec check` of a spec with a schema error (rule 5);
  over_budget     `dprelease run` of a spec whose charge would exceed its dataset's budget (rule 12), a k-means and a
                  histogram spec;
  and the refusals of issue 44, each a `dprelease run` (before the charge, before Prefect starts):
  bootstrap       a histogram of 4,096 bins with 10,000 replicates, past a 2 GiB memory limit (rule 7);
  iterations      k-means with 10^6 iterations, past the 4-hour stage limit (rule 7);
  consistency     k-means with 3,000 iterations: its trajectory's consistency past the memory limit (rule 7);
  bounds          bounds [-1e308, 1e308] (rule 5);
  duplicate_header  a data file whose header names x twice (rule 7b);
  nested          a spec nested 5,000 levels deep (rule 2);
  output_proc     --output-dir /proc/x (rule 8);
  s3_no_credentials  data at an s3:// URL with no credentials in the environment (rule 4).

Goals (issue 32): the schema error and the over-budget run under 1 s of CPU, one `error:` line, exit 2 (1 over budget).
Issue 44: every refusal under 1 s of CPU before Prefect starts where its cause is in the spec or the files' public
facts.

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
        dup = tmp / "dup.csv"
        dup.write_text("x,x\n" + "\n".join(f"{i / 100:.2f},1" for i in range(100)) + "\n")
        specs.update({
            "bootstrap": SPEC.format(id="data", path=data, kind="histogram", epsilon=0.1,
                                     extra="bins: 4096\n  replicates: 10000"),
            "iterations": SPEC.format(id="data", path=data, kind="kmeans", epsilon=0.1,
                                      extra="k: 2\n  iterations: 1000000\n  postprocess: []"),
            "consistency": SPEC.format(id="data", path=data, kind="kmeans", epsilon=0.1,
                                       extra="k: 10\n  iterations: 3000"),
            "bounds": SPEC.format(id="data", path=data, kind="kmeans", epsilon=0.1, extra="k: 2").replace(
                "[0, 1]", "[-1e308, 1e308]"),
            "duplicate_header": SPEC.format(id="dup", path=dup, kind="kmeans", epsilon=0.1, extra="k: 2"),
            "nested": "release: " + "[" * 5000 + "]" * 5000 + "\n",
            "output_proc": SPEC.format(id="data", path=data, kind="kmeans", epsilon=0.1, extra="k: 2"),
            "s3_no_credentials": SPEC.format(id="s3", path="s3://bucket/data.csv", kind="kmeans", epsilon=0.1,
                                             extra="k: 2"),
        })
        for name, text in specs.items():
            (tmp / f"{name}.yaml").write_text(text)
        for dataset, source, reading in (("absent", tmp / "absent.csv", "missing_input"),
                                         ("data", data, "over_budget"), ("dup", dup, "duplicate_header")):
            subprocess.run([sys.executable, "-m", "flows.cli", "budget", "set", dataset, "--epsilon", "1", "--source",
                            str(source), "--reading-from", str(tmp / f"{reading}.yaml")], check=True,
                           capture_output=True, env=env)
        commands = {"missing_input": ["run"], "schema_error": ["spec", "check"], "over_budget": ["run"],
                    "over_budget_histogram": ["run"], "bootstrap": ["run"], "iterations": ["run"],
                    "consistency": ["run"], "bounds": ["run"], "duplicate_header": ["run"], "nested": ["run"],
                    "output_proc": ["run"], "s3_no_credentials": ["run"]}
        # The s3 case in test mode (test data, no ledger): existence is asked of the store at once.
        extra_env = {"bootstrap": {"DPRELEASE_MEMORY_LIMIT_GIB": "2"},
                     "s3_no_credentials": {"DPRELEASE_TEST_MODE": "allowed"}}
        extra_args = {"output_proc": ["--output-dir", "/proc/x"]}
        no_credentials = {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                          "AWS_EC2_METADATA_DISABLED": "true"}
        for name, command in commands.items():
            cpu, wall, out = [], [], None
            case_env = {**env, **extra_env.get(name, {})}
            if name == "s3_no_credentials":
                case_env = {k: v for k, v in case_env.items() if not k.startswith("AWS_")} | no_credentials
                (tmp / f"{name}.yaml").write_text(specs[name] + "mode: test\nseed: 1\n")
            for _ in range(args.repeats):
                c, w, out = run([*command, str(tmp / f"{name}.yaml"), *extra_args.get(name, [])], case_env)
                cpu.append(c)
                wall.append(w)
            lines = [line for line in out.stderr.splitlines() if line.strip()]
            results[name] = statistics.median(cpu)
            print(f"{name}: cpu {statistics.median(cpu):.2f} s, wall {statistics.median(wall):.2f} s, exit "
                  f"{out.returncode}, {len(lines)} stderr line(s): {lines[:1]}")
    print("RESULT " + " ".join(f"{k}_cpu_s={v:.2f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
