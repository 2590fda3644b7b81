"""The simulated accelerator: a modelled device for each worker on a machine with fewer GPUs than workers.

On a GPU, a worker's math runs on the device while the host's cores and the network stay free for
the input pipeline and the all-reduce. Worker processes on CPU cores have no such split: N workers
share the cores with each other and with their communication, so the speed-up of N workers on a
laptop says more about the laptop than about data parallelism. The course therefore gives each
worker a *modelled device* (``COURSE_MAP.md``, "The simulated accelerator"):

- the math runs for real (losses, accuracies and weights are real);
- a training step takes the time the device :class:`Profile` gives for its batch: once the real
  forward and backward passes are done, the worker waits (a sleep, which holds no core) until the
  modelled device would have finished, and only then hands its gradients to the all-reduce;
- an evaluation batch likewise takes the profile's forward time;
- communication, data loading and launching are real and are not modelled.

So a step costs ``device time + all-reduce``, as on a GPU without overlap. The device is slower than
the workers' math: :func:`calibrate` times the model's step with all the workers computing at once,
as they will, and slows that by a margin, to leave room for every worker's math inside its device's
time; :attr:`ModelledDevice.overruns` counts the steps where it did not fit. The single-worker baseline runs on
the same profile.

In a training script (one line; a no-op where the worker has a GPU or no profile was given)::

    fit_callbacks.append(accelerator.ModelledDevice(batch))

and in the notebook that launches it::

    profile = accelerator.calibrate(models.small_resnet, shape, classes, batch=64, workers=4)
    launch.run_script(script, n, args, env=profile.env())
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable

import tensorflow as tf

#: The environment variable that carries a :class:`Profile` to the workers (JSON).
PROFILE_VARIABLE = "MGPU_ACCELERATOR"
#: How much slower than the workers' math (timed all at once) the device is: room for the input
#: pipeline, Horovod's background thread and the machine's own noise beside it.
DEFAULT_MARGIN = 2.0


@dataclass(frozen=True)
class Profile:
    """A modelled device: the time its training step and its forward pass take per example."""

    name: str
    train_s_per_example: float  # forward + backward + the optimizer's update, per example
    eval_s_per_example: float   # forward only, per example
    basis: str = ""              # how the numbers were set, one line for the notebook to print

    def __post_init__(self):
        for field in ("train_s_per_example", "eval_s_per_example"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"Profile.{field} must be a positive number of seconds, got {value!r}")

    def train_step_s(self, batch: int) -> float:
        return self.train_s_per_example * batch

    def eval_step_s(self, batch: int) -> float:
        return self.eval_s_per_example * batch

    def env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """``env`` plus the variable that hands this profile to every worker of a launch."""
        return {**(env or {}), PROFILE_VARIABLE: json.dumps(asdict(self))}

    def line(self, math_runs: bool = True) -> str:
        """The one visible line a notebook prints wherever it times workers on this profile.

        ``math_runs=False`` for a device whose step is the wait alone, without the model's math
        (notebook 03, where the lesson is the input pipeline that feeds it)."""
        if not math_runs:
            return (f"Timed on the simulated accelerator '{self.name}': each training step takes "
                    f"{self.train_s_per_example * 1e3:.2f} ms per image, a wait that holds no core, without the "
                    f"model's math; the input pipeline runs for real on the CPU. {self.basis}").strip()
        return (f"Timed on the simulated accelerator '{self.name}': each worker's math runs for real on the CPU, "
                f"and each training step takes {self.train_s_per_example * 1e3:.2f} ms per image "
                f"(the rest of a step is a wait that holds no core); all-reduce, data and launch are real. "
                f"{self.basis}").strip()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Profile | None":
        """The profile a launch handed to this process, or None."""
        text = (os.environ if environ is None else environ).get(PROFILE_VARIABLE)
        if not text:
            return None
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError) as error:
            raise ValueError(f"{PROFILE_VARIABLE} does not hold a device profile ({error}): "
                             "unset it, or pass Profile.env() to the launch") from None


def profile_from_rate(name: str, train_s: float, eval_s: float, *, workers: int, cores: int,
                      margin: float = DEFAULT_MARGIN) -> Profile:
    """The device for ``workers`` workers whose math takes ``train_s`` (``eval_s``) per example when
    all of them compute at once on ``cores`` cores: ``margin`` times slower than that."""
    if margin < 1:
        raise ValueError(f"margin must be at least 1 (the math has to fit in the device's time), got {margin}")
    return Profile(name=name, train_s_per_example=train_s * margin, eval_s_per_example=eval_s * margin,
                   basis=f"Its speed: the model's step timed with all {workers} worker{'s' if workers > 1 else ''} "
                         f"computing at once on this machine's {cores} core{'s' if cores > 1 else ''}, "
                         f"then made {margin:g}x slower, to leave room for every worker's math in its device's time.")


def _time_together(build: Callable, shape, classes: int, batch: int, steps: int, seed: int) -> dict:
    """Seconds per example of a training step and of a forward pass, timed on every worker of this
    launch at once (each on its own cores); rank 0 returns the slowest worker's."""
    import horovod.tensorflow as hvd
    import numpy as np

    hvd.init()
    rng = np.random.default_rng(seed + hvd.rank())
    x = rng.normal(size=(batch, *shape)).astype("float32")
    y = rng.integers(0, classes, size=batch)
    model = build(tuple(shape), classes, seed=seed)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    step = model.make_train_function()
    forward = tf.function(lambda t: model(t, training=False))
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    for _ in range(3):  # trace and warm up
        step(iterator)
        forward(x)
    hvd.allreduce(tf.constant(0.0), name="calibration_start")  # every worker starts timing together
    train, infer = [], []
    for _ in range(steps):  # the median of single steps: robust to a passing disturbance
        started = time.perf_counter()
        step(iterator)
        train.append(time.perf_counter() - started)
        started = time.perf_counter()
        forward(x).numpy()
        infer.append(time.perf_counter() - started)
    mine = tf.constant([[float(np.median(train)) / batch, float(np.median(infer)) / batch]], tf.float64)
    every = hvd.allgather(mine).numpy()
    return {"train_s": float(every[:, 0].max()), "eval_s": float(every[:, 1].max())}


