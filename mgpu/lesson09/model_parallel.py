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
  bytes moved between stages and by the all-reduce of each stage's gradients);
- schedules as *orders* (one list per stage of forwards and backwards): :func:`gpipe_order`,
  :func:`schedule_problems` (is an order valid?), :func:`simulate_order` (its timeline on ideal devices)
  and :func:`stash_peaks` (the micro-batches each stage holds, counted); the notebook's exercise writes 1F1B;
- :class:`ProcessPipeline`: stages as processes (numpy, joined by queues), each optionally a modelled
  device, running any order and returning its intervals, stash peaks and gradients
  (:func:`reference_gradients` is the whole batch's);
- :class:`GPT`, :func:`layout_memory`, :func:`layout_step`: the cost model of a data x tensor x pipeline
  layout (memory per GPU, bytes per step, a rough step time);
- :func:`tensor_parallel_check`: the harness of the tensor-parallel exercise (Megatron's MLP block).
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
           "tensor_parallel_blocks", "tensor_parallel_check", "gpipe_order", "schedule_problems", "simulate_order",
           "stash_peaks", "stage_forward", "stage_backward", "reference_gradients", "ProcessPipeline", "GPT",
           "layout_memory", "layout_step"]


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


# --------------------------------------------------------------------------------------------
# Pipeline schedules as orders: what each stage does, in which order (GPipe, 1F1B)
#
# An *order* is one list per stage of ``("F", m)`` and ``("B", m)`` entries: the forward and the backward of
# micro-batch m on that stage. The timing follows from it: a stage does its entries one after another, each as
# soon as its inputs exist (the forward of m on stage s needs stage s - 1's forward of m; the backward of m needs
# the stage's own forward of m and stage s + 1's backward of m).


def gpipe_order(stages: int, micro_batches: int) -> list[list[tuple[str, int]]]:
    """GPipe (Huang et al. 2019): every stage runs all its forwards, then all its backwards, last first."""
    if stages < 1 or micro_batches < 1:
        raise ValueError("stages and micro_batches must be at least 1")
    one = [("F", m) for m in range(micro_batches)] + [("B", m) for m in reversed(range(micro_batches))]
    return [list(one) for _ in range(stages)]


def schedule_problems(order, stages: int, micro_batches: int) -> list[str]:
    """What is wrong with ``order`` as a pipeline schedule (an empty list: nothing).

    Checked: one list per stage; each holds the forward and the backward of every micro-batch exactly once;
    a stage's backward of m comes after its forward of m; and the stages together can run it (no stage waits
    for an input that its neighbour only produces after waiting for this stage: a deadlock)."""
    problems = []
    try:
        order = [[(str(kind), int(m)) for kind, m in entries] for entries in order]
    except (TypeError, ValueError):
        return ["the order must be one list per stage of ('F', m) and ('B', m) pairs"]
    if len(order) != stages:
        return [f"the order has {len(order)} lists for {stages} stages (one list per stage)"]
    wanted = sorted((kind, m) for kind in ("F", "B") for m in range(micro_batches))
    for s, entries in enumerate(order):
        if sorted(entries) != wanted:
            problems.append(f"stage {s} must do the forward ('F', m) and the backward ('B', m) of every micro-batch "
                            f"m in 0..{micro_batches - 1} exactly once; it does {entries}")
            continue
        seen = set()
        for kind, m in entries:
            if kind == "B" and m not in seen:
                problems.append(f"stage {s} runs the backward of micro-batch {m} before its forward")
                break
            if kind == "F":
                seen.add(m)
    if not problems:
        try:
            simulate_order(order)
        except RuntimeError as error:
            problems.append(str(error))
    return problems


def simulate_order(order, t_forward: float = 1.0, t_backward: float = 1.0) -> list[Interval]:
    """The intervals of an order on ideal devices: a forward takes ``t_forward``, a backward ``t_backward``,
    hand-overs are free, and every entry starts as soon as the stage is free and its inputs exist.

    Raises RuntimeError if the stages cannot run it (a deadlock). Deterministic."""
    stages = len(order)
    done: dict[tuple[int, str, int], float] = {}
    position, free = [0] * stages, [0.0] * stages
    intervals = []
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            while position[s] < len(order[s]):
                kind, m = order[s][position[s]]
                needs = ([(s - 1, "F", m)] if kind == "F" and s > 0 else []) + (
                    [(s, "F", m)] + ([(s + 1, "B", m)] if s + 1 < stages else []) if kind == "B" else [])
                if not all(n in done for n in needs):
                    break
                start = max([free[s]] + [done[n] for n in needs])
                end = start + (t_forward if kind == "F" else t_backward)
                done[(s, kind, m)] = free[s] = end
                intervals.append(Interval(s, kind, m, start, end))
                position[s] += 1
                progress = True
    stuck = [(s, order[s][position[s]]) for s in range(stages) if position[s] < len(order[s])]
    if stuck:
        raise RuntimeError("the stages cannot run this order (a deadlock): " + "; ".join(
            f"stage {s} waits to run {entry}" for s, entry in stuck))
    return intervals


def stash_peaks(order) -> list[int]:
    """The largest number of micro-batches each stage holds stashed (forward done, backward not yet) while it
    follows its order: counted, so the same on any machine."""
    peaks = []
    for entries in order:
        held = peak = 0
        for kind, _ in entries:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


# --------------------------------------------------------------------------------------------
# Stages as processes: a pipeline of p processes joined by queues, each a modelled device


def _dense_weights(width: int, layers: int, classes: int, last: bool, seed) -> list[np.ndarray]:
    sizes = [width] * (layers + 1) + ([classes] if last else [])
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(a, b)) * np.sqrt(1 / a)).astype(np.float32) for a, b in zip(sizes[:-1], sizes[1:])]


