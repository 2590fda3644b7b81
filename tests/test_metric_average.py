"""Horovod's Keras callbacks on real workers: metric averaging (notebook 04) and the learning-rate warm-up
(notebooks 04 and 05). On the current stack they need the course's patch to Horovod (Keras 2 backend)."""

import numpy as np
import pytest

from mgpu.runtime import launch

pytestmark = pytest.mark.slow


def _log_rank_dependent_metric():
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()

    class RankMetric(tf.keras.callbacks.Callback):
        """Puts a per-rank value in the logs before Horovod's averaging callback runs."""

        def on_epoch_end(self, epoch, logs=None):
            logs["rank_value"] = float(10 * hvd.rank() + epoch)

    seen = []

    class Record(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(logs["rank_value"])

    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), "mse")
    x = np.ones((8, 2), np.float32)
    model.fit(x, x[:, :1], epochs=2, verbose=0,
              callbacks=[RankMetric(), hvd.callbacks.MetricAverageCallback(), Record()])
    return {"seen": seen, "size": hvd.size()}


def test_metric_average_callback_logs_the_mean_over_ranks():
    value = launch.run(_log_rank_dependent_metric, 3, verbose=False).value
    ranks = np.arange(value["size"])
    expected = [float(np.mean(10 * ranks + epoch)) for epoch in range(2)]
    assert value["seen"] == pytest.approx(expected)  # rank 0 sees the mean, not its own value


def _warm_up_over_two_epochs():
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    rates = []

    class RecordRate(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            rates.append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))

    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.4)), "mse")
    x = np.ones((16, 2), np.float32)
    warm_up = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2, steps_per_epoch=4, verbose=0)
    model.fit(x, x[:, :1], batch_size=4, epochs=3, verbose=0, callbacks=[warm_up, RecordRate()])
    return {"rates": rates, "size": hvd.size()}


def test_warm_up_callback_ramps_from_the_one_worker_rate_to_the_scaled_rate():
    value = launch.run(_warm_up_over_two_epochs, 2, verbose=False).value
    rates = np.array(value["rates"])
    assert len(rates) == 12
    one_worker = 0.4 / value["size"]
    assert one_worker <= rates[0] < 1.2 * one_worker  # starts at the one-worker rate (after one step of ramp)
    assert np.all(np.diff(rates[:8]) > 0)  # climbs batch by batch during the two warm-up epochs
    assert rates[8:] == pytest.approx(0.4)  # then holds the scaled rate
