"""The run's cgroups (v1 ``pids``, ``memory``, ``cpu``, ``cpuacct``), where the OS allows them.

:class:`RunCgroups` gives one run a cap on its number of tasks (a fork bomb stops there), a hard
memory cap (a memory bomb faster than the watchdog is stopped by the kernel), one CPU weight for the
whole run (the grader stays responsive), and the CPU time of every task it ever had (who trained:
:func:`autograder.grade.cpu_split`). The watchdog (:mod:`autograder.sandbox`) reads them; killing
what is left in them is :mod:`autograder.stop`'s.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

#: Most tasks (processes + threads) one run may have. A 4-worker run of the reference peaked at
#: a few hundred on 2 cores (RunResult.tasks_peak); TensorFlow's thread pools grow with the cores.
PIDS_MAX = max(2048, 64 * (os.cpu_count() or 1))
#: The kernel's hard memory cap is the watchdog's limit times this (the watchdog, which sums
#: resident memory per process, normally fires first and gives the clearer reason).
CGROUP_MEMORY_FACTOR = 1.25
CGROUP_V1 = Path("/sys/fs/cgroup")
#: pids: the task cap; memory: the hard memory cap; cpu: a group of its own, so however many
#: processes a run starts they share one CPU weight and the grader's watchdog keeps its share;
#: cpuacct: the CPU time of every task the run ever had, exited ones included (who trained: see
#: :func:`autograder.grade.cpu_split`). Where cpu and cpuacct are mounted together, one folder.
CONTROLLERS = ("pids", "memory", "cpu", "cpuacct")
CGROUP_PREFIX = "mgpu-grade-"


def own_cgroup_dir(controller: str) -> Path | None:
    """This process's cgroup v1 folder for ``controller``, if it is mounted and writable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            folder = CGROUP_V1 / controller / path.lstrip("/")
            return folder if folder.is_dir() and os.access(folder, os.W_OK) else None
    return None


def _tasks(folder: Path) -> list[int]:
    try:
        return [int(x) for x in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def empty_and_remove(folder: Path) -> int:
    """SIGKILL every task in a cgroup until none is left, then remove it; returns the kills."""
    killed = 0
    for _ in range(100):
        pids = _tasks(folder)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    for _ in range(50):
        try:
            folder.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:  # the last tasks are still exiting
            time.sleep(0.1)
    return killed


class RunCgroups:
    """The run's own ``pids`` and ``memory`` cgroups (v1), or nothing when the OS does not allow it."""

    def __init__(self, name: str, memory_limit_mb: float, pids_max: int = PIDS_MAX):
        self.folders: dict[str, Path] = {}
        self.note = ""
        for controller in CONTROLLERS:
            parent = own_cgroup_dir(controller)
            if parent is None:
                if controller != "cpu":
                    self.note = f"no writable cgroup v1 {controller} controller: no kernel cap on tasks/memory"
                continue
            folder = parent / f"{CGROUP_PREFIX}{os.getpid()}-{name}"  # the grader's pid: see cleanup
            same = [f for f in self.folders.values() if f.resolve() == folder.resolve()]
            if same:  # controllers mounted together (cpu,cpuacct): the folder made already
                self.folders[controller] = same[0]
                continue
            try:
                folder.mkdir()
                if controller == "pids":
                    (folder / "pids.max").write_text(str(pids_max))
                elif controller == "memory":
                    limit = str(int(memory_limit_mb * CGROUP_MEMORY_FACTOR * 2**20))
                    (folder / "memory.limit_in_bytes").write_text(limit)
                    if (folder / "memory.memsw.limit_in_bytes").exists():
                        try:
                            (folder / "memory.memsw.limit_in_bytes").write_text(limit)
                        except OSError:
                            pass
            except OSError as error:
                self.note = f"cgroup {controller} not usable ({error.strerror}): no kernel cap"
                if folder.is_dir():
                    empty_and_remove(folder)
                continue
            self.folders[controller] = folder

    def join_files(self) -> list[str]:
        return [str(f / "cgroup.procs") for f in dict.fromkeys(self.folders.values())]

    def _read(self, controller: str, name: str) -> str:
        try:
            return (self.folders[controller] / name).read_text()
        except (KeyError, OSError):
            return ""

    def resident_mb(self) -> float | None:
        """Anonymous memory of every task in the run (each page once), or None without the cgroup."""
        for line in self._read("memory", "memory.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "total_rss" and value.strip().isdigit():
                return int(value) / 2**20
        return None

    def peak_mb(self) -> float:
        """The most memory the run's cgroup held (page cache included), 0 without the cgroup."""
        text = self._read("memory", "memory.max_usage_in_bytes").strip()
        return int(text) / 2**20 if text.isdigit() else 0.0

    def cpu_s(self) -> float | None:
        """CPU seconds used by every task the run had so far (exited ones too), None without cpuacct."""
        text = self._read("cpuacct", "cpuacct.usage").strip()
        return int(text) / 1e9 if text.isdigit() else None

    def tasks_peak(self) -> int:
        text = self._read("pids", "pids.peak").strip()
        return int(text) if text.isdigit() else 0

    def hit_pids_limit(self) -> bool:
        for line in self._read("pids", "pids.events").splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and value.strip().isdigit() and int(value) > 0:
                return True
        return False

    def oom_killed(self) -> bool:
        for line in self._read("memory", "memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        return False

    def remove(self) -> int:
        return sum(empty_and_remove(folder) for folder in dict.fromkeys(self.folders.values()))


