"""Gradient compression on Horovod (notebook 07): the harness around the compressors the notebook writes.

The notebook writes the compressors themselves (a 2-bit quantiser with error feedback as a
subclass of Horovod's ``Compressor``; Seide et al. 2014; MXNet's ``--gc-type 2bit``). This module
holds what is needed to train with them and to count their bytes:

- :func:`pack_2bit` / :func:`unpack_2bit`: values in {-t, 0, +t} as 2-bit codes, four to a byte,
  the encoding a 2-bit scheme sends; :func:`wire_bytes` counts bytes per scheme;
- :class:`Measured`: wraps a compressor and records, while the training step is traced, the
  shape and dtype of what it hands to Horovod's all-reduce (what Horovod really transmits), and
  counts the non-zero values it sent;
- :func:`train_with_compressors`: a hand-written Horovod training loop (one ``hvd.allreduce``
  per gradient tensor, each with its own compressor, so a compressor may keep per-tensor state)
  that trains one model per variant from the same initial weights and returns rank 0's report.
  Run it with :func:`mgpu.launch.run`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

__all__ = ["pack_2bit", "unpack_2bit", "wire_bytes", "Measured", "train_with_compressors"]

#: Bits per value of each scheme as the values would travel: float32, float16, 2-bit codes.
BITS_PER_VALUE = {"float32": 32, "float16": 16, "2bit": 2}


def pack_2bit(values: np.ndarray, threshold: float) -> bytes:
    """Encode values in {-t, 0, +t} as 2-bit codes (0: zero, 1: +t, 2: -t), four per byte.

    Raises if a value is not one of the three: this is an encoding, not a quantiser.
    """
    flat = np.ravel(np.asarray(values))
    if not np.issubdtype(flat.dtype, np.floating):
        flat = flat.astype(np.float32)
    t = flat.dtype.type(threshold)  # the threshold as the values hold it (0.01 in float32 is not 0.01)
    codes = np.zeros(flat.size, dtype=np.uint8)
    codes[flat == t] = 1
    codes[flat == -t] = 2
    stray = (flat != 0) & (flat != t) & (flat != -t)
    if np.any(stray):
        raise ValueError(f"{int(stray.sum())} value(s) are not in {{-t, 0, +t}} for t = {threshold}, "
                         f"e.g. {flat[stray][0]!r}: quantise first")
    padded = np.zeros(4 * math.ceil(flat.size / 4), dtype=np.uint8)
    padded[:flat.size] = codes
    quads = padded.reshape(-1, 4)
    packed = quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)
    return packed.astype(np.uint8).tobytes()


def unpack_2bit(payload: bytes, threshold: float, shape) -> np.ndarray:
    """Decode :func:`pack_2bit`'s bytes into float32 values of ``shape``."""
    size = int(np.prod(shape))
    packed = np.frombuffer(payload, dtype=np.uint8)
    if packed.size != math.ceil(size / 4):
        raise ValueError(f"{packed.size} bytes cannot hold {size} 2-bit values")
    codes = np.stack([(packed >> shift) & 3 for shift in (0, 2, 4, 6)], axis=1).ravel()[:size]
    if np.any(codes == 3):
        raise ValueError("code 3 is not used by this encoding: the payload is corrupt")
    table = np.array([0.0, threshold, -threshold, 0.0], dtype=np.float32)
    return table[codes].reshape(shape)


def wire_bytes(sizes, scheme: str) -> int:
    """Bytes that tensors of ``sizes`` values take in ``scheme`` ("float32", "float16", "2bit").

    Each tensor is encoded on its own, so a 2-bit tensor rounds up to whole bytes.
    """
    bits = BITS_PER_VALUE[scheme]
    return sum(math.ceil(int(n) * bits / 8) for n in sizes)


