"""Keras model builders and the batched many-MLP computation behave like separate models."""

import numpy as np
import pytest
import tensorflow as tf

from mgpu.lesson02 import multimodel
from mgpu.runtime import models


def test_keras_builders_shapes_and_determinism():
    x = np.random.default_rng(0).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    for build in (models.small_cnn, models.mlp):
        a, b = build(seed=3), build(seed=3)
        assert a(x).shape == (4, 10)
        assert all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))
    model = models.compile_classifier(models.mlp(seed=0), "sgd", learning_rate=0.1)
    history = model.fit(x, np.arange(4) % 10, epochs=1, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert float(model.optimizer.learning_rate) == pytest.approx(0.1)


def _single_loss(params, j, x, y):
    w1, b1, w2, b2 = (p[j] for p in params)
    z = tf.nn.relu(x @ w1 + b1) @ w2 + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z))


def _data(n=64, d=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def test_batched_losses_equal_one_model_at_a_time():
    x, y = _data()
    params = multimodel.init_params(4, 12, 8, 3, seed=0, same_start=False)
    loss, acc = multimodel.evaluate(params, x, y, chunk=20)
    for j in range(4):
        assert loss[j] == pytest.approx(float(_single_loss(params, j, x, y)), rel=1e-5)
    assert np.all((acc >= 0) & (acc <= 1))


def test_one_sgd_step_with_momentum_matches_the_hand_update():
    x, y = _data()
    params = multimodel.init_params(3, 12, 8, 3, seed=1, same_start=False)
    velocity = tuple(tf.zeros_like(p) for p in params)
    batch = np.arange(16)[None, :]
    lrs, mus = np.array([[0.0, 0.1, 0.5]]), np.array([0.0, 0.9, 0.5])
    x_all, y_all = tf.constant(x), tf.constant(y)
    new, vel = multimodel.sgd_chunk(params, velocity, x_all, y_all, batch, lrs, mus)
    for j in range(3):
        with tf.GradientTape() as tape:
            single = [tf.constant(p[j]) for p in params]
            tape.watch(single)
            w1, b1, w2, b2 = single
            z = tf.nn.relu(x[:16] @ w1 + b1) @ w2 + b2
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[:16], logits=z))
        grads = tape.gradient(loss, single)
        for k in range(4):
            # From zero velocity, v = g and w <- w - lr g.
            assert np.allclose(vel[k][j], grads[k], atol=1e-6)
            assert np.allclose(new[k][j], params[k][j] - lrs[0, j] * grads[k], atol=1e-6)
    # A second step uses the momentum: v2 = mu v1 + g2.
    new2, vel2 = multimodel.sgd_chunk(new, vel, x_all, y_all, batch, np.zeros((1, 3)), mus)
    _, g2 = multimodel.sgd_chunk(new, tuple(tf.zeros_like(p) for p in params), x_all, y_all, batch,
                                 np.zeros((1, 3)), mus)
    for k in range(4):
        expected = mus.reshape([-1] + [1] * (len(params[k].shape) - 1)) * vel[k] + g2[k]
        assert np.allclose(vel2[k], expected, atol=1e-6)


def test_a_diverging_model_does_not_disturb_the_others():
    x, y = _data()
    params = multimodel.init_params(2, 12, 8, 3, seed=2)
    velocity = tuple(tf.zeros_like(p) for p in params)
    batches = np.tile(np.arange(32), (30, 1))
    x_all, y_all = tf.constant(x), tf.constant(y)
    alone, _ = multimodel.sgd_chunk(multimodel.take(params, [0]), multimodel.take(velocity, [0]),
                                    x_all, y_all, batches, np.full((30, 1), 0.05), np.zeros(1))
    both, _ = multimodel.sgd_chunk(params, velocity, x_all, y_all, batches,
                                   np.tile([0.05, 1e4], (30, 1)), np.zeros(2))
    loss = multimodel.mean_losses(both, x, y)
    assert loss[1] > 10 * loss[0]  # the huge step blew model 1 up ...
    for a, b in zip(alone, both):  # ... and model 0 trained exactly as if alone
        assert np.allclose(a[0], b[0], atol=1e-6)


def test_microbatch_norms_match_direct_gradients():
    x, y = _data(n=48)
    params = multimodel.init_params(2, 12, 8, 3, seed=3, same_start=False)
    small, big = multimodel.microbatch_gradient_sq_norms(params, x, y, k=4)
    grads = []
    for i in range(4):
        with tf.GradientTape() as tape:
            single = [tf.constant(p[0]) for p in params]
            tape.watch(single)
            loss = _single_loss([s[None] for s in single], 0, x[12 * i:12 * (i + 1)], y[12 * i:12 * (i + 1)])
        grads.append(np.concatenate([g.numpy().ravel() for g in tape.gradient(loss, single)]))
    grads = np.array(grads)
    assert np.allclose(small, np.sum(grads**2, axis=1), rtol=1e-4)
    # The gradient on the union is the mean of the microbatch gradients (equal sizes).
    assert big == pytest.approx(float(np.sum(grads.mean(axis=0) ** 2)), rel=1e-4)


def test_flat_and_unflat_round_trip():
    params = multimodel.init_params(3, 5, 4, 2, seed=0, same_start=False)
    vectors = multimodel.flat(params)
    assert vectors.shape == (3, 5 * 4 + 4 + 4 * 2 + 2)
    back = multimodel.unflat(vectors, params)
    assert all(np.array_equal(a, b) for a, b in zip(params, back))
