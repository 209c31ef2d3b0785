"""Counting-query evaluation of synthetic set-valued records (Acs et al. §6.3) and its baselines.

Queries: random item sets in 5 length buckets, the length of a query of bucket i uniform in
((i-1)/5 m, i/5 m], its items uniform. Two classes:
  * linear: Q_p(D) = sum over records of |record & p| (a linear function of the item histogram);
  * any-of: Q_p(D) = number of records with at least one item of p.
Relative error |Q(D) - Q(D^)| / max(Q(D), s), sanity bound s = 0.1% of |D|.

Baselines: MWEM (Hardt et al.) on the item histogram for the linear class, with records clipped to at most
`max_items` items (L1 sensitivity max_items; `mwem_linear` takes the counts of clipped records, or of records
weighted by min(1, max_items / |record|), same bound). The any-of class's baseline, independent items from DP
item totals and record lengths at DPGM's (epsilon, delta), is `dpgm.independent_items` (DPGM with one cluster and
no model).
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from dpalgos import baselines
from dpalgos.mechanisms import laplace_mechanism

BUCKETS = 5


def random_queries(m: int, n: int = 1000, rng: np.random.Generator | None = None) -> tuple[sp.csr_matrix, np.ndarray]:
    """(n, m) 0/1 query matrix and the bucket (0..4) of every query."""
    rng = rng or np.random.default_rng(0)
    buckets = np.arange(n) % BUCKETS
    rows, cols = [], []
    for i, b in enumerate(buckets):
        lo, hi = int(np.floor(b / BUCKETS * m)) + 1, max(int(np.floor((b + 1) / BUCKETS * m)), 1)
        size = int(rng.integers(min(lo, hi), hi + 1))
        cols.append(rng.choice(m, size, replace=False))
        rows.append(np.full(size, i))
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    return sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, cols)), shape=(n, m)), buckets


def item_counts(X: sp.csr_matrix) -> np.ndarray:
    return np.asarray(X.sum(axis=0), dtype=np.float64).ravel()


def linear_answers(counts: np.ndarray, Q: sp.csr_matrix) -> np.ndarray:
    return np.asarray(Q @ counts).ravel()


def anyof_answers(X: sp.csr_matrix, Q: sp.csr_matrix, planes: int = 16) -> np.ndarray:
    """Number of records of X (N, m) hitting each query of Q (n_queries, m) (additive over row chunks and
    partitions). A record's hits are the OR of its items' query bitmasks (`item_masks`), added to bit-sliced
    counters (`_anyof`): about (|record| + 2) x n_queries / 64 word operations per record, where a sparse
    records times dense queries product costs |record| x n_queries multiply-adds."""
    X = sp.csr_matrix(X)
    counts = _anyof(X.indptr.astype(np.int64), X.indices.astype(np.int64), item_masks(Q), Q.shape[0], planes)
    return counts.astype(np.float64)


def item_masks(Q: sp.csr_matrix) -> np.ndarray:
    """(m, ceil(n_queries / 64)) uint64: bit q % 64 of word q // 64 of row j is set when item j is in query q."""
    Q = Q.tocoo()
    masks = np.zeros((Q.shape[1], (Q.shape[0] + 63) // 64), dtype=np.uint64)
    np.bitwise_or.at(masks, (Q.col, Q.row // 64), np.left_shift(np.uint64(1), (Q.row % 64).astype(np.uint64)))
    return masks


@numba.njit(cache=True, nogil=True)
def _anyof(indptr, indices, masks, n_queries, planes):
    """Per query, the number of records whose items' masks OR to a set bit. The per-query counts are kept
    bit-sliced (plane p holds bit p of every query's count: a record adds its hit mask with a ripple carry,
    two word operations per word amortised) and flushed to integers every 2^planes - 1 records, before any
    count can overflow its planes."""
    W = masks.shape[1]
    sliced = np.zeros((planes, W), dtype=np.uint64)
    counts = np.zeros(n_queries, dtype=np.int64)
    hit = np.empty(W, dtype=np.uint64)
    pending, capacity = 0, (1 << planes) - 1
    for i in range(indptr.size - 1):
        if indptr[i] == indptr[i + 1]:
            continue
        hit[:] = 0
        for k in range(indptr[i], indptr[i + 1]):
            for w in range(W):
                hit[w] |= masks[indices[k], w]
        for w in range(W):
            carry, p = hit[w], 0
            while carry != 0:
                both = sliced[p, w] & carry
                sliced[p, w] ^= carry
                carry, p = both, p + 1
        pending += 1
        if pending == capacity:
            _flush(sliced, counts)
            pending = 0
    _flush(sliced, counts)
    return counts


@numba.njit(cache=True, inline="always")
def _flush(sliced, counts):
    one = np.uint64(1)
    for p in range(sliced.shape[0]):
        for w in range(sliced.shape[1]):
            word = sliced[p, w]
            for b in range(64):
                q = w * 64 + b
                if q < counts.size and (word >> np.uint64(b)) & one:
                    counts[q] += 1 << p
            sliced[p, w] = 0


def relative_errors(true: np.ndarray, est: np.ndarray, n_records: int) -> np.ndarray:
    sanity = 0.001 * n_records
    return np.abs(true - est) / np.maximum(true, sanity)


def by_bucket(errors: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    return np.array([errors[buckets == b].mean() for b in range(BUCKETS)])


def clip_records(X: sp.csr_matrix, max_items: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Keep at most max_items random items of every record (bounds one record's L1 contribution)."""
    X = X.tocsr()
    lengths = np.diff(X.indptr)
    keys = np.repeat(np.arange(X.shape[0]), lengths) + rng.random(X.nnz)  # random order within each row
    order = np.argsort(keys, kind="stable")
    rank = np.arange(X.nnz) - np.repeat(X.indptr[:-1], lengths)
    keep = np.zeros(X.nnz, dtype=bool)
    keep[order[rank < max_items]] = True
    rows = np.repeat(np.arange(X.shape[0]), lengths)
    return sp.csr_matrix((X.data[keep], (rows[keep], X.indices[keep])), shape=X.shape)


def mwem_linear(clipped_counts: np.ndarray, Q: sp.csr_matrix, *, epsilon: float, max_items: int, rounds: int,
                rng: np.random.Generator, update_passes: int = 10) -> np.ndarray:
    """MWEM over the item histogram h (the linear queries are Q h). One record changes h by at most max_items
    in L1, so the total and every query answer by at most max_items: 10% of epsilon measures the total
    (Laplace), the rest goes to the rounds of `baselines.mwem` with that sensitivity."""
    # Sensitivity max_items: one record holds at most max_items (weighted) items.
    total = max(float(laplace_mechanism(clipped_counts.sum(), sensitivity=max_items, epsilon=0.1 * epsilon,
                                        rng=rng)), 1.0)
    return baselines.mwem(clipped_counts, Q.toarray(), epsilon=0.9 * epsilon, rounds=rounds, total=total, rng=rng,
                          update_passes=update_passes, sensitivity=max_items)


def record_weights(X: sp.csr_matrix, max_items: int) -> np.ndarray:
    """min(1, max_items / |record|) per record: weighted, one record holds at most max_items items."""
    return np.minimum(1.0, max_items / np.maximum(np.diff(X.indptr), 1))


def weighted_item_counts(X: sp.csr_matrix, max_items: int) -> np.ndarray:
    """Item counts (m,) with every record weighted by `record_weights` (L1 sensitivity max_items)."""
    return np.asarray((sp.diags(record_weights(X, max_items)) @ X).sum(axis=0), dtype=np.float64).ravel()
