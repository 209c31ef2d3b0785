"""Maximum-likelihood postprocessing under consistency constraints by ADMM.

Lee, Wang & Kifer, "Maximum Likelihood Postprocessing for Differential Privacy under Consistency
Constraints" (KDD 2015). With Laplace noise, the maximum-likelihood estimate consistent with what is known
to hold in the data is the constrained L1 problem (7)

    minimise ||x - x~||_1   subject to   A x = b,  x >= 0,

solved here by ADMM in the paper's splittings:

* `solve_linear`      Algorithm 1 (and 2): y = x - x~, z = x >= 0, A x = b kept as an augmented term; the
                      x-update solves (A'A + 2I) x = (y + x~ - mu) + (z - nu) + A'(b - eta)   (eq. 15/24)
                      with one factorisation of A'A + 2I, reused every iteration;
* `solve_projection`  Algorithm 3: the subspace C = {A x = 0} handled by a Euclidean projection Pi_C
                      (e.g. Hay et al.'s tree inference `Tree.htree`), in two blocks: x (the residual prox
                      clipped at zero, which is Algorithm 3's y and w at once) and z = Pi_C(x + u);
* `solve_matrix_mechanism`  Algorithm 4: minimise ||A x - r~||_1 s.t. x >= 0 (matrix mechanism).

The penalty on the residual y is one of (§4.5-4.6):
    "l1"       ||y||_1                                  prox: soft thresholding S_{1/rho}      (eq. 13)
    "elastic"  alpha ||y||_1 + (1 - alpha) ||y||_2^2    prox: Theta_{alpha,rho}                (eq. 14, 23)
    "l2"       1/2 ||y||_2^2                            prox: rho v / (1 + rho)                (eq. 25)
Stopping rule (22): every primal residual ||r_i||_2 <= tau_1 and rho ||x^{k+1} - x^k||_2 <= tau_2.
Defaults alpha = 0.9, rho = 2.0 as in the paper's experiments.

Reading one release's path (docs/explanation/architecture.md): next, tasks/manifest.py, the publish.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

import numba
import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

Penalty = Literal["l1", "elastic", "l2"]
ALPHA = 0.9
RHO = 2.0
#: Over-relaxation of the projection variant (Boyd et al. 2011 §3.4.3). In admm_vs_highs (2^16 leaves, default
#: tolerance) a = 1.6 stops after 72 iterations 5.6e-5 above the LP optimum, a = 1 after 65 iterations 2.3e-4
#: above it (1.8: 91 iterations, 2.9e-5).
RELAXATION = 1.6
#: Lets the compiler vectorise the update loops (their squared-norm sums are reassociated).
_FAST = {"reassoc", "contract", "nsz", "arcp"}


def soft_threshold(v: np.ndarray, tau: float) -> np.ndarray:
    """S_tau(v) = sign(v) max(|v| - tau, 0), element-wise (eq. 13)."""
    return np.sign(v) * np.maximum(np.abs(v) - tau, 0.0)


def theta(v: np.ndarray, alpha: float, rho: float) -> np.ndarray:
    """Theta_{alpha,rho}(v): the prox of alpha|y| + (1 - alpha) y^2 with penalty rho (eq. 14):
    0 if |v| <= alpha/rho, else rho (v - (alpha/rho) sign v) / (2(1 - alpha) + rho)."""
    return rho * soft_threshold(v, alpha / rho) / (2.0 * (1.0 - alpha) + rho)


def prox(penalty: Penalty, alpha: float, rho: float) -> Callable[[np.ndarray], np.ndarray]:
    """argmin_y f(y) + rho/2 ||y - v||^2 for the residual penalty f."""
    if penalty == "l1":
        return lambda v: soft_threshold(v, 1.0 / rho)
    if penalty == "elastic":
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        return lambda v: theta(v, alpha, rho)
    if penalty == "l2":
        return lambda v: (rho / (1.0 + rho)) * v
    raise ValueError(f"unknown penalty {penalty!r}: use 'l1', 'elastic' or 'l2'")


def penalty_value(residual: np.ndarray, penalty: Penalty, alpha: float = ALPHA) -> float:
    r = np.asarray(residual)
    if penalty == "l1":
        return float(np.abs(r).sum())
    if penalty == "elastic":
        return float(alpha * np.abs(r).sum() + (1.0 - alpha) * (r * r).sum())
    return float(0.5 * (r * r).sum())


@dataclass
class AdmmResult:
    """x: the estimate (non-negativity exact when requested); objective: the penalty of its residual
    (and the L1 norm of the residual as `l1_objective`); residuals: final primal residual norms and
    rho||x^{k+1} - x^k|| of rule (22), in units of the solver's `scale`, with the tolerance used."""
    x: np.ndarray
    iterations: int
    converged: bool
    objective: float
    l1_objective: float
    residuals: dict = field(default_factory=dict)
    seconds: float = 0.0


