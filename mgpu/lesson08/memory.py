"""Notebook 08's memory measurements: the parts of a training step's memory, and recomputation.

Sizes of tensors are read from the tensors themselves (:func:`nbytes`). Which layer outputs the
backward pass keeps is read from the tape: :func:`measure_budget` keeps only weak references to the
outputs, so an output still alive after the forward pass is one the gradient tape holds. The
recomputation study reads TensorFlow's allocator (:func:`allocated`): on a CPU it counts only with
``TF_CPU_ALLOCATOR_USE_BFC=true`` set before TensorFlow starts (the notebook sets it).
"""

from __future__ import annotations

import gc
import time
import weakref

import numpy as np


def nbytes(tensors) -> int:
    """Bytes of the elements of these tensors or variables (shape x dtype size)."""
    return int(sum(int(np.prod(t.shape)) * t.dtype.size for t in tensors))


def memory_device() -> str:
    """The device whose allocator :func:`allocated` reads: the first GPU, else the CPU."""
    import tensorflow as tf

    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def allocated(peak: bool = False) -> int:
    """Bytes TensorFlow's allocator holds now (or its peak since :func:`reset_peak`)."""
    import tensorflow as tf

    return int(tf.config.experimental.get_memory_info(memory_device())["peak" if peak else "current"])


def reset_peak() -> None:
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats(memory_device())


def allocator_counts() -> bool:
    """Whether :func:`allocated` sees allocations (False on a CPU without the BFC allocator)."""
    import tensorflow as tf

    before = allocated()
    probe = tf.zeros([256, 1024])
    counted = allocated() > before
    del probe
    return counted


def measure_budget(model, optimizer, x, y, loss_fn) -> dict[str, int]:
    """One training step of a Keras model, measured part by part (bytes):

    weights, the model's variables; activations, the layer outputs still alive once the forward pass
    is done and only the tape refers to them; gradients, what ``tape.gradient`` returns; optimizer
    state, ``optimizer.variables()`` after the update (Adam creates its slots on its first step)."""
    import tensorflow as tf

    outputs = []
    with tf.GradientTape() as tape:
        h = x
        for layer in model.layers:
            h = layer(h, training=True)
            outputs.append(weakref.ref(h))
        loss = loss_fn(y, h)
    del h
    gc.collect()
    kept = [r() for r in outputs if r() is not None]
    activations = nbytes(kept)
    del kept
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return {"weights": nbytes(model.weights), "gradients": nbytes(gradients),
            "optimizer state": nbytes(optimizer.variables()), "activations": activations}


def recompute_study(forward, weights, x, repeats: int) -> dict:
    """``forward(x, recompute)`` with and without recomputation: bytes the allocator holds once the
    forward pass is done (what the tape keeps), its peak during the backward pass, the seconds of a
    forward and backward pass (median of ``repeats``, the two interleaved), and the largest difference
    between the two ways' gradients."""
    import tensorflow as tf

    def step(recompute):
        reset_peak()
        start, base = time.perf_counter(), allocated()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(forward(x, recompute))
        stored = allocated() - base
        gradients = tape.gradient(loss, weights)
        gradients[0].numpy()  # waits for the pass to finish
        return time.perf_counter() - start, stored, allocated(peak=True) - base, gradients

    for recompute in (False, True):
        step(recompute)  # warms up: the first call of each way is not measured
    runs = {False: [], True: []}
    for _ in range(repeats):
        for recompute in (False, True):
            runs[recompute].append(step(recompute))
    grads = {k: v[-1][3] for k, v in runs.items()}
    return {name: {"seconds": float(np.median([r[0] for r in runs[k]])), "stored_bytes": runs[k][-1][1],
                   "peak_bytes": runs[k][-1][2]} for name, k in (("plain", False), ("recompute", True))} | {
        "gradient_max_abs_diff": max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(grads[False], grads[True])),
        "gradient_scale": max(float(tf.reduce_max(tf.abs(a))) for a in grads[False])}
