"""DP kernel k-means (Acs et al.): random Fourier features, DPNorm, accounting, an empirical DP audit."""

import dp_accounting
import numpy as np
import pytest
import scipy.sparse as sp
from dp_accounting.rdp import RdpAccountant
from scipy import stats

from dpalgos import kernel_kmeans as kk
from dpalgos.noise import simulated
from dpalgos.plan import ADD_REMOVE_USER


def _binary(n, m, p, seed):
    return (np.random.default_rng(seed).random((n, m)) < p).astype(np.float64)


def test_rff_inner_products_approximate_the_rbf_kernel_better_with_more_features():
    X = _binary(60, 50, 0.2, 0)
    gamma = 0.05
    K = np.exp(-gamma * ((X[:, None] - X[None]) ** 2).sum(-1))
    errors = []
    for d in (50, 500, 5000):
        Z = kk.rbf_features(50, d, gamma, np.random.default_rng(d)).transform(X).astype(np.float64)
        errors.append(np.abs(Z @ Z.T - K).mean())
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.02


def test_feature_norms_are_one_in_expectation_and_at_most_sqrt2():
    X = sp.csr_matrix(_binary(2000, 300, 0.05, 1))
    norms = kk.feature_norms(X, kk.rbf_features(300, 200, 0.1, np.random.default_rng(2)))
    assert np.mean(norms ** 2) == pytest.approx(1.0, abs=0.02)
    assert norms.max() <= np.sqrt(2) + 1e-6


def test_sparse_and_dense_records_give_the_same_features():
    X = _binary(100, 40, 0.3, 3)
    rff = kk.rbf_features(40, 64, 0.1, np.random.default_rng(4))
    assert np.allclose(rff.transform(X), rff.transform(sp.csr_matrix(X)), atol=1e-6)


def _dp_norm(hist, c_max, sigma, rng):
    return kk.dp_norm(hist, c_max=c_max, measure=simulated(kk.plan(iterations=1, sigma=sigma, dpnorm=True), rng))


def test_dpnorm_picks_the_crowded_bin_and_its_noise_has_the_stated_scale():
    norms = np.r_[np.full(5000, 0.93), np.random.default_rng(5).uniform(0, 2, 300)]
    hist = kk.norm_histogram(norms, 2.0, 100)
    rng = np.random.default_rng(6)
    assert {_dp_norm(hist, 2.0, 20.0, rng) for _ in range(50)} == {0.94}
    # Two bins 10 apart: the smaller wins when (N1 - N2) > 10 with N_i ~ N(0, sigma^2) (sensitivity 1 under
    # add/remove), i.e. with probability Phi(-10 / (sqrt 2 sigma)).
    two = np.zeros(10)
    two[3], two[6] = 100.0, 90.0
    sigma, draws = 6.0, 6000
    picks = np.array([_dp_norm(two, 1.0, sigma, rng) for _ in range(draws)])
    frac = np.mean(np.isclose(picks, 0.7))
    expected = stats.norm.cdf(-10 / (np.sqrt(2) * sigma))
    assert abs(frac - expected) < 4 * np.sqrt(expected * (1 - expected) / draws)


def test_noise_free_limit_is_lloyd_on_the_features():
    X = sp.csr_matrix(_binary(500, 30, 0.2, 7))
    rff = kk.rbf_features(30, 40, 0.2, np.random.default_rng(8))
    Z = kk.clip_rows(rff.transform(X), 1.0).astype(np.float64)
    init = Z[:3].copy()
    res = kk.dp_lloyd(lambda C: kk.feature_stats(X, rff, 1.0, C), init, iterations=5, clip=1.0,
                      measure=simulated(kk.plan(iterations=5, sigma=1e-12), np.random.default_rng(0)))
    C = init.copy()
    for _ in range(5):
        s, n = kk.grouped_stats(Z, C)
        C[n > 0] = s[n > 0] / n[n > 0, None]
    assert np.allclose(res.centres, C, atol=1e-5)


