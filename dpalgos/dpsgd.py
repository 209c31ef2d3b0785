"""Differentially private SGD with a per-batch clipping bound (Acs et al. Algorithm 4, after Abadi et al.).

Per-example gradients are never materialised as a (B x P) matrix: a model returns, for every dense layer, the
layer inputs a (B, in) and the back-propagated errors delta (B, out). The per-example gradient of the layer
is the outer product a_i delta_i' (plus delta_i for the bias), so its norm is ||a_i|| ||delta_i|| and the sum
of the clipped per-example gradients is one product (f * a)' delta, f_i = min(1, C_s / ||g_i||).

One step on a Poisson sample (rate q) of the training records:
  1. the histogram of the per-example gradient norms over `bins` intervals of (0, c_max] gets N(0, sigma_n^2)
     noise on every bin (L2 sensitivity 1: one record is in one bin) and C_s is the upper edge of the noisy
     mode (DPNorm, Algorithm 3);
  2. per-example gradients are clipped to norm C_s and summed; the sum gets N(0, (sigma_g C_s)^2) noise per
     coordinate (L2 sensitivity C_s);
  3. the noisy sum is divided by the expected batch size.
Privacy of one step: the two noisy outputs are an adaptive composition of Gaussian mechanisms on the same
batch whose normalised shifts are at most 1/sigma_n and 1/sigma_g; their joint privacy loss is dominated by
one Gaussian mechanism of noise multiplier sigma_eff = (sigma_n^-2 + sigma_g^-2)^(-1/2) on the concatenated
vector (Gaussian mechanisms compose exactly: mu-GDP with mu^2 = sum of squares), applied to a Poisson sample
of rate q: the plan entry "sgd" of `dpalgos.dpgm.plan`, drawn from a per-step generator (dpalgos.noise).

Speed: the gradient noise is N(0, 1) draws scaled by sigma_g C_s afterwards, so they can be drawn before C_s
is known (`dpgm.train` draws them on another thread while the gradients are computed); adding them, dividing
by the batch size and the Adam update are one pass over the parameters (`Adam.noisy_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp


@dataclass
class LayerGrad:
    """Factored per-example gradients of one dense layer: d loss_i / dW = outer(a_i, delta_i) and
    d loss_i / db = delta_i. With a = None the layer is a bare bias (per-example gradient delta_i)."""
    a: np.ndarray | sp.csr_matrix | None
    delta: np.ndarray
    bias: bool = True

    @property
    def size(self) -> int:
        """Parameters of the layer (weights then bias)."""
        out = self.delta.shape[1]
        return (0 if self.a is None else self.a.shape[1] * out) + (out if self.bias or self.a is None else 0)


def _row_sq_norms(a) -> np.ndarray:
    if sp.issparse(a):
        return np.asarray(a.multiply(a).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", a, a)


def per_example_norms(layers: list[LayerGrad]) -> np.ndarray:
    """L2 norm of every example's whole gradient (all layers), without forming it."""
    sq = 0.0
    for layer in layers:
        d2 = np.einsum("ij,ij->i", layer.delta, layer.delta)
        if layer.a is not None:
            sq = sq + _row_sq_norms(layer.a) * d2
        if layer.bias or layer.a is None:
            sq = sq + d2
    return np.sqrt(np.maximum(sq, 0.0))


