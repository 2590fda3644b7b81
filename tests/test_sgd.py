"""mgpu.lesson01.sgd on small problems: every expectation comes from theory, not from a recorded run."""

import numpy as np
import pytest

from mgpu.lesson01 import sgd


def _data(n=512, seed=0):
    return sgd.make_linear_data(n, np.random.default_rng(seed))


# ---- the linear neuron -------------------------------------------------------------------------

def test_loss_gradient_and_least_squares_agree():
    x, y = _data()
    optimum = sgd.least_squares(x, y)
    assert np.allclose(sgd.linear_gradient(optimum, x, y), 0, atol=1e-12)
    point, eps = np.array([0.3, -2.0]), 1e-6
    numeric = [(sgd.linear_loss(*(point + d), x, y) - sgd.linear_loss(*(point - d), x, y)) / (2 * eps)
               for d in (np.array([eps, 0]), np.array([0, eps]))]
    assert np.allclose(numeric, sgd.linear_gradient(point, x, y), rtol=1e-6)
    # The loss is the quadratic 1/2 (theta - theta*)^T H (theta - theta*) above its minimum.
    d = point - optimum
    excess = sgd.linear_loss(*point, x, y) - sgd.linear_loss(*optimum, x, y)
    assert excess == pytest.approx(0.5 * d @ sgd.linear_hessian(x) @ d, rel=1e-9)
    # Arrays of parameters broadcast: a grid costs one call.
    ww, bb = np.meshgrid([0.0, 1.0, 2.0], [-1.0, 0.5])
    grid = sgd.linear_loss(ww, bb, x, y)
    assert grid.shape == (2, 3) and grid[1, 2] == pytest.approx(sgd.linear_loss(2.0, 0.5, x, y))


def test_batch_gradients_stack_along_a_leading_axis():
    x, y = _data(64)
    params = np.array([1.0, 0.5])
    index = np.arange(64).reshape(8, 8)
    stacked = sgd.linear_gradient(params, x[index], y[index])
    assert stacked.shape == (8, 2)
    assert np.allclose(stacked[3], sgd.linear_gradient(params, x[index[3]], y[index[3]]))
    assert np.allclose(stacked.mean(axis=0), sgd.linear_gradient(params, x, y))


@pytest.mark.parametrize("n, batch_size", [(10, 3), (12, 4), (5, 8), (7, 1), (1000, 32)])
def test_shuffled_batches_cover_every_example_once_with_a_ragged_last_batch(n, batch_size):
    batches = list(sgd.shuffled_batches(n, batch_size, np.random.default_rng(0)))
    sizes = [len(b) for b in batches]
    full, rest = divmod(n, batch_size)
    assert sizes == [batch_size] * full + ([rest] if rest else [])
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(n))


def test_shuffled_batches_are_shuffled_and_follow_the_generator():
    rng = np.random.default_rng(1)
    first, second = (np.concatenate(list(sgd.shuffled_batches(500, 50, rng))) for _ in range(2))
    assert not np.array_equal(first, np.arange(500)) and not np.array_equal(first, second)
    again = np.concatenate(list(sgd.shuffled_batches(500, 50, np.random.default_rng(1))))
    assert np.array_equal(first, again)


def test_full_batch_training_is_gradient_descent():
    x, y = _data()
    n, lr, updates, start = len(x), 0.2, 50, (-1.0, 2.0)
    run = sgd.train_linear(x, y, lr=lr, batch_size=n, updates=updates, rng=np.random.default_rng(0),
                           start=start)
    distances = np.linalg.norm(run.params - sgd.least_squares(x, y), axis=1)
    assert np.allclose(distances, sgd.gd_distances(x, y, lr, updates, start=start), rtol=1e-10, atol=1e-14)
    assert np.array_equal(run.examples, n * np.arange(updates + 1))
    assert np.all(np.diff(run.losses) < 0)  # a stable GD step always lowers a convex quadratic


def test_training_counts_examples_through_ragged_batches_and_accepts_a_batcher():
    x, y = _data(100)
    calls = []

    def batches(n, batch_size, rng):
        calls.append((n, batch_size))
        return sgd.shuffled_batches(n, batch_size, rng)

    run = sgd.train_linear(x, y, lr=0.05, batch_size=30, updates=9, rng=np.random.default_rng(0),
                           batches=batches)
    # 100 = 30 + 30 + 30 + 10: four updates per epoch, and epoch after epoch.
    assert list(run.examples) == [0, 30, 60, 90, 100, 130, 160, 190, 200, 230]
    assert calls == [(100, 30)] * 3
    assert run.losses[-1] < run.losses[0]


