"""What communication costs (notebook 07): collectives timed on Horovod, the alpha-beta model fitted to them,
tensor fusion counted in Horovod's timeline, and the all-reduce hidden behind the backward pass.

- :func:`time_collectives` (on Horovod workers): seconds of ``hvd.allreduce``, ``allgather``,
  ``reducescatter`` and ``broadcast`` by message size;
- :func:`fit_alpha_beta`: least squares of ``time = a + n / b`` (a latency, b a bandwidth) on the ratio of
  line to measurement, its R^2 and its worst miss;
  :func:`ring_allreduce_s` the ring's cost 2(N-1) alpha + 2(N-1)/N n / beta (Thakur, Rabenseifner &
  Gropp 2005; Patarasuk & Yuan 2009) and :func:`link_from_allreduce` the alpha and beta a fit implies;
- :func:`fusion_steps` (on Horovod workers): training steps of a model of many small gradient tensors,
  timed, with a stretch of Horovod's timeline recorded to count the all-reduce calls
  (:func:`mgpu.runtime.timeline.collective_calls`);
- :func:`overlap_steps` (on Horovod workers): a step on the simulated accelerator whose backward pass
  hands each layer's gradients over as the modelled device produces them, timed without
  communication, with the all-reduce after the whole backward pass, with
  ``hvd.DistributedGradientTape`` (each gradient's all-reduce starts as soon as it exists), and the
  all-reduce alone;
- :func:`scaling_efficiency`: compute / (compute + exposed communication).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast")


# --------------------------------------------------------------------------------------------
# Timing collectives


def _collective(op: str, hvd):
    import tensorflow as tf  # noqa: F401

    return {"allreduce": lambda x: hvd.allreduce(x, op=hvd.Sum),
            "allgather": lambda x: hvd.allgather(x),
            "reducescatter": lambda x: hvd.reducescatter(x, op=hvd.Sum),
            "broadcast": lambda x: hvd.broadcast(x, root_rank=0)}[op]


def message_values(op: str, nbytes: int, workers: int) -> int:
    """float32 values each worker hands the collective for a message of ``nbytes``.

    ``nbytes`` is the vector every worker holds at the end of an all-reduce or a broadcast, the result of
    an all-gather (each worker contributes 1/N of it) and the input of a reduce-scatter (each keeps 1/N)."""
    values = nbytes // 4
    return values // workers if op == "allgather" else values


def time_collectives(sizes, repeats: int = 3, collectives=COLLECTIVES) -> list[dict]:
    """On every Horovod worker: each collective on float32 messages of ``sizes`` bytes, ``repeats`` timed
    calls after one untimed; rank 0 returns rows ``{op, bytes, seconds, workers}``, seconds being the
    fastest call as the slowest rank saw it (noise only ever adds time). Sizes must be multiples of
    4 x workers bytes."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    n = hvd.size()
    rows, mine = [], []
    for op in collectives:
        call = _collective(op, hvd)
        for nbytes in sizes:
            if nbytes % (4 * n):
                raise ValueError(f"{nbytes} bytes do not split into float32 shares of {n} workers")
            x = tf.fill([message_values(op, nbytes, n)], float(hvd.rank() + 1))
            call(x)  # the first call of a shape negotiates and allocates: not timed
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                call(x)
                seconds.append(time.perf_counter() - started)
            rows.append({"op": op, "bytes": int(nbytes), "workers": n})
            mine.append(seconds)
    slowest = hvd.allreduce(tf.constant(mine, tf.float64), op=hvd.Max).numpy()  # per call, the slowest rank
    for row, calls in zip(rows, slowest):
        row["seconds"] = float(calls.min())
    return rows


# --------------------------------------------------------------------------------------------
# The alpha-beta model


@dataclass(frozen=True)
class Fit:
    """``time = latency_s + bytes / bandwidth_Bps`` fitted to measured times, its R^2, and its worst miss:
    the largest factor between the line and a measurement (``worst_bytes`` the size where it is)."""

    latency_s: float
    bandwidth_Bps: float
    r2: float
    worst_miss: float = math.nan
    worst_bytes: int = 0

    def seconds(self, nbytes):
        return self.latency_s + np.asarray(nbytes, float) / self.bandwidth_Bps


