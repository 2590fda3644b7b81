"""Notebook 11's section 3: the two CPU-checkable pieces of its float16 code (which only runs on a GPU):
:func:`tensor_core_sizes` (which sizes are multiples of 8) and :func:`loss_scaled` (the optimizer
wrapped for loss scaling)."""

from __future__ import annotations

from typing import Sequence


def tensor_core_sizes(sizes: Sequence[int], multiple: int = 8) -> list[tuple[int, bool]]:
    """Each size and its neighbour one smaller, tagged with whether it is a multiple of ``multiple``.

    Tensor cores take float16 matrices whose dimensions are multiples of 8; ``tensor_core_sizes([1024])``
    gives ``[(1024, True), (1023, False)]``, the pair whose speeds section 3 compares.
    """
    out = []
    for n in sizes:
        if n % multiple:
            raise ValueError(f"{n} is not a multiple of {multiple}: give the aligned size")
        out += [(n, True), (n - 1, (n - 1) % multiple == 0)]
    return out


def loss_scaled(optimizer):
    """``optimizer`` wrapped for float16 training: the loss is scaled up before the gradients (so that
    small ones do not underflow to zero in float16), and the gradients scaled back before the update;
    the scale adapts (halved on an overflow, doubled after 2000 good steps)."""
    import tensorflow as tf

    return tf.keras.mixed_precision.LossScaleOptimizer(optimizer, dynamic=True)
