"""LARS and LAMB against the papers' update rules, written independently here in numpy."""

import numpy as np
import pytest
import tensorflow as tf

from mgpu.lesson05 import optimizers


def _trust(numerator, denominator):
    return numerator / denominator if numerator > 0 and denominator > 0 else 1.0


def lars_reference(w, grads, lr, momentum, eta, wd):
    """You et al. 2017, Algorithm 1, one variable, several steps."""
    w, v = w.astype(np.float64), np.zeros_like(w, dtype=np.float64)
    for g in grads:
        local_lr = eta * _trust(np.linalg.norm(w), np.linalg.norm(g) + wd * np.linalg.norm(w))
        v = momentum * v + lr * local_lr * (g + wd * w)
        w = w - v
    return w


def lamb_reference(w, grads, lr, b1, b2, eps, wd):
    """You et al. 2020, Algorithm 2 (with Adam's bias correction), one variable, several steps."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * w
        w = w - lr * _trust(np.linalg.norm(w), np.linalg.norm(r)) * r
    return w


def _run(optimizer, w0, grads):
    variable = tf.Variable(w0.astype(np.float64))
    for g in grads:
        optimizer.apply_gradients([(tf.constant(g), variable)])
    return variable.numpy()


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(6, 4))
    grads = [rng.normal(size=(6, 4)) * (k + 1) for k in range(5)]
    return w0, grads


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lars_matches_the_published_rule(problem, wd):
    w0, grads = problem
    ours = _run(optimizers.LARS(learning_rate=0.5, momentum=0.9, eta=0.01, weight_decay_rate=wd), w0, grads)
    np.testing.assert_allclose(ours, lars_reference(w0, grads, 0.5, 0.9, 0.01, wd), rtol=1e-6)  # Keras keeps the learning rate as a float32 variable
    assert not np.allclose(ours, w0)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_matches_the_published_rule(problem, wd):
    w0, grads = problem
    ours = _run(optimizers.LAMB(learning_rate=0.01, weight_decay_rate=wd), w0, grads)
    np.testing.assert_allclose(ours, lamb_reference(w0, grads, 0.01, 0.9, 0.999, 1e-6, wd), rtol=1e-6)  # Keras keeps the learning rate as a float32 variable


def test_layer_step_is_bounded_by_the_trust_ratio(problem):
    # LAMB's first step moves each layer by exactly lr * ||w|| whatever the gradient's scale.
    w0, grads = problem
    for scale in (1e-3, 1.0, 1e3):
        moved = _run(optimizers.LAMB(learning_rate=0.01), w0, [grads[0] * scale]) - w0
        np.testing.assert_allclose(np.linalg.norm(moved), 0.01 * np.linalg.norm(w0), rtol=1e-6)


def test_zero_weights_fall_back_to_a_trust_ratio_of_one():
    w0 = np.zeros(3)
    g = np.array([1.0, -2.0, 0.5])
    moved = _run(optimizers.LARS(learning_rate=0.1, momentum=0.0, eta=1.0), w0, [g])
    np.testing.assert_allclose(moved, -0.1 * g)


def test_they_train_a_keras_model_and_serialize():
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    for optimizer in (optimizers.LAMB(learning_rate=0.05), optimizers.LARS(learning_rate=2.0, eta=0.02)):
        model = tf.keras.Sequential([tf.keras.Input(shape=(5,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer, "mse")
        history = model.fit(x, y, batch_size=32, epochs=15, verbose=0)
        assert history.history["loss"][-1] < 0.2 * history.history["loss"][0]
        config = optimizer.get_config()
        assert type(optimizer).from_config(config).get_config()["learning_rate"] == config["learning_rate"]


def _horovod_training(name):
    import horovod.tensorflow.keras as hvd

    hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())  # different data per rank
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 5)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = tf.keras.Sequential([tf.keras.Input(shape=(5,)), tf.keras.layers.Dense(1)])
    inner = optimizers.LAMB(learning_rate=0.05) if name == "LAMB" else optimizers.LARS(learning_rate=1.0, eta=0.02)
    model.compile(hvd.DistributedOptimizer(inner), "mse")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    every_rank = hvd.allgather(tf.constant(flat[None])).numpy()
    return float(np.abs(every_rank - every_rank[0]).max())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["LAMB", "LARS"])
def test_they_work_under_horovods_distributed_optimizer(name):
    from mgpu.runtime import launch

    # Different data on each rank, averaged gradients: the ranks stay identical.
    assert launch.run(_horovod_training, 2, args=(name,), verbose=False).value < 1e-6
