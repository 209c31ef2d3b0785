import numpy as np
import pytest

from dpalgos import domain


def test_points_inside_the_ball_are_untouched():
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(500, 4))
    X /= np.maximum(np.abs(X).sum(axis=1, keepdims=True), 1.0) * rng.uniform(1.0, 3.0, size=(500, 1))
    assert np.array_equal(domain.project_l1_ball(X), X)


def test_points_outside_land_on_the_sphere():
    rng = np.random.default_rng(2)
    X = rng.normal(0, 3, size=(1000, 6))
    X = X[np.abs(X).sum(axis=1) > 1]
    P = domain.project_l1_ball(X)
    assert np.allclose(np.abs(P).sum(axis=1), 1.0, atol=1e-12)
    # The projection keeps signs and never moves a coordinate away from zero.
    assert np.all(P * X >= 0) and np.all(np.abs(P) <= np.abs(X) + 1e-15)


@pytest.mark.parametrize("d", [1, 2, 3, 10, 784])
def test_projection_is_the_euclidean_optimum(d):
    # p is the projection of y onto the convex set C iff (y - p).(z - p) <= 0 for every z in C; the L1
    # ball is the convex hull of +-e_i, so checking the 2d vertices proves optimality exactly.
    # Over the vertices +-e_i, max (v - p).(y - p) = max_i |y - p|_i - p.(y - p): all rows at once.
    rng = np.random.default_rng(d)
    Y = rng.normal(0, 2, size=(200, d))
    P = domain.project_l1_ball(Y)
    R = Y - P
    assert np.all(np.abs(R).max(axis=1) - np.einsum("nd,nd->n", P, R) <= 1e-10)
    assert np.all(np.abs(P).sum(axis=1) <= 1 + 1e-12)


def test_projection_of_a_single_point_and_of_ties():
    assert np.allclose(domain.project_l1_ball(np.array([2.0, 2.0])), [0.5, 0.5])
    assert np.allclose(domain.project_l1_ball(np.array([3.0, 0.0, -1.0])), [1.0, 0.0, 0.0])


def test_scaling_uses_public_bounds_clips_and_counts():
    X = np.array([[0.0, 10.0], [5.0, 20.0], [10.0, 30.0], [12.0, 5.0]])
    Y, clipped = domain.scale_to_unit_box(X, [0, 10], [10, 30])
    assert np.allclose(Y[:3], [[-1, -1], [0, 0], [1, 1]])
    assert np.allclose(Y[3], [1, -1])
    assert clipped.tolist() == [1, 1]
    assert np.allclose(domain.unscale_from_unit_box(Y[:3], [0, 10], [10, 30]), X[:3])


@pytest.mark.parametrize("lower, upper", [([0, 5], [1, 5]), ([1], [0]), ([0, np.inf], [1, 2]), ([0, 1], [1])])
def test_bad_bounds_are_refused(lower, upper):
    with pytest.raises(ValueError):
        domain.check_bounds(lower, upper)


def test_to_unit_l1_ball_output_is_in_the_domain():
    rng = np.random.default_rng(3)
    X = rng.uniform(-50, 150, size=(2000, 3))
    P, clipped = domain.to_unit_l1_ball(X, [0, 0, 0], [100, 100, 100])
    assert np.all(np.abs(P).sum(axis=1) <= 1 + 1e-12)
    assert clipped.sum() > 0


@pytest.mark.parametrize("name", domain.DOMAINS)
def test_projection_onto_each_domain_is_the_identity_inside_and_lands_inside(name):
    rng = np.random.default_rng(4)
    inside = domain.uniform(500, 5, name, rng)
    assert np.all(domain.gauge(inside, name) <= 1 + 1e-12)
    assert np.array_equal(domain.project(inside, name), inside)
    P = domain.project(rng.normal(0, 3, size=(500, 5)), name)
    assert np.all(domain.gauge(P, name) <= 1 + 1e-12)


def test_box_clips_and_l2_ball_shrinks_radially():
    assert np.allclose(domain.project([[2.0, -0.5, -3.0]], "box"), [[1.0, -0.5, -1.0]])
    assert np.allclose(domain.project([[3.0, 4.0]], "l2_ball"), [[0.6, 0.8]])


@pytest.mark.parametrize("name", domain.DOMAINS)
@pytest.mark.parametrize("d", [1, 2, 6, 50])
def test_sum_sensitivity_is_the_largest_l1_norm_of_the_domain(name, d):
    """The claim of the plan: no point of the domain has a larger L1 norm, and one reaches it."""
    rng = np.random.default_rng(d)
    bound = domain.sum_sensitivity(name, d)
    points = domain.project(rng.normal(0, 5, size=(2000, d)), name)
    assert np.abs(points).sum(axis=1).max() <= bound * (1 + 1e-12)
    extreme = domain.project(np.full((1, d), 10.0), name)  # the projection of a far corner of the box
    assert np.abs(extreme).sum() == pytest.approx(bound)


def test_default_domain_depends_on_the_dimension_only():
    assert [domain.default_domain(d) for d in (1, 2, 3, 6, 784)] == ["l2_ball", "l2_ball", "box", "box", "box"]
    with pytest.raises(ValueError):
        domain.check_domain("sphere")


@pytest.mark.parametrize("name", domain.DOMAINS)
def test_boundary_distance_and_inradius(name):
    d = 4
    assert domain.boundary_distance(np.zeros((1, d)), name)[0] == pytest.approx(domain.inradius(name, d))
    # a ball of that radius around a point of the domain stays inside it
    rng = np.random.default_rng(5)
    x = 0.5 * domain.uniform(200, d, name, rng)
    u = rng.normal(size=(200, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    edge = x + 0.999 * domain.boundary_distance(x, name)[:, None] * u
    assert np.all(domain.gauge(edge, name) <= 1 + 1e-12)


def test_normalise_scales_then_projects():
    X = np.array([[0.0, 0.0, 0.0], [100.0, 100.0, 50.0]])
    box, clipped = domain.normalise(X, [0, 0, 0], [100, 100, 100], "box")
    assert np.allclose(box, [[-1, -1, -1], [1, 1, 0]]) and clipped.tolist() == [0, 0, 0]
    l1, _ = domain.normalise(X, [0, 0, 0], [100, 100, 100], "l1_ball")
    assert np.allclose(l1, domain.to_unit_l1_ball(X, [0, 0, 0], [100, 100, 100])[0])
