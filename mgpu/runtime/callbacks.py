"""Keras callbacks the labs and the assessment share: throughput, time, targets and logs.

- :class:`Throughput` measures images per second per epoch, leaving out warm-up batches.
- :class:`TrainingClock` records the wall time since training began at every epoch end.
- :class:`StopAtAccuracy` stops when a metric stays at or above a target for N consecutive
  epochs (the assessment's criterion), and records when that happened.
- :class:`TimeBudget` stops training when the wall-clock budget is spent.
- :class:`CosineDecay` lowers the learning rate to zero along half a cosine, batch by batch, after
  any warm-up.
- :class:`WallClockCSVLogger` writes one CSV row per epoch with the wall time, for plots of
  accuracy against time; in a Horovod run only rank 0 should write (``enabled=hvd.rank() == 0``).

They use only Keras 2 callback hooks, so they work unchanged under Horovod (each worker runs its own
copy; average metrics across workers first with Horovod's ``MetricAverageCallback``).
"""

from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path

import tensorflow as tf


class Throughput(tf.keras.callbacks.Callback):
    """Images per second in each epoch, from batch timings after ``warmup_batches`` batches.

    ``images_per_batch`` is the number of images one step processes (in a Horovod run, the global
    batch: the per-worker batch times the number of workers). The epoch's figure is added to the
    logs as ``images_per_s`` and kept in :attr:`history`.
    """

    def __init__(self, images_per_batch: int, warmup_batches: int = 2):
        super().__init__()
        if images_per_batch <= 0:
            raise ValueError(f"images_per_batch must be positive, got {images_per_batch}")
        self.images_per_batch = images_per_batch
        self.warmup_batches = warmup_batches
        self.history: list[float] = []
        self._marks: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._marks = [time.perf_counter()]  # epoch start, then every batch end

    def on_train_batch_end(self, batch, logs=None):
        self._marks.append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        timed = self._marks[self.warmup_batches:]  # from the end of the last warm-up batch
        if len(timed) >= 2:
            rate = (len(timed) - 1) * self.images_per_batch / (timed[-1] - timed[0])
        else:
            rate = math.nan  # the epoch was all warm-up
        self.history.append(rate)
        if logs is not None:
            logs["images_per_s"] = rate

    @property
    def median(self) -> float:
        """The median over epochs that have a measurement (NaN if none)."""
        values = sorted(v for v in self.history if not math.isnan(v))
        if not values:
            return math.nan
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


class TrainingClock(tf.keras.callbacks.Callback):
    """Wall time since ``on_train_begin``: :attr:`epoch_times` (seconds at each epoch end)."""

    def __init__(self):
        super().__init__()
        self.start: float | None = None
        self.epoch_times: list[float] = []
        self.total: float | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start if self.start is not None else 0.0

    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()
        self.epoch_times = []
        self.total = None

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_times.append(self.elapsed())
        if logs is not None:
            logs["wall_time"] = self.epoch_times[-1]

    def on_train_end(self, logs=None):
        self.total = self.elapsed()


class StopAtAccuracy(tf.keras.callbacks.Callback):
    """Stop once ``monitor`` >= ``target`` for ``consecutive`` epochs in a row.

    After training, :attr:`reached_epoch` is the (0-based) epoch that completed the streak and
    :attr:`reached_seconds` the wall time then (None if never reached).
    """

    def __init__(self, target: float, monitor: str = "val_accuracy", consecutive: int = 1,
                 clock: TrainingClock | None = None):
        super().__init__()
        if consecutive < 1:
            raise ValueError(f"consecutive must be at least 1, got {consecutive}")
        self.target, self.monitor, self.consecutive = target, monitor, consecutive
        self.clock = clock
        self.streak = 0
        self.reached_epoch: int | None = None
        self.reached_seconds: float | None = None
        self._started = None

    def on_train_begin(self, logs=None):
        self.streak, self.reached_epoch, self.reached_seconds = 0, None, None
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.monitor not in logs:
            raise KeyError(f"StopAtAccuracy monitors {self.monitor!r}, but the logs only have "
                           f"{sorted(logs)}: pass validation data or choose another metric")
        self.streak = self.streak + 1 if logs[self.monitor] >= self.target else 0
        if self.streak >= self.consecutive and self.reached_epoch is None:
            self.reached_epoch = epoch
            self.reached_seconds = (self.clock.elapsed() if self.clock is not None
                                    else time.perf_counter() - self._started)
            self.model.stop_training = True