def _tolerance(n: int, scale: float, abs_tol: float, rel_tol: float) -> float:
    return np.sqrt(n) * abs_tol + rel_tol * scale


class _SpdSolver:
    """Solves (A'A + c I) x = q with one factorisation: dense Cholesky, sparse LU, or conjugate gradients."""

    def __init__(self, A, c: float, method: str = "auto"):
        n = A.shape[1]
        if method == "auto":
            method = "cholesky" if not sp.issparse(A) else ("splu" if n <= 200_000 else "cg")
        self.method = method
        if method == "cholesky":
            self.dense = A.toarray() if sp.issparse(A) else np.asarray(A, dtype=np.float64)
            self._factor = sla.cho_factor(self.dense.T @ self.dense + c * np.eye(n), lower=True)
        elif method == "splu":
            As = sp.csr_matrix(A)
            self._factor = spla.splu((As.T @ As + c * sp.identity(n)).tocsc())
        elif method == "cg":
            As = sp.csr_matrix(A)
            self._op = spla.LinearOperator((n, n), matvec=lambda v: As.T @ (As @ v) + c * v, dtype=np.float64)
        else:
            raise ValueError(f"unknown linear solver {method!r}")

    def solve(self, q: np.ndarray, guess: np.ndarray) -> np.ndarray:
        if self.method == "cholesky":
            return sla.cho_solve(self._factor, q)
        if self.method == "splu":
            return self._factor.solve(q)
        x, _ = spla.cg(self._op, q, x0=guess, rtol=1e-10, maxiter=200)
        return x


def solve_linear(x_tilde, A, b, *, penalty: Penalty = "elastic", alpha: float = ALPHA, rho: float = RHO,
                 nonneg: bool | np.ndarray = True, scale: float = 1.0, abs_tol: float = 1e-4, rel_tol: float = 0.0,
                 max_iter: int = 20_000, linear_solver: str = "auto") -> AdmmResult:
    """Algorithm 1 (penalty "l1") / Algorithm 2 ("elastic"): min f(x - x~) s.t. A x = b, x >= 0.

    x_tilde : (n,) noisy measurements. A : (p, n) dense or sparse. b : (p,).
    nonneg : True (every coordinate >= 0), False, or a boolean mask (n,) of the coordinates kept >= 0.
    scale : residuals in units of `scale` (the Laplace noise scale), see `solve_projection`.
    """
    start = time.perf_counter()
    xt = np.asarray(x_tilde, dtype=np.float64) / scale
    b = np.asarray(b, dtype=np.float64) / scale
    n = xt.size
    y_step = prox(penalty, alpha, rho)
    lower = np.where(np.broadcast_to(nonneg, (n,)), 0.0, -np.inf)  # z = Pi_C(x + nu), C = {x >= lower}
    # A'A + 2I: the x-update of eq. (15) has coefficient 1 from each of the y and z splittings.
    solver = _SpdSolver(A, 2.0, linear_solver)
    Atb = A.T @ b
    x = xt.copy()
    mu, nu, eta = np.zeros(n), np.zeros(n), np.zeros(b.size)
    tau = _tolerance(n, max(np.linalg.norm(xt), np.linalg.norm(b)), abs_tol, rel_tol)
    if solver.method == "cholesky":
        L = np.tril(solver._factor[0])
        sq = np.zeros(4)
        k = _dense_iterations(xt, np.ascontiguousarray(solver.dense), b, Atb, L, np.ascontiguousarray(L.T), lower, x,
                              mu, nu, eta, penalty_code(penalty, alpha), alpha, rho, tau, max_iter, sq)
        res = {"r_fit": np.sqrt(sq[0]), "r_nonneg": np.sqrt(sq[1]), "r_constraint": np.sqrt(sq[2]),
               "dual": rho * np.sqrt(sq[3])}
        return _result(x * scale, xt * scale, penalty, alpha, lower, k, res, tau, start)
    res = {}
    for k in range(1, max_iter + 1):
        y = y_step(x - xt + mu)
        z = np.maximum(x + nu, lower)
        x_new = solver.solve((y + xt - mu) + (z - nu) + Atb - A.T @ eta, x)
        r1, r2, r3 = x_new - xt - y, x_new - z, A @ x_new - b
        mu += r1
        nu += r2
        eta += r3
        res = {"r_fit": np.linalg.norm(r1), "r_nonneg": np.linalg.norm(r2), "r_constraint": np.linalg.norm(r3),
               "dual": rho * np.linalg.norm(x_new - x)}
        x = x_new
        if max(res["r_fit"], res["r_nonneg"], res["r_constraint"]) <= tau and res["dual"] <= tau:
            break
    return _result(x * scale, xt * scale, penalty, alpha, lower, k, res, tau, start)


