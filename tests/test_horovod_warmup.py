"""Horovod's learning-rate callbacks with their defaults, on 2 real workers, with the course's optimizer.

LearningRateWarmupCallback and LearningRateScheduleCallback correct the momentum by default
(momentum_correction=True; Goyal et al. 2017, section 2.1): on a step whose rate goes from lr_old to
lr_new, the velocity is weighted by momentum * lr_new / lr_old, so the update is

    velocity = momentum * (lr_new / lr_old) * velocity - lr_new * gradient;  weights += velocity.

Keras 2.15's SGD (and tf_keras's) keeps `momentum` as a Python float, on which Horovod 0.28.1 crashed;
the course's patch 04 makes the correction work. A linear model trained with mean squared error on
2 workers is recomputed here in NumPy, step by step, from the same data: the weights after every step
must be those of the corrected update, and far from those of the uncorrected one.
"""

import numpy as np
import pytest

from mgpu.runtime import launch

pytestmark = pytest.mark.slow

LR = 0.1  # the rate for 2 workers; the warm-up starts near LR / 2
MOMENTUM = 0.9
BATCH = 4
STEPS = 3  # batches per epoch and worker
EPOCHS = 3
WARMUP_EPOCHS = 2
DECAY = 0.5  # LearningRateScheduleCallback's multiplier: the rate is LR * DECAY ** epoch
FEATURES = 3


def _shard(rank):
    """Worker ``rank``'s training data (the same in the workers and in the test)."""
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(STEPS * BATCH, FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=(FEATURES, 1)) + 1.0).astype(np.float32)
    return x, y


def _initial_weights():
    return [np.linspace(-0.5, 0.5, FEATURES, dtype=np.float32).reshape(FEATURES, 1),
            np.array([0.25], np.float32)]


def _train_with_horovod_callbacks():
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    x, y = _shard(hvd.rank())

    def fit(optimizer, schedule):
        model = tf.keras.Sequential([tf.keras.Input(shape=(FEATURES,)), tf.keras.layers.Dense(1)])
        model.set_weights(_initial_weights())  # the same on every rank: no broadcast needed
        model.compile(hvd.DistributedOptimizer(optimizer), "mse")
        rates, weights = [], []

        class Record(tf.keras.callbacks.Callback):  # after Horovod's callback: sees the rate it set
            def on_train_batch_begin(self, batch, logs=None):
                rates.append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))

            def on_train_batch_end(self, batch, logs=None):
                weights.append(np.concatenate([w.ravel() for w in self.model.get_weights()]))

        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[schedule, Record()])
        momentum = float(tf.keras.backend.get_value(getattr(model.optimizer, "momentum", 0.0)))
        return {"rates": rates, "weights": np.array(weights), "momentum_after": momentum}

    def warmup():  # Horovod's documented call, defaults kept (momentum_correction=True)
        return hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=WARMUP_EPOCHS)

    runs = {
        "SGD, warm-up": fit(tf.keras.optimizers.SGD(LR, momentum=MOMENTUM), warmup()),
        "SGD, schedule": fit(tf.keras.optimizers.SGD(LR, momentum=MOMENTUM),
                             hvd.callbacks.LearningRateScheduleCallback(initial_lr=LR, multiplier=DECAY)),
        "legacy SGD, warm-up": fit(tf.keras.optimizers.legacy.SGD(LR, momentum=MOMENTUM), warmup()),
        "SGD without momentum, warm-up": fit(tf.keras.optimizers.SGD(LR), warmup()),
        "Adam, warm-up": fit(tf.keras.optimizers.Adam(LR), warmup()),
    }
    try:
        schedule = tf.keras.optimizers.schedules.ExponentialDecay(LR, decay_steps=1, decay_rate=0.5)
        fit(tf.keras.optimizers.SGD(schedule, momentum=MOMENTUM), warmup())
        refused = ""
    except ValueError as error:
        refused = str(error)
    return {"size": hvd.size(), "runs": runs, "refused": refused}


@pytest.fixture(scope="module")
def trained():
    return launch.run(_train_with_horovod_callbacks, 2, verbose=False).value


