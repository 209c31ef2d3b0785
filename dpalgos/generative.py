"""The generative models of DPGM (Acs et al. §3.1-3.2, §6.1), in numpy, trained by `dpalgos.dpsgd`.

Both take binary records over m items (scipy CSR or dense (B, m)), keep their parameters in one flat vector
`params` (the layers are views of it), return for a batch the factored per-example gradients (`LayerGrad`s)
in that order (`gradients`; the loss only on request, `loss`), and apply a DP gradient (`noisy_update`).

* `VAE`: encoder x -> ReLU hidden layers -> (mu, log sigma^2) of a 2-D Gaussian latent; decoder z -> ReLU hidden
  layers -> Bernoulli logits over the m items. Per-example loss: binary cross-entropy + KL(q(z|x) || N(0, I)).
  One hidden layer of 200 units each side as in the paper; `hidden=(200, 200)` is the appendix's variant.
* `RBM`: Bernoulli restricted Boltzmann machine, 200 hidden units, weights N(0, 0.01^2), trained by persistent
  contrastive divergence. Only the positive phase v h' depends on the records (the negative phase runs on
  persistent fantasy particles initialised at random), so only it goes through DP-SGD.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp
from scipy.special import expit

from dpalgos.dpsgd import Adam, LayerGrad, noisy_gradient


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _dense(X) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)


class _Pass:
    """The forward pass of a VAE batch: what the loss and the backward pass need."""

    def __init__(self, **values):
        self.__dict__.update(values)


def _flat_views(shapes: list[tuple[int, ...]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """One zeroed flat vector and a view of it per shape, in order (the layout of `dpsgd.clipped_sum`)."""
    flat = np.zeros(sum(int(np.prod(s)) for s in shapes))
    views, at = [], 0
    for s in shapes:
        n = int(np.prod(s))
        views.append(flat[at:at + n].reshape(s))
        at += n
    return flat, views


def _subtract_records(P: np.ndarray, X) -> np.ndarray:
    """P - x in place (x binary records, sparse or dense), without a dense copy of sparse records."""
    if not sp.issparse(X):
        P -= np.asarray(X, dtype=P.dtype)
        return P
    X = X.tocsr()
    P[np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), X.indices] -= X.data
    return P


class VAE:
    def __init__(self, m: int, rng: np.random.Generator, hidden: tuple[int, ...] = (200,), latent: int = 2,
                 lr: float = 1e-3):
        self.m, self.hidden, self.latent = m, tuple(hidden), latent
        dims_enc = [m, *hidden]
        dims_dec = [latent, *hidden[::-1], m]
        dims = [*zip(dims_enc[:-1], dims_enc[1:]), (hidden[-1], latent), (hidden[-1], latent),
                *zip(dims_dec[:-1], dims_dec[1:])]
        self.params, views = _flat_views([s for i, o in dims for s in ((i, o), (o,))])
        pairs = list(zip(views[::2], views[1::2]))
        for (W, _), (i, o) in zip(pairs, dims):
            W[...] = rng.normal(0, np.sqrt(2.0 / i), (i, o))
        n_enc = len(hidden)
        self.enc, self.mu, self.logvar, self.dec = pairs[:n_enc], pairs[n_enc], pairs[n_enc + 1], pairs[n_enc + 2:]
        self.optimizer = Adam(self.params, lr=lr)

    def _layers(self):
        return [*self.enc, self.mu, self.logvar, *self.dec]

    def _forward(self, X, rng: np.random.Generator) -> _Pass:
        ins, pres = [], []
        a = X
        for W, b in self.enc:
            ins.append(a)
            pres.append(np.asarray(a @ W) + b)
            a = np.maximum(pres[-1], 0.0)
        h_enc = a
        mu = h_enc @ self.mu[0] + self.mu[1]
        logvar = np.clip(h_enc @ self.logvar[0] + self.logvar[1], -20, 20)
        eps = rng.standard_normal(mu.shape)
        std = np.exp(0.5 * logvar)
        dec_ins, dec_pres = [], []
        a = mu + std * eps
        for i, (W, b) in enumerate(self.dec):
            dec_ins.append(a)
            pre = a @ W
            pre += b
            dec_pres.append(pre)
            a = np.maximum(pre, 0.0) if i < len(self.dec) - 1 else pre
        return _Pass(ins=ins, pres=pres, h_enc=h_enc, mu=mu, logvar=logvar, eps=eps, std=std, dec_ins=dec_ins,
                     dec_pres=dec_pres, logits=a)

    def loss(self, X, rng: np.random.Generator) -> np.ndarray:
        """Per-example loss (B,): binary cross-entropy + KL(q(z|x) || N(0, I)). Training never needs it."""
        f = self._forward(X, rng)
        x = _dense(X)
        return (np.logaddexp(0.0, f.logits) - x * f.logits).sum(axis=1) \
            + 0.5 * (np.exp(f.logvar) + f.mu * f.mu - 1.0 - f.logvar).sum(axis=1)

    def gradients(self, X, rng: np.random.Generator) -> list[LayerGrad]:
        """Factored per-example gradients of the loss on a batch X (B, m), in the order of `params`; the same
        latent draws as `loss` with the same generator."""
        f = self._forward(X, rng)
        delta = _subtract_records(expit(f.logits, out=f.logits), X)   # d BCE / d logits, in place
        dec_grads = []
        for i in range(len(self.dec) - 1, -1, -1):
            dec_grads.append(LayerGrad(f.dec_ins[i], delta))
            back = delta @ self.dec[i][0].T
            delta = back * (f.dec_pres[i - 1] > 0) if i > 0 else back
        dmu = delta + f.mu
        dlogvar = delta * f.eps * 0.5 * f.std + 0.5 * (np.exp(f.logvar) - 1.0)
        head = [LayerGrad(f.h_enc, dmu), LayerGrad(f.h_enc, dlogvar)]
        delta = (dmu @ self.mu[0].T + dlogvar @ self.logvar[0].T) * (f.pres[-1] > 0)
        enc_grads = []
        for i in range(len(self.enc) - 1, -1, -1):
            enc_grads.append(LayerGrad(f.ins[i], delta))
            if i > 0:
                delta = (delta @ self.enc[i][0].T) * (f.pres[i - 1] > 0)
        return [*enc_grads[::-1], *head, *dec_grads[::-1]]

    def noisy_update(self, grad_sum: np.ndarray, z: np.ndarray, noise_scale: float, expected_batch: float,
                     rng: np.random.Generator) -> None:
        """One Adam step on the DP gradient `dpsgd.noisy_gradient(grad_sum, z, noise_scale, expected_batch)`."""
        self.optimizer.noisy_step(grad_sum, z, noise_scale, expected_batch)

    def start_at(self, p: np.ndarray, rng: np.random.Generator) -> None:
        """Output logits logit(p) whatever the latent: last decoder layer scaled to 1% of its initial size."""
        W, b = self.dec[-1]
        W *= 0.01
        b[:] = np.log(p) - np.log1p(-p)

    def logits(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Item logits (n, m) float32 of n records: decoder(z), z ~ N(0, I)."""
        a = rng.standard_normal((n, self.latent), dtype=np.float32)
        for i, (W, b) in enumerate(self.dec):
            a = a @ W.astype(np.float32) + b.astype(np.float32)
            if i < len(self.dec) - 1:
                a = np.maximum(a, 0.0)
        return a

