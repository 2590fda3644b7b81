"""How sharp a minimum is: epsilon-sharpness and 1-D interpolation (Keskar et al. 2017).

Keskar et al., *On large-batch training for deep learning: generalization gap and sharp minima*
(ICLR 2017), measure the sharpness of a trained point ``x`` as the largest rise of the training
loss ``f`` inside a small box around it, relative to the loss there:

    sharpness = 100 * (max_{y in box} f(x + y) - f(x)) / (1 + f(x)),
    box: |y_i| <= eps (|x_i| + 1) for every parameter i.

They find the maximum with L-BFGS-B; here :func:`epsilon_sharpness` approximates it with a few
steps of *projected sign-gradient ascent* (the steepest ascent direction for a box is the sign of
the gradient, and projecting onto the box is clipping), starting from a random point inside the
box, and keeps the largest loss seen. Because it is a lower bound on the true maximum, more steps
can only raise it.

The functions work on flat parameter vectors and take the objective as a callable evaluating a
*batch* of points at once (``loss_and_grad(points) -> (losses, gradients)``), so several
candidates are handled in one batched computation. :func:`mlp_objective` builds that callable for
the MLPs of :mod:`mgpu.lesson02.multimodel`; :func:`line_points` gives the points
``a x_b + (1 - a) x_a`` of the 1-D interpolation plot. :func:`small_vs_large_batch` runs notebook 02's
whole comparison: a small and a large batch from one start, the large one also for as many updates
as the small one (Hoffer et al. 2017), with each solution's sharpness, test accuracy and the
interpolation between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from mgpu.lesson02 import multimodel

__all__ = ["box_half_width", "epsilon_sharpness", "line_points", "mlp_objective", "SmallVsLarge",
           "small_vs_large_batch"]


def box_half_width(x: np.ndarray, eps: float) -> np.ndarray:
    """Half-width of Keskar's box around ``x``: ``eps (|x_i| + 1)``."""
    return eps * (np.abs(x) + 1.0)


def epsilon_sharpness(loss_and_grad: Callable, x: np.ndarray, eps: float, steps: int = 10,
                      step_fraction: float = 0.5, seed: int = 0) -> np.ndarray:
    """Keskar's sharpness (x100, relative) at each row of ``x`` (shape ``(points, P)`` or ``(P,)``).

    ``loss_and_grad(points)`` returns the losses ``(points,)`` and gradients ``(points, P)``.
    Each ascent step moves every coordinate by ``step_fraction`` of its half-width in the
    direction of the gradient's sign and clips back into the box.
    """
    x = np.atleast_2d(np.asarray(x, np.float64))
    half = box_half_width(x, eps)
    rng = np.random.default_rng(seed)
    y = rng.uniform(-0.1, 0.1, size=x.shape) * half
    f0, _ = loss_and_grad(x)
    f0 = np.asarray(f0, np.float64)
    best = f0.copy()
    for _ in range(steps + 1):
        f, g = loss_and_grad(x + y)
        best = np.maximum(best, np.asarray(f, np.float64))
        y = np.clip(y + step_fraction * half * np.sign(g), -half, half)
    return 100.0 * (best - f0) / (1.0 + f0)


def line_points(x_a: np.ndarray, x_b: np.ndarray, alphas) -> np.ndarray:
    """Rows ``a x_b + (1 - a) x_a`` for each ``a`` in ``alphas``: ``a = 0`` is ``x_a``, ``a = 1`` is ``x_b``."""
    alphas = np.asarray(alphas, np.float64)[:, None]
    return alphas * np.asarray(x_b)[None, :] + (1 - alphas) * np.asarray(x_a)[None, :]


@tf.function(reduce_retracing=True)
def _value_and_grad(params, x, y):
    with tf.GradientTape() as tape:
        tape.watch(params)
        z = multimodel.logits(params, x)
        labels = tf.broadcast_to(y[None, :], tf.shape(z)[:2])
        losses = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=z), axis=1)
        total = tf.reduce_sum(losses)
    return losses, tape.gradient(total, params)


