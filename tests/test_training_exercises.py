"""The exercises that train: notebook 04's conversion of a training script to Horovod and
notebook 05's recipe. The learner's copy hides the solutions, and the tests reject wrong answers.

The graded test cell of notebook 04's exercise 2 is run, as nbgrader would run it, against the
reference solution (the script its ``%%writefile`` cell writes) and against two incomplete
conversions taken from it.
"""

import json
import re
import shutil
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbgrader.preprocessors import ClearSolutions

from mgpu.runtime import launch

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _notebooks():
    return [nbformat.read(NOTEBOOKS / name, as_version=4) for name in ("04_horovod.ipynb", "05_accuracy_at_scale.ipynb")]


def _by_id(notebooks):
    return {c.metadata["nbgrader"]["grade_id"]: c for nb in notebooks for c in nb.cells if "nbgrader" in c.metadata}


def _cells():
    """Both notebooks' nbgrader cells, by grade id (the ids are unique across the course)."""
    return None, _by_id(_notebooks())


def test_exercise_cells_are_graded_and_locked():
    _, cells = _cells()
    assert {"choose_lr_solution", "choose_lr_valid", "choose_lr_outcome",
            "horovod_steps_solution", "horovod_steps_tests"} <= set(cells)
    for grade_id, cell in cells.items():
        meta = cell.metadata["nbgrader"]
        if grade_id.endswith("_solution"):
            assert meta["solution"] and not meta["grade"]
        else:
            assert meta["grade"] and meta["locked"] and meta["points"] > 0


def test_release_version_has_no_solution_code():
    released = [ClearSolutions().preprocess(notebook, {})[0] for notebook in _notebooks()]
    cells = _by_id(released)
    student = cells["horovod_steps_solution"].source
    for answer in ("hvd.init()", "hvd.DistributedOptimizer", "BroadcastGlobalVariablesCallback", "[rank::size]"):
        assert answer not in student, answer
    assert student.count("raise NotImplementedError()") == 3
    # The learner starts from the converted script's momentum (none) and writes the schedule.
    chosen = cells["choose_lr_solution"].source
    assert "your_momentum = 0.0  #" in chosen and "def your_learning_rate(epoch):" in chosen
    assert "math.cos" not in chosen and "your_momentum = 0.9" not in chosen
    assert "BEGIN SOLUTION" not in "".join(c.source for nb in released for c in nb.cells)


def _without_block(source: str, index: int) -> str:
    """The solution with its ``index``-th solution block replaced by ``pass``."""
    blocks = list(re.finditer(r"( *)### BEGIN SOLUTION\n.*?### END SOLUTION\n", source, re.S))
    block = blocks[index]
    return source[:block.start()] + f"{block.group(1)}pass\n" + source[block.end():]


def _run_test_cell(solution_source: str, lab_dir: Path):
    """What the notebook does: the ``%%writefile`` cell saves the script, then the test cell runs."""
    _, cells = _cells()
    magic, script = solution_source.split("\n", 1)
    assert magic == "%%writefile {lab_dir}/my_train.py"
    lab_dir.mkdir(parents=True, exist_ok=True)
    (lab_dir / "my_train.py").write_text(script)

    def fresh(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return folder

    namespace = {"__name__": "notebook04_exercise", "launch": launch, "np": np, "json": json, "seed": 0,
                 "cores": launch.available_cores(), "lab_dir": lab_dir, "fresh": fresh}
    exec(compile(cells["horovod_steps_tests"].source, "tests", "exec"), namespace)


@pytest.mark.slow
def test_horovod_steps_tests_pass_the_solution_and_reject_incomplete_conversions(tmp_path):
    _, cells = _cells()
    solution = cells["horovod_steps_solution"].source
    _run_test_cell(solution, tmp_path / "lab")
    # No sharding: each rank reads all the data.
    with pytest.raises(AssertionError, match="each rank should read its own half"):
        _run_test_cell(_without_block(solution, 1), tmp_path / "lab")
    # No DistributedOptimizer and no broadcast: the ranks train apart.
    with pytest.raises(AssertionError, match="broadcast the initial weights"):
        _run_test_cell(_without_block(solution, 2), tmp_path / "lab")
    # No Horovod at all: the script cannot run, and the learner sees its error.
    with pytest.raises(AssertionError, match="did not run on 2 workers"):
        _run_test_cell(_without_block(solution, 0), tmp_path / "lab")
