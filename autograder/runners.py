"""The grader's pluggable *run* step: where a submission's notebook runs.

The grader (:mod:`autograder.grade`) takes every submission through the same named steps; only
the run step differs between backends, and every runner ends it the same way, with the
submission's :class:`autograder.sandbox.RunResult` (its epoch files copied into a folder of the
grader's) and the facts files the run left, read as the sandbox reads them:

- :class:`LocalRunner` (the default) runs the notebook on this machine, in the sandbox
  (:func:`autograder.sandbox.run_notebook`), several at once when the machine has the cores;
- :class:`autograder.slurm.SlurmRunner` runs it as an element of a Slurm job array, through a folder
  the cluster's nodes share, where the same sandbox runs it on the node
  (:mod:`autograder.node_run`).

A runner never sees the grader. It is used in this order: :meth:`open` once with the
:class:`Cohort` (what every run shares: data, limits, workers, what to hide), :meth:`prepare` per
submission with its :class:`RunSpec` (the rebuilt notebook, its images, papermill's parameters) in
the grader's thread (a batch runner stages it), :meth:`launch` once with every prepared submission
(a batch runner submits them together), :meth:`run` per submission (in a worker thread: it returns
a :class:`RunOutput` when that run has ended), :meth:`cancel` when the grader is stopped, and
:meth:`close` always.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat
import numpy as np

from autograder import isolation, safe_read, sandbox

#: The facts files the workers write (``facts-<pid>.json``), and the largest one read (a real one
#: is about 200 bytes).
FACTS_PATTERN = r"facts-\d+\.json"
MAX_FACTS_BYTES = 64 * 1024


@dataclass(frozen=True, eq=False)
class Cohort:
    """What every run of one grading shares; a runner's :meth:`open` gets it (never the grader)."""

    course_root: Path        # the course (a batch runner names its jobs after it)
    notebook_name: str       # the notebook's file name in a run, e.g. assessment.ipynb
    data_template: Path      # the cohort's data folder (training and validation images), in the grader's work folder
    profile: object          # the :class:`mgpu.assessment.Profile` graded on (its name and workers)
    timeout_s: float         # the run is killed after this (the grader's clock)
    memory_limit_mb: float   # resident memory of the run's whole process tree
    hidden: tuple = ()       # folders the run must not see (the course, the data cache)
    isolate: bool = True     # namespaces and the unprivileged user (off only for debugging)

    @property
    def workers(self) -> int:
        return self.profile.workers


@dataclass(frozen=True, eq=False)
class RunSpec:
    """What to run for one submission; a runner's :meth:`prepare` and :meth:`run` get it."""

    cohort: Cohort
    student: str
    tag: str                 # its work folders' name (unique per grading run)
    notebook: object         # the grader's notebook, rebuilt from the release (nbformat)
    kept_images: np.ndarray  # the training images it gets, in its order (:meth:`CohortGrader.kept_images`)
    parameters: dict         # papermill's, ``data_dir`` and ``output_dir`` empty (:meth:`parameters_in`)
    #: the files of the run's output its outcome reads besides the epoch files: (name regex, most bytes
    #: per file), or None (:func:`copy_evidence`)
    evidence: tuple | None = None

    def parameters_in(self, data_dir, output_dir) -> dict:
        """papermill's parameters for a run whose data and output folders are these."""
        return dict(self.parameters, data_dir=str(data_dir), output_dir=str(output_dir))


@dataclass(frozen=True, eq=False)
class RunOutput:
    """What a runner's :meth:`run` hands back: the run, its facts files, and where it ran."""

    run: sandbox.RunResult
    facts_files: dict        # the run's facts files as read (bytes, or why refused)
    parameters: dict         # papermill's, as the clean test pass gets them
    cleanup: tuple[Callable[[], None], ...] = ()  # what to remove once the submission is measured, in order
    run_host: str = ""       # the machine it ran on, when not the grader's (a Slurm node)
    slurm_job: str = ""      # its Slurm job array element
    queue_seconds: float = 0.0  # from submitting it to seeing it run (in a cluster's queue)
    evidence_dir: Path | None = None  # the grader's copies of the files ``RunSpec.evidence`` names


