"""Contingency tables consistent with public marginals (Lee, Wang & Kifer §3.3 and Algorithm 2).

A k-way table over attributes with levels I_1 x ... x I_k is a vector x of n = prod |I_j| cells in row-major
order (the lexicographic ordering function Psi of the paper). The marginal of an attribute subset B at a
level combination b is the linear constraint sum_{cells matching b} x = m(b) (eq. 3); M_h is the set of all
marginals of order h (M_0: the number of records).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from dpalgos import admm
from dpalgos.plan import Mechanism, Plan


@dataclass(frozen=True)
class Table:
    names: tuple[str, ...]
    levels: tuple[tuple[str, ...], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(lv) for lv in self.levels)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def cell_levels(self) -> list[tuple[str, ...]]:
        """The level combination of every cell, in cell order."""
        return list(itertools.product(*self.levels))

    def marginal_row(self, fixed: Mapping[str, str]) -> np.ndarray:
        """0/1 indicator (n,) of the cells matching the levels in `fixed` (other attributes summed out)."""
        mask = np.ones(self.shape, dtype=bool)
        for name, level in fixed.items():
            j = self.names.index(name)
            sel = np.zeros(self.shape[j], dtype=bool)
            sel[self.levels[j].index(level)] = True
            mask &= sel.reshape([-1 if i == j else 1 for i in range(len(self.shape))])
        return mask.reshape(-1).astype(np.float64)

    def marginals(self, order: int) -> list[dict[str, str]]:
        """Every marginal cell of order `order` (M_order) as a {attribute: level} mapping."""
        out = []
        for subset in itertools.combinations(range(len(self.names)), order):
            for combo in itertools.product(*(self.levels[j] for j in subset)):
                out.append({self.names[j]: lv for j, lv in zip(subset, combo)})
        return out

    def constraint_matrix(self, marginals: Sequence[Mapping[str, str]]) -> sp.csr_matrix:
        return sp.csr_matrix(np.vstack([self.marginal_row(m) for m in marginals])) if marginals else \
            sp.csr_matrix((0, self.size))


def cells_plan(table: Table, *, epsilon: float, unit_weight: int = 1) -> Plan:
    """The Laplace mechanism on every cell of the table (the measurement of Algorithm 2)."""
    return Plan((Mechanism(
        "cells", f"every cell count of the {table.size}-cell table", "laplace", float(unit_weight),
        f"one privacy unit falls in exactly one cell and adds at most {unit_weight} to its count (its weight, "
        f"capped at the public max_weight, or 1 when weights count records): L1 sensitivity {unit_weight}",
        1.0 / epsilon, integer=True, values=table.size),))


def check_marginals(A: sp.csr_matrix, b: np.ndarray) -> None:
    """Refuse public marginals that no table satisfies (they disagree with each other)."""
    if A.shape[0] == 0:
        return
    from scipy.sparse.linalg import lsqr

    x = lsqr(A, b, atol=1e-12, btol=1e-12)[0]
    gap = np.abs(A @ x - b).max()
    if gap > 1e-6 * max(1.0, np.abs(b).max()):
        raise ValueError(f"the public marginals are inconsistent with each other (no table matches them; "
                         f"max violation {gap:.3g})")


def consistent_table(noisy: np.ndarray, A: sp.csr_matrix, b: np.ndarray, *, noise_scale: float,
                     penalty: admm.Penalty = "elastic", alpha: float = admm.ALPHA,
                     rho: float = admm.RHO) -> admm.AdmmResult:
    """Algorithm 2: the (elastic-net) maximum-likelihood table with A x = b and x >= 0."""
    if A.shape[0] == 0:
        # Only x >= 0 is known: the ADMM fixed point is the noisy table clipped at zero.
        A, b = sp.csr_matrix((1, noisy.size)), np.zeros(1)
    return admm.solve_linear(noisy, A, b, penalty=penalty, alpha=alpha, rho=rho, scale=noise_scale)


def mwem_workload(table: Table, max_order: int = 2) -> np.ndarray:
    """The linear queries MWEM answers for a table: every marginal cell of order 1..max_order and every cell."""
    rows = [table.marginal_row(m) for h in range(1, max_order + 1) for m in table.marginals(h)]
    return np.vstack(rows + [np.eye(table.size)])
