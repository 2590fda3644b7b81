"""Notebook 05's accuracy-at-scale recipes: how to set the learning rate when the batch grows with the workers.

With N workers each processing ``batch`` images, one step sees ``N * batch`` images, so an epoch has
N times fewer steps. A :class:`Recipe` says how training compensates:

- ``scaling``: the learning rate for N workers is the single-worker rate times 1 (``"none"``),
  sqrt(N) (``"sqrt"``, Krizhevsky 2014; Hoffer et al. 2017) or N (``"linear"``, Goyal et al. 2017);
- ``warmup_epochs``: Horovod's ``LearningRateWarmupCallback`` ramps the rate up from its
  single-worker value over the first epochs (Goyal et al.'s gradual warm-up);
- ``momentum`` and ``optimizer``: plain SGD, momentum SGD, or a large-batch optimizer with
  layer-wise trust ratios (:mod:`mgpu.lesson05.optimizers`: LARS, LAMB).

:func:`train_recipes` runs inside every Horovod worker (launch it with :func:`mgpu.runtime.launch.run`): it
trains one fresh model per recipe, all from the same initial weights and data, writes rank 0's
per-epoch log as a CSV (:class:`~mgpu.runtime.callbacks.WallClockCSVLogger`) and returns rank 0's
:class:`RecipeRun` for each. :func:`time_to_target` and :func:`read_log` turn the logs into the
lab's numbers; :func:`mgpu.lesson05.figures.accuracy_vs_time` draws them.

A run *diverges* when its averaged training loss stops being finite, or when its validation accuracy
falls to chance while its training loss is no lower than a uniform guess's, ln(classes); such a run
is stopped at the end of that epoch on every rank at once.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

SCALINGS = ("none", "sqrt", "linear")
OPTIMIZERS = ("sgd", "lars", "lamb")


@dataclass(frozen=True)
class Recipe:
    """One way to train on ``workers`` workers; ``lr`` is the single-worker learning rate."""

    name: str
    workers: int
    lr: float
    scaling: str = "linear"
    warmup_epochs: float = 0.0
    momentum: float = 0.0
    optimizer: str = "sgd"
    # The learning rate at a (fractional) epoch, for this recipe's workers: when given, it replaces
    # the scaling, the warm-up and the cosine decay, and ``lr`` is only its peak, for the table
    # (notebook 05's exercise writes one).
    schedule: Callable[[float], float] | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"recipe {self.name!r}: scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"recipe {self.name!r}: optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.workers < 1 or self.lr <= 0 or self.warmup_epochs < 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"recipe {self.name!r}: needs workers >= 1, lr > 0, warmup_epochs >= 0 "
                             f"and 0 <= momentum < 1")

    def learning_rate(self, workers: int | None = None) -> float:
        """The learning rate after scaling for ``workers`` (default: the recipe's own); with a
        schedule, ``lr`` as given (the schedule's peak, for the table)."""
        if self.schedule is not None:
            return self.lr
        return scaled_learning_rate(self.lr, self.workers if workers is None else workers, self.scaling)


def scaled_learning_rate(lr: float, workers: int, scaling: str) -> float:
    """``lr`` times 1, sqrt(workers) or workers."""
    factor = {"none": 1.0, "sqrt": math.sqrt(workers), "linear": float(workers)}
    if scaling not in factor:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    return lr * factor[scaling]


@dataclass(frozen=True)
class Settings:
    """What every recipe shares: the data, the model and the length of training."""

    epochs: int = 6
    batch: int = 32                 # images per step on each worker
    train_images: int = 16384
    val_images: int = 2000
    filters: tuple = (16, 32)
    dense: int = 64
    seed: int = 0                   # picks the data variant (and, unless init_seed is set, the rest)
    dataset: str = "auto"
    record_steps: int = 100         # steps whose learning rate and loss are kept for the warm-up plot
    cosine_decay: bool = False      # after any warm-up, the rate falls to zero along a half cosine
    init_seed: int | None = None    # the initial weights and shuffles (default: seed)
    # Validations per epoch: how finely the time to a target accuracy is resolved (the rate schedules,
    # the divergence check and the number of steps do not change with it).
    evaluations_per_epoch: int = 1


@dataclass
class RecipeRun:
    """What one recipe did (rank 0's view; metrics are averaged over the workers)."""

    recipe: Recipe
    val_accuracy: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    wall_times: list = field(default_factory=list)    # seconds since the first step ended, per evaluation
    learning_rates: list = field(default_factory=list)
    first_steps: dict = field(default_factory=dict)   # "lr" and the step's own "loss" at each of the first steps
    diverged: bool = False
    log_path: str | None = None
    device_overruns: int = 0                          # steps whose math outran the modelled device
    device_steps: int = 0                             # steps timed on it
    evaluations_per_epoch: int = 1                    # val_accuracy and wall_times have this many per epoch
    device_seconds: float = math.nan                  # of the last wall time, the modelled device's steps and evaluations
    chance: float = math.nan                          # a uniform guess's accuracy (1 / classes)

    @property
    def final_val_accuracy(self) -> float:
        return self.val_accuracy[-1] if self.val_accuracy else math.nan

    @property
    def collapsed(self) -> bool:
        """Stopped as diverged, or validating at chance when it ended (a run stopped by the end of training
        before the divergence check could see a loss above a uniform guess's)."""
        return self.diverged or self.final_val_accuracy <= self.chance + 0.02


def _optimizer(recipe: Recipe, lr: float):
    from mgpu.lesson05 import optimizers

    if recipe.optimizer == "lars":
        return optimizers.LARS(lr, momentum=recipe.momentum)
    if recipe.optimizer == "lamb":
        return optimizers.LAMB(lr)
    return tf.keras.optimizers.SGD(lr, momentum=recipe.momentum)


def train_recipes(recipes, settings: Settings, log_dir: str, log_prefix: str = "",
                  verbose: bool = True) -> list[RecipeRun]:
    """Train one model per recipe on this Horovod job's workers; rank 0 returns the runs.

    Every recipe whose ``workers`` differs from the job's size is refused, so a recipe's numbers
    always come from the number of workers it names. Logs go to ``log_dir/<prefix><name>.csv``.
    """
    import horovod.tensorflow.keras as hvd

    from mgpu.runtime import accelerator, callbacks, data, models

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    wrong = [r.name for r in recipes if r.workers != size]
    if wrong:
        raise ValueError(f"recipes {wrong} are for another number of workers than this job's {size}")
    dataset = data.load(settings.dataset, seed=settings.seed, verbose=False)  # the caller has named it
    x = dataset.x_train[:settings.train_images][rank::size]
    y = dataset.y_train[:settings.train_images][rank::size]
    # Each rank validates on its own share; MetricAverageCallback then averages equal-sized shares.
    val_images = settings.val_images - settings.val_images % size
    x_val = dataset.x_test[:val_images][rank::size]
    y_val = dataset.y_test[:val_images][rank::size]
    steps_per_epoch = settings.train_images // (settings.batch * size)
    # Keras validates at the end of its "epochs": with k evaluations per epoch, each Keras epoch is a
    # k-th of a pass over the data, and every schedule below is given in those units.
    k = settings.evaluations_per_epoch
    if k < 1 or steps_per_epoch % k:
        raise ValueError(f"evaluations_per_epoch={k} must be at least 1 and divide the {steps_per_epoch} steps "
                         f"of an epoch on {size} worker(s)")
    steps_per_part = steps_per_epoch // k
    chance = 1.0 / dataset.num_classes

    init_seed = settings.seed if settings.init_seed is None else settings.init_seed

    runs = []
    for recipe in recipes:
        tf.keras.backend.clear_session()
        # The same initial weights and shuffles for every recipe, so only the recipe differs.
        tf.keras.utils.set_random_seed(init_seed + 1000 * rank)
        model = models.small_cnn(dataset.x_train.shape[1:], dataset.num_classes, filters=settings.filters,
                                 dense=settings.dense, seed=init_seed)
        lr = recipe.learning_rate(size) if recipe.schedule is None else float(recipe.schedule(0.0))
        optimizer = hvd.DistributedOptimizer(_optimizer(recipe, lr))
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        train = (tf.data.Dataset.from_tensor_slices((x, y))
                 .shuffle(len(x), seed=init_seed + rank).repeat().batch(settings.batch)
                 .prefetch(tf.data.AUTOTUNE))
        log_path = Path(log_dir) / f"{log_prefix}{recipe.name}.csv"
        # Trace the evaluation now, off the clock: like the first training step (which the clock also
        # leaves out), tracing the graph is a one-off cost of the framework, not of the device.
        model.evaluate(x_val[:settings.batch], y_val[:settings.batch], verbose=0)
        stop = _StopWhenDiverged(chance, k)
        rates = _RecordLearningRate()
        steps = _RecordFirstSteps(settings.record_steps)
        # Launched with a device profile, each step takes the modelled device's time (mgpu.runtime.accelerator).
        device = accelerator.ModelledDevice(settings.batch)
        fit_callbacks = [device, hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback()]
        if recipe.schedule is not None:
            fit_callbacks.append(_FollowSchedule(recipe.schedule, steps_per_part, k))
        elif recipe.warmup_epochs > 0:
            # Starts at lr / size (the single-worker rate) and reaches lr after warmup_epochs. Both
            # Horovod callbacks rescale SGD's velocity as the rate changes (momentum correction, Goyal
            # et al. 2017, section 2.1); our LARS keeps its velocity where Horovod does not look for
            # it, so it goes without (LAMB has no momentum).
            fit_callbacks.append(hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=lr, warmup_epochs=recipe.warmup_epochs * k, momentum_correction=recipe.optimizer == "sgd",
                steps_per_epoch=steps_per_part, verbose=0))
        if recipe.schedule is None and settings.cosine_decay and settings.epochs > recipe.warmup_epochs:
            # Then down to zero along a half cosine (Loshchilov & Hutter 2017), batch by batch, so
            # every recipe ends where its run settled rather than where its last large step landed.
            fit_callbacks.append(hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=lr, multiplier=_cosine(recipe.warmup_epochs * k, settings.epochs * k),
                start_epoch=recipe.warmup_epochs * k, end_epoch=settings.epochs * k, staircase=False,
                momentum_correction=recipe.optimizer == "sgd", steps_per_epoch=steps_per_part))
        first_step_s = device.profile.train_step_s(settings.batch) if device.active else 0.0
        fit_callbacks += [rates, steps, stop, callbacks.WallClockCSVLogger(log_path, enabled=rank == 0, parts_per_epoch=k,
                                                                           first_step_s=first_step_s)]
        started = time.perf_counter()
        history = model.fit(train, epochs=settings.epochs * k, steps_per_epoch=steps_per_part,
                            validation_data=(x_val, y_val), callbacks=fit_callbacks, verbose=0)
        if verbose and rank == 0:
            acc = history.history["val_accuracy"]
            # The clock of the log (from the start of training to the last evaluation), which the
            # figure and the table read too.
            logged = read_log(log_path)
            seconds = logged[-1]["wall_time"] if logged else time.perf_counter() - started
            epochs_done = len(acc) / k
            on_device = _device_seconds(device, settings.batch, len(acc), len(x_val))
            print(f"  {recipe.name:<24} lr {recipe.learning_rate(size):<8.4g} final val acc {acc[-1]:.3f} after "
                  f"{epochs_done:g} epoch{'' if epochs_done == 1 else 's'}"
                  f"{' (diverged)' if stop.diverged else ''}, {seconds:.1f} s"
                  + (f" = {on_device:.1f} s of device steps + {seconds - on_device:.1f} s beside them"
                     if math.isfinite(on_device) else ""), flush=True)
        runs.append(RecipeRun(recipe, [float(v) for v in history.history["val_accuracy"]],
                              [float(v) for v in history.history["loss"]], [], rates.values,
                              steps.values, stop.diverged, str(log_path), device.overruns, device.steps, k,
                              _device_seconds(device, settings.batch, len(history.history["val_accuracy"]),
                                              len(x_val)), chance))
    if rank == 0:
        for run in runs:
            run.wall_times = [row["wall_time"] for row in read_log(run.log_path)]
    return runs


