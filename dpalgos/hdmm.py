"""HDMM's optimised strategy for the range queries of a 1-D histogram (McKenna, Miklau, Hay & Machanavajjhala,
"Optimizing error of high-dimensional statistical queries under differential privacy", VLDB 2018): OPT_0 over the
p-Identity template, for the workload W of all n(n+1)/2 ranges [i, j] of n bins.

p-Identity strategy (§5.1 of the paper): A = [I; B] D, B >= 0 (p x n), D = diag(1/s), s_j = 1 + sum_i B_ij. Every
column of A has L1 norm (1 + sum_i B_ij) / s_j = 1: one record changes the histogram x by e_j and A x by column j,
so the strategy's L1 sensitivity is 1 whatever B is, and Laplace(1/epsilon) on every row of A x is epsilon-DP.

Expected total squared error of the least-squares estimate (the paper's eq. for OPT_0, with ||A||_1 = 1):
    f(B) = trace(W'W (A'A)^-1) * 2 / epsilon^2,   (A'A)^-1 = S X S,  S = diag(s),  X = (I + B'B)^-1
         = trace(C X) * 2 / epsilon^2,            C = S W'W S
with X = I - B' R B, R = (I_p + B B')^-1 (Woodbury): every evaluation costs O(n p^2), and W'W enters only through
its product with a matrix, which for all ranges is two cumulative sums (`range_gram_apply`), never the n x n Gram.
Gradient (ours, derived from the two dependences of f on B: through s and through X):
    df/dB = 2 1 g' - 2 (R B C - R (B C B') R B),   g_j = (C X)_jj / s_j.
The least-squares estimate from y = A x + noise (`PIdentity.least_squares`): x^ = S X (y_I + B' y_B), linear in y.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize
from threadpoolctl import threadpool_limits

#: HDMM's choice of p for a 1-D workload (the paper's 1-D experiments): n / 16 rows beside the identity.
ROWS_PER_BIN = 1 / 16


def default_rows(n: int) -> int:
    return max(1, int(n * ROWS_PER_BIN))


def range_gram_apply(V: np.ndarray) -> np.ndarray:
    """W'W V for W the n(n+1)/2 ranges of n bins: (W'W)_ab = #ranges holding a and b
    = (min(a, b) + 1)(n - max(a, b)) (0-based), so (W'W V)_a = (n - a) sum_{b <= a} (b + 1) V_b
    + (a + 1) sum_{b > a} (n - b) V_b: O(n k) for V (n, k)."""
    V = np.asarray(V, dtype=np.float64)
    n = V.shape[0]
    up = np.arange(1.0, n + 1.0)[:, None]            # a + 1
    down = n - np.arange(n, dtype=np.float64)[:, None]  # n - a
    below = np.cumsum(up * V, axis=0)
    through = np.cumsum(down * V, axis=0)            # sum_{b > a} = the total less sum_{b <= a}
    return down * below + up * (through[-1] - through)


def range_gram_diag(n: int) -> np.ndarray:
    a = np.arange(n, dtype=np.float64)
    return (a + 1.0) * (n - a)


def loss_and_grad(theta: np.ndarray, p: int, n: int) -> tuple[float, np.ndarray]:
    """trace(C X) (the expected total squared error of all ranges at epsilon = sqrt(2), i.e. in units of 2/eps^2)
    and its gradient in B, for B = theta reshaped (p, n)."""
    B = theta.reshape(p, n)
    s = 1.0 + B.sum(axis=0)
    CBt = s[:, None] * range_gram_apply(s[:, None] * B.T)          # C B', n x p
    K = B @ CBt                                                     # B C B', p x p
    K = 0.5 * (K + K.T)
    try:
        chol = linalg.cho_factor(np.eye(p) + B @ B.T)
    except linalg.LinAlgError:
        return np.inf, np.zeros_like(theta)
    RB, RK = linalg.cho_solve(chol, B), linalg.cho_solve(chol, K)
    diag_c = s * s * range_gram_diag(n)
    loss = float(diag_c.sum() - np.trace(RK))
    g = (diag_c - np.einsum("jk,kj->j", CBt, RB)) / s                # (C X)_jj / s_j
    grad = 2.0 * g[None, :] - 2.0 * (linalg.cho_solve(chol, CBt.T) - RK @ RB)
    return loss, grad.ravel()


def identity_loss(n: int) -> float:
    """trace(W'W): the identity strategy's error, in the same units."""
    return float(range_gram_diag(n).sum())


@dataclass(frozen=True)
class Optimised:
    B: np.ndarray
    loss: float
    iterations: int
    starts: int
    seconds: float


def optimise(n: int, p: int | None = None, seed: int = 0, *, maxiter: int = 3000, ftol: float = 1e-10,
             max_starts: int = 10) -> Optimised:
    """OPT_0: L-BFGS-B on `loss_and_grad` from B ~ U[0, 1)^(p x n) drawn with `seed` (the paper's random start),
    B >= 0. B = 0, the identity, is a stationary point on the bound (the gradient there is 2 diag(W'W) > 0 in every
    entry): a run that ends within 0.1 % of the identity's loss starts again from seed + 1, ... (at most max_starts
    runs), and the best run is kept. Deterministic given (n, p, seed) and the floating-point library: the release
    commits the B it measured with, so nothing depends on recomputing it."""
    p = default_rows(n) if p is None else int(p)
    identity, best, iterations, t0 = identity_loss(n), None, 0, time.perf_counter()
    with threadpool_limits(1):  # its products are small: threaded BLAS ran 25x slower on 2 loaded cores
        best, iterations, start = _starts(n, p, seed, identity, maxiter, ftol, max_starts)
    return Optimised(best.x.reshape(p, n), float(best.fun), iterations, start + 1, time.perf_counter() - t0)


#: The largest entry of a B the optimiser may return. Past it the loss is a difference of numbers of order
#: (1 + sum B)^2 n^2 and cancels to nothing: at 8 bins L-BFGS-B ran B to 1.2e9, "loss" 0, and least squares on the
#: strategy lost a bin. The shipped strategies' entries are below 150.
MAX_ENTRY = 1e4


def sane(B: np.ndarray) -> bool:
    """A p-Identity B whose loss and least squares are computed reliably (`MAX_ENTRY`)."""
    return bool(np.isfinite(B).all() and B.min() >= 0 and B.max() <= MAX_ENTRY)


def _starts(n: int, p: int, seed: int, identity: float, maxiter: int, ftol: float, max_starts: int):
    """The best sane run of up to max_starts; B = 0 (the identity, loss `identity`) when none is sane."""
    best = optimize.OptimizeResult(x=np.zeros(p * n), fun=identity)
    iterations = 0
    for start in range(max_starts):
        x0 = np.random.default_rng(seed + start).random(p * n)
        res = optimize.minimize(loss_and_grad, x0, args=(p, n), jac=True, method="L-BFGS-B",
                                bounds=[(0.0, None)] * x0.size,
                                options={"ftol": ftol, "gtol": 1e-12, "maxiter": maxiter, "maxfun": 2 * maxiter})
        iterations += int(res.nit)
        if sane(res.x) and 0 < res.fun < best.fun:
            best = res
        if best.fun < 0.999 * identity:
            break
    return best, iterations, start


class PIdentity:
    """The strategy A = [I; B] D: its rows' answers, its sensitivity, and least squares from noisy answers."""

    #: The last strategies made through `of`, by their matrix's digest: B B' and its factor cost O(n p^2) (a third of
    #: a second at 4,096 bins), and a release's draw, postprocessing and bootstrap each ask for the same B.
    _made: dict[bytes, PIdentity] = {}

    @classmethod
    def of(cls, B: np.ndarray) -> PIdentity:
        """The strategy of B, made once per matrix (by value) among the last few asked for."""
        B = np.ascontiguousarray(B, dtype=np.float64)
        key = hashlib.sha256(repr(B.shape).encode() + B.tobytes()).digest()
        if key not in cls._made:
            if len(cls._made) >= 4:
                cls._made.pop(next(iter(cls._made)))
            cls._made[key] = cls(B)
        return cls._made[key]

    def __init__(self, B: np.ndarray):
        B = np.asarray(B, dtype=np.float64)
        if B.ndim != 2 or np.any(B < 0) or not np.all(np.isfinite(B)):
            raise ValueError("a p-Identity strategy needs a finite non-negative p x n matrix B")
        self.B = B
        self.p, self.n = B.shape
        self.s = 1.0 + B.sum(axis=0)
        self._chol = linalg.cho_factor(np.eye(self.p) + B @ B.T)

    @property
    def rows(self) -> int:
        return self.n + self.p

    def sensitivity(self) -> float:
        """The largest column L1 norm of A as computed in floating point (1 up to rounding)."""
        return float(np.max((1.0 + self.B.sum(axis=0)) / self.s))

    def _column(self, a: np.ndarray) -> np.ndarray:
        """s shaped to scale the rows of `a`: a vector, or a matrix whose columns are histograms (the Kronecker
        strategy of `dpalgos.kronecker` applies A to every column at once)."""
        return self.s.reshape((-1,) + (1,) * (a.ndim - 1))

    def answers(self, x: np.ndarray) -> np.ndarray:
        """A x: the n scaled bins x / s, then the p weighted sums B (x / s) (x: (n,) or (n, k), column by column)."""
        x = np.asarray(x, dtype=np.float64)
        scaled = x / self._column(x)
        return np.concatenate([scaled, self.B @ scaled])

    def least_squares(self, y: np.ndarray) -> np.ndarray:
        """(A'A)^-1 A' y = S X (y_I + B' y_B): linear in y, so unbiased for any histogram (y: (n + p,) or
        (n + p, k), column by column)."""
        y = np.asarray(y, dtype=np.float64)
        v = y[:self.n] + self.B.T @ y[self.n:]
        return self._column(v) * (v - self.B.T @ linalg.cho_solve(self._chol, self.B @ v))

    def estimate_weights(self, q: np.ndarray) -> np.ndarray:
        """P' q for P = (A'A)^-1 A' the least-squares operator: the weights of the noisy answers in the estimate's
        value of the query q over the bins (its standard deviation is the noise's times ||P' q||)."""
        z = self.s * np.asarray(q, dtype=np.float64)
        z = self.s * (z - self.B.T @ linalg.cho_solve(self._chol, self.B @ z))
        return self.answers(z)

    @functools.cached_property
    def loss(self) -> float:
        """trace(W'W (A'A)^-1) for all ranges (units of 2 / epsilon^2 per unit sensitivity)."""
        return loss_and_grad(self.B.ravel(), self.p, self.n)[0]
