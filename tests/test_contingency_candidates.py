"""The empirical-Bayes table's candidate priors: the gamma family's moments, comparable likelihoods, and the
Akaike-weighted average between the max-entropy table (prior only) and the noisy cells' fit."""

import math

import numpy as np
import pytest

from dpalgos import contingency

LEVELS = {"a": ("0", "1"), "b": ("x", "y", "z"), "c": ("p", "q", "r", "s")}


def _table() -> contingency.Table:
    return contingency.Table(tuple(LEVELS), tuple(LEVELS.values()))


def _counts(rng, total: int = 2000) -> np.ndarray:
    """A table with an a x b x c interaction, so that the 2-way max-entropy table is not the truth."""
    logit = rng.normal(0.0, 0.8, _table().size)
    return rng.multinomial(total, np.exp(logit) / np.exp(logit).sum()).astype(float)


@pytest.mark.parametrize("phi", [0.05, 1.0, 5.0])
def test_the_gamma_prior_has_mean_m_and_variance_phi_m(phi):
    m = np.array([[0.3], [4.0], [40.0]])
    k = contingency.Gamma.support(400)
    p = np.exp(contingency.Gamma.log_prior(m, k, math.log(phi)))
    mean = p @ k
    assert np.allclose(p.sum(axis=1), 1.0) and np.allclose(mean, m[:, 0], rtol=0.01)
    assert np.allclose(p @ k ** 2 - mean ** 2, phi * m[:, 0], rtol=0.05)


def test_a_cell_whose_prior_mean_is_zero_still_counts_its_noise_density():
    noisy, s = np.array([7.0, 3.0]), 2.0
    both = contingency._Posterior(noisy, np.array([0.0, 4.0]), s, 60, contingency.NegativeBinomial)
    one = contingency._Posterior(noisy[1:], np.array([4.0]), s, 60, contingency.NegativeBinomial)
    assert both.loglik == pytest.approx(one.loglik - 7.0 / s - math.log(2 * s))


def _estimate(seed: int, order: int, scale: float):
    """A table, its public marginals' matrix A and the empirical-Bayes estimate from Laplace(scale) cells."""
    rng = np.random.default_rng(seed)
    t = _table()
    x = _counts(rng)
    marginals = t.marginals(order)
    A = t.constraint_matrix(marginals)
    noisy = x + rng.laplace(0.0, scale, x.size)
    return x, A, contingency.empirical_bayes_table(noisy, t, marginals, A @ x, noise_scale=scale)


def test_under_overwhelming_noise_the_table_is_the_max_entropy_one():
    x, A, est = _estimate(0, 2, 300.0)
    assert np.abs(est.x - contingency.max_entropy(A, A @ x)).max() < 0.02 * x.max()


def test_under_small_noise_the_table_follows_the_noisy_cells_and_honours_the_marginals():
    x, A, est = _estimate(1, 1, 0.05)
    assert est.weight["public, prior only"] == 0.0 and sum(est.weight.values()) == pytest.approx(1.0)
    assert np.abs(est.x - x).max() < 0.1
    assert est.x.min() >= 0.0 and np.abs(A @ est.x - A @ x).max() < 1e-6 * x.sum()

