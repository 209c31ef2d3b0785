"""Every published value with its uncertainty (docs/design.md, "Downstream"), made in the postprocess stage after the
kind's own products:

* direct measurements (`ReleaseKind.direct_values`): each measurement file holding them is published at the
  release's top level under its own name, its value columns followed by v_std (the plan entry's noise standard
  deviation), v_lo and v_hi (the exact two-sided interval at the spec's confidence, `dpalgos.intervals`);
* postprocessed products (`ReleaseKind.bootstrap`): a parametric bootstrap. Each of B replicates draws the plan's
  noise around the measurements the released estimate implies, reruns the kind's postprocessing, and the
  products' columns get the replicates' standard deviation and percentile interval; the replicates themselves
  are published (<stem>_replicates.parquet) so that any derived query gets an interval (`tasks.replicates`);
* uncertainty.json: the method of every column, B, the confidence, the bootstrap's seed; the manifest quotes it.

This is post-processing and stays so: it reads the committed measurements, the plan committed beside them, the
spec's public parameters and the staged products, and its randomness is a numpy generator seeded from the
measurements' values (public, and the same on every rerun: a resumed release is byte-identical). It never draws
from the noise source, never reads internal/ or the source data, and charges nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from threadpoolctl import threadpool_limits

from data_contracts import suites
from data_contracts.suites import Contract
from dpalgos.intervals import min_replicates, percentile_interval
from tasks.kinds.uncertainty import (
    Bootstrap,
    Direct,
    Product,
    bootstrap_planned,
    bounded_interval,
    replicates_of,
    skipped_reason,
)
from tasks.run import committed_plan, measurement_content

UNCERTAINTY = "uncertainty.json"
#: The spawn key of the direct intervals' public coins, beside the bootstrap's replicates (keys 0..B-1).
DIRECT_COINS = 2 ** 32 - 1
BOUNDED = ("the interval of the signed estimate (whose sums are unbiased) cut at zero, where every true count lies, "
           "and widened to hold this non-negative value: it holds the truth whenever the signed one does")
PRIVACY = ("post-processing only: computed from the released measurements, the noise laws of the plan committed "
           "with them, the spec's public parameters and public randomness seeded from the measurements' values; "
           "no noise source, no raw data and nothing in internal/ is read, and nothing is charged")
PERCENTILE = ("percentile interval of the B replicates: the k-th smallest and k-th largest, k = floor((B + 1)(1 - "
              "confidence) / 2); coverage >= confidence when the replicates' errors mimic the release's")


def seed_of(measurements: Path) -> int:
    """The bootstrap's seed: 128 bits of sha256 over the committed measurements, each file's name and content (a
    Parquet file's columns and values, not its key-value metadata, which publishing adds). Public (anyone holding
    the release recomputes it from the published copy) and fixed by the measurements, so that a rerun gives the
    same replicates."""
    h = hashlib.sha256(b"dprelease uncertainty v1")
    for f in sorted(Path(measurements).iterdir()):
        h.update(f.name.encode() + b"\0" + measurement_content(f))
    return int(h.hexdigest()[:32], 16)


@dataclass(frozen=True)
class Made:
    """What `add_uncertainty` wrote: the files (relative to the release) and the contract of each."""
    files: list[str]
    contracts: dict[str, Contract]


def add_uncertainty(kind, measurements: Path, staging: Path, log) -> Made:
    """Annotate the direct measurements, run the bootstrap of the postprocessed products, write
    uncertainty.json. Reads nothing but `measurements`, the committed plan, the spec and `staging`."""
    plan = committed_plan(measurements)
    confidence = kind.spec.release.confidence
    made = Made([], {})
    seed = seed_of(measurements)
    coins = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(DIRECT_COINS,)))
    direct = _annotate(kind.direct_values(measurements, plan), measurements, staging, confidence, made, coins)
    count = replicates_of(kind, measurements)
    planned = bootstrap_planned(kind)
    boot = kind.bootstrap(measurements, staging, plan) if planned else None
    skipped = None if planned else kind.unreplicated
    if boot is not None and count:
        log.info("bootstrap of the postprocessed products: %d replicates (post-processing; seed from the "
                 "measurements)", count)
        _replicate(boot, count, seed, staging, confidence, made)
    elif boot is not None:
        skipped = (f"skipped by default: {skipped_reason(kind, measurements)}; the intervals of these products "
                   f"are null. Set the spec's replicates (at least {min_replicates(confidence)}) to run it")
        log.info("bootstrap of the postprocessed products %s", skipped)
        _write_null_intervals(boot, staging, made)
        boot = None
    summary = _summary(direct, boot, count, seed, confidence, skipped)
    (staging / UNCERTAINTY).write_text(json.dumps(summary, indent=2))
    made.files.append(UNCERTAINTY)
    return made


def _annotate(directs: list[Direct], measurements: Path, staging: Path, confidence: float, made: Made,
              coins: np.random.Generator) -> dict:
    """Every measurement file with direct values, published at the top level with their uncertainty columns."""
    described = {}
    for name in dict.fromkeys(d.file for d in directs):
        table = pq.read_table(measurements / name)
        mine = [d for d in directs if d.file == name]
        columns = list(dict.fromkeys(d.column for d in mine))
        extra = {}
        for column in columns:
            values = table.column(column).to_numpy().astype(np.float64)
            extra.update(_direct_columns(column, values, [d for d in mine if d.column == column], confidence,
                                         coins.random(values.shape)))
        pq.write_table(_appended(table, extra), staging / name)
        made.files.append(name)
        made.contracts[name] = suites.uncertainty_columns(f"uncertainty_{Path(name).stem}", table.column_names,
                                                          columns, nullable=True)
        described[name] = {c: [_law_json(d, confidence) for d in mine if d.column == c] for c in columns}
    return described


def _direct_columns(column: str, values: np.ndarray, directs: list[Direct], confidence: float,
                    coins: np.ndarray) -> dict:
    """v_std, v_lo, v_hi of a direct column: the law's exact interval, its half-width randomised between h and
    h - 1 by the values' public coins for integer laws so that it covers exactly at the confidence."""
    std, half = np.full(values.shape, np.nan), np.full(values.shape, np.nan)
    for d in directs:
        if d.law is not None:
            rows = np.ones(values.shape, dtype=bool) if d.rows is None else d.rows
            std[rows], half[rows] = d.law.std(), d.law.randomised_half_widths(confidence, coins[rows])
    std[~np.isfinite(values)] = np.nan  # a value not released (NaN) has no interval
    return {f"{column}_std": std, f"{column}_lo": values - half, f"{column}_hi": values + half}


