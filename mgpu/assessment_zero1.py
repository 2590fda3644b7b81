"""Assessment B (shard the optimizer, ZeRO-1): its protected pieces and the grader's decision.

The learner turns a plain data-parallel training loop (a small Keras MLP trained with Adam in a
custom loop, gradients averaged with ``hvd.allreduce``) into ZeRO-1 (Rajbhandari et al. 2020): each
of the N workers keeps the float32 master copy and Adam's two moments (m, v) for 1/N of the
flattened parameters only, reduce-scatters the gradients (``hvd.reducescatter``), updates its shard
and all-gathers the parameters (``hvd.allgather``). The notebook is
``assignments/source/zero1/zero1.ipynb``; its locked cells call this module, and the grader calls
:func:`decide` on what a run left in its output folder.

What is here:

- :class:`Settings` (built by the notebook's locked setup from the grader's parameters): the model
  (:func:`build_model`, weights drawn from ``data_seed``), the data (:func:`make_data`, generated
  from ``data_seed``: the grader chooses the seed, so nobody has the run's data or reference
  weights in advance), each rank's batch of each step, the loss, and :meth:`Settings.drive`, the
  protected loop that calls the learner's step function ``steps`` times and measures the run from
  outside the learner's code;
- :func:`adam_update`: the given Adam update (the same formula for every layout, so that the layouts
  can be compared exactly); the learner distributes it, and does not rewrite it;
- :func:`worker`: what the locked launch cell runs on every worker (it switches Horovod's timeline
  on before the learner's ``hvd.init()``);
- :func:`reference_trajectory`: the reference plain data-parallel run, in one process (the average
  of the workers' mean gradients is the mean gradient of the global batch), in three summation
  orders, from which :data:`WEIGHTS_ATOL` was measured;
- :func:`state_census`: the bytes of every array, tensor and variable alive in the process except
  the model's weights and the data, taken by the protected loop at the grader's probe steps;
- :func:`wire_bytes`: bytes each worker sends per collective in Horovod's timeline (written by
  Horovod's C++ core; it records each collective's dtype and shape), by the ring formulas;
- :func:`decide`: the grader's verdict on an output folder, pass or fail with one-line reasons
  carrying the numbers.

**Threat model.** The learner's code runs in the same processes as the protected loop, as the
same user, so nothing a worker writes is beyond its reach. The checks are layered by what they
withstand:

1. *Anything the learner's code reports* (prints, return values, flags, files of its own, the names
   of its variables) is never read. A submission that claims to shard is measured like any other.
2. *The weights* are compared with the grader's own reference run, recomputed by :func:`decide` in
   the grader's process from the parameters; at the probe steps and at the end, on every rank, so
   weights copied in at the end fail. A worker can, though, compute the reference trajectory alone
   (the data are generated from the seed, which the notebook has): that needs the full state, or,
   recomputed afresh at every step, collectives faked in the right sizes; a submission written to
   do that is not caught by (3) and (4) either.
3. *The state* is measured by the protected loop: a census through Python's garbage collector and
   the stack of every tensor, array and variable, wherever the learner keeps it (a closure, a
   global, a list, an instance), taken in the middle of training and at the end, so that state
   kept by the honest-but-wrong layouts (plain DP, gathering the full state) is always counted.
   Code written to evade it (state kept as Python bytes or lists of numbers, in C buffers, files
   or shared memory, or the census function replaced in the process) is not caught by it. What does not depend on the
   process is the memory the kernel accounts to it: the census is stored beside the worker's
   resident and anonymous memory at the same probes (``/proc/self/status``; the grader can read
   the same from outside as root). For this model the layouts differ by 0.46 MB of state per
   worker, within that number's noise (2026-11-26, 2 workers: resident 431.0 MB for ZeRO-1 and
   432.6 MB for plain DP at the same probe), so it is recorded, not decided on.
4. *The communication* is read from Horovod's timeline, which its C++ core writes on rank 0 while
   the protected loop runs (the timeline is on only between the first and the last step). Every
   collective the learner's code runs appears in it, whichever rank starts it; extra communication
   (gathering the state) shows as extra bytes, and none (weights obtained without training) as too
   few. A worker that rewrites the file afterwards can forge it, and traffic outside Horovod (files
   in the run's shared ``/tmp``, sockets of its own) is not in it. The count no worker can lower is
   the kernel's byte counter of the run's own loopback interface (the sandbox gives each run a
   network namespace), but at this scale it measures time, not payload: Horovod's coordination
   every cycle dominates it (2026-11-26, 2 workers under load, each launch in a fresh namespace:
   225 MB for a launch that only calls ``hvd.init()``, 1.23 GB for the 30 steps of plain DP in
   71 s, 2.44 GB for ZeRO-1's in 137 s, against 18 MB of gradients and parameters).

The evidence files (:data:`EVIDENCE`) are written by the protected loop into ``output_dir`` on each
rank: ``weights-rank<R>-step<K>.npz`` at each probe step and ``weights-rank<R>-final.npz``,
``census-rank<R>.json`` (the probes' census and memory), and ``timeline.json`` (rank 0's Horovod).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import stat
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mgpu.assessment import horovod_state

# --------------------------------------------------------------------------------------------
# The fixed task

INPUTS, HIDDEN, CLASSES = 32, 256, 10
#: Adam's hyper-parameters (Keras's defaults, and its placement of epsilon).
LEARNING_RATE, BETA_1, BETA_2, EPSILON = 1e-3, 0.9, 0.999, 1e-7
#: Bytes of optimizer state per parameter in this assignment: float32 master copy, m and v (ZeRO's
#: K = 12 for mixed-precision Adam). The model's own float32 weights are not counted as state.
STATE_BYTES_PER_PARAMETER = 12

#: Tolerance on every weight (absolute) between a run and the reference, after the same steps.
#: The reference computes each worker's gradient on that worker's batch, as the workers do, and
#: averages them (``order="shards"``). Measured 2026-11-26, 30 steps: real Horovod runs of plain DP
#: and of the ZeRO-1 solution matched it exactly on 2 workers (seed 7) and within 6.7e-8 on 4
#: (the ring sums in another order); the same reference taking the global batch's gradient
#: instead (another summation order, and other matrix shapes in the forward pass) differed from
#: it by at most 1.75e-7 over seeds 0-2 and 100-123, no weight by more than 1e-6 (``python -m
#: mgpu.assessment_zero1 --measure``), and from the runs by at most 1.7e-7 (seeds 0, 7, 11).
#: Adam done otherwise misses by far more (seed 0, final weights): the sum of the gradients
#: instead of their mean 4.1e-3, epsilon inside the bias correction 6.8e-3, the step counted from
#: 1 1.5e-2, no bias correction 1.3e-1. 1e-5 is about 60x above the largest difference between
#: summation orders and 400x below the smallest wrong one; 30 steps move the weights by up to
#: ~3e-2.
WEIGHTS_ATOL = 1e-5
#: Allowed state per worker beyond 12 bytes x ceil(psi / N): this fraction of one float32 copy of
#: the parameters (4 psi bytes, 307 kB). The ZeRO-1 solution's census exceeded 12 ceil(psi/N) by
#: 3.0 kB on 2 and on 4 workers (2026-11-26: TensorFlow's and the loop's own small arrays); plain
#: DP holds 12 psi, so the bound (6 psi + psi bytes with N = 2, 3 psi + psi with N = 4) leaves it
#: 5 psi or 8 psi bytes out.
STATE_MARGIN_FRACTION = 0.25
#: Bytes sent per worker per step, relative to plain data parallelism's ring all-reduce of the
#: gradient: ZeRO-1's reduce-scatter + all-gather send the same (plus up to N - 1 padding floats).
#: Above the upper bound: more than plain DP. Below the lower: the gradient or the parameters
#: were not communicated every step.
COMM_UPPER, COMM_LOWER = 1.01, 0.9
#: The largest evidence file read (a weights file is 309 kB, a census 1 kB, the 30 steps' timeline
#: 35 kB; a run's evidence is 1.9 MB on 2 workers).
MAX_FILE_BYTES = 16 * 1024 * 1024
EVIDENCE = ("weights-rank<R>-step<K>.npz", "weights-rank<R>-final.npz", "census-rank<R>.json",
            "timeline.json")
TIMELINE_FILE = "timeline.json"
#: The names of the evidence files (see :data:`EVIDENCE`), for the grader's copy of a run's output.
EVIDENCE_FILE = re.compile(r"^(weights-rank\d{1,3}-(step\d{1,6}|final)\.npz|census-rank\d{1,3}\.json|timeline\.json)$")


def parameter_count() -> int:
    return INPUTS * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES


def state_bound_bytes(workers: int, psi: int | None = None) -> int:
    """The most optimizer state a ZeRO-1 worker may hold: 12 ceil(psi/N) + the margin."""
    psi = parameter_count() if psi is None else psi
    return STATE_BYTES_PER_PARAMETER * math.ceil(psi / workers) + int(STATE_MARGIN_FRACTION * 4 * psi)


def make_data(seed: int, examples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: Gaussian inputs labelled by a random two-layer teacher (both from ``seed``)."""
    rng = np.random.default_rng([seed, 1])
    x = rng.standard_normal((examples, INPUTS)).astype(np.float32)
    w1 = rng.standard_normal((INPUTS, 64)) / np.sqrt(INPUTS)
    w2 = rng.standard_normal((64, CLASSES)) / np.sqrt(64)
    logits = np.maximum(x @ w1, 0) @ w2 + 0.3 * rng.standard_normal((examples, CLASSES))
    return x, np.argmax(logits, axis=1).astype(np.int32)


