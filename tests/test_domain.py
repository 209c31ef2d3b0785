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
    rng = np.random.default_rng(d)
    Y = rng.normal(0, 2, size=(200, d))
    P = domain.project_l1_ball(Y)
    vertices = np.vstack([np.eye(d), -np.eye(d)])
    for y, p in zip(Y, P):
        assert np.max((vertices - p) @ (y - p)) <= 1e-10
        assert np.abs(p).sum() <= 1 + 1e-12


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
