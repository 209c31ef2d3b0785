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
    empirical_bayes_table posterior means of the cells under priors centred on a log-linear model (the public
                          max-entropy table; one more order of interactions fitted to the L1 estimate; the same
                          interactions shrunk by empirical Bayes, `shrunk_interactions`): prior only (the
                          max-entropy table itself), negative binomial, gamma; each tilted onto the public
                          marginals, averaged with Akaike weights from the noisy cells' likelihood given
                          the public marginals
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numba
import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.linalg import null_space
from scipy.optimize import minimize_scalar
from scipy.special import gammainc, gammaincc, gammaln, logsumexp
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


def least_squares_table(A: sp.csr_matrix, b: np.ndarray):
    """The signed least-squares table consistent with the public marginals, as a function of the noisy cells:
    argmin ||x - y||_2 s.t. A x = b, that is y - A^+ (A y - b) (one pseudo-inverse of the marginal rows). Affine in
    the noise with A x = b holding at the truth, so every cell and every sum of cells is unbiased (when the public
    marginals are the data's own); without marginals it is the noisy table itself."""
    if A.shape[0] == 0:
        return lambda y: np.asarray(y, dtype=np.float64)
    pinv = np.linalg.pinv(A.toarray())
    return lambda y: np.asarray(y, dtype=np.float64) - pinv @ (A @ y - b)


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


def ipf(A: sp.csr_matrix, b: np.ndarray, base: np.ndarray, *, tol: float = 1e-8,
        max_sweeps: int = 100_000) -> np.ndarray:
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


#: The posterior grids hold cells x support points doubles: beyond this many (512 MB) use the ADMM estimator.
MAX_GRID = 1 << 26
#: The gamma prior's support: 0, then steps of GAMMA_STEP * max(1, sqrt(x)), finer than its standard deviation
#: sqrt(phi x) wherever phi > GAMMA_STEP^2 (smaller phi is the prior-only candidate in all but name).
GAMMA_STEP = 0.05


def _laplace_loglik(residual: np.ndarray, scale: float) -> np.ndarray:
    """log of the Laplace(scale) density (also the discrete Laplace's on integers, up to a constant)."""
    return -np.abs(residual) / scale - math.log(2.0 * scale)


class NegativeBinomial:
    """x ~ NegativeBinomial(mean m, shape r) on the integers: Var x = m + m^2 / r, at least Poisson's."""
    name, bounds = "negative binomial", (-6.0, 12.0)  # log r: from r = 0.0025 to Poisson in all but name

    @staticmethod
    def support(max_count: int) -> np.ndarray:
        return np.arange(max_count + 1, dtype=np.float64)

    @staticmethod
    def log_prior(m: np.ndarray, k: np.ndarray, log_r: float) -> np.ndarray:
        r = math.exp(log_r)
        return gammaln(k + r) - gammaln(r) - gammaln(k + 1) + r * np.log(r / (r + m)) + k * np.log(m / (r + m))


class Gamma:
    """x ~ Gamma(shape m / phi, scale phi), continuous: Var x = phi m, below Poisson's for phi < 1 and a point mass
    at m as phi -> 0. Discretised as its probability of the bin around each support point (0 is a point)."""
    # log phi up to 0: the gamma covers variances from a point mass to Poisson's, the negative binomial those above
    # (above, fitted given the public marginals, phi ran to the bound on sparse tables at small epsilon:
    # docs/explanation-peers.md §4).
    name, bounds = "gamma", (-8.0, 0.0)  # log phi

    @staticmethod
    def support(max_count: int) -> np.ndarray:
        points = [0.0]
        while points[-1] < max_count:
            points.append(points[-1] + GAMMA_STEP * max(1.0, math.sqrt(points[-1])))
        return np.array(points)

    @staticmethod
    def log_prior(m: np.ndarray, k: np.ndarray, log_phi: float) -> np.ndarray:
        phi = math.exp(log_phi)
        edges = np.concatenate([[0.0], (k[1:] + k[:-1]) / 2.0, [np.inf]]) / phi
        a = m / phi
        # Bins above the mean differ upper tails, the others lower ones: a difference of two numbers near 1 would
        # leave rounding noise of 1e-16 where the likelihood may favour a far tail.
        lower, upper = gammainc(a, edges), gammaincc(a, edges)
        mass = np.where(edges[:-1] > a, upper[:, :-1] - upper[:, 1:], lower[:, 1:] - lower[:, :-1])
        with np.errstate(divide="ignore"):
            return np.log(np.maximum(mass, 0.0))


