"""Baselines of the histogram / contingency-table experiments of Lee, Wang & Kifer (KDD 2015).

All are epsilon-DP under add/remove-one-record neighbours of a histogram x of non-negative counts (one record
changes one cell by 1). Each returns an estimate of x; `nonneg_answers` applies the paper's rule that
negative answers of methods without consistent output are replaced by 0.

    lm        identity Laplace mechanism: x + Lap(1/eps)
    lm_tree   LM(H): the noisy k-ary tree, range answers from its nodes without inference (Hay et al.)
    htree     HTree: the noisy tree made consistent by least squares (Hay et al. 2010)
    privelet  Privelet (Xiao, Wang & Gehrke, ICDE 2010), Haar wavelet
    efpa      EFPA (Acs, Castelluccia & Chen, ICDM 2012), Fourier coefficients chosen by the exponential mechanism
    mwem      MWEM (Hardt, Ligett & McSherry, NIPS 2012) for a workload of linear queries
"""

from __future__ import annotations

import numpy as np

from dpalgos.hierarchy import Tree
from dpalgos.mechanisms import laplace_mechanism


def nonneg_answers(answers: np.ndarray) -> np.ndarray:
    return np.maximum(answers, 0.0)


def lm(x: np.ndarray, *, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Laplace mechanism on every cell. Sensitivity: one record changes one cell by 1 (L1 = 1)."""
    return laplace_mechanism(np.asarray(x, dtype=np.float64), sensitivity=1.0, epsilon=epsilon, rng=rng)


def lm_tree(tree: Tree, x: np.ndarray, *, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """LM(H): the noisy tree, no inference. One record is in one node per level: L1 sensitivity = levels.
    Answer ranges with `tree.range_answer` on the returned node vector."""
    return laplace_mechanism(tree.aggregate(x), sensitivity=float(tree.levels), epsilon=epsilon, rng=rng)


def htree(tree: Tree, x: np.ndarray, *, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """HTree: least-squares consistent tree (Hay et al.'s inference) of the noisy tree; returns leaves."""
    return tree.leaves_of(tree.htree(lm_tree(tree, x, epsilon=epsilon, rng=rng)))


def _haar(x: np.ndarray, levels: int) -> np.ndarray:
    """Unnormalised Haar transform: repeatedly (pairwise sums | pairwise differences) on the front part."""
    y = np.array(x, dtype=np.float64)
    n = y.size
    for _ in range(levels):
        head = y[:n]
        y[:n] = np.concatenate([head[0::2] + head[1::2], head[0::2] - head[1::2]])
        n //= 2
    return y


def _inverse_haar(y: np.ndarray, levels: int) -> np.ndarray:
    x = np.array(y, dtype=np.float64)
    n = 2
    for _ in range(levels):
        s, d = x[:n // 2].copy(), x[n // 2:n].copy()
        x[0:n:2], x[1:n:2] = (s + d) / 2.0, (s - d) / 2.0
        n *= 2
    return x


def privelet(x: np.ndarray, *, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Privelet with the Haar wavelet on a histogram padded to 2^m cells.

    In the unnormalised transform every cell enters exactly m + 1 coefficients (the total and one
    difference per level), each with coefficient +-1: one record changes the coefficient vector by L1 = m + 1,
    so Lap((m + 1)/eps) per coefficient is eps-DP (this is Xiao et al.'s weighted noise, add/remove form).
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    m = max(int(np.ceil(np.log2(n))), 0)
    padded = np.zeros(2 ** m)
    padded[:n] = x
    # Sensitivity m + 1 (see the docstring).
    noisy = laplace_mechanism(_haar(padded, m), sensitivity=m + 1.0, epsilon=epsilon, rng=rng)
    return _inverse_haar(noisy, m)[:n]


def _rfft_real(x: np.ndarray) -> np.ndarray:
    """The orthonormal real DFT as a real vector u (n,) with ||u|| = ||x||: [F0, sqrt2 Re F1, sqrt2 Im F1, ...]."""
    n = x.size
    F = np.fft.rfft(x, norm="ortho")
    parts = [F[:1].real]
    last = F.size - 1 if n % 2 == 0 else F.size
    inner = F[1:last]
    parts.append(np.sqrt(2.0) * np.column_stack([inner.real, inner.imag]).reshape(-1))
    if n % 2 == 0:
        parts.append(F[-1:].real)
    return np.concatenate(parts)


def _irfft_real(u: np.ndarray, n: int) -> np.ndarray:
    nf = n // 2 + 1
    F = np.zeros(nf, dtype=np.complex128)
    F[0] = u[0]
    last = nf - 1 if n % 2 == 0 else nf
    pairs = u[1:1 + 2 * (last - 1)].reshape(-1, 2) / np.sqrt(2.0)
    F[1:last] = pairs[:, 0] + 1j * pairs[:, 1]
    if n % 2 == 0:
        F[-1] = u[-1]
    return np.fft.irfft(F, n=n, norm="ortho")


def efpa(x: np.ndarray, *, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """EFPA: keep the first k real Fourier degrees of freedom, k chosen by the exponential mechanism.

    The orthonormal transform u has ||u(x) - u(x')||_2 = 1 for neighbours. Half the budget picks k with score
    -(||u_{>k}||_2 + sqrt(2) k / eps2) (discarded energy plus expected noise), whose sensitivity is 1; the other
    half adds Lap(sqrt(k)/eps2) to the k kept values (their L1 sensitivity is at most sqrt(k) * 1).
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    eps1 = eps2 = epsilon / 2.0
    u = _rfft_real(x)
    tail = np.sqrt(np.maximum(np.cumsum((u * u)[::-1])[::-1], 0.0))  # tail[j] = ||u_j..||
    ks = np.arange(1, n + 1)
    discarded = np.append(tail[1:], 0.0)                              # ||u_{k..}|| for k = 1..n
    score = -(discarded + np.sqrt(2.0) * ks / eps2)
    # Exponential mechanism: score sensitivity 1, P(k) proportional to exp(eps1 * score / 2).
    logits = eps1 * score / 2.0
    p = np.exp(logits - logits.max())
    k = int(rng.choice(ks, p=p / p.sum()))
    kept = np.zeros(n)
    # Sensitivity: L1 of the k kept values <= sqrt(k) * L2 sensitivity (1).
    kept[:k] = laplace_mechanism(u[:k], sensitivity=np.sqrt(k), epsilon=eps2, rng=rng)
    return _irfft_real(kept, n)


def mwem(x: np.ndarray, queries: np.ndarray, *, epsilon: float, rounds: int, total: float,
         rng: np.random.Generator, update_passes: int = 10, sensitivity: float = 1.0) -> np.ndarray:
    """MWEM for the workload `queries` (q, n) of 0/1 (or bounded by 1 in absolute value) linear queries.

    `total` is the public (or separately measured) mass of x. One record changes every query answer by at
    most `sensitivity` (1 for a histogram of records). Each round spends eps/(2T) on the exponential
    mechanism choosing the worst-answered query (score |q.A - q.x|) and eps/(2T) on a Laplace measurement of
    it; the estimate is updated by multiplicative weights over all measurements so far, and the average of
    the rounds' estimates is returned.
    """
    x = np.asarray(x, dtype=np.float64)
    Q = np.asarray(queries, dtype=np.float64)
    n = x.size
    A = np.full(n, total / n)
    eps_round = epsilon / (2.0 * rounds)
    true = Q @ x
    measured: list[tuple[int, float]] = []
    average = np.zeros(n)
    for _ in range(rounds):
        error = np.abs(Q @ A - true)
        # Exponential mechanism, score sensitivity `sensitivity`: weights exp(eps_round * score / (2 sens)).
        logits = eps_round * error / (2.0 * sensitivity)
        p = np.exp(logits - logits.max())
        i = int(rng.choice(Q.shape[0], p=p / p.sum()))
        # One query answer, sensitivity `sensitivity`.
        measured.append((i, float(laplace_mechanism(true[i], sensitivity=sensitivity, epsilon=eps_round,
                                                     rng=rng))))
        for _ in range(update_passes):
            for j, m in measured:
                A = A * np.exp(Q[j] * (m - Q[j] @ A) / (2.0 * total))
                A *= total / A.sum()
        average += A
    return average / rounds
