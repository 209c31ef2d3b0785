"""Kronecker products of per-axis strategies for counts over a d-dimensional grid: HDMM's strategy for a product
workload (McKenna, Miklau, Hay & Machanavajjhala, VLDB 2018, §6: for W = W_1 x ... x W_d, the strategy
A = A_1 x ... x A_d, each A_k optimised for its W_k), here with HDMM's p-Identity strategy for all ranges of an
axis (`dpalgos.hdmm.PIdentity`) on every axis, so that the workload it is optimised for is every axis-aligned
rectangle (a product of ranges).

Facts used (standard properties of the Kronecker product):
* sensitivity: column (j_1, ..., j_d) of A is a^1_{j_1} x ... x a^d_{j_d}, and the L1 norm of a Kronecker product
  of vectors is the product of their L1 norms (|u_a v_b| = |u_a| |v_b|, summed over a and b): every column of A
  has L1 norm prod_k ||a^k_{j_k}||_1 = 1 when every factor's columns have L1 norm 1 (p-Identity: `hdmm`). One
  record changes the grid x by one unit vector, so A x moves by one column of A: L1 sensitivity 1.
* least squares: A has full column rank (each A_k holds a scaled identity), (A'A)^-1 A' = x_k (A_k'A_k)^-1 A_k':
  the estimate is each factor's least squares applied along its axis, linear in the measurements;
* projection onto range(A): A (A'A)^-1 A', the Euclidean projection that Lee, Wang & Kifer's Algorithm 3 needs
  (`dpalgos.admm.solve_projection`) for the measurements' consistency.
Every product is applied axis by axis, so no matrix of the grid's size is ever formed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from dpalgos.hdmm import PIdentity


def along(values: np.ndarray, axis: int, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """fn applied to every 1-D fibre of `values` along `axis` (fn maps (n, k) to (m, k), column by column)."""
    moved = np.moveaxis(values, axis, 0)
    out = fn(moved.reshape(moved.shape[0], -1))
    return np.moveaxis(out.reshape((out.shape[0],) + moved.shape[1:]), 0, axis)


class Kronecker:
    """A = A_1 x ... x A_d over a grid of shape (n_1, ..., n_d); its measurements are A x in row-major order of
    the shape (n_1 + p_1, ..., n_d + p_d)."""

    def __init__(self, factors: Sequence[PIdentity]):
        self.factors = tuple(factors)
        self.shape = tuple(f.n for f in self.factors)
        self.measured_shape = tuple(f.rows for f in self.factors)

    @property
    def rows(self) -> int:
        return math.prod(self.measured_shape)

    def sensitivity(self) -> float:
        """The largest column L1 norm of A as computed in floating point: the product of the factors'."""
        return math.prod(f.sensitivity() for f in self.factors)

    def answers(self, grid: np.ndarray) -> np.ndarray:
        """A x, flattened row-major."""
        out = np.asarray(grid, dtype=np.float64).reshape(self.shape)
        with threadpool_limits(1):  # small products: threaded BLAS ran 100x slower on 2 loaded cores
            for axis, f in enumerate(self.factors):
                out = along(out, axis, f.answers)
        return out.ravel()

    def least_squares(self, y: np.ndarray) -> np.ndarray:
        """(A'A)^-1 A' y as a grid of `shape`: linear in y, so every sum of cells is unbiased."""
        out = np.asarray(y, dtype=np.float64).reshape(self.measured_shape)
        with threadpool_limits(1):
            for axis, f in enumerate(self.factors):
                out = along(out, axis, f.least_squares)
        return out

    def project(self, y: np.ndarray) -> np.ndarray:
        """The Euclidean projection of measurements y onto range(A) = {A x}: A (A'A)^-1 A' y."""
        return self.answers(self.least_squares(y))
