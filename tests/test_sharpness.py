"""Epsilon-sharpness of quadratics with known maxima, and the interpolation line."""

import numpy as np
import pytest

from mgpu.lesson02 import sharpness


def _quadratic(curvature, centre, floor):
    """f(x) = floor + sum(curvature * (x - centre)^2) / 2, evaluated on rows of points."""
    def loss_and_grad(points):
        d = points - centre
        return floor + 0.5 * np.sum(curvature * d**2, axis=1), curvature * d
    return loss_and_grad


def test_half_width():
    assert np.allclose(sharpness.box_half_width(np.array([0.0, -2.0, 3.0]), 0.01), [0.01, 0.03, 0.04])


@pytest.mark.parametrize("seed", [0, 1])
def test_sharpness_of_a_quadratic_at_its_minimum(seed):
    rng = np.random.default_rng(seed)
    p = 30
    curvature = rng.uniform(0.1, 10.0, p)
    centre = rng.standard_normal(p)
    floor, eps = 0.4, 1e-2
    f = _quadratic(curvature, centre, floor)
    # The maximum over the box is at a corner: every coordinate at its half-width.
    half = eps * (np.abs(centre) + 1)
    expected = 100 * 0.5 * np.sum(curvature * half**2) / (1 + floor)
    measured = sharpness.epsilon_sharpness(f, centre, eps, steps=5, seed=seed)
    assert measured.shape == (1,)
    assert measured[0] == pytest.approx(expected, rel=1e-6)


def test_sharper_quadratic_is_sharper_and_rows_are_independent():
    p = 10
    flat = _quadratic(np.full(p, 1.0), np.zeros(p), 0.0)
    sharp = _quadratic(np.full(p, 100.0), np.zeros(p), 0.0)

    def both(points):  # row 0 on the flat bowl, row 1 on the sharp one
        f0, g0 = flat(points[:1])
        f1, g1 = sharp(points[1:])
        return np.concatenate([f0, f1]), np.concatenate([g0, g1])

    values = sharpness.epsilon_sharpness(both, np.zeros((2, p)), 1e-3, steps=3)
    assert values[1] / values[0] == pytest.approx(100, rel=1e-6)


def test_more_ascent_steps_never_lower_the_estimate():
    # A non-convex 1-D bump: the estimate is a running maximum, so it cannot fall with more steps.
    def f(points):
        x = points[:, 0]
        return np.sin(5 * x) + x**2, (5 * np.cos(5 * x) + 2 * x)[:, None]
    x = np.array([[0.3]])
    values = [sharpness.epsilon_sharpness(f, x, 0.5, steps=s, seed=4)[0] for s in (0, 1, 3, 10)]
    assert all(b >= a for a, b in zip(values, values[1:]))


def test_line_points():
    a, b = np.array([0.0, 1.0]), np.array([2.0, 3.0])
    points = sharpness.line_points(a, b, [-1.0, 0.0, 0.5, 1.0, 2.0])
    assert np.allclose(points, [[-2, -1], [0, 1], [1, 2], [2, 3], [4, 5]])


def test_mlp_objective_matches_the_batched_loss_and_finite_differences():
    from mgpu.lesson02 import multimodel

    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int32)
    params = multimodel.init_params(2, 6, 5, 3, seed=1, same_start=False)
    objective = sharpness.mlp_objective(params, x, y)
    points = multimodel.flat(params).astype(np.float64)
    losses, grads = objective(points)
    assert np.allclose(losses, multimodel.mean_losses(params, x, y), rtol=1e-5)
    direction = rng.standard_normal(points.shape[1])
    h = 1e-2
    for row in range(2):
        up, _ = objective(points[row:row + 1] + h * direction)
        down, _ = objective(points[row:row + 1] - h * direction)
        slope = (up[0] - down[0]) / (2 * h)  # central difference of the loss along `direction`
        assert slope == pytest.approx(grads[row] @ direction, rel=2e-2, abs=1e-3)
    assert np.all(sharpness.epsilon_sharpness(objective, points, 1e-3, steps=3) >= 0)
