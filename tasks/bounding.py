"""Contribution bounding of trips per user (the `od` kind with a user column): every user keeps at most k of their
trips, k PUBLIC, chosen by a keyed hash so that the choice is a uniform random k-subset of the user's own trips,
whatever the order of the rows, the files or the shuffle.

On dask, in two passes over the records, with only count vectors reaching the driver:
  1. `scatter_trips` (prepare): every ingested partition's trips encoded as a cell of the origin-destination table
     (`outside` for an origin or destination outside the public zones) and written into one file per bucket of users
     (a hash of the user id): every trip of a user lands in the same bucket, which one worker reads whole;
  2. `bucket_counts` (the DP measurement): per bucket, `kept` chooses each user's k trips, and the bucket's trips
     kept are counted per cell. The driver sums the buckets' count vectors and adds the noise.

The sensitivity (ours; checked by exhaustive search on small cases and by an empirical audit, tests/test_od.py).
Claim: for neighbours D and D' = D plus one user u with any trips, and for every key K, the count vectors c_K(D) and
c_K(D') (cells and the outside cell) of the trips `kept` differ by at most k in L1. Proof: `kept` decides the trips
of a user v from K and v's own multiset of trips only (the priority of v's j-th trip to cell c is SipHash_K(v|c|j),
the k smallest are kept, ties broken by (c, j)); v's trips are the same in D and D' for every v != u, so v keeps the
same trips in both. Hence c_K(D') - c_K(D) is the count vector of u's kept trips: non-negative, summing to at most k,
so its L1 norm is at most k. The mechanism adds Laplace noise of scale k / epsilon to c_K, which is epsilon-DP for
each fixed K; K is drawn independently of the data, so the release, a mixture over K of epsilon-DP mechanisms with
the same mixing weights under D and D', is epsilon-DP. (A user id must be one unit: two users sharing an id would be
one unit of 2k trips' influence; the id is the data's, the operator's binding of `user_column`.)

Why a keyed hash and not "the first k": after a shuffle the order of a user's rows is the order in which partitions
arrived, which depends on other users' data (block boundaries, worker timing). A choice by row order would make user
v's kept trips depend on whether user u is in the data, and the sensitivity argument (below) would not hold. The
choice by `kept` depends on the secret key and the user's own multiset of trips only.
"""

from __future__ import annotations

import string
from typing import Sequence

import numpy as np
import pyarrow as pa

from data_contracts.validate import read_batches
from tasks import storage
from tasks.partitions import cells_of

#: pandas' hash key is 16 characters (SipHash-2-4's 128-bit key); drawn from 62 symbols: about 95 bits of it.
KEY_LENGTH = 16
_KEY_SYMBOLS = string.ascii_letters + string.digits


def secret_key(rng: np.random.Generator) -> str:
    """The key of one release's choice of trips, from the release's secret generator (OS entropy in production, the
    seed in test mode): never written anywhere, never published."""
    return "".join(_KEY_SYMBOLS[i] for i in rng.integers(0, len(_KEY_SYMBOLS), KEY_LENGTH))


def bucket_file(dst: str, bucket: int) -> str:
    """The file of one bucket's trips from the partition that `dst` names: part.3.parquet -> part.3.b00012.parquet."""
    return f"{dst.removesuffix('.parquet')}.b{bucket:05d}.parquet"


def _buckets_of(users, buckets: int) -> np.ndarray:
    """The bucket of every user id: a fixed (unkeyed) hash of the id, so that a user's rows meet in one bucket."""
    import pandas as pd

    hashed = pd.util.hash_pandas_object(pd.Series(users, dtype=object), index=False).to_numpy()
    return (hashed % np.uint64(buckets)).astype(np.int64)