def initial_weights(seed: int) -> list[np.ndarray]:
    """Glorot-uniform kernels and zero biases drawn from ``seed`` (the same on every rank)."""
    rng = np.random.default_rng([seed, 2])
    weights = []
    for fan_in, fan_out in ((INPUTS, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, CLASSES)):
        limit = np.sqrt(6 / (fan_in + fan_out))
        weights += [rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32),
                    np.zeros(fan_out, np.float32)]
    return weights


def build_model(seed: int):
    """The fixed architecture, 32-256-256-10 with ReLU (76,810 parameters), its weights from ``seed``."""
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((INPUTS,)),
                                 tf.keras.layers.Dense(HIDDEN, activation="relu"),
                                 tf.keras.layers.Dense(HIDDEN, activation="relu"),
                                 tf.keras.layers.Dense(CLASSES)])
    model.set_weights(initial_weights(seed))
    return model


def architecture_weights(model) -> list:
    """The kernel and bias of each Dense layer of :func:`build_model`'s model, in order: the model's
    weights proper. A variable attached to the model otherwise (``model.m = tf.Variable(...)``)
    is not among them, so the census counts it. ValueError if the layers are not the fixed ones."""
    found = [v for layer in model.layers for v in (getattr(layer, "kernel", None), getattr(layer, "bias", None))]
    shapes = [tuple(w.shape) for w in initial_weights(0)]
    if any(v is None for v in found) or [tuple(v.shape) for v in found] != shapes:
        raise ValueError("the model is not the assignment's (settings.model()): its layers changed")
    return found