def stage_forward(weights, x, last):
    """A stage's forward in numpy: tanh dense layers (the last stage's last layer gives logits). Returns the
    output and what the backward needs (the stash: every layer's input). tanh, not ReLU: a ReLU's kink at 0
    would let a pre-activation rounded to either side of 0 (micro-batches change the rounding) change a
    gradient by far more than float32 rounding, and the notebook compares gradients to rounding."""
    stash = []
    for i, w in enumerate(weights):
        stash.append(x)
        x = x @ w
        if not (last and i == len(weights) - 1):
            x = np.tanh(x)
    return x, stash


def stage_backward(weights, stash, dy, last, labels=None, batch=None):
    """The stage's backward: from the output's gradient ``dy`` (the last stage: from the labels, the loss
    being the micro-batch's share of the batch's mean cross-entropy) to the input's gradient and the
    weights' gradients."""
    grads = [None] * len(weights)
    for i in reversed(range(len(weights))):
        x, w = stash[i]
        if last and i == len(weights) - 1:
            logits = x @ w
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(labels)), labels] -= 1
            dz = (p / batch).astype(np.float32)
        else:
            dz = dy * (1 - np.tanh(x @ w) ** 2)
        grads[i] = x.T @ dz
        dy = dz @ w.T
    return dy, grads


def reference_gradients(x, y, *, stages, width, layers, classes, seed):
    """The whole batch through every stage in one process: the gradients a pipelined step must give."""
    weights = [_dense_weights(width, layers, classes, s == stages - 1, [seed, s]) for s in range(stages)]
    stashes = []
    h = x
    for s, w in enumerate(weights):
        h, stash = stage_forward(w, h, s == stages - 1)
        stashes.append(list(zip(stash, w)))
    dy, grads = None, []
    for s in reversed(range(stages)):
        dy, g = stage_backward(weights[s], stashes[s], dy, s == stages - 1, labels=y, batch=len(x))
        grads.insert(0, g)
    return np.concatenate([g.ravel() for stage in grads for g in stage])


