"""A ring all-reduce written from scratch in numpy, to step through and to count traffic.

Horovod averages gradients with a ring all-reduce (Sergeev & Del Balso 2018, after Patarasuk &
Yuan 2009 and Baidu's 2017 ring implementation). N workers sit in a ring; each cuts its vector
into N chunks. In N - 1 *reduce-scatter* steps every worker passes one chunk to its right-hand
neighbour, which adds it to its own copy; afterwards worker i holds the full sum of chunk i + 1.
In N - 1 *all-gather* steps the finished chunks travel round the ring once more. Each worker sends
2 (N - 1) chunks, i.e. 2 (N - 1) / N of the vector: almost independent of N, which is why the ring
scales.

:func:`ring_allreduce` returns the result and the bytes each worker sent;
:func:`ring_allreduce_steps` yields the state after every step, for a notebook to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np


@dataclass
class RingStep:
    """The state of the ring after one step."""

    phase: str                     # "start", "reduce-scatter" or "all-gather"
    step: int                      # 0-based within the phase
    chunks: list[list[np.ndarray]]  # chunks[worker][chunk], copies
    sends: list[tuple[int, int, int]]  # (from worker, to worker, chunk index) in this step
    bytes_sent: np.ndarray         # per worker, cumulative


def _check(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(inputs) < 1:
        raise ValueError("need at least one worker's array")
    arrays = [np.asarray(a) for a in inputs]
    shape, dtype = arrays[0].shape, arrays[0].dtype
    for rank, array in enumerate(arrays):
        if array.shape != shape or array.dtype != dtype:
            raise ValueError(f"worker {rank} has {array.dtype}{array.shape}, worker 0 has "
                             f"{dtype}{shape}: every worker must all-reduce the same shape and dtype")
    return arrays


def ring_allreduce_steps(inputs: Sequence[np.ndarray]) -> Iterator[RingStep]:
    """Yield the ring's state at the start and after each of the 2 (N - 1) steps."""
    arrays = _check(inputs)
    n = len(arrays)
    # np.array_split tolerates sizes that N does not divide: chunk sizes differ by at most one.
    chunks = [[c.copy() for c in np.array_split(a.ravel(), n)] for a in arrays]
    sent = np.zeros(n, dtype=np.int64)
    yield RingStep("start", 0, [[c.copy() for c in w] for w in chunks], [], sent.copy())
    for step in range(n - 1):
        # Worker i sends chunk (i - step) mod n; all sends of a step happen at once, so read first.
        sends = [(i, (i + 1) % n, (i - step) % n) for i in range(n)]
        payload = [chunks[i][c].copy() for i, _, c in sends]
        for (i, j, c), data in zip(sends, payload):
            chunks[j][c] = chunks[j][c] + data
            sent[i] += data.nbytes
        yield RingStep("reduce-scatter", step, [[c.copy() for c in w] for w in chunks], sends, sent.copy())
    for step in range(n - 1):
        # Worker i now owns the finished chunk (i + 1 - step) mod n and passes it on.
        sends = [(i, (i + 1) % n, (i + 1 - step) % n) for i in range(n)]
        payload = [chunks[i][c].copy() for i, _, c in sends]
        for (i, j, c), data in zip(sends, payload):
            chunks[j][c] = data
            sent[i] += data.nbytes
        yield RingStep("all-gather", step, [[c.copy() for c in w] for w in chunks], sends, sent.copy())


def ring_allreduce(inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """Sum ``inputs`` (one array per worker) with a ring; returns (each worker's result, bytes sent).

    The ring is notebook 04's (its exercise, saved into :mod:`mgpu.lesson04.saved`); this checks the
    inputs first."""
    from mgpu.lesson04.saved import ring_allreduce as ring_of_notebook_04

    return ring_of_notebook_04(_check(inputs))


def ring_traffic_fraction(num_workers: int) -> float:
    """Bytes each worker sends in a ring all-reduce, as a fraction of the vector: 2 (N - 1) / N."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    return 2 * (num_workers - 1) / num_workers
