"""Colab: every notebook has the badge and the pinned first cell, the pin names the library in this
checkout, the cell does nothing outside Colab, and the setup keeps Colab's own TensorFlow."""

import subprocess
from pathlib import Path

import nbformat
import pytest

from mgpu.runtime import colab, course, paths

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = course.course_notebooks()


def _first_code_cell(path):
    notebook = nbformat.read(path, as_version=4)
    return notebook, next(c for c in notebook.cells if c.cell_type == "code")


def _pins():
    return {path.name: colab.pinned_commit(_first_code_cell(path)[1].source)
            for path in [*NOTEBOOKS, *colab.ASSESSMENTS]}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_opens_with_its_badge_and_the_colab_cell(notebook):
    parsed, cell = _first_code_cell(notebook)
    assert colab.badge(notebook.name) in parsed.cells[0].source
    commit = colab.pinned_commit(cell.source)
    assert commit is not None and cell.source == colab.first_cell(commit), \
        "the first code cell is not the Colab cell: run `python -m mgpu.runtime.colab pin`"
    readme = (ROOT / "README.md").read_text()
    assert f"| `{notebook.stem}` {colab.badge(notebook.name)} |" in readme


@pytest.mark.parametrize("assessment", colab.ASSESSMENTS, ids=lambda p: p.stem)
def test_each_assessment_opens_with_the_colab_cell_for_practice_on_colab(assessment):
    _, cell = _first_code_cell(assessment)
    assert cell.source == colab.first_cell(colab.pinned_commit(cell.source) or "")
    assert cell.metadata["nbgrader"]["locked"] and cell.metadata["nbgrader"]["grade_id"] == "colab"


def test_all_notebooks_pin_one_commit_whose_library_is_this_checkout():
    pins = set(_pins().values())
    assert len(pins) == 1, f"the notebooks pin different commits: {_pins()}"
    commit = pins.pop()
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    assert known.returncode == 0, f"the pinned commit {commit[:12]} is not in this repository"
    changed = subprocess.run(["git", "diff", "--name-only", commit, "--", *colab.LIBRARY], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert changed == [], (f"Colab would run the library of {commit[:12]}, which differs here in {changed}: "
                           "commit, then run `python -m mgpu.runtime.colab pin` and commit the notebooks")


def test_outside_colab_the_cell_does_nothing(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    namespace = {}
    exec(colab.first_cell("0" * 40), namespace)
    assert calls == [] and "course" not in namespace


def test_colabs_own_tensorflow_is_kept_and_only_a_matching_tf_keras_is_added(monkeypatch):
    versions = {"tf_keras": "2.20.1"}
    monkeypatch.setattr(colab, "_installed", lambda dist: versions.get(dist))
    assert colab.keras_2_requirement("2.20.0") is None  # Colab's image as published: nothing to add
    assert colab.keras_2_requirement("2.21.0") == "tf_keras~=2.21.0"  # a newer image: its own tf_keras
    versions.clear()
    assert colab.keras_2_requirement("2.20.0") == "tf_keras~=2.20.0"
    with pytest.raises(colab.ColabSetupError, match="2.16 or later"):
        colab.keras_2_requirement("2.15.1")


def test_only_what_colab_lacks_is_installed(tmp_path, monkeypatch):
    (tmp_path / "requirements-current.txt").write_text(
        "# comment\ntensorflow==2.20.0\ntf_keras==2.20.1\nnumpy==2.1.3\nhorovod==0.28.1\n"
        "nbgrader==0.9.6\npapermill==2.7.0  # runs notebooks\ncloudpickle==3.0.0\n")
    installed = {"tensorflow": "2.19.0", "numpy": "2.0.2", "papermill": "2.7.0", "cloudpickle": "2.2.1"}
    monkeypatch.setattr(colab, "_installed", lambda dist: installed.get(dist))
    assert colab.missing_requirements(tmp_path) == ["nbgrader==0.9.6", "cloudpickle==3.0.0"]


def test_setup_reinstalls_the_course_when_new_processes_would_import_another_checkout(tmp_path):
    # The venv's editable install is this checkout; a course folder elsewhere (a new Colab session's
    # clone, say) is not what a new process imports, so setup must install it.
    assert colab._imports_from(paths.ROOT)
    assert not colab._imports_from(tmp_path)
