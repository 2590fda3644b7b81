"""What the batch size does to training: sweeps, steps-to-target, fits, LR scaling and warm-up (notebook 02).

Everything notebook 02 measures about the number of *steps* is computed here, on many small MLPs trained
at once (:mod:`mgpu.lesson02.multimodel`):

* :func:`prepare` turns a course dataset into small float arrays (2x2 average pooled, standardized)
  and a fixed held-out evaluation set;
* :func:`steps_to_target` trains a grid of learning rates (with and without momentum) at one batch
  size and records, for every model, the number of steps until the held-out loss first reaches a
  target; :func:`sweep_batch_sizes` repeats that over batch sizes, and the best learning rate at a
  batch size is the minimum over its grid (Shallue et al. 2019 tune the LR per batch size too);
* :func:`fit_steps_model` fits ``S(B) = S_min (1 + B_crit / B)`` (McCandlish et al. 2018) and
  :func:`loglog_slope` measures the local slope of ``log S`` against ``log B``;
* :func:`noise_scale_during_training` trains one model and measures the gradient noise scale
  ``B_simple`` (:mod:`mgpu.lesson02.noise_scale`) at checkpoints along the way;
* :func:`scaled_lr` applies the linear / square-root / no scaling rule, :func:`warmup_factors`
  gives the none / constant / gradual warm-up multipliers of Goyal et al. (2017),
  :func:`train_fixed_epochs` trains many models for a fixed epoch budget under such schedules and
  :func:`scaling_study` compares the rules and warm-ups across batch sizes;
* :func:`require` is the notebooks' check of a published claim: it prints ``ok`` or raises
  :class:`ReproductionFailed` with what was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from mgpu.lesson02 import multimodel

# Written in notebook 02 (its exercise) and saved from there by mgpu.runtime.saved: it exists once.
from mgpu.lesson02.saved import scaled_lr  # noqa: E402

__all__ = ["Arrays", "prepare", "shuffled_batches", "steps_to_target", "StepsResult",
           "sweep_batch_sizes", "fit_steps_model", "steps_model", "loglog_slope", "scaled_lr",
           "warmup_factors", "train_fixed_epochs", "crossing_step", "eval_schedule", "lr_grid",
           "NoiseScaleRun", "noise_scale_during_training", "scaling_study", "SCALING_VARIANTS",
           "ReproductionFailed", "require"]


class ReproductionFailed(AssertionError):
    """A published result did not reproduce: the message says which, and what was measured."""


def require(condition: bool, claim: str, measured: str) -> None:
    """Check one published claim against this run's measurement.

    Prints ``ok: <claim> (<measured>)`` when ``condition`` holds; otherwise raises
    :class:`ReproductionFailed` saying which claim failed and what was measured.
    """
    if not condition:
        raise ReproductionFailed(f"NOT REPRODUCED: {claim}. Measured: {measured}")
    print(f"ok: {claim} ({measured})")


# --------------------------------------------------------------------------------------------
# Data


@dataclass
class Arrays:
    """Small float32 arrays for fast sweeps: flattened, pooled, standardized images."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]


