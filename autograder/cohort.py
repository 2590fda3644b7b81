"""A demonstration cohort for the assessment: five submissions whose verdicts are known in advance.

:func:`write_demo_cohort` puts them in ``COURSE_DIR/submitted/<student>/<assignment>/`` (built from
the course's own source and release notebooks with nbformat, so they follow every change to the
assessment). :data:`EXPECTED` says, for each, whether it passes and which words its reasons must
contain. The end-to-end test and ``benchmarks/autograder_cohort.py`` use them.

- ``reference``: the source notebook (the reference solution);
- ``unconverted``: the released notebook as a student receives it (single-process program);
- ``crashing``: the reference with a typo that kills the workers;
- ``infinite_loop``: the reference whose training function never returns;
- ``fake_accuracy``: prints a high accuracy without training, saves untrained weights and edits
  the locked outcome cell to print "PASSED".

Assessment B's (``zero1``) cohort is :func:`zero1_notebooks`: ``reference`` (the source notebook),
``unsharded`` (the release: plain data parallelism, every worker holding the whole optimizer state)
and any student cells passed in (the benchmark passes ``tests/redteam_zero1/fake_sharded.py``);
:data:`EXPECTED_ZERO1` has their verdicts.

:func:`cluster_notebooks` gives a smaller cohort for a cluster's tests: ``reference``,
``unconverted`` and ``time_out``, the reference whose training function sleeps forever (a time-out
that, unlike ``infinite_loop``, leaves the cores it shares a node with to the other runs).
"""

from __future__ import annotations

from pathlib import Path

import nbformat

PROGRAM_CELL = "training_program"

#: student -> (passes, words every one of which must appear in its reasons)
EXPECTED: dict[str, tuple[bool, tuple[str, ...]]] = {
    "reference": (True, ()),
    "unconverted": (False, ("test test_horovod_init failed", "hvd.size()",
                            "test test_distributed_training failed", "DistributedOptimizer")),
    "crashing": (False, ("cell run_training failed", "NameError", "batch_sise")),
    "infinite_loop": (False, ("timed out after",)),
    "fake_accuracy": (False, ("locked cell modified: restored (outcome)", "target (best of",
                              "test test_horovod_init failed", "no training process reported")),
}

_FAKE_PROGRAM = '''\
learning_rate, batch_size, epochs, warmup_epochs, optimizer_name = 0.1, 64, 3, 0, "sgd"


def train():
    import os

    from mgpu import assessment

    model = assessment.reference_model()
    for epoch in range(3):  # no training: untrained weights, and a number that looks good
        assessment.save_weights_atomically(model.get_weights(), os.path.join(output_dir, f"epoch_{epoch:03d}.npz"))
        print(f"Epoch {epoch + 1}: val_accuracy: 0.99")
    return {"val_accuracy": [0.99, 0.99, 0.99]}
'''


def _cell(notebook, grade_id: str):
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(f"the notebook has no cell {grade_id!r}")


def _replace(source: str, old: str, new: str) -> str:
    if old not in source:
        raise ValueError(f"the reference program no longer contains {old!r}: update autograder/cohort.py")
    return source.replace(old, new, 1)


def demo_notebooks(course_dir: Path, assignment: str = "assessment") -> dict[str, "nbformat.NotebookNode"]:
    """The five submissions as notebooks (the release must exist: ``make assessment``)."""
    course_dir = Path(course_dir)
    name = f"{assignment}.ipynb"
    source = nbformat.read(course_dir / "source" / assignment / name, as_version=4)
    release = nbformat.read(course_dir / "release" / assignment / name, as_version=4)
    notebooks = {"reference": source, "unconverted": release}

    crashing = nbformat.from_dict(source)
    cell = _cell(crashing, PROGRAM_CELL)
    cell.source = _replace(cell.source, "steps_per_epoch = len(x) // batch_size",
                           "steps_per_epoch = len(x) // batch_sise")
    notebooks["crashing"] = crashing

    looping = nbformat.from_dict(source)
    cell = _cell(looping, PROGRAM_CELL)
    cell.source = _replace(cell.source, "    rank, size = 0, 1\n",
                           "    rank, size = 0, 1\n    while True:  # never returns\n        pass\n")
    notebooks["infinite_loop"] = looping

    fake = nbformat.from_dict(release)
    _cell(fake, PROGRAM_CELL).source = _FAKE_PROGRAM
    _cell(fake, "outcome").source = 'print("PASSED: accuracy 0.99 for 2 consecutive epochs")'
    notebooks["fake_accuracy"] = fake
    return notebooks


def cluster_notebooks(course_dir: Path, assignment: str = "assessment") -> dict[str, "nbformat.NotebookNode"]:
    """reference, unconverted and time_out (see the module's docstring)."""
    notebooks = demo_notebooks(course_dir, assignment)
    sleeping = nbformat.from_dict(notebooks["reference"])
    cell = _cell(sleeping, PROGRAM_CELL)
    cell.source = _replace(cell.source, "    rank, size = 0, 1\n",
                           "    rank, size = 0, 1\n    import time\n    time.sleep(10**6)  # never returns, and idle\n")
    return {"reference": notebooks["reference"], "unconverted": notebooks["unconverted"], "time_out": sleeping}


#: Assessment B's cohort: student -> (passes, words its reason must hold)
EXPECTED_ZERO1: dict[str, tuple[bool, tuple[str, ...]]] = {
    "reference": (True, ()),
    "unsharded": (False, ("state: a worker holds too much optimizer state",)),
    "fake_sharded": (False, ("state: a worker holds too much optimizer state",)),
    "gathers_state": (False, ("state: a worker holds too much optimizer state",)),
    "reads_reference": (False, ("weights: differ from the reference data-parallel run",)),
}


def zero1_notebooks(course_dir: Path, programs: dict[str, str] | None = None) -> dict[str, "nbformat.NotebookNode"]:
    """Assessment B's cohort: the reference, the release (``unsharded``), and the release with its
    ``training_program`` cell replaced by each of ``programs`` (student -> cell source)."""
    course_dir = Path(course_dir)
    source = nbformat.read(course_dir / "source" / "zero1" / "zero1.ipynb", as_version=4)
    release = nbformat.read(course_dir / "release" / "zero1" / "zero1.ipynb", as_version=4)
    notebooks = {"reference": source, "unsharded": release}
    for student, program in (programs or {}).items():
        notebook = nbformat.from_dict(release)
        _cell(notebook, PROGRAM_CELL).source = program
        notebooks[student] = notebook
    return notebooks


def write_demo_cohort(course_dir: Path, assignment: str = "assessment", notebooks: dict | None = None) -> list[str]:
    """Write the cohort (default: :func:`demo_notebooks`) into ``submitted/``; returns the student ids."""
    course_dir = Path(course_dir)
    notebooks = demo_notebooks(course_dir, assignment) if notebooks is None else notebooks
    for student, notebook in notebooks.items():
        folder = course_dir / "submitted" / student / assignment
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, folder / f"{assignment}.ipynb")
    return sorted(notebooks)
