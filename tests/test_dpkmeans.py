import numpy as np
import pytest
from scipy import stats

from dpalgos import accounting, domain, dpkmeans
from dpalgos.noise import ExactNoise, Measure, simulated
from tests.conftest import blobs


def _run(stats, C0, eps, T, rng, noise=None):
    plan = dpkmeans.plan(epsilon=eps, iterations=T)
    measure = Measure(plan, noise) if noise is not None else simulated(plan, rng)
    return dpkmeans.dp_kmeans(stats, C0, iterations=T, measure=measure)


def _points(n=3000, seed=0):
    X = blobs(n, seed)
    return domain.to_unit_l1_ball(X, [0, 0], [100, 100])[0]


def test_noise_scale_is_2T_over_epsilon():
    K, d, T, eps = 3, 2, 5, 0.5
    true_counts = np.array([100.0, 200.0, 300.0])
    true_sums = np.arange(K * d, dtype=float).reshape(K, d)
    rng = np.random.default_rng(0)
    C0 = dpkmeans.data_independent_centroids(K, d, rng)[0]
    count_noise, sum_noise = [], []
    noise = ExactNoise()  # the production sampler
    for _ in range(300):
        tr = _run(lambda C: (true_sums, true_counts), C0, eps, T, rng, noise)
        count_noise.append(tr.noisy_counts - true_counts)
        sum_noise.append(tr.noisy_sums - true_sums)
    b = 2 * T / eps
    assert tr.noise_scale == b
    counts = np.ravel(count_noise)
    assert np.array_equal(counts, np.rint(counts))  # discrete Laplace on the integers
    # Discrete Laplace of scale b: P(k) proportional to exp(-|k|/b); its mean |k| is 2 e^(-1/b) / (1 - e^(-2/b)).
    assert np.mean(np.abs(counts)) == pytest.approx(2 * np.exp(-1 / b) / (1 - np.exp(-2 / b)), rel=0.05)
    sums = np.ravel(sum_noise)
    assert stats.kstest(sums, stats.laplace(scale=b).cdf).pvalue > 1e-3
    assert np.mean(np.abs(sums)) == pytest.approx(b, rel=0.05)  # E|Lap(b)| = b


def _lloyd(X, C, T):
    for _ in range(T):
        sums, counts = dpkmeans.cluster_stats(X, C)
        C = np.where(counts[:, None] >= 1, sums / np.maximum(counts, 1)[:, None], C)
    return C


def test_with_infinite_budget_it_is_lloyd():
    X = _points()
    rng = np.random.default_rng(1)
    C0, _ = dpkmeans.data_independent_centroids(3, 2, rng)
    tr = _run(dpkmeans.array_stats(X), C0, 1e13, 6, rng)
    assert np.allclose(tr.final_centroids, _lloyd(X, C0, 6), atol=1e-9)
    # every intermediate iterate too
    for t in range(6):
        assert np.allclose(tr.centroids[t], _lloyd(X, C0, t + 1), atol=1e-9)


def test_stats_have_sensitivity_one_on_the_unit_l1_ball():
    rng = np.random.default_rng(2)
    X = _points(500)
    C = dpkmeans.data_independent_centroids(4, 2, rng)[0]
    s0, n0 = dpkmeans.cluster_stats(X, C)
    for x in domain.project_l1_ball(rng.normal(0, 2, size=(200, 2))):
        s1, n1 = dpkmeans.cluster_stats(np.vstack([X, x]), C)
        assert np.abs(n1 - n0).sum() == 1.0
        assert np.abs(s1 - s0).sum() <= 1.0 + 1e-12


def _audit(scale_factor: float, draws: int = 30_000) -> float:
    """Largest observed |log p(o|D)/p(o|D')| over well-populated bins of the affected cluster's
    (noisy count, noisy first sum coordinate), one DP k-means iteration (T=1, eps=1), minus sampling error."""
    D = np.array([[0.5, 0.0], [0.6, 0.1], [-0.5, 0.2], [-0.4, -0.3]])
    Dp = np.vstack([D, [1.0, 0.0]])  # neighbour: one more point, L1 norm 1, in cluster 0
    C0 = np.array([[0.5, 0.0], [-0.5, 0.0]])
    out = []
    for data in (D, Dp):
        rng = np.random.default_rng(len(data))
        st = dpkmeans.array_stats(data)
        eps = 1.0 / scale_factor  # scale_factor > 1 would be too little noise for the claimed eps=1
        samples = np.array([(lambda tr: (tr.noisy_counts[0, 0], tr.noisy_sums[0, 0, 0]))(
            _run(st, C0, eps, 1, rng)) for _ in range(draws)])
        out.append(samples)
    edges = [np.arange(-8, 12, 2.0), np.arange(-8, 12, 2.0)]
    h0 = np.histogram2d(*out[0].T, bins=edges)[0]
    h1 = np.histogram2d(*out[1].T, bins=edges)[0]
    ok = (h0 >= 300) & (h1 >= 300)
    lr = np.abs(np.log(h0[ok] / h1[ok])) - 4 * np.sqrt(1 / h0[ok] + 1 / h1[ok])
    return float(lr.max())


def test_empirical_dp_of_one_iteration_on_neighbouring_datasets():
    # Claimed: eps = 1 per iteration (eps/2 for counts, eps/2 for sums, sensitivity 1 each).
    assert _audit(scale_factor=1.0) <= 1.0
    # The same audit catches a mechanism with half the noise it needs (true loss 2).
    assert _audit(scale_factor=0.5) > 1.0


def test_small_noisy_counts_keep_the_previous_centroid_and_others_stay_in_the_ball():
    prev = np.array([[0.1, 0.1], [0.2, -0.2], [-0.3, 0.0]])
    sums = np.array([[5.0, 5.0], [1.0, 1.0], [-1.0, 0.0]])
    counts = np.array([2.0, 0.5, -3.0])
    C = dpkmeans.update_centroids(sums, counts, prev)
    assert np.allclose(C[1:], prev[1:])
    assert np.allclose(C[0], [0.5, 0.5])  # (2.5, 2.5) projected onto the ball


@pytest.mark.parametrize("k, d", [(15, 2), (5, 6), (10, 50)])
def test_initial_centroids_are_packed_inside_the_ball(k, d):
    C, min_dist = dpkmeans.data_independent_centroids(k, d, np.random.default_rng(k))
    assert C.shape == (k, d)
    assert np.all(np.abs(C).sum(axis=1) <= 1)
    gaps = np.linalg.norm(C[:, None] - C[None], axis=-1)[np.triu_indices(k, 1)]
    assert gaps.min() >= min_dist > 0


def test_explicit_min_distance_is_honoured_or_refused():
    C, md = dpkmeans.data_independent_centroids(4, 2, np.random.default_rng(0), min_distance=0.3)
    assert md == pytest.approx(0.3)
    with pytest.raises(ValueError):
        dpkmeans.data_independent_centroids(50, 2, np.random.default_rng(0), min_distance=1.5)


def test_plan_composes_to_epsilon():
    ev = dpkmeans.plan(epsilon=0.7, iterations=5).event()
    assert accounting.release_guarantee(ev, 1e-6).epsilon == pytest.approx(0.7, rel=1e-12)


def test_bad_parameters_are_refused():
    for kwargs in ({"epsilon": 0.0, "iterations": 5}, {"epsilon": -1, "iterations": 5},
                   {"epsilon": 1.0, "iterations": 0}, {"epsilon": float("inf"), "iterations": 5}):
        with pytest.raises(ValueError):
            dpkmeans.plan(**kwargs)