def calibrate(build: Callable, shape, classes: int, *, batch: int, workers: int, cores: int | None = None,
              name: str | None = None, margin: float = DEFAULT_MARGIN, steps: int = 10, seed: int = 0) -> Profile:
    """Time ``build``'s model on this machine and return the device for ``workers`` workers.

    ``build(shape, classes, seed=...)`` returns an uncompiled Keras model (``mgpu.runtime.models`` has them).
    ``workers`` processes time their steps at once, each pinned to its own ``cores // workers`` cores
    (at least one, shared when they are fewer), as the timed runs are; the slowest sets the device.
    """
    from mgpu.runtime import launch

    cores = cores or launch.available_cores()
    measured = launch.run(_time_together, workers, args=(build, tuple(shape), classes, batch, steps, seed),
                          verbose=False, cores_per_worker=max(1, cores // workers)).value
    model = getattr(build, "func", build)  # a functools.partial names its function
    name = name or f"sim-{getattr(model, '__name__', 'model')}-{workers}w{cores}c"
    return profile_from_rate(name, measured["train_s"], measured["eval_s"], workers=workers, cores=cores,
                             margin=margin)


def _has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


class ModelledDevice(tf.keras.callbacks.Callback):
    """A Keras callback that gives this worker's steps the time of its modelled device.

    ``batch`` is the per-worker training batch; ``eval_batch`` the batch Keras evaluates with
    (its default, 32, when ``fit`` gets arrays as validation data). ``profile`` defaults to the one
    the launch handed over (:meth:`Profile.env`); without one, or on a worker that has a GPU, the
    callback does nothing and the real device is timed (:attr:`active` says which).

    It hooks the optimizer where the gradients are ready and not yet all-reduced: Horovod's
    ``DistributedOptimizer._allreduce``, or ``compute_gradients`` of a plain optimizer. There the
    worker sleeps until the device's time has passed since the step began. After ``fit``,
    :attr:`steps` and :attr:`overruns` say how many steps were timed and in how many the real math
    took longer than the device (the step then took the math's time), the first step (which traces
    the graph) left out.
    """

    def __init__(self, batch: int, eval_batch: int = 32, profile: Profile | None = None):
        super().__init__()
        if batch < 1 or eval_batch < 1:
            raise ValueError(f"batch and eval_batch must be at least 1, got {batch} and {eval_batch}")
        self.profile = profile if profile is not None else Profile.from_env()
        self.active = self.profile is not None and not _has_gpu()
        self.batch, self.eval_batch = batch, eval_batch
        self.steps = self.overruns = 0
        self.waited_s = 0.0
        self._started = self._eval_started = time.perf_counter()
        self._hooked = None

    # -- training steps: the wait sits between the gradients and the all-reduce
    def _wait_for_device(self):
        self.steps += 1
        left = self._started + self.profile.train_step_s(self.batch) - time.perf_counter()
        if left > 0:
            time.sleep(left)
            self.waited_s += left
        elif self.steps > 1:  # the first step also traces the graph: it is not the math overrunning
            self.overruns += 1
        return 0.0

    def _after_device(self, grads):
        ready = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
        with tf.control_dependencies(ready):
            done = tf.py_function(self._wait_for_device, [], tf.float32)
        with tf.control_dependencies([done]):
            return [None if g is None else
                    tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
                    if isinstance(g, tf.IndexedSlices) else tf.identity(g) for g in grads]

    def _hook(self, optimizer):
        # An attribute of this optimizer object only: its class, and any other optimizer, stay as they are.
        if hasattr(optimizer, "_allreduce"):  # Horovod's DistributedOptimizer
            inner = optimizer._allreduce

            def _allreduce(grads, variables):
                return inner(self._after_device(list(grads)), variables)

            optimizer._allreduce = _allreduce
        else:
            inner = optimizer.compute_gradients

            def compute_gradients(loss, var_list, tape=None):
                grads_and_vars = list(inner(loss, var_list, tape=tape))
                grads = self._after_device([g for g, _ in grads_and_vars])
                return list(zip(grads, [v for _, v in grads_and_vars]))

            optimizer.compute_gradients = compute_gradients

    def on_train_begin(self, logs=None):
        # Before the first step traces the train function, which then holds the wait.
        if self.active and self._hooked is not self.model.optimizer:
            self._hook(self.model.optimizer)
            self._hooked = self.model.optimizer

    def on_train_batch_begin(self, batch, logs=None):
        self._started = time.perf_counter()

    # -- evaluation batches: no communication inside, so the wait can follow the batch
    def on_test_batch_begin(self, batch, logs=None):
        self._eval_started = time.perf_counter()

    def on_test_batch_end(self, batch, logs=None):
        if self.active:
            left = self._eval_started + self.profile.eval_step_s(self.eval_batch) - time.perf_counter()
            if left > 0:
                time.sleep(left)
