"""Spotting Horovod workers from outside a run (autograder.watch.spot_workers), on real processes."""

import subprocess
import sys
import threading

import psutil

from autograder import watch


def _spot(command: list[str]) -> tuple[dict, subprocess.Popen]:
    popen = subprocess.Popen(command)
    workers: dict[int, dict] = {}
    spotter = threading.Thread(target=watch.spot_workers, args=(psutil.Process(popen.pid), popen, workers, None))
    spotter.start()
    popen.wait(timeout=60)
    spotter.join(timeout=30)
    assert not spotter.is_alive()
    return workers, popen


def test_a_shell_that_becomes_a_worker_late_is_still_a_worker():
    # A shell that takes 3 s (a loaded machine) before it execs Python with Horovod's variables: it is
    # examined as `sh` first, and again once it is Python.
    python = f"exec env HOROVOD_RANK=1 HOROVOD_SIZE=2 {sys.executable} -c 'import time; time.sleep(1.5)'"
    workers, popen = _spot(["sh", "-c", f"sleep 3; {python}"])
    assert popen.returncode == 0
    assert [(w["rank"], w["size"], w["host_pid"]) for w in workers.values()] == [(1, 2, popen.pid)]


def test_a_process_without_horovods_variables_is_not_a_worker():
    workers, popen = _spot([sys.executable, "-c", "import subprocess, sys, time; "
                            "subprocess.run([sys.executable, '-c', 'import time; time.sleep(1)']); time.sleep(0.5)"])
    assert popen.returncode == 0 and workers == {}
