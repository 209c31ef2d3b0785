"""The 1-D histogram benchmark peers (tests/benchmarks/_histogram_peers.py) on small cases whose answer is known:
unbiasedness of the linear estimators, OpenDP's consistency postprocessor against least squares, HDMM's objective
and gradient and its strategy against the identity and the binary tree, GreedyH's algebra against dense
matrices, DAWA's partition on piecewise-constant data, and DAWA's stage-1 privacy: the deviation's sensitivity
exhaustively, the reference implementation's noise scale shown not epsilon-DP (in closed form and by running
it), the scale used here measured within e^eps1 on neighbouring inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import optimize

from tests.benchmarks import _histogram_peers as P


@pytest.fixture(autouse=True)
def bench_cache(tmp_path, monkeypatch):
    """HDMM strategies go to a cache folder of the test's own (never the operator's)."""
    monkeypatch.setenv("DPRELEASE_BENCH_CACHE", str(tmp_path / "bench-cache"))


def _assert_unbiased(samples: np.ndarray, truth: np.ndarray, z: float = 4.5):
    """Mean error per bin within z standard errors of 0 (samples: runs x bins)."""
    err = samples - truth
    se = err.std(axis=0, ddof=1) / np.sqrt(err.shape[0])
    assert np.all(np.abs(err.mean(axis=0)) <= z * se + 1e-12), (err.mean(axis=0), se)


H10 = np.array([3, 0, 5, 2, 7, 1, 0, 4, 9, 2])


# ---------------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("name", list(P.PEERS))
def test_every_peer_returns_one_float_per_bin_for_any_length(name):
    h = np.arange(37) % 5
    est = P.PEERS[name](h, 1.0, np.random.default_rng(0))
    assert est.shape == (37,) and est.dtype == np.float64 and np.all(np.isfinite(est))


def test_counts_are_refused_unless_non_negative_integers():
    for bad in ([1, -1], [0.5, 1], [[1, 2]], []):
        with pytest.raises(ValueError):
            P._counts(np.array(bad))


# ---------------------------------------------------------------------------------------------------- OpenDP peers


def test_identity_laplace_is_unbiased_with_the_laplace_variance():
    # One call on the histogram tiled 400 times: the noise of every coordinate is independent, as over 400 runs.
    reps, eps = 400, 1.0
    est = P.identity_laplace(np.tile(H10, reps), eps).reshape(reps, H10.size)
    _assert_unbiased(est, H10)
    # discrete Laplace of scale 1/eps: variance 2 e^-eps / (1 - e^-eps)^2 = 1.84 at eps = 1 (continuous: 2)
    var = 2 * np.exp(-eps) / (1 - np.exp(-eps)) ** 2
    assert abs((est - H10).var() / var - 1) < 0.1


def test_opendp_tree_is_unbiased():
    rng = np.random.default_rng(1)
    h = rng.integers(0, 20, 11)
    est = np.array([P.opendp_tree(h, 1.0) for _ in range(300)])
    _assert_unbiased(est, h)


def _opendp_tree_matrix(n: int, b: int, layers: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenDP's breadth-first layout of the complete b-ary tree over n leaves (leaves past n dropped): each
    node's row over the n leaves, and whether it covers any real leaf (nodes over padding only are known 0)."""
    rows = []
    for layer in range(layers):
        width = b ** (layers - 1 - layer)
        count = b ** layer if layer < layers - 1 else n
        for i in range(count):
            r = np.zeros(n)
            r[i * width:min((i + 1) * width, n)] = 1.0
            rows.append(r)
    A = np.array(rows)
    return A, A.sum(axis=1) > 0


@pytest.mark.parametrize("n,b", [(9, 3), (10, 3), (16, 2), (13, 4)])
def test_opendp_consistent_tree_is_least_squares_and_consistent(n, b):
    parts = P.opendp_tree_parts(n, 1.0, branching=b)
    h = np.random.default_rng(n).integers(0, 30, n)
    noisy = np.array(parts.measurement(h.tolist()), dtype=np.float64)
    A, real = _opendp_tree_matrix(n, b, parts.layers)
    assert A.shape[0] == noisy.size
    dp = P._opendp()
    tree = dp.t.make_b_ary_tree(dp.vector_domain(dp.atom_domain(T=int), size=n), dp.l1_distance(T=int),
                                leaf_count=n, branching_factor=b)
    assert np.array_equal(A @ h, tree(h.tolist()))            # the layout A is OpenDP's
    leaves = np.array(parts.consistent(noisy.astype(int).tolist()))
    # the least squares fit of the noisy tree (equal variances; nodes over padding only are known zeros)
    ls = np.linalg.lstsq(A[real], noisy[real], rcond=None)[0]
    assert np.allclose(leaves, ls, atol=1e-8)
    # consistency: the leaves' sums are the tree the fit implies, the root is their total
    assert np.isclose((A @ leaves)[0], leaves.sum())
    # a tree that is already consistent comes back unchanged
    assert np.allclose(parts.consistent((A @ h).astype(int).tolist()), h)