def _warmup_rates(size):
    """Horovod's documented ramp, lr'(epoch) = lr / size * ((size - 1) / warmup * epoch + 1), which the
    callback evaluates at the end of each batch (epoch + (batch + 1) / steps): it reaches LR on the
    last warm-up batch, and the rate then stays LR."""
    rates = []
    for epoch in range(EPOCHS):
        for batch in range(STEPS):
            at = min(epoch + (batch + 1) / STEPS, WARMUP_EPOCHS)
            rates.append(LR / size * ((size - 1) / WARMUP_EPOCHS * at + 1))
    return np.array(rates)


def _schedule_rates():
    return np.array([LR * DECAY ** epoch for epoch in range(EPOCHS) for _ in range(STEPS)])


def _sgd(rates, momentum, size, corrected):
    """Keras's SGD on the workers' averaged MSE gradient, in float64; the weights after every step."""
    shards = [_shard(rank) for rank in range(size)]
    kernel, bias = (w.astype(np.float64) for w in _initial_weights())
    velocity_kernel, velocity_bias = np.zeros_like(kernel), np.zeros_like(bias)
    previous_rate = LR  # the optimizer's own rate before the callback's first change (velocity is 0 then)
    after = []
    for step, rate in enumerate(rates):
        batch = slice(step % STEPS * BATCH, (step % STEPS + 1) * BATCH)
        grad_kernel, grad_bias = np.zeros_like(kernel), np.zeros_like(bias)
        for x, y in shards:
            x, y = x[batch].astype(np.float64), y[batch].astype(np.float64)
            error = x @ kernel + bias - y
            grad_kernel += 2 * x.T @ error / len(x) / size
            grad_bias += 2 * error.sum(axis=0) / len(x) / size
        weight = momentum * (rate / previous_rate if corrected else 1.0)
        velocity_kernel = weight * velocity_kernel - rate * grad_kernel
        velocity_bias = weight * velocity_bias - rate * grad_bias
        kernel, bias = kernel + velocity_kernel, bias + velocity_bias
        after.append(np.concatenate([kernel.ravel(), bias]))
        previous_rate = rate
    return np.array(after)


TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # float32 training against a float64 recomputation


def _assert_follows(run, expected, different_from=None):
    got = run["weights"]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **TOLERANCE)
    if different_from is not None:
        # The correction shows: the uncorrected update is a thousand tolerances away.
        assert np.abs(got - different_from).max() > 1000 * TOLERANCE["atol"]


@pytest.mark.parametrize("name", ["SGD, warm-up", "legacy SGD, warm-up"])
def test_warmup_ramps_the_rate_and_corrects_the_momentum(trained, name):
    size, run = trained["size"], trained["runs"][name]
    assert size == 2
    rates = _warmup_rates(size)
    np.testing.assert_allclose(run["rates"], rates, rtol=1e-6)
    assert rates[0] < LR / size * 1.2 and rates[STEPS * WARMUP_EPOCHS - 1:] == pytest.approx(LR)
    _assert_follows(run, _sgd(rates, MOMENTUM, size, corrected=True),
                    different_from=_sgd(rates, MOMENTUM, size, corrected=False))
    assert run["momentum_after"] == pytest.approx(MOMENTUM)  # the optimizer's momentum is left as it was


def test_schedule_steps_the_rate_per_epoch_and_corrects_the_momentum_where_it_changes(trained):
    run = trained["runs"]["SGD, schedule"]
    rates = _schedule_rates()
    np.testing.assert_allclose(run["rates"], rates, rtol=1e-6)
    _assert_follows(run, _sgd(rates, MOMENTUM, trained["size"], corrected=True),
                    different_from=_sgd(rates, MOMENTUM, trained["size"], corrected=False))
    assert run["momentum_after"] == pytest.approx(MOMENTUM)


def test_warmup_without_momentum(trained):
    size = trained["size"]
    plain = trained["runs"]["SGD without momentum, warm-up"]
    np.testing.assert_allclose(plain["rates"], _warmup_rates(size), rtol=1e-6)
    _assert_follows(plain, _sgd(_warmup_rates(size), 0.0, size, corrected=True))
    adam = trained["runs"]["Adam, warm-up"]  # no `momentum` at all: only the rate changes
    np.testing.assert_allclose(adam["rates"], _warmup_rates(size), rtol=1e-6)
    assert np.all(np.isfinite(adam["weights"]))


def test_a_learning_rate_schedule_is_refused_not_silently_overridden(trained):
    assert "LearningRateSchedule" in trained["refused"]
