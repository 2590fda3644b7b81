"""The two-batch noise-scale estimator recovers |G|^2, tr(Sigma) and B_simple of known distributions."""

import math

import numpy as np
import pytest

from mgpu.lesson02 import noise_scale


def _gaussian_gradients(rng, mean, std, batch, pairs):
    """Mean of `batch` per-example gradients N(mean, diag(std^2)), `pairs` times: shape (pairs, P)."""
    # The mean of `batch` independent draws is N(mean, diag(std^2) / batch): draw it directly.
    return mean + rng.standard_normal((pairs, len(mean))) * std / math.sqrt(batch)


def test_expected_norm_formula_matches_simulation():
    rng = np.random.default_rng(0)
    mean, std = np.array([1.0, -2.0, 0.5]), np.array([3.0, 1.0, 2.0])
    g = _gaussian_gradients(rng, mean, std, 16, 200_000)
    measured = np.mean(np.sum(g**2, axis=1))
    expected = noise_scale.expected_sq_norm(np.sum(mean**2), np.sum(std**2), 16)
    assert measured == pytest.approx(expected, rel=0.01)


def test_estimates_are_exact_on_expected_norms():
    # Feeding the expectations themselves must give back |G|^2 and tr(Sigma) exactly.
    g2, tr = 0.7, 45.0
    small, big = noise_scale.expected_sq_norm(g2, tr, 8), noise_scale.expected_sq_norm(g2, tr, 512)
    assert noise_scale.gradient_sq_estimate(small, big, 8, 512) == pytest.approx(g2, rel=1e-12)
    assert noise_scale.trace_sigma_estimate(small, big, 8, 512) == pytest.approx(tr, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimator_recovers_a_known_distribution(seed):
    rng = np.random.default_rng(seed)
    p = 50
    mean = rng.standard_normal(p) * 0.2
    std = rng.uniform(0.5, 2.0, p)
    true_g2, true_tr = float(np.sum(mean**2)), float(np.sum(std**2))
    b_small, b_big, pairs = 16, 256, 4000
    small = np.sum(_gaussian_gradients(rng, mean, std, b_small, pairs) ** 2, axis=1)
    big = np.sum(_gaussian_gradients(rng, mean, std, b_big, pairs) ** 2, axis=1)
    est = noise_scale.TwoBatchEstimator(b_small, b_big)
    for s, b in zip(small, big):
        est.update(s, b)
    assert est.pairs == pairs
    assert est.gradient_sq == pytest.approx(true_g2, rel=0.1)
    assert est.trace_sigma == pytest.approx(true_tr, rel=0.05)
    assert est.b_simple == pytest.approx(true_tr / true_g2, rel=0.15)


def test_per_worker_norms_from_one_global_batch():
    # Data parallel: 8 workers of 32 each; every worker's local gradient and the all-reduced mean.
    rng = np.random.default_rng(3)
    p, workers, b = 40, 8, 32
    mean = np.full(p, 0.3)
    std = np.full(p, 1.5)
    est = noise_scale.TwoBatchEstimator(b, b * workers)
    for _ in range(3000):
        local = _gaussian_gradients(rng, mean, std, b, workers)
        est.update(np.sum(local**2, axis=1), float(np.sum(local.mean(axis=0) ** 2)))
    assert est.b_simple == pytest.approx(np.sum(std**2) / np.sum(mean**2), rel=0.15)


def test_noise_scale_grows_as_the_gradient_shrinks():
    # Same noise, a 10x smaller true gradient: B_simple must grow 100x (it is tr(Sigma)/|G|^2).
    values = []
    for scale in (1.0, 0.1):
        small = noise_scale.expected_sq_norm(scale**2, 20.0, 4)
        big = noise_scale.expected_sq_norm(scale**2, 20.0, 64)
        est = noise_scale.TwoBatchEstimator(4, 64)
        est.update(small, big)
        values.append(est.b_simple)
    assert values[1] / values[0] == pytest.approx(100, rel=1e-9)


def test_bad_batch_sizes_and_empty_estimator():
    with pytest.raises(ValueError):
        noise_scale.TwoBatchEstimator(64, 64)
    with pytest.raises(ValueError):
        noise_scale.TwoBatchEstimator(8, 4).b_simple
    with pytest.raises(ValueError, match="update"):
        noise_scale.TwoBatchEstimator(8, 64).b_simple
