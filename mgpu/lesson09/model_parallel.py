"""Model and pipeline parallelism (notebook 09): schedules, bubble accounting and a timing harness.

A model split into N consecutive *stages*, one per device, passes activations forward and
gradients backward from device to device. Fed one batch at a time (the naive split), only one
device works at any moment. GPipe (Huang et al. 2019) cuts the batch into M *micro-batches* and
pipelines them: stage s works on micro-batch m while stage s + 1 works on m - 1, and the gradients
of the M micro-batches are added up before the one update, so the update is that of the whole
batch. What is left idle is the *bubble*, a fraction (N - 1)/(M + N - 1) of each device's time.

This module holds what the notebook measures with, not what it teaches (the stages and their
placement with ``tf.device`` are written in the notebook):

- :func:`split_micro_batches`: a batch cut into M micro-batches, sizes differing by at most one;
  :func:`activation_values_per_example`: what one example leaves in a model's layer outputs (the
  memory that micro-batches, accumulated or pipelined, divide);
- :func:`bubble_fraction` and :func:`gpipe_schedule`: the ideal GPipe schedule in clock ticks
  (every forward and every backward of one micro-batch on one stage takes one tick) and its
  idle fraction, counted cell by cell;
- :func:`run_pipeline`: the timing harness. Each stage is a thread that owns one device. It takes
  its inputs from a queue, runs its stage's forward (then, in reverse order, backward) for each
  micro-batch, hands the result to the next (previous) stage and records the wall-clock interval
  of every piece of work. Nothing is simulated: the stages really run, concurrently when the
  hardware lets them;
- :func:`idle_fraction`: the measured bubble, 1 - (busy time summed over stages) / (N x span);
- :func:`hybrid_plan`: the numbers of a hybrid data + pipeline parallel layout (devices, bubble,
  bytes moved between stages and by the all-reduce of each stage's gradients).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from mgpu.lesson04.allreduce import ring_traffic_fraction

__all__ = ["split_micro_batches", "activation_values_per_example", "bubble_fraction", "gpipe_schedule", "schedule_idle_fraction",
           "Interval", "PipelineRun", "run_pipeline", "run_sequential", "idle_fraction", "busy_by_stage", "hybrid_plan",
           "tensor_parallel_blocks", "tensor_parallel_check"]


def split_micro_batches(n_examples: int, micro_batches: int) -> list[slice]:
    """Slices cutting ``n_examples`` into ``micro_batches`` consecutive parts (sizes differ by <= 1)."""
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be at least 1, got {micro_batches}")
    if micro_batches > n_examples:
        raise ValueError(f"cannot cut {n_examples} examples into {micro_batches} non-empty micro-batches")
    bounds = np.linspace(0, n_examples, micro_batches + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def activation_values_per_example(model) -> int:
    """Values one example leaves in a Keras model's layer outputs: what its backward pass keeps.

    The sum over layers of the output size per example (the input layer excluded). Multiply by
    the examples processed at once and the bytes per value for the activation memory of a step.
    """
    total = 0
    for layer in model.layers:
        if layer.__class__.__name__ == "InputLayer":
            continue
        shapes = layer.output_shape if isinstance(layer.output_shape, list) else [layer.output_shape]
        total += sum(int(np.prod([d for d in shape[1:]])) for shape in shapes)
    return total


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle fraction of every device: (N - 1) / (M + N - 1) (Huang et al. 2019)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError("stages and micro_batches must be at least 1")
    return (stages - 1) / (micro_batches + stages - 1)


def gpipe_schedule(stages: int, micro_batches: int) -> list[tuple[int, int, str, int]]:
    """The ideal GPipe schedule as ``(tick, stage, "F" or "B", micro_batch)`` entries.

    Forward of micro-batch m on stage s at tick s + m; the backward pass starts on the last stage
    once its last forward is done and runs the micro-batches in reverse order, so that stage s
    does the backward of micro-batch m at tick (M + N - 1) + (N - 1 - s) + (M - 1 - m).
    """
    n, m_total = stages, micro_batches
    if n < 1 or m_total < 1:
        raise ValueError("stages and micro_batches must be at least 1")
    forward_ticks = m_total + n - 1
    entries = [(s + m, s, "F", m) for s in range(n) for m in range(m_total)]
    entries += [(forward_ticks + (n - 1 - s) + (m_total - 1 - m), s, "B", m) for s in range(n) for m in range(m_total)]
    return sorted(entries)


def schedule_idle_fraction(schedule: Sequence[tuple[int, int, str, int]], stages: int) -> float:
    """Idle fraction of a tick schedule: 1 - (cells with work) / (stages x ticks)."""
    ticks = max(t for t, *_ in schedule) + 1
    occupied = {(t, s) for t, s, *_ in schedule}
    if len(occupied) != len(schedule):
        raise ValueError("a stage does two things in one tick")
    return 1.0 - len(occupied) / (stages * ticks)


# --------------------------------------------------------------------------------------------
# The timing harness


class Stage(Protocol):
    """What :func:`run_pipeline` needs of a stage (the notebook's stages have these two methods)."""

    def forward(self, micro_batch: int, inputs: Any) -> Any: ...

    def backward(self, micro_batch: int, output_gradient: Any) -> Any: ...


@dataclass(frozen=True)
class Interval:
    """One piece of work of one stage: ``kind`` is "F" or "B"; times in seconds from the start."""

    stage: int
    kind: str
    micro_batch: int
    start: float
    end: float


@dataclass
class PipelineRun:
    """Every interval of one pipelined step and the step's wall-clock span."""

    stages: int
    micro_batches: int
    intervals: list[Interval]

    @property
    def span(self) -> float:
        return max(i.end for i in self.intervals) - min(i.start for i in self.intervals)

    @property
    def idle_fraction(self) -> float:
        return idle_fraction(self.intervals, self.stages)


def run_pipeline(stages: Sequence[Stage], micro_inputs: Sequence[Any], *, backward: bool = True,
                 clock: Callable[[], float] = time.perf_counter, timeout: float = 600.0) -> PipelineRun:
    """Run one GPipe step: every micro-batch forward through all stages, then backward.

    Stage s runs in a thread of its own. Stage 0 reads ``micro_inputs``; every other stage waits
    for its predecessor's output of the same micro-batch. After its last forward, a stage runs
    ``backward`` for the micro-batches in reverse order: the last stage with ``None`` (it holds the
    loss), every other with the gradient its successor returned. The interval of every call is
    recorded. An exception in any stage stops the step and is raised here.
    """
    n, m_total = len(stages), len(micro_inputs)
    if n < 1 or m_total < 1:
        raise ValueError("need at least one stage and one micro-batch")
    forward_in = [queue.Queue() for _ in range(n)]
    backward_in = [queue.Queue() for _ in range(n)]
    for m, x in enumerate(micro_inputs):
        forward_in[0].put((m, x))
    intervals: list[list[Interval]] = [[] for _ in range(n)]
    errors: list[BaseException] = []
    failed = threading.Event()
    origin = clock()

    def take(q: queue.Queue):
        while True:
            if failed.is_set():
                raise RuntimeError("another stage failed")
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                continue

    def work(s: int) -> None:
        stage = stages[s]
        try:
            for _ in range(m_total):
                m, x = take(forward_in[s])
                start = clock()
                y = stage.forward(m, x)
                intervals[s].append(Interval(s, "F", m, start - origin, clock() - origin))
                if s + 1 < n:
                    forward_in[s + 1].put((m, y))
            if not backward:
                return
            for m in reversed(range(m_total)):
                if s + 1 < n:
                    got, dy = take(backward_in[s])
                    assert got == m, f"stage {s} expected the gradient of micro-batch {m}, got {got}"
                else:
                    dy = None
                start = clock()
                dx = stage.backward(m, dy)
                intervals[s].append(Interval(s, "B", m, start - origin, clock() - origin))
                if s > 0:
                    backward_in[s - 1].put((m, dx))
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            errors.append(error)
            failed.set()

    threads = [threading.Thread(target=work, args=(s,), name=f"stage-{s}", daemon=True) for s in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        real = [e for e in errors if not (isinstance(e, RuntimeError) and str(e) == "another stage failed")]
        raise (real or errors)[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"the pipeline did not finish in {timeout} s")
    return PipelineRun(n, m_total, [i for per_stage in intervals for i in per_stage])


def run_sequential(stages: Sequence[Stage], micro_inputs: Sequence[Any], *, backward: bool = True,
                   clock: Callable[[], float] = time.perf_counter) -> PipelineRun:
    """The same work as :func:`run_pipeline`, one call after another in the calling thread.

    No two calls overlap, so the span is the step's total work: the reference for how much of a
    pipelined step's span the work itself fills (``work / (N x span)``) on any hardware.
    """
    n = len(stages)
    intervals = []
    origin = clock()
    outputs = {}
    for m, x in enumerate(micro_inputs):
        for s in range(n):
            start = clock()
            x = stages[s].forward(m, x)
            intervals.append(Interval(s, "F", m, start - origin, clock() - origin))
        outputs[m] = x
    if backward:
        for m in reversed(range(len(micro_inputs))):
            dy = None
            for s in reversed(range(n)):
                start = clock()
                dy = stages[s].backward(m, dy)
                intervals.append(Interval(s, "B", m, start - origin, clock() - origin))
    return PipelineRun(n, len(micro_inputs), intervals)


def busy_by_stage(intervals: Sequence[Interval], stages: int) -> list[float]:
    """Seconds each stage spent working (overlapping intervals of one stage counted once)."""
    busy = []
    for s in range(stages):
        mine = sorted((i.start, i.end) for i in intervals if i.stage == s)
        total, reach = 0.0, -np.inf
        for start, end in mine:
            if end > reach:
                total += end - max(start, reach)
                reach = end
        busy.append(total)
    return busy


def idle_fraction(intervals: Sequence[Interval], stages: int) -> float:
    """The measured bubble: 1 - (busy seconds summed over stages) / (stages x wall-clock span)."""
    if not intervals:
        raise ValueError("no intervals")
    span = max(i.end for i in intervals) - min(i.start for i in intervals)
    return 1.0 - sum(busy_by_stage(intervals, stages)) / (stages * span)


# --------------------------------------------------------------------------------------------
# Hybrid data + pipeline parallelism, worked out


def hybrid_plan(*, replicas: int, stages: int, micro_batches: int, batch: int,
                activation_values: int, parameters_by_stage: Sequence[int], bytes_per_value: int = 4) -> dict:
    """The numbers of ``replicas`` data-parallel copies of an ``stages``-stage pipeline.

    ``batch`` is each replica's batch, cut into ``micro_batches``; ``activation_values`` is the
    number of values one example passes across each stage boundary (forward; the backward returns
    as many gradients). Every stage's gradients are all-reduced among the ``replicas`` devices that
    hold that stage, with a ring: each sends 2 (R - 1) / R of them.
    """
    if len(parameters_by_stage) != stages:
        raise ValueError(f"parameters_by_stage has {len(parameters_by_stage)} entries for {stages} stages")
    boundaries = stages - 1
    between_stages = 2 * boundaries * batch * activation_values * bytes_per_value  # forward + backward
    per_device_allreduce = [ring_traffic_fraction(replicas) * p * bytes_per_value for p in parameters_by_stage]
    return {
        "devices": replicas * stages,
        "replicas": replicas,
        "stages": stages,
        "micro_batches": micro_batches,
        "global_batch": replicas * batch,
        "micro_batch_size": batch / micro_batches,
        "bubble_fraction": bubble_fraction(stages, micro_batches),
        "bytes_between_stages_per_replica_step": between_stages,
        "bytes_allreduce_sent_per_device_max": max(per_device_allreduce),
        "bytes_allreduce_sent_all_devices": replicas * sum(per_device_allreduce),
        "bytes_allreduce_if_pure_data_parallel_per_device": ring_traffic_fraction(replicas * stages)
        * sum(parameters_by_stage) * bytes_per_value,
    }


# --------------------------------------------------------------------------------------------
# Tensor parallelism: Megatron's MLP block on real Horovod workers (notebook 09's exercise)


def tensor_parallel_blocks(features: int, hidden: int, workers: int, rank: int, *, batch: int, seed: int):
    """The problem of the exercise, the same on every worker: ``x``, ``W1``, ``W2``, the loss weights ``r``,
    and this worker's blocks: columns ``rank`` of ``W1`` and the matching rows of ``W2`` (``hidden / workers``
    of each). Returns ``(x, w1, w2, r, w1_block, w2_block)`` as float32 arrays."""
    if hidden % workers:
        raise ValueError(f"hidden ({hidden}) must divide among {workers} workers")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, features)).astype(np.float32)
    w1 = (rng.normal(size=(features, hidden)) / np.sqrt(features)).astype(np.float32)
    w2 = (rng.normal(size=(hidden, features)) / np.sqrt(hidden)).astype(np.float32)
    r = rng.normal(size=(batch, features)).astype(np.float32)
    mine = slice(rank * hidden // workers, (rank + 1) * hidden // workers)
    return x, w1, w2, r, w1[:, mine], w2[mine, :]


def tensor_parallel_check(mlp: Callable, features: int = 64, hidden: int = 256, batch: int = 32, seed: int = 0) -> list[dict]:
    """Run the learner's ``mlp(x, w1_block, w2_block)`` on every Horovod worker (call it under ``launch.run``).

    Every worker holds the whole input ``x`` and its blocks of the two weights. The loss is the same
    on every worker, ``sum(y * r)``; its gradients with respect to ``x`` and the worker's blocks are
    compared with the unsplit block's, ``relu(x W1) W2``, computed on the worker with the whole weights.
    ``hvd.allreduce`` is wrapped for the call so that its calls are counted, in the forward pass and in
    the backward pass. Returns one row per rank (gathered), each with the largest absolute differences
    (output, input gradient, weight gradients), the scales they are read against, and the counts.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    x, w1, w2, r, w1_block, w2_block = tensor_parallel_blocks(features, hidden, hvd.size(), hvd.rank(),
                                                              batch=batch, seed=seed)
    mine = slice(hvd.rank() * hidden // hvd.size(), (hvd.rank() + 1) * hidden // hvd.size())
    x_t, w1_t, w2_t, r_t = (tf.constant(a) for a in (x, w1, w2, r))
    with tf.GradientTape() as tape:
        tape.watch([x_t, w1_t, w2_t])
        y_ref = tf.matmul(tf.nn.relu(tf.matmul(x_t, w1_t)), w2_t)
        loss_ref = tf.reduce_sum(y_ref * r_t)
    dx_ref, dw1_ref, dw2_ref = (g.numpy() for g in tape.gradient(loss_ref, [x_t, w1_t, w2_t]))

    calls = {"phase": "forward", "forward": 0, "backward": 0, "values": 0}
    original = hvd.allreduce

    def counted(tensor, *args, **kwargs):
        calls[calls["phase"]] += 1
        calls["values"] += int(np.prod(tensor.shape))
        return original(tensor, *args, **kwargs)

    hvd.allreduce = counted
    try:
        x_in, w1_in, w2_in = tf.constant(x), tf.constant(w1_block), tf.constant(w2_block)
        with tf.GradientTape() as tape:
            tape.watch([x_in, w1_in, w2_in])
            y = mlp(x_in, w1_in, w2_in)
            loss = tf.reduce_sum(tf.convert_to_tensor(y) * r_t)
        calls["phase"] = "backward"
        dx, dw1, dw2 = tape.gradient(loss, [x_in, w1_in, w2_in])
    finally:
        hvd.allreduce = original

    def diff(got, want):
        return float("inf") if got is None else float(np.max(np.abs(np.asarray(got) - want)))

    row = {"rank": hvd.rank(), "workers": hvd.size(),
           "output": diff(y, y_ref.numpy()), "input gradient": diff(dx, dx_ref),
           "W1 block gradient": diff(dw1, dw1_ref[:, mine]), "W2 block gradient": diff(dw2, dw2_ref[mine, :]),
           "output scale": float(np.max(np.abs(y_ref))),
           "gradient scale": float(max(np.max(np.abs(g)) for g in (dx_ref, dw1_ref, dw2_ref))),
           "all-reduces forward": calls["forward"], "all-reduces backward": calls["backward"],
           "values all-reduced": calls["values"],
           "weights held": int(w1_block.size + w2_block.size), "weights of the block": int(w1.size + w2.size)}
    return hvd.allgather_object(row)