def _device_seconds(device, batch: int, evaluations: int, val_images: int) -> float:
    """The modelled device's time for the steps and evaluations a run took (NaN without a device)."""
    if not device.active:
        return math.nan
    eval_batches = evaluations * math.ceil(val_images / device.eval_batch)
    return device.steps * device.profile.train_step_s(batch) + eval_batches * device.profile.eval_step_s(device.eval_batch)


def _cosine(start: float, end: float):
    """The multiplier of the rate at (fractional) epoch e: 1 at ``start``, 0 at ``end``."""
    from mgpu.runtime.callbacks import half_cosine

    return lambda epoch: half_cosine(epoch, start, end)


def divergence_sweep(recipe: Recipe, settings: Settings, seeds, log_dir: str, epochs: int = 1) -> list[dict]:
    """Train ``recipe`` for ``epochs`` from each seed's initial weights and shuffles (same data).

    Runs inside every Horovod worker; rank 0 prints one line per seed as it ends and returns
    ``[{"seed", "diverged", "val_accuracy"}]``. Whether a rate is too high for the untrained
    network is a matter of the draw: one run says little, a sweep gives the rate of divergence.
    """
    import dataclasses

    import horovod.tensorflow.keras as hvd

    outcomes = []
    for seed in seeds:
        swept = dataclasses.replace(settings, epochs=epochs, init_seed=int(seed), cosine_decay=False)
        run = train_recipes([recipe], swept, log_dir, log_prefix=f"seed{seed}-", verbose=False)[0]
        outcomes.append({"seed": int(seed), "diverged": run.diverged, "collapsed": run.collapsed,
                         "val_accuracy": run.final_val_accuracy})
        if hvd.rank() == 0:
            label = ("diverged" if run.diverged else
                     "collapsed (at chance, though its training loss stayed under ln(classes): not stopped)"
                     if run.collapsed else "trained")
            print(f"  seed {seed:>3}: {label} "
                  f"(val acc {run.final_val_accuracy:.3f} after {len(run.val_accuracy) / run.evaluations_per_epoch:g} "
                  f"epoch{'' if len(run.val_accuracy) == run.evaluations_per_epoch else 's'})",
                  flush=True)
    return outcomes


