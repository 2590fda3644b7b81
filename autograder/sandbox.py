"""Run one submission's notebook in a subprocess the grader controls, and watch it with its own clock.

:func:`run_notebook` starts :mod:`autograder.execute` (papermill) in a new session, with:

- **network off and private folders** where the OS allows it: ``unshare --net --mount --pid``
  gives the run a network namespace with only loopback (Horovod's Gloo and the kernel's ZeroMQ
  need it), a mount namespace in which the course folder (gradebook, source, signing key, other
  submissions), the data cache and every other submission's work folder are covered by empty
  read-only tmpfs mounts, and a PID namespace of its own (with its own ``/proc``): when its first
  process ends, the kernel ends every process in it. :func:`isolation_available` probes this
  once; without it the run goes ahead with a logged note;
- **a system-call filter** (:mod:`autograder.syscall_filter`, seccomp compiled by libseccomp),
  loaded after the sandbox's own mounts and before anything of the run starts, so the kernel, the
  launch service, the workers and the clean test pass all run under it: no namespaces, mounts,
  ptrace, BPF, perf events, keyrings, ``userfaultfd``, ``kexec``, modules, personality changes or
  io_uring. :func:`filter_available` probes it once; without it the run goes ahead with a note;
- **cgroups** where the OS allows it (cgroup v1 ``pids``, ``memory``, ``cpu``): a cap on the number
  of tasks (a fork bomb stops there), a hard memory cap (a memory bomb faster than the watchdog
  is stopped by the kernel), and one CPU weight for the whole run (the grader stays responsive);
  :func:`cleanup_stale_runs` kills what a grader that was itself killed left in them;
- **limits named in the verdict**: time, memory, tasks, the output cap (:data:`MAX_RESULT_BYTES`),
  and a full disk or no inode left on the run's own file system, its ``/tmp`` or ``/dev/shm``
  (each one line with the cap);
- **a wall-clock time-out** on the grader's clock and **a memory limit** on the resident memory of
  the whole run, checked by a watchdog: the memory cgroup's anonymous memory (each page once), or
  without it the sum over the process tree (TensorFlow reserves far more virtual memory than it
  uses, so an address-space rlimit would kill healthy runs);
- **no survivors**: the session is killed, then every process carrying the run's marker variable
  (:data:`GRADE_MARKER`, inherited by the kernel, horovodrun and the workers whatever session
  they start), then every task in the run's cgroups, then any child left. If the grader itself
  dies, ``setpriv --pdeathsig`` and ``unshare --kill-child`` take the run's PID namespace with it.

Each run has **its own small file system** (:class:`RunFolder`: a tmpfs with a size and an inode
quota, so a run that fills its disk fails alone) laid out as ``nb/`` (the notebook, the kernel's
working folder, its home), ``data/`` (read-only) and ``output/`` (writable only by the workers), a
private ``/tmp`` and ``/dev/shm``, and an **allow-listed environment** (:func:`run_environment`:
nothing of the grader's own environment, no instructor's tokens).

The kernel runs as ``RUN_UID``; the Horovod workers are started by the sandbox's launch service
(:mod:`autograder.launch_service`) as ``WORKER_UID``, a user the kernel cannot impersonate. The
grader counts as Horovod workers only processes of that user with ``HOROVOD_RANK`` and
``HOROVOD_SIZE`` in their environment, and takes facts and weights only from files that user owns.

While the notebook runs, the watchdog **copies each** ``epoch_XXX.npz`` **the moment it first sees
it** into a folder of the grader's (read without following links, regular files only, size
capped), with the time in seconds since the run started: an epoch is measured as it was when its
time was taken, and a later rewrite is reported and ignored.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import stat
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import psutil

from autograder import syscall_filter
from mgpu import assessment
from mgpu.runtime.launch import kill_processes

#: Environment variable marking every process of one graded run (the launcher uses its own).
GRADE_MARKER = "MGPU_GRADE_ID"
REPO_ROOT = Path(__file__).resolve().parents[1]
#: The Python a run starts, its folder's links resolved (a checkout under a linked home is seen in a
#: run only at its real path); the file itself is not resolved, so a virtual env stays one.
PYTHON = str(Path(sys.executable).parent.resolve() / Path(sys.executable).name)
#: What a call the system-call filter refuses returns (:mod:`autograder.syscall_filter`).
FILTER_ERRNO = errno.EPERM
POLL_SECONDS = 0.25
SAMPLE_SECONDS = 0.1  # the CPU trail's interval (CpuTrail)
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
#: :func:`autograder.grade.trained_elsewhere`). Where cpu and cpuacct are mounted together, one folder.
CONTROLLERS = ("pids", "memory", "cpu", "cpuacct")
CGROUP_PREFIX = "mgpu-grade-"

#: The unprivileged user the student's code runs as inside the namespaces (``MGPU_GRADE_UID``
#: overrides; ``-`` keeps root, for debugging only). Without root it cannot undo the mounts that
#: hide the course, nor read the signing key even if it could see it.
RUN_UID = os.environ.get("MGPU_GRADE_UID", "65534")
#: The user the launch service starts the Horovod workers as: the kernel (``RUN_UID``) cannot
#: become it, signal it, trace it or write its files.
WORKER_UID = os.environ.get("MGPU_GRADE_WORKER_UID", "65533")
#: The run's own file system (tmpfs): its size and how many files and folders it may hold. The
#: reference run uses a few MB and under a hundred inodes (data, notebook, ten epoch files, the
#: kernel's home); the caps leave room for honest runs and stop a run from filling the grader's disk.
RUN_DISK_MB, RUN_INODES = 512, 4096
#: The private /tmp and /dev/shm of a run (tmpfs, charged to the run's memory cgroup).
TMP_MB, TMP_INODES, SHM_MB = 512, 8192, 256
#: Where the launch service takes jobs (in the run's private /tmp).
LAUNCH_SPOOL = "/tmp/mgpu-launch"
#: Most bytes of the result pipe kept (the executed notebook: at most 5 MB in, plus outputs): the
#: output cap. A run whose executed notebook, with what its cells printed, is larger fails with
#: ``output limit exceeded``.
MAX_RESULT_BYTES = 64 * 2**20
#: A file system of the run counts as full below this many free bytes (or with no free inode).
FULL_BELOW_BYTES = 256 * 1024
#: Largest epoch file the watchdog copies (as mgpu.assessment.MAX_WEIGHTS_BYTES).
MAX_EPOCH_BYTES = assessment.MAX_WEIGHTS_BYTES
#: What the watchdog copies from one run at most: a run could otherwise save, wait for the copy,
#: delete and save again, and fill the grader's disk (or a cluster's shared folder, where a Slurm
#: node's runner keeps its copies) far beyond its own quota. The reference saves one file of
#: 0.4 MB per epoch (12 at most); 200 files and 64 MB (160 such files) are generous.
MAX_KEPT_EPOCHS = 200
MAX_KEPT_BYTES = 64 * 2**20
#: Variables of the grader's environment a run may see (their values are the grader's); every other
#: one is dropped.
PASSED_VARIABLES = ("LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
                    "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS")


def _closed_ancestor(path: Path) -> Path | None:
    """The highest folder above ``path`` that other users cannot enter (e.g. /root, mode 0700)."""
    for ancestor in reversed(Path(path).parents[:-1]):  # from the top down, / excluded
        try:
            if not ancestor.stat().st_mode & 0o001:
                return ancestor
        except OSError:
            return None
    return None


def isolation_script(work: Path, parent: Path, hidden: list[Path], needed: list[Path], uid: str,
                     launch_service: bool = False, syscall_filter: list[str] = ()) -> str:
    """The shell script run as root inside the new namespaces, then as ``uid`` (every path quoted).

    1. loopback up; this run's work folder bound aside;
    2. the host is seen through an allow-list: every top-level folder that is not the system's
       (:data:`SYSTEM_TOP_FOLDERS`: ``/home``, ``/root``, ``/work``, ``/srv``, ``/mnt`` ... where
       courses, submissions and other people's files live) is covered by a tmpfs into which only
       the paths the run needs (Python, the course library) are bound back; so is each closed
       folder elsewhere that holds one of them;
    3. the hidden folders are covered by empty read-only tmpfs mounts;
    4. the folder of every run's work folder is covered, and this run's bound back;
    5. a private ``/tmp`` and ``/dev/shm`` (tmpfs with size and inode caps);
    6. every other mount is made read-only (``/var/tmp``, ``/run/lock`` and any other place the
       host leaves writable to all): a run writes only to its own folder, ``/tmp`` and ``/dev/shm``;
    7. the system-call filter is loaded (``syscall_filter``, the command that loads it and runs the
       rest: :mod:`autograder.syscall_filter`), so the launch service, the workers and the kernel
       all run under it, and none of the calls steps 1-6 needed is left to them;
    8. with ``launch_service``, the launch service starts, as root, in the background;
    9. root is dropped (``setpriv``: new uid and gid, no groups, no capabilities, no new privileges).

    A needed path under ``/tmp`` (a checkout in ``/tmp``) is bound aside before the private ``/tmp``
    covers it, and bound back at its path.
    """
    q = shlex.quote
    lines = ["set -e", "ip link set lo up", "keep=$(mktemp -d /dev/shm/mgpu-keep.XXXXXX 2>/dev/null || mktemp -d)",
             f"mount --bind {q(str(work))} \"$keep\""]
    groups: dict[Path, list[Path]] = {top: [] for top in _private_top_folders()}
    in_tmp = [p for p in needed if Path(p).is_relative_to("/tmp") and Path(p) != Path(parent)
              and not Path(parent).is_relative_to(p)]
    in_tmp = [p for p in in_tmp if not any(p != o and Path(p).is_relative_to(o) for o in in_tmp)]  # outermost
    for index, path in enumerate(in_tmp):  # aside first: a closed folder above it may be covered below
        lines += [f"t{index}=$(mktemp {'-d ' if Path(path).is_dir() else ''}/dev/shm/mgpu-open.XXXXXX 2>/dev/null "
                  f"|| mktemp {'-d ' if Path(path).is_dir() else ''}/run/mgpu-open.XXXXXX)",
                  f"mount --bind {q(str(path))} \"$t{index}\""]
    for path in needed:
        if path in in_tmp:
            continue
        top = Path("/" + Path(path).parts[1]) if len(Path(path).parts) > 1 else None
        if top not in groups:
            top = _closed_ancestor(path)
        if top is not None:
            groups.setdefault(top, []).append(path)
    for number, (top, paths) in enumerate(sorted(groups.items())):
        for index, path in enumerate(paths):  # a file is bound onto a file, a folder onto a folder
            folder = Path(path).is_dir()
            lines += [f"k{number}_{index}=$(mktemp {'-d ' if folder else ''}/dev/shm/mgpu-open.XXXXXX 2>/dev/null "
                      f"|| mktemp {'-d' if folder else ''})",
                      f"mount --bind {q(str(path))} \"$k{number}_{index}\""]
        lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {q(str(top))}")
        for index, path in enumerate(paths):
            folder = Path(path).is_dir()
            make = f"mkdir -p {q(str(path))}" if folder else f"mkdir -p {q(str(Path(path).parent))} && touch {q(str(path))}"
            lines += [make, f"mount --bind \"$k{number}_{index}\" {q(str(path))}",
                      f"umount \"$k{number}_{index}\"", f"{'rmdir' if folder else 'rm'} \"$k{number}_{index}\""]
    # A private /tmp first: whatever the host keeps there (other runs, this grader's work folders)
    # is gone; the run's own folder is bound back below.
    lines.append(f"mount -t tmpfs -o size={TMP_MB}m,nr_inodes={TMP_INODES},mode=1777 tmpfs /tmp")
    for index, path in enumerate(in_tmp):
        folder = Path(path).is_dir()
        make = f"mkdir -p {q(str(path))}" if folder else f"mkdir -p {q(str(Path(path).parent))} && touch {q(str(path))}"
        lines += [make, f"mount --bind \"$t{index}\" {q(str(path))}", f"umount \"$t{index}\"",
                  f"{'rmdir' if folder else 'rm'} \"$t{index}\""]
    # (a hidden folder under a closed one, or under /tmp, is already out of sight)
    lines += [f"if [ -d {q(str(h))} ]; then mount -t tmpfs -o size=64k,mode=0555 tmpfs {q(str(h))}; fi"
              for h in hidden]
    lines += [f"mkdir -p {q(str(parent))}", f"mount -t tmpfs -o mode=0755 tmpfs {q(str(parent))}",
              f"mkdir -p {q(str(work))}", f"mount --bind \"$keep\" {q(str(work))}", "umount \"$keep\"",
              "rmdir \"$keep\"", f"mount -t tmpfs -o size={SHM_MB}m,nr_inodes={TMP_INODES},mode=1777 tmpfs /dev/shm"]
    # Read-only: every mount but the run's own folder, its /tmp and /dev/shm, and the kernel's
    # file systems. A mount that refuses is named on stderr (the run's log), never skipped silently.
    kept = [q(p) for p in ("/proc", "/sys", "/dev", "/dev/pts", "/dev/shm", "/tmp", str(work))]
    kept += [f"{q(p)}/*" for p in ("/proc", "/sys", "/dev/pts", str(work))]  # quoted folder, unquoted glob
    lines += ["awk '{print $5}' /proc/self/mountinfo | while read -r point; do",
              "  point=$(printf '%b' \"$point\")",
              "  [ -e \"$point\" ] || continue  # covered by a mount above: out of sight already",
              f"  case \"$point\" in {'|'.join(kept)}) continue;; esac",
              "  mount -o remount,bind,ro \"$point\" 2>/dev/null || echo \"sandbox: $point stays writable\" >&2",
              "done"]
    rest = ["set -e"]
    if launch_service and uid != "-":
        service = REPO_ROOT / "autograder" / "launch_service.py"
        rest.append(f"{q(PYTHON)} -I {q(str(service))} {LAUNCH_SPOOL} {q(uid)} {q(WORKER_UID)} "
                    "</dev/null >/dev/null 2>&1 &")
    if uid != "-":
        rest.append(f"exec setpriv --reuid={q(uid)} --regid={q(uid)} --clear-groups --no-new-privs "
                    "--bounding-set=-all --inh-caps=-all \"$@\"")
    rest.append("exec \"$@\"")
    rest = "\n".join(rest) + "\n"
    if syscall_filter:
        lines.append(f"exec {' '.join(q(a) for a in syscall_filter)} sh -c {q(rest)} isolate \"$@\"")
    else:
        lines.append(rest)
    return "\n".join(lines) + "\n"


#: Top-level folders of the system a run may see (read-only): programs, libraries, configuration.
#: Every other top-level folder (``/home``, ``/root``, ``/work``, ``/srv``, ``/mnt``, ``/media`` ...)
#: is covered, with only :func:`_needed_paths` bound back.
SYSTEM_TOP_FOLDERS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "nix", "opt",
                                "proc", "run", "sbin", "snap", "sys", "tmp", "usr", "var"})


def _private_top_folders() -> list[Path]:
    """The host's top-level folders that are not the system's (folders, not links)."""
    return sorted(p for p in Path("/").iterdir()
                  if p.name not in SYSTEM_TOP_FOLDERS and p.is_dir() and not p.is_symlink())


def _needed_paths() -> list[Path]:
    """What a run must be able to read: the Python installation, the virtual env, the course library
    (``mgpu/`` and the grader's own ``autograder/``, nothing else of the project)."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent,
             Path(PYTHON).parent, REPO_ROOT / "mgpu", REPO_ROOT / "autograder", REPO_ROOT / "pyproject.toml"}
    return sorted(p for p in paths if p.exists())


def _die_with(grader_pid: int):
    """For ``preexec_fn``: the child gets SIGKILL when the grader dies, even if it died already.

    ``setpriv --pdeathsig`` does the same for what it runs, but only once it has started; this
    closes the moment between the fork and that.
    """
    def arm() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != grader_pid:
            os._exit(1)

    return arm


def _chown(path: Path, uid: str) -> None:
    if uid != "-" and os.geteuid() == 0:
        os.chown(path, int(uid), int(uid), follow_symlinks=False)


class RunFolder:
    """One run's own small file system: ``nb/`` (the kernel's), ``data/`` (read-only), ``output/`` (the workers').

    As root, a tmpfs of :data:`RUN_DISK_MB` and :data:`RUN_INODES` is mounted on ``root`` in the
    grader's mount namespace (the run's namespace inherits it, and the grader reads it from
    outside); ``root`` itself is root's and read-only to the run, so the run can neither replace
    ``output/`` or ``data/`` nor fill the grader's disk. Without root it is a plain folder.
    """

    def __init__(self, root: Path, disk_mb: int = RUN_DISK_MB, inodes: int = RUN_INODES):
        self.root = Path(root)
        self.root.mkdir(parents=True)
        self.disk_mb, self.inodes = disk_mb, inodes
        self.mounted = False
        if os.geteuid() == 0 and shutil.which("mount"):
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m,nr_inodes={inodes},mode=0755",
                                   "mgpu-run", str(self.root)], capture_output=True)
            self.mounted = done.returncode == 0
        for folder, owner in ((self.nb, RUN_UID), (self.data, "-"), (self.output, WORKER_UID)):
            folder.mkdir()
            _chown(folder, owner)
        (self.nb / ".home").mkdir()
        _chown(self.nb / ".home", RUN_UID)

    nb = property(lambda self: self.root / "nb")
    data = property(lambda self: self.root / "data")
    output = property(lambda self: self.root / "output")

    def remove(self) -> None:
        """Unmount and delete (links inside are removed, never followed)."""
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def unmount_stale(folder: Path) -> None:
    """Unmount what a killed grader left mounted at or under ``folder`` (before deleting it)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = str(Path(folder).resolve())
    points = [line.split()[1] for line in mounts if len(line.split()) > 1]
    for point in sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def run_environment(nb: Path, marker: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a run: an allow-list, never the grader's own variables."""
    env = {k: os.environ[k] for k in PASSED_VARIABLES if k in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    env.update({
        GRADE_MARKER: marker,
        "PATH": os.pathsep.join([str(Path(PYTHON).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "PYTHONPATH": str(REPO_ROOT),
        "HOME": str(nb / ".home"),
        "TMPDIR": "/tmp",
        "MGPU_DATA_DIR": str(nb / ".no-data-cache"),  # the course's cache (test split) is not theirs
        "MGPU_BUILD_DIR": str(nb / "build"),
        "MPLBACKEND": "Agg",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


UNSHARE = ["unshare", "--net", "--mount", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc",
           "--propagation", "private"]


def isolation_available() -> tuple[bool, str]:
    """(True, '') when ``unshare --net --mount --pid`` works here and the system-call filter can be
    loaded, else (False, one line saying what is missing)."""
    notes = [note for ok, note in (namespaces_available(), filter_available()) if not ok]
    return not notes, "; ".join(notes)


@lru_cache(maxsize=1)
def filter_available() -> tuple[bool, str]:
    """(True, '') when the system-call filter (:mod:`autograder.syscall_filter`) can be built here."""
    try:
        syscall_filter.check(FILTER_ERRNO)
    except syscall_filter.FilterError as error:
        return False, f"{error}: the notebook runs without a system-call filter"
    return True, ""


def _filter_command() -> list[str]:
    """The command that loads the filter and runs the rest of its arguments ([] without a filter)."""
    if not filter_available()[0]:
        return []
    return [PYTHON, "-I", "-S", str(REPO_ROOT / "autograder" / "syscall_filter.py"), "--errno", str(FILTER_ERRNO), "--"]


@lru_cache(maxsize=1)
def namespaces_available() -> tuple[bool, str]:
    """(True, '') when ``unshare --net --mount --pid`` works here, else (False, why)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False, "unshare or ip not installed: the notebook runs with the network on and folders visible"
    if shutil.which("setpriv") is None and RUN_UID != "-":
        return False, "setpriv not installed: cannot run the notebook as an unprivileged user"
    drop = "" if RUN_UID == "-" else f" && setpriv --reuid={RUN_UID} --regid={RUN_UID} --clear-groups true"
    probe = subprocess.run(
        [*UNSHARE, "sh", "-c", f"ip link set lo up && mount -t tmpfs tmpfs /mnt{drop} && echo ok $$"],
        capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or "ok 1" not in probe.stdout:
        why = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        return False, f"unshare --net --mount --pid refused ({why}): the notebook runs with the network on"
    return True, ""


# ------------------------------------------------------------------------------------- cgroups


def _own_cgroup_dir(controller: str) -> Path | None:
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


def _empty_and_remove(folder: Path) -> int:
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
            parent = _own_cgroup_dir(controller)
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
                    _empty_and_remove(folder)
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
        return sum(_empty_and_remove(folder) for folder in dict.fromkeys(self.folders.values()))


def cleanup_stale_runs() -> int:
    """Kill the tasks of runs whose grader is dead (it was killed), and remove their cgroups.

    Returns how many tasks were killed. A running grader's cgroups (its pid is in their names) are
    left alone.
    """
    killed = 0
    for controller in CONTROLLERS:
        parent = _own_cgroup_dir(controller)
        if parent is None:
            continue
        for folder in parent.glob(f"{CGROUP_PREFIX}*"):
            owner = folder.name[len(CGROUP_PREFIX):].split("-", 1)[0]
            if owner.isdigit() and psutil.pid_exists(int(owner)) and int(owner) != os.getpid():
                continue
            killed += _empty_and_remove(folder)
    return killed


# Joins the cgroups whose cgroup.procs files come before "--", then runs the command after it.
_JOIN = 'while [ "$1" != "--" ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'


@dataclass
class RunResult:
    """What happened to one notebook run, on the grader's clock."""

    status: str                 # ok, cell_error, kernel_died, error, timeout, memory, tasks
    reason: str                 # one line a student can act on ('' when ok)
    seconds: float              # from starting the child to its end (or kill)
    notebook: str | None        # the executed notebook (JSON) as papermill left it, via the pipe
    epoch_seen_s: dict[int, float] = field(default_factory=dict)  # epoch -> first seen (s)
    #: epoch -> the grader's copy of the file as it was when first seen (in the caller's ``keep``)
    epoch_files: dict[int, Path] = field(default_factory=dict)
    epoch_rejected: dict[int, str] = field(default_factory=dict)  # epoch -> why it was not copied
    rewritten: list[int] = field(default_factory=list)  # epochs whose file changed after it was seen
    peak_memory_mb: float = 0.0
    isolation: str = ""         # '' when isolated, else the note saying why not
    #: Horovod workers the grader saw: pid in the run's namespace -> {"rank", "size", "host_pid",
    #: "cpu_s"} (the CPU seconds it had used when last seen alive)
    horovod_workers: dict[int, dict] = field(default_factory=dict)
    tasks_peak: int = 0         # most tasks at once in the run's pids cgroup (0: no cgroup)
    worker_uid: int | None = None  # the workers' user, when the launch service started them
    #: ``-np`` of every horovodrun the launch service started (empty without the service)
    launched: list[int] = field(default_factory=list)
    #: CPU seconds of every task of the run (cpuacct), at the first and latest epoch file and at the
    #: end ("first_epoch", "last_epoch", "end"; None without the cgroup)
    run_cpu_s: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict:
        """As JSON (a run on a cluster node hands it to the grader): epoch files by name only."""
        fields = asdict(self)
        fields["epoch_files"] = {e: Path(p).name for e, p in self.epoch_files.items()}
        return fields

    @classmethod
    def from_json(cls, fields: dict, folder: Path) -> "RunResult":
        """The inverse of :meth:`to_json`, its epoch files in ``folder`` (JSON's string keys made ints
        again). Raises ValueError for anything :meth:`to_json` cannot have written."""
        try:
            fields = dict(fields)
            for name in ("epoch_seen_s", "epoch_files", "epoch_rejected", "horovod_workers"):
                fields[name] = {int(k): v for k, v in fields[name].items()}
            for epoch, file in fields["epoch_files"].items():
                if not assessment.EPOCH_FILE.fullmatch(file) or int(assessment.EPOCH_FILE.fullmatch(file).group(1)) != epoch:
                    raise ValueError(f"epoch {epoch}: {file!r} is not its file's name")
                fields["epoch_files"][epoch] = Path(folder) / file
            return cls(**fields)
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"not a run's result: {error}") from None

    def workers_that_ran(self) -> dict[int, dict]:
        """The Horovod workers that count: with the launch service, only those whose rank and size
        fit the largest horovodrun it started (a process of a worker that sets Horovod's variables
        itself, or claims another size, is not a worker), one per rank."""
        if self.worker_uid is None:
            return dict(self.horovod_workers)
        size = max(self.launched, default=0)
        counted, ranks = {}, set()
        for pid, worker in sorted(self.horovod_workers.items()):
            if worker["size"] == size and 0 <= worker["rank"] < size and worker["rank"] not in ranks:
                counted[pid] = worker
                ranks.add(worker["rank"])
        return counted


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


def _namespace_pid(pid: int) -> int:
    """The pid of host process ``pid`` inside its innermost PID namespace."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def _horovod_worker(proc: psutil.Process, worker_uid: int | None) -> dict | None:
    """``{"rank", "size", "host_pid"}`` when ``proc`` is a Horovod worker the launch service started.

    With the launch service (``worker_uid``), only processes of the workers' user count: the
    kernel can start processes with Horovod's variables, but not as that user.
    """
    try:
        if worker_uid is not None and proc.uids().real != worker_uid:
            return None
        env = proc.environ()
        if "HOROVOD_RANK" not in env:
            return None
        return {"rank": int(env["HOROVOD_RANK"]), "size": int(env.get("HOROVOD_SIZE", "0")),
                "host_pid": proc.pid}
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError, ValueError):
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


def _note_training_cpu(workers: dict[int, dict], run_cpu: dict, mark: tuple) -> None:
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


def _spot_workers(root: psutil.Process, popen: subprocess.Popen, workers: dict[int, dict],
                  worker_uid: int | None, launched: list[int] | None = None) -> None:
    """Until the run ends: note every Horovod worker, by its pid in the run's namespace, and the
    number of workers each ``horovodrun`` of the launch service was started with (``launched``)."""
    checked: set[int] = set()
    while popen.poll() is None:
        for proc in _tree(root):
            if proc.pid in checked or popen.poll() is not None:
                continue
            try:  # `sh` and `env` start a worker and become it: look again until it is Python
                young = time.time() - proc.create_time() < 2.0
                if young and not proc.name().startswith("python"):
                    continue
            except psutil.Error:
                continue
            checked.add(proc.pid)
            asked = _horovodrun_launch(proc, worker_uid)
            if asked is not None and launched is not None:
                launched.append(asked)
            worker = _horovod_worker(proc, worker_uid)
            if worker is not None:
                workers[_namespace_pid(proc.pid)] = worker
        time.sleep(POLL_SECONDS)  # each worker's CPU is sampled by the CPU trail (CpuTrail)


class Rejected(ValueError):
    """A file of the run the grader will not take; the message says why, in one line."""


def read_regular(folder_fd: int, name: str, max_bytes: int, owner: int | None = None, *,
                 fix: str = "save with the locked callback") -> bytes:
    """The bytes of ``name`` in the folder open as ``folder_fd``, read as hostile data.

    Never follows a link and never blocks: only a regular file of at most ``max_bytes`` (counted
    while reading, not trusted from a stat), owned by ``owner`` when given; otherwise
    :class:`Rejected` with the reason (and ``fix``, what to do instead).
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Rejected(f"{name} is a link, not a file: {fix}") from None
        raise Rejected(f"{name} could not be opened ({error.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Rejected(f"{name} is not a regular file (a folder, fifo or device): {fix}")
        if owner is not None and info.st_uid != owner:
            raise Rejected(f"{name} was not written by a Horovod worker the grader started")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            cap = f"{max_bytes / 1e6:.0f} MB" if max_bytes >= 1e6 else f"{max_bytes / 1e3:.0f} kB" \
                if max_bytes >= 1e3 else f"{max_bytes} bytes"
            raise Rejected(f"{name} is larger than the {cap} a file may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_path(path: str | os.PathLike, max_bytes: int, *, fix: str) -> bytes:
    """:func:`read_regular` for a path: its last component is never followed (a link is refused)."""
    path = Path(path)
    try:
        folder_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise Rejected(f"{path.name} could not be opened ({error.strerror})") from None
    try:
        return read_regular(folder_fd, path.name, max_bytes, fix=fix)
    finally:
        os.close(folder_fd)


def read_outputs(output: Path, pattern: str, max_bytes: int, owner: int | None) -> dict[str, bytes | Rejected]:
    """Every file of ``output`` whose name matches ``pattern`` (a regex): its bytes, or why it was refused."""
    found: dict[str, bytes | Rejected] = {}
    try:
        folder_fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return found
    try:
        for name in sorted(os.listdir(folder_fd)):
            if re.fullmatch(pattern, name):
                try:
                    found[name] = read_regular(folder_fd, name, max_bytes, owner)
                except Rejected as error:
                    found[name] = error
    finally:
        os.close(folder_fd)
    return found


class EpochKeeper:
    """Copies each epoch file of the run the first time it is seen; notes later rewrites."""

    def __init__(self, output: Path, keep: Path, owner: int | None):
        self.output, self.keep, self.owner = Path(output), Path(keep), owner
        self.keep.mkdir(parents=True, exist_ok=True)
        self.seen: dict[int, float] = {}
        # epoch -> when the file was written (wall clock): its modification time, held between the
        # listing that did not show it and the one that did, so the time a run sets on its own files
        # moves the moment by no more than the time between two listings
        self.written: dict[int, float] = {}
        self.listed_at = time.time()  # when the folder was last listed (wall clock)
        self.files: dict[int, Path] = {}
        self.rejected: dict[int, str] = {}
        self._digests: dict[int, str] = {}
        self.kept_bytes = 0
        try:
            self._fd = os.open(self.output, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def _names(self) -> dict[int, str]:
        if self._fd is None:
            return {}
        try:
            names = os.listdir(self._fd)
        except OSError:
            return {}
        return {int(m.group(1)): name for name in names if (m := assessment.EPOCH_FILE.match(name))}

    def poll(self, now: float) -> None:
        absent_at, self.listed_at = self.listed_at, time.time()
        names = self._names()
        listed = time.time()  # every file listed was there by now
        for epoch, name in sorted(names.items()):
            if epoch in self.seen:
                continue
            self.seen[epoch] = now
            try:  # the link itself, never what it points to
                mtime = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_mtime
            except OSError:
                mtime = listed
            self.written[epoch] = min(max(mtime, absent_at), listed)
            if len(self.seen) > MAX_KEPT_EPOCHS or self.kept_bytes >= MAX_KEPT_BYTES:
                self.rejected[epoch] = (f"{name} was not kept: the run saved more than {MAX_KEPT_EPOCHS} epoch "
                                        f"files or {MAX_KEPT_BYTES // 2**20} MB of them (save one file per epoch)")
                continue
            try:
                data = read_regular(self._fd, name, min(MAX_EPOCH_BYTES, MAX_KEPT_BYTES - self.kept_bytes),
                                    self.owner)
            except Rejected as error:
                self.rejected[epoch] = str(error)
                continue
            copy = self.keep / name
            copy.write_bytes(data)
            self.kept_bytes += len(data)
            self.files[epoch] = copy
            self._digests[epoch] = hashlib.sha256(data).hexdigest()

    def rewritten(self) -> list[int]:
        """Epochs whose file is now different from (or gone since) the copy the grader took."""
        changed = []
        for epoch, digest in self._digests.items():
            try:
                now = read_regular(self._fd, self.files[epoch].name, MAX_EPOCH_BYTES, self.owner)
                same = hashlib.sha256(now).hexdigest() == digest
            except Rejected:
                same = False
            if not same:
                changed.append(epoch)
        return changed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
    leftovers = _tree(psutil.Process(popen.pid)) if popen.poll() is None else []
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


def trusted_python(module: str, *args: str) -> list[str]:
    """``python -I`` running the grader's ``module``: no current folder, user site or PYTHON* variable on
    the import path (a module a run wrote can never stand in for the grader's), only the course's."""
    code = (f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import runpy; "
            f"sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [PYTHON, "-I", "-c", code, *args]


def _wrap(command: list[str], work: Path, *, hide, work_parent: Path | None, isolate: bool,
          cgroups: "RunCgroups", launch_service: bool) -> tuple[list[str], str, bool]:
    """``command`` inside the namespaces, as the run's user, in the run's cgroups, dying with the grader.

    Returns ``(argv, note, isolated)``; the note says what isolation is missing ('' when none).
    """
    note, isolated = "", False
    if isolate:
        ok, note = namespaces_available()
        if ok:
            hidden = [Path(h).resolve() for h in hide if Path(h).exists()]
            parent = (work_parent or work.parent).resolve()
            script = isolation_script(work, parent, hidden, [*_needed_paths(), parent], RUN_UID, launch_service,
                                      _filter_command())
            command = [*UNSHARE, "sh", "-c", script, "isolate", *command]
            isolated = True
        else:  # no namespaces: the filter still applies
            command = [*_filter_command(), *command]
    else:
        note = "isolation switched off by the caller"
        command = [*_filter_command(), *command]
    if not filter_available()[0]:
        note = "; ".join(n for n in (note, filter_available()[1]) if n)
    if cgroups.note:
        note = "; ".join(n for n in (note, cgroups.note) if n)
    command = ["sh", "-c", _JOIN, "join", *cgroups.join_files(), "--", *command]
    if shutil.which("setpriv"):  # the run dies with the grader
        command = ["setpriv", "--pdeathsig", "KILL", *command]
    return command, note, isolated


def run_isolated(command: list[str], work: Path, *, cwd: Path, timeout_s: float, env: dict[str, str], hide=(),
                 work_parent: Path | None = None, isolate: bool = True,
                 memory_limit_mb: float = 4000) -> tuple[int | None, str, str]:
    """Run ``command`` in ``cwd`` inside the same sandbox as a notebook (no launch service), seeing
    ``work`` and not the rest of ``work_parent``.

    Returns ``(returncode, stdout, stderr)``; ``returncode`` is None when it was killed at
    ``timeout_s``. Nothing it started survives.
    """
    marker = uuid.uuid4().hex
    cgroups = RunCgroups(marker, memory_limit_mb)
    argv, _, _ = _wrap(command, Path(work), hide=hide, work_parent=work_parent, isolate=isolate,
                       cgroups=cgroups, launch_service=False)
    popen = subprocess.Popen(argv, cwd=cwd, env={**env, GRADE_MARKER: marker}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                             start_new_session=True, preexec_fn=_die_with(os.getpid()))
    try:
        out, err = popen.communicate(timeout=timeout_s)
        code = popen.returncode
    except subprocess.TimeoutExpired:
        out, err, code = "", "", None
    finally:
        kill_run(popen, marker, cgroups)
    return code, out, err


def run_notebook(folder: RunFolder, name: str, parameters: dict, *, keep: Path, timeout_s: float,
                 memory_limit_mb: float, hide: list[Path] = (), work_parent: Path | None = None,
                 isolate: bool = True, env: dict[str, str] | None = None) -> RunResult:
    """Execute ``folder.nb/name`` with papermill under the grader's limits.

    Epoch files are copied into ``keep`` (a folder of the grader's) as they first appear. Whatever
    happens here (an exception, a signal turned into one), nothing of the run survives.
    """
    run = _NotebookRun(folder, keep, memory_limit_mb)
    run.start(name, parameters, env, hide=hide, work_parent=work_parent, isolate=isolate)
    try:
        status, reason = run.watch(timeout_s)
    finally:
        run.stop()
    return run.result(status, reason)


class _NotebookRun:
    """One notebook run: started in the sandbox, watched against the limits, stopped, read."""

    def __init__(self, folder: RunFolder, keep: Path, memory_limit_mb: float):
        self.folder, self.memory_limit_mb = folder, memory_limit_mb
        self.marker = uuid.uuid4().hex
        self.cgroups = RunCgroups(self.marker, memory_limit_mb)
        self.keep = keep
        self.chunks: list[bytes] = []  # the result pipe's bytes
        self.workers: dict[int, dict] = {}
        self.launched: list[int] = []
        self.run_cpu: dict[str, float | None] = {}  # the run's CPU seconds (cpuacct) at the first and latest epoch
        self.pending: list[float] = []  # when each new epoch file was written, until the trail has a sample after it
        self.peak = 0.0
        self.overflowed = False  # the result pipe passed MAX_RESULT_BYTES
        self.full = ""  # the first of the run's file systems seen full (a reason), '' if none
        self._init_pid: int | None = None  # the first process of the run's PID namespace (its /tmp)

    def start(self, name: str, parameters: dict, env, *, hide, work_parent, isolate) -> None:
        folder = self.folder
        child_env = run_environment(folder.nb, self.marker, env)
        read_end, write_end = os.pipe()
        command = trusted_python("autograder.execute", str(folder.nb / name), str(folder.nb / "executed.ipynb"),
                                 json.dumps(parameters), "--result-fd", str(write_end))
        command, self.note, self.isolated = _wrap(command, folder.root, hide=hide, work_parent=work_parent,
                                             isolate=isolate, cgroups=self.cgroups, launch_service=True)
        self.worker_uid = None
        if self.isolated and RUN_UID != "-":
            self.worker_uid = int(WORKER_UID)
            child_env["MGPU_LAUNCH_SPOOL"] = LAUNCH_SPOOL
        else:
            self.note = "; ".join(n for n in (self.note, "no launch service: Horovod workers and their files cannot "
                                                         "be told apart from the kernel's") if n)
        self.keeper = EpochKeeper(folder.output, self.keep, self.worker_uid)
        self.started = time.monotonic()
        self.popen = subprocess.Popen(command, cwd=folder.nb, env=child_env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True, pass_fds=(write_end,),
                                      preexec_fn=_die_with(os.getpid()))
        os.close(write_end)
        self.reader = threading.Thread(target=self._read_pipe, args=(read_end,), daemon=True)
        self.reader.start()
        self.root = psutil.Process(self.popen.pid)
        # Reading a process's environment waits for its memory map, which a fork bomb keeps busy:
        # the workers are found in a thread of their own, so the limits never wait for it.
        self.spotter = threading.Thread(target=_spot_workers, daemon=True,
                                        args=(self.root, self.popen, self.workers, self.worker_uid, self.launched))
        self.spotter.start()
        self.trail = CpuTrail(self.workers, self.cgroups)

    def _read_pipe(self, read_end: int) -> None:  # the run can write into this pipe too: keep at most MAX_RESULT_BYTES
        total = 0
        with os.fdopen(read_end, "rb") as pipe:
            for chunk in iter(lambda: pipe.read(1 << 16), b""):
                total += len(chunk)
                if total <= MAX_RESULT_BYTES:
                    self.chunks.append(chunk)
                else:
                    self.chunks.clear()
                    self.overflowed = True

    def _file_systems(self) -> list[tuple[str, str, int, int]]:
        """(name, path, size in MB, inodes) of each file system of the run the grader can measure:
        its own (mounted in the grader's namespace) and, while the run's first process lives, its
        private /tmp and /dev/shm seen through that process's root (``statvfs`` only: nothing is
        opened or read there)."""
        found = []
        if self.folder.mounted:
            found.append(("the run's own file system", str(self.folder.root), self.folder.disk_mb, self.folder.inodes))
        if self.isolated and self._init_pid is None:
            try:
                self._init_pid = next((c.pid for c in self.root.children() if _namespace_pid(c.pid) == 1), None)
            except psutil.Error:
                pass
        if self._init_pid is not None:
            found += [("/tmp", f"/proc/{self._init_pid}/root/tmp", TMP_MB, TMP_INODES),
                      ("/dev/shm", f"/proc/{self._init_pid}/root/dev/shm", SHM_MB, TMP_INODES)]
        return found

    def _check_disks(self) -> None:
        """Note the first of the run's file systems found full: no space, or no inode, left."""
        if self.full:
            return
        for name, path, size_mb, inodes in self._file_systems():
            try:
                fs = os.statvfs(path)
            except OSError:
                continue
            if fs.f_blocks and fs.f_bavail * fs.f_frsize < FULL_BELOW_BYTES:
                self.full = (f"disk limit reached: {name} was full (its cap is {size_mb} MB), "
                             "the run could write no more")
            elif fs.f_files and fs.f_ffree <= 0:
                self.full = (f"inode limit reached: {name} held its cap of {inodes} files and folders, "
                             "the run could create no more")
            if self.full:
                return

    def _poll_epochs(self, now: float) -> None:
        known = set(self.keeper.seen)
        self.keeper.poll(now)
        self.pending.extend(sorted(self.keeper.written[e] for e in set(self.keeper.seen) - known))

    def _note_marks(self) -> None:
        while self.pending and (mark := self.trail.at(self.pending[0])) is not None:
            _note_training_cpu(self.workers, self.run_cpu, mark)
            self.pending.pop(0)

    def watch(self, timeout_s: float) -> tuple[str, str]:
        """Until the run ends or breaks a limit: ``(status, reason)`` of a limit, ('', '') otherwise."""
        while self.popen.poll() is None:
            now = time.monotonic() - self.started
            # The cheap checks first: a fork bomb makes walking the process tree slow.
            if self.cgroups.hit_pids_limit():
                return "tasks", (f"too many processes/threads: the run hit the limit of {PIDS_MAX} "
                                 "tasks (a fork bomb?) and was stopped")
            if now > timeout_s:
                return "timeout", f"timed out after {timeout_s:.0f} s"
            self._poll_epochs(now)
            self._check_disks()
            self._note_marks()
            self.trail.forget_before(self.pending[0] if self.pending else self.keeper.listed_at)
            memory = self.cgroups.resident_mb()
            if memory is None:  # no memory cgroup: sum per process (shared pages count more than once)
                memory = _rss_mb(_tree(self.root))
            self.peak = max(self.peak, memory)
            if memory > self.memory_limit_mb:
                return "memory", (f"memory limit exceeded: {memory:.0f} MB > "
                                  f"{self.memory_limit_mb:.0f} MB, the run was killed")
            time.sleep(POLL_SECONDS)
        return "", ""

    def stop(self) -> None:
        """Take the last readings, then kill everything of the run (always called)."""
        cgroups = self.cgroups
        self.end = time.monotonic() - self.started
        self.tasks_peak, self.fork_limited, self.oom = cgroups.tasks_peak(), cgroups.hit_pids_limit(), cgroups.oom_killed()
        self.memory_peak_mb = cgroups.peak_mb()
        self.run_cpu["end"] = cgroups.cpu_s()
        self._poll_epochs(self.end)  # appeared between the last poll and the end
        self._check_disks()
        self.trail.stop()
        self._note_marks()
        kill_run(self.popen, self.marker, cgroups)
        self.reader.join(timeout=30)
        self.spotter.join(timeout=10)

    def result(self, status: str, reason: str) -> RunResult:
        rewritten = self.keeper.rewritten()
        self.keeper.close()
        try:
            result = json.loads(b"".join(self.chunks)) if self.chunks else None
        except ValueError:
            result = None
        result = result if isinstance(result, dict) else None
        if not status:
            status, reason = self._status(result)
        keeper = self.keeper
        return RunResult(status=status, reason=reason, seconds=self.end,
                         notebook=result.get("notebook") if result else None,
                         epoch_seen_s=dict(sorted(keeper.seen.items())), epoch_files=dict(sorted(keeper.files.items())),
                         epoch_rejected=keeper.rejected, rewritten=rewritten, peak_memory_mb=self.peak,
                         isolation=self.note, horovod_workers=dict(sorted(self.workers.items())),
                         tasks_peak=self.tasks_peak, worker_uid=self.worker_uid, launched=list(self.launched),
                         run_cpu_s=dict(self.run_cpu))

    def _status(self, result: dict | None) -> tuple[str, str]:
        """Why a run that broke no limit of the watchdog's ended: the kernel's caps, else the pipe's word."""
        limit = self.memory_limit_mb
        if self.oom:
            self.peak = max(self.peak, self.memory_peak_mb)
            if self.memory_peak_mb and self.memory_peak_mb < 0.9 * limit * CGROUP_MEMORY_FACTOR:
                # killed well under its own cap: by a cap around it (a Slurm job's --mem, a container's)
                return "memory", (f"memory limit exceeded: the kernel stopped the run at {self.memory_peak_mb:.0f} MB, "
                                  f"the memory of the job or container it ran in (the profile allows {limit:.0f} MB: "
                                  "the cluster's --mem is too small for it)")
            return "memory", (f"memory limit exceeded: more than {limit:.0f} MB, the kernel stopped the run at "
                              f"its hard cap ({limit * CGROUP_MEMORY_FACTOR:.0f} MB)")
        if self.fork_limited:
            return "tasks", (f"too many processes/threads: the run hit the limit of {PIDS_MAX} tasks "
                             "(a fork bomb?) and was stopped")
        if self.full and (result is None or result.get("status") != "ok"):
            then = (result or {}).get("message") or "the run ended without a result"
            return "disk", f"{self.full} ({then})"[:600]
        if self.overflowed:
            return "output", (f"output limit exceeded: the executed notebook, with what its cells printed, passed "
                              f"{MAX_RESULT_BYTES // 2**20} MB, the grader's cap (print less)")
        if result is None:
            return "kernel_died", "kernel died (it exited, crashed or ran out of memory): the run ended without a result"
        status = result["status"]
        reason = {"ok": "", "cell_error": result["message"] or "a cell raised an error",
                  "kernel_died": "kernel died (it exited, crashed or ran out of memory)"}.get(status, result["message"])
        if status == "kernel_died" and result["message"]:
            reason += f": {result['message']}"
        return status, reason
