"""DPGM: a differentially private mixture of generative models (Acs et al. Algorithm 1, §4.4, §5).

The records are first clustered by DP kernel k-means (`dpalgos.kernel_kmeans`); then one generative model per
cluster is trained with DP-SGD (`dpalgos.dpsgd`), and synthetic records are drawn from the mixture with the
clusters' noisy sizes as weights.

Training schedule (a deliberate deviation from Algorithm 1, for a rigorous accounting): Algorithm 1 updates
ONE model per step, chosen with probability |D_s|/|D|, on a batch sampled at rate L/|D_s| from its cluster.
With every iterate public, the chosen cluster is visible, so a record of cluster s is exposed at rate
L/|D_s| in the steps that pick s, not at the L/|D| of the paper's analysis. Here every step updates EVERY
cluster's model, each on a Poisson sample of its own cluster at the common rate q: each record is then
exposed exactly as in a Poisson-subsampled Gaussian mechanism of rate q (the clusters are disjoint, so the k
updates of a step compose in parallel), the standard `dp_accounting` event. Per record and per unit of
privacy, the signal-to-noise of a model update is the same as Algorithm 1's under an exact accounting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import scipy.sparse as sp

from dpalgos import dpsgd
from dpalgos.generative import RBM, VAE

ModelKind = Literal["vae", "rbm"]


@dataclass(frozen=True)
class SGDConfig:
    model: ModelKind = "vae"
    hidden: tuple[int, ...] = (200,)
    steps: int = 300
    q: float = 0.01                  # Poisson sampling rate of every record at every step
    sigma_grad: float = 1.0          # noise multiplier of the clipped gradient sum
    sigma_norm: float = 1.0          # noise multiplier of the norm histogram (DPNorm)
    c_max: float = 10.0              # the paper's C_max and w (Algorithm 3)
    bins: int = 100
    lr: float | None = None          # default: Adam 0.01 (VAE), 0.01 (RBM, the paper)


def make_model(config: SGDConfig, m: int, rng: np.random.Generator):
    if config.model == "vae":
        return VAE(m, rng, hidden=config.hidden, lr=config.lr or 0.01)
    return RBM(m, rng, hidden=config.hidden[0], lr=config.lr or 0.01)


def train(models: list, batches: Callable[[int], list], expected_sizes: np.ndarray, config: SGDConfig,
          rng: np.random.Generator, progress: Callable[[int, int], None] | None = None) -> list[float]:
    """DP-SGD on every cluster model at every step.

    batches(step) -> one batch (CSR, possibly empty) per cluster: a Poisson sample of rate q of its records.
    expected_sizes : PUBLIC (noisy) cluster sizes; a batch's gradient is divided by q * size.
    Returns the mean clipping bound C_s per step (a diagnostic of public values).
    """
    clips = []
    for step in range(config.steps):
        step_clips = []
        for model, batch, size in zip(models, batches(step), expected_sizes):
            _, layers = model.loss_and_gradients(batch, rng) if batch.shape[0] else (None, _empty_layers(model))
            res = dpsgd.dp_gradient(layers, sigma_grad=config.sigma_grad, sigma_norm=config.sigma_norm,
                                    c_max=config.c_max, bins=config.bins, expected_batch=max(config.q * size, 1.0),
                                    rng=rng)
            if isinstance(model, RBM):
                model.update(res.grads, rng)
            else:
                model.update(res.grads)
            step_clips.append(res.clip)
        clips.append(float(np.mean(step_clips)))
        if progress is not None:
            progress(step + 1, config.steps)
    return clips


def _empty_layers(model) -> list[dpsgd.LayerGrad]:
    """Zero-example layers with the model's shapes (an empty Poisson batch still gets its noise)."""
    _, layers = model.loss_and_gradients(sp.csr_matrix((1, model.m), dtype=np.float64), np.random.default_rng(0))
    return [dpsgd.LayerGrad(None if l.a is None else l.a[:0], l.delta[:0], l.bias) for l in layers]


def synthesize(models: list, weights: np.ndarray, n: int, rng: np.random.Generator, nonempty: bool = True,
               chunk: int = 50_000) -> sp.csr_matrix:
    """n synthetic records (§4.4): each from model s with probability weights_s / sum(weights); with
    `nonempty`, empty draws are redrawn (real records have at least one item)."""
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    counts = rng.multinomial(n, w / w.sum())
    parts = []
    for model, c in zip(models, counts):
        rows, todo = [], int(c)
        for _ in range(50):
            if todo == 0:
                break
            draw = model.sample(min(todo, chunk) if not nonempty else min(2 * todo, chunk), rng)
            if nonempty:
                draw = draw[np.diff(draw.indptr) > 0]
            draw = draw[:todo]
            rows.append(draw)
            todo -= draw.shape[0]
        parts.extend(rows)
    out = sp.vstack(parts).tocsr() if parts else sp.csr_matrix((0, models[0].m))
    return out[rng.permutation(out.shape[0])]


def model_arrays(model) -> dict[str, np.ndarray]:
    """The released parameters of a model, by name."""
    if isinstance(model, RBM):
        return {"W": model.W, "b": model.b, "c": model.c}
    out = {}
    for name, layers in (("enc", model.enc), ("dec", model.dec)):
        for i, (W, b) in enumerate(layers):
            out[f"{name}{i}_W"], out[f"{name}{i}_b"] = W, b
    out["mu_W"], out["mu_b"] = model.mu
    out["logvar_W"], out["logvar_b"] = model.logvar
    return out
