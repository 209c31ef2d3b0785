"""DPGM (Acs et al.): factored per-example gradients, DP-SGD noise, accounting, the mixture, counting queries."""

import numpy as np
import pytest
import scipy.sparse as sp
from dp_accounting import dp_event as dpe
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from scipy.special import expit

from dpalgos import counting, dpgm, dpsgd, generative
from dpalgos.generative import RBM, VAE, records_of_lengths
from dpalgos.noise import Measure, SeededNoise


def _records(n=40, m=25, p=0.15, seed=0) -> sp.csr_matrix:
    return sp.csr_matrix((np.random.default_rng(seed).random((n, m)) < p).astype(np.float32))


def _models():
    rng = np.random.default_rng(1)
    return [VAE(25, rng, hidden=(16,)), VAE(25, rng, hidden=(12, 9)), RBM(25, rng, hidden=11)]


@pytest.mark.parametrize("model", _models(), ids=["vae", "vae-2-hidden", "rbm"])
def test_factored_norms_and_clipped_sum_equal_the_per_example_loop(model):
    X = _records()
    layers = model.gradients(X, np.random.default_rng(2))
    G = dpsgd.per_example_gradients(layers)                     # the naive (B, P) matrix
    assert G.shape[1] == model.params.size
    norms = dpsgd.per_example_norms(layers)
    np.testing.assert_allclose(norms, np.linalg.norm(G, axis=1), rtol=1e-10)
    f = np.minimum(1.0, np.median(norms) / norms)
    np.testing.assert_allclose(dpsgd.clipped_sum(layers, f), (f[:, None] * G).sum(axis=0), rtol=1e-9, atol=1e-12)
    assert np.all(np.linalg.norm(f[:, None] * G, axis=1) <= np.median(norms) * (1 + 1e-12))


def test_vae_per_example_gradients_match_finite_differences():
    vae = VAE(12, np.random.default_rng(3), hidden=(7, 5))
    x = _records(1, 12, 0.4, 4)
    loss = lambda: vae.loss(x, np.random.default_rng(5))[0]  # same latent noise every call
    grad = dpsgd.per_example_gradients(vae.gradients(x, np.random.default_rng(5)))[0]
    starts = np.cumsum([0] + [a.size for layer in vae._layers() for a in layer])[:-1]
    checked = 0
    for start in starts:
        for i in range(start, start + 6):
            old = vae.params[i]
            vae.params[i] = old + 1e-6
            up = loss()
            vae.params[i] = old - 1e-6
            down = loss()
            vae.params[i] = old
            assert grad[i] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-6)
            checked += 1
    assert grad.size == vae.params.size and checked > 40