def test_same_seed_same_run_other_seed_other_run():
    x, y = _data()

    def run(seed):
        return sgd.train_linear(x, y, lr=0.1, batch_size=4, updates=100, rng=np.random.default_rng(seed)).params

    assert np.array_equal(run(3), run(3))
    assert not np.array_equal(run(3), run(4))
    a, _ = sgd.quadratic_sgd(h=1, s=1, lr=0.1, batch_size=2, steps=50, chains=10, rng=np.random.default_rng(5))
    b, _ = sgd.quadratic_sgd(h=1, s=1, lr=0.1, batch_size=2, steps=50, chains=10, rng=np.random.default_rng(5))
    assert np.array_equal(a, b)


def test_minibatch_gradient_variance_matches_sampling_without_replacement():
    x, y = _data(256)
    params = sgd.least_squares(x, y) + np.array([0.2, -0.1])  # away from the minimum as well
    rng = np.random.default_rng(2)
    # Batch 1 visits every example once per epoch: the average is exact.
    assert sgd.minibatch_gradient_variance(x, y, params, 1, 2, rng) == pytest.approx(
        sgd.predicted_minibatch_variance(x, y, params, 1), rel=1e-9)
    # The whole data set is the full gradient: no noise at all.
    assert sgd.minibatch_gradient_variance(x, y, params, 256, 3, rng) == pytest.approx(0, abs=1e-20)
    assert sgd.predicted_minibatch_variance(x, y, params, 256) == 0
    # 16: a random estimate over 8000 batches (relative spread of a few per cent).
    measured = sgd.minibatch_gradient_variance(x, y, params, 16, 500, rng)
    assert measured == pytest.approx(sgd.predicted_minibatch_variance(x, y, params, 16), rel=0.1)
    with pytest.raises(ValueError, match="divide"):
        sgd.minibatch_gradient_variance(x, y, params, 10, 1, rng)


def test_gd_rate_is_the_largest_contraction_factor():
    x, y = _data()
    hessian = sgd.linear_hessian(x)
    top = np.linalg.eigvalsh(hessian)[-1]
    for fraction in (0.2, 0.5, 0.8):
        lr = fraction * 2 / top
        measured = sgd.convergence_rate(sgd.gd_distances(x, y, lr, 1500, start=(3.0, 3.0)))
        assert measured == pytest.approx(sgd.predicted_gd_rate(lr, hessian), rel=1e-2)
    beyond = sgd.convergence_rate(sgd.gd_distances(x, y, 1.1 * 2 / top, 400, start=(3.0, 3.0)))
    assert beyond == pytest.approx(sgd.predicted_gd_rate(1.1 * 2 / top, hessian), rel=1e-2) and beyond > 1
    with pytest.raises(ValueError, match="too few"):
        sgd.convergence_rate(sgd.gd_distances(x, y, 0.001, 3))


# ---- the quadratic with gradient noise -----------------------------------------------------------

def test_without_noise_the_chains_follow_gd_exactly():
    h, lr, steps = 2.0, 0.3, 20
    mean_loss, paths = sgd.quadratic_sgd(h=h, s=0.0, lr=lr, batch_size=1, steps=steps, chains=3,
                                         rng=np.random.default_rng(0), x0=1.5, keep_paths=2)
    expected = 0.5 * h * (1.5 * (1 - lr * h) ** np.arange(steps + 1)) ** 2
    assert np.allclose(mean_loss[0], expected) and np.allclose(paths[0, :, 1] ** 2 * h / 2, expected)


def test_noise_ball_formula_is_the_fixed_point_of_the_exact_recursion():
    for h, s, b, lr in [(1.0, 1.0, 8, 0.05), (2.0, 0.5, 1, 0.9), (0.5, 3.0, 64, 3.0)]:
        expected = sgd.expected_quadratic_loss(h=h, s=s, lr=lr, batch_size=b, steps=20000, x0=0.0)
        assert expected[-1] == pytest.approx(float(sgd.noise_ball_loss(h, s, b, lr)), rel=1e-9)
    # For small steps the exact ball tends to step s^2 / (4B).
    ratio = sgd.noise_ball_loss(1.0, 1.0, 4, 1e-6) / sgd.noise_ball_loss_small_step(1.0, 4, 1e-6)
    assert ratio == pytest.approx(1.0, rel=1e-5)


