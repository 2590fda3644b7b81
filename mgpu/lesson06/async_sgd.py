"""Notebook 06's helpers for asynchronous SGD, parameter servers and stragglers.

The toy parameter server itself is written in the notebook's cells (it is what the lesson
teaches); this module holds what the notebook measures it with:

- :func:`least_squares_problem`, the small regression every toy run trains, with its largest
  curvature (so learning rates can be given as fractions of gradient descent's limit 2 / lambda_max);
- :func:`losses_of_snapshots` and :func:`staleness_histogram`, reading a run afterwards;
- :func:`staleness_aware_update`, the server's rule of Zhang, Gupta, Lian & Liu (2016): the
  notebook's exercise, saved from its cell into :mod:`mgpu.lesson06.saved` and re-exported here (it
  exists once), and :func:`simulate_async`, a deterministic asynchronous run without
  threads that an update rule can be tested on;
- :func:`traffic_per_worker`, the bytes a step moves through a parameter server and through a ring;
- :func:`split_by_work_load`, MXNet's ``work_load_list``: a global batch cut in proportion to the
  devices' speeds;
- :func:`straggler_study`, run on real Horovod workers by :func:`mgpu.runtime.launch.run`: step times of
  synchronous SGD with and without a slow worker, with an even and an uneven split, and the check
  that the weighted uneven update is the one-process gradient of the concatenated batch;
- :func:`ps_strategy_demo`, TensorFlow's own parameter-server training
  (``tf.distribute.ParameterServerStrategy``) on a cluster of ``tf.distribute.Server``
  objects on localhost ports, run in a child process that is always ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import heapq
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mgpu.runtime import launch
from mgpu.lesson04.allreduce import ring_traffic_fraction

# Written in notebook 06 (its exercise) and saved from there by mgpu.runtime.saved: it exists once.
from mgpu.lesson06.saved import staleness_aware_update  # noqa: E402,F401


# --------------------------------------------------------------------------------------------
# The toy runs' problem and how to read them


def least_squares_problem(seed: int, examples: int = 2048, features: int = 20, condition: float = 50.0,
                          noise: float = 0.1):
    """A linear regression y = X w* + noise whose curvatures spread over ``condition``.

    Returns ``(x, y, lambda_max)`` as float32 arrays and a float: the loss is
    mean((x w - y)^2) / 2, whose Hessian x^T x / n has largest eigenvalue ``lambda_max``.
    """
    rng = np.random.default_rng(seed)
    scales = np.sqrt(np.geomspace(1.0, 1.0 / condition, features))
    x = (rng.normal(size=(examples, features)) * scales).astype(np.float32)
    w_star = rng.normal(size=features).astype(np.float32)
    y = (x @ w_star + noise * rng.normal(size=examples)).astype(np.float32)
    lambda_max = float(np.linalg.eigvalsh(x.T.astype(np.float64) @ x / examples)[-1])
    return x, y, lambda_max


def losses_of_snapshots(snapshots: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The full-data loss mean((x w - y)^2) / 2 of every row ``w`` of ``snapshots`` (inf when not finite)."""
    w = np.asarray(snapshots, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        residual = w @ np.asarray(x, np.float64).T - np.asarray(y, np.float64)[None, :]
        loss = 0.5 * np.mean(residual ** 2, axis=1)
    return np.where(np.isfinite(loss), loss, np.inf)


def staleness_histogram(staleness: Sequence[int]) -> dict[int, float]:
    """The fraction of applied updates at each staleness, smallest first."""
    values, counts = np.unique(np.asarray(staleness, int), return_counts=True)
    return {int(v): float(c / counts.sum()) for v, c in zip(values, counts)}


# --------------------------------------------------------------------------------------------
# The staleness-aware update rule, and a deterministic asynchronous run to test a rule on


@dataclass
class ServerState:
    """What a parameter server's update rule reads and changes; the notebook's toy server has the same
    attributes. ``read_version[worker]``: the version of the weights that worker holds (set when it
    pulls, and by the rule when the server replies to its push with new weights)."""

    weights: np.ndarray
    lr: float
    version: int = 0                                   # updates applied so far
    read_version: dict = field(default_factory=dict)   # worker -> version it computes its gradient on


def simulate_async(update: Callable, *, workers: int = 4, updates: int = 60, seed: int = 0,
                   lr_fraction: float = 0.45, features: int = 5, batch: int = 8) -> dict:
    """Asynchronous SGD on the toy regression, event by event, without threads: the same for every call.

    Every worker pulls version 0 at time 0. Each gradient takes a time drawn from U(0.5, 1.5); the
    gradients reach the server in time order (ties by worker). The server applies each through
    ``update(server, worker, gradient)`` (a :class:`ServerState`; the rule returns the staleness),
    and the worker computes its next gradient on the weights of the reply. After ``updates``
    pushes, returns the weights, the staleness of every push and the server's version.
    """
    x, y, lambda_max = least_squares_problem(seed, examples=256, features=features)
    rng = np.random.default_rng([seed, 6])
    server = ServerState(np.zeros(features, np.float32), lr_fraction * 2.0 / lambda_max)
    held, ready = {}, []
    for worker in range(workers):
        server.read_version[worker] = server.version
        held[worker] = server.weights.copy()
        heapq.heappush(ready, (float(rng.uniform(0.5, 1.5)), worker))
    staleness = []
    for _ in range(updates):
        now, worker = heapq.heappop(ready)
        rows = rng.integers(0, len(x), size=batch)
        gradient = (x[rows].T @ (x[rows] @ held[worker] - y[rows]) / batch).astype(np.float32)
        staleness.append(int(update(server, worker, gradient)))
        held[worker] = np.array(server.weights, dtype=np.float32, copy=True)
        heapq.heappush(ready, (now + float(rng.uniform(0.5, 1.5)), worker))
    return {"weights": np.array(server.weights, copy=True), "staleness": staleness, "version": server.version}


# --------------------------------------------------------------------------------------------
# Traffic: a parameter server against a ring all-reduce


def traffic_per_worker(num_workers: int, gradient_bytes: int) -> dict[str, float]:
    """Bytes one synchronous step moves, for a gradient (and a model) of ``gradient_bytes``.

    With one parameter server, each worker sends its gradient and receives the weights, so the
    server's link carries N gradients in and N models out. A ring all-reduce (notebook 04) has
    every worker send 2 (N - 1) / N of the gradient and receive as much, on every link alike.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    n, g = num_workers, float(gradient_bytes)
    return {
        "workers": n,
        "ps_worker_sends": g,
        "ps_server_receives": n * g,
        "ps_server_sends": n * g,
        "ring_worker_sends": ring_traffic_fraction(n) * g,
    }


# --------------------------------------------------------------------------------------------
# Unequal devices: the uneven split


def split_by_work_load(global_batch: int, work_load: Sequence[float]) -> list[int]:
    """Cut ``global_batch`` examples in proportion to ``work_load`` (MXNet's ``work_load_list``).

    The sizes are whole numbers that add up to the global batch: each device gets the floor of its
    share, and the examples left over go to the devices with the largest remainders.
    """
    load = np.asarray(work_load, dtype=float)
    if load.ndim != 1 or len(load) == 0 or np.any(load <= 0):
        raise ValueError(f"work_load must be positive numbers, got {list(work_load)}")
    share = global_batch * load / load.sum()
    sizes = np.floor(share).astype(int)
    for i in np.argsort(-(share - sizes), kind="stable")[: global_batch - sizes.sum()]:
        sizes[i] += 1
    return sizes.tolist()


def _mlp_and_data(seed: int, examples: int, features: int, hidden: int, classes: int):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(examples, features)).astype(np.float32)
    y = rng.integers(0, classes, size=examples).astype(np.int64)
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input((features,)),
                                 tf.keras.layers.Dense(hidden, activation="relu"),
                                 tf.keras.layers.Dense(classes)])
    return model, x, y


def straggler_study(configs: Sequence[dict], *, global_batch: int = 64, steps: int = 30, warmup: int = 3,
                    ms_per_example: float = 1.0, seed: int = 0, features: int = 64, hidden: int = 128,
                    classes: int = 10) -> dict:
    """Synchronous data-parallel SGD on real Horovod workers, one configuration after another.

    Each configuration is a dict with ``name``, ``slowness`` (one factor per rank: 3 means a device
    three times slower), ``work_load`` (the split of the global batch, as for
    :func:`split_by_work_load`) and ``weighted`` (each rank's gradient weighted by its share of the
    batch before the sum, which makes any split exact; False: Horovod's plain average).

    A rank's step is its real gradient computation, then a sleep of ``ms_per_example`` x its
    examples x its slowness, standing for the device's time (a sleep holds no core, so a slow
    rank does not slow its neighbour, as a slower GPU would not), then the all-reduce and the
    update. Rank 0 returns, per configuration, the median step time after ``warmup`` steps, the
    throughput, every rank's device seconds per step, and the largest difference between the
    all-reduced gradient of the first step and the gradient one process computes on the
    concatenated global batch (with that gradient's largest absolute value, its scale).
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out = {"size": size, "global_batch": global_batch, "configs": {}}
    for config in configs:
        slowness = list(config["slowness"])
        if len(slowness) != size or len(config["work_load"]) != size:
            raise ValueError(f"{config['name']}: one slowness and one work load per rank ({size})")
        sizes = split_by_work_load(global_batch, config["work_load"])
        first = int(np.sum(sizes[:rank]))
        model, x, y = _mlp_and_data(seed, global_batch * (steps + warmup), features, hidden, classes)
        optimizer = tf.keras.optimizers.SGD(0.05)
        share = sizes[rank] / global_batch

        @tf.function
        def gradients(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            return tape.gradient(loss, model.trainable_variables)

        @tf.function
        def average(grads):
            if config["weighted"]:  # weights b_r / B, summed: the mean over the concatenated batch
                return hvd.grouped_allreduce([g * share for g in grads], op=hvd.Sum)
            return hvd.grouped_allreduce(grads, op=hvd.Average)

        times, max_error, scale = [], None, None
        ended = time.perf_counter()
        for step in range(steps + warmup):
            base = step * global_batch
            xb, yb = x[base + first: base + first + sizes[rank]], y[base + first: base + first + sizes[rank]]
            grads = gradients(xb, yb)
            time.sleep(ms_per_example * 1e-3 * sizes[rank] * slowness[rank])
            reduced = average(grads)
            if step == 0:
                reference = gradients(x[:global_batch], y[:global_batch])  # one process, the whole batch
                max_error = max(float(tf.reduce_max(tf.abs(r - g))) for r, g in zip(reduced, reference))
                scale = max(float(tf.reduce_max(tf.abs(g))) for g in reference)
            optimizer.apply_gradients(zip(reduced, model.trainable_variables))
            # A step runs from the end of the previous all-reduce to the end of its own: the time
            # between two updates, which the slowest rank sets.
            started, ended = ended, time.perf_counter()
            if step >= warmup:
                times.append(ended - started)
        step_s = float(np.median(times))
        out["configs"][config["name"]] = {
            "sizes": sizes, "slowness": slowness, "weighted": bool(config["weighted"]),
            "step_s": step_s, "examples_per_s": global_batch / step_s,
            "device_s_per_rank": [ms_per_example * 1e-3 * b * s for b, s in zip(sizes, slowness)],
            "max_error_vs_concatenated": max_error, "gradient_scale": scale,
        }
    return out


# --------------------------------------------------------------------------------------------
# TensorFlow's parameter-server training, in a child process


def _ps_strategy_child(config: dict) -> dict:
    """In a fresh process: a cluster of ``tf.distribute.Server``s, then the coordinator's training."""
    import tensorflow as tf

    started = time.perf_counter()
    spec = {"worker": [f"localhost:{launch.free_port()}" for _ in range(config["workers"])],
            "ps": [f"localhost:{launch.free_port()}" for _ in range(config["ps"])]}
    cluster = tf.train.ClusterSpec(spec)
    worker_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4, intra_op_parallelism_threads=1)
    # Every task is a gRPC server listening on its own localhost port; here they share one process.
    servers = [tf.distribute.Server(cluster, job_name="worker", task_index=i, config=worker_config, protocol="grpc")
               for i in range(config["workers"])]
    servers += [tf.distribute.Server(cluster, job_name="ps", task_index=i, protocol="grpc")
                for i in range(config["ps"])]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    x, y, lambda_max = least_squares_problem(config["seed"], features=config["features"])
    lr = config["lr_fraction"] * 2.0 / lambda_max
    with strategy.scope():
        w = tf.Variable(tf.zeros(config["features"]), name="w")
        optimizer = tf.keras.optimizers.SGD(lr)
        optimizer.build([w])  # its step counter lives on the parameter server too

    def dataset_fn():
        # No seed: each worker's shuffle draws its own, so the workers read different batches, as the
        # toy's do. (The strategy runs one traced dataset_fn on every worker, and the input context it
        # passes says pipeline 0 of 1 on each, so a seed could not tell the workers apart.)
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).repeat()
        return data.batch(config["batch"])

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(batches):
        def replica_step(xb, yb):
            pulled = optimizer.iterations.read_value()  # the updates applied when this step reads w
            with tf.control_dependencies([pulled]):
                with tf.GradientTape() as tape:
                    tape.watch(w)
                    loss = 0.5 * tf.reduce_mean((tf.linalg.matvec(xb, w.read_value()) - yb) ** 2)
                gradient = tape.gradient(loss, w)
            # the device's time for the step, as in the toy (a sleep: the workers share this process)
            device = tf.py_function(lambda: time.sleep(config["device_ms"] * 1e-3) or 0.0, [], tf.float32)
            with tf.control_dependencies([device]):
                optimizer.apply_gradients([(tf.identity(gradient), w)])
            # the update this step made is number `iterations`; staleness = updates in between
            return loss, optimizer.iterations.read_value() - 1 - pulled, pulled

        xb, yb = next(batches)
        return strategy.run(replica_step, args=(xb, yb))

    scheduled = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(config["steps"])]
    coordinator.join()
    fetched = [r.fetch() for r in scheduled]
    final_loss = float(0.5 * np.mean((x @ w.numpy() - y) ** 2))
    initial_loss = float(0.5 * np.mean(y.astype(np.float64) ** 2))  # the weights start at zero
    return {
        "cluster": spec,
        "variable_device": w.device,
        "step_counter_device": optimizer.iterations.device,
        "losses": [float(f[0]) for f in fetched],
        "staleness": [int(f[1]) for f in fetched],
        "pulled": [int(f[2]) for f in fetched],
        "updates_applied": int(optimizer.iterations.numpy()),
        "initial_loss": initial_loss,
        "final_loss": final_loss,
        "lr": lr,
        "seconds": time.perf_counter() - started,
        "tensorflow": tf.__version__,
    }


def ps_strategy_demo(workers: int = 2, ps: int = 1, steps: int = 60, batch: int = 16, lr_fraction: float = 0.2,
                     features: int = 20, device_ms: float = 20.0, seed: int = 0, timeout: float = 180.0) -> dict:
    """Train the toy regression with ``ParameterServerStrategy`` in a child process; return its record.

    The child starts ``workers`` worker servers and ``ps`` parameter servers on free localhost
    ports, becomes their coordinator and schedules ``steps`` training steps; it is killed (with its
    whole process group) if it is still running after ``timeout`` seconds or if the caller is
    interrupted, so no server outlives the call.
    """
    config = dict(workers=workers, ps=ps, steps=steps, batch=batch, lr_fraction=lr_fraction,
                  features=features, device_ms=device_ms, seed=seed)
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="mgpu-ps-") as tmp:
        out = Path(tmp) / "out.json"
        command = [sys.executable, "-m", "mgpu.lesson06.async_sgd", json.dumps(config), str(out)]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=env, start_new_session=True)
        try:
            log, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            log = f"timed out after {timeout:.0f} s"
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if child.returncode != 0 or not out.exists():
            raise RuntimeError(f"the ParameterServerStrategy run failed (status {child.returncode}):\n{log[-3000:]}")
        return json.loads(out.read_text())


def _main(argv: list[str]) -> int:
    import mgpu  # noqa: F401  (Keras 2 on TensorFlow 2.16+, before TensorFlow is imported)

    config, out = json.loads(argv[0]), Path(argv[1])
    record = _ps_strategy_child(config)
    out.write_text(json.dumps(record))
    sys.stdout.flush()
    os._exit(0)  # the in-process servers have no shutdown: leave without waiting for their threads


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
