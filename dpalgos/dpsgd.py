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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp



@dataclass
class LayerGrad:
    """Factored per-example gradients of one dense layer: d loss_i / dW = outer(a_i, delta_i) and
    d loss_i / db = delta_i. With a = None the layer is a bare bias (per-example gradient delta_i)."""
    a: np.ndarray | sp.csr_matrix | None
    delta: np.ndarray
    bias: bool = True


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


def clipped_sums(layers: list[LayerGrad], factors: np.ndarray) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
    """sum_i f_i g_i per layer: (weight gradient (in, out) or None, bias gradient (out,) or None)."""
    out = []
    for layer in layers:
        scaled = layer.delta * factors[:, None]
        w = None
        if layer.a is not None:
            w = np.asarray(layer.a.T @ scaled) if sp.issparse(layer.a) else layer.a.T @ scaled
        b = scaled.sum(axis=0) if (layer.bias or layer.a is None) else None
        out.append((w, b))
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
    noisy = hist + rng.normal(0.0, sigma, size=hist.shape)
    return (int(np.argmax(noisy)) + 1) * edges


@dataclass
class StepResult:
    grads: list[tuple[np.ndarray | None, np.ndarray | None]]
    clip: float
    batch: int


def dp_gradient(layers: list[LayerGrad], *, sigma_grad: float, sigma_norm: float, c_max: float, bins: int,
                expected_batch: float, rng: np.random.Generator) -> StepResult:
    """Algorithm 4, lines 3-6, on the factored gradients of a Poisson batch (possibly empty)."""
    B = layers[0].delta.shape[0]
    norms = per_example_norms(layers) if B else np.zeros(0)
    clip = noisy_mode_bound(norms, c_max=c_max, bins=bins, sigma=sigma_norm, rng=rng)
    factors = np.minimum(1.0, clip / np.maximum(norms, 1e-12)) if B else np.zeros(0)
    noisy = []
    for w, b in clipped_sums(layers, factors):
        nw = None if w is None else w + rng.normal(0.0, sigma_grad * clip, size=w.shape)
        nb = None if b is None else b + rng.normal(0.0, sigma_grad * clip, size=b.shape)
        noisy.append((None if nw is None else nw / expected_batch, None if nb is None else nb / expected_batch))
    return StepResult(noisy, clip, B)


class Adam:
    """Adam on a list of parameter arrays (in place)."""

    def __init__(self, params: list[np.ndarray], lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.b1, self.b2, self.eps = params, lr, betas[0], betas[1], eps
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            mhat = m / (1 - self.b1 ** self.t)
            vhat = v / (1 - self.b2 ** self.t)
            p -= self.lr * mhat / (np.sqrt(vhat) + self.eps)
