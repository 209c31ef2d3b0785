"""DPGM (Acs et al.): factored per-example gradients, DP-SGD noise, accounting, the mixture, counting queries."""

import numpy as np
import pytest
import scipy.sparse as sp
from dp_accounting import dp_event as dpe
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from dpalgos import counting, dpgm, dpsgd
from dpalgos.generative import RBM, VAE
from dpalgos.noise import Measure, SeededNoise


def _records(n=40, m=25, p=0.15, seed=0) -> sp.csr_matrix:
    return sp.csr_matrix((np.random.default_rng(seed).random((n, m)) < p).astype(np.float32))


def _models():
    rng = np.random.default_rng(1)
    return [VAE(25, rng, hidden=(16,)), VAE(25, rng, hidden=(12, 9)), RBM(25, rng, hidden=11)]


@pytest.mark.parametrize("model", _models(), ids=["vae", "vae-2-hidden", "rbm"])
def test_factored_norms_and_clipped_sum_equal_the_per_example_loop(model):
    X = _records()
    _, layers = model.loss_and_gradients(X, np.random.default_rng(2))
    G = dpsgd.per_example_gradients(layers)                     # the naive (B, P) matrix
    norms = dpsgd.per_example_norms(layers)
    np.testing.assert_allclose(norms, np.linalg.norm(G, axis=1), rtol=1e-10)
    f = np.minimum(1.0, np.median(norms) / norms)
    flat = np.concatenate([x.ravel() for pair in dpsgd.clipped_sums(layers, f) for x in pair if x is not None])
    np.testing.assert_allclose(flat, (f[:, None] * G).sum(axis=0), rtol=1e-9, atol=1e-12)
    assert np.all(np.linalg.norm(f[:, None] * G, axis=1) <= np.median(norms) * (1 + 1e-12))


def test_vae_per_example_gradients_match_finite_differences():
    vae = VAE(12, np.random.default_rng(3), hidden=(7, 5))
    x = _records(1, 12, 0.4, 4)
    loss = lambda: vae.loss_and_gradients(x, np.random.default_rng(5))[0][0]  # same latent noise every call
    _, layers = vae.loss_and_gradients(x, np.random.default_rng(5))
    grad = dpsgd.per_example_gradients(layers)[0]
    params = [p for layer in vae._layers() for p in layer]
    flat_index, checked = 0, 0
    for p in params:
        for idx in list(np.ndindex(p.shape))[:6]:
            old = p[idx]
            p[idx] = old + 1e-6
            up = loss()
            p[idx] = old - 1e-6
            down = loss()
            p[idx] = old
            assert grad[flat_index + np.ravel_multi_index(idx, p.shape)] == pytest.approx((up - down) / 2e-6,
                                                                                          rel=1e-4, abs=1e-6)
            checked += 1
        flat_index += p.size
    assert flat_index == grad.size and checked > 40


def test_noise_of_a_dp_sgd_step_has_std_sigma_times_the_clipping_bound():
    # Zero gradients: the released update is pure noise N(0, (sigma C_s)^2) / expected_batch per coordinate.
    layers = [dpsgd.LayerGrad(np.ones((30, 400)), np.zeros((30, 300)))]
    sigma, batch = 1.7, 50.0
    res = dpsgd.dp_gradient(layers, sigma_grad=sigma, sigma_norm=1.0, c_max=10.0, bins=100,
                            expected_batch=batch, rng=np.random.default_rng(6))
    w, b = res.grads[0]
    assert 0 < res.clip <= 10.0 and np.isclose(res.clip * 10, round(res.clip * 10))  # a bin's upper edge
    assert np.std(w * batch) / (sigma * res.clip) == pytest.approx(1.0, abs=0.01)
    assert b.shape == (300,) and abs(np.mean(w)) < 0.01 * np.std(w)


def test_dpnorm_picks_the_mode_of_the_gradient_norms_when_the_noise_is_small():
    norms = np.concatenate([np.full(500, 2.34), np.full(100, 7.0)])
    bound = dpsgd.noisy_mode_bound(norms, c_max=10.0, bins=100, sigma=1.0, rng=np.random.default_rng(7))
    assert bound == pytest.approx(2.4)


