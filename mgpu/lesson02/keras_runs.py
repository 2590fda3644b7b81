"""Keras ``model.fit`` runs timed with the course callbacks: throughput and time-to-accuracy.

These are the measurements a learner makes on any Keras model before going multi-GPU:

* :func:`throughput_by_batch` trains a model for a short while at each batch size with the
  :class:`~mgpu.runtime.callbacks.Throughput` callback and returns images per second (best of a few epochs);
* :func:`time_to_accuracy` trains at each batch size until the validation accuracy reaches a
  target (:class:`~mgpu.runtime.callbacks.StopAtAccuracy` with a :class:`~mgpu.runtime.callbacks.TrainingClock`),
  within a :class:`~mgpu.runtime.callbacks.TimeBudget`, logging each epoch with
  :class:`~mgpu.runtime.callbacks.WallClockCSVLogger`.

``build`` is a function returning a compiled model (a fresh one per batch size, from one seed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mgpu.runtime import callbacks, paths

__all__ = ["throughput_by_batch", "time_to_accuracy", "TimeToAccuracy"]


def throughput_by_batch(build: Callable, x: np.ndarray, y: np.ndarray, batch_sizes,
                        min_batches: int = 12, min_images: int = 4096, epochs: int = 2,
                        rounds: int = 2) -> dict[int, float]:
    """Images/s at each batch size: the best epoch of ``rounds`` x ``epochs`` short epochs.

    Each epoch has at least ``min_batches`` batches and ``min_images`` images (examples are
    repeated if ``x`` is too small), so large batches are timed over several steps too; the first
    two batches of every epoch are left out (:class:`~mgpu.runtime.callbacks.Throughput`). The rounds go
    over all batch sizes in turn and the best epoch is kept: on a shared machine other programs
    can only slow an epoch down, so the fastest one is the best estimate of what the hardware does.
    """
    out = {int(b): 0.0 for b in batch_sizes}
    for _ in range(rounds):
        for b in batch_sizes:
            n = max(min_images, min_batches * b)
            index = np.arange(n) % len(x)
            model = build()
            meter = callbacks.Throughput(images_per_batch=b, warmup_batches=2)
            model.fit(x[index], y[index], batch_size=b, epochs=epochs, shuffle=False, verbose=0,
                      callbacks=[meter])
            measured = [r for r in meter.history if not math.isnan(r)]
            out[int(b)] = max([out[int(b)], *measured])
    return out


@dataclass
class TimeToAccuracy:
    """One batch size's run to the target."""

    batch_size: int
    reached: bool
    seconds: float        # wall time to the target (or the whole run if not reached)
    epochs: int           # epochs run (to the target, if reached)
    val_accuracy: list    # per epoch
    wall_times: list      # per epoch, seconds since training began
    eval_seconds: float = math.nan         # of ``seconds``: evaluating the validation set after each epoch
    first_epoch_seconds: float = math.nan  # of ``seconds``: the first epoch's training (graph tracing included)


class _EvaluationClock(callbacks.TrainingClock):
    """Wall time spent in each epoch's validation (``fit`` calls ``on_test_begin``/``on_test_end``)."""

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.eval_times: list[float] = []
        self._eval_start = None

    def on_test_begin(self, logs=None):
        self._eval_start = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._eval_start is not None:
            self.eval_times.append(time.perf_counter() - self._eval_start)
            self._eval_start = None


def time_to_accuracy(build: Callable, x: np.ndarray, y: np.ndarray, x_val: np.ndarray,
                     y_val: np.ndarray, batch_sizes, target: float, max_epochs: int,
                     budget_seconds: float, log_name: str = "02_time_to_accuracy") -> list[TimeToAccuracy]:
    """Train a fresh model at each batch size until ``val_accuracy >= target`` (or the caps).

    Per-epoch CSV logs go to ``build/logs/<log_name>_b<batch>.csv``. ``seconds`` is wall time from the
    start of ``fit``, so it includes graph tracing (in the first epoch) and the validation after every
    epoch; :attr:`TimeToAccuracy.eval_seconds` and :attr:`TimeToAccuracy.first_epoch_seconds` say how much.
    """
    runs = []
    for b in batch_sizes:
        model = build()
        clock = _EvaluationClock()
        stop = callbacks.StopAtAccuracy(target, monitor="val_accuracy", clock=clock)
        budget = callbacks.TimeBudget(budget_seconds)
        logger = callbacks.WallClockCSVLogger(paths.build_dir() / "logs" / f"{log_name}_b{b}.csv")
        history = model.fit(x, y, batch_size=b, epochs=max_epochs, validation_data=(x_val, y_val),
                            verbose=0, callbacks=[clock, stop, budget, logger])
        acc = [float(v) for v in history.history["val_accuracy"]]
        reached = stop.reached_epoch is not None
        epochs = (stop.reached_epoch + 1) if reached else len(acc)
        first_epoch = (clock.epoch_times[0] - clock.eval_times[0]
                       if clock.epoch_times and clock.eval_times else math.nan)
        runs.append(TimeToAccuracy(
            int(b), reached,
            stop.reached_seconds if reached else (clock.total or math.nan),
            epochs, acc, list(clock.epoch_times),
            eval_seconds=float(sum(clock.eval_times[:epochs])), first_epoch_seconds=float(first_epoch)))
    return runs
