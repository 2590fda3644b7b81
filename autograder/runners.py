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

A runner is used in this order: :meth:`open` once (the cohort's shared set-up), :meth:`prepare`
per submission in the grader's thread (a batch runner stages it), :meth:`launch` once with every
prepared submission (a batch runner submits them together), :meth:`run` per submission (in a
worker thread: it returns when that run has ended), :meth:`cancel` when the grader is stopped, and
:meth:`close` always.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import numpy as np

from autograder import isolation, safe_read, sandbox

#: The facts files the workers write (``facts-<pid>.json``), and the largest one read (a real one
#: is about 200 bytes).
FACTS_PATTERN = r"facts-\d+\.json"
MAX_FACTS_BYTES = 64 * 1024


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

    def open(self, grader, work_root: Path) -> None:
        self.work_root = work_root

    def prepare(self, grader, submission) -> None:
        """Nothing to stage ahead: the run's own file system is made when it starts (it is memory)."""

    def launch(self, submissions, jobs: int) -> None:
        """Nothing to submit: :meth:`run` starts each run."""

    def run(self, grader, submission) -> None:
        folder = isolation.RunFolder(self.work_root / submission.tag)
        keep = self.work_root / f"{submission.tag}-kept"  # the grader's: copies of the run's epoch files
        submission.cleanup += [folder.remove, lambda: shutil.rmtree(keep, ignore_errors=True)]
        write_run_data(grader.data_template, grader.kept_images(submission.student), folder.data)
        nbformat.write(submission.notebook, folder.nb / grader.notebook_name)
        submission.parameters = grader.run_parameters(folder.data, folder.output)
        run = sandbox.run_notebook(folder, grader.notebook_name, submission.parameters, keep=keep,
                                   timeout_s=grader.timeout_s, memory_limit_mb=grader.profile.memory_limit_mb,
                                   hide=grader.hidden, work_parent=self.work_root, isolate=grader.isolate)
        submission.run = run
        submission.facts_files = safe_read.read_outputs(folder.output, FACTS_PATTERN, MAX_FACTS_BYTES, run.worker_uid)

    def cancel(self) -> None:
        """Runs in progress die with their threads' sandbox (nothing queued elsewhere)."""

    def close(self) -> None:
        pass