class _FollowSchedule(tf.keras.callbacks.Callback):
    """Sets the rate before every step to ``schedule(epoch)``, ``epoch`` the fraction of passes over
    the data done so far; Keras' epochs are ``parts`` to a pass (one per validation)."""

    def __init__(self, schedule: Callable[[float], float], steps_per_part: int, parts: int = 1):
        super().__init__()
        self.schedule, self.steps_per_part, self.parts, self.part = schedule, steps_per_part, parts, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.part = epoch

    def on_train_batch_begin(self, batch, logs=None):
        epoch = (self.part + batch / self.steps_per_part) / self.parts
        rate = float(self.schedule(epoch))
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"the schedule gave the rate {rate} at epoch {epoch:.3f}: "
                             "a rate must be a finite number >= 0")
        tf.keras.backend.set_value(self.model.optimizer.learning_rate, rate)


class _StopWhenDiverged(tf.keras.callbacks.Callback):
    """Stop at the end of an epoch whose (worker-averaged) loss is not finite, or whose validation
    accuracy is chance while its training loss is no better than a uniform guess.

    Accuracy alone is not enough: at a high rate a run that is learning can land, at the moment an
    epoch ends, on weights that validate at chance (05's smoke setting, 24 steps per epoch, did so
    mid warm-up with an epoch loss near 2.0). Every collapse measured in 05 averaged at least 2.33 over
    its epoch, above ln(10) = 2.303. Placed after ``MetricAverageCallback``, so every rank sees the
    same numbers and stops together.
    """

    def __init__(self, chance: float, parts: int = 1):
        super().__init__()
        self.chance, self.parts = chance, parts
        self.uniform_loss = math.log(1.0 / chance)
        self.diverged = False

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        loss = logs.get("loss", math.nan)
        if math.isfinite(loss) and (epoch + 1) % self.parts:
            return  # judged at the end of whole epochs (Keras' epochs are parts of one), unless not finite
        at_chance = logs.get("val_accuracy", 1.0) <= self.chance + 0.02 and loss >= self.uniform_loss
        if not math.isfinite(loss) or at_chance:
            self.diverged = True
            self.model.stop_training = True