class TimeBudget(tf.keras.callbacks.Callback):
    """Stop training at the first batch end after ``seconds`` of wall time; :attr:`exceeded`."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.exceeded = False

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()
        self.exceeded = False

    def on_train_batch_end(self, batch, logs=None):
        if time.perf_counter() - self._start > self.seconds:
            self.exceeded = True
            self.model.stop_training = True


def half_cosine(epoch: float, start: float, end: float) -> float:
    """The fraction of its rate a half-cosine decay keeps at (fractional) ``epoch``: 1 at ``start``,
    0 at ``end`` and after (Loshchilov & Hutter 2017)."""
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (epoch - start) / (end - start))))


class CosineDecay(tf.keras.callbacks.Callback):
    """From ``start_epoch`` on, the learning rate falls from ``lr`` to 0 at ``end_epoch`` along half a
    cosine (Loshchilov & Hutter 2017), set before every batch; before ``start_epoch`` it is left to
    whatever sets it there (a warm-up), and a run that ends by ``start_epoch`` never decays. Epochs
    may be fractional."""

    def __init__(self, lr: float, start_epoch: float, end_epoch: float, steps_per_epoch: int):
        super().__init__()
        self.lr, self.start, self.end, self.steps = float(lr), float(start_epoch), float(end_epoch), int(steps_per_epoch)
        self._epoch = 0

    def rate(self, epoch: float) -> float | None:
        """The rate at (fractional) ``epoch``; None before the decay starts."""
        if epoch < self.start or self.end <= self.start:
            return None
        return self.lr * half_cosine(epoch, self.start, self.end)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        rate = self.rate(self._epoch + batch / self.steps)
        if rate is not None:
            tf.keras.backend.set_value(self.model.optimizer.learning_rate, rate)


class WallClockCSVLogger(tf.keras.callbacks.Callback):
    """One CSV row per epoch: ``epoch``, ``epochs_done``, ``wall_time`` (s since training began), then the logs.

    ``epochs_done`` is ``(epoch + 1) / parts_per_epoch``: the passes over the data done, where each of
    Keras' epochs is a part of one (a run validated several times per pass). Rows are flushed as they
    are written, so a run that is stopped keeps what it logged. With ``enabled=False`` (Horovod ranks
    other than 0) nothing is written. With ``first_step_s`` the clock starts again when the first
    training step ends, counting that step as ``first_step_s`` (it traces the graph, and Horovod
    broadcasts the weights after it: one-off costs of the framework, not of the device).
    """

    def __init__(self, path: str | os.PathLike, enabled: bool = True, parts_per_epoch: int = 1,
                 first_step_s: float | None = None):
        super().__init__()
        self.path = Path(path)
        self.enabled = enabled
        self.parts_per_epoch = parts_per_epoch
        self.first_step_s = first_step_s
        self._file = None
        self._writer = None
        self._columns: list[str] | None = None

    def on_train_batch_end(self, batch, logs=None):
        if self.first_step_s is not None and not self._restarted:
            self._start, self._restarted = time.perf_counter() - self.first_step_s, True

    def on_train_begin(self, logs=None):
        self._start, self._restarted = time.perf_counter(), False
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", newline="")
            self._columns = None

    def on_epoch_end(self, epoch, logs=None):
        if not self.enabled:
            return
        logs = {k: float(v) for k, v in (logs or {}).items() if k != "wall_time"}
        if self._columns is None:
            self._columns = ["epoch", "epochs_done", "wall_time", *sorted(logs)]
            self._writer = csv.DictWriter(self._file, fieldnames=self._columns, extrasaction="ignore")
            self._writer.writeheader()
        self._writer.writerow({"epoch": epoch, "epochs_done": (epoch + 1) / self.parts_per_epoch,
                               "wall_time": time.perf_counter() - self._start, **logs})
        self._file.flush()

    def on_train_end(self, logs=None):
        if self._file is not None:
            self._file.close()
            self._file = None
