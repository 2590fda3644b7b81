"""The learner's copies of the labs: each notebook with its exercise solutions removed, by nbgrader.

``notebooks/`` holds the sources: every exercise's solution sits between ``### BEGIN SOLUTION``
and ``### END SOLUTION`` so that ``make course`` and the tests run the whole lesson. A learner
works in ``lab/`` instead (``make lab`` opens it), where each notebook is the source passed
through :data:`RELEASE_STEPS`, nbgrader's own preprocessors, in order:

- ``check metadata``: every exercise cell's nbgrader metadata is valid (``CheckCellMetadata``);
- ``clear solutions``: the code between the markers becomes ``raise NotImplementedError()``,
  the markdown answers become "YOUR ANSWER HERE" (``ClearSolutions``);
- ``clear outputs``: no output of the author's run is left (``ClearOutput``).

The test cell after each exercise stays: running it is how the learner checks the answer.

A learner's copy is written only when it is missing, so ``make lab`` never overwrites work;
``python -m mgpu.runtime.labs --fresh 02`` starts notebook 02 again (the old copy is kept in
``lab/.previous/``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, ClearSolutions

from mgpu.runtime import course, paths

LAB_DIR = paths.ROOT / "lab"

#: The release, as a declared list of named nbgrader steps.
RELEASE_STEPS = [
    ("check metadata", CheckCellMetadata),
    ("clear solutions", ClearSolutions),
    ("clear outputs", ClearOutput),
]


def release(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The learner's version of one source notebook (a new object; the source is not changed)."""
    released = nbformat.from_dict(notebook)
    resources: dict = {}
    for _, step in RELEASE_STEPS:
        released, resources = step().preprocess(released, resources)
    return released


def cell_sources(number: str) -> tuple[dict[str, str], dict[str, str]]:
    """The nbgrader cells of notebook ``number`` ("09") by grade id: their sources in ``notebooks/``
    (solutions in) and in the learner's copy (:func:`release`). For the tests, which run an
    exercise's solution, stub or wrong answer and then its test cell as the notebook does."""
    path = next(p for p in course.course_notebooks() if p.name.startswith(f"{number}_"))
    notebook = nbformat.read(path, as_version=4)
    by_id = lambda cells: {c.metadata["nbgrader"]["grade_id"]: c.source for c in cells if "nbgrader" in c.metadata}
    return by_id(notebook.cells), by_id(release(notebook).cells)


def exercises(notebook: nbformat.NotebookNode) -> list[str]:
    """The grade ids of a notebook's exercise cells (those the learner writes)."""
    return [c.metadata["nbgrader"]["grade_id"] for c in notebook.cells
            if c.metadata.get("nbgrader", {}).get("solution")]


def write_lab(lab_dir: Path = LAB_DIR, fresh: list[str] = (), notebooks: list[Path] | None = None,
              out=sys.stdout) -> list[Path]:
    """Write the learner's copy of every lab that is missing in ``lab_dir``; returns those written.

    ``fresh`` names notebooks (by number, e.g. ``"02"``) to write again; the learner's copy is
    moved to ``lab_dir/.previous/<name>.<time>.ipynb`` first.
    """
    sources = notebooks if notebooks is not None else course.course_notebooks()
    numbers = {p.name[:2] for p in sources}
    unknown = sorted(set(fresh) - numbers)
    if unknown:
        raise ValueError(f"no notebook numbered {', '.join(unknown)}: choose from {', '.join(sorted(numbers))}")
    lab_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources:
        target = lab_dir / source.name
        if target.exists() and source.name[:2] in fresh:
            previous = lab_dir / ".previous"
            previous.mkdir(exist_ok=True)
            kept = previous / f"{source.stem}.{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
            shutil.move(target, kept)
            print(f"{source.stem}: your copy is kept as {kept.relative_to(lab_dir)}", file=out)
        if target.exists():
            continue
        released = release(nbformat.read(source, as_version=4))
        partial = target.with_suffix(".ipynb.partial")
        nbformat.write(released, partial)
        partial.replace(target)
        count = len(exercises(released))
        print(f"{source.stem}: written to {target.relative_to(lab_dir.parent)} ({count} exercise cell(s) to fill in)",
              file=out)
        written.append(target)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", nargs="*", default=[], metavar="NN",
                        help="write these notebooks again (your copy is kept in lab/.previous/)")
    parser.add_argument("--lab-dir", type=Path, default=LAB_DIR)
    options = parser.parse_args(argv)
    try:
        write_lab(options.lab_dir, fresh=options.fresh)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
