"""The Slurm backend of the grader's run step: each submission's notebook runs as an element of one
Slurm job array, on a cluster node; everything else stays on the grader's machine.

``python -m autograder grade COURSE --backend slurm --shared-dir DIR [--partition P] [--account A]``
(or the same settings in ``COURSE/autograder/slurm.json``, see :class:`ClusterSettings`):

1. the grader validates and rebuilds every submission as for the local backend, then stages each
   in a folder the nodes share (``DIR/mgpu-grade-<course>-<random>/``): the cohort's training and
   validation data once (``data/``), and per submission its notebook, the indices of the training
   images it gets (chosen with the course secret, which stays here) and ``task.json``;
2. one ``sbatch --array`` asks, per element, for the profile's workers as cores
   (``--cpus-per-task``), its GPUs (``--gres=gpu:N``, for a profile other than ``cpu``), memory
   (``--mem``: the run's limit, the sandbox's kernel cap over it, and room for the node's runner)
   and time (``--time``: the time-out and :data:`RUNNER_SLACK_S`, in whole minutes: a backstop
   behind the sandbox's own clock); with ``--jobs N``, at most N elements run at once (``%N``);
3. on the node, :mod:`autograder.node_run` runs the notebook in the same sandbox and under the
   same watchdog as the local backend, and hands back the run's result and the epoch files it
   copied; the grader's threads, woken by one poller of ``squeue``, then check, measure and grade
   each submission here, as the local backend does.

A job Slurm ends for its time or memory gets the local backend's verdict and reason (``timed out
after N s``, ``memory limit exceeded``); a job that ends in any other way without a result (node
failure, cancelled by someone else) is a fault of the grader: it is logged, not recorded, and a
rerun grades it. Stopping the grader (Ctrl-C, SIGTERM) cancels its job array; a grader that was
killed outright leaves its jobs and shared folder, and its rerun (the course's lock says no other
grader is at work) cancels those jobs and removes that folder before it starts.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

from autograder import course as course_mod
from autograder import cgroups, isolation, node_run, runners, sandbox
from mgpu.lesson10.slurm_horovod import ACTIVE_STATES

#: The file of a course's cluster settings (the command line's flags override it).
SETTINGS_FILE = "slurm.json"
#: How often the poller asks squeue (s).
POLL_S = 1.0
#: The node's runner around the notebook: Python, copying the data in and the epochs out (s).
RUNNER_SLACK_S = 120
#: Memory for the node's runner, beside the run's own cap (MB).
RUNNER_MEMORY_MB = 512
#: After a job's end, how long its result may take to show in the shared folder (a network file
#: system caches what a folder holds for a few seconds).
RESULT_GRACE_S = 30
#: Below this much free space in the shared folder, an element that ended without a result is
#: taken for a full disk: the grader stops the cohort with one line (as locally), never blaming a student.
MIN_FREE_MB = 256
#: Where Slurm is found when PATH lacks it (Debian puts the daemons in /usr/sbin, the commands in /usr/bin).
_SEARCH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


class SlurmError(course_mod.CourseError):
    """Slurm refused, or cannot be reached: one line naming the fix."""


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SEARCH}")


@dataclass
class ClusterSettings:
    """Where the grader's jobs go. ``COURSE/autograder/slurm.json`` may hold any of these fields;
    the command line's ``--shared-dir``, ``--partition`` and ``--account`` override it."""

    shared_dir: str = ""          # a folder every node sees at this same path (NFS, Lustre, BeeGFS ...)
    partition: str = ""           # sbatch --partition ('' : the cluster's default)
    account: str = ""             # sbatch --account ('' : the user's default)
    sbatch_args: list = field(default_factory=list)  # anything else the site needs (--qos, --constraint ...)

    @classmethod
    def load(cls, course_dir, **overrides) -> "ClusterSettings":
        path = Path(course_dir) / "autograder" / SETTINGS_FILE
        fields = {}
        if path.exists():
            try:
                fields = json.loads(path.read_text())
                if not isinstance(fields, dict) or set(fields) - set(cls.__dataclass_fields__):
                    raise ValueError(f"unknown fields {sorted(set(fields) - set(cls.__dataclass_fields__))}")
                settings = cls(**fields)
            except (ValueError, TypeError) as error:
                raise SlurmError(f"{path} is not valid ({error}): write a JSON object with shared_dir, "
                                 "partition, account, sbatch_args") from None
        else:
            settings = cls()
        for name, value in overrides.items():
            if value:
                setattr(settings, name, value)
        if not isinstance(settings.sbatch_args, list) or not all(isinstance(a, str) for a in settings.sbatch_args):
            raise SlurmError(f"sbatch_args in {path} must be a list of strings, e.g. [\"--qos=short\"]")
        return settings

    def check(self) -> Path:
        """The shared folder, once Slurm answers and the folder is usable; else SlurmError."""
        missing = [c for c in ("sbatch", "squeue", "scancel") if _which(c) is None]
        if missing:
            raise SlurmError(f"Slurm's commands are not installed here ({', '.join(missing)} missing): grade on a "
                             "machine that can submit jobs (a login node), or use --backend local")
        if not self.shared_dir:
            raise SlurmError("no shared folder: pass --shared-dir DIR (a folder every node sees at the same path) "
                             f"or put \"shared_dir\" in COURSE/autograder/{SETTINGS_FILE}")
        folder = Path(self.shared_dir).resolve()
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise SlurmError(f"shared folder {folder} does not exist or is not writable: create it on the shared "
                             "file system, or pass another --shared-dir")
        inside = [p for p in isolation.needed_paths() if p == folder or folder in p.parents]
        if inside:  # runs cannot see the shared folder, and they need these
            raise SlurmError(f"shared folder {folder} holds {inside[0]}, which every run needs (runs never see the "
                             "shared folder): pass a folder of its own, e.g. DIR/mgpu-grading")
        conf = os.environ.get("SLURM_CONF")
        if conf and not Path(conf).is_file():  # Slurm's commands would retry for a minute
            raise SlurmError(f"SLURM_CONF names {conf}, which does not exist: point it at the cluster's slurm.conf, "
                             "or unset it")
        try:
            done = subprocess.run([_which("squeue"), "-h", "-u", str(os.getuid()), "-o", "%i"], capture_output=True,
                                  text=True, timeout=30)
        except subprocess.TimeoutExpired:
            raise SlurmError("Slurm does not answer (squeue took over 30 s): check that slurmctld runs, or use "
                             "--backend local") from None
        if done.returncode:
            said = "; ".join(line.strip() for line in done.stderr.splitlines() if line.strip())[:200]
            raise SlurmError(f"Slurm does not answer (squeue: {said or 'no message'}): check "
                             "SLURM_CONF and that slurmctld runs, or use --backend local")
        return folder