def test_opendp_tree_noise_is_layers_over_epsilon():
    parts = P.opendp_tree_parts(4096, 0.5)
    assert parts.branching == 23 and parts.layers == 4        # choose_branching_factor(4096); 23^3 >= 4096
    assert parts.measurement.map(1) == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------------- HDMM


def test_range_gram_apply_matches_the_dense_gram_of_all_ranges():
    n = 13
    W = np.array([np.r_[np.zeros(lo), np.ones(hi - lo), np.zeros(n - hi)]
                  for lo in range(n) for hi in range(lo + 1, n + 1)])
    assert np.allclose(W.T @ W, P.range_gram(n))
    V = np.random.default_rng(0).normal(size=(n, 3))
    assert np.allclose(P.range_gram_apply(V), W.T @ W @ V)
    assert np.allclose(P.range_gram_diag(n), np.diag(W.T @ W))


def test_pidentity_loss_and_gradient():
    n, p = 20, 3
    theta = np.random.default_rng(1).random(p * n)
    f = lambda t: P.pidentity_loss_and_grad(t, p, n, P.range_gram_apply, P.range_gram_diag(n))
    A = P.pidentity_matrix(theta.reshape(p, n))
    assert np.allclose(np.abs(A).sum(axis=0), 1.0)             # every column of A has L1 norm 1
    assert f(theta)[0] == pytest.approx(np.trace(P.range_gram(n) @ np.linalg.inv(A.T @ A)), rel=1e-10)
    grad = f(theta)[1]
    assert optimize.check_grad(lambda t: f(t)[0], lambda t: f(t)[1], theta) < 1e-5 * np.linalg.norm(grad)


def _expected_error(A: np.ndarray, WtW: np.ndarray) -> float:
    """||A||_1^2 trace(W^T W (A^T A)^-1): total squared error over the workload, per 2/eps^2."""
    return np.abs(A).sum(axis=0).max() ** 2 * np.trace(WtW @ np.linalg.inv(A.T @ A))


def _binary_tree(n: int) -> np.ndarray:
    rows, width = [], n
    while width >= 1:
        rows += [np.r_[np.zeros(i), np.ones(width), np.zeros(n - i - width)] for i in range(0, n, width)]
        width //= 2
    return np.array(rows)


def test_hdmm_strategy_beats_identity_and_binary_tree_on_all_ranges():
    n = 64
    s = P.hdmm_strategy(n)                                    # p = 4, optimised into the test's cache folder
    assert s.B.shape == (4, n) and not s.cached and np.all(s.B >= 0)
    WtW = P.range_gram(n)
    err = _expected_error(P.pidentity_matrix(s.B), WtW)
    assert err == pytest.approx(s.loss, rel=1e-8)
    identity, tree = np.trace(WtW), _expected_error(_binary_tree(n), WtW)
    assert err < 0.8 * identity and err < 0.4 * tree, (err, identity, tree)
    again = P.hdmm_strategy(n)                                # read back from the cache
    assert again.cached and np.array_equal(again.B, s.B) and again.loss == s.loss


def test_hdmm_for_unit_queries_is_the_identity():
    n, p = 24, 2
    s = P.optimise_pidentity(n, p, seed=0, gram_apply=lambda V: V, gram_diag=np.ones(n))
    # trace((A^T A)^-1) >= n for any A with unit column norms, reached by the identity
    assert n - 1e-9 <= s.loss <= n * 1.001
    assert s.B.max() < 0.05


def test_hdmm_estimate_is_unbiased_least_squares():
    n, p = 16, 2
    B = np.random.default_rng(2).random((p, n))
    h = np.random.default_rng(3).integers(0, 10, n)
    rng = np.random.default_rng(4)
    est = np.array([P.hdmm_estimate(B, h, 1.0, rng) for _ in range(3000)])
    _assert_unbiased(est, h)
    # least squares: with no noise the estimate is exact, and it is the lstsq fit of A x_hat to the measurements
    A = P.pidentity_matrix(B)
    y = A @ h + np.random.default_rng(5).normal(size=A.shape[0])
    s = 1 + B.sum(axis=0)
    v = y[:n] + B.T @ y[n:]
    x_ls = np.linalg.lstsq(A, y, rcond=None)[0]
    assert np.allclose(s * (v - B.T @ np.linalg.solve(np.eye(p) + B @ B.T, B @ v)), x_ls)