def test_accounting_matches_dp_accounting_and_exposes_lemma1s_factor_two():
    sigma = 3.0
    acc = RdpAccountant(orders=[2.0, 3.0, 5.0, 9.0, 17.0])
    acc.compose(dp_accounting.GaussianDpEvent(sigma))
    for order, rdp in zip([2, 3, 5, 9, 17], acc._rdp):
        lam = order - 1
        exact_log_moment = lam * rdp  # alpha(lambda) = lambda * RDP(lambda + 1)
        assert exact_log_moment == pytest.approx((lam * lam + lam) / (2 * sigma ** 2))
        # The paper's Lemma 1 states half of it (it understates the privacy loss).
        assert exact_log_moment == pytest.approx(2 * kk.lemma1_log_moment(lam, sigma))
    # The run's event is T iterations of two Gaussian mechanisms (+ DPNorm): dp_accounting on it directly.
    ev = kk.plan(iterations=20, sigma=25.0, dpnorm=True).event()
    direct = RdpAccountant()
    direct.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(25.0), 41))
    ours = RdpAccountant()
    ours.compose(ev)
    assert ours.get_epsilon(1e-5) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_calibration_hits_the_target(eps):
    sigma = kk.calibrate_sigma(epsilon=eps, delta=1e-5, iterations=20)
    acc = RdpAccountant()
    acc.compose(kk.plan(iterations=20, sigma=sigma).event())
    assert acc.get_epsilon(1e-5) == pytest.approx(eps, rel=1e-3)
    acc = RdpAccountant()
    acc.compose(kk.plan(iterations=20, sigma=0.97 * sigma).event())
    assert acc.get_epsilon(1e-5) > eps


def _audit_statistic(sigma_claimed: float, noise_factor: float, draws: int) -> tuple[np.ndarray, np.ndarray]:
    """One real dp_lloyd iteration on D and on D' = D plus one record in cluster b (add/remove neighbours).
    Returns the noisy size n_b on both: the privacy loss of the sizes mechanism depends on the output only
    through it (a Gaussian shift of 1)."""
    sums = np.zeros((2, 3))
    counts_d, counts_dp = np.array([50.0, 40.0]), np.array([50.0, 41.0])
    init = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    out = []
    for counts in (counts_d, counts_dp):
        rng = np.random.default_rng(int(counts[1]))
        # noise_factor < 1 simulates an implementation that draws less noise than it claims
        plan = kk.plan(iterations=1, sigma=sigma_claimed * noise_factor)
        n = np.array([kk.dp_lloyd(lambda C: (sums, counts), init, iterations=1, clip=1.0,
                                  measure=simulated(plan, rng)).noisy_counts[0] for _ in range(draws)])
        out.append(n[:, 1])
    return out[0], out[1]


def _hockey_stick(a: np.ndarray, b: np.ndarray, eps: float) -> float:
    edges = np.linspace(min(a.min(), b.min()), max(a.max(), b.max()), 121)
    p = np.histogram(a, edges)[0] / a.size
    q = np.histogram(b, edges)[0] / b.size
    return float(max(np.maximum(p - np.exp(eps) * q, 0).sum(), np.maximum(q - np.exp(eps) * p, 0).sum()))


def test_empirical_dp_audit_of_one_iteration():
    sigma, eps, draws = 1.0, 1.0, 10_000  # half the noise scores 0.51 against a bound of 0.18
    # Claimed for the sizes: GaussianDpEvent(sigma); its exact delta(eps) (Balle & Wang 2018).
    claimed = (stats.norm.cdf(-eps * sigma + 1 / (2 * sigma))
               - np.exp(eps) * stats.norm.cdf(-eps * sigma - 1 / (2 * sigma)))
    slack = 4 * np.sqrt(2 / draws)
    assert _hockey_stick(*_audit_statistic(sigma, 1.0, draws), eps) <= claimed + slack
    # An implementation drawing half the noise is caught at the same (eps, delta).
    assert _hockey_stick(*_audit_statistic(sigma, 0.5, draws), eps) > claimed + slack