class Measured:
    """A compressor wrapped to record what it hands to Horovod.

    ``values`` and ``bytes`` are the size of the tensor it hands to Horovod's all-reduce, read from
    its shape and dtype when the training step is traced (wrap one compressor per gradient tensor).
    ``nonzero`` and ``total`` count, over all steps, the values sent and how many were not zero.
    """

    def __init__(self, inner):
        import tensorflow as tf

        self.inner = inner
        self.values = self.bytes = None
        self.nonzero = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.total = tf.Variable(0, dtype=tf.int64, trainable=False)

    def compress(self, tensor):
        import tensorflow as tf

        compressed, ctx = self.inner.compress(tensor)
        n = int(np.prod(compressed.shape))
        self.values, self.bytes = n, n * compressed.dtype.size
        self.nonzero.assign_add(tf.math.count_nonzero(compressed, dtype=tf.int64))
        self.total.assign_add(tf.cast(tf.size(compressed), tf.int64))
        return compressed, ctx

    def decompress(self, tensor, ctx):
        return self.inner.decompress(tensor, ctx)


def train_with_compressors(variants: dict[str, Callable[[list], list]], *, train_images: int, val_images: int,
                           epochs: int, batch: int, lr: float, seeds=(0,), hidden=(128,),
                           verbose: bool = True) -> list[dict[str, Any]]:
    """Train one MLP per (seed, variant) on this Horovod worker's shard; return rank 0's reports.

    ``variants`` maps a name to a factory that takes the model's trainable variables and returns
    one Horovod compressor per variable (in the same order), e.g. ``lambda vs: [hvd.Compression.fp16] * len(vs)``.
    Every variant of one seed starts from the same weights (built from the seed, then broadcast from
    rank 0), sees the same batches in the same order, and uses plain SGD at ``lr`` on the average of
    the workers' gradients, each gradient all-reduced with its own compressor. ``batch`` is per worker.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from mgpu import data, models

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
            compressors = [Measured(c) for c in factory(variables)]
            if len(compressors) != len(variables):
                raise ValueError(f"variant {name!r}: {len(compressors)} compressors for {len(variables)} tensors")
            optimizer = tf.keras.optimizers.SGD(lr)
            loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

            @tf.function
            def train_step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, variables)
                averaged = [hvd.allreduce(g, op=hvd.Average, compression=c, name=f"grad_{i}")
                            for i, (g, c) in enumerate(zip(grads, compressors))]
                optimizer.apply_gradients(zip(averaged, variables))
                return loss

            order_rng = np.random.default_rng([seed, 7])  # the same shuffles on every rank and variant
            started = time.perf_counter()
            accuracy_by_epoch = []
            for _ in range(epochs):
                order = order_rng.permutation(len(x_train))
                for step in range(steps_per_epoch):
                    chosen = order[step * global_batch:(step + 1) * global_batch][rank::size]
                    train_step(tf.constant(x_train[chosen]), tf.constant(y_train[chosen]))
                logits = model.predict(x_val, batch_size=1000, verbose=0)
                accuracy_by_epoch.append(float(np.mean(np.argmax(logits, axis=1) == y_val)))
            seconds = time.perf_counter() - started
            spread = max(float(hvd.allreduce(tf.reduce_max(tf.abs(v - hvd.broadcast(v, 0))), op=hvd.Max))
                         for v in variables)
            sizes = [c.values for c in compressors]
            report = {
                "seed": seed, "variant": name, "val_accuracy": accuracy_by_epoch[-1],
                "val_accuracy_by_epoch": accuracy_by_epoch,
                "allreduce_bytes_per_step": sum(c.bytes for c in compressors),
                "values_per_step": sum(sizes),
                "tensor_sizes": sizes,
                "nonzero_fraction": float(sum(int(c.nonzero.numpy()) for c in compressors))
                / max(1, sum(int(c.total.numpy()) for c in compressors)),
                "weight_spread_across_ranks": spread,
                "steps": epochs * steps_per_epoch, "seconds": seconds, "workers": size,
            }
            reports.append(report)
            if verbose and rank == 0:
                print(f"seed {seed}, {name}: validation accuracy {report['val_accuracy']:.3f} "
                      f"({report['seconds']:.0f} s)", flush=True)
    return reports
