"""Every notebook runs headless with papermill in its smoke setting, and git holds no outputs."""

import json
import subprocess
from pathlib import Path

import nbformat
import papermill
import pytest

from mgpu.runtime import course

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = course.course_notebooks()


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


def _tracked_notebooks():
    listed = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / p for p in listed.stdout.split()]


def test_notebooks_in_git_carry_no_outputs():
    dirty = []
    for path in _tracked_notebooks():
        notebook = nbformat.read(path, as_version=4)
        if any(c.cell_type == "code" and (c.outputs or c.execution_count) for c in notebook.cells):
            dirty.append(path.name)
    assert dirty == [], f"strip the outputs of: {dirty}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_smoke_and_seed_parameters(notebook):
    parameters = papermill.inspect_notebook(str(notebook))
    assert parameters["smoke"]["inferred_type_name"] == "bool"
    assert parameters["seed"]["inferred_type_name"] == "int"


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode_and_writes_its_results(notebook, tmp_path, monkeypatch):
    monkeypatch.setenv("MGPU_BUILD_DIR", str(tmp_path))
    # A seed other than the default: a notebook's checks must hold for any seed.
    executed = course.run_notebook(notebook, smoke=True, seed=7, progress=False)
    assert executed.exists()
    record = json.loads((tmp_path / "results" / f"{notebook.stem}.json").read_text())
    assert record["smoke"] is True and record["seed"] == 7
    assert "dataset_fingerprint" in record