#: The most bytes of evidence files kept from one run, all together (as the epoch keeper's cap).
MAX_EVIDENCE_BYTES = 64 * 2**20


def copy_evidence(output: Path, evidence: tuple | None, folder: Path, owner: int | None) -> Path | None:
    """The files of the run's ``output`` that its outcome reads (``evidence``: a regex of their names and
    the most bytes one may have), copied into ``folder`` (the grader's) after the run; None when the
    outcome reads none. Read as hostile data (:func:`autograder.safe_read.read_regular`: no link, a
    regular file, owned by ``owner``, size counted); a file refused, or past :data:`MAX_EVIDENCE_BYTES`
    in all, is left out: the outcome sees only what was copied."""
    if evidence is None:
        return None
    pattern, max_bytes = evidence
    folder.mkdir(parents=True)
    try:
        output_fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return folder
    try:
        total = 0
        for name in sorted(n for n in os.listdir(output_fd) if re.fullmatch(pattern, n)):
            if total >= MAX_EVIDENCE_BYTES:
                break
            try:
                data = safe_read.read_regular(output_fd, name, min(max_bytes, MAX_EVIDENCE_BYTES - total), owner)
            except safe_read.Rejected:
                continue
            (folder / name).write_bytes(data)
            total += len(data)
    finally:
        os.close(output_fd)
    return folder


def write_run_data(template: Path, keep: np.ndarray, folder: Path) -> None:
    """A run's data folder: the cohort's ``template`` with only the training images ``keep`` (their
    order included), as :meth:`autograder.grade.CohortGrader.kept_images` chose them."""
    shutil.copytree(template, folder, dirs_exist_ok=True)
    with np.load(Path(template) / "train.npz", allow_pickle=False) as train:
        x, y = train["x"], train["y"]
    np.savez(Path(folder) / "train.npz", x=x[keep], y=y[keep])


class LocalRunner:
    """Runs each notebook on this machine, in the sandbox, under the profile's limits."""

    name = "local"
    batch = False  # each submission runs as its thread reaches its run step

    def open(self, cohort: Cohort, work_root: Path) -> None:
        self.work_root = work_root

    def prepare(self, spec: RunSpec) -> None:
        """Nothing to stage ahead: the run's own file system is made when it starts (it is memory)."""

    def launch(self, submissions, jobs: int) -> None:
        """Nothing to submit: :meth:`run` starts each run."""

    def run(self, spec: RunSpec) -> RunOutput:
        cohort = spec.cohort
        folder = isolation.RunFolder(self.work_root / spec.tag)
        keep = self.work_root / f"{spec.tag}-kept"  # the grader's: copies of the run's epoch files
        evidence = self.work_root / f"{spec.tag}-evidence"  # the grader's: copies of its outcome's files
        cleanup = (lambda: shutil.rmtree(keep, ignore_errors=True),
                   lambda: shutil.rmtree(evidence, ignore_errors=True), folder.remove)
        try:
            write_run_data(cohort.data_template, spec.kept_images, folder.data)
            nbformat.write(spec.notebook, folder.nb / cohort.notebook_name)
            parameters = spec.parameters_in(folder.data, folder.output)
            run = sandbox.run_notebook(folder, cohort.notebook_name, parameters, keep=keep,
                                       timeout_s=cohort.timeout_s, memory_limit_mb=cohort.memory_limit_mb,
                                       hide=list(cohort.hidden), work_parent=self.work_root, isolate=cohort.isolate)
            facts_files = safe_read.read_outputs(folder.output, FACTS_PATTERN, MAX_FACTS_BYTES, run.worker_uid)
            evidence_dir = copy_evidence(folder.output, spec.evidence, evidence, run.worker_uid)
        except BaseException:
            for remove in cleanup:
                remove()
            raise
        return RunOutput(run, facts_files, parameters, cleanup, evidence_dir=evidence_dir)

    def cancel(self) -> None:
        """Runs in progress die with their threads' sandbox (nothing queued elsewhere)."""

    def close(self) -> None:
        pass
