"""Gradient compression on Horovod (notebook 07): a 2-bit all-reduce with error feedback, and the harness to train with it.

The notebook's learner writes the 2-bit scheme; the notebook's own solution is saved into the library
(:mod:`mgpu.lesson07.saved`, by :mod:`mgpu.runtime.saved`) and re-exported here, with what is needed
to train with it and to count its bytes:

- :func:`twobit_quantise`: one of 4 levels per value, ``(code - 1.5) * scale`` with ``scale`` the mean
  absolute value of the tensor (plus the residual carried from the last step), and the new residual;
- :func:`twobit_allreduce`: packs the codes four to a byte, ``hvd.allgather``\\ s the packed codes and
  the scales, and decodes and averages every worker's values on every worker;
- :func:`reference_codes`, :func:`pack_codes`, :func:`unpack_codes`: the same in numpy, to check it;
- :func:`wire_log` (from :mod:`mgpu.runtime.collectives`): records every tensor handed to Horovod's
  all-reduce, reduce-scatter and all-gather (dtype, shape, bytes): what each worker really puts on the wire;
- :class:`ErrorFeedback`: one gradient tensor's reducer holding its residual;
- :func:`train_with_compressors`: a hand-written Horovod training loop that trains one model per
  variant from the same initial weights and returns rank 0's report. Run it with :func:`mgpu.runtime.launch.run`.

Error feedback: Seide et al. 2014 (1-bit SGD); MXNet's ``--gc-type 2bit`` quantises to {-t, 0, +t}.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from mgpu.runtime.collectives import last_trace, wire_log

__all__ = ["twobit_quantise", "twobit_allreduce", "reference_codes", "pack_codes", "unpack_codes",
           "wire_bytes", "wire_log", "last_trace", "ErrorFeedback", "train_with_compressors"]

#: Bits per value of each scheme as the values travel: float32, float16, 2-bit codes.
BITS_PER_VALUE = {"float32": 32, "float16": 16, "2bit": 2}


# --------------------------------------------------------------------------------------------
# The 2-bit scheme in TensorFlow (runs inside a Horovod training step)


# Written in notebook 07 (its exercises) and saved from there by mgpu.runtime.saved: they exist once.
from mgpu.lesson07.saved import twobit_allreduce, twobit_quantise  # noqa: E402


# --------------------------------------------------------------------------------------------
# The same in numpy, to check it


def reference_codes(corrected, scale) -> np.ndarray:
    """Codes of :func:`twobit_quantise` for ``corrected`` (values + residual) and the scale used, in numpy."""
    c = np.asarray(corrected)
    s = c.dtype.type(scale)
    return ((c >= -s).astype(np.uint8) + (c >= 0) + (c >= s)).astype(np.uint8)


def pack_codes(codes) -> np.ndarray:
    """Codes in {0, 1, 2, 3}, four per byte (value 4b + k in bits 2k, 2k + 1 of byte b), as uint8."""
    flat = np.ravel(np.asarray(codes)).astype(np.uint8)
    if np.any(flat > 3):
        raise ValueError("a 2-bit code is 0, 1, 2 or 3")
    padded = np.zeros(4 * math.ceil(flat.size / 4), np.uint8)
    padded[:flat.size] = flat
    quads = padded.reshape(-1, 4)
    return (quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6).astype(np.uint8)


def unpack_codes(packed, n: int) -> np.ndarray:
    """:func:`pack_codes` undone: the first ``n`` codes."""
    packed = np.asarray(packed, np.uint8)
    if packed.size != math.ceil(n / 4):
        raise ValueError(f"{packed.size} bytes cannot hold {n} 2-bit codes")
    return np.stack([(packed >> shift) & 3 for shift in (0, 2, 4, 6)], axis=1).ravel()[:n]


def wire_bytes(sizes, scheme: str) -> int:
    """Bytes that tensors of ``sizes`` values take in ``scheme`` ("float32", "float16", "2bit").

    Each tensor is encoded on its own, so a 2-bit tensor rounds up to whole bytes (scales not counted).
    """
    bits = BITS_PER_VALUE[scheme]
    return sum(math.ceil(int(n) * bits / 8) for n in sizes)


# --------------------------------------------------------------------------------------------
# What goes on the wire


# --------------------------------------------------------------------------------------------
# Training


class ErrorFeedback:
    """One gradient tensor's 2-bit reducer: ``reducer(g)`` is the workers' average of ``g`` sent in 2 bits.

    With ``feedback`` it keeps the residual in a variable of the tensor's shape and carries it to the
    next step; without, the residual is dropped every step. ``allreduce(gradient, residual)`` returns
    ``(average, new_residual)`` (:func:`twobit_allreduce`, or the notebook's own).
    """

    def __init__(self, allreduce: Callable, variable, feedback: bool = True):
        import tensorflow as tf

        self.allreduce, self.feedback = allreduce, feedback
        self.residual = tf.Variable(tf.zeros(variable.shape, variable.dtype), trainable=False)

    def __call__(self, gradient):
        import tensorflow as tf

        average, residual = self.allreduce(gradient, self.residual if self.feedback else tf.zeros_like(gradient))
        if self.feedback:
            self.residual.assign(residual)
        return average


def train_with_compressors(variants: dict[str, Callable[[list], list]], *, train_images: int, val_images: int,
                           epochs: int, batch: int, lr: float, seeds=(0,), hidden=(128,),
                           verbose: bool = True) -> list[dict[str, Any]]:
    """Train one MLP per (seed, variant) on this Horovod worker's shard; return rank 0's reports.

    ``variants`` maps a name to a factory that takes the model's trainable variables and returns one
    item per variable (in the same order): a Horovod compressor (the gradient goes through
    ``hvd.allreduce(g, op=hvd.Average, compression=c)``, e.g. ``hvd.Compression.fp16``) or a callable
    that returns the workers' average of the gradient itself (an :class:`ErrorFeedback`). Every variant
    of one seed starts from the same weights (built from the seed, then broadcast from rank 0), sees the
    same batches in the same order, and uses plain SGD at ``lr``. ``batch`` is per worker. The report's
    ``wire_bytes_per_step`` is what one worker handed to Horovod per step (:func:`wire_log`).
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from mgpu.runtime import data, models

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    reports = []
    for seed in seeds:
        dataset = data.load("auto", seed=seed, verbose=False)
        x_train, y_train = dataset.x_train[:train_images], dataset.y_train[:train_images].astype(np.int32)
        x_val, y_val = dataset.x_test[:val_images], dataset.y_test[:val_images].astype(np.int32)
        global_batch = batch * size
        steps_per_epoch = len(x_train) // global_batch
        for name, factory in variants.items():
            model = models.mlp(dataset.x_train.shape[1:], dataset.num_classes, hidden=hidden, seed=seed)
            variables = model.trainable_variables
            hvd.broadcast_variables(model.variables, root_rank=0)
            reducers = list(factory(variables))
            if len(reducers) != len(variables):
                raise ValueError(f"variant {name!r}: {len(reducers)} compressors for {len(variables)} tensors")
            optimizer = tf.keras.optimizers.SGD(lr)
            loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

            def average(i, g, reducer):
                if hasattr(reducer, "compress"):
                    return hvd.allreduce(g, op=hvd.Average, compression=reducer, name=f"grad_{i}")
                return reducer(g)

            @tf.function
            def train_step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, variables)
                optimizer.apply_gradients(zip([average(i, g, r) for i, (g, r) in enumerate(zip(grads, reducers))],
                                              variables))
                return loss

            order_rng = np.random.default_rng([seed, 7])  # the same shuffles on every rank and variant
            started = time.perf_counter()
            accuracy_by_epoch, wire = [], None
            for _ in range(epochs):
                order = order_rng.permutation(len(x_train))
                for step in range(steps_per_epoch):
                    chosen = order[step * global_batch:(step + 1) * global_batch][rank::size]
                    if wire is None:  # the first call traces the step: record what it hands to Horovod
                        with wire_log() as wire:
                            train_step(tf.constant(x_train[chosen]), tf.constant(y_train[chosen]))
                    else:
                        train_step(tf.constant(x_train[chosen]), tf.constant(y_train[chosen]))
                logits = model.predict(x_val, batch_size=1000, verbose=0)
                accuracy_by_epoch.append(float(np.mean(np.argmax(logits, axis=1) == y_val)))
            seconds = time.perf_counter() - started
            spread = max(float(hvd.allreduce(tf.reduce_max(tf.abs(v - hvd.broadcast(v, 0))), op=hvd.Max))
                         for v in variables)
            report = {
                "seed": seed, "variant": name, "val_accuracy": accuracy_by_epoch[-1],
                "val_accuracy_by_epoch": accuracy_by_epoch,
                "wire_bytes_per_step": sum(e["bytes"] for e in last_trace(wire)),
                "wire": [{k: e[k] for k in ("op", "dtype", "shape", "bytes")} for e in last_trace(wire)],
                "values_per_step": sum(int(np.prod(v.shape)) for v in variables),
                "tensor_sizes": [int(np.prod(v.shape)) for v in variables],
                "weight_spread_across_ranks": spread,
                "steps": epochs * steps_per_epoch, "seconds": seconds, "workers": size,
            }
            reports.append(report)
            if verbose and rank == 0:
                print(f"seed {seed}, {name}: validation accuracy {report['val_accuracy']:.3f}", flush=True)
    return reports
