"""The grader works from any checkout: under /tmp (which every run replaces with a private one),
at a path with spaces, and through a linked folder (a home that is a link elsewhere)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import isolation

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

# Runs a notebook in the sandbox with the grader of the checkout it is started from.
GRADE_ONE = r"""
import json, sys
from pathlib import Path
checkout = Path(sys.argv[1])
sys.path.insert(0, str(checkout))
import nbformat
from autograder import isolation, sandbox
assert isolation.REPO_ROOT == checkout.resolve(), (isolation.REPO_ROOT, checkout)
runs = Path(sys.argv[2]) / "runs"
runs.mkdir(parents=True)
work = isolation.RunFolder(runs / "work")
notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                             "display_name": "Python 3"}})
notebook.cells = [nbformat.v4.new_code_cell("import sys, mgpu, autograder\nprint('course at', mgpu.__file__)\n"
                                            "print('python', sys.executable)")]
nbformat.write(notebook, work.nb / "submission.ipynb")
try:
    run = sandbox.run_notebook(work, "submission.ipynb", {}, keep=runs / "kept", timeout_s=300,
                               memory_limit_mb=4000, work_parent=runs)
finally:
    work.remove()
text = "".join(o.get("text", "") for c in nbformat.reads(run.notebook, as_version=4).cells
               for o in c.get("outputs", [])) if run.notebook else ""
print(json.dumps({"status": run.status, "reason": run.reason, "isolation": run.isolation, "text": text}))
"""


def _grade_one(python: str, checkout: Path, work: Path) -> dict:
    done = subprocess.run([python, "-c", GRADE_ONE, str(checkout), str(work)], cwd=work.parent,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture()
def isolated():
    available, why = isolation.isolation_available()
    if not available:
        pytest.skip(why)


def test_a_checkout_under_tmp_with_spaces_in_its_path_grades(tmp_path, isolated):
    assert Path(tmp_path).resolve().is_relative_to("/tmp"), "pytest's tmp_path is expected under /tmp"
    checkout = tmp_path / "my courses" / "deep learning on 2 GPUs"
    checkout.mkdir(parents=True)
    for name in ("mgpu", "autograder"):
        shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    run = _grade_one(sys.executable, checkout, tmp_path / "grading here")
    assert run["status"] == "ok" and run["isolation"] == "", run
    assert f"course at {checkout / 'mgpu' / '__init__.py'}" in run["text"], run


def test_a_checkout_reached_through_a_link_grades(tmp_path, isolated):
    """The grader started as ``LINK/.venv/bin/python`` where LINK (here under /tmp, hidden from runs)
    links to the checkout: runs start Python at its real path."""
    link = tmp_path / "home link"
    link.symlink_to(ROOT)
    python = link / Path(sys.executable).relative_to(ROOT) if Path(sys.executable).is_relative_to(ROOT) else None
    if python is None or not python.exists():
        pytest.skip("the interpreter is not inside the checkout")
    run = _grade_one(str(python), link, tmp_path / "work")
    assert run["status"] == "ok" and run["isolation"] == "", run
    assert f"course at {ROOT / 'mgpu' / '__init__.py'}" in run["text"], run
    assert f"python {Path(sys.executable).parent.resolve()}" in run["text"], run
