"""The generative models of DPGM (Acs et al. §3.1-3.2, §6.1), in numpy, trained by `dpalgos.dpsgd`.

Both take binary records over m items (scipy CSR or dense (B, m)) and return, for a batch, the factored
per-example gradients (`LayerGrad`s) in the order of `params`.

* `VAE`: encoder x -> ReLU hidden layers -> (mu, log sigma^2) of a 2-D Gaussian latent; decoder z -> ReLU hidden
  layers -> Bernoulli logits over the m items. Per-example loss: binary cross-entropy + KL(q(z|x) || N(0, I)).
  One hidden layer of 200 units each side as in the paper; `hidden=(200, 200)` is the appendix's variant.
* `RBM`: Bernoulli restricted Boltzmann machine, 200 hidden units, weights N(0, 0.01^2), trained by persistent
  contrastive divergence. Only the positive phase v h' depends on the records (the negative phase runs on
  persistent fantasy particles initialised at random), so only it goes through DP-SGD.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dpalgos.dpsgd import Adam, LayerGrad


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _dense(X) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)


def _bernoulli_rows(P: np.ndarray, rng: np.random.Generator) -> sp.csr_matrix:
    """Independent Bernoulli(P) draws (n, m) as CSR, without a dense float copy of the draws."""
    rows, cols = np.nonzero(rng.random(P.shape, dtype=np.float32) < P)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=P.shape[0]))])
    return sp.csr_matrix((np.ones(cols.size, dtype=np.float32), cols, indptr), shape=P.shape)


class VAE:
    def __init__(self, m: int, rng: np.random.Generator, hidden: tuple[int, ...] = (200,), latent: int = 2,
                 lr: float = 1e-3):
        self.m, self.hidden, self.latent = m, tuple(hidden), latent
        dims_enc = [m, *hidden]
        dims_dec = [latent, *hidden[::-1], m]
        init = lambda i, o: (rng.normal(0, np.sqrt(2.0 / i), (i, o)), np.zeros(o))
        self.enc = [init(i, o) for i, o in zip(dims_enc[:-1], dims_enc[1:])]
        self.mu = init(hidden[-1], latent)
        self.logvar = init(hidden[-1], latent)
        self.dec = [init(i, o) for i, o in zip(dims_dec[:-1], dims_dec[1:])]
        self.params = [p for layer in self._layers() for p in layer]
        self.optimizer = Adam(self.params, lr=lr)

    def _layers(self):
        return [*self.enc, self.mu, self.logvar, *self.dec]

    def loss_and_gradients(self, X, rng: np.random.Generator) -> tuple[np.ndarray, list[LayerGrad]]:
        """Per-example loss (B,) and factored per-example gradients of a batch X (B, m)."""
        ins, pres = [], []
        a = X
        for W, b in self.enc:
            ins.append(a)
            pre = np.asarray(a @ W) + b
            pres.append(pre)
            a = np.maximum(pre, 0.0)
        h_enc = a
        mu = h_enc @ self.mu[0] + self.mu[1]
        logvar = np.clip(h_enc @ self.logvar[0] + self.logvar[1], -20, 20)
        eps = rng.standard_normal(mu.shape)
        std = np.exp(0.5 * logvar)
        z = mu + std * eps
        dec_ins, dec_pres = [], []
        a = z
        for i, (W, b) in enumerate(self.dec):
            dec_ins.append(a)
            pre = a @ W + b
            dec_pres.append(pre)
            a = np.maximum(pre, 0.0) if i < len(self.dec) - 1 else pre
        logits = a
        x = _dense(X)
        loss = (np.logaddexp(0.0, logits) - x * logits).sum(axis=1) \
            + 0.5 * (np.exp(logvar) + mu * mu - 1.0 - logvar).sum(axis=1)
        # Backward: per-example errors of every layer's pre-activation.
        dec_grads = []
        delta = _sigmoid(logits) - x
        for i in range(len(self.dec) - 1, -1, -1):
            dec_grads.append(LayerGrad(dec_ins[i], delta))
            back = delta @ self.dec[i][0].T
            delta = back * (dec_pres[i - 1] > 0) if i > 0 else back
        dz = delta
        dmu = dz + mu
        dlogvar = dz * eps * 0.5 * std + 0.5 * (np.exp(logvar) - 1.0)
        head = [LayerGrad(h_enc, dmu), LayerGrad(h_enc, dlogvar)]
        delta = (dmu @ self.mu[0].T + dlogvar @ self.logvar[0].T) * (pres[-1] > 0)
        enc_grads = []
        for i in range(len(self.enc) - 1, -1, -1):
            enc_grads.append(LayerGrad(ins[i], delta))
            if i > 0:
                delta = (delta @ self.enc[i][0].T) * (pres[i - 1] > 0)
        return loss, [*enc_grads[::-1], *head, *dec_grads[::-1]]

    def update(self, grads: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """One Adam step with per-layer (weight, bias) gradients of the mean loss."""
        self.optimizer.step([g for pair in grads for g in pair])

    def start_at(self, p: np.ndarray, rng: np.random.Generator) -> None:
        """Output logits logit(p) whatever the latent: last decoder layer scaled to 1% of its initial size."""
        W, b = self.dec[-1]
        W *= 0.01
        b[:] = np.log(p) - np.log1p(-p)

    def _logits(self, z: np.ndarray) -> np.ndarray:
        a = z
        for i, (W, b) in enumerate(self.dec):
            a = a @ W + b
            if i < len(self.dec) - 1:
                a = np.maximum(a, 0.0)
        return a

    def match_marginals(self, p: np.ndarray, rng: np.random.Generator, latents: int = 2000,
                        newton_steps: int = 30) -> None:
        """Shift the output biases so that every item's probability among NON-EMPTY records (synthesis drops
        empty draws), averaged over z ~ N(0, I), is p_j: E[x_j] = p_j P(record non-empty), by Newton's method on
        each item's shift over a fixed sample of latents, P(non-empty) updated at every step."""
        L = self._logits(rng.standard_normal((latents, self.latent)))
        shift = np.zeros(self.m)
        for _ in range(newton_steps):
            P = _sigmoid(L + shift)
            nonempty = 1.0 - np.exp(np.log1p(-np.minimum(P, 1 - 1e-12)).sum(axis=1)).mean()
            shift -= (P.mean(axis=0) - p * nonempty) / np.maximum((P * (1 - P)).mean(axis=0), 1e-12)
            shift = np.clip(shift, -30.0, 30.0)
        self.dec[-1][1][:] += shift

    def sample(self, n: int, rng: np.random.Generator, chunk: int = 20_000) -> sp.csr_matrix:
        """n records: z ~ N(0, I), items ~ Bernoulli(sigmoid(decoder(z))) (float32, in chunks of rows)."""
        layers = [(W.astype(np.float32), b.astype(np.float32)) for W, b in self.dec]
        out = []
        for start in range(0, n, chunk):
            a = rng.standard_normal((min(chunk, n - start), self.latent), dtype=np.float32)
            for i, (W, b) in enumerate(layers):
                a = a @ W + b
                if i < len(layers) - 1:
                    a = np.maximum(a, 0.0)
            out.append(_bernoulli_rows(_sigmoid(a), rng))
        return sp.vstack(out).tocsr() if out else sp.csr_matrix((0, self.m), dtype=np.float32)