@numba.njit(cache=True)
def _dense_iterations(xt, A, b, Atb, L, U, lower, x, mu, nu, eta, code, alpha, rho, tau, max_iter, sq):
    """`solve_linear`'s iterations with a dense A and the Cholesky factor L = U' of A'A + 2I, in buffers
    allocated once (x, mu, nu, eta are updated in place); returns the iteration count, sq the squared
    residual norms (fit, non-negativity, constraint) and ||x^{k+1} - x^k||^2."""
    n, p = xt.size, b.size
    y, z, q, xn = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    for k in range(1, max_iter + 1):
        for i in range(n):
            y[i] = _prox_scalar(x[i] - xt[i] + mu[i], code, alpha, rho)
            z[i] = max(x[i] + nu[i], lower[i])
            q[i] = (y[i] + xt[i] - mu[i]) + (z[i] - nu[i]) + Atb[i]
        for j in range(p):
            for i in range(n):
                q[i] -= A[j, i] * eta[j]
        for i in range(n):  # L w = q, then U x = w
            s = q[i]
            for j in range(i):
                s -= L[i, j] * xn[j]
            xn[i] = s / L[i, i]
        for i in range(n - 1, -1, -1):
            s = xn[i]
            for j in range(i + 1, n):
                s -= U[i, j] * xn[j]
            xn[i] = s / U[i, i]
        s_fit = s_neg = s_con = s_dx = 0.0
        for j in range(p):
            r = -b[j]
            for i in range(n):
                r += A[j, i] * xn[i]
            eta[j] += r
            s_con += r * r
        for i in range(n):
            r1, r2, d = xn[i] - xt[i] - y[i], xn[i] - z[i], xn[i] - x[i]
            mu[i] += r1
            nu[i] += r2
            x[i] = xn[i]
            s_fit += r1 * r1
            s_neg += r2 * r2
            s_dx += d * d
        sq[0], sq[1], sq[2], sq[3] = s_fit, s_neg, s_con, s_dx
        if max(s_fit, s_neg, s_con) <= tau * tau and rho * rho * s_dx <= tau * tau:
            return k
    return max_iter


