"""The shared Keras callbacks, driven by real (tiny) Keras training and by scripted logs."""

import csv
import math
import statistics
import time

import numpy as np
import pytest
import tensorflow as tf

from mgpu.runtime import callbacks


def _tiny_model():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


class _SlowBatches(tf.keras.callbacks.Callback):
    """Makes every batch take at least ``seconds`` so the expected throughput is known."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def test_throughput_counts_images_per_second_after_warm_up():
    x, y = _data(64)
    meter = callbacks.Throughput(images_per_batch=8, warmup_batches=2)
    history = _tiny_model().fit(x, y, batch_size=8, epochs=2, verbose=0,
                                callbacks=[_SlowBatches(0.05), meter])
    assert len(meter.history) == 2
    # 8 images per batch of at least 50 ms: never more than 160 images/s; the lower bound only
    # says the warm-up batches and the epoch's set-up were left out (loose: machines are shared).
    assert all(20 < rate <= 160 for rate in meter.history), meter.history
    assert history.history["images_per_s"] == meter.history
    assert meter.median == statistics.median(meter.history)


def test_throughput_of_an_all_warm_up_epoch_is_nan():
    x, y = _data(16)
    meter = callbacks.Throughput(images_per_batch=8, warmup_batches=5)
    _tiny_model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[meter])
    assert math.isnan(meter.history[0]) and math.isnan(meter.median)


def test_stop_at_accuracy_needs_consecutive_epochs():
    stopper = callbacks.StopAtAccuracy(target=0.75, consecutive=2)
    stopper.set_model(_tiny_model())
    stopper.on_train_begin()
    for epoch, accuracy in enumerate([0.5, 0.8, 0.7, 0.8, 0.9, 0.95]):
        stopper.on_epoch_end(epoch, {"val_accuracy": accuracy})
        if stopper.model.stop_training:
            break
    assert stopper.reached_epoch == 4 and epoch == 4
    assert stopper.reached_seconds is not None and stopper.reached_seconds >= 0


def test_stop_at_accuracy_in_real_training_and_when_never_reached():
    x, y = _data()
    reached = callbacks.StopAtAccuracy(target=0.0, consecutive=2, monitor="accuracy")
    history = _tiny_model().fit(x, y, epochs=10, verbose=0, callbacks=[reached])
    assert len(history.history["loss"]) == 2 and reached.reached_epoch == 1
    never = callbacks.StopAtAccuracy(target=1.01, monitor="accuracy")
    history = _tiny_model().fit(x, y, epochs=3, verbose=0, callbacks=[never])
    assert len(history.history["loss"]) == 3 and never.reached_epoch is None


def test_stop_at_accuracy_without_the_metric_says_what_to_do():
    stopper = callbacks.StopAtAccuracy(target=0.5)
    stopper.set_model(_tiny_model())
    stopper.on_train_begin()
    with pytest.raises(KeyError, match="pass validation data"):
        stopper.on_epoch_end(0, {"accuracy": 0.9})


def test_time_budget_stops_mid_epoch():
    x, y = _data(64)
    budget = callbacks.TimeBudget(seconds=0.2)
    clock = callbacks.TrainingClock()
    history = _tiny_model().fit(x, y, batch_size=8, epochs=50, verbose=0,
                                callbacks=[_SlowBatches(0.05), budget, clock])
    assert budget.exceeded
    assert len(history.history["loss"]) == 1  # stopped inside the first epoch (8 batches >= 0.4 s)
    assert clock.total >= 0.2


def test_csv_logger_writes_wall_time_rows_only_when_enabled(tmp_path):
    x, y = _data()
    clock = callbacks.TrainingClock()
    logger = callbacks.WallClockCSVLogger(tmp_path / "rank0.csv")
    silent = callbacks.WallClockCSVLogger(tmp_path / "rank1.csv", enabled=False)
    _tiny_model().fit(x, y, epochs=3, validation_data=(x, y), verbose=0,
                      callbacks=[clock, logger, silent])
    rows = list(csv.DictReader(open(tmp_path / "rank0.csv")))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    times = [float(r["wall_time"]) for r in rows]
    assert times == sorted(times) and times[0] > 0
    assert {"loss", "accuracy", "val_accuracy"} <= set(rows[0])
    assert not (tmp_path / "rank1.csv").exists()
    assert len(clock.epoch_times) == 3 and clock.total >= clock.epoch_times[-1]


class _SlowFirstBatch(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 0 and not getattr(self, "done", False):
            self.done = True
            time.sleep(1.0)


def test_csv_logger_can_start_its_clock_after_the_first_step(tmp_path):
    x, y = _data()
    plain = callbacks.WallClockCSVLogger(tmp_path / "plain.csv")
    after = callbacks.WallClockCSVLogger(tmp_path / "after.csv", first_step_s=0.25)
    _tiny_model().fit(x, y, epochs=2, verbose=0, callbacks=[_SlowFirstBatch(), plain, after])
    first = {name: float(next(csv.DictReader(open(tmp_path / f"{name}.csv")))["wall_time"]) for name in ("plain", "after")}
    assert first["plain"] >= 1.0  # the slow first step counts
    assert 0.25 <= first["after"] < first["plain"] - 0.7  # counted as 0.25 s instead of its 1 s


class _RecordRate(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))


def test_cosine_decay_leaves_the_warm_up_alone_then_falls_to_zero_in_real_training():
    model = _tiny_model()
    tf.keras.backend.set_value(model.optimizer.learning_rate, 0.3)
    x, y = _data(64)
    record = _RecordRate()  # after the decay in the list: sees the rate the batch trains with
    model.fit(x, y, batch_size=16, epochs=3, verbose=0,
              callbacks=[callbacks.CosineDecay(0.4, start_epoch=1, end_epoch=3, steps_per_epoch=4), record])
    assert record.rates[:4] == pytest.approx([0.3] * 4)  # before start_epoch: untouched
    expected = [0.4 * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)]
    assert record.rates[4:] == pytest.approx(expected, rel=1e-5)
    assert record.rates[4] == pytest.approx(0.4) and record.rates[-1] < 0.4 * 0.05


def test_cosine_decay_of_a_run_that_ends_before_it_starts_changes_nothing():
    decay = callbacks.CosineDecay(0.4, start_epoch=1, end_epoch=1, steps_per_epoch=4)
    assert decay.rate(0.5) is None and decay.rate(1.0) is None and decay.rate(5.0) is None
