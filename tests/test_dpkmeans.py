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
    # OS randomness: a threshold of 1e-3 failed about one suite run in a thousand (p = 0.00085 seen); at n = 9000
    # a Gaussian of the same variance gives p ~ 1e-36 and scale 1.3 b p ~ 1e-20, so 1e-6 still catches them.
    assert stats.kstest(sums, stats.laplace(scale=b).cdf).pvalue > 1e-6
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
    (noisy count, noisy first sum coordinate), one DP k-means iteration (T=1, eps=1), minus sampling error.
    The `draws` repetitions run as one DP k-means call on `draws` copies of the two centroids (each copy's
    statistics are the data's with its own noise draw), so that the audit costs one call, not 30,000."""
    D = np.array([[0.5, 0.0], [0.6, 0.1], [-0.5, 0.2], [-0.4, -0.3]])
    Dp = np.vstack([D, [1.0, 0.0]])  # neighbour: one more point, L1 norm 1, in cluster 0
    C0 = np.array([[0.5, 0.0], [-0.5, 0.0]])
    out = []
    for data in (D, Dp):
        rng = np.random.default_rng(len(data))
        sums, counts = dpkmeans.cluster_stats(data, C0)
        copies = lambda C: (np.tile(sums, (draws, 1)), np.tile(counts, draws))
        eps = 1.0 / scale_factor  # scale_factor > 1 would be too little noise for the claimed eps=1
        tr = _run(copies, np.tile(C0, (draws, 1)), eps, 1, rng)
        out.append(np.column_stack([tr.noisy_counts[0, 0::2], tr.noisy_sums[0, 0::2, 0]]))
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


@pytest.mark.parametrize("name, sensitivity", [("box", 6.0), ("l2_ball", np.sqrt(6.0)), ("l1_ball", 1.0)])
def test_plan_sum_sensitivity_follows_the_domain(name, sensitivity):
    p = dpkmeans.plan(epsilon=0.5, iterations=4, k=3, d=6, domain=name)
    f = dpkmeans.sum_share(name, 6)
    assert p["sums"].sensitivity == pytest.approx(sensitivity)
    assert p["sums"].scale == pytest.approx(4 / (f * 0.5) * sensitivity)
    assert p["counts"].scale == pytest.approx(4 / ((1 - f) * 0.5))
    assert accounting.release_guarantee(p.event(), 1e-6).epsilon == pytest.approx(0.5, rel=1e-12)
    assert {"box": "d", "l2_ball": "sqrt(d)", "l1_ball": "L1 ball"}[name] in p["sums"].argument


def test_plan_needs_the_dimension_for_box_and_l2_and_dp_kmeans_checks_the_domain():
    with pytest.raises(ValueError):
        dpkmeans.plan(epsilon=1.0, iterations=2, domain="box")
    rng = np.random.default_rng(0)
    C0 = dpkmeans.data_independent_centroids(2, 3, rng)[0]
    stats = dpkmeans.array_stats(rng.uniform(-0.3, 0.3, (50, 3)))
    with pytest.raises(ValueError):  # an L1-ball plan (sensitivity 1) on box data would understate the noise
        dpkmeans.dp_kmeans(stats, C0, iterations=2, measure=simulated(dpkmeans.plan(epsilon=1.0, iterations=2), rng),
                           domain="box")


def test_update_projects_onto_the_domain():
    prev = np.zeros((2, 2))
    sums, counts = np.array([[30.0, -5.0], [3.0, 4.0]]), np.array([10.0, 1.0])
    assert np.allclose(dpkmeans.update_centroids(sums, counts, prev, "box"), [[1.0, -0.5], [1.0, 1.0]])
    assert np.allclose(dpkmeans.update_centroids(sums, counts, prev, "l2_ball")[1], [0.6, 0.8])


@pytest.mark.parametrize("name", ["box", "l2_ball"])
def test_initial_centroids_are_packed_inside_every_domain(name):
    C, min_dist = dpkmeans.data_independent_centroids(8, 5, np.random.default_rng(1), domain=name)
    assert np.all(domain.boundary_distance(C, name) >= min_dist / 2 - 1e-12)
    gaps = np.linalg.norm(C[:, None] - C[None], axis=-1)[np.triu_indices(8, 1)]
    assert gaps.min() >= min_dist > 0


def _replayed_worst(name: str, seeding: bool = False):
    """The conformance suite's sensitivity check (tests/conformance.py) on DP k-means itself: D, then D plus a
    far corner of the box projected onto the domain, replaying D's noisy outputs (and, with `seeding`, the
    seeding round's public candidates and k-means restarts)."""
    from tests import conformance as conf

    rng = np.random.default_rng(2)
    X = domain.project(rng.uniform(-0.6, 0.6, (300, 3)), name)
    plan = dpkmeans.plan(epsilon=1.0, iterations=3, k=3, d=3, domain=name, seeding=seeding)
    C0 = dpkmeans.data_independent_centroids(3, 3, np.random.default_rng(3), domain=name)[0]
    base = conf.Recording()

    def run(data, source):
        stats, measure = dpkmeans.array_stats(data), Measure(plan, source)
        start = dpkmeans.oversampled_seeds(stats, 3, 3, np.random.default_rng(4), measure=measure,
                                           domain=name).initial_centroids if seeding else C0
        dpkmeans.dp_kmeans(stats, start, iterations=3 - seeding, measure=measure, domain=name)
    run(X, base)
    worst = conf.Worst()
    for corner in ([5.0, 5.0, 5.0], [-5.0, 5.0, -5.0]):
        neighbour = conf.Recording(replay=base.calls)
        run(np.vstack([X, domain.project(np.array([corner]), name)]), neighbour)
        conf.worst_changes(plan, base.calls, neighbour.calls, worst)
    return conf.sensitivity_violations(worst), worst


@pytest.mark.parametrize("name, seeding", [("box", False), ("l2_ball", False), ("box", True), ("l2_ball", True),
                                           ("l1_ball", True)])
def test_box_and_l2_sensitivities_hold_under_replay(name, seeding):
    violations, worst = _replayed_worst(name, seeding)
    assert violations == []
    # the corner moves the sums by the full claimed sensitivity: the claim is tight, not loose
    assert worst.change["sums"] == pytest.approx(worst.allowed["sums"])


def test_an_understated_box_sensitivity_is_caught_by_replay():
    """Claiming the L1 ball's sensitivity 1 for box data (a third of the true 3) fails the replay check."""
    from tests import conformance as conf

    rng = np.random.default_rng(2)
    X = rng.uniform(-0.6, 0.6, (300, 3))
    true_plan = dpkmeans.plan(epsilon=1.0, iterations=3, k=3, d=3, domain="box")
    understated = true_plan.scaled("sums", 1.0 / 3.0)
    C0 = dpkmeans.data_independent_centroids(3, 3, np.random.default_rng(3), domain="box")[0]
    base = conf.Recording()
    calls = []
    for data, replay in ((X, None), (np.vstack([X, [[1.0, 1.0, 1.0]]]), True)):
        source = conf.Recording(replay=base.calls) if replay else base
        stats = dpkmeans.array_stats(data)
        C = C0
        measure = Measure(understated, source)
        for _ in range(3):  # dp_kmeans refuses a plan that is not its domain's; the same loop by hand
            sums, counts = stats(C)
            noisy_counts, noisy_sums = measure("counts", counts), measure("sums", sums)
            C = dpkmeans.update_centroids(noisy_sums, noisy_counts, C, "box")
        calls.append(source.calls)
    worst = conf.worst_changes(understated, calls[0], calls[1], conf.Worst())
    assert any(v.startswith("sums:") for v in conf.sensitivity_violations(worst))


def test_sum_share_is_even_on_the_l1_ball_and_minimises_the_centroid_error_elsewhere():
    assert dpkmeans.sum_share("l1_ball", 7) == 0.5
    for name, d in (("box", 2), ("box", 6), ("l2_ball", 6)):
        delta = domain.sum_sensitivity(name, d)
        r2 = d / 3 if name == "box" else d / (d + 2)
        error = lambda f: d * delta ** 2 / f ** 2 + r2 / (1 - f) ** 2
        grid = np.linspace(0.01, 0.99, 9801)
        assert dpkmeans.sum_share(name, d) == pytest.approx(grid[np.argmin(error(grid))], abs=1e-3)


def test_seeding_spends_the_first_of_the_T_rounds_on_four_times_K_candidates():
    p = dpkmeans.plan(epsilon=0.8, iterations=5, k=3, d=2, domain="l2_ball", seeding=True)
    assert p["seed_counts"].values == dpkmeans.SEED_MULTIPLE * 3 and p["seed_sums"].values == dpkmeans.SEED_MULTIPLE * 6
    assert p["seed_counts"].repetitions == 1 and p["counts"].repetitions == 4
    for name in ("counts", "sums"):  # every round has the unseeded plan's per-round scales
        assert p["seed_" + name].scale == p[name].scale == dpkmeans.plan(
            epsilon=0.8, iterations=5, k=3, d=2, domain="l2_ball")[name].scale
    assert accounting.release_guarantee(p.event(), 1e-6).epsilon == pytest.approx(0.8, rel=1e-12)
    with pytest.raises(ValueError, match="iterations must be >= 2 with seeding"):
        dpkmeans.plan(epsilon=1.0, iterations=1, k=3, d=2, domain="l2_ball", seeding=True)


def _start_ratio(X, k, seeding: bool, runs: int = 6) -> float:
    """Mean WCSS / k-means++ of DP k-means at a budget where the noise is negligible (T = 3): what is left is
    the local optimum its start leads to."""
    from dpalgos import metrics
    from tasks.experiments.kmeans import run_dpkm

    ref, _ = metrics.kmeans_reference(X, k, seed=0)
    rng = np.random.default_rng(5)
    return float(np.mean([metrics.wcss(X, run_dpkm(dpkmeans.array_stats(X), k, 2, 1e6, 3, "l2_ball", rng,
                                                   seeding).final_centroids) / ref for _ in range(runs)]))


def test_seeding_escapes_the_local_optima_of_data_independent_starts():
    # Nine tight clusters on a 3 x 3 grid with k = 9: Lloyd from a data-independent packing often merges two
    # and splits another; the noisy means of 36 candidates cover every cluster, and weighted k-means finds them.
    rng = np.random.default_rng(0)
    centres = np.array([[x, y] for x in (-0.5, 0.0, 0.5) for y in (-0.5, 0.0, 0.5)])
    X = domain.project(centres[rng.integers(9, size=2000)] + rng.normal(0, 0.03, (2000, 2)), "l2_ball")
    seeded, unseeded = _start_ratio(X, 9, True), _start_ratio(X, 9, False)
    assert seeded < 1.02 < 1.3 < unseeded


@pytest.mark.parametrize("y, beta", [(0.3, 0.01), (0.3, 100.0), (5.0, 0.01), (5.0, 1.0), (-3.0, 0.5), (0.99, 0.2),
                                     (-1.0, 1e-9), (1e6, 1e4)])
def test_box_posterior_mean_is_the_truncated_laplace_mean(y, beta):
    mu = np.linspace(-1.0, 1.0, 400_001)
    log_w = -np.abs(mu - y) / beta
    w = np.exp(log_w - log_w.max())
    expected = (mu * w).sum() / w.sum()
    assert dpkmeans.box_posterior_mean(np.array([y]), beta)[0] == pytest.approx(expected, abs=2e-5)


def test_box_update_shrinks_noisy_centroids_to_the_centre_and_keeps_precise_ones():
    prev = np.zeros((2, 3))
    counts = np.array([100.0, 100.0])
    sums = np.array([[50.0, -30.0, 250.0], [5e5, -5e5, 0.0]])  # a precise mean, and one the noise threw far out
    precise = dpkmeans.update_centroids(sums, counts, prev, "box", sum_scale=1e-3)
    assert np.allclose(precise[0], [0.5, -0.3, 1.0], atol=1e-4)
    noisy = dpkmeans.update_centroids(sums, counts, prev, "box", sum_scale=1e6)  # noise 1e4 per coordinate
    assert np.all(np.abs(noisy) < 0.01)  # projection would put them on the faces (+-1)
    assert np.allclose(dpkmeans.update_centroids(sums, counts, prev, "box")[1], [1.0, -1.0, 0.0])
