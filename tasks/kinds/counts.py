"""Shared steps of the count-based kinds (histogram, contingency table, matrix mechanism): encode every
record as a bin / cell index on dask, count records per index with only the counts reaching the driver, and
bootstrap the released signed estimate."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts.validate import parquet_files
from tasks import storage
from tasks.kinds.uncertainty import Bootstrap, Center, Product
from tasks.partitions import bin_partition, cell_partition, current_client, grid_partition, index_counts
from tasks.progress import Progress, gather
from tasks.run import RunPaths, StageOutput

#: The encoding's diagnostics in internal/ (raw-derived counts).
ENCODING = "encoding.json"


def encode(run: RunPaths, ingested: StageOutput, fn, log=None) -> StageOutput:
    """Apply fn(src, dst) -> {diagnostic: count} to every ingested partition, writing internal/encoded/; the
    summed counts (rows whose weight was capped at max_weight, records left out for a level outside the public
    ones) go to internal/encoding.json (raw-derived: never logged; the log names the file whatever they are)."""
    out = run.stage("encoded")
    storage.remove(out)
    storage.makedirs(out)
    files = parquet_files(ingested.path)
    futures = current_client().map(fn, files, [storage.join(out, storage.name(f)) for f in files])
    parts = gather(current_client(), futures, Progress(log, "partitions encoded", len(files)) if log else None)
    counts = {k: int(sum(p.get(k, 0) for p in parts)) for k in sorted({k for p in parts for k in p})}
    (run.internal / ENCODING).write_text(json.dumps(counts))
    if log:
        log.info("records capped or left out by the public weights and levels: counted in %s (internal)",
                 (run.internal / ENCODING).resolve())
    return StageOutput(out, ingested.rows, len(files))


def _weights(spec) -> dict:
    return {"weight": spec.dataset.weight_column, "max_weight": spec.dataset.max_weight}


def encode_bins(spec, run: RunPaths, ingested: StageOutput, bins: int, log=None) -> StageOutput:
    (column, (lo, hi)), = spec.dataset.bounds.items()
    return encode(run, ingested, partial(bin_partition, column=column, lower=lo, upper=hi, bins=bins,
                                         **_weights(spec)), log)


def encode_grid(spec, run: RunPaths, ingested: StageOutput, cells: int, log=None) -> StageOutput:
    """Every record's row-major cell in the grid of `cells` per axis over the public bounds, in their order."""
    bounds = spec.dataset.bounds
    return encode(run, ingested, partial(grid_partition, columns=list(bounds), lower=[b[0] for b in bounds.values()],
                                         upper=[b[1] for b in bounds.values()], cells=cells, **_weights(spec)), log)


def encode_cells(spec, run: RunPaths, ingested: StageOutput, log=None) -> StageOutput:
    cats = spec.dataset.categories
    return encode(run, ingested, partial(cell_partition, columns=list(cats), levels=list(cats.values()),
                                         **_weights(spec)), log)


def count(spec, prepared: StageOutput, index: str, size: int) -> np.ndarray:
    """Exact record counts per index (raw-derived: noise is added by the caller, or it stays internal)."""
    files = parquet_files(prepared.path)
    futures = current_client().map(index_counts, files, index=index,
                                   weighted=spec.dataset.weight_column is not None, size=size)
    return np.sum(current_client().gather(futures), axis=0)


def write_vector(path, index: str, values: dict[str, np.ndarray], **extra) -> None:
    n = len(next(iter(values.values())))
    pq.write_table(pa.table({index: np.arange(n, dtype=np.int64), **extra, **values}), path)


def read_column(path, column: str) -> np.ndarray:
    return pq.read_table(path, columns=[column]).column(column).to_numpy()


#: What every count kind says of its two count columns' intervals (uncertainty.json's notes).
SIGNED_NOTE = ("queries are answered from `estimate` (signed least squares: unbiased sums); `count` (non-negative "
               "per cell) gets the estimate's interval cut at zero and widened to hold it")


def signed_bootstrap(product: str, index: str, entry: str, law, implied: np.ndarray, solve, *, also=(),
                     notes=()) -> Bootstrap:
    """The count kinds' parametric bootstrap: around the released signed estimate, whose noiseless measurements
    (`implied`: the plan entry's answers on it) get the entry's noise `law` again and `solve` (noisy answers ->
    {file: values}) estimates anew. The estimate is linear in the noise, so each replicate's error has exactly the
    release's law: the intervals of every sum hold at their confidence, on any data. `count` is bounded by
    `estimate`'s interval; `also`: further products (their own Product rows)."""
    return Bootstrap(products=(Product(product, index, ("estimate",), bounded=(("count", "estimate"),)), *also),
                     centers=(Center(entry, implied, law),),
                     rerun=lambda noisy, rng: solve(noisy[entry]), notes=(SIGNED_NOTE, *notes))
