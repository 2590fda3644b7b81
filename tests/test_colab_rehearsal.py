"""A Colab rehearsal: Colab's published image rebuilt as a Python 3.13 environment, the notebooks'
first cell run there as Colab runs it, then notebooks 00 and 04 in their smoke setting and the
assessment in practice mode.

The "image" has what Colab's runtime lists (googlecolab/backend-info, 2026-08): Python 3.13, TensorFlow
2.20.0 with Keras 3.13 and tf_keras 2.20.1, numpy 2.1, matplotlib, pillow and ipykernel; no course
package, no Horovod. Papermill, in the course's own environment, plays Colab's frontend: it starts a
kernel in the image with COLAB_RELEASE_TAG set, and the first cell clones this repository (in place of
GitHub) at the pinned commit, installs what is missing on Colab's own TensorFlow, builds Horovod and
runs its self-test; then the assessment runs in practice mode. Not part of `make test` (it needs
Python 3.13 and minutes): `.ci/run` runs it, then the Horovod-correctness tests and the other smoke
notebooks inside the same image.

    python -m pytest -m colab_rehearsal -s tests/test_colab_rehearsal.py
"""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import papermill
import pytest

from mgpu.runtime import colab, paths

pytestmark = pytest.mark.colab_rehearsal
ROOT = Path(__file__).resolve().parents[1]
#: Colab's image as published, to the version the issue names (the course must not change them).
IMAGE_PACKAGES = ["tensorflow==2.20.0", "tf_keras==2.20.1", "keras==3.13.0", "numpy==2.1.3",
                  "matplotlib==3.10.0", "pillow==11.3.0", "ipykernel==6.29.5", "pytest==8.3.3"]
KERNEL = "colab-rehearsal"


def rehearsal_dir() -> Path:
    return Path(os.environ.get("MGPU_COLAB_REHEARSAL") or paths.build_dir() / "colab-rehearsal")


def python_3_13() -> str:
    candidates = [os.environ.get("MGPU_COLAB_PYTHON"), shutil.which("python3.13"),
                  *sorted(str(p) for p in Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
                          .glob("versions/3.13.*/bin/python3.13"))]
    for candidate in filter(None, candidates):
        ok = subprocess.run([candidate, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 13))"],
                            capture_output=True)
        if ok.returncode == 0:
            return candidate
    raise AssertionError("no Python 3.13 for the Colab rehearsal: install one or set MGPU_COLAB_PYTHON")