def test_one_step_is_one_subsampled_gaussian_with_the_combined_noise_multiplier():
    # Without sampling the claim is exact: the two Gaussian releases of one batch compose to one Gaussian of
    # sigma_eff = (sigma_n^-2 + sigma_g^-2)^(-1/2) (mu-GDP composes in quadrature); the plan's "sgd" entry
    # states sigma_eff and the step draws both parts at sqrt 2 sigma_eff.
    sigma, delta = 1.3, 1e-6
    pair = PLDAccountant().compose(dpe.ComposedDpEvent([dpe.GaussianDpEvent(sigma)] * 2))
    sgd = dpgm.plan(dpgm.NoisePlan(1.0, 1.0, sigma), kmeans_iterations=1, q=0.01, steps=200, max_items=5)["sgd"]
    single = PLDAccountant().compose(dpe.GaussianDpEvent(sgd.noise_multiplier))
    assert pair.get_epsilon(delta) == pytest.approx(single.get_epsilon(delta), rel=2e-3)
    event = sgd.event()
    assert event.count == 200 and event.event.sampling_probability == 0.01
    assert event.event.event.noise_multiplier == pytest.approx((2 * sigma ** -2) ** -0.5, rel=1e-12)


def test_calibrated_plan_meets_the_budget_recomputed_from_scratch():
    eps, delta, T, q, steps = 1.5, 1e-6, 10, 0.02, 300
    noise = dpgm.calibrate(epsilon=eps, delta=delta, kmeans_iterations=T, q=q, steps=steps)
    # Recompute: 2T zCDP Gaussians (k-means, OpenDP discrete Gaussians), one (marginals), `steps`
    # Poisson-subsampled continuous Gaussians (DP-SGD), by RDP from scratch.
    acc = RdpAccountant()
    acc.compose(dpe.ZCDpEvent(1 / (2 * noise.sigma_kmeans ** 2)), 2 * T)
    acc.compose(dpe.ZCDpEvent(1 / (2 * noise.sigma_marginals ** 2)))
    acc.compose(dpe.PoissonSampledDpEvent(q, dpe.GaussianDpEvent(noise.sigma_sgd / np.sqrt(2))), steps)
    assert 0.97 * eps <= acc.get_epsilon(delta) <= eps * 1.001
    plan = noise
    # The shares order the noise: the part with the largest share gets the smallest multiplier.
    assert plan.sigma_kmeans > plan.sigma_marginals


def test_cluster_table_has_l2_sensitivity_sqrt_max_items_plus_one():
    rng = np.random.default_rng(8)
    X = _records(200, 40, 0.3, 9)
    labels = rng.integers(0, 3, 200)
    base = dpgm.cluster_counts(X, labels, 3, max_items=5)
    worst = 0.0
    for length in (1, 3, 5, 9, 40):
        extra = sp.csr_matrix((np.ones(length, np.float32), (np.zeros(length, int), rng.choice(40, length, False))),
                              shape=(1, 40))
        more = dpgm.cluster_counts(sp.vstack([X, extra]).tocsr(), np.append(labels, 1), 3, max_items=5)
        worst = max(worst, np.linalg.norm(more - base))
    assert worst <= np.sqrt(6) + 1e-12 and worst > np.sqrt(5)  # the bound is attained at length 5


def test_marginal_initialisation_starts_every_model_at_the_independent_items_model():
    p = np.linspace(0.01, 0.6, 30)
    rng = np.random.default_rng(10)
    for kind in ("vae", "rbm"):
        model = dpgm.make_model(dpgm.SGDConfig(model=kind), 30, rng, marginals=p)
        freq = np.asarray(model.sample(20_000, rng).mean(axis=0)).ravel()
        # (uninitialised, every item would come out near 0.5; the RBM's random weights couple the items a little)
        assert np.abs(freq - p).mean() < (0.03 if kind == "rbm" else 0.006)


def test_matching_the_marginals_sets_every_items_average_probability():
    rng = np.random.default_rng(16)
    vae = VAE(40, rng, hidden=(24,))            # a random decoder: item probabilities depend on z
    p = np.linspace(0.001, 0.08, 40)            # short records: many empty draws, which synthesis drops
    dpgm.match_marginals([vae], p[None], rng)
    S = vae.sample(40_000, rng)
    freq = np.asarray(S[np.diff(S.indptr) > 0].mean(axis=0)).ravel()
    assert np.abs(freq - p).mean() < 0.002 and np.diff(S.indptr).min() == 0