def fit_alpha_beta(nbytes, seconds, rounds: int = 30) -> Fit:
    """Least squares of ``t = a + n / b`` on the ratio of line to measurement, so that a line twice too high
    counts as much as one twice too low, at 1 kB as at 64 MB: relative errors (each size weighted by 1 / its
    time), then reweighted by 1 / sqrt(time x line) until the misses are symmetric in the ratio (the
    log of the ratio, to second order). Also the R^2 of the fit on the times themselves and its worst miss."""
    n, t = np.asarray(nbytes, float), np.asarray(seconds, float)
    if n.size < 2 or np.ptp(n) == 0:
        raise ValueError("a latency and a bandwidth need at least two message sizes")
    weights = 1 / t
    a = slope = None
    for _ in range(rounds):
        design = np.stack([np.ones_like(n), n], axis=1) * weights[:, None]
        (a_new, slope_new), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
        predicted = a_new + slope_new * n
        if a is not None and np.any(predicted <= 0):
            break  # a line through zero has no ratio: keep the last one that had
        converged = a is not None and np.isclose(a_new, a, rtol=1e-9, atol=0) and np.isclose(slope_new, slope, rtol=1e-9, atol=0)
        a, slope = a_new, slope_new
        if converged or np.any(predicted <= 0):
            break
        weights = 1 / np.sqrt(t * predicted)
    predicted = a + slope * n
    r2 = 1 - float(np.sum((t - predicted) ** 2)) / float(np.sum((t - t.mean()) ** 2))
    if np.all(predicted > 0):
        factors = np.maximum(predicted / t, t / predicted)
        worst = int(np.argmax(factors))
        worst_miss, worst_bytes = float(factors[worst]), int(n[worst])
    else:
        worst_miss, worst_bytes = math.inf, int(n[int(np.argmin(predicted))])
    return Fit(float(a), float(1 / slope) if slope > 0 else math.inf, r2, worst_miss, worst_bytes)


def ring_allreduce_s(nbytes, workers: int, alpha_s: float, beta_Bps: float):
    """The ring all-reduce of ``nbytes`` on ``workers``: 2(N-1) alpha + 2(N-1)/N n / beta."""
    return 2 * (workers - 1) * alpha_s + 2 * (workers - 1) / workers * np.asarray(nbytes, float) / beta_Bps


def link_from_allreduce(fit: Fit, workers: int) -> tuple[float, float]:
    """The (alpha, beta) of one link that make the ring's formula equal an all-reduce fit on ``workers``."""
    return fit.latency_s / (2 * (workers - 1)), fit.bandwidth_Bps * 2 * (workers - 1) / workers


def scaling_efficiency(compute_s: float, communication_s: float, hidden_fraction: float = 0.0) -> float:
    """Throughput on N workers over N times one worker's, when each step adds the communication that is not hidden."""
    return compute_s / (compute_s + (1 - hidden_fraction) * communication_s)


# --------------------------------------------------------------------------------------------
# Tensor fusion