def _law_json(d: Direct, confidence: float) -> dict:
    if d.law is None:
        return {"mechanism": d.mechanism, "method": "analytic", "drawn": False}
    rows = None if d.rows is None else int(np.count_nonzero(d.rows))
    h = d.law.half_width(confidence)
    out = {"mechanism": d.mechanism, "method": "analytic", "distribution": ("discrete " if d.law.integer else "")
           + d.law.distribution, "scale": d.law.scale, "std": d.law.std(), "half_width": h,
           "attained_coverage": confidence, "rows": rows if rows is not None else "all"}
    if d.law.integer and h > 0:
        out["half_width_rule"] = (f"{h:g} or {h - 1:g} per value by its public coin (DIRECT_COINS), so that the "
                                  f"coverage is exactly the confidence; {h:g} alone covers "
                                  f"{d.law.attained(confidence):.4f}")
    return out


def _appended(table: pa.Table, extra: dict) -> pa.Table:
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values, type=pa.float64()))
    return table


def _replicate(boot: Bootstrap, count: int, seed: int, staging: Path, confidence: float, made: Made) -> None:
    """B reruns of the postprocessing, each on the centres plus the plan's noise drawn from the replicate's own
    public generator; then each product's intervals and replicate file."""
    # One BLAS/OpenMP thread: each rerun is small, and a pool's start-up cost 30x the work (scikit-learn's k-means
    # of a refinement: 1.2 s threaded against 40 ms on one thread, 2 loaded cores).
    with threadpool_limits(1):
        outs = [boot.rerun(_simulated(boot, rng), rng)
                for rng in map(np.random.default_rng, np.random.SeedSequence(seed).spawn(count))]
    for product in boot.products:
        values = np.stack([o[product.file] for o in outs]).astype(np.float64)  # (B, rows, columns)
        if product.intervals == "bootstrap":
            _write_intervals(product, values, staging, confidence, made)
        if product.replicates:
            _write_replicates(product, values, staging, made)


def _write_null_intervals(boot: Bootstrap, staging: Path, made: Made) -> None:
    """The products' interval columns, null: the columns their contracts expect, with nothing computed."""
    for product in boot.products:
        if product.intervals != "bootstrap":
            continue
        table = original = pq.read_table(staging / product.file)
        for name in suites.interval_columns(product.interval_columns):
            table = table.append_column(name, pa.nulls(original.num_rows, pa.float64()))
        pq.write_table(table, staging / product.file)
        if product.file not in made.files:
            made.files.append(product.file)
        made.contracts[product.file] = suites.uncertainty_columns(f"uncertainty_{Path(product.file).stem}",
                                                                  original.column_names, product.interval_columns,
                                                                  nullable=True)