class _RecordLearningRate(tf.keras.callbacks.Callback):
    """The optimizer's learning rate at the end of every epoch (after any warm-up step)."""

    def __init__(self):
        super().__init__()
        self.values: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.values.append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))


class _RecordFirstSteps(tf.keras.callbacks.Callback):
    """The learning rate and this rank's loss at each of the first steps: the step's own loss, recovered
    from Keras' running mean, which restarts with each of its epochs (each evaluation)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.values: dict[str, list[float]] = {"lr": [], "loss": []}
        self._mean = 0.0

    def on_train_batch_end(self, batch, logs=None):
        mean = float((logs or {}).get("loss", math.nan))
        # The mean of batches 0..batch (equal batches): this batch's loss is (batch + 1) m_b - batch m_(b-1).
        own = mean if batch == 0 else (batch + 1) * mean - batch * self._mean
        self._mean = mean
        if len(self.values["loss"]) < self.steps:
            self.values["lr"].append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))
            self.values["loss"].append(own)


def read_log(path) -> list[dict]:
    """The rows of a :class:`~mgpu.runtime.callbacks.WallClockCSVLogger` CSV, as floats."""
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


#: Accuracies are float32 counts of a validation set: 0.85 may come back as 0.8499999.
_ROUNDING = 1e-6


def time_to_target(run: RecipeRun, target: float) -> float | None:
    """Seconds from the start of training to the first validation with ``val_accuracy >= target``."""
    for accuracy, seconds in zip(run.val_accuracy, run.wall_times):
        if accuracy >= target - _ROUNDING:
            return float(seconds)
    return None


def epochs_to_target(run: RecipeRun, target: float) -> float | None:
    """The epochs (in steps of 1 / ``evaluations_per_epoch``) until ``val_accuracy >= target`` (None if never)."""
    for part, accuracy in enumerate(run.val_accuracy, start=1):
        if accuracy >= target - _ROUNDING:
            return part / run.evaluations_per_epoch
    return None


def summary_rows(runs, target: float) -> list[dict]:
    """One row per run for the notebook's table."""
    rows = []
    for run in runs:
        r = run.recipe
        rows.append({"recipe": r.name, "workers": r.workers, "optimizer": r.optimizer,
                     "momentum": r.momentum, "lr": r.learning_rate(),
                     "warmup_epochs": "its schedule" if r.schedule is not None else r.warmup_epochs,
                     "final_val_acc": run.final_val_accuracy, "diverged": run.diverged,
                     "epochs_to_target": epochs_to_target(run, target),
                     "seconds_to_target": time_to_target(run, target),
                     "seconds": run.wall_times[-1] if run.wall_times else math.nan})
    return rows


