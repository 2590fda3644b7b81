"""Run one submission's notebook in a subprocess the grader controls, and watch it with its own clock.

:func:`run_notebook` starts :mod:`autograder.execute` (papermill) in a new session, isolated
(:mod:`autograder.isolation`: namespaces, the run's own file system and private ``/tmp``, the
system-call filter, an unprivileged user, an allow-listed environment) and in cgroups of its own
(:mod:`autograder.cgroups`), then watches it until it ends or breaks a limit:

- **limits named in the verdict**: time, memory, tasks, the output cap (:data:`MAX_RESULT_BYTES`),
  and a full disk or no inode left on the run's own file system, its ``/tmp`` or ``/dev/shm``
  (each one line with the cap);
- **a wall-clock time-out** on the grader's clock and **a memory limit** on the resident memory of
  the whole run, checked by a watchdog: the memory cgroup's anonymous memory (each page once), or
  without it the sum over the process tree (TensorFlow reserves far more virtual memory than it
  uses, so an address-space rlimit would kill healthy runs);
- **who ran**: the Horovod workers and launches, and the CPU trail (:mod:`autograder.watch`);
- **the epoch files**, each copied the moment it first appears (:mod:`autograder.epochs`);
- **no survivors** (:mod:`autograder.stop`): the session, every process with the run's marker,
  every task in its cgroups, then any child left. If the grader itself dies, ``setpriv
  --pdeathsig`` and ``unshare --kill-child`` take the run's PID namespace with it.

It returns a :class:`RunResult`. :func:`run_isolated` runs another command (the clean test pass)
in the same sandbox, without the launch service. Files the grader reads from a run are read by
:mod:`autograder.safe_read`.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from autograder import isolation
from autograder.cgroups import CGROUP_MEMORY_FACTOR, PIDS_MAX, RunCgroups
from autograder.epochs import EpochKeeper
from autograder.isolation import (GRADE_MARKER, LAUNCH_SPOOL, RUN_UID, WORKER_UID, RunFolder, die_with,
                                  run_environment, trusted_python, wrap)
from autograder.stop import kill_run
from autograder.watch import (POLL_SECONDS, CpuTrail, namespace_pid, note_training_cpu, process_tree, rss_mb,
                              spot_workers)
from mgpu import assessment

#: Most bytes of the result pipe kept (the executed notebook: at most 5 MB in, plus outputs): the
#: output cap. A run whose executed notebook, with what its cells printed, is larger fails with
#: ``output limit exceeded``.
MAX_RESULT_BYTES = 64 * 2**20
#: A file system of the run counts as full below this many free bytes (or with no free inode).
FULL_BELOW_BYTES = 256 * 1024


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
    argv, _, _ = wrap(command, Path(work), hide=hide, work_parent=work_parent, isolate=isolate,
                      cgroups=cgroups, launch_service=False)
    popen = subprocess.Popen(argv, cwd=cwd, env={**env, GRADE_MARKER: marker}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                             start_new_session=True, preexec_fn=die_with(os.getpid()))
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
        command, self.note, self.isolated = wrap(command, folder.root, hide=hide, work_parent=work_parent,
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
                                      preexec_fn=die_with(os.getpid()))
        os.close(write_end)
        self.reader = threading.Thread(target=self._read_pipe, args=(read_end,), daemon=True)
        self.reader.start()
        self.root = psutil.Process(self.popen.pid)
        # Reading a process's environment waits for its memory map, which a fork bomb keeps busy:
        # the workers are found in a thread of their own, so the limits never wait for it.
        self.spotter = threading.Thread(target=spot_workers, daemon=True,
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
                self._init_pid = next((c.pid for c in self.root.children() if namespace_pid(c.pid) == 1), None)
            except psutil.Error:
                pass
        if self._init_pid is not None:
            found += [("/tmp", f"/proc/{self._init_pid}/root/tmp", isolation.TMP_MB, isolation.TMP_INODES),
                      ("/dev/shm", f"/proc/{self._init_pid}/root/dev/shm", isolation.SHM_MB, isolation.TMP_INODES)]
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
            note_training_cpu(self.workers, self.run_cpu, mark)
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
                memory = rss_mb(process_tree(self.root))
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
