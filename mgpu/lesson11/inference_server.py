"""Notebook 11's inference server: it starts and stops from a notebook without leaving a process.

:class:`InferenceServer` serves a saved Keras model under one name per batching delay, in a child
process, with one of two real servers that batch requests dynamically (:func:`pick_backend`):
NVIDIA Triton through the ``nvidia-pytriton`` package (its dynamic batcher's maximum queue
delay), or, where Triton cannot run (``nvidia-pytriton`` 0.7.0 needs NumPy 1, so not on the
current stack or Colab), Ray Serve's ``@serve.batch`` (its ``batch_wait_timeout_s``). Both speak
the same HTTP protocol (KServe v2: ``/v2/models/<name>/infer``, ``ready`` and ``stats``), so the
load generator (:mod:`mgpu.lesson11.loadgen`) does not care which one runs. The child has its own
process group; stopping it (always, from ``__exit__``, ``atexit`` or the child noticing that its
parent died) ends the child and everything it started (Triton and its Python-backend stubs, or
Ray's daemons and actors), and :meth:`InferenceServer.pids` lets a test check that none is left.
:func:`batches_between`, :func:`busy_seconds` and :func:`compute_seconds_by_batch` read the
server's statistics.

The child process is :mod:`mgpu.lesson11.server_process`.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from mgpu.runtime import launch


NO_BATCHING = "no_batching"


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
        command = [sys.executable, "-m", "mgpu.lesson11.server_process", "serve", "--backend", backend, "--model", str(self.model_path),
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
                                         start_new_session=True, env=env, cwd=str(Path(__file__).resolve().parents[2]))
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