def _adam_reference(p, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def test_a_training_step_adds_noise_sigma_times_the_bound_from_the_step_generator_and_fuses_adam_exactly():
    rng = np.random.default_rng(20)
    X = _records(60, 25, 0.2, 21)
    cfg = dpgm.SGDConfig(hidden=(16,), steps=3, q=0.5, lr=0.01)
    plan = dpgm.plan(dpgm.NoisePlan(1.0, 1.0, 0.8), kmeans_iterations=1, q=cfg.q, steps=cfg.steps, max_items=5)
    model = dpgm.make_model(cfg, 25, rng, np.full(25, 0.2))
    replica = dpgm.make_model(cfg, 25, np.random.default_rng(20), np.full(25, 0.2))
    measure = Measure(plan, SeededNoise(22))
    dpgm.train([model], lambda s: [X[10 * s:10 * s + 30]], np.array([60.0]), cfg, measure)
    assert measure.calls["sgd"] == cfg.steps
    # Replay: the same step generators, the exact clipped sums, the noise N(0, (sigma C_s)^2) per coordinate,
    # and textbook Adam on the released gradients.
    source, sigma, start = SeededNoise(22), plan["sgd"].noise_multiplier * np.sqrt(2.0), replica.params.copy()
    grads = []
    for s in range(cfg.steps):
        n_rng, g_rng = source.step_generator().spawn(2)  # the noise stream, then one per model
        z = n_rng.standard_normal(start.size)
        replica.params[:] = _adam_reference(start, grads, cfg.lr)
        total, clip = dpsgd.clip_and_sum(replica.gradients(X[10 * s:10 * s + 30], g_rng), sigma_norm=sigma,
                                         c_max=cfg.c_max, bins=cfg.bins, rng=g_rng)
        grads.append(dpsgd.noisy_gradient(total, z, sigma * clip, cfg.q * 60.0))
    np.testing.assert_allclose(model.params, _adam_reference(start, grads, cfg.lr), rtol=1e-9, atol=1e-12)


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
    eps, delta, T, q, steps, max_items = 1.5, 1e-6, 10, 0.02, 300, 30
    noise = dpgm.calibrate(epsilon=eps, delta=delta, kmeans_iterations=T, q=q, steps=steps, max_items=max_items)
    # Recompute: 2T zCDP Gaussians (k-means, OpenDP discrete Gaussians), one (marginals, sizes and length
    # histograms), `steps` Poisson-subsampled continuous Gaussians (DP-SGD), by RDP from scratch.
    acc = RdpAccountant()
    acc.compose(dpe.ZCDpEvent(1 / (2 * noise.sigma_kmeans ** 2)), 2 * T)
    acc.compose(dpe.ZCDpEvent(1 / (2 * noise.sigma_marginals ** 2)))
    acc.compose(dpe.PoissonSampledDpEvent(q, dpe.GaussianDpEvent(noise.sigma_sgd / np.sqrt(2))), steps)
    assert 0.97 * eps <= acc.get_epsilon(delta) <= eps * 1.001
    # The shares order the noise: the part with the largest share gets the smallest multiplier.
    assert noise.sigma_kmeans > noise.sigma_marginals


def test_length_histograms_keep_empty_records_as_a_length_and_move_by_one_bin():
    rng = np.random.default_rng(17)
    X = _records(200, 40, 0.05, 18)               # some records are empty
    labels = rng.integers(0, 3, 200)
    table = dpgm.split_table(dpgm.cluster_counts(X, labels, 3, max_items=6, min_length=0), 40)[2]
    lengths = np.diff(X.indptr)
    assert table.sum() == 200 and table[:, 0].sum() == (lengths == 0).sum() > 0
    assert table[:, -1].sum() == (lengths >= 6).sum()
    for length in (0, 1, 6, 40):
        extra = sp.csr_matrix((np.ones(length, np.float32), (np.zeros(length, int), rng.choice(40, length, False))),
                              shape=(1, 40))
        more = dpgm.split_table(dpgm.cluster_counts(sp.vstack([X, extra]).tocsr(), np.append(labels, 2), 3, 6, 0),
                                40)[2]
        assert np.linalg.norm(more - table) == 1.0


def test_length_estimate_fits_the_item_total_so_the_noise_of_empty_bins_adds_no_long_records():
    rng = np.random.default_rng(23)
    scale = 26.0                                  # BMS1, 64 items, epsilon 1.74: the marginals' noise scale
    noisy = np.zeros(31)
    noisy[0] = 18_000                             # a cluster of empty records
    noisy += rng.normal(0, scale, 31)
    cluster = np.concatenate([rng.normal(0, scale, 64), [18_000 + rng.normal(0, scale)], noisy])
    a = dpgm.total_scale(64, 31)                  # the rows of all records: present/absent counts
    top = a * np.concatenate([np.zeros(64), [18_000], noisy * 0 + np.eye(31)[0] * 18_000]) + rng.normal(0, scale, 96)
    bottom = a * np.concatenate([np.full(64, 18_000.0), np.zeros(32)]) + rng.normal(0, scale, 96)
    mean_length = dpgm.length_distributions(np.vstack([cluster, top, bottom]), 64, 0)[0] @ np.arange(31)
    simplex = dpgm.project_simplex(noisy, noisy.sum())
    assert mean_length < 0.005 and simplex @ np.arange(31) / simplex.sum() > 0.01


def test_lengths_above_the_item_count_get_no_mass_and_synthesis_keeps_the_item_total():
    """16 items, max_items 30: length bins 17..30 are impossible and hold noise only. Fitted in, they took part of
    the item total, which synthesis (at most 16 distinct items a record) then lost: every item total about 0.3 %
    low on BMS1 at 16 items, a flat error of every linear query (issue 37)."""
    rng = np.random.default_rng(31)
    m, k, bins, n = 16, 2, 31, 20_000
    X = sp.vstack([_records(n // 2, m, 0.04, 32), _records(n // 2, m, 0.85, 33)]).tocsr()   # short and long records
    labels = np.repeat([0, 1], n // 2)
    exact = dpgm.cluster_counts(X, labels, k, max_items=30, min_length=0)
    noisy = exact + rng.normal(0, 30.0, exact.shape)
    noisy[:, m + 1 + 17:] = np.abs(noisy[:, m + 1 + 17:])        # the impossible bins' noise, all of it positive
    probs = dpgm.length_distributions(noisy, m, 0)
    assert probs.shape == (k, bins) and np.all(probs[:, m + 1:] == 0)
    _, sizes, _ = dpgm.split_table(dpgm.reconciled(noisy, m), m)
    totals = dpgm.split_table(dpgm.reconciled(noisy, m), m)[0].sum(axis=1)
    np.testing.assert_allclose(probs @ np.arange(bins) * sizes, totals, rtol=1e-3)
    _, lengths = dpgm.record_plan(sizes, probs, 0, int(np.round(sizes.sum())), rng)
    assert lengths.max() <= m                     # every planned item fits in a record: none is lost


def test_cluster_table_of_many_items_has_l2_sensitivity_sqrt_max_items_plus_two_and_no_rows_of_all_records():
    rng = np.random.default_rng(8)
    X = _records(200, 40, 0.3, 9)                 # 40 items against a clip of 5: many items
    labels = rng.integers(0, 3, 200)
    assert not dpgm.present_absent(40, 5)
    base = dpgm.cluster_counts(X, labels, 3, max_items=5)
    assert not base[3:].any()
    worst = 0.0
    for length in (1, 3, 5, 9, 40):
        extra = sp.csr_matrix((np.ones(length, np.float32), (np.zeros(length, int), rng.choice(40, length, False))),
                              shape=(1, 40))
        more = dpgm.cluster_counts(sp.vstack([X, extra]).tocsr(), np.append(labels, 1), 3, max_items=5)
        worst = max(worst, np.linalg.norm(more - base))
    assert worst == pytest.approx(np.sqrt(7), rel=1e-12)  # the bound sqrt(5 + 2) is attained at length 5
    sensitivity = lambda items: dpgm.plan(dpgm.NoisePlan(1.0, 1.0, 1.0), kmeans_iterations=1, q=0.1, steps=1,
                                          max_items=5, items=items)["marginals"].sensitivity
    assert sensitivity(40) == pytest.approx(np.sqrt(7))
    assert sensitivity(None) == pytest.approx(np.sqrt(7 * (1 + dpgm.TOTAL_WEIGHT ** 2)))  # m unknown: the larger
    noisy = base + rng.normal(0, 1.0, base.shape)
    np.testing.assert_array_equal(dpgm.reconciled(noisy, 40), noisy)


def test_present_absent_rows_stay_within_the_sensitivity_and_reconciling_shrinks_the_item_totals_error():
    rng = np.random.default_rng(30)
    X, k, max_items = _records(3000, 20, 0.1, 31), 4, 5   # 20 items, clip 5: present/absent rows
    labels = rng.integers(0, k, 3000)
    assert dpgm.present_absent(20, max_items + 1)
    base = dpgm.cluster_counts(X, labels, k, max_items, 0)
    bound = np.sqrt((1 + dpgm.TOTAL_WEIGHT ** 2) * (max_items + 2))
    for length in (0, 1, 5, 20):
        extra = sp.csr_matrix((np.ones(length, np.float32), (np.zeros(length, int), rng.choice(20, length, False))),
                              shape=(1, 20))
        more = dpgm.cluster_counts(sp.vstack([X, extra]).tocsr(), np.append(labels, 0), k, max_items, 0)
        assert np.linalg.norm(more - base) <= bound * (1 + 1e-12)
    assert dpgm.plan(dpgm.NoisePlan(1.0, 1.0, 1.0), kmeans_iterations=1, q=0.1, steps=1, max_items=max_items,
                     items=20, min_length=0)["marginals"].sensitivity == pytest.approx(bound)
    true = counting.item_counts(X)
    plain, joint = [], []
    for seed in range(20):
        noisy = base + np.random.default_rng(seed).normal(0, 10.0, base.shape)
        plain.append(noisy[:k, :20].sum(axis=0) - true)
        joint.append(dpgm.reconciled(noisy, 20)[:k, :20].sum(axis=0) - true)
    # k cluster rows summed: variance 4 x 100; the rows of all records: about 100 / (2 a^2) (a = 2 sqrt(7/22)).
    assert np.std(joint) < 0.5 * np.std(plain)


def test_marginal_initialisation_starts_every_model_at_the_independent_items_model():
    p = np.linspace(0.01, 0.6, 30)
    rng = np.random.default_rng(10)
    for kind in ("vae", "rbm"):
        model = dpgm.make_model(dpgm.SGDConfig(model=kind), 30, rng, marginals=p)
        logits = model.logits(20_000, rng) if kind == "vae" else model.logits(2_000, rng, chains=200, burn_in=100)
        freq = expit(logits).mean(axis=0)                                                # Bernoulli item rates
        # (uninitialised, every item would come out near 0.5; the RBM's random weights couple the items a little)
        assert np.abs(freq - p).mean() < (0.03 if kind == "rbm" else 0.006)


def test_records_of_lengths_have_their_lengths_and_single_items_follow_the_odds():
    rng = np.random.default_rng(19)
    logits = np.tile(np.log(np.array([1.0, 2.0, 4.0, 1.0, 0.5, 0.5]) / 9), (60_000, 1)).astype(np.float32)
    lengths = rng.integers(0, 7, 60_000)
    S = records_of_lengths(logits, lengths, rng)
    np.testing.assert_array_equal(np.diff(S.indptr), lengths)
    assert S.max() == 1.0                          # distinct items
    single = np.asarray(S[lengths == 1].mean(axis=0)).ravel()
    # Given one item, the model's independent Bernoulli items pick item j with probability odds_j / sum(odds).
    np.testing.assert_allclose(single, np.array([1, 2, 4, 1, 0.5, 0.5]) / 9, atol=0.015)


def test_race_keeps_each_records_largest_keys():
    rng = np.random.default_rng(29)
    keys = rng.normal(size=(500, 40)).astype(np.float32)
    lengths = rng.integers(0, 41, 500)
    S = generative.race(keys, lengths)
    for i in range(500):
        expected = np.sort(np.argsort(-keys[i])[:lengths[i]])
        np.testing.assert_array_equal(S.indices[S.indptr[i]:S.indptr[i + 1]], expected)


def _successive_law(w: np.ndarray, L: int) -> dict:
    """P(the set drawn) under successive sampling of L of the weights w, by enumerating the orders."""
    from itertools import permutations
    law: dict = {}
    for order in permutations(range(w.size), L):
        p, rest = 1.0, w.sum()
        for j in order:
            p, rest = p * w[j] / rest, rest - w[j]
        key = tuple(sorted(order))
        law[key] = law.get(key, 0.0) + p
    return law


@pytest.mark.parametrize("odds", [[1.0, 2.0, 4.0, 1.0, 0.5, 0.5],       # draws by rejection
                                  [200.0, 100.0, 1.0, 1.0, 0.5, 0.5]])  # most of the odds drawn: exact scans
def test_records_of_lengths_draw_sets_with_the_successive_sampling_law(odds):
    rng, w, n = np.random.default_rng(23), np.array(odds), 40_000
    for L in (2, 3):
        S = records_of_lengths(np.tile(np.log(w), (n, 1)).astype(np.float32), np.full(n, L), rng)
        keys, counts = np.unique(S.indices.reshape(n, L), axis=0, return_counts=True)
        seen = {tuple(k): c / n for k, c in zip(keys, counts)}
        for key, p in _successive_law(w, L).items():
            assert abs(seen.get(key, 0.0) - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-4, (L, key)


def test_synthesis_keeps_empty_records_and_the_dp_lengths_and_matching_sets_the_item_frequencies():
    rng = np.random.default_rng(16)
    vae = VAE(40, rng, hidden=(24,))            # a random decoder: item probabilities depend on z
    probs = np.array([0.4, 0.3, 0.2, 0.1])        # lengths 0..3: 40% empty records
    p = np.linspace(0.001, 0.05, 40) * 1.0 / np.linspace(0.001, 0.05, 40).sum()   # sums to E[length] = 1
    dpgm.match_marginals([vae], p[None], probs[None], 0, rng)
    S = dpgm.synthesize([vae], np.array([1.0]), probs[None], p[None], 0, 40_000, rng)
    assert S.shape[0] == 40_000                  # no silent shrink
    np.testing.assert_allclose(np.bincount(np.diff(S.indptr)) / 40_000, probs, atol=0.01)
    freq = np.asarray(S.mean(axis=0)).ravel()
    assert np.abs(freq - p).mean() < 0.1 * p.mean()


def test_record_plan_holds_every_clusters_item_total_which_rounding_the_lengths_alone_misses():
    rng = np.random.default_rng(40)
    probs = np.vstack([np.full(31, 1 / 31), rng.random(31) ** 4, np.eye(31)[0] * 0.9 + 0.1 / 31])
    weights = np.array([7.0, 5_000.0, 300.0])
    clusters, lengths = dpgm.record_plan(weights, probs, 0, 5_307, rng)
    for c, p in enumerate(probs):
        n = int(np.sum(clusters == c))
        share, target = n * p / p.sum(), round(n * p / p.sum() @ np.arange(31))
        assert lengths[clusters == c].sum() == target
        assert np.abs(np.bincount(lengths[clusters == c], minlength=31) - share).max() < 3
    # 7 records over 31 equally likely lengths: the largest remainders alone give lengths 0..6, 21 items of 105.
    assert dpgm.rounded(probs[0], 7) @ np.arange(31) == 21


def test_raking_moves_item_counts_to_the_marginals_and_keeps_lengths_and_distinct_items():
    rng = np.random.default_rng(24)
    S = sp.csr_matrix((rng.random((4000, 30)) < np.linspace(0.02, 0.2, 30)).astype(np.float32))
    p = np.linspace(0.02, 0.2, 30) * rng.uniform(0.8, 1.2, 30)     # the sample is off its DP marginals
    R = dpgm.rake_items(S, p, rng)
    np.testing.assert_array_equal(np.diff(R.indptr), np.diff(S.indptr))
    assert R.max() == 1.0
    target = dpgm.rounded(p, S.nnz)
    assert np.abs(np.asarray(R.sum(axis=0)).ravel() - target).sum() < 0.02 * np.abs(
        np.asarray(S.sum(axis=0)).ravel() - target).sum()


def test_raking_fills_an_item_most_records_hold_from_the_records_without_it():
    """Long records over few items (retail at 16 items): nearly every record holds the item in deficit, so a
    random surplus occurrence is almost always in a record that holds it already; the moves must come from the
    records without it, or the item total stays short of its DP marginal (issue 37)."""
    rng = np.random.default_rng(41)
    n, m = 3000, 8
    X = np.zeros((n, m), dtype=np.float32)
    for i in range(n):
        X[i, rng.choice(m, 6, replace=False, p=np.r_[0.05, np.full(m - 1, 0.95 / (m - 1))])] = 1
    S = sp.csr_matrix(X)
    p = np.r_[0.97, np.full(m - 1, (6 - 0.97) / (m - 1))]   # item 0 in 97 % of records; feasible at length 6
    R = dpgm.rake_items(S, p, rng)
    np.testing.assert_array_equal(np.diff(R.indptr), np.diff(S.indptr))
    assert R.max() == 1.0
    np.testing.assert_array_equal(np.asarray(R.sum(axis=0)).ravel(), dpgm.rounded(p, S.nnz))


def test_a_cluster_holds_an_item_at_most_once_per_record_and_keeps_records_for_it():
    """Cluster 0 is the records holding item 0 (retail on 16 items has such clusters). The rows of all records
    read item 0 40 too high and cluster 0's empty bin 60 too high: reconciling must not give the cluster more of
    item 0 than its size (the rest goes to the other cluster), and the length fit must leave it a non-empty
    record for every one of them, or synthesis loses them (issue 37)."""
    m, n = 8, 5_000
    rest = [_records(n, m - 1, 0.2, seed).toarray() for seed in (43, 44)]
    X = sp.csr_matrix(np.vstack([np.c_[np.ones(n), rest[0]], np.c_[np.zeros(n), rest[1]]]))
    labels = np.repeat([0, 1], n)
    noisy = dpgm.cluster_counts(X, labels, 2, max_items=30, min_length=0)
    a = dpgm.total_scale(m, 31)
    noisy[2, 0] += 40 * a
    noisy[3, 0] -= 40 * a
    noisy[0, m + 1] += 60
    counts, sizes, _ = dpgm.split_table(dpgm.reconciled(noisy, m), m)
    assert counts[0, 0] <= sizes[0] + 1e-9
    np.testing.assert_allclose(counts[:, 0].sum(), dpgm.column_totals(noisy, m)[0])   # above n: the rest in cluster 1
    assert counts[1, 0] > 5
    probs = dpgm.length_distributions(noisy, m, 0)
    assert sizes[0] * (1 - probs[0, 0]) >= counts[0, 0] - 1e-6


def test_every_part_of_a_synthesis_holds_its_share_of_an_item_nearly_every_record_holds():
    """Parts are raked on their own, each to its share of the cluster's items: a part drawn at random with more
    items per record than the cluster asks more of item 0 (in 99.7 % of records) than it has non-empty records,
    and the rest is lost (retail on 16 items: 30 in a part of 10,415 records). Dealt parts hold every length's
    share (issue 37)."""
    rng = np.random.default_rng(45)
    m, n = 6, 30_001
    probs = np.array([[0.002, 0.3, 0.4, 0.298]])            # lengths 0..3
    mean = probs[0] @ np.arange(4)
    p = np.r_[0.997, np.full(m - 1, (mean - 0.997) / (m - 1))]
    S = sp.vstack(list(dpgm.synthesize_chunks([VAE(m, rng, hidden=(8,))], np.array([1.0]), probs, p[None], 0, n,
                                              rng, chunk=4_000))).tocsr()
    np.testing.assert_array_equal(np.bincount(np.diff(S.indptr)), dpgm.length_counts(probs[0], n, 0))
    assert abs(S[:, 0].sum() - 0.997 * n) < 10


def test_synthesis_holds_the_item_totals_where_a_clusters_lengths_cannot_hold_its_marginals():
    """Cluster 0's DP marginals put items 0 and 1 in every record, but half its records have length 1: it can
    hold 1.5 of its 2 per record, and half an occurrence of item 2 per record is left over. The slice's other
    cluster takes the rest, so the item totals (all that linear queries see) are the DP ones (BMS1 on 16 items,
    seed 3: one item 29 high, another 17 short, when every cluster was raked on its own)."""
    rng = np.random.default_rng(47)
    m, n = 5, 4_000
    marginals = np.array([[1.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0, 1.0]])
    clusters = np.repeat([0, 1], n // 2)
    lengths = np.r_[np.tile([1, 3], n // 4), np.full(n // 2, 3)]
    models = [VAE(m, rng, hidden=(8,)) for _ in range(2)]
    S = dpgm.synthesize_part(models, marginals, clusters, lengths, rng)
    np.testing.assert_array_equal(np.diff(S.indptr), lengths)
    assert S.max() == 1.0
    np.testing.assert_array_equal(np.asarray(S.sum(axis=0)).ravel(), [n // 2, n // 2, n // 2, n // 2, n // 2])


def test_an_item_a_cluster_does_not_hold_gets_no_occurrences_in_its_records():
    """Rates kept off 0 for the models' logits were also the raking targets: 1e-4 of a cluster of 50,000
    records is 5 occurrences of an item it does not hold, in every release (BMS1 on 16 items)."""
    m, n = 6, 50_000
    X = sp.csr_matrix(np.c_[_records(n, m - 1, 0.3, 48).toarray(), np.zeros(n)])
    table = dpgm.cluster_counts(X, np.zeros(n, dtype=np.int64), 1, max_items=30, min_length=0)
    marginals, sizes = dpgm.marginals_and_sizes(table, m)
    assert marginals[0, m - 1] == 0.0
    rng = np.random.default_rng(49)
    lengths = np.diff(X.indptr)
    S = dpgm.synthesize_part([dpgm.make_model(dpgm.SGDConfig(hidden=(8,)), m, rng, marginals[0])], marginals,
                             np.zeros(n, dtype=np.int64), lengths, rng)
    assert S[:, m - 1].nnz == 0
    np.testing.assert_allclose(np.asarray(S.sum(axis=0)).ravel(), counting.item_counts(X), atol=1)


def test_training_improves_the_fit_and_synthesis_is_reproducible_from_the_stored_models():
    rng = np.random.default_rng(11)
    # Two clusters with different popular items; models start from flat marginals and must learn them.
    A = (rng.random((3000, 20)) < np.r_[np.full(10, 0.5), np.full(10, 0.02)]).astype(np.float32)
    B = (rng.random((3000, 20)) < np.r_[np.full(10, 0.02), np.full(10, 0.5)]).astype(np.float32)
    clusters = [sp.csr_matrix(A), sp.csr_matrix(B)]
    cfg = dpgm.SGDConfig(model="vae", hidden=(32,), steps=150, q=0.1, lr=0.02)
    plan = dpgm.plan(dpgm.NoisePlan(1.0, 1.0, 0.5), kmeans_iterations=1, q=cfg.q, steps=cfg.steps, max_items=5)
    models = [dpgm.make_model(cfg, 20, rng, np.full(20, 0.26)) for _ in clusters]
    before = [m.loss(X, rng).mean() for m, X in zip(models, clusters)]
    dpgm.train(models, lambda s: [X[rng.random(X.shape[0]) < cfg.q] for X in clusters], np.array([3000., 3000.]),
               cfg, Measure(plan, SeededNoise(13)))
    after = [m.loss(X, rng).mean() for m, X in zip(models, clusters)]
    assert all(a < 0.85 * b for a, b in zip(after, before))
    stored = [dpgm.load_model("vae", dpgm.model_arrays(m), (32,)) for m in models]
    hist = np.bincount(np.diff(sp.csr_matrix(A).indptr), minlength=21)[1:]
    lengths, marg = np.tile(hist / hist.sum(), (2, 1)), np.array([A.mean(axis=0), B.mean(axis=0)])
    S1 = dpgm.synthesize(stored, np.array([1.0, 3.0]), lengths, marg, 1, 4000, np.random.default_rng(12))
    S2 = dpgm.synthesize(models, np.array([1.0, 3.0]), lengths, marg, 1, 4000, np.random.default_rng(12))
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
    np.testing.assert_array_equal(counting.anyof_answers(X, Q), anyof)
    np.testing.assert_array_equal(counting.anyof_answers(X, Q, planes=3), anyof)  # flushed every 7 records
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


@pytest.mark.parametrize("items", [20, 300])          # with and without present/absent rows (max_items 30)
def test_independent_baseline_spends_the_release_budget_on_dpgm_marginals_entry_for_one_cluster(items):
    plan = dpgm.independent_plan(epsilon=1.74, delta=1e-5, max_items=30, items=items)
    (entry,) = plan.mechanisms
    assert entry.name == "marginals" and entry.distribution == "gaussian"
    assert entry.sensitivity == dpgm.marginals_sensitivity(30, items, 30)    # DPGM's sensitivity argument, k = 1
    accountant = RdpAccountant()
    accountant.compose(plan.event())
    assert 1.74 / 2 <= accountant.get_epsilon(1e-5) <= 1.74 * (1 + 1e-6)     # the whole (epsilon, delta), no more


def test_independent_baseline_keeps_totals_and_lengths_and_not_which_items_go_together():
    rng = np.random.default_rng(40)
    n, m = 6000, 12
    pairs = rng.random(n) < 0.5                       # items 0 and 1 always together, in half the records
    X = (rng.random((n, m)) < 0.2).astype(np.float32)
    X[:, 0] = X[:, 1] = pairs
    X[X.sum(axis=1) == 0, 5] = 1                      # non-empty records
    X = sp.csr_matrix(X)
    exact = dpgm.cluster_counts(X, np.zeros(n, np.int64), 1, max_items=30)   # no noise: the totals themselves
    S = dpgm.independent_items(exact, m, rng)
    assert abs(S.shape[0] - n) <= 1
    np.testing.assert_allclose(counting.item_counts(S), counting.item_counts(X), atol=2)
    np.testing.assert_array_equal(np.bincount(np.diff(S.indptr), minlength=m + 1)[:m + 1],
                                  np.bincount(np.diff(X.indptr), minlength=m + 1)[:m + 1])
    together = lambda Y: float(Y[:, 0].multiply(Y[:, 1]).sum()) / Y.shape[0]
    assert together(X) == pytest.approx(0.5, abs=0.02) and together(S) < 0.35   # the pairs come apart


def test_the_number_of_clusters_is_a_rule_of_the_public_item_count():
    """`dpgm.default_k`: items // 8 within [4, 8] (4 at 16 items, 8 at 64 and beyond); a spec without k gets it from
    its public item_count, whatever max_items; a spec's own k is kept."""
    from tasks.spec import parse_spec

    assert [dpgm.default_k(m) for m in (1, 16, 39, 40, 63, 64, 497, 16470)] == [4, 4, 4, 5, 7, 8, 8, 8]

    def k_of(items, **release):
        return parse_spec({"dataset": {"id": "d", "path": "d.parquet", "items_column": "items", "item_count": items},
                           "release": {"kind": "synthetic", "epsilon": 1.0, "delta": 1e-6, "gamma": 0.05,
                                       **release}}).release.k
    assert (k_of(16), k_of(64), k_of(64, max_items=5), k_of(64, k=3)) == (4, 8, 8, 3)