def _pool_flatten(images: np.ndarray, pool: int) -> np.ndarray:
    x = images.astype(np.float32) / 255.0
    if x.ndim == 4:
        x = x.mean(axis=3)
    n, h, w = x.shape
    x = x[:, : h - h % pool, : w - w % pool]
    x = x.reshape(n, h // pool, pool, w // pool, pool).mean(axis=(2, 4))
    return x.reshape(n, -1)


def prepare(dataset, n_train: int, n_eval: int, pool: int = 2, seed: int = 0) -> Arrays:
    """The first ``n_train`` training images and a held-out split of the test images.

    ``x_eval`` (``n_eval`` test images) decides when a target is reached; ``x_test`` is the rest of
    the test split and is used only to report generalization. Images are average pooled
    ``pool x pool`` and standardized with the training subset's mean and standard deviation.
    """
    rng = np.random.default_rng(seed)
    train = rng.permutation(len(dataset.x_train))[:n_train]
    test = rng.permutation(len(dataset.x_test))
    x_train = _pool_flatten(dataset.x_train[train], pool)
    mean, std = x_train.mean(), x_train.std()
    norm = lambda a: ((a - mean) / std).astype(np.float32)  # noqa: E731
    x_test_all = _pool_flatten(dataset.x_test[test], pool)
    y_test_all = dataset.y_test[test].astype(np.int32)
    return Arrays(norm(x_train), dataset.y_train[train].astype(np.int32),
                  norm(x_test_all[:n_eval]), y_test_all[:n_eval],
                  norm(x_test_all[n_eval:]), y_test_all[n_eval:])


def shuffled_batches(n: int, batch_size: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """``(steps, batch_size)`` indices: passes over a fresh permutation of ``range(n)`` each epoch.

    A batch never straddles two epochs (the last incomplete batch of a permutation is dropped),
    unless ``batch_size > n``, where batches are drawn without replacement from the whole set.
    """
    if batch_size > n:
        return np.stack([rng.choice(n, batch_size, replace=True) for _ in range(steps)])
    per_epoch = n // batch_size
    out = []
    while len(out) * per_epoch < steps:
        out.append(rng.permutation(n)[: per_epoch * batch_size].reshape(per_epoch, batch_size))
    return np.concatenate(out)[:steps]


# --------------------------------------------------------------------------------------------
# Steps to target


def crossing_step(steps: np.ndarray, values: np.ndarray, target: float) -> float:
    """The first step at which ``values`` (recorded at ``steps``) falls to ``target`` or below.

    Linear interpolation between the last value above and the first at or below the target;
    ``inf`` if it never gets there. ``values[0]`` is taken at ``steps[0]``.
    """
    values = np.asarray(values, float)
    below = np.flatnonzero(values <= target)
    if len(below) == 0:
        return math.inf
    i = below[0]
    if i == 0:
        return float(steps[0])
    v0, v1 = values[i - 1], values[i]
    s0, s1 = steps[i - 1], steps[i]
    if not np.isfinite(v0) or v0 == v1:
        return float(s1)
    return float(s0 + (s1 - s0) * (v0 - target) / (v0 - v1))


@dataclass
class StepsResult:
    """The outcome of :func:`steps_to_target` at one batch size (one entry per model)."""

    batch_size: int
    lrs: np.ndarray          # (models,)
    momenta: np.ndarray      # (models,)
    replicas: np.ndarray     # (models,) which independent start the model had
    steps: np.ndarray        # (models,) steps to target, inf if not reached
    eval_steps: np.ndarray   # the steps at which the held-out loss was recorded
    eval_losses: np.ndarray  # (evaluations, models)
    final_params: tuple = field(repr=False, default=None)

    def by_lr(self, momentum: float) -> tuple[np.ndarray, np.ndarray]:
        """``(lrs, steps)`` for this momentum, steps averaged over replicas (inf if any missed)."""
        mask = np.isclose(self.momenta, momentum)
        lrs = np.unique(self.lrs[mask])
        steps = np.array([self.steps[mask & np.isclose(self.lrs, lr)].mean() for lr in lrs])
        return lrs, steps

    def best(self, momentum: float) -> float:
        """Steps to target with the best learning rate among models with this momentum."""
        return float(self.by_lr(momentum)[1].min())

    def best_lr(self, momentum: float) -> float:
        lrs, steps = self.by_lr(momentum)
        return float(lrs[np.argmin(steps)])


def eval_schedule(max_steps: int, ratio: float = 1.06, first: int = 4) -> np.ndarray:
    """Geometrically spaced evaluation steps ``first, ..., max_steps`` (relative resolution ``ratio``)."""
    out = [first]
    while out[-1] < max_steps:
        out.append(min(max_steps, max(out[-1] + 1, int(math.ceil(out[-1] * ratio)))))
    return np.array(out)


def steps_to_target(arrays: Arrays, batch_size: int, lrs, momenta, target_loss: float,
                    max_steps: int, seed: int, hidden: int = 32, replicas: int = 1,
                    ratio: float = 1.06) -> StepsResult:
    """Train one model per ``(lr, momentum)`` pair and replica at ``batch_size`` until the target.

    ``lrs`` and ``momenta`` have one entry per grid point. Within a replica every grid point starts
    from the same weights; replicas start from independent draws (from ``seed``) and their steps
    are averaged, which halves the variance of noisy small-batch runs. All models see the same
    minibatches. The held-out loss is recorded at geometrically spaced steps; training stops at
    ``max_steps`` or as soon as, for every distinct momentum, some learning rate has reached
    ``target_loss`` in every replica (the minimum over the grid is then known).
    """
    grid_lrs = np.asarray(lrs, np.float32)
    grid_mus = np.asarray(momenta, np.float32)
    g = len(grid_lrs)
    lrs = np.tile(grid_lrs, replicas)
    momenta = np.tile(grid_mus, replicas)
    replica = np.repeat(np.arange(replicas), g)
    m = len(lrs)
    classes = int(arrays.y_train.max()) + 1
    starts = [multimodel.init_params(g, arrays.n_features, hidden, classes, seed * 1000 + r)
              for r in range(replicas)]
    params = tuple(tf.concat([s[k] for s in starts], axis=0) for k in range(4))
    velocity = tuple(tf.zeros_like(p) for p in params)
    rng = np.random.default_rng([seed, batch_size])
    x_all, y_all = tf.constant(arrays.x_train), tf.constant(arrays.y_train)
    schedule = eval_schedule(max_steps, ratio)
    batches = shuffled_batches(len(arrays.x_train), batch_size, int(schedule[-1]), rng)
    steps_done = 0
    rec_steps = [0]
    rec_losses = [multimodel.mean_losses(params, arrays.x_eval, arrays.y_eval)]
    lr_table = np.broadcast_to(lrs, (len(batches), m))
    for stop in schedule:
        params, velocity = multimodel.sgd_chunk(params, velocity, x_all, y_all,
                                                batches[steps_done:stop],
                                                lr_table[steps_done:stop], momenta)
        steps_done = int(stop)
        rec_steps.append(steps_done)
        rec_losses.append(multimodel.mean_losses(params, arrays.x_eval, arrays.y_eval))
        reached = (np.array(rec_losses).min(axis=0) <= target_loss).reshape(replicas, g).all(axis=0)
        if all(reached[grid_mus == mu].any() for mu in np.unique(grid_mus)):
            break
    rec_steps = np.array(rec_steps)
    rec_losses = np.array(rec_losses)
    steps = np.array([crossing_step(rec_steps, rec_losses[:, j], target_loss) for j in range(m)])
    return StepsResult(batch_size, lrs, momenta, replica, steps, rec_steps, rec_losses, params)


def lr_grid(low: float, high: float, per_octave: int = 1) -> np.ndarray:
    """Learning rates from ``low`` to ``high`` spaced by factors of ``2 ** (1 / per_octave)``."""
    n = int(round(math.log2(high / low) * per_octave)) + 1
    return low * 2.0 ** (np.arange(n) / per_octave)


def sweep_batch_sizes(arrays: Arrays, batch_sizes, effective_lrs, momenta, target_loss: float,
                      max_examples: float, seed: int, hidden: int = 32, max_steps: int = 20000,
                      replicas=lambda b: 1, progress: bool = True) -> dict[int, StepsResult]:
    """:func:`steps_to_target` at each batch size over a grid of *effective* learning rates.

    For momentum ``mu`` the learning rate is ``effective_lr * (1 - mu)``, so each grid point takes
    steps of the same long-run size with and without momentum. A batch size stops after
    ``max_examples`` training examples (or ``max_steps``), whichever comes first;
    ``replicas(b)`` says how many independent starts to average at batch size ``b``, and
    ``effective_lrs`` is one grid for all batch sizes or a function ``b -> grid``.
    """
    grid_for = effective_lrs if callable(effective_lrs) else (lambda b: effective_lrs)
    results = {}
    for b in batch_sizes:
        grid = np.asarray(grid_for(int(b)), float)
        lrs = np.concatenate([grid * (1 - mu) for mu in momenta])
        mus = np.repeat(np.asarray(momenta, float), len(grid))
        budget = int(min(max_steps, max(50, max_examples // b)))
        results[int(b)] = steps_to_target(arrays, int(b), lrs, mus, target_loss, budget, seed,
                                          hidden=hidden, replicas=replicas(int(b)))
        if progress:
            line = ", ".join(f"momentum {mu:g}: {results[int(b)].best(mu):7.1f}" for mu in momenta)
            print(f"  batch {b:>5}: steps to target with the best LR, {line}", flush=True)
    return results


# --------------------------------------------------------------------------------------------
# Fits and slopes


def steps_model(batch_sizes, s_min: float, b_crit: float) -> np.ndarray:
    """``S(B) = S_min (1 + B_crit / B)`` (McCandlish et al. 2018)."""
    return s_min * (1 + b_crit / np.asarray(batch_sizes, float))


def fit_steps_model(batch_sizes, steps) -> tuple[float, float]:
    """Least-squares fit of ``log S = log S_min + log(1 + B_crit / B)``; returns ``(S_min, B_crit)``.

    For a given ``B_crit`` the best ``log S_min`` is a mean, so the fit is a one-dimensional search
    over ``log B_crit`` (a grid, then golden-section refinement). Points with infinite steps are
    ignored.
    """
    b = np.asarray(batch_sizes, float)
    s = np.asarray(steps, float)
    ok = np.isfinite(s) & (s > 0)
    b, log_s = b[ok], np.log(s[ok])
    if len(b) < 2:
        raise ValueError("need at least two batch sizes that reached the target")

    def cost(log_bc):
        r = log_s - np.log1p(np.exp(log_bc) / b)
        return float(np.sum((r - r.mean()) ** 2))

    lo, hi = math.log(b.min()) - 6, math.log(b.max()) + 6
    grid = np.linspace(lo, hi, 400)
    i = int(np.argmin([cost(g) for g in grid]))
    a, c = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        x1, x2 = c - golden * (c - a), a + golden * (c - a)
        if cost(x1) < cost(x2):
            c = x2
        else:
            a = x1
    log_bc = (a + c) / 2
    b_crit = math.exp(log_bc)
    s_min = math.exp(float(np.mean(log_s - np.log1p(b_crit / b))))
    return s_min, b_crit


def loglog_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return float(np.polyfit(lx, ly, 1)[0])


# --------------------------------------------------------------------------------------------
# LR scaling rules and warm-up (Goyal et al. 2017)


def warmup_factors(total_steps: int, warmup_steps: int, kind: str, start_factor: float) -> np.ndarray:
    """Multipliers of the target learning rate at each step ``0 .. total_steps - 1``.

    ``kind``: ``"none"`` (1 throughout); ``"constant"`` (``start_factor`` for the first
    ``warmup_steps`` steps, then 1); ``"gradual"`` (a linear ramp from ``start_factor`` at step 0 to
    1 at step ``warmup_steps``, then 1). Goyal et al. use ``start_factor = 1 / k`` for a batch
    ``k`` times the base one, so warm-up starts from the base learning rate.
    """
    t = np.arange(total_steps, dtype=float)
    if kind == "none" or warmup_steps <= 0:
        return np.ones(total_steps)
    if kind == "constant":
        return np.where(t < warmup_steps, start_factor, 1.0)
    if kind == "gradual":
        return np.where(t < warmup_steps, start_factor + (1 - start_factor) * t / warmup_steps, 1.0)
    raise ValueError(f"unknown warm-up {kind!r}: choose none, constant or gradual")


def train_fixed_epochs(arrays: Arrays, batch_size: int, lr_table: np.ndarray, momenta, epochs: float,
                       seed: int, hidden: int = 32, params=None):
    """Train ``lr_table.shape[1]`` models for ``epochs`` passes at ``batch_size``; returns the params.

    ``lr_table`` is ``(steps, models)`` (one row per step, e.g. a scaled rate times a warm-up
    factor) or ``(models,)`` (constant rates). Every model starts from the same weights (from
    ``seed``, unless ``params`` is given) and sees the same minibatches.
    """
    n = len(arrays.x_train)
    steps = max(1, int(round(epochs * n / batch_size)))
    lr_table = np.asarray(lr_table, np.float32)
    if lr_table.ndim == 1:
        lr_table = np.broadcast_to(lr_table, (steps, len(lr_table)))
    lr_table = lr_table[:steps]
    m = lr_table.shape[1]
    classes = int(arrays.y_train.max()) + 1
    if params is None:
        params = multimodel.init_params(m, arrays.n_features, hidden, classes, seed)
    velocity = tuple(tf.zeros_like(p) for p in params)
    rng = np.random.default_rng([seed, batch_size, 1])
    batches = shuffled_batches(n, batch_size, steps, rng)
    x_all, y_all = tf.constant(arrays.x_train), tf.constant(arrays.y_train)
    chunk = max(1, min(steps, 2000))
    momenta = np.broadcast_to(np.asarray(momenta, np.float32), (m,))
    for start in range(0, steps, chunk):
        params, velocity = multimodel.sgd_chunk(params, velocity, x_all, y_all,
                                                batches[start:start + chunk],
                                                lr_table[start:start + chunk], momenta)
    return params


# --------------------------------------------------------------------------------------------
# The gradient noise scale along a training run


@dataclass
class NoiseScaleRun:
    """B_simple measured at checkpoints of one training run."""

    steps: np.ndarray        # checkpoint steps
    eval_loss: np.ndarray    # held-out loss there
    b_simple: np.ndarray
    gradient_sq: np.ndarray
    trace_sigma: np.ndarray

    def at_start(self, checkpoints: int = 3) -> float:
        """B_simple pooled over the first ``checkpoints`` checkpoints (tr(Sigma) and |G|^2 averaged)."""
        pool = slice(0, checkpoints)
        return float(np.mean(self.trace_sigma[pool]) / np.mean(self.gradient_sq[pool]))

    def at_end(self, checkpoints: int = 5) -> float:
        """B_simple pooled over the last ``checkpoints`` checkpoints."""
        pool = slice(len(self.steps) - checkpoints, len(self.steps))
        return float(np.mean(self.trace_sigma[pool]) / np.mean(self.gradient_sq[pool]))

    def at_loss(self, loss: float, window: int = 1) -> float:
        """B_simple where the held-out loss first reaches ``loss``.

        The checkpoint where that happens and ``window`` checkpoints on either side are pooled the
        way McCandlish et al. pool noisy estimates: ``tr(Sigma)`` and ``|G|^2`` are averaged
        separately, then divided. If the loss never gets there, the last checkpoints are used.
        """
        hits = np.flatnonzero(self.eval_loss <= loss)
        i = int(hits[0]) if len(hits) else len(self.steps) - 1
        pool = slice(max(0, i - window), min(len(self.steps), i + window + 1))
        return float(np.mean(self.trace_sigma[pool]) / np.mean(self.gradient_sq[pool]))


def noise_scale_during_training(arrays: Arrays, batch_size: int, lr: float, momentum: float,
                                checkpoints, seed: int, hidden: int = 32, b_small: int = 32,
                                k: int = 32, repeats: int = 8) -> NoiseScaleRun:
    """Train one MLP and estimate ``B_simple`` (:func:`mgpu.lesson02.noise_scale.measure_mlp`) at each checkpoint.

    The gradients are those of the training loss on the training subset, measured at the current
    weights with ``k`` small batches of ``b_small`` (``repeats`` times).
    """
    from mgpu.lesson02 import noise_scale

    classes = int(arrays.y_train.max()) + 1
    params = multimodel.init_params(1, arrays.n_features, hidden, classes, seed * 1000)
    velocity = tuple(tf.zeros_like(p) for p in params)
    checkpoints = np.asarray(sorted(set(int(c) for c in checkpoints)))
    rng = np.random.default_rng([seed, batch_size, 2])
    batches = shuffled_batches(len(arrays.x_train), batch_size, int(checkpoints[-1]), rng)
    x_all, y_all = tf.constant(arrays.x_train), tf.constant(arrays.y_train)
    done, rows = 0, []
    for stop in checkpoints:
        if stop > done:
            chunk = batches[done:stop]
            params, velocity = multimodel.sgd_chunk(params, velocity, x_all, y_all, chunk,
                                                    np.full((len(chunk), 1), lr), np.array([momentum]))
            done = int(stop)
        est = noise_scale.measure_mlp(params, arrays.x_train, arrays.y_train, b_small, k, repeats, rng)
        loss = float(multimodel.mean_losses(params, arrays.x_eval, arrays.y_eval)[0])
        rows.append((done, loss, est.b_simple, est.gradient_sq, est.trace_sigma))
    columns = [np.array(c, float) for c in zip(*rows)]
    return NoiseScaleRun(*columns)


# --------------------------------------------------------------------------------------------
# A fixed epoch budget under LR scaling rules and warm-ups (Goyal et al. 2017)

#: The (scaling rule, warm-up) pairs :func:`scaling_study` trains at every batch size.
SCALING_VARIANTS = (("linear", "gradual"), ("linear", "constant"), ("linear", "none"),
                    ("sqrt", "gradual"), ("none", "none"))


def scaling_study(arrays: Arrays, batch_sizes, base_batch: int, base_lr: float, momentum: float,
                  epochs: float, warmup_epochs: float, seed: int, hidden: int = 32, replicas: int = 1,
                  variants=SCALING_VARIANTS, progress: bool = True,
                  lr_rule=None) -> dict[str, dict[int, float]]:
    """Held-out accuracy after ``epochs`` epochs at each batch size, for each (rule, warm-up) variant.

    The learning rate is ``lr_rule(base_lr, base_batch, B, rule)`` (notebook 02's exercise 2 passes
    the learner's; :func:`scaled_lr` by default); a warm-up starts from
    ``1 / k`` of it (``k = B / base_batch``, i.e. from the base rate) and lasts ``warmup_epochs``.
    All variants start from the same weights and see the same minibatches, and variants with the same
    schedule (all of them at ``k = 1``) are trained once, so they report the same accuracy; with
    ``replicas > 1`` each variant is also trained from that many independent starts and the
    accuracies averaged.
    Returns ``{"linear/gradual": {B: accuracy, ...}, ...}`` (accuracy on ``x_test``).
    """
    n = len(arrays.x_train)
    classes = int(arrays.y_train.max()) + 1
    out = {f"{rule}/{warm}": {} for rule, warm in variants}
    for b in batch_sizes:
        steps = max(1, int(round(epochs * n / b)))
        warm_steps = int(round(warmup_epochs * n / b))
        k = b / base_batch
        columns = []
        for rule, warm in variants:
            lr = (lr_rule or scaled_lr)(base_lr, base_batch, b, rule)
            first = min(1.0, base_lr / lr)
            columns.append(np.asarray(lr * warmup_factors(steps, warm_steps, warm, first), np.float32))
        # Variants whose schedules coincide (all of them at k = 1) are trained once and share the result:
        # a model's place in the batched arithmetic changes its round-off, which training would amplify.
        schedules, which = np.unique(np.stack(columns, axis=1), axis=1, return_inverse=True)
        which = np.asarray(which).reshape(-1)
        u = schedules.shape[1]
        starts = [multimodel.init_params(u, arrays.n_features, hidden, classes, seed * 1000 + 7 + r)
                  for r in range(replicas)]
        start = tuple(tf.concat([s[i] for s in starts], axis=0) for i in range(4))
        table = np.tile(schedules, (1, replicas))
        params = train_fixed_epochs(arrays, b, table, momentum, epochs, seed, hidden=hidden, params=start)
        acc = multimodel.accuracies(params, arrays.x_test, arrays.y_test).reshape(replicas, u).mean(axis=0)[which]
        for (rule, warm), a in zip(variants, acc):
            out[f"{rule}/{warm}"][int(b)] = float(a)
        if progress:
            print(f"  batch {b:>5} (k = {k:g}, {steps} steps): "
                  + ", ".join(f"{rule}/{warm} {a:.3f}" for (rule, warm), a in zip(variants, acc)),
                  flush=True)
    return out
