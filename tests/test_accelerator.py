"""The simulated accelerator (mgpu.runtime.accelerator): real math, the device's time, the wait before the all-reduce.

These tests check behaviour, not speed: a sleep never ends early, so "a step lasted at least the
device's time" and "the all-reduce got the gradients only after it" hold on any machine.
"""

import json
import time

import numpy as np
import pytest
import tensorflow as tf

from mgpu.runtime import accelerator, launch


def test_profile_checks_its_numbers_and_travels_through_the_environment():
    profile = accelerator.Profile("dev", 0.002, 0.0005, basis="set by hand")
    assert profile.train_step_s(64) == pytest.approx(0.128) and profile.eval_step_s(32) == pytest.approx(0.016)
    env = profile.env({"OTHER": "1"})
    assert env["OTHER"] == "1" and accelerator.Profile.from_env(env) == profile
    assert accelerator.Profile.from_env({}) is None
    assert "dev" in profile.line() and "2.00 ms per image" in profile.line()
    for bad in (0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="train_s_per_example must be a positive number"):
            accelerator.Profile("dev", bad, 0.001)
    with pytest.raises(ValueError, match="does not hold a device profile"):
        accelerator.Profile.from_env({accelerator.PROFILE_VARIABLE: json.dumps({"name": "x"})})


def test_the_device_is_the_shared_math_slowed_by_the_margin():
    profile = accelerator.profile_from_rate("d", 0.002, 0.0006, workers=4, cores=2, margin=1.5)
    assert profile.train_s_per_example == pytest.approx(0.003) and profile.eval_s_per_example == pytest.approx(0.0009)
    assert "all 4 workers computing at once on this machine's 2 cores" in profile.basis
    with pytest.raises(ValueError, match="margin must be at least 1"):
        accelerator.profile_from_rate("d", 0.001, 0.001, workers=1, cores=1, margin=0.5)


def _tiny(seed=0):
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    model.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")


class _StepClock(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train, self.test = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self._t = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.train.append(time.perf_counter() - self._t)

    def on_test_batch_begin(self, batch, logs=None):
        self._e = time.perf_counter()

    def on_test_batch_end(self, batch, logs=None):
        self.test.append(time.perf_counter() - self._e)


def test_real_math_in_the_device_time_on_one_process():
    x, y = _data()
    profile = accelerator.Profile("dev", 0.0025, 0.001)  # 40 ms per training step of 16, 16 ms per test batch of 16
    plain = _tiny()
    plain.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    modelled, device, clock = _tiny(), accelerator.ModelledDevice(16, eval_batch=16, profile=profile), _StepClock()
    # The device's callback comes first: the clock's batch starts after it.
    modelled.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, validation_data=(x[:32], y[:32]),
                 validation_batch_size=16, callbacks=[device, clock])
    # The math is untouched: the same weights, bit for bit.
    for a, b in zip(plain.get_weights(), modelled.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert device.active and device.steps == 12 and len(clock.train) == 12
    # Every step and every test batch lasted at least the device's time (a sleep never ends early).
    assert min(clock.train) >= profile.train_step_s(16) and min(clock.test) >= profile.eval_step_s(16)
    assert device.waited_s > 0


def test_without_a_profile_or_on_a_gpu_nothing_changes(monkeypatch):
    monkeypatch.delenv(accelerator.PROFILE_VARIABLE, raising=False)
    device = accelerator.ModelledDevice(16)
    assert not device.active
    model = _tiny()
    compute = model.optimizer.compute_gradients
    model.fit(*_data(32), batch_size=16, epochs=1, verbose=0, callbacks=[device])
    assert device.steps == 0 and model.optimizer.compute_gradients == compute
    monkeypatch.setattr(accelerator, "_has_gpu", lambda: True)
    assert not accelerator.ModelledDevice(16, profile=accelerator.Profile("dev", 1.0, 1.0)).active
    with pytest.raises(ValueError, match="at least 1"):
        accelerator.ModelledDevice(0, profile=accelerator.Profile("dev", 1.0, 1.0))


def _two_workers(step_s):
    """Each rank records when its gradients reached Horovod's all-reduce, relative to the step's start."""
    import horovod.tensorflow.keras as hvd

    from mgpu.runtime import accelerator

    hvd.init()
    model = _tiny(seed=hvd.rank())  # different starts: the broadcast must make them equal
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9)),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    reached, starts = [], []
    inner = model.optimizer._allreduce

    def recorded(grads, variables):  # installed before the device's hook, so it runs after the wait
        with tf.control_dependencies([g for g in grads if g is not None]):
            mark = tf.py_function(lambda: reached.append(time.perf_counter()) or 0.0, [], tf.float32)
        with tf.control_dependencies([mark]):
            grads = [tf.identity(g) for g in grads]
        return inner(grads, variables)

    model.optimizer._allreduce = recorded

    class Start(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            starts.append(time.perf_counter())

    device = accelerator.ModelledDevice(16)
    x, y = _data(64, seed=hvd.rank())
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Start(), device])
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    every = hvd.allgather(tf.constant(flat[None, :])).numpy()
    return {"active": device.active, "steps": device.steps, "spread": float(np.abs(every - every[0]).max()),
            "delays": [r - s for r, s in zip(reached, starts)], "step_s": step_s}


def test_gradients_reach_the_all_reduce_only_after_the_device_time():
    profile = accelerator.Profile("dev", 0.05 / 16, 0.001)  # 50 ms per step of 16
    out = launch.run(_two_workers, 2, args=(profile.train_step_s(16),), env=profile.env(), verbose=False,
                     cores_per_worker=1).value
    assert out["active"] and out["steps"] == 4 and len(out["delays"]) == 4
    assert min(out["delays"]) >= out["step_s"], out["delays"]
    assert out["spread"] == 0.0  # the ranks stay in sync: the wait changes no number


def test_calibrate_times_the_workers_at_once():
    import functools

    from mgpu.runtime import models

    profile = accelerator.calibrate(functools.partial(models.mlp, hidden=(32,)), (28, 28), 10, batch=32,
                                    workers=2, cores=2, steps=3, margin=2)
    assert profile.name == "sim-mlp-2w2c" and "all 2 workers computing at once" in profile.basis
    assert "made 2x slower" in profile.basis  # the margin, said as the device's slowdown
    # Both were timed (a training step and a prediction); which is longer is a timing, not checked here.
    assert profile.train_s_per_example > 0 and profile.eval_s_per_example > 0
