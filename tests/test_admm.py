"""ADMM (Lee, Wang & Kifer) against exact LP optima (scipy linprog / HiGHS) on random small problems."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog

from dpalgos import admm
from dpalgos.hierarchy import Tree, tree_plan
from dpalgos.noise import simulated


def lp_consistent_l1(xt, A, b, nonneg=True):
    """min ||x - xt||_1 s.t. A x = b (, x >= 0) as an LP in x = xt + p - q, p, q >= 0."""
    n = xt.size
    A = sp.csr_matrix(A)
    kw = {"A_ub": sp.hstack([-sp.identity(n), sp.identity(n)]).tocsr(), "b_ub": xt} if nonneg else {}
    r = linprog(np.ones(2 * n), A_eq=sp.hstack([A, -A]).tocsr(), b_eq=b - A @ xt, bounds=(0, None),
                method="highs", **kw)
    assert r.status == 0
    return r.fun


def lp_matrix_mechanism(rt, A):
    """min ||A x - rt||_1 s.t. x >= 0 as an LP in (x, t): -t <= A x - rt <= t."""
    m, n = A.shape
    r = linprog(np.r_[np.zeros(n), np.ones(m)],
                A_ub=np.block([[A, -np.eye(m)], [-A, -np.eye(m)]]), b_ub=np.r_[rt, -rt],
                bounds=(0, None), method="highs")
    assert r.status == 0
    return r.fun


@pytest.mark.parametrize("seed", range(4))
def test_algorithm1_matches_the_lp_optimum(seed):
    rng = np.random.default_rng(seed)
    n, p = 40, 6
    A = rng.integers(0, 2, size=(p, n)).astype(float)
    x0 = rng.poisson(3.0, n).astype(float)
    b = A @ x0
    xt = x0 + rng.laplace(0, 2.0, n)
    res = admm.solve_linear(xt, A, b, penalty="l1", scale=2.0, abs_tol=1e-8, max_iter=50_000)
    opt = lp_consistent_l1(xt, A, b)
    assert res.l1_objective == pytest.approx(opt, rel=1e-4)
    assert np.abs(A @ res.x - b).max() <= 1e-5 * max(1.0, np.abs(b).max())
    assert res.x.min() >= 0.0


@pytest.mark.parametrize("branching, leaves, fused, relaxation", [(2, 64, True, 1.6), (3, 81, False, 1.6),
                                                                (4, 64, True, 1.0)])
def test_algorithm3_on_a_tree_matches_the_lp_optimum(branching, leaves, fused, relaxation):
    rng = np.random.default_rng(branching)
    t = Tree(leaves, branching)
    true = np.where(rng.random(leaves) < 0.3, rng.poisson(8, leaves), 0)
    xt = simulated(tree_plan(t, epsilon=1.0), rng)("tree", t.aggregate(true))
    res = admm.solve_projection(xt, t.projection() if fused else t.htree, penalty="l1", scale=t.levels,
                                x0=t.htree(xt), abs_tol=1e-8, max_iter=100_000, relaxation=relaxation)
    opt = lp_consistent_l1(xt, t.consistency_matrix(), np.zeros(t.consistency_matrix().shape[0]))
    assert res.l1_objective == pytest.approx(opt, rel=1e-4)
    assert np.abs(t.consistency_matrix() @ res.x).max() <= 1e-4
    assert res.x.min() >= 0.0


@pytest.mark.parametrize("seed", range(3))
def test_algorithm4_matches_the_lp_optimum(seed):
    rng = np.random.default_rng(seed)
    m, n = 30, 12
    A = rng.integers(0, 2, size=(m, n)).astype(float)
    x0 = rng.poisson(5.0, n).astype(float)
    rt = A @ x0 + rng.laplace(0, 3.0, m)
    res = admm.solve_matrix_mechanism(rt, A, penalty="l1", scale=3.0, abs_tol=1e-9, max_iter=100_000)
    assert res.l1_objective == pytest.approx(lp_matrix_mechanism(rt, A), rel=1e-4)
    assert res.x.min() >= 0.0


def test_the_elastic_net_tends_to_the_l1_solution_as_alpha_goes_to_1():
    rng = np.random.default_rng(7)
    n, p = 30, 5
    A = rng.integers(0, 2, size=(p, n)).astype(float)
    x0 = rng.poisson(3.0, n).astype(float)
    b = A @ x0
    xt = x0 + rng.laplace(0, 1.0, n)
    opt = lp_consistent_l1(xt, A, b)
    gaps = [admm.solve_linear(xt, A, b, penalty="elastic", alpha=a, abs_tol=1e-9, max_iter=100_000).l1_objective
            - opt for a in (0.5, 0.9, 0.99, 0.9999)]
    assert all(g >= -1e-6 for g in gaps)
    assert gaps[-1] <= 1e-3 * opt and gaps[-1] < gaps[0]


@pytest.mark.parametrize("penalty", ["l1", "elastic", "l2"])
@pytest.mark.parametrize("branching, leaves", [(2, 1), (2, 32), (3, 27), (16, 256)])
def test_the_fused_tree_pass_takes_the_same_steps_as_the_plain_projection(penalty, branching, leaves):
    rng = np.random.default_rng(leaves)
    t = Tree(leaves, branching)
    xt = simulated(tree_plan(t, epsilon=0.5), rng)("tree", t.aggregate(rng.poisson(2, leaves)))
    kw = dict(penalty=penalty, scale=2 * t.levels, abs_tol=1e-6, max_iter=500)
    fused, plain = admm.solve_projection(xt, t.projection(), **kw), admm.solve_projection(xt, t.htree, **kw)
    assert fused.iterations == plain.iterations
    assert np.allclose(fused.x, plain.x, rtol=1e-9, atol=1e-9)


def test_htree_writes_into_its_output_and_may_work_in_place():
    rng = np.random.default_rng(1)
    t = Tree(81, 3)
    noisy = rng.normal(5.0, 3.0, t.size)
    expected = t.htree(noisy)
    assert np.abs(t.consistency_matrix() @ expected).max() < 1e-9
    out = np.full(t.size, np.nan)
    assert t.htree(noisy, out) is out and np.allclose(out, expected)
    copy = noisy.copy()
    t.htree(copy, copy)
    assert np.allclose(copy, expected)


def test_the_fused_tree_pass_allocates_nothing():
    """Minor page faults over passes on a 2^22-node tree: an allocating pass faults its fresh 33 MB vectors in
    again (the allocating Htree plus the update: about 500 faults per pass here, with huge pages)."""
    resource = pytest.importorskip("resource")
    t = Tree(2 ** 21, 2)
    rng = np.random.default_rng(0)
    xt, v, x, sq = rng.normal(size=t.size), rng.normal(size=t.size), np.zeros(t.size), np.zeros(2)
    project = t.projection()
    project.admm_pass(v, x, xt, True, 0, 0.9, 2.0, 1.6, sq)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        project.admm_pass(v, x, xt, True, 0, 0.9, 2.0, 1.6, sq)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 50


def test_l2_variant_is_the_nonnegative_least_squares_projection():
    rng = np.random.default_rng(3)
    t = Tree(16, 2)
    xt = simulated(tree_plan(t, epsilon=1.0), rng)("tree", t.aggregate(rng.poisson(500, 16)))
    assert t.htree(xt).min() > 0  # large counts: the non-negativity constraint does not bind
    res = admm.solve_projection(xt, t.projection(), penalty="l2", abs_tol=1e-10, max_iter=100_000)
    # ... so the L2 solution is exactly Hay et al.'s least squares.
    assert np.allclose(res.x, t.htree(xt), atol=1e-5)


def test_thresholding_operators():
    v = np.array([-3.0, -0.2, 0.0, 0.4, 2.0])
    assert np.allclose(admm.soft_threshold(v, 0.5), [-2.5, 0, 0, 0, 1.5])
    assert np.allclose(admm.theta(v, 1.0, 2.0), admm.soft_threshold(v, 0.5))
    # Theta is the prox of alpha|y| + (1 - alpha) y^2: check the optimality condition on the support.
    alpha, rho = 0.7, 2.0
    y = admm.theta(v, alpha, rho)
    on = y != 0
    assert np.allclose(alpha * np.sign(y[on]) + 2 * (1 - alpha) * y[on] + rho * (y[on] - v[on]), 0)
    assert np.all(np.abs(v[~on]) <= alpha / rho)
    with pytest.raises(ValueError):
        admm.prox("l3", 0.9, 2.0)


def test_sparse_and_cg_linear_solvers_agree_with_dense():
    rng = np.random.default_rng(5)
    A = rng.integers(0, 2, size=(8, 50)).astype(float)
    x0 = rng.poisson(3.0, 50).astype(float)
    xt = x0 + rng.laplace(0, 1.0, 50)
    dense = admm.solve_linear(xt, A, A @ x0, abs_tol=1e-9)
    for method in ("splu", "cg"):
        other = admm.solve_linear(xt, sp.csr_matrix(A), A @ x0, abs_tol=1e-9, linear_solver=method)
        assert np.allclose(other.x, dense.x, atol=1e-5)