def fusion_steps(layers: int, width: int, batch: int, steps: int, timeline_path: str, timeline_steps: int = 3,
                 seed: int = 0) -> dict:
    """On every Horovod worker: ``steps`` timed training steps of an MLP of ``layers`` Dense(``width``) layers
    (2 gradient tensors each) with ``hvd.DistributedGradientTape``, then ``timeline_steps`` more with
    Horovod's timeline recorded to ``timeline_path`` (rank 0; the launch needs ``HOROVOD_TIMELINE=DYNAMIC``).
    Rank 0 returns the median step's seconds (slowest rank), the tensors per step and the steps recorded."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rng = np.random.default_rng([seed, hvd.rank()])
    x = tf.constant(rng.normal(size=(batch, width)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, batch).astype(np.int32))
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.layers.Dense(width, activation="relu") for _ in range(layers)]
                                + [tf.keras.layers.Dense(10)])
    model.build((None, width))
    hvd.broadcast_variables(model.variables, root_rank=0)
    optimizer = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(3):
        step().numpy()
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        step().numpy()
        seconds.append(time.perf_counter() - started)
    if hvd.rank() == 0:
        hvd.start_timeline(timeline_path)
    for _ in range(timeline_steps):
        step().numpy()
    if hvd.rank() == 0:  # rank 0 takes part in every call: once its steps are done, every call is
        hvd.stop_timeline()
    slowest = float(hvd.allreduce(tf.constant(float(np.median(seconds))), op=hvd.Max))
    return {"step_s": slowest, "tensors_per_step": len(model.trainable_variables),
            "timeline_steps": timeline_steps, "timeline": timeline_path, "workers": hvd.size()}


# --------------------------------------------------------------------------------------------
# Overlap on the simulated accelerator


class _DeviceClock:
    """The modelled device's clock for one step: the step's start, and waits until given moments after it.

    A wait that finds the real math later than ``tolerance_s`` past its moment counts as an overrun."""

    def __init__(self, tolerance_s: float = 0.0):
        self.started = time.perf_counter()
        self.tolerance_s = tolerance_s
        self.waits = self.overruns = 0

    def start(self):
        self.started = time.perf_counter()
        return np.float32(0)

    def wait_until(self, offset_s):
        self.waits += 1
        left = self.started + float(offset_s) - time.perf_counter()
        if left > 0:
            time.sleep(left)
        elif -left > self.tolerance_s:
            self.overruns += 1
        return np.float32(0)


def overlap_steps(widths, batch: int, steps: int, seed: int = 0, margin: float | None = None,
                  forward_share: float = 1 / 3) -> dict:
    """On every Horovod worker: the overlap study of notebook 07 on an MLP ``widths[0] -> ... -> widths[-1]``.

    First the real step is timed with every worker computing at once, and a modelled device is made from it
    (:func:`mgpu.runtime.accelerator.profile_from_rate`, slower by ``margin``). On that device the forward
    pass ends ``forward_share`` of the step after it began, and the backward pass hands over each layer's
    gradients (last layer first) at the moment the device would have computed them, its share of the
    backward time being its share of the weights. Four steps are then timed, interleaved, for ``steps``
    rounds: ``compute`` (no communication), ``serial`` (each gradient all-reduced once the whole backward
    pass is done), ``overlapped`` (``hvd.DistributedGradientTape``: each all-reduce starts as soon as its
    gradient exists) and ``allreduce`` (the gradients' all-reduce alone). Rank 0 returns the median of each
    (slowest rank), the profile, the gradient sizes and the overruns: waits the real math had passed by more
    than 5% of the device's step (a layer's share of it can be shorter than the real math's fixed costs).
    A worker that has a GPU is timed on it, without a modelled device (``profile`` None).
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from mgpu.runtime import accelerator, launch

    hvd.init()
    rng = np.random.default_rng([seed, hvd.rank()])
    x = tf.constant(rng.normal(size=(batch, widths[0])).astype(np.float32))
    y = tf.constant(rng.integers(0, widths[-1], batch).astype(np.int32))
    init = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        weights.append(tf.Variable(init.normal(0, math.sqrt(2 / fan_in), (fan_in, fan_out)).astype(np.float32)))
        weights.append(tf.Variable(np.zeros(fan_out, np.float32)))
    sizes = [int(np.prod(w.shape)) for w in weights]
    layers = len(widths) - 1
    clock = _DeviceClock()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.SGD(0.001)

    def dense(h, w, b, last, deadline):
        # One layer whose backward pass hands over its gradients no earlier than `deadline` (None: at once).
        @tf.custom_gradient
        def layer(h, w, b):
            z = h @ w + b
            out = z if last else tf.nn.relu(z)

            def grad(upstream):
                dz = upstream if last else upstream * tf.cast(z > 0, upstream.dtype)
                grads = [tf.matmul(dz, w, transpose_b=True), tf.matmul(h, dz, transpose_a=True),
                         tf.reduce_sum(dz, axis=0)]
                if deadline is None:
                    return grads
                with tf.control_dependencies(grads):
                    done = tf.py_function(clock.wait_until, [deadline], tf.float32)
                with tf.control_dependencies([done]):
                    return [tf.identity(g) for g in grads]
            return out, grad
        return layer(h, w, b)

    def loss_on_device(step_s):
        # The forward pass, with the device's deadlines when step_s is given.
        shares = [sizes[2 * i] + sizes[2 * i + 1] for i in range(layers)]
        forward = None if step_s is None else forward_share * step_s
        backward = 0.0 if step_s is None else (1 - forward_share) * step_s
        done_after = np.cumsum(shares[::-1])[::-1] / sum(shares)  # backward share done once layer i is through
        h = x
        if step_s is not None:
            with tf.control_dependencies([tf.py_function(clock.start, [], tf.float32)]):
                h = tf.identity(h)
        for i in range(layers):
            deadline = None if step_s is None else float(forward + backward * done_after[i])
            h = dense(h, weights[2 * i], weights[2 * i + 1], i == layers - 1, deadline)
        if step_s is not None:
            with tf.control_dependencies([tf.py_function(clock.wait_until, [forward], tf.float32)]):
                h = tf.identity(h)
        return loss_fn(y, h)

    def make_step(kind, step_s):
        @tf.function
        def step():
            if kind == "allreduce":
                return tf.add_n([tf.reduce_sum(hvd.allreduce(tf.identity(w), name=f"only_{i}"))
                                 for i, w in enumerate(weights)])
            with tf.GradientTape() as tape:
                loss = loss_on_device(step_s)
            if kind == "overlapped":
                grads = hvd.DistributedGradientTape(tape).gradient(loss, weights)
            else:
                grads = tape.gradient(loss, weights)
                if kind == "serial":
                    with tf.control_dependencies(grads):  # no all-reduce starts before the last gradient exists
                        grads = [tf.identity(g) for g in grads]
                    grads = [hvd.allreduce(g, name=f"serial_{i}") for i, g in enumerate(grads)]
            optimizer.apply_gradients(zip(grads, weights))
            return loss
        return step

    # The real step, timed with every worker computing at once, makes the device.
    real = make_step("compute", None)
    for _ in range(3):
        real().numpy()
    hvd.allreduce(tf.constant(0.0), name="overlap_calibration_start")
    real_s = []
    for _ in range(max(5, steps)):
        started = time.perf_counter()
        real().numpy()
        real_s.append(time.perf_counter() - started)
    slowest_real = float(hvd.allreduce(tf.constant(float(np.median(real_s))), op=hvd.Max))
    profile, step_s = None, None  # a worker with a GPU of its own is timed as it is
    if not tf.config.list_physical_devices("GPU"):
        cores = launch.available_cores()
        kwargs = {} if margin is None else {"margin": margin}
        profile = accelerator.profile_from_rate(f"sim-overlap-mlp-{hvd.size()}w{cores}c", slowest_real / batch,
                                                forward_share * slowest_real / batch, workers=hvd.size(),
                                                cores=cores, **kwargs)
        step_s = profile.train_step_s(batch)
        clock.tolerance_s = 0.05 * step_s

    kinds = ("compute", "serial", "overlapped", "allreduce")
    runs = {k: make_step(k, step_s) for k in kinds}
    for k in kinds:  # trace and warm up
        for _ in range(2):
            runs[k]().numpy()
    clock.waits = clock.overruns = 0
    seconds = {k: [] for k in kinds}
    for _ in range(steps):
        for k in kinds:
            hvd.allreduce(tf.constant(0.0), name="overlap_round")  # the workers start each step together
            started = time.perf_counter()
            runs[k]().numpy()
            seconds[k].append(time.perf_counter() - started)
    medians = tf.constant([float(np.median(seconds[k])) for k in kinds], tf.float64)
    slowest = hvd.allreduce(medians, op=hvd.Max).numpy()
    overruns = int(hvd.allreduce(tf.constant(clock.overruns), op=hvd.Sum))
    waits = int(hvd.allreduce(tf.constant(clock.waits), op=hvd.Sum))
    return {"seconds": {k: float(s) for k, s in zip(kinds, slowest)}, "profile": profile,
            "device_step_s": step_s or slowest_real, "real_step_s": slowest_real, "gradient_sizes": sizes,
            "gradient_bytes": 4 * sum(sizes), "overruns": overruns, "waits": waits, "workers": hvd.size()}


def hidden_fraction(seconds: dict) -> float:
    """The share of the all-reduce that overlap hid: 1 - (overlapped - compute) / (serial - compute), in [0, 1]."""
    exposed_serial = seconds["serial"] - seconds["compute"]
    if exposed_serial <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1 - (seconds["overlapped"] - seconds["compute"]) / exposed_serial)))