def _simulated(boot: Bootstrap, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {c.mechanism: c.values + c.law.sample(rng, np.shape(c.values)) for c in boot.centers}


def _write_intervals(product: Product, values: np.ndarray, staging: Path, confidence: float, made: Made) -> None:
    """The replicated columns' percentile intervals, then each bounded column's (`bounded_interval`)."""
    table = pq.read_table(staging / product.file)
    lo, hi = percentile_interval(values, confidence)
    std = values.std(axis=0, ddof=1)
    extra = {}
    for j, column in enumerate(product.columns):
        extra.update({f"{column}_std": std[:, j], f"{column}_lo": lo[:, j], f"{column}_hi": hi[:, j]})
    for column, of in product.bounded:
        j = product.columns.index(of)
        c_lo, c_hi = bounded_interval(table.column(column).to_numpy().astype(np.float64), lo[:, j], hi[:, j])
        extra.update({f"{column}_std": std[:, j], f"{column}_lo": c_lo, f"{column}_hi": c_hi})
    pq.write_table(_appended(table, extra), staging / product.file)
    if product.file not in made.files:
        made.files.append(product.file)
    made.contracts[product.file] = suites.uncertainty_columns(f"uncertainty_{Path(product.file).stem}",
                                                              table.column_names, product.interval_columns)


def replicates_file(product: str) -> str:
    return f"{Path(product).stem}_replicates.parquet"


def _write_replicates(product: Product, values: np.ndarray, staging: Path, made: Made) -> None:
    count, rows, _ = values.shape
    name = replicates_file(product.file)
    columns = {"replicate": np.repeat(np.arange(count, dtype=np.int32), rows),
               product.index: np.tile(np.arange(rows, dtype=np.int64), count)}
    columns.update({c: values[:, :, j].reshape(-1) for j, c in enumerate(product.columns)})
    pq.write_table(pa.table(columns), staging / name)
    made.files.append(name)
    made.contracts[name] = suites.replicates(f"uncertainty_{Path(name).stem}", product.index, rows, product.columns,
                                             count)


def _product_json(p: Product) -> dict:
    out = {"columns": list(p.columns), "index": p.index, "intervals": p.intervals,
           "replicates_file": replicates_file(p.file) if p.replicates else None}
    if p.bounded:
        out["bounded"] = {c: {"of": of, "interval": BOUNDED} for c, of in p.bounded}
        out["nonnegative"] = True
    return out


def _summary(direct: dict, boot: Bootstrap | None, count: int, seed: int, confidence: float,
             skipped: str | None = None) -> dict:
    out = {"confidence": confidence, "privacy": PRIVACY,
           "columns": "each value column v of a file below is followed by v_std (standard deviation), v_lo and "
                      "v_hi (two-sided interval at the confidence)",
           "direct": {"method": "analytic: the exact quantiles of the plan entry's noise law (dpalgos/intervals.py); "
                                "for integer laws each value's half-width is h or h - 1 by a public coin (uniform "
                                "from SeedSequence(seed, spawn_key=(2^32 - 1,)), in row order) so that the coverage "
                                "is exactly the confidence",
                      "files": direct}}
    if boot is None:
        reason = skipped or ("no postprocessed product, or nothing released" if count else "replicates: 0")
        out["bootstrap"] = {"replicates": 0, "reason": reason}
        return out
    out["bootstrap"] = {
        "method": "parametric bootstrap: the plan's noise redrawn around the measurements the released estimate "
                  "implies, the kind's postprocessing rerun on each replicate", "replicates": count,
        "interval": PERCENTILE, "std": "standard deviation of the replicates (ddof 1)",
        "seed": f"{seed:032x}", "seed_derivation": "sha256 of b'dprelease uncertainty v1' and the measurement "
        "files' names and contents (sorted by name; a Parquet file's columns and values in Arrow's IPC stream "
        "format, without its key-value metadata), first 128 bits; replicate b uses SeedSequence(seed).spawn(B)[b]",
        "centers": {c.mechanism: {"distribution": ("discrete " if c.law.integer else "") + c.law.distribution,
                                  "scale": c.law.scale, "values": int(np.size(c.values))} for c in boot.centers},
        "notes": list(boot.notes),
        "products": {p.file: _product_json(p) for p in boot.products}}
    return out
