"""The code a lesson teaches exists once: the notebook's ``#@save`` cells are the library's
``mgpu/lessonNN/saved.py`` (mgpu.runtime.saved), and the library re-exports them."""

import importlib.util
import json

import pytest

from mgpu.runtime import saved


def test_the_saved_modules_are_what_the_notebooks_give():
    assert saved.stale() == [], "a saved module differs from its notebook: run python -m mgpu.runtime.saved"


def test_the_library_uses_the_notebooks_definitions():
    from mgpu.lesson02 import batch_study, saved as saved02
    from mgpu.lesson07 import compression, saved as saved07

    assert batch_study.scaled_lr is saved02.scaled_lr
    assert compression.twobit_quantise is saved07.twobit_quantise
    assert compression.twobit_allreduce is saved07.twobit_allreduce


def test_the_library_ring_is_the_notebooks_behind_a_check_of_its_inputs(monkeypatch):
    import numpy as np

    from mgpu.lesson04 import allreduce, saved as saved04

    calls = []
    monkeypatch.setattr(saved04, "ring_allreduce", lambda inputs: calls.append(len(inputs)) or ([], None))
    allreduce.ring_allreduce([np.zeros(4), np.zeros(4)])
    assert calls == [2]
    with pytest.raises(ValueError, match="same shape"):
        allreduce.ring_allreduce([np.zeros(3), np.zeros(4)])


def _course(tmp_path, cells):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "mgpu" / "lesson05").mkdir(parents=True)
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
                          for s in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks" / "05_demo.ipynb").write_text(json.dumps(notebook))
    return tmp_path


def test_a_saved_cell_keeps_its_solution_and_drops_the_markers(tmp_path):
    root = _course(tmp_path, ["x = 1  # not saved",
                              "#@save\nimport math\n\n\ndef twice(v):\n    ### BEGIN SOLUTION\n    return 2 * v\n    ### END SOLUTION",
                              "#@save\ndef root(v):\n    return math.sqrt(v)"])
    assert saved.stale(root) == [root / "mgpu" / "lesson05" / "saved.py"]
    assert saved.write(root) == [root / "mgpu" / "lesson05" / "saved.py"]
    text = (root / "mgpu" / "lesson05" / "saved.py").read_text()
    assert "SOLUTION" not in text and "x = 1" not in text and "#@save" not in text
    spec = importlib.util.spec_from_file_location("saved05", root / "mgpu" / "lesson05" / "saved.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.twice(3) == 6 and module.root(9) == 3
    assert saved.stale(root) == [] and saved.write(root) == []
    # Editing the notebook makes the saved module stale until it is written again.
    notebook = json.loads((root / "notebooks" / "05_demo.ipynb").read_text())
    notebook["cells"][1]["source"] = notebook["cells"][1]["source"].replace("2 * v", "v + v")
    (root / "notebooks" / "05_demo.ipynb").write_text(json.dumps(notebook))
    assert saved.stale(root) == [root / "mgpu" / "lesson05" / "saved.py"]


def test_a_saved_cell_cannot_hold_magics(tmp_path):
    root = _course(tmp_path, ["#@save\n%%writefile x.py\nprint(1)"])
    with pytest.raises(ValueError, match="cannot hold notebook magics"):
        saved.targets(root)