def make_image(folder: Path) -> Path:
    """A venv with Colab's image's versions; kept between runs while those versions stay the same."""
    stamp = folder / ".image"
    python = folder / "bin" / "python"
    if stamp.exists() and stamp.read_text() == "\n".join(IMAGE_PACKAGES):
        return python
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([python_3_13(), "-m", "venv", str(folder)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip", "setuptools<76", "wheel"],
                   check=True, capture_output=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *IMAGE_PACKAGES],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    stamp.write_text("\n".join(IMAGE_PACKAGES))
    return python


def _kernelspec(folder: Path, python: Path) -> Path:
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab rehearsal (Python 3.13)", "language": "python"}))
    return folder


def _outputs(notebook: Path, cell_index: int) -> str:
    cell = json.loads(notebook.read_text())["cells"][cell_index]
    text = [o.get("text", "") for o in cell["outputs"]]
    return "".join("".join(t) if isinstance(t, list) else t for t in text)


@pytest.fixture(scope="module")
def colab_runtime(tmp_path_factory):
    """The image, a kernelspec for it, and the environment Colab's kernel would have."""
    started = time.monotonic()
    image = make_image(rehearsal_dir() / "image")
    print(f"\n[rehearsal] image ready in {time.monotonic() - started:.0f} s")
    content = tmp_path_factory.mktemp("content")
    jupyter = _kernelspec(tmp_path_factory.mktemp("jupyter"), image)
    env = {
        "COLAB_RELEASE_TAG": "release-colab-rehearsal",
        "MGPU_COURSE_REPO": str(ROOT),
        "MGPU_COURSE_DIR": str(content / "mgpu-course"),
        "MGPU_WHEEL_CACHE": str(rehearsal_dir() / "wheels"),
        "MGPU_BUILD_DIR": str(content / "build"),
        "JUPYTER_PATH": str(jupyter),
    }
    saved = {k: os.environ.get(k) for k in [*env, "TF_USE_LEGACY_KERAS", "PYTHONPATH", "VIRTUAL_ENV"]}
    for name in ("TF_USE_LEGACY_KERAS", "PYTHONPATH", "VIRTUAL_ENV"):
        os.environ.pop(name, None)  # Colab's kernel has none of these: the course must set what it needs
    os.environ.update(env)
    yield {"python": image, "content": content, "build": content / "build"}
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _run(notebook: str, runtime) -> tuple[Path, float]:
    out = runtime["content"] / notebook
    started = time.monotonic()
    papermill.execute_notebook(str(ROOT / "notebooks" / notebook), str(out), kernel_name=KERNEL,
                               parameters={"smoke": True, "seed": 3}, cwd=str(runtime["content"]),
                               progress_bar=False)
    return out, time.monotonic() - started


def test_the_first_cell_sets_colab_up_and_notebook_00_passes_in_smoke(colab_runtime):
    executed, seconds = _run("00_setup_check.ipynb", colab_runtime)
    setup = _outputs(executed, 1)
    ready = re.search(r"\[colab\] ready in (\d+) s", setup)
    assert ready, f"the first cell did not finish its setup:\n{setup}"
    assert "averaged ranks 0 and 1 to 0.5" in setup and "TensorFlow 2.20.0 with tf_keras 2.20.1" in setup
    record = json.loads((colab_runtime["build"] / "results" / "00_setup_check.json").read_text())
    assert record["smoke"] is True and record["seed"] == 3
    print(f"[rehearsal] 00 in smoke: {seconds:.0f} s, of which the first cell's setup {ready.group(1)} s")


def test_notebook_04_runs_in_smoke_after_the_setup(colab_runtime):
    executed, seconds = _run("04_horovod.ipynb", colab_runtime)
    setup = _outputs(executed, 1)
    assert "Horovod is installed" in setup and "[colab] ready in" in setup  # the second notebook: no rebuild
    record = json.loads((colab_runtime["build"] / "results" / "04_horovod.json").read_text())
    assert record["smoke"] is True and record["seed"] == 3
    print(f"[rehearsal] 04 in smoke: {seconds:.0f} s")


def test_the_assessment_runs_in_practice_mode_on_colab(colab_runtime):
    """Its source (the solution in place of the student's work) with its default parameters: the
    practice profile, 2 workers, generated data; the tests in it pass and the epochs are saved."""
    out = colab_runtime["content"] / "assessment.ipynb"
    started = time.monotonic()
    papermill.execute_notebook(str(colab.ASSESSMENT), str(out), kernel_name=KERNEL,
                               cwd=str(colab_runtime["content"]), progress_bar=False)
    assert "[colab] ready in" in _outputs(out, 1)
    saved = _outputs(out, len(json.loads(out.read_text())["cells"]) - 1)
    count = re.search(r"(\d+) epoch file\(s\)", saved)
    assert count and int(count.group(1)) > 0, f"the practice run saved no epochs:\n{saved}"
    print(f"[rehearsal] the assessment in practice mode: {time.monotonic() - started:.0f} s")


def test_colabs_own_versions_were_kept(colab_runtime):
    listed = subprocess.run([str(colab_runtime["python"]), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    versions = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed)}
    for pin in IMAGE_PACKAGES:
        name, version = pin.split("==")
        assert versions[name.lower().replace("_", "-")] == version, f"the setup changed Colab's {name}"
    assert versions["horovod"] == "0.28.1"
