"""Functions that run on dask workers, one Parquet partition at a time, and the handle the iterative
algorithms use to reduce sufficient statistics over partitions.

No Prefect import here: workers only need numpy, pyarrow and dpalgos.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.validate import read_batches
from dpalgos.lazy import module
from tasks import scheduler, settings, storage
from tasks.errors import InputError, ReleaseError
from tasks.params import DaskSpec

sp = module("scipy.sparse")


def current_client():
    """The dask client of the running release (imported lazily: distributed costs ~1 s to import, and the
    spec and CLI modules import the kinds)."""
    from distributed import get_client

    return get_client()


def compute_with_progress(collection, prefix: str, progress) -> None:
    """Compute a dask collection on the current client, `progress.advance()` as each task whose key starts with
    `prefix` finishes (e.g. each partition written by `to_parquet`: "toparquetdata-"); without such keys (another
    dask's naming) it is computed without ticks. Errors are raised as by `compute`."""
    from distributed import as_completed

    graph = dict(collection.__dask_graph__())  # dask-expr lowers and optimises it here
    final = collection.__dask_keys__()
    while isinstance(final, list):
        final = final[0]
    ticks = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith(prefix)]
    client = current_client()
    *parts, last = client.get(graph, ticks + [final], sync=False)
    for future in as_completed(parts):
        future.result()  # a failed partition raises here, as `compute` would
        progress.advance()
    last.result()


def read_points(path: str, columns: Sequence[str]) -> np.ndarray:
    """One partition as a float64 array (n, d), columns in the given order."""
    return table_points(storage.read_table(path, columns=list(columns)), columns)


def write_points(path: str, X: np.ndarray, columns: Sequence[str]) -> None:
    storage.write_table(pa.table({c: X[:, j] for j, c in enumerate(columns)}), path)


def _capped(weights: np.ndarray, max_weight: int | None) -> tuple[np.ndarray, int]:
    """Weights capped at the public max_weight (None: no cap), and how many rows were capped."""
    if max_weight is None:
        return weights, 0
    return np.minimum(weights, max_weight), int(np.count_nonzero(weights > max_weight))


@storage.on_store
def bin_partition(src: str, dst: str, column: str, lower: float, upper: float, bins: int,
                  weight: str | None, max_weight: int | None = None) -> dict[str, int]:
    """Equal-width bin index in [0, bins) of every value over the PUBLIC [lower, upper] (values outside
    fall in the first / last bin), with the record weight capped at max_weight, a batch at a time (`read_batches`).
    Returns the capped rows."""
    capped = []

    def binned(table: pa.Table) -> pa.Table:
        b = table.column(column).to_numpy() - lower  # in place from here: one temporary a batch, not five
        b /= upper - lower
        b *= bins
        cols = {"bin": np.clip(np.floor(b, out=b), 0, bins - 1, out=b).astype(np.int32)}
        if weight:
            cols["weight"], n = _capped(table.column(weight).to_numpy(), max_weight)
            capped.append(n)
        return pa.table(cols)
    storage.write_batches(map(binned, read_batches(src, [column] + ([weight] if weight else []))), dst)
    return {"rows_capped_at_max_weight": sum(capped)}


@storage.on_store
def grid_partition(src: str, dst: str, columns: Sequence[str], lower: Sequence[float], upper: Sequence[float],
                   cells: int, weight: str | None, max_weight: int | None = None) -> dict[str, int]:
    """Row-major index of every record's cell in the grid of `cells` equal-width cells per axis over the PUBLIC
    bounds of `columns` (values outside fall in the first / last cell of their axis, as `bin_partition`'s), with
    the record weight capped at max_weight, a batch at a time. Returns the capped rows."""
    capped = []
    lo, width = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64) - np.asarray(lower)

    def celled(table: pa.Table) -> pa.Table:
        index = np.zeros(table.num_rows, dtype=np.int64)
        for k, c in enumerate(columns):
            v = table.column(c).to_numpy()
            index = index * cells + np.clip(np.floor((v - lo[k]) / width[k] * cells), 0, cells - 1).astype(np.int64)
        cols = {"cell": index}
        if weight:
            cols["weight"], n = _capped(table.column(weight).to_numpy(), max_weight)
            capped.append(n)
        return pa.table(cols)
    storage.write_batches(map(celled, read_batches(src, list(columns) + ([weight] if weight else []))), dst)
    return {"rows_capped_at_max_weight": sum(capped)}