def _stage_process(s, stages, width, layers, classes, seed, commands, results, from_prev, to_next, from_next, to_prev,
                   barrier):
    """One stage's process: runs the commands it is sent until it gets None."""
    import os
    import queue as queue_module

    last = s == stages - 1
    weights = _dense_weights(width, layers, classes, last, [seed, s])
    inbox: dict = {"F": {}, "B": {}}

    def receive(q, kind, m):
        while m not in inbox[kind]:
            got, value = q.get(timeout=120)
            inbox[kind][got] = value
        return inbox[kind].pop(m)

    def pause_until(deadline):
        left = deadline - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return left

    while True:
        command = commands.get()
        if command is None:
            return
        try:
            name = command["name"]
            if name == "calibrate":  # the math of one micro-batch, timed while every stage computes at once
                rng = np.random.default_rng([seed, s, 1])
                n = command["micro_batch"]
                x = rng.normal(size=(n, width)).astype(np.float32)
                labels = rng.integers(0, classes, n)
                dy = rng.normal(size=(n, width)).astype(np.float32)
                forward, backward = [], []
                barrier.wait(timeout=120)
                for _ in range(command["repeats"]):
                    start = time.perf_counter()
                    out, stash = stage_forward(weights, x, last)
                    middle = time.perf_counter()
                    stage_backward(weights, list(zip(stash, weights)), dy, last, labels=labels, batch=n)
                    forward.append(middle - start)
                    backward.append(time.perf_counter() - middle)
                results.put((s, {"forward_s": float(np.median(forward)) / n, "backward_s": float(np.median(backward)) / n,
                                 "pid": os.getpid()}))
                continue
            # a step: this stage's order, on the micro-batches of x (stage 0) and y (the last stage)
            x, y, parts, order, device = (command[k] for k in ("x", "y", "parts", "order", "device"))
            batch = len(y)
            stashed, peak, overruns, intervals, grads = {}, 0, 0, [], None
            for kind, m in order:
                size = parts[m].stop - parts[m].start
                if kind == "F":
                    h = x[parts[m]] if s == 0 else receive(from_prev, "F", m)
                    start = time.perf_counter()
                    out, stash = stage_forward(weights, h, last)
                    stashed[m] = list(zip(stash, weights))
                    peak = max(peak, len(stashed))
                    if device:
                        overruns += pause_until(start + device["forward_s"] * size) < 0
                    end = time.perf_counter()
                    if not last:
                        to_next.put((m, out))
                else:
                    dy = None if last else receive(from_next, "B", m)
                    start = time.perf_counter()
                    dx, g = stage_backward(weights, stashed.pop(m), dy, last, labels=y[parts[m]], batch=batch)
                    grads = g if grads is None else [a + b for a, b in zip(grads, g)]
                    if device:
                        overruns += pause_until(start + device["backward_s"] * size) < 0
                    end = time.perf_counter()
                    if s > 0:
                        to_prev.put((m, dx))
                intervals.append((s, kind, m, start, end))
            results.put((s, {"intervals": intervals, "peak_stashed": peak, "overruns": int(overruns),
                             "gradients": np.concatenate([g.ravel() for g in grads])}))
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            results.put((s, {"error": f"{type(error).__name__}: {error}"}))
            if isinstance(error, queue_module.Empty):
                return