# ---------------------------------------------------------------------------------------------------- DAWA stage 2


def _bucket_matrix(bounds, n):
    Pm = np.zeros((n, len(bounds) - 1))
    for c in range(len(bounds) - 1):
        Pm[bounds[c]:bounds[c + 1], c] = 1.0 / (bounds[c + 1] - bounds[c])
    return Pm


BOUNDS = np.array([0, 1, 4, 5, 9, 10, 11, 17, 20, 23, 24, 30, 31, 40])


def test_bucket_range_gram_is_the_reformed_workload():
    n = BOUNDS[-1]
    Pm = _bucket_matrix(BOUNDS, n)
    M = Pm.T @ P.range_gram(n) @ Pm
    U, V, D = P.bucket_range_gram(BOUNDS, n)
    upper = np.triu(np.outer(U, V), 1)
    assert np.allclose(M, np.diag(D) + upper + upper.T)
    u = np.random.default_rng(0).normal(size=5)
    U2c, V2c = (np.concatenate([[0.0], np.cumsum(a * a)]) for a in (U, V))
    assert P._quad(U, V, D, 3, u) == pytest.approx(u @ M[3:8, 3:8] @ u)
    assert P._col_sq(U, V, D, 3, u, U2c, V2c) == pytest.approx(np.sum((M[:, 3:8] @ u) ** 2))


@pytest.mark.parametrize("objective", ["reference", "workload"])
def test_greedy_h_strategy_error_sensitivity_and_least_squares(objective):
    m = BOUNDS.size - 1
    U, V, D = P.bucket_range_gram(BOUNDS, BOUNDS[-1])
    st = P.greedy_h(U, V, D, objective=objective)
    A = np.array([np.r_[np.zeros(a), np.full(b - a, w), np.zeros(m - b)] for a, b, w in zip(st.lo, st.hi, st.w)])
    assert np.allclose(A.sum(axis=0), 1.0)                  # weights along every root-to-leaf path sum to 1
    A = A[st.w > 0]
    M = np.diag(D) + np.triu(np.outer(U, V), 1) + np.triu(np.outer(U, V), 1).T
    assert st.error == pytest.approx(np.trace(M @ np.linalg.inv(A.T @ A)), rel=1e-9)
    z = np.where(st.w > 0, st.w * 10 + np.random.default_rng(1).normal(size=st.w.size), 0.0)
    assert np.allclose(P.tree_least_squares(st, z), np.linalg.lstsq(A, z[st.w > 0], rcond=None)[0])


def test_greedy_h_reference_objective_beats_identity_more_than_the_local_one():
    # all ranges over 256 singleton buckets: the reference's damped objective gives the better strategy
    n = 256
    U, V, D = P.bucket_range_gram(np.arange(n + 1), n)
    ref, local = (P.greedy_h(U, V, D, objective=o).error / D.sum() for o in ("reference", "workload"))
    assert ref == pytest.approx(0.5496, abs=2e-3) and local == pytest.approx(0.7972, abs=2e-3)


# ---------------------------------------------------------------------------------------------------- DAWA stage 1


def _dev(x):
    return np.abs(x - x.mean()).sum()


def test_bucket_deviation_sensitivity_exhaustively():
    """|dev(x + e_j) - dev(x)| <= 2 (1 - 1/|B|) over every x in {0..3}^k, k <= 5, and every j; attained."""
    for k in range(1, 6):
        worst = 0.0
        for x in itertools.product(range(4), repeat=k):
            x = np.array(x, dtype=float)
            for j in range(k):
                y = x.copy()
                y[j] += 1
                worst = max(worst, abs(_dev(y) - _dev(x)))
        assert worst == pytest.approx(2 * (1 - 1 / k))


