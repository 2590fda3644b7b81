"""Notebook 11's queueing model of request batching.

:func:`simulate_batching` is the model: Poisson arrivals, one model instance, a batch service time
``a + c * batch``, and a batcher that starts a batch when the instance is free and its oldest
request has waited ``delay`` (or ``max_batch`` requests wait); :func:`fit_batch_cost` fits ``a`` and
``c`` to measured batch times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class BatchingRun:
    """What a batching policy did to a sequence of arrivals (the model's, or a server's)."""

    latencies: np.ndarray           # seconds, one per request, in arrival order
    batch_sizes: np.ndarray         # one per batch, in order
    finished: float                 # when the last request was answered (seconds)

    @property
    def throughput(self) -> float:
        """Requests answered per second, from the first arrival to the last answer."""
        return len(self.latencies) / self.finished if self.finished > 0 else float("nan")

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batch_sizes))


def simulate_batching(arrivals: Sequence[float], delay: float, batch_cost: tuple[float, float],
                      max_batch: int = 64, overhead: float = 0.0) -> BatchingRun:
    """The queueing model of a dynamic batcher in front of one model instance.

    Requests arrive at ``arrivals`` (seconds, increasing) and wait in one FIFO queue. Whenever the
    instance is free and a request waits, a batch starts at the latest of: the moment the instance
    became free, and the oldest waiting request's arrival plus ``delay`` -- unless ``max_batch``
    requests are waiting before that, which starts it at once. The batch takes every waiting request
    (at most ``max_batch``) and ``a + c * size`` seconds (``batch_cost = (a, c)``). A request's
    latency is its batch's end minus its arrival, plus ``overhead`` (time spent outside the batcher:
    network, parsing, the client). ``max_batch=1`` is a server without batching; ``delay=0`` batches
    only what queued while the instance was busy.
    """
    a, c = batch_cost
    t = np.asarray(arrivals, dtype=float)
    if t.size == 0 or np.any(np.diff(t) < 0):
        raise ValueError("arrivals must be a non-empty increasing sequence")
    if delay < 0 or max_batch < 1:
        raise ValueError("delay must be >= 0 and max_batch >= 1")
    n = t.size
    done = np.empty(n)
    sizes = []
    free = -math.inf
    i = 0
    while i < n:
        start = max(free, t[i] + delay)
        full = i + max_batch - 1  # the request that would fill the batch
        if full < n and t[full] <= start:
            start = max(free, t[i], t[full])
        end_index = np.searchsorted(t, start, side="right")  # everyone who arrived by the start...
        end_index = min(end_index, i + max_batch)            # ...up to a full batch
        size = end_index - i
        free = start + a + c * size
        done[i:end_index] = free
        sizes.append(size)
        i = end_index
    latencies = done - t + overhead
    return BatchingRun(latencies=latencies, batch_sizes=np.asarray(sizes), finished=float(done[-1] - t[0] + overhead))


def fit_batch_cost(batch_sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(a, c)`` of ``seconds = a + c * batch`` (a fixed cost per batch, and per request)."""
    b = np.asarray(batch_sizes, dtype=float)
    s = np.asarray(seconds, dtype=float)
    if b.size < 2 or np.unique(b).size < 2:
        raise ValueError("need at least two different batch sizes")
    c, a = np.polyfit(b, s, 1)
    return float(max(a, 0.0)), float(max(c, 0.0))
