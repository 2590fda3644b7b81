"""The sandbox's launch service: it, not the student's kernel, starts a graded run's Horovod workers.

Inside a graded run the notebook's kernel runs as one unprivileged user (``RUN_UID``). Whatever that
kernel starts runs as the same user, so a process it started could not be told apart from a
worker, and could write a worker's facts file. This service closes that: it runs as root inside
the run's namespaces (started by the sandbox's isolation script, before root is dropped), and the
course launcher (:mod:`mgpu.runtime.launch`), seeing ``MGPU_LAUNCH_SPOOL`` in its environment, asks it to
start ``horovodrun`` instead of starting it itself. The service starts it as a second unprivileged
user (``WORKER_UID``) that the kernel cannot become, signal, trace or write the files of. Only
processes of that user count as Horovod workers for the grader, and only files that user owns
count as facts or weights.

The protocol, in the spool folder (a folder of the run's private ``/tmp``):

- the launcher makes a job folder ``SPOOL/<name>/`` (mode 1777) holding ``job.pkl`` and
  ``request.json`` = ``{"workers": N, "start_timeout": S, "threads": T, "cwd": DIR}``;
- the service starts ``horovodrun -np N ... python -m mgpu.runtime._worker JOB`` as ``WORKER_UID`` in
  ``DIR``, its output going to ``JOB/log``; the workers leave their status files in ``JOB``;
- a file ``JOB/cancel`` (made by the launcher) stops the job; when it ends the service kills
  every process left with the job's marker and writes ``JOB/exit.json`` = ``{"returncode": R}``.

Everything in the spool is hostile data: the service reads only ``request.json`` (a regular file
the kernel's user owns, at most 4 kB, opened without following links, relative to folder
descriptors opened the same way), writes only ``log`` and ``exit.json`` (created, never
overwritten, through the same descriptors), and passes paths only to the unprivileged workers.
It imports nothing but the standard library and runs with ``python -I``.

    python -I autograder/launch_service.py SPOOL KERNEL_UID WORKER_UID
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

POLL_SECONDS = 0.1
MAX_REQUEST_BYTES = 4096
MAX_WORKERS = 64
#: The variable that marks every process of one job (as :data:`mgpu.runtime.launch.LAUNCH_MARKER`).
LAUNCH_MARKER = "MGPU_LAUNCH_ID"
JOB_NAME = re.compile(r"^mgpu-launch-[A-Za-z0-9_]{1,64}$")
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _read_request(spool_fd: int, name: str, kernel_uid: int) -> tuple[int, dict] | None:
    """(job folder descriptor, request) for a complete request by the kernel's user, else None."""
    try:
        job_fd = os.open(name, DIR_FLAGS, dir_fd=spool_fd)
    except OSError:
        return None
    try:
        fd = os.open("request.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=job_fd)
    except OSError:
        os.close(job_fd)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != kernel_uid or info.st_size > MAX_REQUEST_BYTES:
            raise ValueError("not a request")
        request = json.loads(os.read(fd, MAX_REQUEST_BYTES + 1))
        if not isinstance(request, dict):
            raise ValueError("not a request")
        return job_fd, request
    except (OSError, ValueError):
        os.close(job_fd)
        return None
    finally:
        os.close(fd)


def _number(request: dict, key: str, low: int, high: int, default: int) -> int:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} must be a whole number from {low} to {high}")
    return value


def _create(job_fd: int, name: str) -> int:
    """A new file in the job folder, never one that exists or a link."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=job_fd)


def _write_exit(job_fd: int, returncode: int, message: str = "") -> None:
    try:
        fd = _create(job_fd, "exit.json.tmp")
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        json.dump({"returncode": returncode, "message": message}, f)
    try:
        os.rename("exit.json.tmp", "exit.json", src_dir_fd=job_fd, dst_dir_fd=job_fd)
    except OSError:
        pass


def _marked(job_id: str) -> list[int]:
    """Pids (in this PID namespace) of every process carrying the job's marker."""
    found = []
    needle = f"{LAUNCH_MARKER}={job_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _kill_job(popen: subprocess.Popen, job_id: str) -> None:
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(3):  # horovodrun starts each worker in a session of its own
        pids = _marked(job_id)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    try:
        popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Job:
    def __init__(self, name: str, job_fd: int, request: dict, spool: str, worker_uid: int):
        self.name, self.fd = name, job_fd
        workers = _number(request, "workers", 1, MAX_WORKERS, 1)
        start_timeout = _number(request, "start_timeout", 1, 3600, 180)
        threads = _number(request, "threads", 1, 1024, 1)
        cwd = request.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
            raise ValueError("cwd must be an absolute path")
        job_dir = os.path.join(spool, name)
        python = sys.executable
        horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
        env = {k: v for k, v in os.environ.items() if k not in ("MGPU_LAUNCH_SPOOL",)}
        env.update({LAUNCH_MARKER: name, "MGPU_THREADS_PER_WORKER": str(threads),
                    "HOROVOD_GLOO_TIMEOUT_SECONDS": str(start_timeout), "HOME": "/tmp/mgpu-worker-home"})
        # The workers' user makes its home and enters the kernel's folder itself (as that user).
        command = ["setpriv", f"--reuid={worker_uid}", f"--regid={worker_uid}", "--clear-groups",
                   "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
                   "sh", "-c", 'mkdir -p "$HOME" && cd -- "$0" && exec "$@"', cwd,
                   python, horovodrun, "-np", str(workers), "-H", f"localhost:{workers}", "--gloo",
                   "--start-timeout", str(start_timeout), python, "-m", "mgpu.runtime._worker", job_dir]
        log = _create(job_fd, "log")
        try:
            self.popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, cwd="/", start_new_session=True)
        finally:
            os.close(log)

    def cancelled(self) -> bool:
        try:
            os.stat("cancel", dir_fd=self.fd, follow_symlinks=False)
            return True
        except OSError:
            return False

    def finish(self) -> None:
        returncode = self.popen.poll()
        _kill_job(self.popen, self.name)
        _write_exit(self.fd, returncode if returncode is not None else -signal.SIGKILL,
                    "" if returncode is not None else "cancelled")
        os.close(self.fd)


def serve(spool: str, kernel_uid: int, worker_uid: int) -> None:
    os.makedirs(spool, exist_ok=True)
    os.chown(spool, kernel_uid, kernel_uid)
    os.chmod(spool, 0o755)
    spool_fd = os.open(spool, DIR_FLAGS)
    jobs: dict[str, Job] = {}
    seen: set[str] = set()
    while True:
        for name in os.listdir(spool_fd):
            if name in seen or not JOB_NAME.match(name):
                continue
            found = _read_request(spool_fd, name, kernel_uid)
            if found is None:
                continue  # not complete yet, or not a request
            seen.add(name)
            job_fd, request = found
            try:
                jobs[name] = Job(name, job_fd, request, spool, worker_uid)
            except (OSError, ValueError) as error:
                _write_exit(job_fd, 2, f"launch refused: {error}"[:300])
                os.close(job_fd)
        for name, job in list(jobs.items()):
            if job.popen.poll() is not None or job.cancelled():
                job.finish()
                del jobs[name]
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