def solve_projection(x_tilde, project: Callable[[np.ndarray], np.ndarray], *, penalty: Penalty = "elastic",
                     alpha: float = ALPHA, rho: float = RHO, nonneg: bool = True, x0=None, scale: float = 1.0,
                     abs_tol: float = 1e-3, rel_tol: float = 0.0, max_iter: int = 20_000,
                     relaxation: float = RELAXATION) -> AdmmResult:
    """Algorithm 3: min f(x - x~) s.t. x in C, x >= 0, with `project` the Euclidean projection onto the
    subspace C (e.g. `Tree.htree`; C must be a linear subspace, A x = 0).

    Two blocks instead of the paper's three: f(x - x~) + [x >= 0] is separable, so its prox is the residual
    prox clipped at zero (exact in one dimension) and the y and w blocks of Algorithm 3 merge into x. The
    problem and its solutions are the same; the iteration keeps two vectors (v = x^ + u and x) instead of
    five, and converges in about half the iterations. With the scaled dual u and relaxation a (Boyd et al.
    2011, §3.4.3; a = 1 is plain ADMM):
        x = clip(x~ + prox_f(z - u - x~)),  x^ = a x + (1 - a) z,  z' = Pi_C(x^ + u),  u' = x^ + u - z'.
    A projection object with an `admm_pass(v, x, xt, nonneg, code, alpha, rho, relaxation, sq)` method
    (`Tree.projection()`) does the projection and the update in its own passes, without allocating.

    x0 : starting point z (default x~, as in the paper; the least-squares estimate project(x~) is a good
    warm start). scale : residuals are measured in units of `scale` (pass the Laplace noise scale: the L1
    solution does not depend on it, and rho, alpha and the tolerances then do not depend on epsilon).
    Stopping rule (22): ||x - z|| <= tau and rho ||x^{k+1} - x^k|| <= tau.
    """
    start = time.perf_counter()
    code = penalty_code(penalty, alpha)
    x_tilde = np.asarray(x_tilde, dtype=np.float64)
    xt = x_tilde / scale
    v = xt.copy() if x0 is None else np.array(x0, dtype=np.float64) / scale
    x, sq = v.copy(), np.zeros(2)
    _projection_update(v, v, x, xt, nonneg, code, alpha, rho, relaxation, sq)  # z^0 = v, u = 0: x^1 and v^1
    fused = getattr(project, "admm_pass", None)
    tau = _tolerance(xt.size, np.linalg.norm(xt), abs_tol, rel_tol)
    for k in range(1, max_iter + 1):
        if fused is not None:
            fused(v, x, xt, nonneg, code, alpha, rho, relaxation, sq)
        else:
            _projection_update(v, project(v), x, xt, nonneg, code, alpha, rho, relaxation, sq)
        res = {"r_constraint": np.sqrt(sq[0]), "dual": rho * np.sqrt(sq[1])}
        if max(res.values()) <= tau:
            break
    x *= scale
    if nonneg:
        np.maximum(x, 0.0, out=x)
    objective, l1 = _objective(x, x_tilde, code, alpha)
    return AdmmResult(x, k, bool(max(res.values()) <= tau), objective, l1, {**res, "tolerance": tau},
                      time.perf_counter() - start)


@numba.njit(cache=True, fastmath=_FAST)
def _objective(x, xt, code, alpha):
    """`penalty_value` and the L1 norm of x - xt without temporaries (they are the size of the problem)."""
    s1 = s2 = 0.0
    for i in range(x.size):
        r = x[i] - xt[i]
        s1 += abs(r)
        s2 += r * r
    return (s1 if code == 0 else alpha * s1 + (1.0 - alpha) * s2 if code == 1 else 0.5 * s2), s1


_PENALTY_CODES = {"l1": 0, "elastic": 1, "l2": 2}


def penalty_code(penalty: Penalty, alpha: float) -> int:
    """The residual penalty as the integer the compiled kernels take."""
    if penalty not in _PENALTY_CODES:
        raise ValueError(f"unknown penalty {penalty!r}: use 'l1', 'elastic' or 'l2'")
    if penalty == "elastic" and not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return _PENALTY_CODES[penalty]


@numba.njit(cache=True, inline="always")
def _prox_scalar(v, code, alpha, rho):
    """The prox of `prox` on one value, without data-dependent branches (their mispredictions on noisy data
    cost more than the arithmetic)."""
    if code == 2:
        return rho / (1.0 + rho) * v
    tau = 1.0 / rho if code == 0 else alpha / rho
    y = math.copysign(max(abs(v) - tau, 0.0), v)
    return y if code == 0 else rho * y / (2.0 * (1.0 - alpha) + rho)


