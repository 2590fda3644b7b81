"""What a data-parallel step spends its time on, measured inside real Horovod workers (notebook 04).

Run these with :func:`mgpu.runtime.launch.run` (they call ``hvd.init()`` themselves and return rank 0's
result):

- :func:`allreduce_check`: every rank contributes a random vector; Horovod sums them, and rank 0
  returns all the inputs and Horovod's sum, so the notebook can redo the sum with the ring
  all-reduce of :mod:`mgpu.lesson04.allreduce` and compare.
- :func:`step_costs`: a training loop written out by hand so that its two halves can be timed
  apart: computing the gradients (forward and backward pass) and averaging them across the
  workers (one ``hvd.allreduce`` per gradient tensor, as ``DistributedOptimizer`` does, so tensor
  fusion applies). Steps alternate between no compression and fp16 compression, so both see the
  same machine load. Each step also records every worker's own squared gradient norm (batch
  ``b``) and the squared norm of the averaged gradient (batch ``b * size``): the two-batch estimate
  of the gradient noise scale (:mod:`mgpu.lesson02.noise_scale`) comes for free.
"""

from __future__ import annotations

import time

import numpy as np


def allreduce_check(length: int, seed: int) -> dict:
    """Each rank draws a float32 vector; returns every input and ``hvd.allreduce`` (sum) on rank 0."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    vector = np.random.default_rng([seed, hvd.rank()]).normal(size=length).astype(np.float32)
    summed = hvd.allreduce(tf.constant(vector), op=hvd.Sum).numpy()
    inputs = hvd.allgather(tf.constant(vector[None, :])).numpy()
    return {"size": hvd.size(), "inputs": inputs, "horovod_sum": summed}


def step_costs_by_batch(batches, noise_steps: int = 0, **kwargs) -> dict:
    """:func:`step_costs` for each per-worker batch size in ``batches``, in one Horovod job.

    Only the first batch size gets the extra ``noise_steps``.
    """
    return {b: step_costs(batch=b, noise_steps=noise_steps if i == 0 else 0, **kwargs)
            for i, b in enumerate(batches)}


def step_costs(*, width: int, blocks: int, batch: int, steps: int, warmup: int = 2, lr: float = 0.05,
               train_images: int = 8192, seed: int = 0, noise_steps: int = 0) -> dict:
    """Time gradient computation and all-reduce per step; log per-worker and averaged gradient norms.

    ``steps`` steps of each kind (uncompressed and fp16) are timed after ``warmup`` untimed ones;
    ``noise_steps`` further uncompressed steps only add gradient norms to the noise-scale estimate
    (which is noisy: it wants tens of steps). Returns rank 0's median seconds per step for each
    part, the gradient size in bytes and the noise-scale estimate from the uncompressed steps.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from mgpu.lesson02 import noise_scale
    from mgpu.runtime import data, models

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    dataset = data.load("auto", seed=seed, verbose=False)
    x = dataset.x_train[:train_images][rank::size]
    y = dataset.y_train[:train_images][rank::size]
    model = models.small_resnet(x.shape[1:], len(dataset.class_names), width=width, blocks=blocks, seed=seed)
    hvd.broadcast_variables(model.variables, root_rank=0)
    optimizer = tf.keras.optimizers.SGD(lr, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, variables)
        return grads, tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads])

    def averager(compression):
        @tf.function
        def average(grads):
            reduced = [hvd.allreduce(g, op=hvd.Average, compression=compression) for g in grads]
            return reduced, tf.add_n([tf.reduce_sum(tf.square(g)) for g in reduced])
        return average

    kinds = {"none": averager(hvd.Compression.none), "fp16": averager(hvd.Compression.fp16)}
    times = {"compute": [], **{f"allreduce_{k}": [] for k in kinds}}
    estimator = noise_scale.TwoBatchEstimator(batch, batch * size)
    rng = np.random.default_rng([seed, rank])
    timed_steps = 2 * (warmup + steps)
    for step in range(timed_steps + noise_steps):
        kind = "none" if step % 2 == 0 or step >= timed_steps else "fp16"
        index = rng.choice(len(x), size=batch, replace=False)
        xb, yb = tf.constant(x[index]), tf.constant(y[index])
        started = time.perf_counter()
        grads, small_sq = gradients(xb, yb)
        small_sq = float(small_sq.numpy())
        computed = time.perf_counter()
        averaged, big_sq = kinds[kind](grads)
        big_sq = float(big_sq.numpy())
        reduced = time.perf_counter()
        optimizer.apply_gradients(zip(averaged, variables))
        if 2 * warmup <= step < timed_steps:
            times["compute"].append(computed - started)
            times[f"allreduce_{kind}"].append(reduced - computed)
        if step >= 2 * warmup and kind == "none":
            # Every worker's own squared norm, averaged over the workers (a scalar all-reduce).
            mean_small = float(hvd.allreduce(tf.constant(small_sq), op=hvd.Average).numpy())
            estimator.update(mean_small, big_sq)
    gradient_bytes = int(sum(np.prod(v.shape) * 4 for v in variables))
    return {
        "size": size, "batch_per_worker": batch, "parameters": gradient_bytes // 4,
        "gradient_bytes": gradient_bytes,
        **{f"{k}_s": float(np.median(v)) for k, v in times.items()},
        "b_simple": estimator.b_simple, "gradient_sq": estimator.gradient_sq,
        "trace_sigma": estimator.trace_sigma, "noise_pairs": estimator.pairs,
    }
