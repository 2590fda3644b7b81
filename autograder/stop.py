"""Stopping runs: nothing of a run survives it, nor a grader that was killed.

:func:`kill_run` kills a run's session (its first process takes the run's PID namespace with it),
every process carrying the run's marker (:data:`autograder.isolation.GRADE_MARKER`, inherited by the
kernel, horovodrun and the workers whatever session they start), every task in its cgroups, then
any child left. :func:`cleanup_stale_runs` kills what a grader that was itself killed left in its
cgroups; :func:`processes_of_runs` lists every process of any graded run still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess

import psutil

from autograder.cgroups import CGROUP_PREFIX, CONTROLLERS, RunCgroups, empty_and_remove, own_cgroup_dir
from autograder.isolation import GRADE_MARKER
from autograder.watch import process_tree
from mgpu.runtime.launch import kill_processes


def cleanup_stale_runs() -> int:
    """Kill the tasks of runs whose grader is dead (it was killed), and remove their cgroups.

    Returns how many tasks were killed. A running grader's cgroups (its pid is in their names) are
    left alone.
    """
    killed = 0
    for controller in CONTROLLERS:
        parent = own_cgroup_dir(controller)
        if parent is None:
            continue
        for folder in parent.glob(f"{CGROUP_PREFIX}*"):
            owner = folder.name[len(CGROUP_PREFIX):].split("-", 1)[0]
            if owner.isdigit() and psutil.pid_exists(int(owner)) and int(owner) != os.getpid():
                continue
            killed += empty_and_remove(folder)
    return killed


def processes_of_runs() -> list[int]:
    """Pids of every process of any graded run still alive (each carries :data:`GRADE_MARKER`)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if GRADE_MARKER in proc.environ():
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(GRADE_MARKER) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def kill_run(popen: subprocess.Popen, marker: str, cgroups: RunCgroups | None = None) -> None:
    """Kill the run's session, every process with its marker, its cgroups' tasks, and whatever
    descendants remain."""
    # The run's process group holds unshare and the first process of the run's PID namespace:
    # killing that one makes the kernel kill every process in the namespace at once, which is the
    # only way to stop a fork bomb (killing its processes one by one frees slots it refills).
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroups is not None:
        cgroups.remove()
    leftovers = process_tree(psutil.Process(popen.pid)) if popen.poll() is None else []
    for _ in range(3):
        procs = [p for p in {*_marked(marker), *leftovers} if p.is_running()]
        leftovers = []
        if not procs:
            break
        kill_processes(procs, grace=1.0)
    if cgroups is not None:
        cgroups.remove()
    try:
        popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()