class ProcessPipeline:
    """``stages`` processes, stage s holding ``layers`` dense tanh layers of ``width`` units (the last adds the
    ``classes`` logits), joined by queues: stage s sends its activations to s + 1 and its input's gradient
    to s - 1. Horovod has no point-to-point send, so the stages are plain processes (``multiprocessing``,
    started with spawn); each runs single-threaded numpy. Use it in a ``with`` block."""

    def __init__(self, stages: int, width: int, layers: int, classes: int = 10, seed: int = 0, timeout: float = 300):
        import multiprocessing as mp
        import os

        self.stages, self.width, self.layers, self.classes, self.seed, self.timeout = stages, width, layers, classes, seed, timeout
        context = mp.get_context("spawn")
        self.commands = [context.Queue() for _ in range(stages)]
        self.results = context.Queue()
        barrier = context.Barrier(stages)  # the calibration starts on every stage at once
        forward = [context.Queue() for _ in range(stages)]   # into stage s from s - 1
        backward = [context.Queue() for _ in range(stages)]  # into stage s from s + 1
        saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ.update({k: "1" for k in saved})  # one thread per stage, as one device each
        try:
            self.processes = [context.Process(
                target=_stage_process, name=f"stage-{s}", daemon=True,
                args=(s, stages, width, layers, classes, seed, self.commands[s], self.results,
                      forward[s], forward[s + 1] if s + 1 < stages else None,
                      backward[s], backward[s - 1] if s > 0 else None, barrier)) for s in range(stages)]
            for p in self.processes:
                p.start()
            self._links = (forward, backward, barrier)  # kept alive while the stages use them
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _gather(self) -> list[dict]:
        import queue as queue_module

        got = {}
        deadline = time.perf_counter() + self.timeout
        while len(got) < self.stages:
            try:
                s, value = self.results.get(timeout=max(0.1, min(5.0, deadline - time.perf_counter())))
            except queue_module.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead or time.perf_counter() > deadline:
                    raise RuntimeError(f"the pipeline's stages did not answer ({'dead: ' + ', '.join(dead) if dead else 'timeout'})")
                continue
            if "error" in value:
                raise RuntimeError(f"stage {s} failed: {value['error']}")
            got[s] = value
        return [got[s] for s in range(self.stages)]

    def calibrate(self, micro_batch: int, repeats: int = 5) -> dict:
        """Seconds per example of a stage's forward and backward, timed on every stage at once (the slowest)."""
        for q in self.commands:
            q.put({"name": "calibrate", "micro_batch": micro_batch, "repeats": repeats})
        rows = self._gather()
        return {"forward_s": max(r["forward_s"] for r in rows), "backward_s": max(r["backward_s"] for r in rows)}

    def step(self, order, x, y, micro_batches: int, device: dict | None = None) -> dict:
        """One pipelined step following ``order`` (one list per stage). ``device``: seconds per example of a
        forward and of a backward on the modelled device (each call then lasts that long: the math, then a
        wait that holds no core); None times the real cores. Returns the intervals (seconds from the step's
        first start), the idle fraction, each stage's peak of stashed micro-batches, the overruns and the
        accumulated gradients (every stage's, concatenated)."""
        parts = split_micro_batches(len(y), micro_batches)
        for s, q in enumerate(self.commands):
            q.put({"name": "step", "x": x if s == 0 else None, "y": y, "parts": parts, "order": list(order[s]),
                   "device": device})
        rows = self._gather()
        raw = [i for r in rows for i in r["intervals"]]
        origin = min(i[3] for i in raw)
        intervals = [Interval(s, kind, m, a - origin, b - origin) for s, kind, m, a, b in raw]
        return {"intervals": intervals, "idle": idle_fraction(intervals, self.stages),
                "span": max(i.end for i in intervals), "peak_stashed": [r["peak_stashed"] for r in rows],
                "overruns": sum(r["overruns"] for r in rows),
                "gradients": np.concatenate([r["gradients"] for r in rows])}

    def close(self):
        for q in self.commands:
            q.put(None)
        for p in self.processes:
            p.join(10)
            if p.is_alive():
                p.terminate()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------------------------
# Choosing a layout: memory per GPU and time per step of a GPT model for a data x tensor x pipeline layout