def mlp_objective(like, x: np.ndarray, y: np.ndarray) -> Callable:
    """``loss_and_grad`` for MLPs shaped like ``like`` (see :mod:`mgpu.lesson02.multimodel`) on ``(x, y)``.

    Takes flat parameter rows ``(points, P)``; returns the mean cross-entropy of each point on the
    whole of ``(x, y)`` and its gradient, in float64 numpy arrays.
    """
    x_t = tf.constant(x, tf.float32)
    y_t = tf.constant(y, tf.int32)

    def loss_and_grad(points):
        params = multimodel.unflat(points, like)
        losses, grads = _value_and_grad(params, x_t, y_t)
        return losses.numpy().astype(np.float64), multimodel.flat(grads).astype(np.float64)

    return loss_and_grad


@dataclass
class SmallVsLarge:
    """Three solutions from one start: small batch, large batch (same epochs), large batch (same updates)."""

    labels: tuple[str, ...]
    train_loss: dict
    test_accuracy: dict
    sharpness: dict
    alphas: np.ndarray
    line_train_loss: np.ndarray      # f(a x_LB + (1 - a) x_SB) on the training set, x_LB converged
    line_test_accuracy: np.ndarray


def small_vs_large_batch(arrays, small: int, large: int, lr: float, momentum: float, epochs: float,
                         seed: int, hidden: int = 64, eps: float = 1e-3, ascent_steps: int = 10,
                         alphas=np.linspace(-1, 2, 31)) -> SmallVsLarge:
    """Keskar's comparison and Hoffer's remedy on the MLPs of :mod:`mgpu.lesson02.multimodel`.

    From one start and with one learning rate: batch ``small`` for ``epochs`` epochs; batch
    ``large`` for the same epochs (far fewer updates); batch ``large`` for as many updates as the
    small batch made (``epochs * large / small`` epochs). Each solution's training loss, held-out
    accuracy (``arrays.x_test``) and epsilon-sharpness on the training set are measured, and the
    1-D interpolation runs from the small-batch solution (a = 0) to the converged large-batch one
    (a = 1).
    """
    from mgpu.lesson02 import batch_study

    classes = int(arrays.y_train.max()) + 1
    start = multimodel.init_params(1, arrays.n_features, hidden, classes, seed)
    runs = {f"B={small}, {epochs:g} epochs": (small, epochs),
            f"B={large}, {epochs:g} epochs": (large, epochs),
            f"B={large}, same updates": (large, epochs * large / small)}
    solutions, train_loss, test_acc, sharp = {}, {}, {}, {}
    for label, (b, ep) in runs.items():
        params = batch_study.train_fixed_epochs(arrays, b, np.array([lr]), momentum, ep, seed,
                                                hidden=hidden, params=start)
        solutions[label] = params
        train_loss[label] = float(multimodel.mean_losses(params, arrays.x_train, arrays.y_train)[0])
        test_acc[label] = float(multimodel.accuracies(params, arrays.x_test, arrays.y_test)[0])
        objective = mlp_objective(params, arrays.x_train, arrays.y_train)
        sharp[label] = float(epsilon_sharpness(objective, multimodel.flat(params), eps,
                                               steps=ascent_steps, seed=seed)[0])
    labels = tuple(runs)
    x_sb = multimodel.flat(solutions[labels[0]])[0]
    x_lb = multimodel.flat(solutions[labels[2]])[0]
    line = multimodel.unflat(line_points(x_sb, x_lb, alphas), solutions[labels[0]])
    line_loss = multimodel.mean_losses(line, arrays.x_train, arrays.y_train)
    line_acc = multimodel.accuracies(line, arrays.x_test, arrays.y_test)
    return SmallVsLarge(labels, train_loss, test_acc, sharp, np.asarray(alphas), line_loss, line_acc)
