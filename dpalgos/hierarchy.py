"""Hierarchical (k-ary tree) histograms over an ordered domain, after Hay, Rastogi, Miklau & Suciu,
"Boosting the accuracy of differentially private histograms through consistency" (PVLDB 2010).

A tree over m = k^L leaves is stored as one vector in breadth-first order: the root first, then each level
left to right (n = (k^(L+1) - 1)/(k - 1) nodes). Every record falls in exactly one node per level, so the
vector of all node counts has L1 sensitivity L+1 (the number of levels).

Reading one release's path (docs/explanation/architecture.md): next, dpalgos/admm.py, the consistent estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numba
import numpy as np
import scipy.sparse as sp

from dpalgos import admm
from dpalgos.plan import Mechanism, Plan


@dataclass(frozen=True)
class Tree:
    """Shape of a complete k-ary tree with `leaves` = k^L leaves."""
    leaves: int
    branching: int = 2

    def __post_init__(self):
        k, m = self.branching, self.leaves
        if k < 2:
            raise ValueError(f"branching factor must be >= 2, got {k}")
        if m < 1 or k ** self.depth != m:
            raise ValueError(f"the number of leaves must be a power of the branching factor {k}, got {m}")

    @cached_property
    def depth(self) -> int:
        """L: the number of edges from the root to a leaf."""
        L, size = 0, 1
        while size < self.leaves:
            size *= self.branching
            L += 1
        return L

    @property
    def levels(self) -> int:
        return self.depth + 1

    @cached_property
    def offsets(self) -> np.ndarray:
        """Start of each level (root = level 0) in the breadth-first vector, plus the total size."""
        sizes = self.branching ** np.arange(self.levels)
        return np.concatenate([[0], np.cumsum(sizes)])

    @property
    def size(self) -> int:
        return int(self.offsets[-1])

    def level(self, x: np.ndarray, l: int) -> np.ndarray:
        return x[self.offsets[l]:self.offsets[l + 1]]

    def aggregate(self, leaf_counts: np.ndarray) -> np.ndarray:
        """Exact node counts (n,) of the tree over `leaf_counts` (leaves,)."""
        leaf_counts = np.asarray(leaf_counts, dtype=np.float64)
        if leaf_counts.shape != (self.leaves,):
            raise ValueError(f"expected {self.leaves} leaf counts, got shape {leaf_counts.shape}")
        out = np.empty(self.size)
        cur = leaf_counts
        for l in range(self.depth, -1, -1):
            out[self.offsets[l]:self.offsets[l + 1]] = cur
            if l:
                cur = cur.reshape(-1, self.branching).sum(axis=1)
        return out

    def consistency_matrix(self) -> sp.csr_matrix:
        """A (internal nodes x n) with A x = 0 iff every internal node equals the sum of its children."""
        k = self.branching
        internal = int(self.offsets[-2])
        parents = np.arange(internal)
        rows = np.concatenate([parents, np.repeat(parents, k)])
        cols = np.concatenate([parents, k * np.repeat(parents, k) + np.tile(np.arange(1, k + 1), internal)])
        vals = np.concatenate([np.ones(internal), -np.ones(internal * k)])
        return sp.csr_matrix((vals, (rows, cols)), shape=(internal, self.size))

    def htree(self, noisy: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Hay et al.'s constrained inference: the least-squares consistent tree closest to `noisy`.

        This is the Euclidean projection onto {x : every parent equals the sum of its children}, computed
        in O(n): bottom-up z[v] = (k^i - k^(i-1))/(k^i - 1) h[v] + (k^(i-1) - 1)/(k^i - 1) sum_children z
        (i the height of v, leaves i = 1), then top-down x[v] = z[v] + (x[parent] - sum_siblings z)/k.
        `out` (n,) receives the result (it may be `noisy` itself); nothing else is allocated.
        """
        noisy = np.ascontiguousarray(noisy, dtype=np.float64)
        if noisy.shape != (self.size,):
            raise ValueError(f"expected a tree vector of {self.size} nodes, got shape {noisy.shape}")
        out = np.empty_like(noisy) if out is None else out
        _htree(noisy, out, self.offsets, self.branching)
        return out

    def projection(self) -> "TreeProjection":
        """`htree` as the projection of `admm.solve_projection`, with its workspace and the fused ADMM pass."""
        return TreeProjection(self)

    def range_answer(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Sum over leaves [lo, hi) answered from the tree `x` with the fewest nodes (greedy canonical
        decomposition: at most 2(k-1) nodes per level). Vectorised over the ranges."""
        lo = np.asarray(lo, dtype=np.int64).copy()
        hi = np.asarray(hi, dtype=np.int64).copy()
        total = np.zeros(lo.shape)
        k = self.branching
        for l in range(self.depth, -1, -1):
            nodes = self.level(x, l)
            # Take single nodes at this level until lo and hi are aligned to the parent level.
            for _ in range(k - 1):
                take = (lo % k != 0) & (lo < hi)
                total[take] += nodes[lo[take]]
                lo[take] += 1
                take = (hi % k != 0) & (lo < hi)
                hi[take] -= 1
                total[take] += nodes[hi[take]]
            lo //= k
            hi //= k
        return total

    def leaves_of(self, x: np.ndarray) -> np.ndarray:
        return self.level(np.asarray(x), self.depth).copy()


def tree_plan(tree: Tree, *, epsilon: float, unit_weight: int = 1) -> Plan:
    """The Laplace mechanism on every node of the tree (LM(H), the measurement of Algorithm 3)."""
    return Plan((Mechanism(
        "tree", f"every node count of the {tree.branching}-ary tree over {tree.leaves} bins", "laplace",
        float(tree.levels * unit_weight),
        f"one privacy unit falls in one node per level and adds at most {unit_weight} (its capped weight) to "
        f"each: L1 sensitivity {tree.levels} levels x {unit_weight}", 1.0 / epsilon, integer=True,
        values=tree.size),))


def bins_plan(bins: int, *, epsilon: float, unit_weight: int = 1) -> Plan:
    """The Laplace mechanism on every bin of a flat histogram (LM, the identity strategy): the tree of one level."""
    return Plan((Mechanism(
        "bins", f"every bin count of the histogram over {bins} bins", "laplace", float(unit_weight),
        f"one privacy unit falls in one bin and adds at most {unit_weight} (its capped weight) to it: L1 "
        f"sensitivity {unit_weight}", 1.0 / epsilon, integer=True, values=bins),))


#: Parents per run of the fused pass: their children's projections (a few kB) stay in L1 cache.
CHUNK_NODES = 512


class TreeProjection:
    """The projection onto consistent trees for `admm.solve_projection`: calling it is `Tree.htree`;
    `admm_pass` is one whole ADMM iteration in two passes over the tree (Htree's bottom-up pass, then its
    top-down pass with the ADMM update of each node as soon as its projection is known), in a workspace of
    the internal nodes allocated once."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self._work = np.empty(int(tree.offsets[-2]))
        self._chunk = np.empty(CHUNK_NODES * tree.branching)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return self.tree.htree(v)

    def admm_pass(self, v, x, xt, nonneg, code, alpha, rho, relaxation, sq) -> None:
        if v.shape != (self.tree.size,):
            raise ValueError(f"expected a tree vector of {self.tree.size} nodes, got shape {v.shape}")
        _admm_pass(v, x, xt, self._work, self._chunk, self.tree.offsets, self.tree.branching, nonneg, code, alpha, rho,
                   relaxation, sq)


@numba.njit(cache=True)
def _bottom_up(h, z, offsets, k):
    """Htree's bottom-up pass: z[v] for every internal node v (z of a leaf is h of the leaf)."""
    depth = offsets.size - 2
    for l in range(depth - 1, -1, -1):
        ki = float(k) ** (depth - l + 1)
        a = (ki - ki / k) / (ki - 1.0)
        c = (ki / k - 1.0) / (ki - 1.0)
        start, child = offsets[l], offsets[l + 1]
        below = z if l + 1 < depth else h
        for j in range(child - start):
            s = 0.0
            for u in range(k):
                s += below[child + k * j + u]
            z[start + j] = a * h[start + j] + c * s


@numba.njit(cache=True)
def _htree(h, out, offsets, k):
    """Both passes of Htree; the internal nodes of `out` hold the bottom-up z until the top-down pass
    replaces them (a node's z is read only by its own correction and its parent's sibling sum)."""
    depth = offsets.size - 2
    if depth == 0:
        out[0] = h[0]
        return
    _bottom_up(h, out, offsets, k)
    for l in range(1, depth + 1):
        pstart, start = offsets[l - 1], offsets[l]
        below = out if l < depth else h
        for j in range(start - pstart):
            s = 0.0
            for u in range(k):
                s += below[start + k * j + u]
            corr = (out[pstart + j] - s) / k
            for u in range(k):
                out[start + k * j + u] = below[start + k * j + u] + corr


@numba.njit(cache=True)
def _admm_pass(v, x, xt, z, chunk, offsets, k, nonneg, code, alpha, rho, relaxation, sq):
    """One iteration of `admm.solve_projection` on a tree: Htree's bottom-up pass on v into z (internal
    nodes), then its top-down pass level by level, each run of nodes updated by ADMM as soon as its
    projection is known (the update reads and writes only the node's own v and x; the children's projection
    needs only the node's, kept in z). Leaf projections live only in `chunk`, a buffer small enough to stay
    in cache. sq gets ||x - Pi(v)||^2 and ||x' - x||^2."""
    depth = offsets.size - 2
    if depth == 0:
        sq[0], sq[1] = admm.update_all(v, x, xt, v.copy(), nonneg, code, alpha, rho, relaxation)
        return
    _bottom_up(v, z, offsets, k)
    s_con, s_dx = admm.update_all(v[:1], x[:1], xt[:1], z[:1], nonneg, code, alpha, rho, relaxation)
    run = chunk.size // k
    for l in range(1, depth + 1):
        pstart, start = offsets[l - 1], offsets[l]
        below = z if l < depth else v
        for j0 in range(0, start - pstart, run):
            j1 = min(j0 + run, start - pstart)
            lo, hi = start + k * j0, start + k * j1
            dest = z[lo:hi] if l < depth else chunk[:hi - lo]
            for j in range(j0, j1):
                first = start + k * j
                s = 0.0
                for i in range(first, first + k):
                    s += below[i]
                corr = (z[pstart + j] - s) / k
                for i in range(first, first + k):
                    dest[i - lo] = below[i] + corr
            c, d = admm.update_all(v[lo:hi], x[lo:hi], xt[lo:hi], dest, nonneg, code, alpha, rho, relaxation)
            s_con += c
            s_dx += d
    sq[0] = s_con
    sq[1] = s_dx
