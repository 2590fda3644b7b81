"""Steps-to-target fits, slopes, LR scaling rules, warm-up schedules and a tiny real sweep."""

import math

import numpy as np
import pytest

from mgpu.lesson02 import batch_study as bs

BATCHES = 2.0 ** np.arange(2, 14)


def test_steps_model_limits():
    # S(B) -> S_min B_crit / B for B << B_crit (perfect scaling), -> S_min for B >> B_crit.
    s = bs.steps_model([1e-3, 1e9], 100.0, 256.0)
    assert s[0] == pytest.approx(100 * 256 / 1e-3, rel=1e-3)
    assert s[1] == pytest.approx(100.0, rel=1e-6)
    assert bs.steps_model([256], 100.0, 256.0)[0] == pytest.approx(200.0)  # twice S_min at B_crit


def test_fit_recovers_noiseless_parameters():
    s = bs.steps_model(BATCHES, 120.0, 300.0)
    s_min, b_crit = bs.fit_steps_model(BATCHES, s)
    assert s_min == pytest.approx(120.0, rel=1e-4)
    assert b_crit == pytest.approx(300.0, rel=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_fit_recovers_parameters_from_noisy_steps(seed):
    rng = np.random.default_rng(seed)
    s = bs.steps_model(BATCHES, 80.0, 150.0) * np.exp(0.05 * rng.standard_normal(len(BATCHES)))
    s_min, b_crit = bs.fit_steps_model(BATCHES, s)
    assert s_min == pytest.approx(80.0, rel=0.1)
    assert b_crit == pytest.approx(150.0, rel=0.25)


def test_fit_ignores_batches_that_never_reached_the_target():
    s = bs.steps_model(BATCHES, 50.0, 64.0)
    s[3] = math.inf
    assert bs.fit_steps_model(BATCHES, s)[1] == pytest.approx(64.0, rel=1e-4)


def test_loglog_slopes_match_the_regimes():
    assert bs.loglog_slope([2, 4, 8], [400, 200, 100]) == pytest.approx(-1.0)
    s = bs.steps_model(BATCHES, 100.0, 1000.0)
    # Local slope of S_min(1 + Bc/B) is -1 / (1 + B / Bc): near -1 far below Bc, near 0 far above.
    assert bs.loglog_slope(BATCHES[:2], s[:2]) < -0.99
    assert bs.loglog_slope(BATCHES[:2], s[:2]) >= -1.0
    s = bs.steps_model(BATCHES, 100.0, 4.0)
    assert -0.01 < bs.loglog_slope(BATCHES[-2:], s[-2:]) < 0
    b = np.array([900.0, 1100.0])
    assert bs.loglog_slope(b, bs.steps_model(b, 1.0, 1000.0)) == pytest.approx(-0.5, abs=0.01)


def test_scaling_rules():
    assert bs.scaled_lr(0.1, 32, 256, "linear") == pytest.approx(0.8)
    assert bs.scaled_lr(0.1, 32, 128, "sqrt") == pytest.approx(0.2)
    assert bs.scaled_lr(0.1, 32, 4096, "none") == pytest.approx(0.1)
    with pytest.raises(ValueError):
        bs.scaled_lr(0.1, 32, 64, "cubic")


def test_warmup_schedules():
    k = 8
    none = bs.warmup_factors(20, 10, "none", 1 / k)
    constant = bs.warmup_factors(20, 10, "constant", 1 / k)
    gradual = bs.warmup_factors(20, 10, "gradual", 1 / k)
    assert np.all(none == 1)
    assert np.all(constant[:10] == 1 / k) and np.all(constant[10:] == 1)
    assert gradual[0] == pytest.approx(1 / k)
    assert gradual[5] == pytest.approx(1 / k + (1 - 1 / k) / 2)  # halfway up the ramp
    assert np.all(np.diff(gradual[:11]) > 0) and np.all(gradual[10:] == 1)
    with pytest.raises(ValueError):
        bs.warmup_factors(5, 2, "cosine", 0.5)


def test_crossing_step_interpolates():
    steps = np.array([0, 10, 20, 30])
    assert bs.crossing_step(steps, [2.0, 1.5, 0.5, 0.1], 1.0) == pytest.approx(15.0)
    assert bs.crossing_step(steps, [2.0, 1.5, 1.2, 1.1], 1.0) == math.inf
    assert bs.crossing_step(steps, [0.5, 0.4, 0.3, 0.2], 1.0) == 0.0


def test_shuffled_batches_are_permutations_per_epoch():
    batches = bs.shuffled_batches(100, 10, 25, np.random.default_rng(0))
    assert batches.shape == (25, 10)
    for epoch in range(2):
        assert sorted(batches[epoch * 10:(epoch + 1) * 10].ravel()) == list(range(100))


def test_eval_schedule_is_increasing_and_ends_at_max():
    s = bs.eval_schedule(1000, 1.1)
    assert s[-1] == 1000 and np.all(np.diff(s) > 0)


def _toy_arrays(seed=0, n=2048, d=20, shift=0.25):
    """Two overlapping Gaussian classes (means +-shift per coordinate): a real but easy problem."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype(np.int32)
    x = (rng.standard_normal((n, d)) + shift * (2 * y[:, None] - 1)).astype(np.float32)
    return bs.Arrays(x[:1536], y[:1536], x[1536:], y[1536:], x[1536:], y[1536:])


def test_steps_to_target_on_a_real_problem():
    arrays = _toy_arrays()
    # One learning rate per call, so every run goes all the way to the target.
    steps = [bs.steps_to_target(arrays, 32, [lr], [0.0], target_loss=0.4, max_steps=3000, seed=0,
                                hidden=16).steps[0] for lr in (0.01, 0.03, 0.1)]
    # On this well-conditioned problem a larger (still stable) step gets there in fewer steps.
    assert np.isfinite(steps).all()
    assert steps[2] < steps[1] < steps[0]
    # A grid in one call stops when its best rate arrives: the others are then not yet there.
    grid = bs.steps_to_target(arrays, 32, [0.01, 0.03, 0.1], [0.0] * 3, target_loss=0.4,
                              max_steps=3000, seed=0, hidden=16)
    assert grid.best_lr(0.0) == pytest.approx(0.1)
    assert grid.best(0.0) == pytest.approx(steps[2])
    assert np.all(grid.steps[:2] > grid.steps[2])


@pytest.mark.parametrize("seed", [0, 1])
def test_momentum_lags_plain_sgd_by_its_warm_up_of_the_velocity(seed):
    # Heavy ball with lr = (1 - mu) * lr_plain takes the same long-run step, but its velocity builds
    # up as 1 - mu^t: summed over steps that is mu / (1 - mu) = 9 steps behind plain SGD (mu = 0.9).
    arrays = _toy_arrays(seed)
    run = lambda lr, mu: bs.steps_to_target(arrays, 16, [lr], [mu], target_loss=0.4, max_steps=3000,
                                            seed=seed, hidden=16).steps[0]
    lag = run(0.01, 0.9) - run(0.1, 0.0)
    assert 0 < lag < 9 + 3


def test_scaling_study_gives_every_rule_the_same_accuracy_at_k_1():
    # At k = 1 every rule and warm-up gives the base rate: the variants are one run and report one accuracy.
    arrays = _toy_arrays()
    out = bs.scaling_study(arrays, [32, 128], base_batch=32, base_lr=0.05, momentum=0.9, epochs=1,
                           warmup_epochs=0.5, seed=0, hidden=8, replicas=2, progress=False)
    at_base = {variant: acc[32] for variant, acc in out.items()}
    assert len(set(at_base.values())) == 1, at_base
    assert len({acc[128] for acc in out.values()}) > 1  # at k = 4 the rules differ