def test_training_improves_the_fit_and_synthesis_is_reproducible_from_the_stored_models():
    rng = np.random.default_rng(11)
    # Two clusters with different popular items; models start from flat marginals and must learn them.
    A = (rng.random((3000, 20)) < np.r_[np.full(10, 0.5), np.full(10, 0.02)]).astype(np.float32)
    B = (rng.random((3000, 20)) < np.r_[np.full(10, 0.02), np.full(10, 0.5)]).astype(np.float32)
    clusters = [sp.csr_matrix(A), sp.csr_matrix(B)]
    cfg = dpgm.SGDConfig(model="vae", hidden=(32,), steps=150, q=0.1, lr=0.02)
    plan = dpgm.plan(dpgm.NoisePlan(1.0, 1.0, 0.5), kmeans_iterations=1, q=cfg.q, steps=cfg.steps, max_items=5)
    models = [dpgm.make_model(cfg, 20, rng, np.full(20, 0.26)) for _ in clusters]
    before = [m.loss_and_gradients(X, rng)[0].mean() for m, X in zip(models, clusters)]
    dpgm.train(models, lambda s: [X[rng.random(X.shape[0]) < cfg.q] for X in clusters], np.array([3000., 3000.]),
               cfg, Measure(plan, SeededNoise(13)))
    after = [m.loss_and_gradients(X, rng)[0].mean() for m, X in zip(models, clusters)]
    assert all(a < 0.85 * b for a, b in zip(after, before))
    stored = [dpgm.load_model("vae", dpgm.model_arrays(m), (32,)) for m in models]
    S1 = dpgm.synthesize(stored, np.array([1.0, 3.0]), 4000, np.random.default_rng(12))
    S2 = dpgm.synthesize(models, np.array([1.0, 3.0]), 4000, np.random.default_rng(12))
    assert (S1 != S2).nnz == 0 and S1.shape == (4000, 20) and np.diff(S1.indptr).min() >= 1
    # weights 1:3 -> a quarter of the records look like cluster A (more items among the first ten).
    share_a = np.mean(np.asarray(S1[:, :10].sum(axis=1)).ravel() > np.asarray(S1[:, 10:].sum(axis=1)).ravel())
    assert share_a == pytest.approx(0.25, abs=0.05)


def test_counting_queries_buckets_and_answers():
    rng = np.random.default_rng(13)
    Q, buckets = counting.random_queries(50, 200, rng)
    lengths = np.diff(Q.indptr)
    for b in range(5):
        sel = lengths[buckets == b]
        assert sel.min() > b * 10 and sel.max() <= (b + 1) * 10
    X = _records(300, 50, 0.05, 14)
    dense_q, dense_x = Q.toarray() > 0, X.toarray() > 0
    anyof = np.array([(dense_x[:, q]).any(axis=1).sum() for q in dense_q])
    np.testing.assert_array_equal(counting.anyof_answers(X, Q, chunk=70), anyof)
    linear = np.array([dense_x[:, q].sum() for q in dense_q])
    np.testing.assert_array_equal(counting.linear_answers(counting.item_counts(X), Q), linear)
    err = counting.relative_errors(np.array([0.0, 100.0]), np.array([0.2, 90.0]), 1000)
    np.testing.assert_allclose(err, [0.2, 0.1])  # sanity bound 0.1% of 1000 = 1


def test_mwem_beats_uniform_and_clipping_keeps_at_most_max_items():
    rng = np.random.default_rng(15)
    X = sp.csr_matrix((rng.random((5000, 40)) < np.linspace(0.01, 0.5, 40)).astype(np.float32))
    Xc = counting.clip_records(X, 3, rng)
    assert np.diff(Xc.indptr).max() <= 3 and (Xc - Xc.multiply(X)).nnz == 0
    Q, _ = counting.random_queries(40, 100, rng)
    counts = counting.item_counts(Xc)
    est = counting.mwem_linear(counts, Q, epsilon=5.0, max_items=3, rounds=20, rng=rng)
    uniform = np.full(40, counts.sum() / 40)
    truth = counting.linear_answers(counts, Q)
    assert (np.abs(counting.linear_answers(est, Q) - truth).mean()
            < 0.6 * np.abs(counting.linear_answers(uniform, Q) - truth).mean())
