"""Notebook 11's serving helpers: a load generator, latency statistics, a queueing model of request
batching, and an inference server that starts and stops from a notebook without leaving a process.

- :func:`poisson_arrivals` draws the arrival times of an open-loop load (a Poisson process), and
  :func:`send_load` sends one request per arrival to a server over HTTP, each at its own time
  whether or not earlier ones have been answered, and returns every request's latency measured
  from its *scheduled* arrival (a client that falls behind shows up as latency, not as a lower rate),
  with the requests the server answered wrongly (errors) apart from those it did not answer in time;
  :func:`burst_capacity` gauges how many requests per second a model name answers.
- :func:`percentile` and :func:`latency_stats` summarise latencies (nearest-rank percentiles).
- :func:`simulate_batching` is the queueing model: Poisson arrivals, one model instance, a batch
  service time ``a + c * batch``, and a batcher that starts a batch when the instance is free and
  its oldest request has waited ``delay`` (or ``max_batch`` requests wait).
- :class:`InferenceServer` serves a saved Keras model under one name per batching delay, in a child
  process, with one of two real servers that batch requests dynamically (:func:`pick_backend`):
  NVIDIA Triton through the ``nvidia-pytriton`` package (its dynamic batcher's maximum queue
  delay), or, where Triton cannot run (``nvidia-pytriton`` 0.7.0 needs NumPy 1, so not on the
  current stack or Colab), Ray Serve's ``@serve.batch`` (its ``batch_wait_timeout_s``). Both speak
  the same HTTP protocol (KServe v2: ``/v2/models/<name>/infer``, ``ready`` and ``stats``), so the
  load generator and the statistics below do not care which one runs. The child has its own
  process group; stopping it (always, from ``__exit__``, ``atexit`` or the child noticing that its
  parent died) ends the child and everything it started (Triton and its Python-backend stubs, or
  Ray's daemons and actors), and :meth:`InferenceServer.pids` lets a test check that none is left.
- :func:`serve_in_threads` runs a batching loop of one's own (the notebook's exercise) in a thread,
  with client threads that put ``(row, future)`` pairs on a :class:`queue.Queue`, and counts the
  batches it hands the model (:class:`CountingModel`).
- :func:`tensor_core_sizes` and :func:`loss_scaled` are section 3's two CPU-checkable pieces of the
  float16 code (which only runs on a GPU).

The child process is this module run as ``python -m mgpu.serving serve ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mgpu import launch

NO_BATCHING = "no_batching"


# --------------------------------------------------------------------------------------------
# The load generator and latency statistics
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# The queueing model of batching
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# The server: Triton in a child process, and its plumbing
# --------------------------------------------------------------------------------------------


def triton_unavailable_reason() -> str | None:
    """Why Triton (through ``nvidia-pytriton``) cannot serve on this machine, or None when it can."""
    import platform

    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        return "nvidia-pytriton has wheels for Linux on x86_64 and aarch64 only"
    libc, version = platform.libc_ver()
    if libc == "glibc" and tuple(int(p) for p in version.split(".")[:2]) < (2, 35):
        return f"nvidia-pytriton 0.7.0 needs glibc 2.35 or later (Ubuntu 22.04+, Debian 12+); this machine has {version}"
    if int(np.__version__.split(".")[0]) >= 2:
        return (f"NumPy {np.__version__}: Triton's Python-backend stub in nvidia-pytriton 0.7.0 is built against "
                "NumPy 1's binary interface, so with NumPy 2 the server starts but every inference fails "
                "('output tensor shape does not match size of output'); it needs NumPy < 2 (the course's "
                "pinned stack: Python 3.11, TensorFlow 2.15)")
    try:
        import pytriton  # noqa: F401
    except ImportError:
        return "the nvidia-pytriton package is not installed (pip install nvidia-pytriton==0.7.0 tritonclient==2.51.0)"
    return None


def ray_unavailable_reason() -> str | None:
    """Why Ray Serve cannot serve here, or None when it can."""
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        return "Ray Serve is not installed (pip install 'ray[serve]==2.60.0', in the current stack's requirements)"
    return None


BACKENDS = ("triton", "ray")


def pick_backend(backend: str = "auto") -> tuple[str | None, str]:
    """The server section 2 uses, and why: ``(backend, reason)``, or ``(None, why neither can run)``.

    ``"auto"`` prefers Triton, the server the section is written around, and takes Ray Serve where
    Triton cannot run; naming a backend insists on it.
    """
    reasons = {"triton": triton_unavailable_reason(), "ray": ray_unavailable_reason()}
    if backend not in ("auto",) + BACKENDS:
        raise ValueError(f"unknown serving backend {backend!r}: use 'auto', 'triton' or 'ray'")
    if backend != "auto":
        return (None, reasons[backend]) if reasons[backend] else (backend, f"{backend} was asked for")
    if reasons["triton"] is None:
        return "triton", "NVIDIA Triton can run here"
    if reasons["ray"] is None:
        return "ray", f"Triton cannot run here ({reasons['triton']}), so Ray Serve's @serve.batch batches instead"
    return None, f"Triton cannot run here ({reasons['triton']}) and {reasons['ray']}"


def model_name(delay_ms: float | None) -> str:
    """The name a batching delay is served under (None: no batching)."""
    if delay_ms is None:
        return NO_BATCHING
    return f"delay_{int(round(delay_ms * 1000))}us"


def _library_path_with_libpython(env: dict) -> str:
    """LD_LIBRARY_PATH with this interpreter's own libpython first.

    Triton's Python-backend stub links ``libpython3.X.so.1.0`` dynamically but runs this
    interpreter's standard library; the system's copy can be an older patch release (Debian 12 has
    3.11.2 while a pyenv or venv Python is 3.11.7), whose C modules lack what the newer library calls.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME")
    parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    if libdir and soname and (Path(libdir) / soname).exists() and libdir not in parts:
        parts.insert(0, libdir)
    return ":".join(parts)