def test_reference_stage1_scale_is_not_eps1_dp_in_closed_form():
    """n = 3, x = (0, 0, 0), x' = (0, 1, 0), reference noise: the all-singleton partition (cost 3/eps2, no
    noise) wins iff the noisy costs of [0,1], [1,2] exceed 2/eps2 and that of [0,2] exceeds 3/eps2 (no clamp
    binds there), three independent Laplace tails."""
    eps1, eps2, n = 1.0, 1.0, 3
    S = 1 / eps2
    b2, b3 = (P.dawa_partition_scale(k, n, eps1, reference=True) for k in (2, 3))
    tail = lambda t, b: 0.5 * np.exp(-t / b)                  # P(Lap(b) >= t), t >= 0
    p = tail(S, b2) ** 2 * tail(2 * S, b3)                    # devs (0, 0, 0)
    p_neighbour = tail(S - 1, b2) ** 2 * tail(2 * S - 4 / 3, b3)   # devs (1, 1, 4/3)
    assert np.log(p_neighbour / p) == pytest.approx(eps1 * (2 / (7 / 6) + 1), rel=1e-12)   # 2.71 eps1 > eps1


def _partition_frequencies(x, eps1, eps2, reference, reps, seed):
    """Frequencies of the 2^(n-1) partitions (cut sets as bit masks) over reps runs of the stage-1 code."""
    x = np.asarray(x, dtype=np.float64)
    P._numba_seed(seed)
    out = np.zeros(2 ** (x.size - 1))
    for _ in range(reps):
        cut = P._l1_partition(x, eps1, eps2, reference)
        code, e = 0, x.size
        while e > 0:
            s = int(cut[e])
            if s > 0:
                code |= 1 << (s - 1)
            e = s
        out[code] += 1
    return out / reps


def _max_violation(f, g, eps1, reps):
    """Largest amount by which f > e^eps1 g (either way round) exceeds 5 standard errors, over the outcomes."""
    se = lambda q: np.sqrt(q * (1 - q) / reps + 1 / reps ** 2)
    worst = -np.inf
    for a, b in ((f, g), (g, f)):
        slack = a - np.exp(eps1) * b - 5 * np.sqrt(se(a) ** 2 + np.exp(2 * eps1) * se(b) ** 2)
        worst = max(worst, slack.max())
    return worst


def test_reference_stage1_scale_violates_eps1_when_run():
    reps, eps1 = 30000, 1.0
    f = _partition_frequencies([0, 0, 0], eps1, 1.0, True, reps, 1)
    g = _partition_frequencies([0, 1, 0], eps1, 1.0, True, reps, 2)
    assert _max_violation(f, g, eps1, reps) > 0.02
    assert g[3] / f[3] > 10                                     # all singletons: e^2.71 = 15, far above e^1


NEIGHBOURS = [((0, 0, 0), 1), ((1, 1, 1), 0), ((2, 0, 2), 1), ((0, 3, 0), 1)]


@pytest.mark.parametrize("x,j", NEIGHBOURS)
def test_stage1_scale_here_stays_within_eps1_on_neighbours(x, j):
    reps, eps1 = 30000, 1.0
    y = list(x)
    y[j] += 1
    f = _partition_frequencies(x, eps1, 1.0, False, reps, 3)
    g = _partition_frequencies(y, eps1, 1.0, False, reps, 4)
    assert _max_violation(f, g, eps1, reps) <= 0


@pytest.mark.slow
def test_stage1_scale_here_stays_within_eps1_exhaustively():
    """Every x in {0, 1, 2}^3 and every neighbour x + e_j, at eps1 = 1 and at eps1 = 2 (~10 s)."""
    reps = 20000
    for eps1 in (1.0, 2.0):
        freq = {x: _partition_frequencies(x, eps1, 1.0, False, reps, 7)
                for x in itertools.product(range(4), repeat=3) if sum(v == 3 for v in x) <= 1}
        for x in itertools.product(range(3), repeat=3):
            for j in range(3):
                y = list(x)
                y[j] += 1
                assert _max_violation(freq[x], freq[tuple(y)], eps1, reps) <= 0, (x, j, eps1)


def test_dawa_partition_recovers_pieces_at_huge_epsilon():
    pieces = [(0, 7, 5), (7, 8, 0), (8, 20, 12), (20, 33, 0), (33, 40, 3)]
    h = np.concatenate([np.full(b - a, v) for a, b, v in pieces])
    rng = np.random.default_rng(0)
    bounds = P.dawa_partition(h, 0.25e6, 0.75e6, rng)
    # no bucket straddles a change of value, and every change is a cut; a constant piece may still be split
    # (the stage-1 noise is 12 times the per-bucket cost 1/eps2 whatever epsilon: a split is nearly free)
    assert {a for a, _, _ in pieces} <= set(bounds[:-1].tolist())
    for a, b in zip(bounds[:-1], bounds[1:]):
        assert np.all(h[a:b] == h[a])
    est = P.dawa(h, 1e6, rng)
    assert np.allclose(est, h, atol=1e-3)
