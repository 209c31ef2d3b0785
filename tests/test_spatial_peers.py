"""The 2-D grid benchmark peers (tests/benchmarks/_spatial_peers.py) on cases whose answer is known: unbiasedness
where each peer's estimate is linear in unbiased noise, the identity's per-cell variance, HDMM's Kronecker solve
against the dense least squares and its sensitivity, the HTree and AG inference against dense weighted least
squares, consistency of the tree, exactness at a huge epsilon, the rectangle workload against brute force, and the
corpus's promised shapes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmarks import _spatial_peers as P


def _assert_unbiased(samples: np.ndarray, truth: np.ndarray, z: float = 4.5):
    """Mean error per cell within z standard errors of 0 (samples: runs x cells...)."""
    err = samples - truth
    se = err.std(axis=0, ddof=1) / np.sqrt(err.shape[0])
    assert np.all(np.abs(err.mean(axis=0)) <= z * se + 1e-9), np.abs(err.mean(axis=0)).max()


def _dense_wls(A: np.ndarray, y: np.ndarray, var: np.ndarray) -> np.ndarray:
    W = np.diag(1.0 / var)
    return np.linalg.solve(A.T @ W @ A, A.T @ W @ y)


G16 = np.random.default_rng(7).poisson(4.0, (16, 16)).astype(float)


# ---------------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("name", list(P.PEERS))
@pytest.mark.parametrize("shape", [(32, 32), (32, 16)])
def test_every_peer_returns_one_float_per_cell(name, shape):
    g = np.random.default_rng(1).poisson(2.0, shape).astype(float)
    est = P.PEERS[name](g, 1.0, np.random.default_rng(0))
    assert est.shape == shape and est.dtype == np.float64 and np.all(np.isfinite(est))


@pytest.mark.parametrize("bad", [np.ones(5), -np.ones((3, 3)), np.full((2, 2), np.nan), np.ones((0, 3))])
def test_grids_are_refused_unless_non_negative_2d(bad):
    with pytest.raises(ValueError):
        P.identity(bad, 1.0, np.random.default_rng(0))


@pytest.mark.parametrize("name", list(P.PEERS))
def test_every_peer_is_exact_at_a_huge_epsilon(name):
    # UG's and AG's grids reach the fine resolution once N epsilon is huge; the others are linear and unbiased.
    est = P.PEERS[name](G16, 1e12, np.random.default_rng(0))
    np.testing.assert_allclose(est, G16, atol=1e-6)


@pytest.mark.parametrize("name", ["identity", "quadtree", "HDMM"])
def test_data_independent_peers_are_unbiased_on_any_grid(name):
    rng = np.random.default_rng(3)
    _assert_unbiased(np.stack([P.PEERS[name](G16, 0.5, rng) for _ in range(300)]), G16)


@pytest.mark.parametrize("name", ["UG", "AG"])
def test_grids_are_unbiased_where_the_data_are_uniform(name):
    # Their only bias is the non-uniformity inside a cell: on a constant grid spreading is exact, and the rest is
    # linear in zero-mean noise whatever the (noisy) partition.
    g = np.full((32, 32), 40.0)
    rng = np.random.default_rng(4)
    _assert_unbiased(np.stack([P.PEERS[name](g, 0.3, rng) for _ in range(300)]), g)


# ---------------------------------------------------------------------------------------------------- identity


def test_identity_mse_is_the_laplace_variance_per_cell():
    g = np.zeros((64, 64))
    rng = np.random.default_rng(5)
    for eps in (0.1, 1.0):
        mse = np.mean([P.unit_mse(P.identity(g, eps, rng), g) for _ in range(50)])
        assert mse == pytest.approx(2.0 / eps ** 2, rel=0.03)


# ---------------------------------------------------------------------------------------------------- HDMM


def _dense(strategy) -> np.ndarray:
    return np.stack([strategy.answers(e) for e in np.eye(strategy.n)], axis=1)


def test_hdmm_kronecker_strategy_has_sensitivity_one_and_factored_least_squares():
    ax, ay = P._kron_strategy((32, 16))
    A = np.kron(_dense(ax), _dense(ay))
    assert np.abs(A).sum(axis=0).max() == pytest.approx(1.0)
    X = np.random.default_rng(2).poisson(3.0, (32, 16)).astype(float)
    Y = P.kron_answers(ax, ay, X)
    np.testing.assert_allclose(Y.ravel(), A @ X.ravel(), atol=1e-10)
    noisy = Y + np.random.default_rng(3).laplace(0.0, 1.0, Y.shape)
    dense = np.linalg.lstsq(A, noisy.ravel(), rcond=None)[0]
    np.testing.assert_allclose(P.kron_least_squares(ax, ay, noisy).ravel(), dense, atol=1e-8)


def test_hdmm_rectangle_error_is_its_strategy_s_and_beats_identity_at_256():
    g = np.zeros((32, 32))
    rects = P.rectangles(g.shape, 500, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    measured = np.mean([np.mean(P.rect_answers(P.hdmm_kron(g, 1.0, rng), rects) ** 2) for _ in range(200)])
    assert measured == pytest.approx(P.hdmm_expected_rect_mse(g.shape, rects, 1.0), rel=0.1)
    # at 256 x 256 the optimised strategies pay off on the rectangle workload (identity: 2 / eps^2 per cell)
    rects = P.rectangles((256, 256), 300, np.random.default_rng(2))
    identity = 2.0 * np.mean((rects[:, 1] - rects[:, 0]) * (rects[:, 3] - rects[:, 2]))
    assert P.hdmm_expected_rect_mse((256, 256), rects, 1.0) < 0.3 * identity


# ---------------------------------------------------------------------------------------------------- quadtree


def test_quadtree_budgets_sum_to_epsilon_and_grow_geometrically():
    eps = P.quadtree_budgets(8, 0.7)
    assert eps.sum() == pytest.approx(0.7)
    np.testing.assert_allclose(eps[1:] / eps[:-1], 2 ** (1 / 3))
    assert P.quadtree_budgets(3, 1.0, "uniform").tolist() == [0.25] * 4


def test_htree_two_passes_are_the_weighted_least_squares_and_consistent():
    h, side = 3, 8
    rng = np.random.default_rng(0)
    noisy = [rng.normal(size=(1 << lev, 1 << lev)) * 5 for lev in range(h + 1)]
    var = np.array([4.0, 2.5, 1.0, 0.3])
    rows, obs, v = [], [], []
    for lev in range(h + 1):
        b = side >> lev
        for i in range(1 << lev):
            for j in range(1 << lev):
                r = np.zeros((side, side))
                r[i * b:(i + 1) * b, j * b:(j + 1) * b] = 1
                rows.append(r.ravel())
                obs.append(noisy[lev][i, j])
                v.append(var[lev])
    x = P.htree_consistent(noisy, var)
    np.testing.assert_allclose(x[h].ravel(), _dense_wls(np.array(rows), np.array(obs), np.array(v)), atol=1e-10)
    for lev in range(h):
        np.testing.assert_allclose(P._blocks(x[lev + 1], 2), x[lev], atol=1e-10)
    assert x[h].sum() == pytest.approx(x[0][0, 0])


def test_quadtree_pads_to_a_power_of_two_and_stays_unbiased():
    g = np.random.default_rng(6).poisson(3.0, (12, 20)).astype(float)
    rng = np.random.default_rng(7)
    _assert_unbiased(np.stack([P.quadtree(g, 1.0, rng) for _ in range(300)]), g)


# ---------------------------------------------------------------------------------------------------- AG


def test_ag_inference_is_the_weighted_least_squares_of_both_levels():
    rng = np.random.default_rng(1)
    parent = np.array([0, 0, 0, 0, 1, 2, 2])         # level-1 cells with 4, 1 and 2 leaves
    v, u = rng.normal(size=3) * 10, rng.normal(size=7) * 10
    alpha = 0.3
    A = np.vstack([np.eye(7), np.stack([(parent == c).astype(float) for c in range(3)])])
    var = np.concatenate([np.full(7, 1 / (1 - alpha) ** 2), np.full(3, 1 / alpha ** 2)])
    np.testing.assert_allclose(P.two_level(v, u, parent, alpha), _dense_wls(A, np.concatenate([u, v]), var),
                               atol=1e-10)


def test_ag_leaves_are_rectangles_inside_one_coarse_cell():
    px, py = P._parts(37, 10), P._parts(23, 7)
    m2 = np.arange(70) % 6 + 1
    leaf, parent = P._split_cells(px, py, m2)
    coarse = px[:, None] * 7 + py[None, :]
    assert np.array_equal(parent[leaf], coarse)
    assert np.array_equal(np.unique(leaf), np.arange(parent.size))
    for lf in range(parent.size):
        xs, ys = np.nonzero(leaf == lf)
        assert xs.size == (np.ptp(xs) + 1) * (np.ptp(ys) + 1)
    # a coarse cell gets min(m2, width) x min(m2, height) leaves
    w, h = np.bincount(px), np.bincount(py)
    expect = np.minimum(m2, w[np.arange(70) // 7]) * np.minimum(m2, h[np.arange(70) % 7])
    assert np.array_equal(np.bincount(parent), expect)


def test_grid_sizes_follow_qardaji_guideline():
    assert P._side(1e6, 1.0, P.C) == 317           # ceil(sqrt(1e6 / 10))
    assert P._side(-50.0, 1.0, P.C) == 1


# ---------------------------------------------------------------------------------------------------- workload


def test_rect_answers_match_brute_force():
    g = np.random.default_rng(8).poisson(5.0, (19, 11)).astype(float)
    rects = P.rectangles(g.shape, 300, np.random.default_rng(9))
    brute = [g[x0:x1, y0:y1].sum() for x0, x1, y0, y1 in rects]
    np.testing.assert_allclose(P.rect_answers(g, rects), brute)
    units = P.unit_cells(g.shape)
    np.testing.assert_allclose(P.rect_answers(g, units), g.ravel())


def test_rectangles_are_inside_non_empty_and_of_six_sizes():
    r = P.rectangles((256, 128), 3000, np.random.default_rng(0))
    assert np.all((r[:, 0] >= 0) & (r[:, 0] < r[:, 1]) & (r[:, 1] <= 256))
    assert np.all((r[:, 2] >= 0) & (r[:, 2] < r[:, 3]) & (r[:, 3] <= 128))
    assert sorted(set(r[:, 1] - r[:, 0])) == [4, 8, 16, 32, 64, 128]


# ---------------------------------------------------------------------------------------------------- corpus


def test_corpus_is_deterministic_and_has_its_promised_shapes():
    a, b = P.datasets(seed=3), P.datasets(seed=3)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert {"uniform", "clustered", "sparse", "roads", "taxi"} <= a.keys()
    for g in a.values():
        assert g.shape == (256, 256) and np.all(g >= 0) and np.all(g == np.round(g))
    assert np.mean(a["sparse"] == 0) > 0.95
    assert 5e5 < a["taxi"].sum() < 2e6
    assert not np.array_equal(P.datasets(seed=4)["clustered"], a["clustered"])


def test_shipped_checkin_grid_is_summed_into_coarser_shapes():
    if not P.CHECKIN.is_file():
        pytest.skip(f"{P.CHECKIN} absent")
    full, coarse = P.datasets()["checkin"], P.datasets((64, 32))["checkin"]
    assert coarse.shape == (64, 32) and coarse.sum() == full.sum()
    assert "checkin" not in P.datasets((100, 100))