@dataclass
class _Task:
    index: int
    folder: Path
    state: str = ""
    node: str = ""
    reason: str = ""
    ended: threading.Event = field(default_factory=threading.Event)
    started_at: float | None = None  # monotonic, when the grader first saw it running (or ended)
    ended_at: float | None = None   # monotonic, when the grader saw it end


def job_name(course_root: Path) -> str:
    """The name of a course's grading jobs (the same for every run of its grader)."""
    return "mgpu-grade-" + hashlib.sha256(str(Path(course_root).resolve()).encode()).hexdigest()[:10]


class SlurmRunner:
    """Runs each submission as an element of one Slurm job array (see the module's docstring)."""

    name = "slurm"
    batch = True

    def __init__(self, settings: ClusterSettings, log=print):
        self.settings = settings
        self.shared = settings.check()
        self.log = log
        self.tasks: dict[str, _Task] = {}
        self.job_id: str | None = None
        self.cancelled = threading.Event()
        self.progress = lambda text: None
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()

    # ----------------------------------------------------------------------------- set-up

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([_which(args[0]) or args[0], *args[1:]], capture_output=True, text=True,
                              timeout=timeout)

    def open(self, cohort: runners.Cohort, work_root: Path) -> None:
        """Cancel what a killed grader of this course left, and stage the cohort's data once."""
        self.work_root = work_root
        self.array_name = job_name(cohort.course_root)
        stale = self._run("squeue", "-h", "-u", str(os.getuid()), "-n", self.array_name, "-o", "%A").stdout.split()
        if stale:
            self._run("scancel", "-u", str(os.getuid()), "-n", self.array_name)
            self.log(f"cancelled {len(set(stale))} Slurm job(s) left by an interrupted grading run of this course")
        for old in self.shared.glob(f"{self.array_name}-*"):
            shutil.rmtree(old, ignore_errors=True)
        self.folder = self.shared / f"{self.array_name}-{secrets.token_hex(4)}"
        (self.folder / "tasks").mkdir(parents=True)
        shutil.copytree(cohort.data_template, self.folder / "data")
        self.timeout_s = cohort.timeout_s
        self.memory_mb = cohort.memory_limit_mb
        self.profile = cohort.profile
        self.hide = [str(self.shared), *map(str, cohort.hidden)]  # the whole shared folder: other cohorts too
        self.isolate = cohort.isolate

    def prepare(self, spec: runners.RunSpec) -> None:
        """Stage one submission: its notebook, its images' indices, its task."""
        task = _Task(len(self.tasks), self.folder / "tasks" / str(len(self.tasks)))
        task.folder.mkdir()
        nbformat.write(spec.notebook, task.folder / spec.cohort.notebook_name)
        np.save(task.folder / "keep.npy", spec.kept_images)
        parameters = spec.parameters  # the node puts its own folders in
        (task.folder / "task.json").write_text(json.dumps({
            "notebook": spec.cohort.notebook_name, "parameters": parameters, "timeout_s": self.timeout_s,
            "memory_limit_mb": self.memory_mb, "isolate": self.isolate, "hide": self.hide,
            "student": spec.student, "evidence": list(spec.evidence) if spec.evidence is not None else None}))
        self.tasks[spec.student] = task

    # -------------------------------------------------------------------------- the array

    def sbatch_args(self, count: int, jobs: int | None) -> list[str]:
        """sbatch's options for an array of ``count`` runs of the profile (``jobs``: most at once)."""
        workers = self.profile.workers
        mem = math.ceil(self.memory_mb * cgroups.CGROUP_MEMORY_FACTOR) + RUNNER_MEMORY_MB
        minutes = math.ceil((self.timeout_s + RUNNER_SLACK_S) / 60)
        args = [f"--array=0-{count - 1}" + (f"%{jobs}" if jobs else ""), f"--job-name={self.array_name}",
                "--ntasks=1", f"--cpus-per-task={workers}", f"--mem={mem}M", f"--time={minutes}",
                f"--output={self.folder}/tasks/%a/slurm.out", f"--chdir={self.folder}", "--export=NONE",
                "--parsable"]
        if self.profile.name != "cpu":
            args.append(f"--gres=gpu:{workers}")
        if self.settings.partition:
            args.append(f"--partition={self.settings.partition}")
        if self.settings.account:
            args.append(f"--account={self.settings.account}")
        return args + list(self.settings.sbatch_args)

    def batch_script(self) -> str:
        """The array's script: the node's runner on this element's task, in ``python -I``."""
        runner = isolation.trusted_python("autograder.node_run", f"{self.folder}/tasks/$SLURM_ARRAY_TASK_ID")
        command = " ".join(shlex.quote(a) for a in runner[:-1]) + f' "{runner[-1]}"'
        return ("#!/bin/sh\n"
                f"export PATH={_SEARCH} LANG=C.UTF-8\n"
                f"exec {command}\n")

    def launch(self, submissions, jobs: int | None) -> None:
        if not submissions:
            return
        script = self.folder / "job.sh"
        script.write_text(self.batch_script())
        done = self._run("sbatch", *self.sbatch_args(len(self.tasks), jobs), str(script))
        if done.returncode:
            said = "; ".join(line.strip() for line in done.stderr.splitlines() if line.strip())[:300]
            raise SlurmError(f"sbatch refused the grading jobs ({said or 'no message'}): check --partition, "
                             f"--account and the sbatch_args in COURSE/autograder/{SETTINGS_FILE}")
        self.job_id = done.stdout.strip().split(";")[0]
        self.submitted_at = time.monotonic()
        self.log(f"submitted Slurm job array {self.job_id} ({len(self.tasks)} runs; shared folder {self.folder})")
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        """Until every element has ended: their states, from squeue; wakes each one's waiting thread."""
        by_index = {t.index: t for t in self.tasks.values()}
        shown = ""
        while not self._stop.is_set() and not all(t.ended.is_set() for t in by_index.values()):
            try:
                out = self._run("squeue", "-h", "-r", "-j", self.job_id, "-t", "all", "-o", "%i|%T|%N|%r",
                                timeout=30).stdout
            except subprocess.TimeoutExpired:
                out = ""
            listed = set()
            for line in out.splitlines():
                job, state, node, reason = (line.split("|") + ["", "", ""])[:4]
                match = re.fullmatch(rf"{re.escape(self.job_id)}_(\d+)", job.strip())
                if not match or int(match.group(1)) not in by_index:
                    continue
                task = by_index[int(match.group(1))]
                listed.add(task.index)
                task.state, task.node, task.reason = state.strip(), node.strip() or task.node, reason.strip()
                if task.started_at is None and task.state not in ("PENDING", "CONFIGURING", "REQUEUED"):
                    task.started_at = time.monotonic()
                if task.state not in ACTIVE_STATES and not task.ended.is_set():
                    task.ended_at = time.monotonic()
                    task.ended.set()
            counts = {}
            for task in by_index.values():
                if not task.ended.is_set():
                    counts[task.state.lower() or "submitted"] = counts.get(task.state.lower() or "submitted", 0) + 1
            text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            if text != shown:
                self.progress(text)
                shown = text
            self._stop.wait(POLL_S)

    def run(self, spec: runners.RunSpec) -> runners.RunOutput:
        """Wait for the submission's element to end; take its result as the local backend would."""
        task = self.tasks[spec.student]
        while not task.ended.wait(1.0):
            if self.cancelled.is_set():
                raise SlurmError("grading was stopped: the Slurm jobs were cancelled")
        keep = self.work_root / f"{spec.tag}-kept"  # the grader's copies of the epoch files
        evidence = self.work_root / f"{spec.tag}-evidence"  # and of the files the outcome reads
        cleanup = (lambda: shutil.rmtree(keep, ignore_errors=True), lambda: shutil.rmtree(evidence, ignore_errors=True))
        evidence_dir = None
        try:
            deadline = task.ended_at + RESULT_GRACE_S
            found = node_run.read_result(task.folder, keep)
            while found is None and task.state == "COMPLETED" and time.monotonic() < deadline:
                time.sleep(1.0)  # a network file system shows the result a little later
                found = node_run.read_result(task.folder, keep)
            run, facts_files = self.outcome(task, found)
            if spec.evidence is not None:  # what the node copied out of the run, read as hostile data again
                evidence_dir = runners.copy_evidence(task.folder / "result" / "evidence", spec.evidence, evidence, None)
        except BaseException:
            for remove in cleanup:
                remove()
            raise
        shutil.rmtree(task.folder, ignore_errors=True)  # collected: the shared folder holds only what runs
        if os.geteuid() != 0:  # what the grader knows, whatever the result says
            run.isolation = "; ".join(n for n in (
                f"the Slurm job ran as uid {os.geteuid()}, not root: the node's sandbox could not isolate the run, "
                "and the run could have written its own result", run.isolation) if n)
        # the grader's own parameters (the clean test pass puts its folders in), never the record's
        return runners.RunOutput(run, facts_files, spec.parameters, cleanup, run_host=task.node,
                                 slurm_job=f"{self.job_id}_{task.index}", evidence_dir=evidence_dir,
                                 queue_seconds=round((task.started_at or task.ended_at) - self.submitted_at, 1))

    def outcome(self, task: _Task, found) -> tuple[sandbox.RunResult, dict]:
        """The run and its facts files, from the element's result and its final state:
        Slurm's time and memory kills give the local backend's status and reason."""
        limit = f"{self.memory_mb:.0f} MB"
        memory = ("memory", f"memory limit exceeded: more than {limit}, Slurm stopped the run at the job's --mem")
        timeout = ("timeout", f"timed out after {self.timeout_s:.0f} s")
        by_slurm = {"OUT_OF_MEMORY": memory, "TIMEOUT": timeout, "DEADLINE": timeout}.get(task.state)
        if found is None:
            if by_slurm is None and shutil.disk_usage(self.folder).free < MIN_FREE_MB * 2**20:
                raise OSError(errno.ENOSPC, f"the shared folder {self.shared} is full (the element {self.job_id}_"
                                            f"{task.index} ended {task.state} without a result)")
            if by_slurm is None:
                raise SlurmError(f"Slurm job {self.job_id}_{task.index} ended {task.state or 'unseen'}"
                                 f"{' on ' + task.node if task.node else ''} without a result"
                                 f"{' (' + task.reason + ')' if task.reason not in ('', 'None') else ''}; its "
                                 f"output: {task.folder / 'slurm.out'}")
            status, reason = by_slurm
            run = sandbox.RunResult(status=status, reason=reason, seconds=self.timeout_s if status == "timeout" else 0.0,
                                    notebook=None, isolation="Slurm ended the job before its runner reported")
            return run, {}
        run, facts, _ = found
        if by_slurm is not None and run.status not in ("memory", "timeout"):
            run.status, run.reason = by_slurm
        return run, facts

    # --------------------------------------------------------------------------- stopping

    def cancel(self) -> None:
        """scancel the array (whatever of it has not ended); wake every waiting thread."""
        self.cancelled.set()
        if self.job_id and not all(t.ended.is_set() for t in self.tasks.values()):
            self._run("scancel", self.job_id)
            self.log(f"cancelled Slurm job array {self.job_id}")

    def close(self) -> None:
        if self.job_id and not all(t.ended.is_set() for t in self.tasks.values()):
            self.cancel()
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        if getattr(self, "folder", None) is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
