"""Contingency tables consistent with public marginals (Lee, Wang & Kifer §3.3 and Algorithm 2).

A k-way table over attributes with levels I_1 x ... x I_k is a vector x of n = prod |I_j| cells in row-major
order (the lexicographic ordering function Psi of the paper). The marginal of an attribute subset B at a
level combination b is the linear constraint sum_{cells matching b} x = m(b) (eq. 3); M_h is the set of all
marginals of order h (M_0: the number of records).

Estimators of the table from its noisy cells (all post-processing: they read the noisy cells, the noise
scale and the PUBLIC marginals, never the data):
    consistent_table      Algorithm 2: ADMM maximum likelihood (true L1), elastic net or L2, with A x = b, x >= 0
    max_entropy           the zero-budget baseline: the table of maximum entropy with the public marginals
                          (iterative proportional fitting; it ignores the measurement)
    empirical_bayes_table the posterior mean of each cell under a negative-binomial prior centred on a
                          log-linear model (the public max-entropy table, or one more order of interactions
                          fitted to the L1 estimate, chosen by AIC on the noisy cells' marginal likelihood),
                          raked onto the public marginals
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numba
import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize_scalar
from scipy.special import gammaln, logsumexp
from threadpoolctl import threadpool_limits

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


def marginal_order(marginals: Sequence[Mapping[str, str]]) -> int:
    """The largest number of attributes a marginal cell fixes (-1 without marginals)."""
    return max((len(m) for m in marginals), default=-1)


def ipf(A: sp.csr_matrix, b: np.ndarray, base: np.ndarray, *, tol: float = 1e-8, max_sweeps: int = 100_000) -> np.ndarray:
    """Iterative proportional fitting (Bregman balancing; A has 0/1 rows): the table closest to `base` in
    Kullback-Leibler divergence with A x = b, by scaling the cells of one marginal at a time. Sweeps stop when
    every marginal is within tol * max(1, max b). Cells of `base` that are 0 stay 0."""
    A = sp.csr_matrix(A)
    x = np.array(base, dtype=np.float64)
    if A.shape[0]:
        _ipf(A.indptr, A.indices, np.asarray(b, dtype=np.float64), x, tol * max(1.0, float(np.max(b))), max_sweeps)
    return x


@numba.njit(cache=True)
def _ipf(indptr, indices, b, x, tol, max_sweeps):
    for _ in range(max_sweeps):
        worst = 0.0
        for row in range(b.size):
            s = 0.0
            for j in range(indptr[row], indptr[row + 1]):
                s += x[indices[j]]
            worst = max(worst, abs(s - b[row]))
            if s > 0.0:
                f = b[row] / s
                for j in range(indptr[row], indptr[row + 1]):
                    x[indices[j]] *= f
        if worst <= tol:
            return


def max_entropy(A: sp.csr_matrix, b: np.ndarray) -> np.ndarray:
    """The zero-budget baseline: the maximum-entropy table with the public marginals A x = b (which must
    include the total, directly or through a complete marginal)."""
    if A.shape[0] == 0:
        raise ValueError("the maximum-entropy table needs public marginals (at least the number of records)")
    return ipf(A, b, np.ones(A.shape[1]))


#: The posterior grids hold cells x (max_count + 1) doubles: beyond this many (512 MB) use the ADMM estimator.
MAX_GRID = 1 << 26


def nb_posterior_mean(noisy: np.ndarray, prior_mean: np.ndarray, noise_scale: float,
                      max_count: int) -> tuple[np.ndarray, float, float]:
    """Cell by cell, the posterior mean of x_i in {0..max_count} given noisy_i = x_i + Laplace(noise_scale) and
    the prior x_i ~ NegativeBinomial(mean m_i, shape r), r chosen by maximum marginal likelihood of the noisy
    cells (empirical Bayes). The Laplace density is also the discrete Laplace's, up to a constant.
    Returns (posterior means, log marginal likelihood at r, r). Cells with m_i = 0 are 0."""
    post = _Posterior(noisy, prior_mean, noise_scale, max_count)
    return post.means(), post.loglik, post.r


class _Posterior:
    """The cells' log posteriors (up to a constant per cell) on the grid k = 0..max_count under the
    negative-binomial prior of `nb_posterior_mean`, its shape r fitted by marginal likelihood."""

    def __init__(self, noisy, prior_mean, noise_scale, max_count):
        self.k = np.arange(max_count + 1, dtype=np.float64)
        self.on = np.flatnonzero(prior_mean > 0)
        if self.on.size * self.k.size > MAX_GRID:
            raise ValueError(f"the empirical-Bayes grid ({self.on.size} cells x {self.k.size} counts) is too large: "
                             f"use the admm estimator")
        self.size = noisy.size
        m, k = prior_mean[self.on, None], self.k
        lik = -np.abs(noisy[self.on, None] - k) / noise_scale - math.log(2.0 * noise_scale)

        def terms(log_r):
            r = math.exp(log_r)
            return gammaln(k + r) - gammaln(r) - gammaln(k + 1) + r * np.log(r / (r + m)) + k * np.log(m / (r + m)) + lik

        best = minimize_scalar(lambda t: -logsumexp(terms(t), axis=1).sum(), bounds=(-6.0, 12.0), method="bounded",
                               options={"xatol": 1e-3})
        self.r, self.loglik, self.terms = math.exp(best.x), float(-best.fun), terms(best.x)

    def means(self, terms: np.ndarray | None = None) -> np.ndarray:
        t = self.terms if terms is None else terms
        out = np.zeros(self.size)
        out[self.on] = np.exp(t - logsumexp(t, axis=1, keepdims=True)) @ self.k
        return out

    def tilted_means(self, A: sp.csr_matrix, b: np.ndarray, tol: float = 1e-8, max_steps: int = 100) -> np.ndarray:
        """The means of the distribution closest to the posterior (Kullback-Leibler) whose means satisfy
        A x = b: the posterior tilted by exp(lambda' A x), lambda minimising the convex dual
        sum_i log Z_i(lambda) - lambda' b by damped Newton steps. With a Gaussian posterior this is the
        posterior conditioned on A x = b."""
        Ad = A.toarray()[:, self.on]
        k, lam = self.k, np.zeros(A.shape[0])

        def dual(l):
            t = self.terms + (Ad.T @ l)[:, None] * k
            return logsumexp(t, axis=1).sum() - l @ b, t

        value, t = dual(lam)
        for _ in range(max_steps):
            w = np.exp(t - logsumexp(t, axis=1, keepdims=True))
            mean = w @ k
            g = Ad @ mean - b
            if np.abs(g).max() <= tol * max(1.0, float(np.abs(b).max())):
                break
            with threadpool_limits(1):
                step = np.linalg.lstsq((Ad * (w @ (k * k) - mean ** 2)) @ Ad.T, g, rcond=1e-10)[0]
            a = 1.0
            while True:
                new_value, new_t = dual(lam - a * step)
                if new_value <= value - 1e-4 * a * (g @ step) or a < 1e-8:
                    break
                a /= 2.0
            lam, value, t = lam - a * step, new_value, new_t
        return self.means(t)


@dataclass
class BayesEstimate:
    """x: the table; prior: the log-linear model chosen ('public' or 'order h'); dispersion: the prior's
    negative-binomial shape r; aic_gain: log-likelihood gain of the richer model minus its extra parameters."""
    x: np.ndarray
    prior: str
    dispersion: float
    aic_gain: float


def empirical_bayes_table(noisy: np.ndarray, table: Table, marginals: Sequence[Mapping[str, str]], b: np.ndarray,
                          *, noise_scale: float) -> BayesEstimate:
    """The empirical-Bayes table (post-processing of the noisy cells and the PUBLIC marginals only).

    Prior means: (a) the maximum-entropy table of the public marginals (uniform at the L1 estimate's total
    without any); (b) the log-linear model of the next order h+1 (h the public marginals' order) fitted to
    the L1 estimate's order-(h+1) marginals and raked onto the public ones. (b) is kept when its marginal
    likelihood exceeds (a)'s by more than its number of extra parameters (AIC). The released cells are the
    means of the cells' posterior under that prior, tilted to satisfy the public marginals (`_Posterior.
    tilted_means`: measured lower MSE than raking the posterior means by IPF in most cells of the paper's table).
    """
    noisy = np.asarray(noisy, dtype=np.float64)
    A = table.constraint_matrix(list(marginals))
    b = np.asarray(b, dtype=np.float64)
    l1 = consistent_table(noisy, A, b, noise_scale=noise_scale, penalty="l1").x
    h = marginal_order(marginals)
    public = max_entropy(A, b) if A.shape[0] else np.full(table.size, l1.sum() / table.size)
    max_count = int(math.ceil(max(float(noisy.max()), 0.0) + 40.0 * noise_scale))
    if A.shape[0] and h == 0:
        max_count = min(max_count, int(math.ceil(b.max())))
    post, prior, gain = _Posterior(noisy, public, noise_scale, max_count), "public", -math.inf
    h = max(h, 0)  # without public marginals, the uniform table against the main effects
    if h + 1 <= len(table.names):
        A1 = table.constraint_matrix(table.marginals(h + 1))
        richer = ipf(A1, A1 @ l1, np.ones(table.size))
        richer = ipf(A, b, richer) if A.shape[0] else richer
        post1 = _Posterior(noisy, richer, noise_scale, max_count)
        gain = post1.loglik - post.loglik - _extra_parameters(A, A1)
        if gain > 0:
            post, prior = post1, f"order {h + 1}"
    x = post.tilted_means(A, b) if A.shape[0] else post.means()
    return BayesEstimate(x, prior, post.r, gain)


def _extra_parameters(A: sp.csr_matrix, A1: sp.csr_matrix) -> int:
    """Free parameters the marginals A1 add to the log-linear model of A (the total counts for no A)."""
    base = A if A.shape[0] else sp.csr_matrix(np.ones((1, A1.shape[1])))
    # One BLAS thread: the threaded SVD of these small matrices is a hundred times slower on a loaded machine.
    with threadpool_limits(1):
        return int(np.linalg.matrix_rank(sp.vstack([base, A1]).toarray()) - np.linalg.matrix_rank(base.toarray()))


def mwem_workload(table: Table, max_order: int = 2) -> np.ndarray:
    """The linear queries MWEM answers for a table: every marginal cell of order 1..max_order and every cell."""
    rows = [table.marginal_row(m) for h in range(1, max_order + 1) for m in table.marginals(h)]
    return np.vstack(rows + [np.eye(table.size)])
