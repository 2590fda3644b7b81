"""Measuring speed the same way everywhere: warm-up excluded, several repetitions, the median.

:func:`measure_rate` times a callable that processes a known number of items per call (images per
training step, say). The first ``warmup`` calls are run but not timed (graph tracing, allocation,
caches filling), then ``repeats`` timed rounds of ``calls_per_round`` calls each give one rate per
round; the result keeps them all and reports the median, which one slow round (another process
on a shared machine) does not move.

:func:`flops_per_image` counts the multiply-accumulates of a Keras model's convolution and dense
layers from their shapes (2 FLOPs each), the usual way papers state a network's cost.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Rate:
    """Items per second over several timed rounds."""

    rounds: list[float] = field(default_factory=list)  # items/s per round
    seconds_per_call: list[float] = field(default_factory=list)  # per round

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def spread(self) -> float:
        """(max - min) / median: how much the rounds disagree."""
        return (max(self.rounds) - min(self.rounds)) / self.median

    def __str__(self) -> str:
        return f"{self.median:,.1f}/s (median of {len(self.rounds)}, spread {self.spread:.0%})"


def measure_rate(call: Callable[[], object], items_per_call: int, *, warmup: int = 2,
                 repeats: int = 5, calls_per_round: int = 1,
                 clock: Callable[[], float] = time.perf_counter) -> Rate:
    """Run ``call`` ``warmup`` times untimed, then ``repeats`` timed rounds; items per second."""
    if items_per_call <= 0 or repeats < 1 or calls_per_round < 1 or warmup < 0:
        raise ValueError("items_per_call, repeats and calls_per_round must be positive, warmup >= 0")
    for _ in range(warmup):
        call()
    rate = Rate()
    for _ in range(repeats):
        start = clock()
        for _ in range(calls_per_round):
            call()
        elapsed = clock() - start
        if elapsed <= 0:
            raise RuntimeError("the clock did not advance during a round: use more calls_per_round")
        rate.rounds.append(items_per_call * calls_per_round / elapsed)
        rate.seconds_per_call.append(elapsed / calls_per_round)
    return rate


def measure_side_by_side(calls: dict[str, Callable[[], object]], items_per_call: int, *, warmup: int = 2,
                         repeats: int = 5, calls_per_round: int = 1,
                         clock: Callable[[], float] = time.perf_counter) -> dict[str, Rate]:
    """Like :func:`measure_rate` for several callables, their rounds interleaved (A B A B ...).

    A machine that slows down part-way (another process starts) slows every callable alike, so
    ratios between them stay fair: compare ``rates[a].median / rates[b].median``.
    """
    if not calls:
        raise ValueError("nothing to measure")
    for call in calls.values():
        for _ in range(warmup):
            call()
    rates = {name: Rate() for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            one = measure_rate(call, items_per_call, warmup=0, repeats=1,
                               calls_per_round=calls_per_round, clock=clock)
            rates[name].rounds += one.rounds
            rates[name].seconds_per_call += one.seconds_per_call
    return rates


def flops_by_layer(model) -> dict[str, int]:
    """Forward-pass FLOPs of one image in each Conv2D and Dense layer of a Keras model.

    Counts 2 x multiply-accumulates: Conv2D ``out_h * out_w * out_c * k_h * k_w * in_c / groups``,
    Dense ``in * out``. Pooling, activations, normalisation and biases are left out (they are a
    few percent of a CNN's work); a training step costs about three forward passes.
    """
    import tensorflow as tf

    counts = {}
    for layer in _leaf_layers(model):
        if isinstance(layer, tf.keras.layers.Conv2D):
            _, out_h, out_w, out_c = layer.output.shape
            in_c = layer.input.shape[-1]
            k_h, k_w = layer.kernel_size
            counts[layer.name] = 2 * out_h * out_w * out_c * k_h * k_w * in_c // layer.groups
        elif isinstance(layer, tf.keras.layers.Dense):
            fan_in = layer.input.shape[-1]
            positions = 1
            for dim in layer.input.shape[1:-1]:
                positions *= dim
            counts[layer.name] = 2 * positions * fan_in * layer.units
    return {name: int(count) for name, count in counts.items()}


def flops_per_image(model) -> int:
    """Forward-pass FLOPs of one image through a Keras model (the sum of :func:`flops_by_layer`)."""
    return sum(flops_by_layer(model).values())


def _leaf_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:
            yield from _leaf_layers(layer)
        else:
            yield layer


def call_times(build_model, widths, batch_sizes, devices, *, samples: int = 100, repeats: int = 5,
               calls_per_round: int = 20) -> dict:
    """Seconds per training call of small Dense models, by device, width and batch size.

    ``build_model(width)`` returns an uncompiled Keras model taking 1 feature. Each call is one
    ``train_on_batch`` on ``batch`` of ``samples`` points. Returns
    ``{device: {width: {batch: median seconds per call}}}``: what a fixed per-call cost (Python,
    kernel launches, host-device copies) does to tiny models.
    """
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 1)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    table: dict = {}
    for device in devices:
        table[device] = {}
        for width in widths:
            table[device][width] = {}
            with tf.device(device):
                model = build_model(width)
                model.compile(tf.keras.optimizers.SGD(0.01),
                              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                for batch in batch_sizes:
                    xb, yb = x[:batch], y[:batch]
                    rate = measure_rate(lambda: model.train_on_batch(xb, yb), batch, warmup=3,
                                        repeats=repeats, calls_per_round=calls_per_round)
                    table[device][width][batch] = statistics.median(rate.seconds_per_call)
    return table


def crossover_batch(cpu: dict, gpu: dict) -> int | None:
    """The smallest batch from which the GPU's call is faster than the CPU's (None if never)."""
    for batch in sorted(cpu):
        if batch in gpu and gpu[batch] < cpu[batch]:
            return batch
    return None
