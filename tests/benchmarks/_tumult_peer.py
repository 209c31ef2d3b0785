"""Tumult Analytics (`tmlt.analytics` 0.21 on pyspark 3.5, the machine's Java 17) as a benchmark peer: histogram
counts over public equal-width bins, and bounded means (pure DP, and zCDP).

The module has two halves, and is both:
- imported in the pipeline's venv (it imports neither tmlt nor pyspark at the top): `histogram_counts`, `mean` and
  `mean_zcdp` save the values to a temporary folder, run this file in the tumult peer's venv (created on first use
  by tests/benchmarks/_peer_venv.py, or the interpreter given as `python=`) and read back the releases, one row per
  run, as .npy files;
- run in the tumult venv as a script (the peer side below), which starts ONE local SparkSession per call and makes
  every run in it, each run a fresh Tumult `Session` (its own budget): `runs` independent releases.

What Tumult releases (its defaults, as a data team would call it):
- counts: `QueryBuilder.groupby(KeySet).count()` over the public KeySet of the bin indices 0 .. bins-1, the values
  binned first (numpy, public edges: bin i is [lower + i w, lower + (i + 1) w), w = (upper - lower) / bins; values
  outside [lower, upper) are in no bin, and so not counted), `PureDPBudget(epsilon)`, protected change `AddOneRow()`
  (add/remove-one-row neighbours). The default count mechanism under pure DP is the double-sided geometric
  (discrete Laplace) with scale 1/epsilon (sensitivity 1): per bin P(k) proportional to exp(-epsilon |k|), variance
  2 exp(-epsilon) / (1 - exp(-epsilon))^2 (1.84 at epsilon 1, against 2 / epsilon^2 = 2 for the continuous
  Laplace). Counts are integers and may be negative (Tumult does no post-processing).
- means: `QueryBuilder.average(column, low=lower, high=upper)` of a float column, values clamped to [lower, upper]
  by Tumult. Tumult spends half the budget on a noisy sum of the deviations from the midpoint (sensitivity
  (upper - lower) / 2) and half on a noisy count, and releases sum / max(1, count) + midpoint (not clamped to the
  bounds). Pure DP (`PureDPBudget`): continuous Laplace noise for a float column; zCDP (`RhoZCDPBudget(rho)`,
  `mean_zcdp`): Gaussian noise on the sum and discrete Gaussian on the count.
Tumult draws its noise from its own generator and takes no seed: runs cannot be replayed.

Spark (local[2], 2 shuffle partitions, no UI, its warehouse and scratch in the temporary folder: Tumult writes a
table per release there) starts in 2-5 s on this 2-core machine, and a call costs ~8 s beyond its runs (the
interpreter, tmlt's imports, the data into Spark, the clean-up). A run (a Session, the query, its materialized
tables) takes 0.7 s for 64 bins and 1.4 s for 4,096 (median; the first run of a call 5 s), 4-8 s for a mean (two
aggregations, each written to a table), more when the machine is loaded. A call's timings (`spark_start_s`,
`run_s`, `per_run_s`, `call_s`) and Tumult's own account of its noise (`noise`) are put in `timings` when a dict is
passed.

    <tumult python> _tumult_peer.py {histogram,mean,mean_zcdp} IN.npy OUT.npy INFO.json --lower L --upper U
        [--bins B] --budget EPSILON_OR_RHO --runs R
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SOURCE = "data"


def bin_index(values: np.ndarray, lower: float, upper: float, bins: int) -> np.ndarray:
    """The equal-width bin of each value in [lower, upper), public edges; -1 for a value outside (in no bin)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    idx = np.floor((v - lower) / (upper - lower) * bins)
    inside = (v >= lower) & (v < upper) & np.isfinite(v)
    return np.where(inside, np.clip(idx, 0, bins - 1), -1).astype(np.int64)


# ======================================================================================================================
# Pipeline side: runs in the pipeline's venv (numpy only); each call runs this file in the tumult peer's venv.
# ======================================================================================================================