def _tree(pid: int) -> dict:
    """``{pid: psutil.Process}`` for a process and its descendants (the objects notice a reused pid)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return {p.pid: p for p in [root] + root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def _running(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def alive(pids) -> list[int]:
    """The processes of ``pids`` that still exist (zombies count as gone)."""
    import psutil

    left = []
    for pid in pids:
        try:
            if _running(psutil.Process(pid)):
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


class ServerError(RuntimeError):
    """The inference server did not start or answer; the message ends with its log."""


@dataclass
class InferenceServer:
    """A real inference server serving a saved Keras model, one model name per batching delay.

    ``delays_ms`` are the batcher's delays (milliseconds: Triton's maximum queue delay, Ray Serve's
    ``batch_wait_timeout_s``); each is served as :func:`model_name(delay) <model_name>` with batches
    of up to ``max_batch`` rows, and the same model one request at a time as ``"no_batching"``.
    ``backend`` is ``"triton"``, ``"ray"`` or ``"auto"`` (:func:`pick_backend`). Use it as a
    context manager::

        with InferenceServer(path, delays_ms=[0, 2]) as server:
            latencies = send_load(server.url, model_name(2), ...)

    ``threads`` caps TensorFlow's threads in the server (None: TensorFlow's default).
    """

    model_path: str | os.PathLike
    delays_ms: Sequence[float] = (0.0,)
    max_batch: int = 64
    threads: int | None = None
    start_timeout: float = 180.0
    stop_timeout: float = 20.0
    log_path: str | os.PathLike | None = None
    port: int = 0
    backend: str = "auto"
    _process: subprocess.Popen | None = field(default=None, repr=False)
    _seen: dict = field(default_factory=dict, repr=False)
    _workdir: str | None = field(default=None, repr=False)
    started_in: float = float("nan")
    stopped_in: float = float("nan")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_names(self) -> list[str]:
        return [NO_BATCHING] + [model_name(d) for d in self.delays_ms]

    def pids(self) -> set[int]:
        """Every process this server started that is known so far (the child and its descendants)."""
        if self._process is not None and self._process.poll() is None:
            self._seen.update(_tree(self._process.pid))
        return set(self._seen)

    def _left(self) -> list:
        return [p for p in self._seen.values() if _running(p)]

    def log(self, lines: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except (OSError, TypeError):
            return "(no log)"

    def start(self) -> "InferenceServer":
        if self._process is not None:
            raise RuntimeError("the server is already started")
        backend, why = pick_backend(self.backend)
        if backend is None:
            raise ServerError(f"no inference server can run here: {why}")
        self.backend = backend
        begin = time.perf_counter()
        self._workdir = tempfile.mkdtemp(prefix=f"mgpu-{backend}-")
        if self.log_path is None:
            self.log_path = str(Path(self._workdir) / "server.log")
        self.port = self.port or launch.free_port()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = _library_path_with_libpython(env)
        env["PYTHONUNBUFFERED"] = "1"
        env["TMPDIR"] = self._workdir  # where Triton copies each model's files while it is loaded
        command = [sys.executable, "-m", "mgpu.serving", "serve", "--backend", backend, "--model", str(self.model_path),
                   "--delays-ms", ",".join(repr(float(d)) for d in self.delays_ms),
                   "--max-batch", str(self.max_batch), "--http-port", str(self.port),
                   "--grpc-port", str(launch.free_port()), "--metrics-port", str(launch.free_port()),
                   "--workspace", str(Path(self._workdir) / "workspace")]
        if self.threads:
            command += ["--threads", str(self.threads)]
        log = open(self.log_path, "w")
        # Its own session: the child, Triton and the stubs form one process group, killed as one.
        # Its stdin is a pipe from us: when this process dies, the child reads EOF and shuts down.
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env, cwd=str(Path(__file__).resolve().parents[1]))
        log.close()
        atexit.register(self.stop)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        self.pids()
        self.started_in = time.perf_counter() - begin
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = list(self.model_names)
        while waiting:
            self.pids()
            if self._process.poll() is not None:
                raise ServerError(f"the server exited with code {self._process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise ServerError(f"the server was not ready after {self.start_timeout:.0f} s "
                                  f"(waiting for {waiting}):\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/models/{waiting[0]}/ready", timeout=2) as r:
                    if r.status == 200:
                        waiting.pop(0)
                        continue
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the child gracefully (SIGTERM), then kill whatever of its process group is left."""
        process, self._process = self._process, None
        if process is None:
            return
        begin = time.perf_counter()
        atexit.unregister(self.stop)
        if process.poll() is None:
            self._seen.update(_tree(process.pid))
        try:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    pass
            deadline = time.monotonic() + 5  # Triton's stubs or Ray's daemons finish on their own
            while self._left() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if self._left():
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # the group: anything the child left behind
                except (ProcessLookupError, PermissionError):
                    pass
            for leftover in self._left():  # psutil checks that the pid still names the same process
                try:
                    leftover.kill()
                except Exception:  # gone meanwhile
                    pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if process.stdin:
                process.stdin.close()
            deadline = time.monotonic() + 10
            while self._left() and time.monotonic() < deadline:
                time.sleep(0.05)
            for block in Path("/dev/shm").glob(f"pytrtion{process.pid}-*"):  # pytriton's tensor blocks
                block.unlink(missing_ok=True)
            if self._workdir:  # the workspace, Triton's model copies or Ray's session (and the log, unless put elsewhere)
                shutil.rmtree(self._workdir, ignore_errors=True)
            self.stopped_in = time.perf_counter() - begin

    def __enter__(self) -> "InferenceServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the server's running processes, all of them.

        The difference over a run, divided by its requests, is what one request cost the server's
        processes, inside the model and out (HTTP, queues, the hop to the model), whatever the backend.
        """
        import psutil

        total = 0.0
        for process in (_tree(self._process.pid).values() if self._process is not None else ()):
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total

    # ---- talking to it

    def stats(self) -> dict:
        """Per model: how many batches it ran and requests it answered, and the compute time per batch size."""
        out = {}
        for name in self.model_names:
            with urllib.request.urlopen(f"{self.url}/v2/models/{name}/stats", timeout=10) as r:
                entry = json.load(r)["model_stats"][0]
            by_size = {}
            for row in entry.get("batch_stats", []):
                seconds = sum(int(row[part]["ns"]) for part in ("compute_input", "compute_infer", "compute_output"))
                by_size[int(row["batch_size"])] = (int(row["compute_infer"]["count"]), seconds / 1e9)
            out[name] = {"executions": int(entry.get("execution_count", 0)),
                         "requests": int(entry.get("inference_count", 0)), "by_batch_size": by_size}
        return out


def batches_between(before: dict, after: dict, name: str) -> tuple[int, int]:
    """(batches run, requests answered) by model ``name`` between two :meth:`InferenceServer.stats`."""
    return (after[name]["executions"] - before[name]["executions"],
            after[name]["requests"] - before[name]["requests"])


def busy_seconds(before: dict, after: dict, name: str) -> float:
    """Seconds model ``name`` spent computing batches between two :meth:`InferenceServer.stats`."""
    return sum(seconds - before[name]["by_batch_size"].get(size, (0, 0.0))[1]
               for size, (_, seconds) in after[name]["by_batch_size"].items())


def compute_seconds_by_batch(before: dict, after: dict, name: str) -> dict[int, float]:
    """Mean seconds of model compute per batch, by batch size, between two :meth:`InferenceServer.stats`."""
    out = {}
    for size, (count, seconds) in after[name]["by_batch_size"].items():
        count0, seconds0 = before[name]["by_batch_size"].get(size, (0, 0.0))
        if count > count0:
            out[size] = (seconds - seconds0) / (count - count0)
    return out


# ---- the client


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


# ---- the child process


def _load_traced(model_path: str, threads: int | None):
    """The saved model as a traced call on float32 rows, traced once before the first request."""
    import mgpu  # noqa: F401  (Keras 2 on TensorFlow 2.16+, before tensorflow)
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    model = tf.keras.models.load_model(model_path, compile=False)
    features = int(model.input_shape[-1])
    predict = tf.function(model, input_signature=[tf.TensorSpec([None, features], tf.float32)])
    predict(tf.zeros([1, features]))
    return (lambda rows: predict(tf.constant(rows)).numpy()), features


def _stop_signals() -> tuple[threading.Event, threading.Event]:
    """``(stop, orphaned)``: stop is set by SIGTERM, SIGINT or the parent's death, orphaned by the last.

    The child's stdin is a pipe from the parent: EOF means the parent exited, however it died.
    """
    stop, orphaned = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def parent_gone():
        try:
            while os.read(0, 4096):  # the raw descriptor: no lock for the interpreter's shutdown to wait on
                pass
            orphaned.set()
        finally:
            stop.set()

    threading.Thread(target=parent_gone, daemon=True).start()
    return stop, orphaned


def _serve_triton(model_path: str, delays_ms: list[float], max_batch: int, ports: tuple[int, int, int],
                  workspace: str, threads: int | None) -> None:
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    predict, features = _load_traced(model_path, threads)

    @batch
    def infer_func(x):
        return {"y": predict(x)}

    stop, orphaned = _stop_signals()
    http, grpc, metrics = ports
    config = TritonConfig(http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1", grpc_port=grpc,
                          metrics_port=metrics, exit_timeout_secs=10, log_verbose=0)
    security = TritonSecurityConfig(restricted_endpoints=["shared-memory", "model-repository", "trace", "logging"])
    inputs = [Tensor(name="x", dtype=np.float32, shape=(features,))]
    outputs = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
    with Triton(config=config, workspace=workspace, security_config=security) as triton:
        triton.bind(model_name=NO_BATCHING, infer_func=infer_func, inputs=inputs, outputs=outputs,
                    config=ModelConfig(max_batch_size=1))
        for delay in delays_ms:
            batcher = DynamicBatcher(max_queue_delay_microseconds=int(round(delay * 1000)))
            triton.bind(model_name=model_name(delay), infer_func=infer_func, inputs=inputs, outputs=outputs,
                        config=ModelConfig(max_batch_size=max_batch, batcher=batcher))
        triton.run()
        print("serving", flush=True)
        while not stop.wait(0.5):
            pass
        print("stopping", flush=True)
    for block in Path("/dev/shm").glob(f"pytrtion{os.getpid()}-*"):  # what pytriton may leave behind
        block.unlink(missing_ok=True)
    if orphaned.is_set():  # nobody is left to remove the server's folder
        shutil.rmtree(Path(workspace).parent, ignore_errors=True)


class _RayModels:
    """Ray Serve's replica: the model, one ``@serve.batch`` queue per model name, and Triton's routes.

    One batch runs at a time, as with Triton's one model instance: requests that arrive while it
    computes wait for the next. The compute time is recorded per batch size in the shape of
    Triton's statistics.
    """

    def __init__(self, model_path: str, delays_ms: list[float], max_batch: int, threads: int | None):
        from ray import serve

        self.predict, self.features = _load_traced(model_path, threads)
        self.counts = {}
        self.handlers = {NO_BATCHING: self._batcher(NO_BATCHING, serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0))}
        for delay in delays_ms:
            rows = serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=delay / 1e3,
                               batch_size_fn=lambda items: sum(len(item) for item in items))
            self.handlers[model_name(delay)] = self._batcher(model_name(delay), rows)

    def _batcher(self, name: str, decorator):
        counts = self.counts[name] = {"executions": 0, "requests": 0, "by_size": {}}

        async def run(items: list) -> list:
            rows = np.concatenate(items)
            begin = time.perf_counter_ns()
            out = self.predict(rows)  # on the replica's event loop: requests arriving meanwhile queue up
            spent = time.perf_counter_ns() - begin
            count, ns = counts["by_size"].get(len(rows), (0, 0))
            counts["by_size"][len(rows)] = (count + 1, ns + spent)
            counts["executions"] += 1
            counts["requests"] += len(rows)
            return list(np.split(out, np.cumsum([len(item) for item in items])[:-1]))

        return decorator(run)

    def _stats(self, name: str) -> dict:
        counts = self.counts[name]
        zero = {"count": 0, "ns": 0}
        return {"model_stats": [{
            "name": name, "execution_count": counts["executions"], "inference_count": counts["requests"],
            "batch_stats": [{"batch_size": size, "compute_infer": {"count": count, "ns": ns},
                             "compute_input": zero, "compute_output": zero}
                            for size, (count, ns) in sorted(counts["by_size"].items())]}]}

    async def __call__(self, request):
        from starlette.responses import JSONResponse, PlainTextResponse

        *_, name, action = request.url.path.rstrip("/").split("/")
        if name not in self.handlers or action not in ("ready", "stats", "infer"):
            return PlainTextResponse(f"no model {name!r} or no route {action!r}", status_code=404)
        if action == "ready":
            return PlainTextResponse("ready")
        if action == "stats":
            return JSONResponse(self._stats(name))
        body = await request.body()
        split = int(request.headers.get("inference-header-content-length", len(body)))
        shape = json.loads(body[:split])["inputs"][0]["shape"]
        rows = np.frombuffer(body[split:], dtype=np.float32).reshape(shape)
        out = await self.handlers[name](rows)
        return JSONResponse({"outputs": [{"name": "y", "datatype": "FP32", "shape": list(out.shape),
                                          "data": out.ravel().tolist()}]})


def _serve_ray(model_path: str, delays_ms: list[float], max_batch: int, http_port: int,
               workspace: str, threads: int | None) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report sent from a course's notebook
    # Ray's workers import this module: give them the course on their path, wherever it was imported from.
    course = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([course] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    if not Path(model_path).exists():  # before Ray starts, rather than in a replica it would retry
        raise FileNotFoundError(f"no saved model at {model_path}")
    import ray
    from ray import serve

    stop, orphaned = _stop_signals()
    Path(workspace).mkdir(parents=True, exist_ok=True)
    # A small object store (Ray's default takes 30% of the memory in /dev/shm; requests here are bytes).
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, _temp_dir=str(Path(workspace) / "ray"),
             object_store_memory=100 * 2 ** 20, logging_level="WARNING", configure_logging=True)
    try:
        quiet = {"log_level": "WARNING", "enable_access_log": False}  # no log line per request
        serve.start(http_options={"host": "127.0.0.1", "port": http_port}, logging_config=quiet)
        deployment = serve.deployment(_RayModels, name="models", ray_actor_options={"num_cpus": 0},
                                      max_ongoing_requests=100_000, logging_config=quiet)
        serve.run(deployment.bind(model_path, delays_ms, max_batch, threads), name="models",
                  route_prefix="/v2/models", blocking=False)
        print("serving", flush=True)
        while not stop.wait(0.5):
            pass
        print("stopping", flush=True)
        serve.shutdown()
    finally:
        ray.shutdown()
    if orphaned.is_set():  # nobody is left to remove the server's folder
        shutil.rmtree(Path(workspace).parent, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.serving")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a saved Keras model with Triton or Ray Serve (the notebook starts this)")
    serve.add_argument("--backend", choices=BACKENDS, required=True)
    serve.add_argument("--model", required=True)
    serve.add_argument("--delays-ms", default="0")
    serve.add_argument("--max-batch", type=int, default=64)
    serve.add_argument("--http-port", type=int, required=True)
    serve.add_argument("--grpc-port", type=int, required=True)
    serve.add_argument("--metrics-port", type=int, required=True)
    serve.add_argument("--workspace", required=True)
    serve.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    delays = [float(d) for d in args.delays_ms.split(",") if d.strip()]
    if args.backend == "triton":
        _serve_triton(args.model, delays, args.max_batch, (args.http_port, args.grpc_port, args.metrics_port),
                      args.workspace, args.threads)
    else:
        _serve_ray(args.model, delays, args.max_batch, args.http_port, args.workspace, args.threads)
    return 0


# --------------------------------------------------------------------------------------------
# A batcher of one's own: the notebook's exercise runs in threads, on a queue, with futures
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Section 3: tensor-core shapes and float16 (the parts a CPU can check)
# --------------------------------------------------------------------------------------------


def tensor_core_sizes(sizes: Sequence[int], multiple: int = 8) -> list[tuple[int, bool]]:
    """Each size and its neighbour one smaller, tagged with whether it is a multiple of ``multiple``.

    Tensor cores take float16 matrices whose dimensions are multiples of 8; ``tensor_core_sizes([1024])``
    gives ``[(1024, True), (1023, False)]``, the pair whose speeds section 3 compares.
    """
    out = []
    for n in sizes:
        if n % multiple:
            raise ValueError(f"{n} is not a multiple of {multiple}: give the aligned size")
        out += [(n, True), (n - 1, (n - 1) % multiple == 0)]
    return out


def loss_scaled(optimizer):
    """``optimizer`` wrapped for float16 training: the loss is scaled up before the gradients (so that
    small ones do not underflow to zero in float16), and the gradients scaled back before the update;
    the scale adapts (halved on an overflow, doubled after 2000 good steps)."""
    import tensorflow as tf

    return tf.keras.mixed_precision.LossScaleOptimizer(optimizer, dynamic=True)


if __name__ == "__main__":
    sys.exit(main())
