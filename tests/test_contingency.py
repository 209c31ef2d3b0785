"""Contingency-table estimators: the maximum-entropy baseline (IPF), the empirical-Bayes table, and the release
kind's choice between them and ADMM."""

import numpy as np
import pytest

from dpalgos import contingency
from tasks.kinds import contingency as kind

LEVELS = {"a": ("0", "1"), "b": ("x", "y", "z"), "c": ("p", "q", "r", "s")}


def _table() -> contingency.Table:
    return contingency.Table(tuple(LEVELS), tuple(LEVELS.values()))


def _interacting_counts(rng, strength: float, total: int = 3000) -> np.ndarray:
    """A table drawn from a model with an a x b interaction of the given strength (0: independence)."""
    logit = np.add.outer(np.add.outer([0.0, 0.4], [0.0, -0.3, 0.5]), [0.0, 0.2, 0.1, -0.4])  # main effects
    logit[1, 2, :] += strength
    p = np.exp(logit).reshape(-1)
    return rng.multinomial(total, p / p.sum()).astype(float)


def test_max_entropy_with_the_one_way_marginals_is_the_independence_table():
    rng = np.random.default_rng(0)
    t = _table()
    x = rng.poisson(20, t.size).astype(float)
    marginals = t.marginals(0) + t.marginals(1)
    A = t.constraint_matrix(marginals)
    me = contingency.max_entropy(A, A @ x).reshape(t.shape)
    tensor, n = x.reshape(t.shape), x.sum()
    independent = np.einsum("i,j,k->ijk", tensor.sum((1, 2)), tensor.sum((0, 2)), tensor.sum((0, 1))) / n ** 2
    assert np.allclose(me, independent, rtol=1e-8)


def test_ipf_keeps_the_zeros_of_its_base_and_of_the_marginals():
    t = _table()
    A = t.constraint_matrix(t.marginals(1))
    x = np.arange(t.size, dtype=float) % 5
    x.reshape(t.shape)[1] = 0.0  # a = 1 is empty: a zero marginal
    base = np.ones(t.size)
    base[3] = 0.0
    fit = contingency.ipf(A, A @ x, base)
    assert fit[3] == 0.0 and np.all(fit.reshape(t.shape)[1] == 0.0)
    assert np.abs(A @ fit - A @ x).max() < 1e-6


def test_the_extra_parameters_of_the_next_order_are_the_log_linear_interactions():
    t = _table()  # levels 2, 3, 4: an interaction of a set S has prod_{j in S} (levels_j - 1) free parameters
    A0, A1, A2 = (t.constraint_matrix(t.marginals(h)) for h in (0, 1, 2))
    assert contingency._extra_parameters(t.constraint_matrix([]), A1) == 1 + 2 + 3
    assert contingency._extra_parameters(A0, A1) == 1 + 2 + 3
    assert contingency._extra_parameters(A1, A2) == 1 * 2 + 1 * 3 + 2 * 3


def test_max_entropy_needs_public_marginals():
    with pytest.raises(ValueError, match="needs public marginals"):
        contingency.max_entropy(_table().constraint_matrix([]), np.zeros(0))


def test_the_posterior_mean_follows_the_data_under_small_noise_and_the_prior_under_large_noise():
    rng = np.random.default_rng(1)
    prior = rng.uniform(5, 50, 40)
    x = rng.poisson(prior).astype(float)
    sharp, _, _ = contingency.nb_posterior_mean(x + rng.laplace(0, 0.05, x.size), prior, 0.05, 200)
    assert np.abs(sharp - x).max() < 0.05
    vague, _, _ = contingency.nb_posterior_mean(x + rng.laplace(0, 1e4, x.size), prior, 1e4, 200)
    assert np.abs(vague - prior).max() < 0.05 * prior.max()
    zero = contingency.nb_posterior_mean(np.array([3.0, 9.0]), np.array([0.0, 4.0]), 1.0, 50)[0]
    assert zero[0] == 0.0 and zero[1] > 0.0


@pytest.mark.parametrize("strength, prior", [(0.0, "public"), (1.5, "order 2")])
def test_empirical_bayes_chooses_its_prior_by_aic_and_honours_the_public_marginals(strength, prior):
    rng = np.random.default_rng(2)
    t = _table()
    x = _interacting_counts(rng, strength)
    marginals = t.marginals(1)
    A = t.constraint_matrix(marginals)
    noisy = x + rng.laplace(0, 2.0, x.size)
    est = contingency.empirical_bayes_table(noisy, t, marginals, A @ x, noise_scale=2.0)
    assert est.prior == prior
    assert est.x.min() >= 0.0 and np.abs(A @ est.x - A @ x).max() < 1e-6 * x.sum()


def test_empirical_bayes_beats_admm_the_noisy_cells_and_max_entropy_on_edwards(shared_data):
    """Edwards' mildew table with the one-way marginals public, epsilon = 1 (measured over 6 runs: EB 0.43,
    ADMM L1 0.65, LM 1.1, max-entropy 6.8)."""
    from tasks.experiments.contingency import load_table

    t, x = load_table(shared_data / "contingency" / "edwards_mildew.csv")
    marginals = t.marginals(1)
    A = t.constraint_matrix(marginals)
    b = A @ x
    rng = np.random.default_rng(3)
    mse = {"lm": [], "admm_l1": [], "eb": []}
    for _ in range(3):
        noisy = x + rng.laplace(0, 1.0, x.size)
        est = {"lm": np.maximum(noisy, 0), "admm_l1": contingency.consistent_table(noisy, A, b, noise_scale=1.0,
                                                                                    penalty="l1").x,
               "eb": contingency.empirical_bayes_table(noisy, t, marginals, b, noise_scale=1.0).x}
        for k, e in est.items():
            mse[k].append(np.mean((e - x) ** 2))
    means = {k: np.mean(v) for k, v in mse.items()}
    assert means["eb"] < min(means["lm"], means["admm_l1"], np.mean((contingency.max_entropy(A, b) - x) ** 2))


def test_without_public_marginals_the_estimate_is_nonnegative_and_deterministic():
    rng = np.random.default_rng(4)
    t = _table()
    noisy = rng.poisson(10, t.size) + rng.laplace(0, 3.0, t.size)
    one = contingency.empirical_bayes_table(noisy, t, [], np.zeros(0), noise_scale=3.0)
    two = contingency.empirical_bayes_table(noisy, t, [], np.zeros(0), noise_scale=3.0)
    assert one.x.min() >= 0.0 and one.x.tobytes() == two.x.tobytes()


@pytest.mark.parametrize("estimator", ["admm", "empirical_bayes"])
def test_the_kind_estimates_from_the_noisy_cells_and_the_public_marginals(estimator):
    rng = np.random.default_rng(5)
    t = _table()
    x = _interacting_counts(rng, 1.0, total=500)
    marginals = t.marginals(0) + t.marginals(1)
    A = t.constraint_matrix(marginals)
    params = kind.ContingencyParams(epsilon=0.5, estimator=estimator)
    noisy = x + rng.laplace(0, 2.0, x.size)
    est, info = kind._estimate(params, t, noisy, marginals, A @ x, A, 2.0)
    assert est.min() >= 0.0 and np.abs(A @ est - A @ x).max() < 1e-3 * x.sum()
    assert info["method"].startswith({"admm": "admm", "empirical_bayes": "empirical Bayes"}[estimator])
    assert np.mean((est - x) ** 2) < np.mean((np.maximum(noisy, 0) - x) ** 2)