@storage.on_store
def cell_partition(src: str, dst: str, columns: Sequence[str], levels: Sequence[Sequence[str]],
                   weight: str | None, max_weight: int | None = None, outside: int | None = None) -> dict[str, int]:
    """Row-major cell index of every record's levels in the table of shape (|levels_1|, ..., |levels_k|),
    with the record weight capped at max_weight, a batch at a time. A record with a value outside its column's public
    levels is left out, as numeric values outside their public bounds are clipped: refusing it would tell whoever
    wrote the levels whether anyone has one they left out (with `outside`, counted in that extra cell instead: the `od`
kind's noisy count of trips outside its zones). Returns the capped rows and the records left out."""
    totals = {"rows_capped_at_max_weight": 0, "rows_outside_public_levels": 0}

    def encoded(table: pa.Table) -> pa.Table:
        out, counts = _cells(table.to_pandas(), columns, levels, weight, max_weight, outside)
        for k, n in counts.items():
            totals[k] += n
        return out
    storage.write_batches(map(encoded, read_batches(src, list(columns) + ([weight] if weight else []))), dst)
    return totals


def cells_of(frame, columns, levels, outside: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The row-major cell index of every record whose levels are all public, and which records those are. With
    `outside`, every record gets a cell, the others `outside` (an extra cell counting them: the `od` kind's)."""
    import pandas as pd

    codes = np.stack([pd.Categorical(frame[c], categories=list(lv)).codes for c, lv in zip(columns, levels)]) \
        if len(columns) else np.empty((0, len(frame)), dtype=np.int8)
    inside = (codes >= 0).all(axis=0)
    cell = np.ravel_multi_index(tuple(codes[:, inside]), [len(lv) for lv in levels]).astype(np.int32)
    if outside is None:
        return cell, inside
    every = np.full(inside.size, outside, dtype=np.int32)
    every[inside] = cell
    return every, inside


def _cells(frame, columns, levels, weight, max_weight, outside=None) -> tuple[pa.Table, dict[str, int]]:
    cell, inside = cells_of(frame, columns, levels, outside)
    cols, capped = {"cell": cell}, 0
    if weight:
        w = frame[weight].to_numpy(dtype=np.float64)
        cols["weight"], capped = _capped(w[inside] if outside is None else w, max_weight)
    return pa.table(cols), {"rows_capped_at_max_weight": capped,
                            "rows_outside_public_levels": int(np.count_nonzero(~inside))}


@storage.on_store
def index_counts(path: str, index: str, weighted: bool, size: int) -> np.ndarray:
    """Exact counts (size,) of the records of one encoded partition per index (weights summed), a batch at a time."""
    total = np.zeros(size, dtype=np.float64)
    for table in read_batches(path, [index] + (["weight"] if weighted else [])):
        w = table.column("weight").to_numpy() if weighted else None
        total += np.bincount(table.column(index).to_numpy(), weights=w, minlength=size)
    return total


@storage.on_store
def ingest_file(src: str, dst: str, wanted: list[str], numeric: list[str], categorical: list[str],
                dataset_id: str, source: str) -> int:
    """One source file's `wanted` columns, numeric ones as float64, categorical ones as text value by value
    (`level_text`), into the Parquet file `dst`, a batch at a time; returns its rows. The same columns and refusals
    as `tasks.ingest.read_source` (naming `source`, the dataset's location)."""
    schema = pq_schema(src)
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise InputError(f"dataset '{dataset_id}': columns {missing} are missing from {source}")
    wrong = {c: str(schema.field(c).type) for c in numeric
             if not (pa.types.is_integer(schema.field(c).type) or pa.types.is_floating(schema.field(c).type))}
    if wrong:
        raise InputError(f"dataset '{dataset_id}': columns must be numeric, but {wrong} are not")
    rows = []

    def typed(table: pa.Table) -> pa.Table:
        rows.append(table.num_rows)
        if categorical:  # text per value through pandas, as `typed_frame` does for dask's partitions
            frame = typed_frame(table.to_pandas(), numeric, categorical)
            return pa.Table.from_pandas(frame, preserve_index=False)
        # safe=False: integers beyond 2^53 rounded to the nearest float64, as pandas' astype does
        return pa.table({c: pc.cast(table.column(c), pa.float64(), safe=False) for c in wanted})
    storage.write_batches(map(typed, read_batches(src, wanted)), dst)
    return sum(rows)


def pq_schema(location: str) -> pa.Schema:
    import pyarrow.parquet as pq

    fs, path = (None, location) if not storage.is_url(location) else storage.filesystem(location)
    return pq.read_schema(path, filesystem=fs)


def typed_frame(frame, numeric: list[str], categorical: list[str]):
    import pandas as pd

    out = {c: frame[c].astype("float64") for c in numeric}
    out.update({c: level_text(frame[c]) for c in categorical})
    return pd.DataFrame(out, index=frame.index)[list(frame.columns)]


def level_text(col):
    """A categorical column's values as text, each by itself: a whole number stored as a float (Parquet) prints
    as "1", not "1.0". Never by a test over the partition: one record's 1.5 would then turn every other record's
    "1" into "1.0", outside the public levels (one record moving every count), and change the work done."""
    import pandas as pd

    if isinstance(col.dtype, pd.CategoricalDtype):  # a writer's categories may be floats: 1.0 for 1
        return level_text(col.astype(col.dtype.categories.dtype))
    if not pd.api.types.is_float_dtype(col):
        return col.astype("string")
    col = col.astype("float64")  # a nullable Float64's NA as NaN, which the comparisons below leave null
    whole = (col % 1 == 0) & (col.abs() < 2.0 ** 53)  # NaN compares False: nulls stay null
    text = col.astype("string")
    return text.where(~whole, col.where(whole, 0.0).astype("int64").astype("string"))


def _bernoulli_rows(X, fraction: float, seed: int):
    return X if fraction >= 1.0 else X[np.random.default_rng(seed).random(X.shape[0]) < fraction]


def _add(a, b):
    if isinstance(a, tuple):
        return tuple(_add(x, y) for x, y in zip(a, b))
    return a + b


class Partitioned:
    """The partitions of a Parquet output loaded into the dask workers' memory (numpy arrays of points, or
    CSR matrices of set-valued records).

    `reduce(fn, *args)` computes fn(partition, *args) on every partition where it lives and sums the
    results (arrays, floats, or tuples of them) on the driver: only aggregates leave the workers.
    """

    def __init__(self, client, files: Sequence[Path], loader: Callable, **loader_kwargs):
        self._client = client
        self._parts = client.map(loader, [str(f) for f in files], **loader_kwargs)
        self.n_partitions = len(self._parts)

    @classmethod
    def points(cls, client, files: Sequence[Path], columns: Sequence[str]) -> "Partitioned":
        return cls(client, files, read_points, columns=list(columns))

    @classmethod
    def sets(cls, client, files: Sequence[Path], column: str, item_count: int) -> "Partitioned":
        from tasks.sets import read_sets

        return cls(client, files, read_sets, column=column, item_count=item_count)

    def map(self, fn: Callable, *args) -> list:
        """fn(partition, *args) of every partition, brought to the driver (for per-record outputs)."""
        return self._client.gather(self._client.map(fn, self._parts, *[[a] * self.n_partitions for a in args]))

    def map_seeded(self, fn: Callable, rng: np.random.Generator, *args) -> list:
        """fn(partition, seed, *args) of every partition, each with its own seed drawn from `rng`."""
        seeds = [int(s) for s in rng.integers(0, 2 ** 63 - 1, self.n_partitions)]
        return self._client.gather(self._client.map(fn, self._parts, seeds,
                                                    *[[a] * self.n_partitions for a in args]))

    def reduce(self, fn: Callable, *args, progress=None):
        """`progress`: its `advance()` is called as each partition's result arrives (one unit per partition); the
        results are summed in partition order whatever order they arrive in."""
        futures = self._client.map(fn, self._parts, *[[a] * self.n_partitions for a in args])
        if progress is not None:
            from distributed import as_completed

            for _ in as_completed(futures):
                progress.advance()
        total = None
        for result in self._client.gather(futures):
            total = result if total is None else _add(total, result)
        return total

    def sample(self, max_rows: int, total_rows: int, seed: int) -> np.ndarray:
        """A uniform sample of about `max_rows` points (all of them when there are fewer) on the driver."""
        fraction = min(1.0, max_rows / max(total_rows, 1))
        futures = self._client.map(_bernoulli_rows, self._parts, [fraction] * self.n_partitions,
                                   [seed + i for i in range(self.n_partitions)])
        parts = self._client.gather(futures)
        return sp.vstack(parts).tocsr() if sp.issparse(parts[0]) else np.concatenate(parts, axis=0)

    def collect(self):
        """Every partition, concatenated on the driver (for methods that need all points together)."""
        parts = self._client.gather(self._parts)
        return sp.vstack(parts).tocsr() if sp.issparse(parts[0]) else np.concatenate(parts, axis=0)

    def close(self) -> None:
        self._client.cancel(self._parts)


class Streamed:
    """The partitions of a Parquet output of points, read a batch at a time (`read_batches`) in every pass and never
    kept: `reduce` as `Partitioned.reduce`, with the workers' memory a batch per thread whatever the records (10^8
    points of 2 columns kept in memory were 1.6 GB). A pass reads the files again, from the page cache or the store:
    2.6 ns a value (pyarrow 26, 2026-11-29) against the pass's own work on it."""

    def __init__(self, client, files: Sequence[str], columns: Sequence[str]):
        self._client, self._files, self._columns = client, [str(f) for f in files], list(columns)
        self.n_partitions = len(self._files)

    def reduce(self, fn: Callable, *args, progress=None):
        futures = self._client.map(reduce_file, self._files, fn=fn, args=args, columns=self._columns, pure=False)
        if progress is not None:
            from distributed import as_completed

            for _ in as_completed(futures):
                progress.advance()
        total = None
        for result in self._client.gather(futures):  # in partition order, whatever order they arrive in
            total = result if total is None else _add(total, result)
        return total

    def close(self) -> None:
        pass


@storage.on_store
def reduce_file(path: str, fn: Callable, args: tuple, columns: list[str]):
    """The sum over one file's batches of fn(points of the batch, *args)."""
    total = None
    for table in read_batches(path, columns):
        result = fn(table_points(table, columns), *args)
        total = result if total is None else _add(total, result)
    return total


def table_points(table: pa.Table, columns: Sequence[str], order: str = "C") -> np.ndarray:
    """A table's columns as a float64 array (n, d), in the given order. `order="F"` (each column contiguous) for
    numpy's element-wise work over the columns: scaling 2-d points into the box took 50 ns a value row by row (numpy's
    inner loop runs over the d values of a row) and 13 column by column; the L2 projection 25 and 10 (2026-11-29).
    C (rows contiguous) for the compiled per-point kernels (Lloyd's statistics: 5.4 against 7.6)."""
    out = np.empty((table.num_rows, len(columns)), order=order)
    for j, c in enumerate(columns):
        out[:, j] = table.column(c).to_numpy()
    return out


class InMemory:
    """One in-memory partition (points, or a CSR matrix of set-valued records) behind `Partitioned`'s interface:
    a kind's measurement code runs on it as on the dask partitions (benchmarks score the kind's own code path on
    data in memory). `map_seeded` draws its one seed from `rng` as `Partitioned` draws one per partition."""
    n_partitions = 1

    def __init__(self, data):
        self.data = data

    def map(self, fn: Callable, *args) -> list:
        return [fn(self.data, *args)]

    def map_seeded(self, fn: Callable, rng: np.random.Generator, *args) -> list:
        seeds = [int(s) for s in rng.integers(0, 2 ** 63 - 1, self.n_partitions)]
        return [fn(self.data, seeds[0], *args)]

    def reduce(self, fn: Callable, *args, progress=None):
        out = fn(self.data, *args)
        if progress is not None:
            progress.advance()
        return out

    def collect(self):
        return self.data

    def close(self) -> None:
        pass


@contextlib.contextmanager
def dask_client(spec: DaskSpec, scratch: Path | None = None) -> Iterator:
    """A dask.distributed client: to the scheduler of the machine (`tasks.scheduler`: the operator's settings, else
    the team's dask configuration; never the spec's choice, since the scheduler and its workers see the raw
    partitions and the exact statistics), with its TLS credentials; or to a local cluster of the spec's size started
    here, on 127.0.0.1 with mutual TLS from temporary credentials this run alone holds (an attacker's review
    connected another local account's client to a run's plain-TCP scheduler, and a client of the same user ran code
    in a worker that read the raw copy of the data).

    A local cluster's workers keep their files (what they spill to disk when memory runs short: raw partitions)
    in `scratch`, a folder of the run's owner-only internal/, not in dask's default temporary folder, which other
    local accounts can list; an operator's workers spill where their `--local-directory` says."""
    from distributed import Client, LocalCluster

    from tasks.threads import limit_threads  # imports distributed, as this function does

    choice = scheduler.chosen()
    address, wait = choice.address, settings.current().dask_wait_seconds
    if address:
        # The client's timeout bounds its first connection and its reconnection to a restarted scheduler alike: the
        # operator's dask_wait_seconds (tasks/cluster.py), at least the 30 s a connection took before it.
        try:
            client = Client(address, timeout=f"{max(wait, 30.0)}s", set_as_default=True, security=choice.security)
        except (OSError, TimeoutError) as exc:  # before any data is sent; its type is enough
            raise ReleaseError(f"cannot reach the dask scheduler {address} (from {choice.source}): "
                               f"{type(exc).__name__}") from None
        with client, _watched(client, choice.shown, wait):
            limit_threads(client)
            yield client
        return
    # Every listener on loopback (the scheduler, the workers, their HTTP servers, the dashboard), every connection
    # authenticated both ways by certificates of a temporary CA held in this process's memory.
    if scratch is not None:
        scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    with LocalCluster(n_workers=spec.n_workers, threads_per_worker=spec.threads_per_worker,
                      processes=spec.processes, host="127.0.0.1", security=True,
                      dashboard_address="127.0.0.1:0" if settings.current().dask_dashboard else None,
                      local_directory=str(scratch) if scratch is not None else None) as cluster, \
            Client(cluster, set_as_default=True) as client, _watched(client, "the run's local dask scheduler", wait):
        limit_threads(client)
        yield client


@contextlib.contextmanager
def _watched(client, shown: str, seconds: float) -> Iterator:
    """The cluster's health watched while the release runs (`tasks.cluster.Watch`)."""
    from tasks.cluster import Watch

    watch = Watch(client, shown, seconds).start()
    try:
        yield watch
    finally:
        watch.stop()
