"""Run one submission's notebook in a subprocess the grader controls, and watch it with its own clock.

:func:`run_notebook` starts :mod:`autograder.execute` (papermill) in a new session, with:

- **network off and private folders** where the OS allows it: ``unshare --net --mount`` gives the
  run a network namespace with only loopback (Horovod's Gloo and the kernel's ZeroMQ need it) and
  a mount namespace in which the course folder (gradebook, source, other submissions), the data
  cache and every other submission's work folder are covered by empty read-only tmpfs mounts.
  :func:`isolation_available` probes this once; without it the run goes ahead with a logged note;
- **a wall-clock time-out** on the grader's clock and **a memory limit** on the resident memory of
  the whole process tree (a psutil watchdog: TensorFlow reserves far more virtual memory than it
  uses, so an address-space rlimit would kill healthy runs);
- **no survivors**: the session is killed, then every process carrying the run's marker variable
  (:data:`GRADE_MARKER`, inherited by the kernel, horovodrun and the workers whatever session
  they start), then any child left.

While the notebook runs, the watchdog also records when each ``epoch_XXX.npz`` first appears in
the output folder, in seconds since the run started: the time axis of the grader's measurements.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import psutil

from mgpu import assessment
from mgpu.launch import kill_processes

#: Environment variable marking every process of one graded run (the launcher uses its own).
GRADE_MARKER = "MGPU_GRADE_ID"
REPO_ROOT = Path(__file__).resolve().parents[1]
POLL_SECONDS = 0.25

# Runs inside the new namespaces: loopback up, hide folders, keep this run's work folder visible.
# $1: this run's work folder, $2: the folder holding every run's work folder, then "--", then
# folders to hide, then "--", then the command.
_ISOLATE = r'''
set -e
ip link set lo up
work="$1"; parent="$2"; shift 2; shift
keep=$(mktemp -d /dev/shm/mgpu-keep.XXXXXX 2>/dev/null || mktemp -d)
mount --bind "$work" "$keep"
while [ "$1" != "--" ]; do mount -t tmpfs -o size=64k,mode=0555 tmpfs "$1"; shift; done
shift
mount -t tmpfs -o mode=0755 tmpfs "$parent"
mkdir -p "$work"
mount --bind "$keep" "$work"
umount "$keep"
rmdir "$keep"
exec "$@"
'''


@lru_cache(maxsize=1)
def isolation_available() -> tuple[bool, str]:
    """(True, '') when ``unshare --net --mount`` works here, else (False, why)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False, "unshare or ip not installed: the notebook runs with the network on and folders visible"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
         "ip link set lo up && mount -t tmpfs tmpfs /mnt && echo ok"],
        capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or "ok" not in probe.stdout:
        why = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        return False, f"unshare --net --mount refused ({why}): the notebook runs with the network on"
    return True, ""


@dataclass
class RunResult:
    """What happened to one notebook run, on the grader's clock."""

    status: str                 # ok, cell_error, kernel_died, error, timeout, memory
    reason: str                 # one line a student can act on ('' when ok)
    seconds: float              # from starting the child to its end (or kill)
    notebook: str | None        # the executed notebook (JSON) as papermill left it, via the pipe
    epoch_seen_s: dict[int, float] = field(default_factory=dict)  # epoch -> first seen (s)
    peak_memory_mb: float = 0.0
    isolation: str = ""         # '' when isolated, else the note saying why not


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _rss_mb(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**20


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(GRADE_MARKER) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def kill_run(popen: subprocess.Popen, marker: str) -> None:
    """Kill the run's session, every process with its marker, and whatever descendants remain."""
    leftovers = _tree(psutil.Process(popen.pid)) if popen.poll() is None else []
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(3):
        procs = [p for p in {*_marked(marker), *leftovers} if p.is_running()]
        leftovers = []
        if not procs:
            break
        kill_processes(procs, grace=1.0)
    try:
        popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def run_notebook(notebook: Path, parameters: dict, *, output_dir: Path, timeout_s: float,
                 memory_limit_mb: float, hide: list[Path] = (), work_parent: Path | None = None,
                 isolate: bool = True, env: dict[str, str] | None = None) -> RunResult:
    """Execute ``notebook`` (in its own folder) with papermill under the grader's limits."""
    notebook = Path(notebook).resolve()
    work = notebook.parent
    marker = uuid.uuid4().hex
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MGPU_", "JUPYTER"))}
    home = work / ".home"
    home.mkdir(exist_ok=True)
    child_env.update({
        GRADE_MARKER: marker,
        "PYTHONPATH": str(REPO_ROOT),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), child_env.get("PATH", "")]),
        "HOME": str(home),
        "MGPU_DATA_DIR": str(work / ".no-data-cache"),  # the course's cache (test split) is not theirs
        "MGPU_BUILD_DIR": str(work / "build"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONUNBUFFERED": "1",
    })
    child_env.update(env or {})
    read_end, write_end = os.pipe()
    command = [sys.executable, "-m", "autograder.execute", str(notebook), str(work / "executed.ipynb"),
               json.dumps(parameters), "--result-fd", str(write_end)]
    note = ""
    if isolate:
        ok, note = isolation_available()
        if ok:
            hidden = [str(Path(h).resolve()) for h in hide if Path(h).exists()]
            command = ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", _ISOLATE,
                       "isolate", str(work), str((work_parent or work.parent).resolve()), "--",
                       *hidden, "--", *command]
    else:
        note = "isolation switched off by the caller"

    chunks: list[bytes] = []

    def read_pipe():
        with os.fdopen(read_end, "rb") as pipe:
            for chunk in iter(lambda: pipe.read(1 << 16), b""):
                chunks.append(chunk)

    started = time.monotonic()
    popen = subprocess.Popen(command, cwd=work, env=child_env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, pass_fds=(write_end,))
    os.close(write_end)
    reader = threading.Thread(target=read_pipe, daemon=True)
    reader.start()

    seen: dict[int, float] = {}
    peak = 0.0
    status = ""
    reason = ""
    root = psutil.Process(popen.pid)
    try:
        while popen.poll() is None:
            now = time.monotonic() - started
            for epoch in assessment.epoch_files(output_dir):
                seen.setdefault(epoch, now)
            memory = _rss_mb(_tree(root))
            peak = max(peak, memory)
            if memory > memory_limit_mb:
                status, reason = "memory", (f"memory limit exceeded: {memory:.0f} MB > "
                                            f"{memory_limit_mb:.0f} MB, the run was killed")
                break
            if now > timeout_s:
                status, reason = "timeout", f"timed out after {timeout_s:.0f} s"
                break
            time.sleep(POLL_SECONDS)
    finally:
        end = time.monotonic() - started
        kill_run(popen, marker)
        reader.join(timeout=30)
    for epoch in assessment.epoch_files(output_dir):
        seen.setdefault(epoch, end)  # appeared between the last poll and the end

    result = None
    if chunks:
        try:
            result = json.loads(b"".join(chunks))
        except ValueError:
            result = None
    if not status:
        if result is None:
            status, reason = "kernel_died", "kernel died (out of memory?): the run ended without a result"
        else:
            status = result["status"]
            reason = {"ok": "",
                      "cell_error": result["message"] or "a cell raised an error",
                      "kernel_died": "kernel died (out of memory?)"}.get(status, result["message"])
            if status == "kernel_died" and result["message"]:
                reason += f": {result['message']}"
    return RunResult(status=status, reason=reason, seconds=end,
                     notebook=result.get("notebook") if result else None,
                     epoch_seen_s=dict(sorted(seen.items())), peak_memory_mb=peak, isolation=note)
