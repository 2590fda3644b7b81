"""Isolating a run: the namespaces, the file system it sees, the user it runs as, its environment.

:func:`wrap` turns a command into one that runs isolated, and is what :mod:`autograder.sandbox` starts
(the notebook's papermill process, and the clean test pass):

- ``unshare --net --mount --pid --ipc`` gives the run a network namespace with only loopback
  (Horovod's Gloo and the kernel's ZeroMQ need it), a mount namespace, a PID namespace of its own
  (with its own ``/proc``: when its first process ends, the kernel ends every process in it) and
  its own IPC namespace. :func:`isolation_available` probes this once; without it the run goes
  ahead with a logged note;
- inside, :func:`isolation_script` (run as root) shows the host through an allow-list, covers the
  course folder, the data cache and every other run's folder, gives the run a private ``/tmp``
  and ``/dev/shm``, makes every other mount read-only, loads the system-call filter
  (:mod:`autograder.syscall_filter`; :func:`filter_available` probes it), starts the launch
  service (:mod:`autograder.launch_service`) and drops root (``setpriv``) to :data:`RUN_UID`;
- the command joins the run's cgroups (:mod:`autograder.cgroups`) and dies with the grader
  (``setpriv --pdeathsig``, and :func:`die_with` for the moment before it).

Each run has **its own small file system** (:class:`RunFolder`: a tmpfs with a size and an inode
quota, so a run that fills its disk fails alone) laid out as ``nb/`` (the notebook, the kernel's
working folder, its home), ``data/`` (read-only) and ``output/`` (writable only by the workers), and
an **allow-listed environment** (:func:`run_environment`: nothing of the grader's own environment,
no instructor's tokens). The kernel runs as :data:`RUN_UID`; the launch service starts the Horovod
workers as :data:`WORKER_UID`, a user the kernel cannot impersonate. :func:`trusted_python` is how
the grader starts its own modules so that nothing a run wrote can stand in for them.
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from autograder import syscall_filter

#: Environment variable marking every process of one graded run (the launcher uses its own).
GRADE_MARKER = "MGPU_GRADE_ID"
REPO_ROOT = Path(__file__).resolve().parents[1]
#: The Python a run starts, its folder's links resolved (a checkout under a linked home is seen in a
#: run only at its real path); the file itself is not resolved, so a virtual env stays one.
PYTHON = str(Path(sys.executable).parent.resolve() / Path(sys.executable).name)
#: What a call the system-call filter refuses returns (:mod:`autograder.syscall_filter`).
FILTER_ERRNO = errno.EPERM
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
#: is covered, with only :func:`needed_paths` bound back.
SYSTEM_TOP_FOLDERS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "nix", "opt",
                                "proc", "run", "sbin", "snap", "sys", "tmp", "usr", "var"})


def _private_top_folders() -> list[Path]:
    """The host's top-level folders that are not the system's (folders, not links)."""
    return sorted(p for p in Path("/").iterdir()
                  if p.name not in SYSTEM_TOP_FOLDERS and p.is_dir() and not p.is_symlink())


def needed_paths() -> list[Path]:
    """What a run must be able to read: the Python installation, the virtual env, the course library
    (``mgpu/`` and the grader's own ``autograder/``, nothing else of the project)."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent,
             Path(PYTHON).parent, REPO_ROOT / "mgpu", REPO_ROOT / "autograder", REPO_ROOT / "pyproject.toml"}
    return sorted(p for p in paths if p.exists())


def die_with(grader_pid: int):
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


# Joins the cgroups whose cgroup.procs files come before "--", then runs the command after it.
_JOIN = 'while [ "$1" != "--" ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'


def trusted_python(module: str, *args: str) -> list[str]:
    """``python -I`` running the grader's ``module``: no current folder, user site or PYTHON* variable on
    the import path (a module a run wrote can never stand in for the grader's), only the course's."""
    code = (f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import runpy; "
            f"sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [PYTHON, "-I", "-c", code, *args]


def wrap(command: list[str], work: Path, *, hide, work_parent: Path | None, isolate: bool,
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
            script = isolation_script(work, parent, hidden, [*needed_paths(), parent], RUN_UID, launch_service,
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