def values_from_counts(counts: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """A histogram of counts as records: count[i] values at the centre of bin i of [lower, upper). Tumult counts rows
    (a count has no weights), so a histogram is given to `histogram_counts` this way."""
    counts = np.asarray(counts).ravel()
    if np.any(counts < 0) or np.any(counts != np.round(counts)):
        raise ValueError("counts must be non-negative integers")
    width = (upper - lower) / counts.size
    return np.repeat(lower + (np.arange(counts.size) + 0.5) * width, counts.astype(np.int64))


def histogram_counts(values: np.ndarray, lower: float, upper: float, bins: int, epsilon: float, runs: int, *,
                     python: str | None = None, timings: dict | None = None) -> np.ndarray:
    """(runs, bins): Tumult's pure epsilon-DP group-by counts of the values' equal-width bins of [lower, upper)."""
    if bins < 1 or not upper > lower:
        raise ValueError("need bins >= 1 and upper > lower")
    out = _call("histogram", values, lower, upper, epsilon, runs, bins=bins, python=python, timings=timings)
    return out.reshape(runs, bins)


def mean(values: np.ndarray, lower: float, upper: float, epsilon: float, runs: int, *,
         python: str | None = None, timings: dict | None = None) -> np.ndarray:
    """(runs,): Tumult's pure epsilon-DP average of the values clamped to [lower, upper] (Laplace noise)."""
    return _call("mean", values, lower, upper, epsilon, runs, python=python, timings=timings).reshape(runs)


def mean_zcdp(values: np.ndarray, lower: float, upper: float, rho: float, runs: int, *,
              python: str | None = None, timings: dict | None = None) -> np.ndarray:
    """(runs,): Tumult's rho-zCDP average of the values clamped to [lower, upper] (Gaussian noise)."""
    return _call("mean_zcdp", values, lower, upper, rho, runs, python=python, timings=timings).reshape(runs)


def peer_python(python: str | None = None, *, log=print) -> str:
    """The tumult venv's interpreter: `python` if given, else the cached venv's (created on first use)."""
    if python:
        return python
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _peer_venv import ensure

    return ensure("tumult", log=log)


def _call(task: str, values: np.ndarray, lower: float, upper: float, budget: float, runs: int, *, bins: int = 0,
          python: str | None, timings: dict | None) -> np.ndarray:
    if not (budget > 0 and runs >= 1 and upper > lower):
        raise ValueError("need a positive budget, runs >= 1 and upper > lower")
    python = peer_python(python)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tumult-peer-") as tmp:
        src, dst, info = Path(tmp) / "values.npy", Path(tmp) / "out.npy", Path(tmp) / "info.json"
        np.save(src, np.asarray(values, dtype=np.float64).ravel())
        cmd = [python, str(Path(__file__).resolve()), task, str(src), str(dst), str(info),
               "--lower", repr(float(lower)), "--upper", repr(float(upper)), "--bins", str(bins),
               "--budget", repr(float(budget)), "--runs", str(runs)]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if done.returncode != 0:  # Spark's log is long: its tail and the Python traceback are what tell
            tail = "\n".join((done.stderr or "").strip().splitlines()[-40:])
            raise RuntimeError(f"the Tumult peer failed (exit {done.returncode}): {' '.join(cmd[:3])} ...\n{tail}")
        released = np.load(dst)
        if timings is not None:
            timings.update(json.loads(info.read_text()))
            timings["call_s"] = time.perf_counter() - t0
    return released


# ======================================================================================================================
# Peer side: runs in the tumult venv (tmlt.analytics, pyspark); imports them only here.
# ======================================================================================================================

def start_spark(tmp: str):
    """One local SparkSession for the whole call, its warehouse (Tumult's tables) and scratch inside `tmp`."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers must be this venv's (they unpickle tmlt)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("dprelease-tumult-peer")
             .config("spark.sql.warehouse.dir", str(Path(tmp) / "spark-warehouse"))
             .config("spark.local.dir", str(Path(tmp) / "spark-local"))
             .config("spark.sql.shuffle.partitions", "2")  # 200 by default: tiny tasks that dominate a run
             .config("spark.default.parallelism", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             # tmlt.core's get_java11_config (Java 11+): netty's reflective access
             .config("spark.driver.extraJavaOptions", "-Dio.netty.tryReflectionSetAccessible=true")
             .config("spark.executor.extraJavaOptions", "-Dio.netty.tryReflectionSetAccessible=true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _noise(session, query, budget) -> list[dict]:
    """Tumult's own account of the noise it adds (a private API, read before the evaluation: None if it moved)."""
    try:
        return [{k: str(v) for k, v in d.items()} for d in session._noise_info(query, budget)]
    except Exception:  # informational only
        return None


def peer_histogram_counts(spark, values, lower, upper, bins, epsilon, runs) -> tuple[np.ndarray, dict]:
    import pandas as pd
    from tmlt.analytics import AddOneRow, KeySet, PureDPBudget, QueryBuilder, Session

    idx = bin_index(values, lower, upper, bins)
    sdf = spark.createDataFrame(pd.DataFrame({"bin": idx[idx >= 0]}), schema="bin long").cache()
    sdf.count()
    keys = KeySet.from_dict({"bin": list(range(bins))})
    out, seconds, noise = np.zeros((runs, bins)), [], None
    for r in range(runs):
        t0 = time.perf_counter()
        session = Session.from_dataframe(PureDPBudget(epsilon), SOURCE, sdf, protected_change=AddOneRow())
        query = QueryBuilder(SOURCE).groupby(keys).count(name="count")
        if r == 0:
            noise = _noise(session, query, PureDPBudget(epsilon))
        got = session.evaluate(query, PureDPBudget(epsilon)).toPandas()
        out[r, got["bin"].to_numpy()] = got["count"].to_numpy()
        seconds.append(time.perf_counter() - t0)
    return out, {"run_s": seconds, "noise": noise}


def peer_mean(spark, values, lower, upper, budget, runs, zcdp: bool) -> tuple[np.ndarray, dict]:
    import pandas as pd
    from tmlt.analytics import AddOneRow, PureDPBudget, QueryBuilder, RhoZCDPBudget, Session

    make_budget = RhoZCDPBudget if zcdp else PureDPBudget
    x = np.asarray(values, dtype=np.float64).ravel()
    sdf = spark.createDataFrame(pd.DataFrame({"x": x}), schema="x double").cache()
    sdf.count()
    out, seconds, noise = np.zeros(runs), [], None
    for r in range(runs):
        t0 = time.perf_counter()
        session = Session.from_dataframe(make_budget(budget), SOURCE, sdf, protected_change=AddOneRow())
        query = QueryBuilder(SOURCE).average("x", low=lower, high=upper, name="mean")
        if r == 0:
            noise = _noise(session, query, make_budget(budget))
        out[r] = float(session.evaluate(query, make_budget(budget)).toPandas()["mean"].iloc[0])
        seconds.append(time.perf_counter() - t0)
    return out, {"run_s": seconds, "noise": noise}


def peer_main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task", choices=("histogram", "mean", "mean_zcdp"))
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("info")
    ap.add_argument("--lower", type=float, required=True)
    ap.add_argument("--upper", type=float, required=True)
    ap.add_argument("--bins", type=int, default=0)
    ap.add_argument("--budget", type=float, required=True, help="epsilon (pure DP) or rho (mean_zcdp)")
    ap.add_argument("--runs", type=int, required=True)
    args = ap.parse_args()
    values = np.load(args.src)
    tmp = str(Path(args.dst).parent)
    t0 = time.perf_counter()
    spark = start_spark(tmp)
    started = time.perf_counter() - t0
    if args.task == "histogram":
        out, info = peer_histogram_counts(spark, values, args.lower, args.upper, args.bins, args.budget, args.runs)
    else:
        out, info = peer_mean(spark, values, args.lower, args.upper, args.budget, args.runs, args.task == "mean_zcdp")
    np.save(args.dst, out)
    import pyspark
    import tmlt.analytics
    from tmlt.analytics.utils import cleanup

    info.update(spark_start_s=started, runs_s=sum(info["run_s"]), per_run_s=sum(info["run_s"]) / args.runs,
                tmlt_analytics=tmlt.analytics.__version__, pyspark=pyspark.__version__)
    Path(args.info).write_text(json.dumps(info))
    cleanup()  # Tumult's temporary tables, before Spark stops
    spark.stop()


if __name__ == "__main__":
    peer_main()