def test_clustering_accuracy_uses_the_best_matching():
    truth = np.array([0, 0, 1, 1, 2, 2])
    assert kk.clustering_accuracy(np.array([2, 2, 0, 0, 1, 1]), truth) == 1.0
    assert kk.clustering_accuracy(np.array([1, 1, 1, 0, 0, 2]), truth) == pytest.approx(4 / 6)


def test_sensitivities_are_those_of_add_remove_neighbours():
    sigma, clip = 3.0, 0.7
    plan = kk.plan(iterations=4, sigma=sigma, dpnorm=True)
    assert {m.relation for m in plan} == {ADD_REMOVE_USER}
    # 1, C_s and 1 (replace-one neighbours would need sqrt 2 times these, and sqrt 2 times the noise).
    assert plan["sizes"].scale == sigma and plan["norms"].scale == sigma
    assert plan["sums"].scale_for(clip) == pytest.approx(sigma * clip)
    # Replay on D and D + one record: one size moves by 1, the sums by at most C_s, and C_s is attained.
    X = sp.csr_matrix(_binary(300, 30, 0.2, 9))
    rff = kk.rbf_features(30, 24, 0.2, np.random.default_rng(10))
    centres = kk.clip_rows(rff.transform(X[:4]), clip).astype(np.float64)
    s0, n0 = kk.feature_stats(X, rff, clip, centres)
    moves = []
    for x in _binary(40, 30, 0.5, 11):
        s1, n1 = kk.feature_stats(sp.vstack([X, sp.csr_matrix(x)]).tocsr(), rff, clip, centres)
        assert np.linalg.norm(n1 - n0) == 1.0
        moves.append(np.linalg.norm(s1 - s0))
    assert max(moves) <= clip and max(moves) == pytest.approx(clip, rel=1e-5)


@pytest.mark.parametrize("sizes, share, nonempty, degenerate", [
    ([910, 50, 40], 0.91, 3, True),        # one cluster above the threshold
    ([900, 60, 40], 0.90, 3, False),       # at the threshold: not above it
    ([0, 120, 0, 0], 1.0, 1, True),        # a single non-empty cluster
    ([400, 350, 250], 0.4, 3, False),
    ([500], 1.0, 1, False),                # k = 1: one cluster is what was asked for
])
def test_degeneracy_check(sizes, share, nonempty, degenerate):
    check = kk.degeneracy(np.array(sizes))
    assert check == {"largest_cluster_share": pytest.approx(share), "nonempty_clusters": nonempty,
                     "degenerate": degenerate}


def _two_groups_of_features():
    rng = np.random.default_rng(12)
    Z = np.vstack([rng.normal(0.4, 0.05, (300, 8)), rng.normal(-0.4, 0.05, (300, 8))])
    return kk.clip_rows(Z, 1.0)


def test_a_degenerate_clustering_is_a_failure_not_a_reassuring_ratio():
    from tasks.kinds.kernel_kmeans import clustering_evaluation, feature_wcss_ratio

    Z = _two_groups_of_features()
    collapsed = np.vstack([Z.mean(axis=0), np.full((2, 8), 5.0)])  # one centre takes every record
    exact = np.bincount(kk.nearest(Z, collapsed), minlength=3)
    assert feature_wcss_ratio(Z, collapsed, 5) < 1.01  # what the ratio alone would have said
    report = clustering_evaluation(exact, exact + 3.0, Z, collapsed, 5)
    assert report["degenerate"] is True and report["nonempty_clusters"] == 1
    assert report["feature_wcss_ratio_to_noise_free_lloyd"] is None
    assert report["headline"].startswith("FAILED: degenerate clustering")
    good = np.vstack([Z[:300].mean(axis=0), Z[300:].mean(axis=0)])
    exact = np.bincount(kk.nearest(Z, good), minlength=2)
    report = clustering_evaluation(exact, exact, Z, good, 5)
    assert report["degenerate"] is False and report["largest_cluster_share"] == 0.5
    assert report["feature_wcss_ratio_to_noise_free_lloyd"] == pytest.approx(1.0, abs=1e-6)