class RBM:
    def __init__(self, m: int, rng: np.random.Generator, hidden: int = 200, lr: float = 0.01, particles: int = 100):
        self.m, self.h, self.lr = m, hidden, lr
        self.params, (self.W, self.c, self.b) = _flat_views([(m, hidden), (hidden,), (m,)])
        self.W[...] = rng.normal(0.0, 0.01, (m, hidden))
        self.fantasy = (rng.random((particles, m)) < 0.5).astype(np.float64)

    def start_at(self, p: np.ndarray, rng: np.random.Generator) -> None:
        """Visible biases log(p / (1 - p)) (Hinton, A Practical Guide to Training RBMs, §8.1), fantasy
        particles drawn from p."""
        self.b[:] = np.log(p) - np.log1p(-p)
        self.fantasy = (rng.random(self.fantasy.shape) < p).astype(np.float64)

    def loss(self, X, rng: np.random.Generator) -> np.ndarray:
        """Free energy (B,) of the records."""
        pre = np.asarray(X @ self.W) + self.c
        return -(_dense(X) @ self.b) - np.logaddexp(0.0, pre).sum(axis=1)

    def gradients(self, X, rng: np.random.Generator) -> list[LayerGrad]:
        """The per-example positive phase: d/dW = outer(x_i, p(h|x_i)), d/dc = p(h|x_i), d/db = x_i (the
        ascent direction of the log-likelihood, before the negative phase)."""
        P = _sigmoid(np.asarray(X @ self.W) + self.c)
        return [LayerGrad(X, P, bias=True), LayerGrad(None, _dense(X))]

    def _gibbs(self, V: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        H = (rng.random((V.shape[0], self.h)) < _sigmoid(V @ self.W + self.c)).astype(np.float64)
        return (rng.random(V.shape) < _sigmoid(H @ self.W.T + self.b)).astype(np.float64)

    def noisy_update(self, grad_sum: np.ndarray, z: np.ndarray, noise_scale: float, expected_batch: float,
                     rng: np.random.Generator) -> None:
        """Gradient ascent: (noisy positive phase) - (negative phase of one Gibbs step of the fantasy particles)."""
        pos_w, pos_c, pos_b = np.split(noisy_gradient(grad_sum, z, noise_scale, expected_batch),
                                       [self.W.size, self.W.size + self.h])
        pos_w = pos_w.reshape(self.W.shape)
        self.fantasy = self._gibbs(self.fantasy, rng)
        ph = _sigmoid(self.fantasy @ self.W + self.c)
        n = self.fantasy.shape[0]
        self.W += self.lr * (pos_w - self.fantasy.T @ ph / n)
        self.c += self.lr * (pos_c - ph.mean(axis=0))
        self.b += self.lr * (pos_b - self.fantasy.mean(axis=0))

    def logits(self, n: int, rng: np.random.Generator, chains: int = 1000, burn_in: int = 300,
               thinning: int = 2) -> np.ndarray:
        """Visible logits (n, m) float32 of n records from `chains` Gibbs chains started from the visible biases
        alone: after `burn_in` steps, every `thinning`-th state of every chain gives a record, whose items are
        independent given its hidden units h: logits W h + b."""
        V = (rng.random((min(chains, n), self.m)) < _sigmoid(self.b)).astype(np.float64)
        for _ in range(burn_in):
            V = self._gibbs(V, rng)
        out, have = [], 0
        while have < n:
            for _ in range(thinning - 1):
                V = self._gibbs(V, rng)
            H = (rng.random((V.shape[0], self.h)) < _sigmoid(V @ self.W + self.c)).astype(np.float64)
            out.append((H[:n - have] @ self.W.T + self.b).astype(np.float32))
            V = (rng.random(V.shape) < _sigmoid(H @ self.W.T + self.b)).astype(np.float64)
            have += out[-1].shape[0]
        return np.concatenate(out)


def records_of_lengths(logits: np.ndarray, lengths: np.ndarray, rng: np.random.Generator) -> sp.csr_matrix:
    """Record i gets lengths[i] distinct items drawn without replacement with probabilities proportional to
    exp(logits_ij) = p_ij / (1 - p_ij): successive sampling (each next item proportional to the odds of those
    not yet drawn), the law of the exponential race `race` runs on fixed keys. This is the model's independent
    Bernoulli items conditioned on the record's length exactly for lengths 0 and 1, and its usual
    approximation beyond. Drawn one item at a time from the row's cumulative odds (`_successive`): O(m) per
    record plus O(log m) per item, against the race's m exponential draws, logs and a partial sort."""
    n, m = logits.shape
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), m)
    if n == 0:
        return sp.csr_matrix((0, m), dtype=np.float32)
    odds = logits - logits.max(axis=1, keepdims=True)
    np.exp(odds, out=odds)  # float32; an item 87 nats below its row's top underflows to odds 0
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    _successive(odds, indptr, int(rng.integers(0, 2**32)), indices)
    return sp.csr_matrix((np.ones(indices.size, dtype=np.float32), indices, indptr), shape=(n, m))


