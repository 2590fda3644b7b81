"""Gradient descent and stochastic gradient descent on problems small enough to see whole (notebook 01).

Notebook 01 asks why the noise of small batches is useful and how big it is. Everything it measures is
computed here, in vectorized numpy, on three small problems:

* **A linear neuron** ``y = w x + b`` fitted to noisy data by least squares. Its loss is a quadratic
  bowl in the two parameters ``(w, b)``, so it can be drawn, and gradient descent (GD), SGD with
  batch 1 and minibatch SGD can be run on it and their paths drawn on the surface
  (:func:`make_linear_data`, :func:`linear_loss`, :func:`train_linear`). The same data gives the
  minibatch gradient noise (:func:`minibatch_gradient_variance`, predicted by
  :func:`predicted_minibatch_variance`) and GD's convergence rate (:func:`gd_distances`,
  :func:`convergence_rate`, predicted by :func:`predicted_gd_rate`).
* **A one-dimensional quadratic** ``f(x) = h x^2 / 2`` whose gradient is observed with noise of
  variance ``s^2 / B``: many independent SGD chains run side by side (:func:`quadratic_sgd`), so the
  stationary loss of constant-step SGD (the *noise ball*, predicted exactly by
  :func:`noise_ball_loss`) and the ``O(1/t)`` decay of a diminishing step ``beta / (gamma + t)``
  (predicted by :func:`expected_quadratic_loss`) can be measured tightly.
* **A saddle** ``f(x, y) = x^2 + y^4/4 - y^2/2``: GD started on the ridge ``y = 0`` converges to the
  saddle point, SGD escapes to one of the two minima (:func:`run_saddle`, :func:`escape_fraction`).

The functions take a ``numpy.random.Generator`` wherever they draw random numbers, so a seed fixes
every result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

__all__ = [
    "make_linear_data", "least_squares", "linear_hessian", "linear_loss", "linear_gradient",
    "shuffled_batches", "train_linear", "Trajectory",
    "minibatch_gradient_variance", "predicted_minibatch_variance",
    "gd_distances", "convergence_rate", "predicted_gd_rate",
    "noise_ball_loss", "noise_ball_loss_small_step", "quadratic_sgd", "stationary_mean",
    "decaying_step", "expected_quadratic_loss", "loglog_slope",
    "saddle_loss", "saddle_gradient", "run_saddle", "SaddleRuns", "escape_fraction",
]


# --------------------------------------------------------------------------------------------
# The linear neuron y = w x + b with the loss L(w, b) = mean((w x + b - y)^2) / 2
# --------------------------------------------------------------------------------------------

def make_linear_data(n: int, rng: np.random.Generator, *, w: float = 2.0, b: float = -1.0,
                     noise: float = 0.5, x_mean: float = 1.0, x_std: float = 1.0):
    """``n`` points ``x ~ N(x_mean, x_std^2)``, ``y = w x + b + noise * N(0, 1)``; returns ``(x, y)``."""
    x = x_mean + x_std * rng.standard_normal(n)
    y = w * x + b + noise * rng.standard_normal(n)
    return x, y


def least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The minimizer ``(w*, b*)`` of the mean squared error (exactly, by solving the normal equations)."""
    design = np.stack([x, np.ones_like(x)], axis=1)
    return np.linalg.solve(design.T @ design, design.T @ y)


def linear_hessian(x: np.ndarray) -> np.ndarray:
    """The (constant) Hessian of ``L(w, b)``: ``[[mean x^2, mean x], [mean x, 1]]``."""
    return np.array([[np.mean(x * x), np.mean(x)], [np.mean(x), 1.0]])


def linear_loss(w, b, x: np.ndarray, y: np.ndarray):
    """``L(w, b) = mean((w x + b - y)^2) / 2`` for scalars or arrays ``w``, ``b`` (broadcast together).

    Computed from the data's moments, so a 200 x 200 grid of parameters costs no more than one point.
    """
    w, b = np.asarray(w, dtype=float), np.asarray(b, dtype=float)
    mx, my = np.mean(x), np.mean(y)
    mxx, mxy, myy = np.mean(x * x), np.mean(x * y), np.mean(y * y)
    return 0.5 * (w * w * mxx + 2 * w * b * mx + b * b - 2 * w * mxy - 2 * b * my + myy)