def test_noise_ball_formula_matches_a_long_simulation_on_a_grid():
    h, s = 2.0, 1.5
    lrs, batches = np.array([0.05, 0.3, 0.8]), np.array([2, 8, 2])
    mean_loss, _ = sgd.quadratic_sgd(h=h, s=s, lr=lrs, batch_size=batches, steps=3000, chains=2000,
                                     rng=np.random.default_rng(11))
    measured = sgd.stationary_mean(mean_loss, 500)
    predicted = sgd.noise_ball_loss(h, s, batches, lrs)
    assert np.allclose(measured, predicted, rtol=0.05)
    # Same step, 4x the batch: 4x smaller ball.
    big, _ = sgd.quadratic_sgd(h=h, s=s, lr=0.3, batch_size=np.array([2, 8]), steps=3000, chains=2000,
                               rng=np.random.default_rng(12))
    small_over_big = sgd.stationary_mean(big, 500)
    assert small_over_big[0] / small_over_big[1] == pytest.approx(4.0, rel=0.1)


def test_decaying_step_gives_one_over_t():
    schedule = sgd.decaying_step(2.0, 10.0)
    assert schedule(0) == pytest.approx(0.2) and schedule(90) == pytest.approx(0.02)
    steps = 3000
    t = np.unique(np.geomspace(300, steps, 30).astype(int))
    exact = sgd.expected_quadratic_loss(h=1.0, s=1.0, lr=schedule, batch_size=1, steps=steps)
    assert sgd.loglog_slope(t, exact[t]) == pytest.approx(-1.0, abs=0.05)
    # The limit of t E[f]: h/2 * beta^2 s^2 / (B (2 beta h - 1)) = 2/3 here.
    assert steps * exact[-1] == pytest.approx(2 / 3, rel=0.02)
    simulated, _ = sgd.quadratic_sgd(h=1.0, s=1.0, lr=schedule, batch_size=1, steps=steps, chains=2000,
                                     rng=np.random.default_rng(3))
    assert -1.2 <= sgd.loglog_slope(t, simulated[0, t]) <= -0.8
    assert sgd.loglog_slope(np.arange(1, 100), 5.0 / np.arange(1, 100) ** 2) == pytest.approx(-2.0)


# ---- the saddle -----------------------------------------------------------------------------------

def test_saddle_function_and_gradient():
    assert sgd.saddle_loss(0.0, 0.0) == 0 and sgd.saddle_loss(0.0, 1.0) == -0.25
    assert sgd.saddle_gradient(0.0, 1.0) == (0.0, 0.0) and sgd.saddle_gradient(0.0, 0.0) == (0.0, 0.0)
    eps = 1e-6
    for point in [(0.4, -0.7), (-1.0, 1.3)]:
        gx, gy = sgd.saddle_gradient(*point)
        assert gx == pytest.approx((sgd.saddle_loss(point[0] + eps, point[1])
                                    - sgd.saddle_loss(point[0] - eps, point[1])) / (2 * eps), rel=1e-6)
        assert gy == pytest.approx((sgd.saddle_loss(point[0], point[1] + eps)
                                    - sgd.saddle_loss(point[0], point[1] - eps)) / (2 * eps), rel=1e-6)


def test_gd_converges_to_the_saddle_and_sgd_escapes():
    rng = np.random.default_rng(0)
    gd = sgd.run_saddle(lr=0.05, steps=400, noise=0.0, runs=1, rng=rng, keep_paths=1)
    assert np.all(gd.paths[:, 0, 1] == 0)  # never leaves the ridge y = 0
    assert np.hypot(*gd.final[0]) < 1e-6 and gd.escape_step[0] == -1
    assert sgd.escape_fraction(gd.final) == 0
    noisy = sgd.run_saddle(lr=0.05, steps=400, noise=0.1, runs=500, rng=rng)
    assert sgd.escape_fraction(noisy.final) >= 0.95
    # Escapes go either way, about evenly (symmetry), and end near the minima y = +-1.
    assert 0.35 < np.mean(noisy.final[:, 1] > 0) < 0.65
    assert np.allclose(np.abs(noisy.final[noisy.escape_step >= 0, 1]), 1, atol=0.3)
    # Off the ridge, GD escapes too, once (1 + lr)^t has grown the offset: about log(0.5/1e-6)/log(1.05).
    nudged = sgd.run_saddle(lr=0.05, steps=400, noise=0.0, runs=1, rng=rng, start=(1.0, 1e-6))
    assert nudged.escape_step[0] == pytest.approx(np.log(0.5 / 1e-6) / np.log(1.05), rel=0.05)