_MISSES = 16  # redraws of items already drawn before a row switches to exact scans over the rest


@numba.njit(cache=True, nogil=True)
def _successive(odds, indptr, seed, indices):
    """Successive sampling of each row's indptr[i+1] - indptr[i] items, written sorted to indices.

    The next item is drawn from the row's cumulative odds by binary search; an item already drawn is drawn
    again, which leaves the next distinct item proportional to the odds of those not drawn (rejection). After
    `_MISSES` rejections in a row (drawn items holding most of the odds), the next items come from a scan
    over the odds of the items not drawn. Odds that all underflowed leave the rest uniform."""
    np.random.seed(seed)
    n, m = odds.shape
    cum = np.empty(m)
    taken = np.zeros(m, dtype=np.bool_)
    for i in range(n):
        start, L = indptr[i], indptr[i + 1] - indptr[i]
        if L == 0:
            continue
        total = 0.0
        for j in range(m):
            total += odds[i, j]
            cum[j] = total
        got, misses = 0, 0
        while got < L:
            if misses < _MISSES and total > 0.0:
                j = min(np.searchsorted(cum, np.random.random() * total, side="right"), m - 1)
                if taken[j]:
                    misses += 1
                    continue
            else:
                j = _scan_rest(odds[i], taken)
            taken[j] = True
            indices[start + got] = j
            got += 1
        row = indices[start:start + L]
        row.sort()
        for j in row:
            taken[j] = False


