"""Notebook 11's batcher of one's own: the exercise's batching loop, run in threads on a queue.

:func:`serve_in_threads` runs a batching loop of one's own (the notebook's exercise) in a thread,
with client threads that put ``(row, future)`` pairs on a :class:`queue.Queue`, and counts the
batches it hands the model (:class:`CountingModel`); it returns a :class:`ThreadedRun`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


class CountingModel:
    """A model function that records the size of every batch it is called on."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]):
        self.fn = fn
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        with self._lock:
            self.batch_sizes.append(len(batch))
        return self.fn(batch)


@dataclass
class ThreadedRun:
    """What a batching loop did for a set of client threads."""

    answers: list            # the answer each row's request got, in the order of the rows
    latencies: np.ndarray    # seconds from each request's put on the queue to its answer, per row
    seconds: float           # from the clients' common start to the last answer
    batch_sizes: list        # the size of each model call, in order

    @property
    def throughput(self) -> float:
        return len(self.answers) / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batch_sizes)) if self.batch_sizes else float("nan")


def serve_in_threads(loop: Callable, model: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, *,
                     clients: int, max_batch: int, max_delay: float, wait_for_answers: bool = True,
                     timeout: float = 60.0) -> ThreadedRun:
    """Run ``loop(requests, model, max_batch, max_delay)`` in a thread and ``clients`` client threads
    against it, then stop it.

    ``requests`` is a :class:`queue.Queue`. Client ``i`` sends rows ``i``, ``i + clients``, ...: for
    each it puts ``(row, future)`` on the queue (``future`` a :class:`concurrent.futures.Future`
    that the loop answers with ``future.set_result``). With ``wait_for_answers`` a client waits for
    each answer before sending its next row (a closed loop); without, it puts all its rows at once
    and then waits (a burst). All clients start together, so ``clients == len(rows)`` is a burst of
    simultaneous requests either way. When every client has its answers, ``None`` is put on the
    queue: the loop must then return. The model is wrapped in a :class:`CountingModel`, whose batch
    sizes the run returns. An exception in the loop, or a loop that returns or stops answering while
    requests wait, is raised here, never a hang.
    """
    import queue
    from concurrent.futures import Future, TimeoutError as FutureTimeout

    counting = CountingModel(model)
    requests: queue.Queue = queue.Queue()
    loop_failed: list[BaseException] = []
    failures: list[BaseException] = []

    def serve():
        try:
            loop(requests, counting, max_batch, max_delay)
        except BaseException as error:  # raised by serve_in_threads, below
            loop_failed.append(error)

    server = threading.Thread(target=serve, name="batching-loop", daemon=True)
    answers: list = [None] * len(rows)
    futures: list = [None] * len(rows)
    sent = np.full(len(rows), np.nan)
    finished = np.full(len(rows), np.nan)
    start = threading.Barrier(clients + 1)

    def send(index: int):
        future = futures[index] = Future()
        future.add_done_callback(lambda _, i=index: finished.__setitem__(i, time.perf_counter()))
        sent[index] = time.perf_counter()
        requests.put((rows[index], future))

    def wait(index: int):
        give_up = time.perf_counter() + timeout
        while True:
            try:
                answers[index] = futures[index].result(timeout=0.05)
                return
            except FutureTimeout:
                if not server.is_alive():
                    raise RuntimeError("the batching loop stopped while a request waited for its answer")
                if time.perf_counter() > give_up:
                    raise RuntimeError(f"no answer within {timeout} s")

    def client(first: int):
        try:
            start.wait()
            mine = range(first, len(rows), clients)
            for index in mine:
                send(index)
                if wait_for_answers:
                    wait(index)
            if not wait_for_answers:
                for index in mine:
                    wait(index)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    server.start()
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    requests.put(None)
    server.join(timeout=10.0)
    if loop_failed or failures:
        raise (loop_failed or failures)[0]
    if server.is_alive():
        raise RuntimeError("the batching loop did not return after None was put on its queue")
    return ThreadedRun(answers=answers, latencies=finished - sent, seconds=float(np.nanmax(finished) - began),
                       batch_sizes=list(counting.batch_sizes))