@numba.njit(cache=True, inline="always")
def projection_update(v, z, xt, nonneg, code, alpha, rho, relaxation):
    """One coordinate of the two-block iteration (see `solve_projection`) after z = Pi_C(v), v = x^ + u:
    returns the next x and the next projection input v' = x^' + u'."""
    u = v - z
    x = xt + _prox_scalar(z - u - xt, code, alpha, rho)
    if nonneg:
        x = max(x, 0.0)
    return x, relaxation * x + (1.0 - relaxation) * z + u


@numba.njit(cache=True, fastmath=_FAST)
def update_all(v, x, xt, z, nonneg, code, alpha, rho, relaxation):
    """`projection_update` on every coordinate (the arguments may be views of one run of coordinates), with
    z the projections; returns the sums of (x - z)^2 and (x' - x)^2."""
    s_con = s_dx = 0.0
    for i in range(v.size):
        r = x[i] - z[i]
        xn, v[i] = projection_update(v[i], z[i], xt[i], nonneg, code, alpha, rho, relaxation)
        d = xn - x[i]
        x[i] = xn
        s_con += r * r
        s_dx += d * d
    return s_con, s_dx


def _projection_update(v, z, x, xt, nonneg, code, alpha, rho, relaxation, sq):
    """The update of every coordinate after a projection z; sq gets ||x - z||^2 and ||x' - x||^2."""
    sq[:] = update_all(v, x, xt, z, nonneg, code, alpha, rho, relaxation)


def solve_matrix_mechanism(r_tilde, A, *, penalty: Penalty = "elastic", alpha: float = ALPHA, rho: float = RHO,
                           scale: float = 1.0, abs_tol: float = 1e-4, rel_tol: float = 0.0, max_iter: int = 20_000,
                           linear_solver: str = "auto") -> AdmmResult:
    """Algorithm 4: min f(A x - r~) s.t. x >= 0 for noisy strategy answers r~ (m,) of A (m, n).

    The x-update solves (A'A + I) x = A'(r~ - y - mu) + (z - nu) with one factorisation.
    scale : residuals in units of `scale` (the Laplace noise scale), see `solve_projection`.
    """
    start = time.perf_counter()
    rt = np.asarray(r_tilde, dtype=np.float64) / scale
    n = A.shape[1]
    y_step = prox(penalty, alpha, rho)
    solver = _SpdSolver(A, 1.0, linear_solver)
    x = np.zeros(n)
    z = np.zeros(n)
    mu, nu = np.zeros(rt.size), np.zeros(n)
    tau = _tolerance(max(n, rt.size), np.linalg.norm(rt), abs_tol, rel_tol)
    res = {}
    for k in range(1, max_iter + 1):
        y = y_step(rt - A @ x - mu)
        z = np.maximum(x + nu, 0.0)
        x_new = solver.solve(A.T @ (rt - y - mu) + (z - nu), x)
        r1, r2 = A @ x_new - rt + y, x_new - z
        mu += r1
        nu += r2
        res = {"r_fit": np.linalg.norm(r1), "r_nonneg": np.linalg.norm(r2),
               "dual": rho * np.linalg.norm(A @ (x_new - x))}
        x = x_new
        if max(res["r_fit"], res["r_nonneg"]) <= tau and res["dual"] <= tau:
            break
    x = np.maximum(x, 0.0) * scale
    resid = A @ x - rt * scale
    return AdmmResult(x, k, bool(max(res.values()) <= tau), penalty_value(resid, penalty, alpha),
                      float(np.abs(resid).sum()), {**res, "tolerance": tau}, time.perf_counter() - start)


def _result(x, xt, penalty, alpha, lower, k, res, tau, start) -> AdmmResult:
    x = np.maximum(x, lower)  # exact non-negativity; moves x by at most the r_nonneg tolerance
    converged = max(res.values()) <= tau
    return AdmmResult(x, k, bool(converged), penalty_value(x - xt, penalty, alpha), float(np.abs(x - xt).sum()),
                      {**res, "tolerance": tau}, time.perf_counter() - start)