def linear_gradient(params: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of the mean squared error over the examples ``x``, ``y`` at ``params = (w, b)``.

    ``x`` and ``y`` may have a leading batch-of-batches axis, shape ``(k, B)``: then the result has
    shape ``(k, 2)``, one gradient per batch.
    """
    residual = params[0] * x + params[1] - y
    return np.stack([np.mean(residual * x, axis=-1), np.mean(residual, axis=-1)], axis=-1)


def shuffled_batches(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """One epoch of minibatches: index arrays that cover ``range(n)`` once, in a random order.

    Every batch has ``batch_size`` indices except the last, which holds the remainder when
    ``batch_size`` does not divide ``n``.
    """
    order = rng.permutation(n)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


@dataclass
class Trajectory:
    """One training run: the parameters and full-data loss before the first and after every update."""

    params: np.ndarray   # shape (updates + 1, 2): (w, b)
    losses: np.ndarray   # shape (updates + 1,): L(w, b) on the whole data set
    examples: np.ndarray  # shape (updates + 1,): examples whose gradients had been used so far
    batch_size: int
    lr: float


def train_linear(x: np.ndarray, y: np.ndarray, *, lr: float, batch_size: int, updates: int,
                 rng: np.random.Generator, start=(0.0, 0.0),
                 batches: Callable[[int, int, np.random.Generator], Iterator[np.ndarray]] | None = None,
                 ) -> Trajectory:
    """Minibatch SGD on the linear neuron for ``updates`` parameter updates.

    ``batch_size = len(x)`` is gradient descent, ``batch_size = 1`` plain SGD. The examples are
    visited epoch by epoch in the order given by ``batches(n, batch_size, rng)`` (default
    :func:`shuffled_batches`), so a ragged last batch is used as it is.
    """
    n = len(x)
    batches = batches or shuffled_batches
    params = np.empty((updates + 1, 2))
    examples = np.zeros(updates + 1, dtype=np.int64)
    params[0] = start
    step = 0
    while step < updates:
        for index in batches(n, batch_size, rng):
            params[step + 1] = params[step] - lr * linear_gradient(params[step], x[index], y[index])
            examples[step + 1] = examples[step] + len(index)
            step += 1
            if step == updates:
                break
    losses = linear_loss(params[:, 0], params[:, 1], x, y)
    return Trajectory(params=params, losses=losses, examples=examples, batch_size=batch_size, lr=lr)


def minibatch_gradient_variance(x: np.ndarray, y: np.ndarray, params, batch_size: int, epochs: int,
                                rng: np.random.Generator) -> float:
    """Measured ``E |g_B - g|^2``: mean squared distance of a minibatch gradient from the full gradient.

    The minibatches are those SGD uses (shuffled epochs without replacement); ``batch_size`` must
    divide ``len(x)`` so that every batch has the same size.
    """
    n = len(x)
    if n % batch_size:
        raise ValueError(f"batch_size {batch_size} must divide the number of examples {n}")
    params = np.asarray(params, dtype=float)
    full = linear_gradient(params, x, y)
    total, count = 0.0, 0
    for _ in range(epochs):
        order = rng.permutation(n).reshape(-1, batch_size)  # all batches of one epoch, one per row
        grads = linear_gradient(params, x[order], y[order])
        total += float(np.sum((grads - full) ** 2))
        count += len(order)
    return total / count


def predicted_minibatch_variance(x: np.ndarray, y: np.ndarray, params, batch_size: int) -> float:
    """``tr(Sigma) / B * (n - B) / (n - 1)``: variance of the mean of ``B`` per-example gradients
    drawn without replacement from ``n``, where ``Sigma`` is their covariance over the data set."""
    n = len(x)
    params = np.asarray(params, dtype=float)
    per_example = linear_gradient(params, x[:, None], y[:, None])  # shape (n, 2)
    trace_sigma = float(np.sum(np.var(per_example, axis=0)))
    return trace_sigma / batch_size * (n - batch_size) / (n - 1)


def gd_distances(x: np.ndarray, y: np.ndarray, lr: float, steps: int, start=(0.0, 0.0)) -> np.ndarray:
    """Full-batch GD on the linear neuron: ``|theta_t - theta*|`` for ``t = 0 .. steps``."""
    optimum = least_squares(x, y)
    params = np.asarray(start, dtype=float)
    distances = np.empty(steps + 1)
    distances[0] = np.linalg.norm(params - optimum)
    for t in range(steps):
        params = params - lr * linear_gradient(params, x, y)
        distances[t + 1] = np.linalg.norm(params - optimum)
    return distances


def convergence_rate(distances: np.ndarray, *, low: float = 1e-10, high: float = 1e-3) -> float:
    """The factor by which ``distances`` shrinks (or grows) per step, fitted on its late stretch.

    Uses the steps where ``low < distance / distance[0] < high`` (past the start-up transient and
    above round-off; for a diverging run, ``1e3 < ratio < 1e10``) and fits a straight line to
    ``log(distance)`` against the step: the rate is ``exp(slope)``.
    """
    ratio = np.asarray(distances) / distances[0]
    growing = ratio[-1] > 1
    keep = (ratio > 1 / high) & (ratio < 1 / low) if growing else (ratio > low) & (ratio < high)
    steps = np.flatnonzero(keep)
    if len(steps) < 5:
        raise ValueError("too few steps in the fitting range: run more steps")
    slope = np.polyfit(steps, np.log(ratio[steps]), 1)[0]
    return float(np.exp(slope))


def predicted_gd_rate(lr: float, hessian: np.ndarray) -> float:
    """GD's asymptotic rate on a quadratic: ``max_i |1 - lr * lambda_i|`` over the Hessian's eigenvalues."""
    return float(np.max(np.abs(1 - lr * np.linalg.eigvalsh(hessian))))


# --------------------------------------------------------------------------------------------
# The quadratic f(x) = h x^2 / 2 with gradient noise of variance s^2 / B
# --------------------------------------------------------------------------------------------

def noise_ball_loss(h, s, batch_size, lr):
    """Stationary ``E[f]`` of constant-step SGD on ``f = h x^2 / 2`` with gradient noise ``s^2 / B``.

    ``x_{t+1} = (1 - lr h) x_t - lr * noise`` has the stationary variance
    ``lr s^2 / (B h (2 - lr h))`` (for ``0 < lr h < 2``), so ``E[f] = lr s^2 / (2 B (2 - lr h))``.
    """
    h, s, batch_size, lr = (np.asarray(v, dtype=float) for v in (h, s, batch_size, lr))
    return lr * s * s / (2 * batch_size * (2 - lr * h))


def noise_ball_loss_small_step(s, batch_size, lr):
    """The small-step approximation ``lr s^2 / (4 B)`` of :func:`noise_ball_loss` (Bottou et al. 2018)."""
    s, batch_size, lr = (np.asarray(v, dtype=float) for v in (s, batch_size, lr))
    return lr * s * s / (4 * batch_size)


def quadratic_sgd(*, h: float, s: float, lr, batch_size, steps: int, chains: int,
                  rng: np.random.Generator, x0: float = 1.0, keep_paths: int = 0):
    """Run ``chains`` independent SGD chains on ``f = h x^2 / 2`` for each setting, all at once.

    ``lr`` and ``batch_size`` are scalars or 1-D arrays (broadcast together) with one entry per
    setting; ``lr`` may also be a function ``lr(t)`` returning them for step ``t = 0, 1, ...``.
    The gradient at step t is ``h x + z`` with ``z ~ N(0, s^2 / B)``: the mean of ``B`` per-example
    gradients whose noise has variance ``s^2``.

    Returns ``(mean_loss, paths)``: ``mean_loss[k, t]`` is ``f`` averaged over the chains of setting
    ``k`` at step ``t`` (``t = 0 .. steps``), and ``paths[k, t, j]`` the first ``keep_paths`` chains.
    """
    schedule = lr if callable(lr) else (lambda t, fixed=np.asarray(lr, dtype=float): fixed)
    shape = np.broadcast(np.asarray(schedule(0)), np.asarray(batch_size)).shape
    settings = int(np.prod(shape)) if shape else 1
    noise_sd = (s / np.sqrt(np.broadcast_to(np.asarray(batch_size, dtype=float), shape))).reshape(settings, 1)
    x = np.full((settings, chains), float(x0))
    mean_loss = np.empty((settings, steps + 1))
    paths = np.empty((settings, steps + 1, keep_paths))
    mean_loss[:, 0] = 0.5 * h * x0 * x0
    paths[:, 0] = x0
    for t in range(steps):
        step = np.broadcast_to(np.asarray(schedule(t), dtype=float), shape).reshape(settings, 1)
        x -= step * (h * x + noise_sd * rng.standard_normal((settings, chains)))
        mean_loss[:, t + 1] = 0.5 * h * np.mean(x * x, axis=1)
        paths[:, t + 1] = x[:, :keep_paths]
    return mean_loss, paths


def stationary_mean(mean_loss: np.ndarray, burn_in: int) -> np.ndarray:
    """Average of ``mean_loss[..., t]`` over the stationary window ``t >= burn_in``."""
    return np.mean(mean_loss[..., burn_in:], axis=-1)


def decaying_step(beta: float, gamma: float) -> Callable[[int], float]:
    """The diminishing step ``lr_t = beta / (gamma + t)`` (Robbins & Monro 1951; Bottou et al. 2018)."""
    return lambda t: beta / (gamma + t)


def expected_quadratic_loss(*, h: float, s: float, lr, batch_size: float, steps: int,
                            x0: float = 1.0) -> np.ndarray:
    """Exact ``E[f(x_t)]`` of SGD on ``f = h x^2 / 2`` (``t = 0 .. steps``), from the recursion
    ``E[x_{t+1}^2] = (1 - lr_t h)^2 E[x_t^2] + lr_t^2 s^2 / B``; ``lr`` is a number or ``lr(t)``."""
    schedule = lr if callable(lr) else (lambda t: lr)
    second_moment = np.empty(steps + 1)
    second_moment[0] = x0 * x0
    for t in range(steps):
        step = schedule(t)
        second_moment[t + 1] = (1 - step * h) ** 2 * second_moment[t] + step * step * s * s / batch_size
    return 0.5 * h * second_moment


def loglog_slope(t: np.ndarray, values: np.ndarray) -> float:
    """Slope of the least-squares line through ``(log t, log values)``."""
    return float(np.polyfit(np.log(t), np.log(values), 1)[0])


# --------------------------------------------------------------------------------------------
# The saddle f(x, y) = x^2 + y^4 / 4 - y^2 / 2: a saddle point at (0, 0), minima at (0, +-1)
# --------------------------------------------------------------------------------------------

def saddle_loss(x, y):
    """``x^2 + y^4 / 4 - y^2 / 2``: 0 at the saddle point (0, 0), -1/4 at the minima (0, +-1)."""
    return x * x + y ** 4 / 4 - y * y / 2


def saddle_gradient(x, y):
    """``(2 x, y^3 - y)``."""
    return 2 * x, y ** 3 - y


@dataclass
class SaddleRuns:
    """Runs of (noisy) GD on :func:`saddle_loss`, see :func:`run_saddle`."""

    final: np.ndarray        # shape (runs, 2): where each run ended
    paths: np.ndarray        # shape (steps + 1, keep_paths, 2): the first runs, step by step
    escape_step: np.ndarray  # shape (runs,): first step with |y| > threshold, -1 if never


def run_saddle(*, lr: float, steps: int, noise: float, runs: int, rng: np.random.Generator,
               start=(1.0, 0.0), keep_paths: int = 0, threshold: float = 0.5) -> SaddleRuns:
    """``runs`` independent runs of (noisy) gradient descent on :func:`saddle_loss`, all at once.

    Each update uses the gradient plus independent ``N(0, noise^2)`` noise in each coordinate;
    ``noise = 0`` is plain GD. A run has *escaped* once ``|y| > threshold`` (the saddle point is at
    ``y = 0``, the minima at ``|y| = 1``).
    """
    x = np.full(runs, float(start[0]))
    y = np.full(runs, float(start[1]))
    paths = np.empty((steps + 1, keep_paths, 2))
    paths[0] = start
    escape_step = np.where(np.abs(y) > threshold, 0, -1)
    for t in range(steps):
        gx, gy = saddle_gradient(x, y)
        if noise:
            gx = gx + noise * rng.standard_normal(runs)
            gy = gy + noise * rng.standard_normal(runs)
        x, y = x - lr * gx, y - lr * gy
        paths[t + 1, :, 0], paths[t + 1, :, 1] = x[:keep_paths], y[:keep_paths]
        escape_step[(escape_step < 0) & (np.abs(y) > threshold)] = t + 1
    return SaddleRuns(final=np.stack([x, y], axis=1), paths=paths, escape_step=escape_step)


def escape_fraction(final: np.ndarray, threshold: float = 0.5) -> float:
    """Fraction of runs whose final ``|y|`` exceeds ``threshold``: they left the saddle's ridge
    (the minima are at ``|y| = 1``, the saddle point at ``y = 0``)."""
    return float(np.mean(np.abs(final[:, 1]) > threshold))