def loss_fn(logits, labels):
    """Mean cross-entropy over the batch (a worker's mean; averaging the workers' gives the global)."""
    import tensorflow as tf

    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def adam_update(params, m, v, grad, step: int, learning_rate: float = LEARNING_RATE) -> None:
    """One Adam step in place on float32 ``tf.Variable`` s of one shape (Keras's formula).

    ``step`` counts from 0. ``params``, ``m`` and ``v`` may be the whole flattened model or one
    worker's shard of it: the update is element-wise, so a shard's update needs that shard only.
    """
    t = step + 1
    alpha = learning_rate * math.sqrt(1 - BETA_2 ** t) / (1 - BETA_1 ** t)
    m.assign_add((grad - m) * (1 - BETA_1))
    v.assign_add((grad * grad - v) * (1 - BETA_2))
    params.assign_sub(alpha * m / (v ** 0.5 + EPSILON))


# --------------------------------------------------------------------------------------------
# Files (read as the grader reads a run's files: no links, regular files, capped sizes)


def _read_regular(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{path.name} is {info.st_size} bytes, more than {limit}")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise ValueError(f"{path.name} grew past {limit} bytes while read")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_weights(weights: list[np.ndarray], path: Path) -> None:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, *[np.asarray(w, np.float32) for w in weights])
    _write_atomically(path, buffer.getvalue())


def load_weights(path: Path, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Float32 arrays ``arr_0..`` of exactly ``shapes`` from ``path``, or ValueError with a reason."""
    import io

    data = _read_regular(path)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = sorted(archive.namelist())
            unpacked = sum(i.file_size for i in archive.infolist())
        if unpacked > MAX_FILE_BYTES:
            raise ValueError(f"{path.name} unpacks to {unpacked} bytes")
        if names != sorted(f"arr_{i}.npy" for i in range(len(shapes))):
            raise ValueError(f"{path.name} holds {len(names)} arrays, the model has {len(shapes)}")
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = [npz[f"arr_{i}"] for i in range(len(shapes))]
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as error:
        raise ValueError(f"{path.name} is not a plain .npz file ({error})") from None
    for i, (a, shape) in enumerate(zip(arrays, shapes)):
        if a.shape != tuple(shape) or a.dtype != np.float32:
            raise ValueError(f"{path.name}: weight {i} is {a.dtype}{list(a.shape)}, expected float32{list(shape)}")
    return arrays


# --------------------------------------------------------------------------------------------
# Measurements inside a worker (the protected loop)


def state_census(exclude=()) -> dict:
    """Bytes of every tensor, array and variable alive in this process, but those in ``exclude``.

    Found through the garbage collector (every container, closure cell, instance dictionary, and
    what they hold) and the locals of every frame on the stack; each buffer counted once (a numpy
    view counts its base). ``exclude``: objects not to count (the model's weights, the data).
    Returns ``{"bytes", "objects", "largest": [[bytes, kind], ...]}``.
    """
    import gc

    import tensorflow as tf

    import inspect
    import types

    excluded = {id(o) for o in exclude}
    eager = type(tf.constant(0.0))
    is_variable: dict[type, bool] = {}  # issubclass(kind, tf.Variable), once per type
    # Objects whose referents are all tracked by the collector themselves (or strings, numbers and
    # code): their contents are found as objects of their own, so they are not opened.
    opaque = {types.FunctionType, types.BuiltinFunctionType, type, types.CodeType, types.ModuleType,
              weakref_type(), types.MappingProxyType, inspect.Parameter, inspect.Signature}
    gc.collect()
    counted: dict[int, tuple[int, str]] = {}
    keep_alive = []  # ids are only unique while the objects live

    def consider(obj) -> None:
        kind = type(obj)
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            key = id(base) if base.base is None else id(base.base)
            if key in counted or id(obj) in excluded or id(base) in excluded:
                return
            counted[key] = (int(base.nbytes), f"ndarray {base.dtype}{list(base.shape)}")
            keep_alive.append(base)
        elif kind is eager:
            if id(obj) in counted or id(obj) in excluded:
                return
            counted[id(obj)] = (int(obj.shape.num_elements() or 0) * obj.dtype.size,
                                f"tensor {obj.dtype.name}{obj.shape.as_list()}")
            keep_alive.append(obj)
        else:  # a tf.Variable
            if id(obj) in counted or id(obj) in excluded:
                return
            try:
                size = int(obj.shape.num_elements() or 0) * obj.dtype.size
            except (AttributeError, TypeError, ValueError):
                return
            counted[id(obj)] = (size, f"variable {obj.dtype.name}{obj.shape.as_list()}")
            keep_alive.append(obj)

    roots = gc.get_objects()
    frame = sys._getframe()
    while frame is not None:
        roots.append(dict(frame.f_locals))
        frame = frame.f_back
    ndarray = np.ndarray
    for obj in roots:  # tensors and variables are tracked; arrays are not, and are found in what holds them
        kind = type(obj)
        if kind is eager or is_variable.get(kind) or (kind not in is_variable and is_variable.setdefault(
                kind, issubclass(kind, tf.Variable))):
            consider(obj)
        elif kind not in opaque:
            for inner in gc.get_referents(obj):
                if isinstance(inner, ndarray):
                    consider(inner)
    del roots
    largest = sorted(counted.values(), reverse=True)[:8]
    return {"bytes": sum(b for b, _ in counted.values()), "objects": len(counted),
            "largest": [[b, k] for b, k in largest]}


def weakref_type() -> type:
    import weakref

    return weakref.ReferenceType


def process_memory() -> dict:
    """This process's resident and private memory (kB) from the kernel (``/proc/self/status``)."""
    found = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmHWM"):
                found[key] = int(value.split()[0])
    except OSError:
        pass
    return found


@dataclass(frozen=True)
class Settings:
    """The run the grader asked for (from the notebook's locked parameters)."""

    workers: int
    output_dir: str
    data_seed: int = 0
    steps: int = 30
    batch_size: int = 16          # examples per worker per step
    probe_steps: tuple = (14, 29)  # steps after which the state is counted and the weights saved
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.workers

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        if "data" not in self._cache:
            self._cache["data"] = make_data(self.data_seed, self.steps * self.global_batch)
        return self._cache["data"]

    def global_batch_at(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.data()
        rows = slice(step * self.global_batch, (step + 1) * self.global_batch)
        return x[rows], y[rows]

    def batch(self, step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s ``batch_size`` examples of step ``step`` (its slice of the global batch)."""
        x, y = self.global_batch_at(step)
        rows = slice(rank * self.batch_size, (rank + 1) * self.batch_size)
        return x[rows], y[rows]

    def model(self):
        """The model, with the same initial weights on every rank (no broadcast needed)."""
        return build_model(self.data_seed)

    def loss(self, logits, labels):
        return loss_fn(logits, labels)

    def drive(self, model, step_fn) -> dict:
        """The protected training loop: ``step_fn(step, x, y)`` for each step, on this rank's batch.

        It switches Horovod's timeline on (rank 0 writes ``timeline.json``) for the steps only;
        after each probe step it saves the model's weights and takes :func:`state_census`; at the
        end it saves the final weights. Nothing the step function returns is used.
        """
        import tensorflow as tf

        rank, size, hvd = horovod_state()
        out = Path(self.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        record = {"rank": rank, "size": size, "pid": os.getpid(), "parameters": parameter_count(),
                  "timeline": None, "probes": {}, "steps_done": 0}
        census_path = out / f"census-rank{rank}.json"

        def write_record():
            _write_atomically(census_path, json.dumps(record).encode())

        write_record()
        timeline = os.environ.get("HOROVOD_TIMELINE") == "DYNAMIC" and hvd is not None
        if timeline:
            hvd.start_timeline(str(out / TIMELINE_FILE))
            record["timeline"] = "started"
        weights = architecture_weights(model)  # only these are not counted as state
        data = self.data()
        for step in range(self.steps):
            x, y = (tf.constant(a) for a in self.batch(step, rank))
            step_fn(step, x, y)
            record["steps_done"] = step + 1
            if step in self.probe_steps:
                save_weights([w.numpy() for w in weights], out / f"weights-rank{rank}-step{step}.npz")
                census = state_census(exclude=[*weights, *data, x, y, self])
                record["probes"][str(step)] = {**census, "memory_kb": process_memory()}
                write_record()
        if timeline:
            hvd.stop_timeline()
            record["timeline"] = "stopped"
        save_weights([w.numpy() for w in weights], out / f"weights-rank{rank}-final.npz")
        write_record()
        return {"rank": rank, "steps": record["steps_done"]}


def worker(train):
    """What the locked launch cell runs on each worker: the timeline on, then the learner's ``train``."""

    def run():
        os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
        return train()

    return run


def run_all(trains) -> dict:
    """Run several ``(name, train)`` one after another on the same workers (tests, measurements):
    one Horovod start-up for many runs. Each ``train`` must write to an output folder of its own."""
    os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    return {name: train() for name, train in trains}


# --------------------------------------------------------------------------------------------
# The reference, and the grader's decision


def reference_trajectory(settings: Settings, record_steps=(), order: str = "shards") -> dict:
    """Plain data-parallel Adam in one process: ``{step: weights}`` after each of ``record_steps``
    and ``"final"``.

    ``order``: ``"shards"`` (the grader's) the mean of the N workers' mean-loss gradients, each
    on its own batch as the workers compute it, summed in rank order; ``"reversed"`` in reverse
    order; ``"global"`` the gradient of the global batch's mean loss. They are equal in exact
    arithmetic and differ by float32 rounding only.
    """
    import tensorflow as tf

    model = build_model(settings.data_seed)
    variables = model.trainable_variables
    sizes = [int(np.prod(v.shape)) for v in variables]
    flat = lambda tensors: tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)  # noqa: E731
    params = tf.Variable(flat(variables))
    m, v = tf.Variable(tf.zeros_like(params)), tf.Variable(tf.zeros_like(params))
    recorded = {}

    def gradient(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(model(x, training=True), y)
        return flat(tape.gradient(loss, variables))

    for step in range(settings.steps):
        if order == "global":
            g = gradient(*(tf.constant(a) for a in settings.global_batch_at(step)))
        else:
            ranks = range(settings.workers)
            parts = [gradient(*(tf.constant(a) for a in settings.batch(step, r))) for r in ranks]
            if order == "reversed":
                parts = parts[::-1]
            g = parts[0]
            for part in parts[1:]:
                g = g + part
            g = g / settings.workers
        adam_update(params, m, v, g, step)
        for var, piece in zip(variables, tf.split(params, sizes)):
            var.assign(tf.reshape(piece, var.shape))
        if step in record_steps:
            recorded[step] = model.get_weights()
    recorded["final"] = model.get_weights()
    return recorded


def wire_bytes(events: list[dict], workers: int) -> dict:
    """Bytes each worker sends, per collective kind, from a Horovod timeline's events.

    Horovod 0.28.1 ends each collective's top-level event (``ALLREDUCE``, ``REDUCESCATTER``,
    ``ALLGATHER``, ...) with ``args: {"dtype", "shape"}``: the tensor's shape for an all-reduce,
    the output for an all-gather, and rank 0's output (its share) for a reduce-scatter. By the ring
    algorithms (Patarasuk & Yuan 2009), for n bytes across N workers a worker sends: all-reduce
    2 (N-1)/N n; all-gather of an n-byte output (N-1)/N n; reduce-scatter whose share is s bytes
    (N-1) s; broadcast and all-to-all (N-1)/N n. Returns ``{kind: {"calls", "bytes"}}``.
    """
    stacks: dict[int, list[str]] = {}
    found: dict[str, dict] = {}
    n_1 = workers - 1
    for event in sorted((e for e in events if isinstance(e, dict) and e.get("ph") in ("B", "E")),
                        key=lambda e: e.get("ts", 0)):
        stack = stacks.setdefault(event.get("pid"), [])
        if event["ph"] == "B":
            stack.append(str(event.get("name")))
            continue
        if not stack:
            continue
        name = stack.pop()
        args = event.get("args") or {}
        if stack or "shape" not in args:
            continue  # only the top-level activity carries the tensor
        try:
            count = int(np.prod([int(d) for d in str(args["shape"]).strip("[]").split(",") if d.strip()]))
            itemsize = np.dtype(str(args.get("dtype", "float32"))).itemsize
        except (ValueError, TypeError):
            continue
        n = count * itemsize
        sent = {"ALLREDUCE": 2 * n_1 / workers * n, "ALLGATHER": n_1 / workers * n,
                "REDUCESCATTER": n_1 * n, "BROADCAST": n_1 / workers * n,
                "ALLTOALL": n_1 / workers * n}.get(name, 2 * n)
        entry = found.setdefault(name, {"calls": 0, "bytes": 0.0})
        entry["calls"] += 1
        entry["bytes"] += sent
    return found


_REFERENCES: dict = {}  # reference trajectories computed in this process, by settings


def dp_bytes_per_step(workers: int, psi: int | None = None) -> float:
    """What plain data parallelism sends per worker per step: a ring all-reduce of the gradient."""
    psi = parameter_count() if psi is None else psi
    return 2 * (workers - 1) / workers * 4 * psi


@dataclass
class Decision:
    passed: bool
    reasons: list[str]   # one line each, with the numbers; the failures first
    numbers: dict
    failures: list[str] = field(default_factory=list)

    def failed(self, area: str) -> list[str]:
        """The failure lines of one area: ``"weights"``, ``"state"`` or ``"communication"``."""
        return [line for line in self.failures if line.startswith(area + ":")]

    def __str__(self) -> str:
        return ("PASSED" if self.passed else "FAILED") + "".join(f"\n- {r}" for r in self.reasons)


def decide(output_dir, *, workers: int, data_seed: int, steps: int = 30, batch_size: int = 16,
           probe_steps=(14, 29), timeline: str | os.PathLike | None = None,
           reference: dict | None = None) -> Decision:
    """Pass or fail a run from the evidence in ``output_dir`` (see the module's docstring).

    The keyword arguments are the parameters the grader gave the notebook. ``timeline``: the
    Horovod timeline to read (default ``output_dir/timeline.json``). ``reference``: a
    :func:`reference_trajectory` already computed for these settings (several runs of one setting
    share it); computed here otherwise. Pass when (a) every rank's weights at every probe step and
    at the end are within :data:`WEIGHTS_ATOL` of the reference; (b) every rank's state census at
    every probe is at most :func:`state_bound_bytes`; (c) the bytes sent per worker per step are
    within [:data:`COMM_LOWER`, :data:`COMM_UPPER`] x plain data parallelism's.
    """
    out = Path(output_dir)
    settings = Settings(workers=workers, output_dir=str(out), data_seed=data_seed, steps=steps,
                        batch_size=batch_size, probe_steps=tuple(probe_steps))
    psi = parameter_count()
    failures, notes = [], []
    numbers: dict = {"workers": workers, "parameters": psi}
    if reference is None:
        key = (workers, data_seed, steps, batch_size, tuple(probe_steps))
        if key not in _REFERENCES:
            _REFERENCES[key] = reference_trajectory(settings, tuple(probe_steps), order="shards")
        reference = _REFERENCES[key]
    shapes = [w.shape for w in reference["final"]]

    # (a) weights, every rank, every probe and the end
    worst, missing = 0.0, []
    for rank in range(workers):
        for label in [*probe_steps, "final"]:
            name = f"weights-rank{rank}-{label if label == 'final' else f'step{label}'}.npz"
            try:
                got = load_weights(out / name, shapes)
            except FileNotFoundError:
                missing.append(name)
                continue
            except (OSError, ValueError) as error:
                failures.append(f"weights: {error}")
                continue
            want = reference[label]
            diff = max(float(np.max(np.abs(g.astype(np.float64) - w))) if g.size else 0.0
                       for g, w in zip(got, want))
            worst = max(worst, diff if np.isfinite(diff) else float("inf"))
    numbers["weights_max_abs_diff"], numbers["weights_tolerance"] = worst, WEIGHTS_ATOL
    if missing:
        failures.append(f"weights: {len(missing)} file(s) the protected loop writes are missing "
                        f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}): did train() "
                        f"call settings.drive on all {workers} workers?")
    elif worst > WEIGHTS_ATOL:
        failures.append(f"weights: differ from the reference data-parallel run by up to {worst:.2e} "
                        f"(tolerance {WEIGHTS_ATOL:.0e}, measured between summation orders)")
    else:
        notes.append(f"weights: every rank within {worst:.1e} of the reference data-parallel run at "
                     f"steps {', '.join(map(str, probe_steps))} and the end (tolerance {WEIGHTS_ATOL:.0e})")

    # (b) optimizer state per worker
    bound = state_bound_bytes(workers, psi)
    numbers["state_bound_bytes"], numbers["state_dp_bytes"] = bound, STATE_BYTES_PER_PARAMETER * psi
    per_rank = {}
    for rank in range(workers):
        try:
            record = json.loads(_read_regular(out / f"census-rank{rank}.json"))
            if (record.get("rank"), record.get("size"), record.get("steps_done")) != (rank, workers, steps):
                failures.append(f"state: rank {rank}'s protected loop saw rank {record.get('rank')} of "
                                f"{record.get('size')} worker(s) and ran {record.get('steps_done')} step(s); "
                                f"expected {workers} workers and {steps} steps: call hvd.init() first")
                continue
            probes = record["probes"]
            held = max(int(probes[str(k)]["bytes"]) for k in probe_steps)
        except FileNotFoundError:
            failures.append(f"state: rank {rank} left no census (census-rank{rank}.json)")
            continue
        except (OSError, ValueError, KeyError, TypeError) as error:
            failures.append(f"state: rank {rank}'s census is unreadable or lacks a probe step ({error})")
            continue
        per_rank[rank] = held
    numbers["state_bytes_per_rank"] = per_rank
    if per_rank:
        top_rank = max(per_rank, key=per_rank.get)
        top = per_rank[top_rank]
        line = (f"{top / 1e3:.0f} kB on rank {top_rank}, {top / (STATE_BYTES_PER_PARAMETER * psi):.2f} "
                f"of plain DP's {STATE_BYTES_PER_PARAMETER * psi / 1e3:.0f} kB; at most "
                f"{bound / 1e3:.0f} kB = 12 bytes x ceil(psi/{workers}) + {STATE_MARGIN_FRACTION} x 4 psi")
        if top > bound:
            failures.append(f"state: a worker holds too much optimizer state: {line}")
        elif len(per_rank) == workers:
            notes.append(f"state: largest {line}")

    # (c) communication per step
    path = Path(timeline) if timeline is not None else out / TIMELINE_FILE
    dp = dp_bytes_per_step(workers, psi)
    try:
        kinds = wire_bytes(parse_timeline(_read_regular(path)), workers)
    except FileNotFoundError:
        failures.append(f"communication: no Horovod timeline ({path.name}): run the workers with "
                        "the locked launch cell (it switches the timeline on)")
        kinds = None
    except (OSError, ValueError) as error:
        failures.append(f"communication: the Horovod timeline cannot be read ({error})")
        kinds = None
    if kinds is not None:
        per_step = sum(k["bytes"] for k in kinds.values()) / steps
        ratio = per_step / dp
        numbers.update(comm_bytes_per_step=per_step, comm_over_dp=ratio,
                       collectives={k: v["calls"] for k, v in kinds.items()})
        calls = ", ".join(f"{v['calls']} {k.lower()}" for k, v in sorted(kinds.items())) or "none"
        line = (f"{per_step / 1e3:.0f} kB sent per worker per step, {ratio:.3f}x plain DP's ring "
                f"all-reduce ({dp / 1e3:.0f} kB); collectives in {steps} steps: {calls}")
        if ratio > COMM_UPPER:
            failures.append(f"communication: more than plain data parallelism: {line}")
        elif ratio < COMM_LOWER:
            failures.append(f"communication: too little to have reduced the gradients and gathered the "
                            f"parameters every step: {line}")
        else:
            notes.append(f"communication: {line}")
    return Decision(passed=not failures, reasons=failures + notes, numbers=numbers, failures=failures)


def parse_timeline(raw: bytes) -> list[dict]:
    """A timeline's events; like :func:`mgpu.runtime.timeline.load_events`, it accepts the missing
    ``]`` of a file Horovod had not closed."""
    text = raw.decode("utf-8", "replace").strip().rstrip(",")
    if not text:
        return []
    if not text.endswith("]"):
        text = text.rstrip().rstrip(",") + "]"
    events = json.loads(text)
    if not isinstance(events, list):
        raise ValueError("the timeline is not a list of events")
    return events


class ShardedOptimizer:
    """Assessment B's outcome for the grader's seam (``autograder.outcomes.OUTCOMES["zero1"]``).

    ``parameters`` gives the notebook a data seed drawn once per cohort (:func:`secrets.randbits`:
    no run can know it in advance; it is in every record) and the run's shape; ``open`` computes the
    reference trajectory once; ``judge`` runs :func:`decide` on ``evidence_dir``, the grader's copies
    of the run's files that :attr:`evidence` names (regular files the workers' user wrote, names
    matching :data:`EVIDENCE_FILE`, at most :data:`MAX_FILE_BYTES` each). Thread-safe after ``open``.
    """

    steps, batch_size, probe_steps = 30, 16, (14, 29)
    #: the files of the run's output folder the grader copies for :meth:`judge` (name regex, most bytes each)
    evidence = (EVIDENCE_FILE.pattern, MAX_FILE_BYTES)

    def __init__(self, data_seed: int | None = None):
        self.data_seed = secrets.randbits(31) if data_seed is None else int(data_seed)
        self.workers = None
        self.reference = None

    def parameters(self, profile) -> dict:
        return {"data_seed": self.data_seed, "steps": self.steps, "batch_size": self.batch_size,
                "probe_steps": list(self.probe_steps)}

    def open(self, context) -> None:
        self.workers = int(context.profile.workers)
        settings = Settings(workers=self.workers, output_dir="", data_seed=self.data_seed, steps=self.steps,
                            batch_size=self.batch_size, probe_steps=self.probe_steps)
        self.reference = reference_trajectory(settings, self.probe_steps, order="shards")

    def decide(self, folder) -> Decision:
        return decide(folder, workers=self.workers, data_seed=self.data_seed, steps=self.steps,
                      batch_size=self.batch_size, probe_steps=self.probe_steps, reference=self.reference)

    def judge(self, run, evidence_dir=None):
        from autograder.outcomes import Judgement  # the grader's type; mgpu does not need it otherwise

        folder = evidence_dir
        if folder is None:
            decision = Decision(False, ["no evidence: the grader copied no file of the run's output folder"],
                                {}, ["no evidence: the grader copied no file of the run's output folder"])
        else:
            decision = self.decide(folder)
        reason = decision.failures[0] if decision.failures else "; ".join(
            line.split(":")[0] for line in decision.reasons) + " as required"
        lines = [f"Measured by the grader from the protected loop's files; data seed {self.data_seed}, "
                 f"{self.workers} workers, {self.steps} steps.", *decision.reasons]
        return Judgement(decision.passed, reason, lines,
                         {"zero1": {"data_seed": self.data_seed, **decision.numbers}})


# --------------------------------------------------------------------------------------------
# Measuring the tolerance (python -m mgpu.assessment_zero1 --measure)


def measure_orders(seeds=(0, 1, 2), workers: int = 2, steps: int = 30) -> dict:
    """Max |difference| between the reference's summation orders, and how far 30 steps move the weights."""
    found = {}
    for seed in seeds:
        settings = Settings(workers=workers, output_dir="", data_seed=seed, steps=steps)
        runs = {o: reference_trajectory(settings, order=o)["final"] for o in ("global", "shards", "reversed")}
        start = initial_weights(seed)
        found[seed] = {
            "shards": max(float(np.max(np.abs(a - b))) for a, b in zip(runs["global"], runs["shards"])),
            "reversed": max(float(np.max(np.abs(a - b))) for a, b in zip(runs["global"], runs["reversed"])),
            "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(runs["global"], start)),
        }
    return found


if __name__ == "__main__":
    if "--measure" in sys.argv:
        for seed, row in measure_orders().items():
            print(f"seed {seed}: global vs shards {row['shards']:.2e}, vs reversed {row['reversed']:.2e}, "
                  f"weights moved up to {row['moved']:.2e}")