@dataclass(frozen=True)
class GPT:
    """A GPT model's shape (Narayanan et al. 2021's notation): ``layers`` transformer layers of ``hidden``
    units and ``heads`` attention heads, a vocabulary of ``vocab`` tokens, sequences of ``sequence`` tokens."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    sequence: int

    @property
    def parameters(self) -> float:
        """12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h)) (Narayanan et al. 2021, section 5.1)."""
        l, h = self.layers, self.hidden
        return 12 * l * h ** 2 * (1 + 13 / (12 * h) + (self.vocab + self.sequence) / (12 * l * h))

    def flops_per_step(self, batch: int, recompute: bool = True) -> float:
        """Floating-point operations of a training step on ``batch`` sequences: 72 B s l h^2 (1 + s / (6 h) +
        V / (16 l h)), 96 instead of 72 when the forward is recomputed in the backward (Narayanan et al. 2021)."""
        l, h, s = self.layers, self.hidden, self.sequence
        return (96 if recompute else 72) * batch * s * l * h ** 2 * (1 + s / (6 * h) + self.vocab / (16 * l * h))


def layout_memory(model: GPT, *, tp: int, pp: int, dp: int, micro_batch: int, micro_batches: int,
                  zero1: bool = False, recompute: bool = True) -> dict:
    """Bytes per GPU of the busiest pipeline stage (the first), by part.

    Mixed-precision Adam keeps 16 bytes per parameter (Rajbhandari et al. 2020): 2 of fp16 weights, 2 of fp16
    gradients, 12 of optimizer state (fp32 weights, momentum, variance); each GPU holds 1/(tp pp) of the
    parameters, and ZeRO-1 shards the optimizer state over the dp replicas. Activations, in 2-byte values:
    under 1F1B the first stage holds min(pp, micro_batches) micro-batches in flight over its layers / pp
    layers. With recomputation each keeps only its layers' inputs, 2 s b h bytes per layer, plus the
    working set of the one layer being recomputed; without, every layer keeps s b h (10 + 24 / tp +
    5 a s / (h tp)) bytes per micro-batch (Korthikanti et al. 2022, tensor parallelism without sequence
    parallelism)."""
    psi = model.parameters / (tp * pp)
    s, b, h, a = model.sequence, micro_batch, model.hidden, model.heads
    layer_activations = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    in_flight = min(pp, micro_batches)
    layers_here = model.layers / pp
    if recompute:
        activations = in_flight * layers_here * 2 * s * b * h + layer_activations
    else:
        activations = in_flight * layers_here * layer_activations
    parts = {"weights": 2 * psi, "gradients": 2 * psi, "optimizer": 12 * psi / (dp if zero1 else 1),
             "activations": activations}
    parts["total"] = sum(parts.values())
    return parts


def layout_step(model: GPT, *, gpus: int, tp: int, pp: int, batch: int, micro_batch: int, flops_per_gpu: float,
                intra_node_bytes_per_s: float, inter_node_bytes_per_s: float, recompute: bool = True) -> dict:
    """Bytes each GPU sends in one step and the step's time, for dp = gpus / (tp pp) replicas.

    Data parallelism: a ring all-reduce of the fp16 gradients, 2 (dp - 1) / dp x 2 bytes x parameters / (tp pp).
    Tensor parallelism: per layer and micro-batch 2 all-reduces forward and 2 backward (Shoeybi et al. 2019;
    2 more when the forward is recomputed), each a ring of 2 (tp - 1) / tp x s b h x 2 bytes, on the links
    inside a node. Pipeline: per micro-batch one activation forward and one gradient backward, s b h x 2 bytes
    each, between nodes. Time: the arithmetic at ``flops_per_gpu`` stretched by the bubble
    (pp - 1) / (m + pp - 1), plus every byte at its link's bandwidth, nothing overlapped: a rough model."""
    dp = gpus // (tp * pp)
    if dp * tp * pp != gpus or batch % (dp * micro_batch):
        raise ValueError(f"{gpus} GPUs and a batch of {batch} do not split into tp={tp}, pp={pp} with micro-batches "
                         f"of {micro_batch}")
    m = batch // (dp * micro_batch)
    psi = model.parameters / (tp * pp)
    message = model.sequence * micro_batch * model.hidden * 2
    tp_allreduces = (6 if recompute else 4) * model.layers // pp * m if tp > 1 else 0
    sent = {"data parallel": ring_traffic_fraction(dp) * 2 * psi if dp > 1 else 0.0,
            "tensor parallel": tp_allreduces * ring_traffic_fraction(tp) * message if tp > 1 else 0.0,
            "pipeline": 2 * m * message if pp > 1 else 0.0}
    bubble = bubble_fraction(pp, m)
    compute_s = model.flops_per_step(batch, recompute) / (gpus * flops_per_gpu)
    step_s = (compute_s / (1 - bubble) + sent["tensor parallel"] / intra_node_bytes_per_s
              + (sent["data parallel"] + sent["pipeline"]) / inter_node_bytes_per_s)
    return {"dp": dp, "micro_batches": m, "bubble": bubble, "bytes_sent": sent, "compute_s": compute_s,
            "step_s": step_s, "tp_allreduces_per_step": tp_allreduces}