def summary_table(runs, target: float):
    """The recipes side by side (a :class:`mgpu.runtime.tables.Table`): accuracy, and epochs and seconds to
    the target (seconds compare across recipes when the runs were timed on the simulated accelerator
    or on a GPU per worker)."""
    from mgpu.runtime.tables import Table

    rows = [{"recipe": r["recipe"], "lr": r["lr"], "momentum": r["momentum"], "warm-up epochs": r["warmup_epochs"],
             "final val acc": r["final_val_acc"], "epochs to target": r["epochs_to_target"],
             "seconds to target": r["seconds_to_target"], "diverged": "yes" if r["diverged"] else ""}
            for r in summary_rows(runs, target)]
    return Table(rows, formats={"lr": ".3g", "momentum": ".2g", "warm-up epochs": ".3g", "final val acc": ".3f",
                                "seconds to target": ".1f"})


def lab_recipes(workers: int, lr: float, momentum: float = 0.9, warmup_epochs: float = 2.0,
                lars_lr: float = 1.0, lamb_lr: float = 0.002) -> list[Recipe]:
    """The lab's recipes for ``workers`` workers, from the single-worker SGD learning rate ``lr``.

    The momentum recipe divides ``lr`` by 1 / (1 - momentum), so its effective step
    lr / (1 - momentum) equals plain SGD's: what momentum changes is how gradients are averaged
    over steps, not the step size. LARS scales its trust-ratio step linearly; LAMB, an Adam-style
    method, scales by sqrt(workers) (You et al. 2020).
    """
    return [
        Recipe("no scaling", workers, lr, "none"),
        Recipe("sqrt scaling", workers, lr, "sqrt"),
        Recipe("linear scaling", workers, lr, "linear"),
        Recipe("linear + warm-up", workers, lr, "linear", warmup_epochs),
        Recipe("+ momentum", workers, lr * (1 - momentum), "linear", warmup_epochs, momentum),
        Recipe("LARS", workers, lars_lr, "linear", warmup_epochs, momentum, "lars"),
        Recipe("LAMB", workers, lamb_lr, "sqrt", warmup_epochs, 0.0, "lamb"),
    ]
