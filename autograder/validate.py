"""Checks on a submitted notebook before anything of it runs: size, format, the assignment's cells.

:func:`load_submission` returns the notebook, or raises :class:`InvalidSubmission` whose message
is one line telling the student what to do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat

#: Largest notebook file accepted (the released notebook is ~12 kB; outputs can add some).
MAX_NOTEBOOK_BYTES = 5 * 1024 * 1024


class InvalidSubmission(ValueError):
    """The submission cannot be run; the message says why and what to do."""


def load_submission(path: Path, required_cells: dict) -> "nbformat.NotebookNode":
    """Read and check ``path``; ``required_cells`` maps grade_id -> info (every one must be present).

    The file is read as hostile data: a link, a fifo, a folder or a device is refused without being
    followed or opened for reading, and no more than :data:`MAX_NOTEBOOK_BYTES` are read.
    """
    from autograder import safe_read

    path = Path(path)
    if not os.path.lexists(path):
        raise InvalidSubmission(f"no notebook {path.name} in the submission: submit the released notebook")
    try:
        data = safe_read.read_path(path, MAX_NOTEBOOK_BYTES, fix="submit the notebook file itself")
    except safe_read.Rejected as error:
        if "larger than" in str(error):
            size = os.lstat(path).st_size
            raise InvalidSubmission(f"notebook is {size / 2**20:.1f} MB, more than the "
                                    f"{MAX_NOTEBOOK_BYTES / 2**20:.0f} MB limit: clear its outputs and submit "
                                    "again") from None
        raise InvalidSubmission(str(error)) from None
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise InvalidSubmission(f"not a well-formed notebook (invalid JSON: {error}): submit the .ipynb "
                                "file as Jupyter saved it") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise InvalidSubmission("not a notebook (no cells): submit the .ipynb file as Jupyter saved it")
    try:
        notebook = nbformat.reads(json.dumps(raw), as_version=4)
        nbformat.validate(notebook)
    except Exception as error:  # nbformat raises several types for malformed notebooks
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InvalidSubmission(f"not a valid notebook ({first[:200]}): submit the file as Jupyter saved it") from None
    for index, cell in enumerate(notebook.cells, 1):
        if "nbgrader" not in cell.metadata:
            continue
        info = cell.metadata["nbgrader"]
        if not isinstance(info, dict):
            raise InvalidSubmission(f"cell {index}'s nbgrader metadata is not a mapping "
                                    f"({type(info).__name__}): start again from the released notebook")
        grade_id = info.get("grade_id")
        if grade_id is not None and not isinstance(grade_id, str):
            raise InvalidSubmission(f"cell {index}'s nbgrader grade_id is not a string "
                                    f"({type(grade_id).__name__}): start again from the released notebook")
    language = notebook.metadata.get("kernelspec", {}).get("language", "python")
    if language != "python":
        raise InvalidSubmission(f"the notebook's kernel is {language!r}, not Python: use the released notebook")
    present = {c.metadata.get("nbgrader", {}).get("grade_id") for c in notebook.cells}
    missing = [grade_id for grade_id in required_cells if grade_id not in present]
    if missing:
        raise InvalidSubmission(f"cells missing from the notebook: {', '.join(missing)}: start again from the "
                                "released notebook and keep every cell")
    return notebook
