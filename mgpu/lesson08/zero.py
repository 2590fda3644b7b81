"""Notebook 08's ZeRO harness: the same training run under plain data parallelism and each ZeRO stage.

The notebook writes the stages themselves (their cells are saved into :mod:`mgpu.lesson08.saved`);
this module gives each stage its weights and optimizer, feeds every worker its batches, records what
each step hands Horovod (:func:`mgpu.runtime.collectives.wire_log`), measures the bytes each worker
holds, and gathers every worker's final weights for the parity check. The formulas of the bytes are here too.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from mgpu.runtime.collectives import wire_log

#: Which of a stage's tensors are sharded: (parameters, gradients, optimizer state).
SHARDED = {"dp": (False, False, False), "zero1": (False, False, True),
           "zero2": (False, True, True), "zero3": (True, True, True)}


def layer_sizes(widths) -> list[int]:
    """Parameters of each dense layer (weights and biases) of an MLP with these widths."""
    return [a * b + b for a, b in zip(widths[:-1], widths[1:])]


def layer_specs(widths) -> list[tuple[int, int, bool]]:
    """Each dense layer's (fan_in, fan_out, hidden): every layer but the last (the logits) is hidden."""
    return [(a, b, i < len(widths) - 2) for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]


def padded_size(size: int, workers: int) -> int:
    """``size`` rounded up to a multiple of ``workers`` (a tensor padded before it is sharded)."""
    return -(-size // workers) * workers


def formula_bytes(widths, workers: int, stage: str) -> dict[str, int]:
    """Bytes one worker holds in the course's float32 setting: 4 per parameter for the weights, 4 for
    the gradients, 8 for Adam's two moments, each divided by N where the stage shards it (psi padded to
    a multiple of N per layer)."""
    psi = sum(layer_sizes(widths))
    shard = sum(padded_size(s, workers) for s in layer_sizes(widths)) // workers
    params, grads, state = SHARDED[stage]
    return {"parameters": 4 * (shard if params else psi), "gradients": 4 * (shard if grads else psi),
            "optimizer state": 8 * (shard if state else psi)}


def network_bytes(entries, workers: int) -> float:
    """Bytes one worker sends through the network for the logged collectives, by the ring algorithms:
    an all-reduce 2(N - 1)/N of its input, a reduce-scatter (N - 1)/N of its input, an all-gather
    N - 1 times its input (the shard it contributes)."""
    factor = {"allreduce": 2 * (workers - 1) / workers, "reducescatter": (workers - 1) / workers,
              "allgather": workers - 1}
    return sum(factor[e["op"]] * e["bytes"] for e in entries)


def _nbytes(tensors) -> int:
    return int(sum(int(np.prod(t.shape)) * t.dtype.size for t in tensors))


def batches(seed: int, rank: int, steps: int, batch: int, widths):
    """Every step's batch of one worker: random inputs, labels of a fixed random linear teacher."""
    rng = np.random.default_rng([seed, 7])
    teacher = rng.normal(size=(widths[0], widths[-1])).astype(np.float32)
    rng = np.random.default_rng([seed, rank])
    for _ in range(steps):
        x = rng.normal(size=(batch, widths[0])).astype(np.float32)
        yield x, np.argmax(x @ teacher, axis=1).astype(np.int32)


def initial_thetas(seed: int, widths) -> list[np.ndarray]:
    """Each layer's parameters as one flat float32 vector (He-initialised weights, then zero biases)."""
    rng = np.random.default_rng([seed, 3])
    return [np.concatenate([rng.normal(0, math.sqrt(2 / a), a * b), np.zeros(b)]).astype(np.float32)
            for a, b in zip(widths[:-1], widths[1:])]


def compare_stages(stages: dict[str, Callable], adam_class, widths, batch: int, steps: int, lr: float,
                   seed: int) -> list[dict] | None:
    """On each Horovod worker: train the MLP ``widths`` for ``steps`` steps once per stage of ``stages``,
    from the same weights on the same batches. A stage is name -> ``step(params, adams, x, y, specs)``,
    which updates ``params`` and returns the gradients it holds when its backward pass ends (``specs``:
    each layer's (fan_in, fan_out, hidden)); ``adam_class(size, lr=...)`` makes each layer's optimizer.
    Returns, on rank 0, one row per worker and stage: the bytes held, the collectives of the last
    step and the final weights (whole, gathered where sharded); None on the other ranks."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    specs = layer_specs(widths)
    rows = []
    for stage, step in stages.items():
        shard_params, _, shard_state = SHARDED[stage]
        params, adams = [], []
        for theta in initial_thetas(seed, widths):
            shard_size = padded_size(theta.size, n) // n
            shard = np.pad(theta, (0, padded_size(theta.size, n) - theta.size)).reshape(n, -1)[rank]
            params.append(tf.Variable(shard if shard_params else theta))
            adams.append(adam_class(shard_size if shard_state else theta.size, lr=lr))
        for i, (x, y) in enumerate(batches(seed, rank, steps, batch, widths)):
            if i == steps - 1:
                with wire_log() as log:
                    held_gradients = step(params, adams, tf.constant(x), tf.constant(y), specs)
            else:
                step(params, adams, tf.constant(x), tf.constant(y), specs)
        final = [hvd.allgather(p).numpy()[:t.size] if shard_params else p.numpy()
                 for p, t in zip(params, initial_thetas(seed, widths))]
        rows.append({"stage": stage, "rank": rank, "workers": n,
                     "parameters": _nbytes(params), "gradients": _nbytes(held_gradients),
                     "optimizer state": _nbytes([v for a in adams for v in (a.m, a.v)]),
                     "collectives": log, "weights": np.concatenate(final)})
    every = hvd.allgather_object(rows)
    return [row for rows_of_rank in every for row in rows_of_rank] if rank == 0 else None
