"""The matrix mechanism (Li et al. PODS 2010) with the L1 reconstruction of Lee, Wang & Kifer (Algorithm 4).

A strategy matrix A (m, n) is answered with the Laplace mechanism, r~ = A x + Lap(Delta_A / eps), Delta_A the
largest column L1 norm of A (one record changes one cell of x by 1). The histogram is reconstructed from r~
by least squares, MM(l2): x^ = A^+ r~, or by maximum likelihood, MM(l1): min ||A x - r~||_1 s.t. x >= 0
(eq. 5, solved by ADMM), and the workload W is answered from x^.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from dpalgos import admm
from dpalgos.hierarchy import Tree
from dpalgos.plan import Mechanism, Plan

WorkloadKind = Literal["identity", "predicate", "all_range", "plus_minus_one"]


@dataclass(frozen=True)
class Workload:
    """A workload of linear queries over n cells. `all_range` (every interval [i, j]) is kept implicit:
    its n(n+1)/2 answers come from prefix sums."""
    kind: WorkloadKind
    n: int
    matrix: np.ndarray | None = None

    @property
    def queries(self) -> int:
        return self.n * (self.n + 1) // 2 if self.kind == "all_range" else self.matrix.shape[0]

    def answer(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "all_range":
            cs = np.concatenate([[0.0], np.cumsum(x)])
            lo, hi = np.triu_indices(self.n + 1, 1)
            return cs[hi] - cs[lo]
        return self.matrix @ x

    def mse(self, estimate: np.ndarray, truth: np.ndarray) -> float:
        """Mean squared error of the workload answers from `estimate` against those from `truth`."""
        if self.kind == "all_range":
            # sum over a < b of (E_b - E_a)^2 with E the prefix sums of the error, without materialising pairs.
            E = np.concatenate([[0.0], np.cumsum(np.asarray(estimate, float) - np.asarray(truth, float))])
            m = E.size
            return float((m * np.sum(E * E) - np.sum(E) ** 2) / self.queries)
        d = self.answer(estimate) - self.answer(truth)
        return float(np.mean(d * d))


def workload(kind: WorkloadKind, n: int, *, queries: int = 512, seed: int = 0) -> Workload:
    """identity; predicate: `queries` random 0/1 rows (each cell in with probability 1/2); plus_minus_one:
    `queries` random +-1 rows; all_range: every interval. The seed is public (the workload is public)."""
    rng = np.random.default_rng(seed)
    if kind == "identity":
        return Workload(kind, n, np.eye(n))
    if kind == "predicate":
        return Workload(kind, n, (rng.random((queries, n)) < 0.5).astype(np.float64))
    if kind == "plus_minus_one":
        return Workload(kind, n, rng.choice([-1.0, 1.0], size=(queries, n)))
    if kind == "all_range":
        return Workload(kind, n)
    raise ValueError(f"unknown workload {kind!r}")


def hierarchical_strategy(n: int) -> sp.csr_matrix:
    """Every node of the binary tree over n = 2^L cells as a row (its leaf-interval indicator)."""
    tree = Tree(n, 2)
    rows, cols = [], []
    for l in range(tree.levels):
        width = n >> l
        nodes = np.arange(2 ** l)
        rows.append(np.repeat(tree.offsets[l] + nodes, width))
        cols.append(np.arange(n))
    return sp.csr_matrix((np.ones(tree.levels * n), (np.concatenate(rows), np.concatenate(cols))), shape=(tree.size, n))


def strategy(kind: Literal["identity", "hierarchical", "workload"], w: Workload):
    if kind == "identity":
        return sp.identity(w.n, format="csr")
    if kind == "hierarchical":
        return hierarchical_strategy(w.n)
    if w.matrix is None:
        raise ValueError("the all_range workload has no explicit matrix: use the hierarchical strategy")
    return sp.csr_matrix(w.matrix)


def sensitivity(A) -> float:
    """Delta_A: the largest column L1 norm (one record changes one cell by 1)."""
    return float(np.asarray(abs(A).sum(axis=0)).max())


def strategy_plan(A, *, epsilon: float, name: str = "strategy", unit_weight: int = 1) -> Plan:
    """r~ = A x + Lap(unit_weight Delta_A / eps) on every strategy query."""
    delta = sensitivity(A) * unit_weight
    data = A.data if sp.issparse(A) else np.asarray(A)
    return Plan((Mechanism(
        "strategy", f"{name} strategy: {A.shape[0]} linear queries over {A.shape[1]} bins", "laplace", delta,
        f"one privacy unit changes one bin of x by at most {unit_weight} (its capped weight), so A x changes by "
        f"at most {unit_weight} times a column of A: L1 sensitivity {unit_weight} x Delta_A (the largest column "
        f"L1 norm, {sensitivity(A):g})", 1.0 / epsilon, integer=bool(np.all(data == np.rint(data))),
        values=A.shape[0]),))


def reconstruct_l2(A, r_tilde: np.ndarray) -> np.ndarray:
    """MM(l2): the least-squares estimate A^+ r~ (no non-negativity)."""
    Ad = A.toarray() if sp.issparse(A) else np.asarray(A)
    # One BLAS thread: the threaded SVD of a strategy this size is a hundred times slower on a loaded machine.
    with threadpool_limits(1):
        return np.linalg.lstsq(Ad, r_tilde, rcond=None)[0]


def pseudo_inverse(A) -> np.ndarray:
    """A^+ (n, m), so that the least-squares estimate of any r~ is A^+ r~ (one SVD, one BLAS thread)."""
    Ad = A.toarray() if sp.issparse(A) else np.asarray(A, dtype=np.float64)
    with threadpool_limits(1):
        return np.linalg.pinv(Ad)


def reconstruct_l1(A, r_tilde: np.ndarray, *, noise_scale: float, penalty: admm.Penalty = "elastic",
                   alpha: float = admm.ALPHA, rho: float = admm.RHO) -> admm.AdmmResult:
    """MM(l1): Algorithm 4, the non-negative (elastic-net) maximum-likelihood estimate."""
    return admm.solve_matrix_mechanism(r_tilde, A, penalty=penalty, alpha=alpha, rho=rho, scale=noise_scale)