class RBM:
    def __init__(self, m: int, rng: np.random.Generator, hidden: int = 200, lr: float = 0.01, particles: int = 100):
        self.m, self.h, self.lr = m, hidden, lr
        self.W = rng.normal(0.0, 0.01, (m, hidden))
        self.b = np.zeros(m)
        self.c = np.zeros(hidden)
        self.params = [self.W, self.c, self.b]
        self.fantasy = (rng.random((particles, m)) < 0.5).astype(np.float64)

    def start_at(self, p: np.ndarray, rng: np.random.Generator) -> None:
        """Visible biases log(p / (1 - p)) (Hinton, A Practical Guide to Training RBMs, §8.1), fantasy
        particles drawn from p."""
        self.b[:] = np.log(p) - np.log1p(-p)
        self.fantasy = (rng.random(self.fantasy.shape) < p).astype(np.float64)

    def loss_and_gradients(self, X, rng: np.random.Generator) -> tuple[np.ndarray, list[LayerGrad]]:
        """Free energy (B,) and the per-example positive phase: d/dW = outer(x_i, p(h|x_i)), d/dc = p(h|x_i),
        d/db = x_i (the ascent direction of the log-likelihood, before the negative phase)."""
        pre = np.asarray(X @ self.W) + self.c
        P = _sigmoid(pre)
        x = _dense(X)
        free_energy = -(x @ self.b) - np.logaddexp(0.0, pre).sum(axis=1)
        return free_energy, [LayerGrad(X, P, bias=True), LayerGrad(None, x)]

    def _gibbs(self, V: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        H = (rng.random((V.shape[0], self.h)) < _sigmoid(V @ self.W + self.c)).astype(np.float64)
        return (rng.random(V.shape) < _sigmoid(H @ self.W.T + self.b)).astype(np.float64)

    def update(self, grads: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator) -> None:
        """Gradient ascent: (noisy positive phase) - (negative phase of one Gibbs step of the fantasy particles)."""
        self.fantasy = self._gibbs(self.fantasy, rng)
        ph = _sigmoid(self.fantasy @ self.W + self.c)
        n = self.fantasy.shape[0]
        (pos_w, pos_c), (_, pos_b) = grads
        self.W += self.lr * (pos_w - self.fantasy.T @ ph / n)
        self.c += self.lr * (pos_c - ph.mean(axis=0))
        self.b += self.lr * (pos_b - self.fantasy.mean(axis=0))

    def sample(self, n: int, rng: np.random.Generator, chains: int = 1000, burn_in: int = 300,
               thinning: int = 2) -> sp.csr_matrix:
        """n records from `chains` Gibbs chains started from the visible biases alone: after `burn_in` steps, every `thinning`-th
        state of every chain is a record."""
        V = (rng.random((min(chains, n), self.m)) < _sigmoid(self.b)).astype(np.float64)
        for _ in range(burn_in):
            V = self._gibbs(V, rng)
        out, have = [], 0
        while have < n:
            for _ in range(thinning):
                V = self._gibbs(V, rng)
            out.append(sp.csr_matrix(V[:n - have].astype(np.float32)))
            have += out[-1].shape[0]
        return sp.vstack(out).tocsr()
