"""Notebook 11's load generator, its HTTP client and latency statistics.

- :func:`poisson_arrivals` draws the arrival times of an open-loop load (a Poisson process), and
  :func:`send_load` sends one request per arrival to a server over HTTP, each at its own time
  whether or not earlier ones have been answered, and returns every request's latency measured
  from its *scheduled* arrival (a client that falls behind shows up as latency, not as a lower rate),
  with the requests the server answered wrongly (errors) apart from those it did not answer in time
  (unanswered); :func:`burst_capacity` gauges how many requests per second a model name answers;
  :func:`infer` sends one request and returns the model's outputs.
- :func:`percentile` and :func:`latency_stats` summarise latencies (nearest-rank percentiles).

The servers speak KServe v2 (``/v2/models/<name>/infer``), so none of this cares which server runs
(:mod:`mgpu.lesson11.inference_server`).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mgpu.lesson11.inference_server import ServerError


def poisson_arrivals(rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (seconds from 0, increasing, all below ``duration``) of a Poisson process.

    Gaps between arrivals are independent and exponential with mean ``1 / rate``, so the number of
    arrivals is Poisson with mean ``rate * duration``.
    """
    if rate <= 0 or duration <= 0:
        raise ValueError("rate and duration must be positive")
    expected = rate * duration
    count = int(expected + 10 * math.sqrt(expected) + 20)  # enough gaps to pass `duration` almost surely
    times = np.cumsum(rng.exponential(1.0 / rate, size=count))
    while times[-1] < duration:  # practically never: draw more
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, size=count))])
    return times[times < duration]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile: the smallest value with at least q% of the values at or below it."""
    ordered = np.sort(np.asarray(values, dtype=float))
    if ordered.size == 0:
        raise ValueError("no values")
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    rank = math.ceil(q / 100 * ordered.size)
    return float(ordered[rank - 1])


def latency_stats(latencies: Sequence[float]) -> dict:
    """Mean, median (p50), p99 and maximum of latencies, in the latencies' unit."""
    values = np.asarray(latencies, dtype=float)
    return {"mean": float(values.mean()), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": float(values.max()), "count": int(values.size)}


def _request_body(rows: np.ndarray) -> tuple[bytes, dict]:
    """One inference request in Triton's HTTP protocol, the tensor as raw bytes after a JSON header."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    header = json.dumps({
        "inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": rows.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": False}}],
    }).encode()
    return header + rows.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                     "Content-Type": "application/octet-stream"}


@dataclass
class LoadRun:
    """A load's requests as the client saw them.

    ``errors``: requests the server answered with an error status, or (given the expected outputs)
    with an output that differs from them -- something is wrong. ``unanswered``: requests with no
    answer within the timeout, or whose connection was dropped -- what an overloaded server does.
    """

    latencies: np.ndarray  # seconds from each answered request's scheduled arrival to its answer
    finished: float        # seconds from the first scheduled arrival to the last answer
    errors: int = 0
    unanswered: int = 0

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.finished if self.finished > 0 else float("nan")


def _output(payload: bytes) -> np.ndarray:
    """The first output tensor of a KServe v2 JSON answer."""
    output = json.loads(payload)["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


async def _send_all(url: str, name: str, arrivals: np.ndarray, bodies: list, timeout: float,
                    expected: np.ndarray | None) -> LoadRun:
    import aiohttp

    loop = asyncio.get_running_loop()
    target = f"{url}/v2/models/{name}/infer"
    done = np.full(len(arrivals), np.nan)
    errors = unanswered = 0

    async def one(session, index, body, headers):
        nonlocal errors, unanswered
        try:
            async with session.post(target, data=body, headers=headers) as response:
                payload = await response.read()
                if response.status != 200:
                    raise ServerError(payload[:200].decode(errors="replace"))
            if expected is not None and not np.allclose(_output(payload)[0], expected[index % len(expected)],
                                                        rtol=1e-3, atol=1e-4):
                raise ServerError(f"a wrong answer to request {index}")
            done[index] = loop.time()
        except (ServerError, ValueError, KeyError, IndexError):
            errors += 1
        except (aiohttp.ClientError, asyncio.TimeoutError):
            unanswered += 1

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        start = loop.time() + 0.05
        tasks = []
        for index, at in enumerate(arrivals):
            wait = start + at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            body, headers = bodies[index % len(bodies)]
            tasks.append(asyncio.create_task(one(session, index, body, headers)))
        await asyncio.gather(*tasks)
    ok = ~np.isnan(done)
    scheduled = start + np.asarray(arrivals)
    latencies = (done - scheduled)[ok]
    finished = float(np.nanmax(done) - scheduled[0]) if ok.any() else float("nan")
    return LoadRun(latencies=latencies, finished=finished, errors=errors, unanswered=unanswered)


def send_load(url: str, name: str, arrivals: np.ndarray, inputs: np.ndarray, timeout: float = 120.0,
              expected: np.ndarray | None = None) -> LoadRun:
    """Send one request (one row of ``inputs``, in turn) at each arrival time (seconds from now).

    Requests go out on schedule whether or not earlier ones have been answered (an open loop, as
    independent users behave); each latency runs from the scheduled arrival to the answer. A request
    not answered within ``timeout`` seconds counts as unanswered. ``expected``: the model's output
    on each row of ``inputs``, to check every answer against (a mismatch counts as an error).
    """
    bodies = [_request_body(inputs[i:i + 1]) for i in range(len(inputs))]
    if expected is not None:
        expected = np.asarray(expected, dtype=np.float32).reshape(len(inputs), -1)
    return _run(_send_all(url, name, np.asarray(arrivals, dtype=float), bodies, timeout, expected))


def burst_capacity(url: str, names: Sequence[str], requests: int, inputs: np.ndarray, rounds: int = 3,
                   timeout: float = 120.0) -> dict[str, float]:
    """Requests per second each model name answers when ``requests`` arrive at once: the median of
    ``rounds`` bursts, the names taken in turn in each round (a busy moment slows them alike)."""
    speeds = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            speeds[name].append(send_load(url, name, np.zeros(requests), inputs, timeout=timeout).throughput)
    return {name: float(np.median(values)) for name, values in speeds.items()}


def infer(url: str, name: str, rows: np.ndarray, timeout: float = 60.0) -> np.ndarray:
    """One request carrying ``rows`` (a batch made by the client): the model's outputs."""
    body, headers = _request_body(rows)
    request = urllib.request.Request(f"{url}/v2/models/{name}/infer", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return _output(r.read())


def _run(coroutine):
    """Run a coroutine to completion, also from inside Jupyter's running event loop (in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result = {}

    def target():
        try:
            result["value"] = asyncio.run(coroutine)
        except BaseException as error:  # handed to the caller
            result["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