FAMILIES = (NegativeBinomial, Gamma)


def nb_posterior_mean(noisy: np.ndarray, prior_mean: np.ndarray, noise_scale: float,
                      max_count: int) -> tuple[np.ndarray, float, float]:
    """Cell by cell, the posterior mean of x_i in {0..max_count} given noisy_i = x_i + Laplace(noise_scale) and
    the prior x_i ~ NegativeBinomial(mean m_i, shape r), r chosen by maximum marginal likelihood of the noisy
    cells (empirical Bayes). Returns (posterior means, log marginal likelihood at r, r). Cells with m_i = 0 are 0."""
    post = _Posterior(noisy, prior_mean, noise_scale, max_count, NegativeBinomial)
    return post.means(), post.loglik, post.dispersion


class _Posterior:
    """The cells' log posteriors (up to a constant per cell) on the support of a prior `family` with means
    prior_mean and one dispersion parameter fitted by maximum likelihood of the noisy cells: given the public
    marginals `given` = (A, b) when passed (`conditional_loglik`, and `loglik` is then that likelihood), their
    unconditional likelihood otherwise; with `upper`, the prior of cell i is cut above upper_i (see
    `empirical_bayes_table`)."""

    def __init__(self, noisy, prior_mean, noise_scale, max_count, family, upper=None, given=None):
        self.family, self.k = family, family.support(max_count)
        self.on = np.flatnonzero(prior_mean > 0)
        if self.on.size * self.k.size > MAX_GRID:
            raise ValueError(f"the empirical-Bayes grid ({self.on.size} cells x {self.k.size} counts) is too large: "
                             f"use the admm estimator")
        self.size, self.noise_scale = noisy.size, noise_scale
        self.noisy, self.upper = noisy[self.on, None], None if upper is None else upper[self.on, None]
        self.m, lik = prior_mean[self.on, None], self._lik()
        if given is None:
            fit = lambda t: logsumexp(family.log_prior(self.m, self.k, t) + lik, axis=1).sum()
        else:
            basis = self._basis(*given)
            fit = lambda t: self._given_at(t, lik, *basis)
        # Given the marginals every step costs two saddle points (`_log_event`): a coarser tolerance on log r.
        best = minimize_scalar(lambda t: -fit(t), bounds=family.bounds, method="bounded",
                               options={"xatol": 1e-2 if given is None else 5e-2})
        self.log_dispersion, self.dispersion = best.x, math.exp(best.x)
        self.terms = family.log_prior(self.m, self.k, best.x) + lik
        # A cell whose prior mean is 0 is 0, but its noisy count still has a density: priors with different zero
        # cells are only comparable with it included.
        self.off_loglik = float(_laplace_loglik(np.delete(noisy, self.on), noise_scale).sum())
        self.loglik = float(-best.fun) + self.off_loglik

    def _lik(self) -> np.ndarray:
        """The Laplace log-likelihood of the noisy cells on the support, -inf above the cells' upper bounds."""
        lik = _laplace_loglik(self.noisy - self.k, self.noise_scale)
        return lik if self.upper is None else np.where(self.k > self.upper + 1e-9, -np.inf, lik)

    def means(self, terms: np.ndarray | None = None) -> np.ndarray:
        t = self.terms if terms is None else terms
        out = np.zeros(self.size)
        out[self.on] = np.exp(t - logsumexp(t, axis=1, keepdims=True)) @ self.k
        return out

    def tilted_means(self, A: sp.csr_matrix, b: np.ndarray) -> np.ndarray:
        """The means of the distribution closest to the posterior (Kullback-Leibler) whose means satisfy
        A x = b (`_tilt`). With a Gaussian posterior this is the posterior conditioned on A x = b."""
        return self.means(_tilt(self.terms, self.k, A.toarray()[:, self.on], b)[1])

    def conditional_loglik(self, A: sp.csr_matrix, b: np.ndarray) -> float:
        """log p(noisy | A x = b) at the fitted dispersion: the noisy cells' likelihood given the public marginals,
            log sum_x p(x) L(x) [A x = b] - log sum_x p(x) [A x = b],
        each sum (the posterior's and the prior's probability of the public marginals, up to the same constant)
        by the saddle-point approximation of `_log_event`; the cells the prior sets to 0 add their noise density
        (as in `loglik`). The prior-only candidate's (its table satisfies A x = b) is its noise density alone.
        Post-processing like the rest: the noisy cells, the noise scale and the public marginals, nothing else."""
        return self._given_at(self.log_dispersion, self._lik(), *self._basis(A, b)) + self.off_loglik

    def _basis(self, A: sp.csr_matrix, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The public marginals on the cells the prior keeps, as rows of full rank (the determinant needs it)."""
        Ad = A.toarray()[:, self.on]
        with threadpool_limits(1):
            _, _, pivots = scipy.linalg.qr(Ad.T, pivoting=True, mode="economic")
            rows = np.sort(pivots[:np.linalg.matrix_rank(Ad)])
        return Ad[rows], np.asarray(b, dtype=np.float64)[rows]

    def _given_at(self, log_dispersion: float, lik: np.ndarray, Ad: np.ndarray, b: np.ndarray) -> float:
        """log p(noisy | Ad x = b) of the cells the prior keeps, at this dispersion (see `conditional_loglik`)."""
        prior = self.family.log_prior(self.m, self.k, log_dispersion)
        cut = np.where(np.isneginf(lik), -np.inf, prior)  # the bounds cut the prior too
        return _log_event(prior + lik, self.k, Ad, b) - _log_event(cut, self.k, Ad, b)


def _tilt(terms: np.ndarray, k: np.ndarray, Ad: np.ndarray, b: np.ndarray, tol: float = 1e-8,
          max_steps: int = 100) -> tuple[float, np.ndarray, np.ndarray]:
    """Independent cells with log weights `terms` on the support k, tilted by exp(lambda' Ad x) so that their
    means satisfy Ad x = b: lambda minimises the convex dual K(lambda) - lambda' b, K(lambda) =
    sum_i log sum_k exp(terms_ik + (Ad' lambda)_i k), by damped Newton steps. Returns the dual's minimum, the
    tilted terms and the Hessian K''(lambda) = Ad diag(tilted variances) Ad'."""
    lam = np.zeros(Ad.shape[0])

    def dual(l):
        t = terms + (Ad.T @ l)[:, None] * k
        return logsumexp(t, axis=1).sum() - l @ b, t

    value, t = dual(lam)
    for _ in range(max_steps):
        w = np.exp(t - logsumexp(t, axis=1, keepdims=True))
        mean = w @ k
        g, hessian = Ad @ mean - b, (Ad * (w @ (k * k) - mean ** 2)) @ Ad.T
        if np.abs(g).max() <= tol * max(1.0, float(np.abs(b).max())):
            break
        with threadpool_limits(1):
            step = np.linalg.lstsq(hessian, g, rcond=1e-10)[0]
        a = 1.0
        while True:
            new_value, new_t = dual(lam - a * step)
            if new_value <= value - 1e-4 * a * (g @ step) or a < 1e-8:
                break
            a /= 2.0
        lam, value, t = lam - a * step, new_value, new_t
    return value, t, hessian


def _log_event(terms: np.ndarray, k: np.ndarray, Ad: np.ndarray, b: np.ndarray) -> float:
    """log sum_x prod_i exp(terms_i(x_i)) [Ad x = b], Ad of full row rank, by the saddle-point approximation
    (Daniels 1954): K(lambda) - lambda' b - 1/2 log det K''(lambda) at the dual's minimum (`_tilt`), without the
    constant -r/2 log(2 pi) plus the lattice's log volume, which a candidate's prior and posterior share (their
    difference is what the weights use). With the gamma's continuous support it approximates the density of Ad x
    at b, and the difference is again the log ratio."""
    value, _, hessian = _tilt(terms, k, Ad, b)
    with threadpool_limits(1):
        return float(value - 0.5 * np.linalg.slogdet(hessian)[1])


@dataclass
class BayesEstimate:
    """x: the table; per candidate prior ('public', 'order h' or 'shrunk order h', then its family): aic, its
    log marginal likelihood minus the parameters fitted to the noisy cells; weight, its Akaike weight in x;
    dispersion, its fitted r or phi (0 for prior only)."""
    x: np.ndarray
    aic: dict[str, float]
    weight: dict[str, float]
    dispersion: dict[str, float]

    @property
    def prior(self) -> str:
        """The mean model of the heaviest candidate."""
        return max(self.weight, key=self.weight.get).split(", ")[0]


#: Candidates whose Akaike weight is below this are left out of the average (their tilt is not computed).
MIN_WEIGHT = 1e-3


def empirical_bayes_table(noisy: np.ndarray, table: Table, marginals: Sequence[Mapping[str, str]], b: np.ndarray,
                          *, noise_scale: float) -> BayesEstimate:
    """The empirical-Bayes table (post-processing of the noisy cells and the PUBLIC marginals only).

    Prior means m: (a) the maximum-entropy table of the public marginals (uniform at the L1 estimate's total
    without any); (b) the log-linear model of the next order h+1 (h the public marginals' order) fitted to the L1
    estimate's order-(h+1) marginals and raked onto the public ones; (c) the order-(h+1) interactions shrunk
    direction by direction by how much the noisy cells support them (`shrunk_interactions`; absent when they
    support none). Prior families, cells independent, with
    noisy_i = x_i + Laplace(noise_scale):
        prior only         x = m: the candidate table is m itself (for (a), the max-entropy table)
        negative binomial  x_i ~ NB(m_i, r) on the integers, Var = m_i + m_i^2 / r (overdispersed)
        gamma              x_i ~ Gamma(m_i / phi, phi), Var = phi m_i, phi <= 1 (Poisson's variance or less; prior only
                           as phi -> 0)
    r and phi maximise the likelihood of the noisy cells given the public marginals, L(noisy | A x = b)
    (`_Posterior.conditional_loglik`), with every prior cut above u_i, the smallest public marginal count cell i
    adds to (`cell_upper_bounds`): a dispersed prior gains nothing by explaining a noise spike with a count the
    marginals rule out (measured with tests/benchmarks/contingency_peers.py: Edwards with 2-way marginals at eps
    0.1-0.5, up to a third lower MSE).
    Around (b) and (c), whose means were fitted to the same noisy cells and so absorb part of their noise, only
    the negative binomial: an underdispersed fit there would mistake that absorption for a tight prior (measured
    on the Czech table with 2-way marginals public: MSE up to 1.7x). Each candidate's table is its
    posterior's means tilted to satisfy the public marginals (`_Posterior.tilted_means`: measured lower MSE than
    raking the posterior means by IPF on the paper's tables). x is their average with Akaike weights
    w_c ~ exp(AIC_c), AIC_c = log L_c(noisy | A x = b) minus the parameters fitted to the noisy cells (the
    dispersion; the free parameters (b) adds; (c)'s prior variance and effective number of parameters): the table
    moves to the max-entropy one when the noisy cells say less than the public marginals, without the jumps of
    picking one candidate (measured, with the unconditional likelihood, by tests/benchmarks/contingency_peers.py on
    Edwards' table, 10 runs per cell: 24/30 (marginals, epsilon) cells below every peer averaged, 18/30 picking
    the best candidate).

    The rule is the same on every table; its inputs are the noisy cells, the noise scale (1/epsilon), the public
    marginals' order h and counts b, and the attributes' levels. Prior means: the log-linear models of order h
    (the max-entropy table, which b alone determines: no parameter) and h+1 (whole, and shrunk), the first order
    b leaves free. Families: a count of independently sampled records is Poisson around a correct model's mean
    (multinomial = Poisson given the total; the tilt gives the marginals), a gamma-mixed Poisson (the negative
    binomial) around a misfitting one; the gamma family covers variances below Poisson's, which conditioning on
    the marginals gives and the tilt, matching means only, does not. Weights: Akaike's (the maximised
    log-likelihood overstates the expected one by the number of fitted parameters) of the likelihood GIVEN b
    (`_Posterior.conditional_loglik`), because every candidate's means were raked onto b and its table is tilted
    onto it: b is given to the candidates, not predicted by them; for the same reason the dispersion is fitted
    by that likelihood (fitted unconditionally it shrank too far toward the prior means: on a generated
    7-attribute table with a 3-way interaction and its 2-way marginals public at epsilon 0.5, the weighted table's
    correction to the max-entropy one was best scaled by 1.09-1.25 in every run; given b, the MSE over those runs
    went from 1.069 to 0.985). Unconditionally, a dispersed prior's
    likelihood is spread over tables that b rules out, a cost the prior-only table (A m = b) never pays: that
    favoured the prior-only and gamma candidates where the negative binomial alone was far better (a generated
    6-attribute table with 2-way marginals public at epsilon 0.5, 8 runs: MSE 1.57 weighted, 0.97 the
    negative binomial alone; 1.31 weighted given b). A full-cells candidate (a flat prior up to the public
    bounds, tilted onto b: the noisy cells' fit consistent with the marginals, below ADMM-L2's MSE) was measured
    in five cells with 2-way or 1-way marginals public: weight 0 in four, 0.1 in one where it raised the MSE by
    7 %, above the weighted table's MSE alone in all five; it is not among them.
    """
    noisy = np.asarray(noisy, dtype=np.float64)
    A = table.constraint_matrix(list(marginals))
    b = np.asarray(b, dtype=np.float64)
    fits = _candidates(noisy, table, marginals, A, b, noise_scale)
    top = max(aic for aic, _ in fits.values())
    weight = {c: math.exp(aic - top) for c, (aic, _) in fits.items()}
    kept = {c: w for c, w in weight.items() if w >= MIN_WEIGHT}
    total = sum(kept.values())
    x = sum(w / total * _candidate_table(fits[c][1], A, b) for c, w in kept.items())
    return BayesEstimate(x, {c: aic for c, (aic, _) in fits.items()}, {c: kept.get(c, 0.0) / total for c in fits},
                         {c: 0.0 if isinstance(f, np.ndarray) else f.dispersion for c, (_, f) in fits.items()})


def _candidates(noisy, table, marginals, A, b, noise_scale) -> dict[str, tuple[float, "np.ndarray | _Posterior"]]:
    """Every candidate prior as name -> (AIC, its means for prior only or its fitted posterior)."""
    max_count = int(math.ceil(max(float(noisy.max()), 0.0) + 40.0 * noise_scale))
    upper = cell_upper_bounds(A, b) if A.shape[0] else None
    if upper is not None and np.isfinite(upper).all():  # public marginals may leave some cells out
        max_count = min(max_count, int(math.ceil(upper.max())))
    out = {}
    for prior, mean, extra in _prior_means(noisy, table, marginals, A, b, noise_scale):
        if prior == "public":
            out[f"{prior}, prior only"] = float(_laplace_loglik(noisy - mean, noise_scale).sum()) - extra, mean
        for family in FAMILIES if prior == "public" else (NegativeBinomial,):
            post = _Posterior(noisy, mean, noise_scale, max_count, family, upper, given=(A, b) if A.shape[0] else None)
            out[f"{prior}, {family.name}"] = post.loglik - extra - 1, post
    return out


def cell_upper_bounds(A: sp.csr_matrix, b: np.ndarray) -> np.ndarray:
    """Per cell, the smallest public marginal count it adds to (inf for a cell in none): a count is at most every
    marginal count it is part of."""
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    upper = np.full(A.shape[1], np.inf)
    np.minimum.at(upper, A.indices, b[rows])
    return upper


def _candidate_table(fit, A, b) -> np.ndarray:
    if isinstance(fit, np.ndarray):
        return fit
    return fit.tilted_means(A, b) if A.shape[0] else fit.means()


def _prior_means(noisy, table, marginals, A, b, noise_scale):
    """The candidate prior means as (name, means, parameters fitted to the noisy cells)."""
    l1 = consistent_table(noisy, A, b, noise_scale=noise_scale, penalty="l1").x
    public = max_entropy(A, b) if A.shape[0] else np.full(table.size, l1.sum() / table.size)
    out = [("public", public, 0 if A.shape[0] else 1)]
    h = max(marginal_order(marginals), 0)  # without public marginals, the uniform table against the main effects
    if h + 1 <= len(table.names):
        A1 = table.constraint_matrix(table.marginals(h + 1))
        richer = ipf(A1, A1 @ l1, np.ones(table.size))
        richer = ipf(A, b, richer) if A.shape[0] else richer
        out.append((f"order {h + 1}", richer, out[0][2] + _extra_parameters(A, A1)))
        shrunk = shrunk_interactions(noisy, A, b, A1, public, noise_scale)
        if shrunk is not None:
            out.append((f"shrunk order {h + 1}", shrunk.means, out[0][2] + 1 + shrunk.parameters))
    return out


@dataclass
class Shrunk:
    """means: the public model shifted by the shrunk interactions; parameters: their effective number, tr(H);
    tau2: the interactions' prior variance; gain: the log marginal likelihood gained over tau2 = 0."""
    means: np.ndarray
    parameters: float
    tau2: float
    gain: float


def shrunk_interactions(noisy: np.ndarray, A: sp.csr_matrix, b: np.ndarray, A1: sp.csr_matrix,
                        public: np.ndarray, noise_scale: float) -> Shrunk | None:
    """The public model m0 shifted by the interactions of the marginals A1 (one order up), each shrunk by how much
    the noisy cells support it: random effects fitted by empirical Bayes (ours, not the paper's: a post-processing
    estimator, no privacy argument is involved). None when the noisy cells favour no interactions (tau2 = 0).

    Linearised model (the cells with m0_i > 0, which the public marginals do not force to 0):
        noisy = m0 + G theta + e,  theta ~ N(0, tau2 I),  e ~ N(0, D),  D = diag(2 s^2 + m0)
    (the Laplace noise's variance 2 s^2 and a Poisson count's m0), with G = diag(m0) A1' N and N a basis of the
    theta with A diag(m0) A1' theta = 0: G spans the tangent space at m0 of the order-(h+1) log-linear model
    m0 exp(A1' theta) within the tables that keep the public marginals (its interaction directions; the public
    total without public marginals), so the shift leaves the public marginals unchanged to first order. Then
    noisy ~ N(m0, Sigma), Sigma = D + tau2 G G'; tau2 maximises this marginal likelihood (type-II maximum
    likelihood), and the shift is the best linear unbiased predictor
        delta = E[G theta | noisy] = H (noisy - m0),  H = tau2 G G' Sigma^-1,
    a linear smoother with tr(H) effective parameters (Hastie & Tibshirani 1990, §3.5). With W = D^-1/2 G and
    lambda_j its singular values, Q its left singular vectors, r = noisy - m0 and z = Q' D^-1/2 r:
        log L(tau2) = -1/2 [sum log d_i + sum_j log(1 + tau2 lambda_j^2) + |D^-1/2 r|^2
                            - sum_j tau2 lambda_j^2 / (1 + tau2 lambda_j^2) z_j^2] + const
        tr(H) = sum_j tau2 lambda_j^2 / (1 + tau2 lambda_j^2).
    Every direction is shrunk by its own factor: a strong interaction is kept, a weak one (within the noise)
    nearly removed, unlike the full model one order up (every interaction kept, all its parameters charged).
    The shift enters multiplicatively (m0 exp(delta / m0), positive; cells the interactions empty go to 0) and
    the result is raked onto the public marginals (or the public total m0's).
    """
    on = np.flatnonzero(public > 0)
    m0, r = public[on], np.asarray(noisy, dtype=np.float64)[on] - public[on]
    base = A.toarray()[:, on] if A.shape[0] else np.ones((1, on.size))
    tangent = (A1.toarray()[:, on] * m0).T
    with threadpool_limits(1):
        G = tangent @ null_space(base @ tangent)
        d = 2.0 * noise_scale ** 2 + m0
        Q, lam, _ = np.linalg.svd(G / np.sqrt(d)[:, None], full_matrices=False)
    if lam.size == 0 or lam[0] == 0.0:  # no interaction direction left by the public marginals
        return None
    keep = lam > 1e-9 * lam[0]  # singular values come in descending order
    Q, lam2 = Q[:, keep], lam[keep] ** 2
    z = Q.T @ (r / np.sqrt(d))

    def gain(log_tau2: float) -> float:
        f = math.exp(log_tau2) * lam2
        return 0.5 * float(np.sum(f / (1.0 + f) * z * z) - np.sum(np.log1p(f)))

    # tau2 lambda_j^2 from 1e-6 to 1e6 around the typical direction: below, the gain is 0; above, it falls
    # (the log1p terms grow, the others are bounded).
    centre = -math.log(float(np.median(lam2)))
    best = minimize_scalar(lambda t: -gain(t), bounds=(centre - 14.0, centre + 14.0), method="bounded")
    if not -best.fun > 0.0:
        return None
    tau2 = math.exp(best.x)
    shrink = tau2 * lam2 / (1.0 + tau2 * lam2)
    delta = np.sqrt(d) * (Q @ (shrink * z))
    means = np.zeros_like(public)
    means[on] = m0 * np.exp(np.clip(delta / m0, -30.0, 30.0))
    means = ipf(A, b, means) if A.shape[0] else means * (public.sum() / means.sum())
    return Shrunk(means, float(shrink.sum()), tau2, float(-best.fun))


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