def _weight_sum(a, delta: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """sum_i f_i outer(a_i, delta_i), scaling whichever factor has fewer columns."""
    if sp.issparse(a):
        return np.asarray(a.T @ (delta * factors[:, None]))
    if a.shape[1] <= delta.shape[1]:
        return (a * factors[:, None]).T @ delta
    return a.T @ (delta * factors[:, None])


def clipped_sum(layers: list[LayerGrad], factors: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """sum_i f_i g_i, flattened layer by layer (weights (in, out) row-major, then bias)."""
    out = np.empty(sum(layer.size for layer in layers)) if out is None else out
    at = 0
    for layer in layers:
        width = layer.delta.shape[1]
        if layer.a is not None:
            n = layer.a.shape[1] * width
            out[at:at + n] = _weight_sum(layer.a, layer.delta, factors).ravel()
            at += n
        if layer.bias or layer.a is None:
            out[at:at + width] = factors @ layer.delta
            at += width
    return out


def per_example_gradients(layers: list[LayerGrad]) -> np.ndarray:
    """The (B, P) matrix of flattened per-example gradients, the slow way (for tests)."""
    rows = []
    for i in range(layers[0].delta.shape[0]):
        parts = []
        for layer in layers:
            d = layer.delta[i]
            if layer.a is not None:
                a = layer.a[i].toarray().ravel() if sp.issparse(layer.a) else layer.a[i]
                parts.append(np.outer(a, d).ravel())
            if layer.bias or layer.a is None:
                parts.append(d)
        rows.append(np.concatenate(parts))
    return np.array(rows)


def noisy_mode_bound(norms: np.ndarray, *, c_max: float, bins: int, sigma: float, rng: np.random.Generator) -> float:
    """DPNorm over gradient norms: the upper edge of the noisy mode of their histogram on (0, c_max]."""
    edges = c_max / bins
    idx = np.ceil(np.asarray(norms) / edges).astype(np.int64)
    ok = (idx >= 1) & (idx <= bins)
    hist = np.bincount(idx[ok] - 1, minlength=bins).astype(np.float64)
    # One example is in one bin: L2 sensitivity 1, noise sigma (the norm half of the "sgd" plan entry).
    noisy = hist + rng.normal(0.0, sigma, size=hist.shape)
    return (int(np.argmax(noisy)) + 1) * edges


def clip_and_sum(layers: list[LayerGrad], *, sigma_norm: float, c_max: float, bins: int, rng: np.random.Generator,
                 out: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Algorithm 4, lines 3-5 on the factored gradients of a Poisson batch (possibly empty): the DPNorm bound
    C_s and the exact sum of the per-example gradients clipped to it (the noise is added by the update)."""
    B = layers[0].delta.shape[0]
    norms = per_example_norms(layers) if B else np.zeros(0)
    clip = noisy_mode_bound(norms, c_max=c_max, bins=bins, sigma=sigma_norm, rng=rng)
    factors = np.minimum(1.0, clip / np.maximum(norms, 1e-12))
    return clipped_sum(layers, factors, out), clip


def noisy_gradient(grad_sum: np.ndarray, z: np.ndarray, noise_scale: float, expected_batch: float) -> np.ndarray:
    """(sum + noise_scale z) / expected_batch: the released gradient, z ~ N(0, 1) per coordinate."""
    # The sum of gradients clipped to C_s has L2 sensitivity C_s; noise_scale = sigma_g C_s.
    return (grad_sum + noise_scale * z) / expected_batch


@numba.njit(cache=True, nogil=True)
def _noisy_adam(p, m, v, grad_sum, z, noise_scale, inv_batch, lr_t, b1, b2, eps_t):
    for i in range(p.size):
        g = (grad_sum[i] + noise_scale * z[i]) * inv_batch
        m[i] = b1 * m[i] + (1.0 - b1) * g
        v[i] = b2 * v[i] + (1.0 - b2) * g * g
        p[i] -= lr_t * m[i] / (np.sqrt(v[i]) + eps_t)


class Adam:
    """Adam on one flat parameter vector (in place), fused with the DP-SGD noise.

    lr mhat / (sqrt(vhat) + eps) = lr_t m / (sqrt(v) + eps_t) with lr_t = lr sqrt(1 - b2^t) / (1 - b1^t) and
    eps_t = eps sqrt(1 - b2^t): no bias-corrected copies of m and v."""

    def __init__(self, params: np.ndarray, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.b1, self.b2, self.eps = params, lr, betas[0], betas[1], eps
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0

    def noisy_step(self, grad_sum: np.ndarray, z: np.ndarray, noise_scale: float, expected_batch: float) -> None:
        """One step on `noisy_gradient(grad_sum, z, noise_scale, expected_batch)` in a single pass."""
        self.t += 1
        c2 = np.sqrt(1.0 - self.b2 ** self.t)
        _noisy_adam(self.params, self.m, self.v, grad_sum, z, float(noise_scale), 1.0 / expected_batch,
                    self.lr * c2 / (1.0 - self.b1 ** self.t), self.b1, self.b2, self.eps * c2)
