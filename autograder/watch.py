"""Watching a run from outside: its processes, its Horovod workers and launches, and the CPU trail.

The grader counts as Horovod workers only processes of :data:`autograder.isolation.WORKER_UID` with
``HOROVOD_RANK`` and ``HOROVOD_SIZE`` in their environment (:func:`spot_workers`, in a thread of its
own: reading a process's environment waits on a fork bomb), and the ``-np`` of every ``horovodrun``
the launch service started. :class:`CpuTrail` samples the run's and each worker's CPU time every
:data:`SAMPLE_SECONDS`, so that each epoch file's CPU marks (:func:`note_training_cpu`) are taken at
the moment it was written, however late the watchdog's poll. The watchdog itself, with the limits,
is :class:`autograder.sandbox._NotebookRun`.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

POLL_SECONDS = 0.25
SAMPLE_SECONDS = 0.1  # the CPU trail's interval (CpuTrail)


def process_tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def rss_mb(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**20


def namespace_pid(pid: int) -> int:
    """The pid of host process ``pid`` inside its innermost PID namespace."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


class _Unreadable(Exception):
    """A process whose user or environment could not be read this time (it may be exec-ing)."""


def _horovod_worker(proc: psutil.Process, worker_uid: int | None) -> dict | None:
    """``{"rank", "size", "host_pid"}`` when ``proc`` is a Horovod worker the launch service started.

    With the launch service (``worker_uid``), only processes of the workers' user count: the
    kernel can start processes with Horovod's variables, but not as that user. Raises
    :class:`_Unreadable` when the process could not be read (look again at the next poll).
    """
    try:
        if worker_uid is not None and proc.uids().real != worker_uid:
            return None
        env = proc.environ()
    except psutil.NoSuchProcess:
        return None  # it has ended (a zombie, too): nothing more to see
    except (psutil.AccessDenied, OSError) as error:
        raise _Unreadable(str(error)) from None
    if "HOROVOD_RANK" not in env:
        return None
    try:
        return {"rank": int(env["HOROVOD_RANK"]), "size": int(env.get("HOROVOD_SIZE", "0")), "host_pid": proc.pid}
    except ValueError:
        return None


def _horovodrun_launch(proc: psutil.Process, worker_uid: int | None) -> int | None:
    """The number of workers a ``horovodrun`` the launch service started was asked for (``-np``).

    Only a process of the workers' user whose parent is root (the launch service) counts: the
    service wrote that command line, and no process of the run can make itself root's child.
    """
    try:
        if worker_uid is None or proc.uids().real != worker_uid or proc.parent() is None \
                or proc.parent().uids().real != 0:
            return None
        argv = proc.cmdline()
        if not any(os.path.basename(a) == "horovodrun" for a in argv[:2]) or "-np" not in argv:
            return None
        return int(argv[argv.index("-np") + 1])
    except (psutil.Error, OSError, ValueError, IndexError):
        return None


def _cpu_sample(workers: dict[int, dict], cgroups: "RunCgroups") -> tuple[float, float | None, dict[int, float]]:
    """(wall time, the run's CPU seconds from its cgroup, each known worker's CPU seconds), now."""
    per = {}
    for pid, worker in list(workers.items()):
        try:
            times = psutil.Process(worker["host_pid"]).cpu_times()
            worker["cpu_s"] = max(worker.get("cpu_s", 0.0), times.user + times.system)
        except psutil.Error:
            pass  # it has ended: what it used when last seen alive
        per[pid] = worker.get("cpu_s", 0.0)
    return time.time(), cgroups.cpu_s(), per


def _cpu_at(before: tuple, after: tuple, written: float) -> tuple[float | None, dict[int, float]]:
    """The run's and each worker's CPU seconds at wall time ``written``, between two samples."""
    (t0, run0, per0), (t1, run1, per1) = before, after
    f = 1.0 if t1 <= t0 else min(max((written - t0) / (t1 - t0), 0.0), 1.0)

    def mix(a, b):
        return b if a is None or b is None else a + f * (b - a)
    return mix(run0, run1), {pid: mix(per0.get(pid, cpu), cpu) for pid, cpu in per1.items()}