@storage.on_store
def scatter_trips(src: str, dst: str, columns: Sequence[str], levels: Sequence[Sequence[str]], user: str,
                  buckets: int) -> dict[str, int]:
    """One ingested partition's trips as (cell, user) rows, into `buckets` files beside `dst` (`bucket_file`; empty
    ones too: the work does not depend on which buckets the users fall in). Returns the trips outside the zones
    (raw-derived: internal diagnostics only)."""
    outside = len(levels[0]) * len(levels[1])
    frames, left_out = [], 0
    for table in read_batches(src, list(columns) + [user]):
        frame = table.to_pandas()
        cell, _ = cells_of(frame, columns, levels, outside=outside)
        left_out += int(np.count_nonzero(cell == outside))
        frames.append((cell, frame[user].astype("string").to_numpy(dtype=object)))
    cells = np.concatenate([c for c, _ in frames]) if frames else np.zeros(0, np.int32)
    users = np.concatenate([u for _, u in frames]) if frames else np.zeros(0, object)
    which = _buckets_of(users, buckets)
    for b in range(buckets):
        rows = which == b
        storage.write_table(pa.table({"cell": pa.array(cells[rows], pa.int32()),
                                      "user": pa.array(users[rows], pa.string())}),
                            bucket_file(dst, b))
    return {"trips_outside_public_zones": left_out}


def kept(cells: np.ndarray, users: np.ndarray, k: int, key: str) -> np.ndarray:
    """Which trips are kept: for every user, the k whose priority is smallest (all of them if fewer), the priority of
    the j-th trip of user u to cell c being SipHash_key("u|c|j"). Identical trips of a user are interchangeable and
    numbered j = 0, 1, ... whatever their order, so the trips kept (as cells) are a function of the key and the
    user's own multiset of trips alone; with a uniformly random secret key the priorities of distinct (u, c, j) are
    (computationally) independent and uniform, and the kept trips a uniform random k-subset of each user's trips,
    independently across users. Ties (a 64-bit collision) are broken by (c, j), never by row order."""
    import pandas as pd

    if cells.size == 0:
        return np.zeros(0, dtype=bool)
    cells = np.asarray(cells, dtype=np.int64)
    user_code = pd.factorize(np.asarray(users, dtype=object))[0]
    # j: the trip's number among the user's trips to the same cell (a stable sort keeps their order; any order of
    # identical trips gives the same numbered multiset)
    by_pair = np.lexsort((cells, user_code))
    j = np.empty(cells.size, dtype=np.int64)
    j[by_pair] = _rank_in_runs(user_code[by_pair] * (int(cells.max()) + 1) + cells[by_pair])
    text = np.array([f"{u}|{c}|{i}" for u, c, i in zip(users, cells.tolist(), j.tolist())], dtype=object)
    priority = pd.util.hash_array(text, hash_key=key, categorize=False)
    order = np.lexsort((j, cells, priority, user_code))
    keep = np.zeros(order.size, dtype=bool)
    keep[order[_rank_in_runs(user_code[order]) < k]] = True
    return keep


def _rank_in_runs(sorted_keys: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each run of equal values of a sorted array."""
    index = np.arange(sorted_keys.size)
    start = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
    return index - np.maximum.accumulate(np.where(start, index, 0))


@storage.on_store
def bucket_counts(files: Sequence[str], k: int | None, secret: str, size: int) -> np.ndarray:
    """Trips per cell (size,) of one bucket's files, each user's bounded to k by `kept` under the key `secret` (k
    None: every trip, the unbounded table the internal evaluation compares with). Not called `key`: that is dask's
    name of a task, which the scheduler logs."""
    parts = [storage.read_table(f, ["cell", "user"]) for f in files]
    cells = np.concatenate([p.column("cell").to_numpy() for p in parts]).astype(np.int64)
    if k is not None:
        users = np.concatenate([p.column("user").to_numpy(zero_copy_only=False) for p in parts])
        cells = cells[kept(cells, users, k, secret)]
    return np.bincount(cells, minlength=size).astype(np.float64)


def buckets(files: Sequence[str]) -> list[list[str]]:
    """The prepared files grouped by bucket (their names say which: `bucket_file`)."""
    groups: dict[str, list[str]] = {}
    for f in sorted(files):
        groups.setdefault(f.removesuffix(".parquet").rsplit(".", 1)[-1], []).append(f)
    return [groups[b] for b in sorted(groups)]