def test_noise_that_cannot_reach_the_asked_epsilon_is_refused_not_returned():
    """An audit got sigma = 1e9 for epsilon 0.001 and 0.01 alike (charged about 0): below RDP's floor the
    calibration is refused as a parameter error; above it the noise certifies the epsilon asked."""
    from dpalgos.accounting import CalibrationError

    with pytest.raises(CalibrationError, match="cannot be calibrated to epsilon=0.001"):
        kk.calibrate_sigma(epsilon=0.001, delta=1e-9, iterations=5)
    sigma = kk.calibrate_sigma(epsilon=0.05, delta=1e-9, iterations=5)
    accountant = RdpAccountant()
    accountant.compose(kk.plan(iterations=5, sigma=sigma).event())
    assert 0.025 <= accountant.get_epsilon(1e-9) <= 0.05 * (1 + 1e-6)


def test_a_centre_that_is_mostly_noise_is_reseeded_beside_the_largest_cluster():
    """`reseeded` (DPGM's clustering): a centre whose noise norm sigma C sqrt(d) / n~ is above RESEED_NOISE C moves
    to the largest cluster's centre plus RESEED_STEP C in a random direction; two such centres go to the two
    largest clusters (the donor's size halved); reliable centres stay; with none reliable nothing moves. A function
    of the noisy sizes, the centres and public randomness only."""
    d, clip, noise_sd = 50, 1.0, 10.0
    C = np.random.default_rng(0).normal(size=(4, d))
    limit = noise_sd * np.sqrt(d) / (kk.RESEED_NOISE * clip)    # the noisy size below which a centre is noise
    n_hat = np.array([0.5 * limit, 40 * limit, 2 * limit, 30 * limit])
    out = kk.reseeded(C, n_hat, noise_sd, clip, np.random.default_rng(1))
    assert np.array_equal(out[1:], C[1:])
    assert np.isclose(np.linalg.norm(out[0] - C[1]), kk.RESEED_STEP * clip)
    n_two = np.array([0.5 * limit, 40 * limit, -3.0, 30 * limit])
    two = kk.reseeded(C, n_two, noise_sd, clip, np.random.default_rng(1))
    donors = sorted(int(np.argmin(np.linalg.norm(C - two[j], axis=1))) for j in (0, 2))
    assert donors == [1, 3]
    assert np.array_equal(kk.reseeded(C, np.full(4, 0.5 * limit), noise_sd, clip, np.random.default_rng(1)), C)


def test_reseeding_keeps_every_cluster_alive_under_heavy_noise():
    """Two well separated groups of records and four centres, two of them started far from every record: with
    heavy noise on the sums, plain noisy Lloyd leaves those clusters empty; with reseeding every cluster ends
    with records (the largest groups are split)."""
    rng = np.random.default_rng(3)
    X = np.zeros((4000, 40))
    X[:2000, :20] = rng.random((2000, 20)) < 0.3
    X[2000:, 20:] = rng.random((2000, 20)) < 0.3
    X = sp.csr_matrix(X)
    rff = kk.rbf_features(40, 30, 0.05, np.random.default_rng(4))
    Z = kk.clip_rows(rff.transform(X), 1.0).astype(np.float64)
    init = np.vstack([Z[0], Z[-1], -Z[0], -Z[-1]])
    plan = kk.plan(iterations=4, sigma=20.0)
    alive = []
    for reseed in (None, np.random.default_rng(5)):
        res = kk.dp_lloyd(lambda C: kk.feature_stats(X, rff, 1.0, C), init, iterations=4, clip=1.0,
                          measure=simulated(plan, np.random.default_rng(6)), reseed=reseed)
        alive.append(np.count_nonzero(np.bincount(kk.nearest(Z, res.centres), minlength=4) > 100))
    assert alive[0] < 4 and alive[1] == 4