class CpuTrail:
    """The run's and each worker's CPU, sampled every :data:`SAMPLE_SECONDS` by a thread of its own.

    An epoch file's CPU marks are interpolated between the two samples around the moment it was
    written, at most that far apart: however long the watchdog's poll is held back (a busy machine,
    a large epoch file to copy, a fork bomb's process tree to walk), the workers' training in the
    meantime is not counted as start-up. Samples no mark can need any more are dropped."""

    def __init__(self, workers: dict[int, dict], cgroups: "RunCgroups"):
        self._workers, self._cgroups = workers, cgroups
        self._samples: list[tuple] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:
            sample = _cpu_sample(self._workers, self._cgroups)
            with self._lock:
                self._samples.append(sample)
            if self._done.wait(SAMPLE_SECONDS):
                return

    def stop(self) -> None:
        """No more samples after one last one, taken now."""
        self._done.set()
        self._thread.join(timeout=10)
        sample = _cpu_sample(self._workers, self._cgroups)
        with self._lock:
            self._samples.append(sample)

    def at(self, written: float) -> tuple[float | None, dict[int, float]] | None:
        """The CPU at wall time ``written``; None until a sample at or after it is taken (or after
        :meth:`stop`, the last sample)."""
        with self._lock:
            if not self._samples:
                return None
            after = next((i for i, s in enumerate(self._samples) if s[0] >= written), None)
            if after is None:
                if not self._done.is_set():
                    return None
                after = len(self._samples) - 1
            return _cpu_at(self._samples[max(after - 1, 0)], self._samples[after], written)

    def forget_before(self, moment: float) -> None:
        """Drop the samples no mark at or after wall time ``moment`` can need."""
        with self._lock:
            keep = max((i for i, s in enumerate(self._samples) if s[0] <= moment), default=0)
            del self._samples[:keep]


def note_training_cpu(workers: dict[int, dict], run_cpu: dict, mark: tuple) -> None:
    """An epoch file, the latest so far, was written when the run and its workers had used ``mark``
    (see :meth:`CpuTrail.at`): the first such mark is kept, the latest replaces the one before.
    ``train_cpu_s`` is what a worker used between the first and the latest epoch file (training,
    without the start-up every worker pays, importing TensorFlow and loading data, however little
    it trains)."""
    run_at, per = mark
    run_cpu.setdefault("first_epoch", run_at)
    run_cpu["last_epoch"] = run_at
    for pid, worker in list(workers.items()):
        if pid not in per:
            continue
        worker.setdefault("cpu_at_first_epoch", per[pid])
        worker["cpu_at_last_epoch"] = per[pid]
        worker["train_cpu_s"] = per[pid] - worker["cpu_at_first_epoch"]


def spot_workers(root: psutil.Process, popen: subprocess.Popen, workers: dict[int, dict],
                 worker_uid: int | None, launched: list[int] | None = None) -> None:
    """Until the run ends: note every Horovod worker, by its pid in the run's namespace, and the
    number of workers each ``horovodrun`` of the launch service was started with (``launched``).

    A process is examined when first seen and again after each ``exec`` (its name changes): ``sh``
    and ``env`` start a worker and become it, however long that takes on a loaded machine. A pid
    seen again under another start time is a new process (the kernel reuses pids)."""
    examined: dict[int, tuple[float, str]] = {}  # pid -> (start time, name) when last examined
    while popen.poll() is None:
        for proc in process_tree(root):
            if popen.poll() is not None:
                break
            try:
                seen = (proc.create_time(), proc.name())
            except psutil.Error:
                continue
            if examined.get(proc.pid) == seen:
                continue
            try:
                worker = _horovod_worker(proc, worker_uid)
            except _Unreadable:
                continue  # not examined: read it again at the next poll
            examined[proc.pid] = seen
            asked = _horovodrun_launch(proc, worker_uid)
            if asked is not None and launched is not None:
                launched.append(asked)
            if worker is not None:
                workers[namespace_pid(proc.pid)] = worker
        time.sleep(POLL_SECONDS)  # each worker's CPU is sampled by the CPU trail (CpuTrail)