@numba.njit(cache=True, inline="always")
def _scan_rest(odds, taken):
    """An item not taken, with probability proportional to its odds (uniform if they are all 0)."""
    rest, free = 0.0, 0
    for j in range(odds.size):
        if not taken[j]:
            rest += odds[j]
            free += 1
    if rest > 0.0:
        u, last = np.random.random() * rest, -1
        for j in range(odds.size):
            if not taken[j]:
                last = j
                u -= odds[j]
                if u < 0.0:
                    return j
        return last
    r = np.random.randint(0, free)
    for j in range(odds.size):
        if not taken[j]:
            if r == 0:
                return j
            r -= 1
    return -1


def log_exponentials(shape, rng: np.random.Generator) -> np.ndarray:
    """log E, E ~ Exp(1) float32 (a float32 draw of 0 is moved to the smallest positive float32)."""
    return np.log(np.maximum(rng.standard_exponential(shape, dtype=np.float32), np.finfo(np.float32).tiny))


def race(keys: np.ndarray, lengths: np.ndarray) -> sp.csr_matrix:
    """Record i holds the items of its lengths[i] largest keys (n, m) (ties: the lower item)."""
    n, m = keys.shape
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), m)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    _largest(keys, indptr, indices)
    return sp.csr_matrix((np.ones(indices.size, dtype=np.float32), indices, indptr), shape=(n, m))


@numba.njit(cache=True, nogil=True)
def _largest(keys, indptr, indices):
    """The items of each row's indptr[i+1] - indptr[i] largest keys, sorted, into indices: one pass per row
    over a buffer of the largest so far, kept in decreasing order (a key enters only if it beats the last)."""
    m = keys.shape[1]
    best = np.empty(m, dtype=keys.dtype)
    for i in range(keys.shape[0]):
        start, L = indptr[i], indptr[i + 1] - indptr[i]
        if L == 0:
            continue
        top = indices[start:start + L]
        have = 0
        for j in range(m):
            v = keys[i, j]
            if have == L and not v > best[L - 1]:
                continue
            pos = min(have, L - 1)
            while pos > 0 and v > best[pos - 1]:
                best[pos], top[pos] = best[pos - 1], top[pos - 1]
                pos -= 1
            best[pos], top[pos] = v, j
            have = min(have + 1, L)
        top.sort()
