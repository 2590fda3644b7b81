"""Horovod's metric averaging, as notebook 04 teaches it: the logged metric is the mean over ranks."""

import numpy as np
import pytest

from mgpu import launch

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
