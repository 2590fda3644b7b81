"""Notebook 05's nbgrader exercises: the release hides the solutions, and the tests reject wrong answers.

The graded test cell of "the Horovod steps of a training function" is run, as nbgrader would run
it, against the reference solution and against two incomplete conversions taken from it.
"""

import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbgrader.preprocessors import ClearSolutions

from mgpu import launch

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "05_accuracy_at_scale.ipynb"


def _cells():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    return notebook, {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells if "nbgrader" in c.metadata}


def test_exercise_cells_are_graded_and_locked():
    _, cells = _cells()
    assert set(cells) == {"choose_lr_solution", "choose_lr_valid", "choose_lr_outcome",
                          "horovod_steps_solution", "horovod_steps_tests"}
    for grade_id, cell in cells.items():
        meta = cell.metadata["nbgrader"]
        if grade_id.endswith("_solution"):
            assert meta["solution"] and not meta["grade"]
        else:
            assert meta["grade"] and meta["locked"] and meta["points"] > 0


def test_release_version_has_no_solution_code():
    notebook, _ = _cells()
    released, _ = ClearSolutions().preprocess(notebook, {})
    cells = {c.metadata["nbgrader"]["grade_id"]: c for c in released.cells if "nbgrader" in c.metadata}
    student = cells["horovod_steps_solution"].source
    for answer in ("hvd.init()", "hvd.DistributedOptimizer", "BroadcastGlobalVariablesCallback", "[rank::size]"):
        assert answer not in student, answer
    assert student.count("raise NotImplementedError()") == 3
    assert "your_lr =" not in cells["choose_lr_solution"].source
    assert "BEGIN SOLUTION" not in "".join(c.source for c in released.cells)


def _without_block(source: str, index: int) -> str:
    """The solution with its ``index``-th solution block replaced by ``pass``."""
    blocks = list(re.finditer(r"( *)### BEGIN SOLUTION\n.*?### END SOLUTION\n", source, re.S))
    block = blocks[index]
    return source[:block.start()] + f"{block.group(1)}pass\n" + source[block.end():]


def _run_test_cell(solution_source: str):
    _, cells = _cells()
    namespace = {"__name__": "notebook05_exercise", "launch": launch, "np": np, "seed": 0}
    exec(compile(solution_source, "solution", "exec"), namespace)
    exec(compile(cells["horovod_steps_tests"].source, "tests", "exec"), namespace)


@pytest.mark.slow
def test_horovod_steps_tests_pass_the_solution_and_reject_incomplete_conversions():
    _, cells = _cells()
    solution = cells["horovod_steps_solution"].source
    _run_test_cell(solution)
    # No sharding: each rank reads all the data.
    with pytest.raises(AssertionError, match="each rank should read its own half"):
        _run_test_cell(_without_block(solution, 1))
    # No DistributedOptimizer and no broadcast: the ranks train apart.
    with pytest.raises(AssertionError, match="broadcast the initial weights"):
        _run_test_cell(_without_block(solution, 2))
