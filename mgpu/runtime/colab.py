"""Colab: the "Open in Colab" badges, every notebook's first cell, and the course's setup inside Colab.

Every notebook starts with a code cell that does nothing outside Colab (there `make setup` did the
work). Inside Colab (``COLAB_RELEASE_TAG`` is set in its runtime) the cell clones the course at the
commit the notebooks were tested with, puts it on the import path and calls :func:`setup`, which:

1. keeps Colab's own TensorFlow (2.16 or later; never downgraded) and installs the tf_keras of the
   same minor version if it is missing;
2. installs the rest of the current stack (``requirements-current.txt``) that Colab lacks;
3. builds Horovod 0.28.1 for the CPU with Gloo and the course's patches (Colab's one GPU needs no
   NCCL: multi-worker labs run as CPU workers there, see :mod:`mgpu.runtime.launch`), or installs the wheel
   built before, which ``drive=True`` keeps in the learner's Google Drive;
4. runs a self-test (two workers average their ranks) and prints how long all of it took.

``python -m mgpu.runtime.colab pin [REV]`` writes the badges and the first cells, pinned to REV (default: HEAD),
into every notebook and the README's table (the assessment gets the cell: its release, uploaded to
Colab, runs in practice mode there); a test checks that they agree and that the library at
the pinned commit is the one in the checkout.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from mgpu.runtime import paths

#: Where learners get the course (GitHub owner/name) and the branch the badges open.
REPOSITORY = "mgpu-course/deep-learning-on-multiple-gpus"
BRANCH = "main"
#: Where the first cell clones the course inside Colab.
COLAB_HOME = "/content/mgpu-course"
#: Where drive=True keeps the built Horovod wheel (keyed by Python, TensorFlow and patches).
DRIVE_CACHE = "/content/drive/MyDrive/mgpu-course/wheels"
#: Packages of the current stack that Colab's image already has: its own versions are kept.
COLAB_PROVIDES = {"tensorflow", "tf_keras", "numpy", "matplotlib", "pillow", "jupyterlab", "httpx",
                  "tensorboard-plugin-profile", "horovod"}
#: The assessment has the first cell too (its release, uploaded to Colab, runs in practice mode).
ASSESSMENT = paths.ROOT / "assignments" / "source" / "assessment" / "assessment.ipynb"
#: Both assessments (A, the conversion; B, ZeRO-1): each has the first cell, pinned like the labs.
ASSESSMENTS = (ASSESSMENT, paths.ROOT / "assignments" / "source" / "zero1" / "zero1.ipynb")
#: The paths whose contents the pinned commit must share with the checkout (what the cell runs).
LIBRARY = ("mgpu", "patches", "requirements-current.txt")

CELL_MARK = "# Colab only"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"


class ColabSetupError(RuntimeError):
    """Setting the course up inside Colab failed; the message names the fix."""


def badge(notebook: str) -> str:
    url = f"https://colab.research.google.com/github/{REPOSITORY}/blob/{BRANCH}/notebooks/{notebook}"
    return f"[![Open In Colab]({BADGE_IMAGE})]({url})"


def first_cell(commit: str) -> str:
    """The source of every notebook's first code cell, pinned to ``commit``."""
    return f'''{CELL_MARK}: fetch the course at the commit these notebooks were tested with and set up its
# stack on Colab's own TensorFlow (a few minutes the first time, seconds with drive=True afterwards).
# Outside Colab this cell does nothing: `make setup` has done it.
import os, subprocess, sys
if "COLAB_RELEASE_TAG" in os.environ:
    course = os.environ.get("MGPU_COURSE_DIR", "{COLAB_HOME}")
    if not os.path.isdir(course):
        subprocess.run(["git", "clone", "--quiet", os.environ.get("MGPU_COURSE_REPO",
                        "https://github.com/{REPOSITORY}"), course], check=True)
    subprocess.run(["git", "-C", course, "checkout", "--quiet", "{commit}"], check=True)
    sys.path.insert(0, course)
    from mgpu.runtime import colab
    colab.setup(course, drive=False)  # drive=True keeps the Horovod build in your Google Drive'''


def pinned_commit(cell_source: str) -> str | None:
    found = re.search(r'"checkout", "--quiet", "([0-9a-f]{40})"', cell_source)
    return found.group(1) if found else None


# ---- inside Colab ---------------------------------------------------------------------------------

def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _minor(version: str) -> tuple[int, int]:
    major, minor = (int(p) for p in version.split(".")[:2])
    return major, minor


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ColabSetupError(f"pip install {' '.join(args)} failed: {last}")


def missing_requirements(course: Path) -> list[str]:
    """The pins of requirements-current.txt that Colab does not provide and are not installed yet."""
    wanted = []
    for line in (course / "requirements-current.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        name = name.split("[")[0]  # ray[serve]: the distribution is ray
        if name.lower() not in COLAB_PROVIDES and _installed(name) != version:
            wanted.append(line)
    return wanted


def keras_2_requirement(tensorflow_version: str | None) -> str | None:
    """What to pip-install so that tf.keras can be Keras 2 on this TensorFlow (None: nothing)."""
    if tensorflow_version is None or _minor(tensorflow_version) < (2, 16):
        raise ColabSetupError(f"this runtime has TensorFlow {tensorflow_version or '(none)'}; the course needs "
                              "2.16 or later on Colab: pick Runtime > Change runtime type > the latest version")
    major, minor = _minor(tensorflow_version)
    have = _installed("tf_keras")
    if have is not None and _minor(have) == (major, minor):
        return None
    return f"tf_keras~={major}.{minor}.0"


def _average_ranks():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    return float(hvd.allreduce(tf.constant([float(hvd.rank())])).numpy()[0])


def self_test(workers: int = 2) -> float:
    """Two CPU workers average their ranks; returns the average (0.5 when Horovod works)."""
    from mgpu.runtime import launch

    average = launch.run(_average_ranks, workers, verbose=False).value
    expected = (workers - 1) / 2
    if abs(average - expected) > 1e-6:
        raise ColabSetupError(f"Horovod's self-test averaged the ranks to {average}, not {expected}: "
                              "run this cell again with a fresh runtime (Runtime > Disconnect and delete runtime)")
    return average


def setup(course: str | os.PathLike = COLAB_HOME, drive: bool = False, verbose: bool = True) -> float:
    """Installs what the course needs into Colab's Python; returns the seconds it took."""
    from mgpu.runtime import horovod_build

    started = time.monotonic()
    say = print if verbose else (lambda *a, **k: None)
    course = Path(course)
    keras = keras_2_requirement(_installed("tensorflow"))
    wanted = ([keras] if keras else []) + missing_requirements(course)
    if wanted:
        say(f"[colab] installing {', '.join(wanted)}")
        _pip(*wanted)
    if not _imports_from(course):  # so that new processes (workers, `!python -m mgpu...`) import it too
        _pip("--no-deps", "-e", str(course))
    cache = Path(os.environ.get("MGPU_WHEEL_CACHE") or horovod_build.DEFAULT_CACHE)
    if drive:
        from google.colab import drive as google_drive  # type: ignore[import-not-found]

        google_drive.mount("/content/drive")
        cache = Path(DRIVE_CACHE)
    if _installed("horovod") == horovod_build.VERSION and _horovod_imports():
        say("[colab] Horovod is installed")
    else:
        horovod_build.ensure("cpu", cache, course / "build" / "logs" / "horovod-build.log", verbose=verbose)
    average = self_test()
    seconds = time.monotonic() - started
    say(f"[colab] ready in {seconds:.0f} s: TensorFlow {_installed('tensorflow')} with tf_keras "
        f"{_installed('tf_keras')}, Horovod {_installed('horovod')}; 2 CPU workers averaged ranks 0 and 1 "
        f"to {average:.1f}")
    return seconds


def _imports_from(course: Path) -> bool:
    """Whether a new process imports mgpu from ``course`` (an editable install of another checkout,
    or of one since deleted, does not count)."""
    done = subprocess.run([sys.executable, "-c", "import mgpu; print(mgpu.__file__)"], capture_output=True,
                          text=True, cwd="/")
    return done.returncode == 0 and Path(done.stdout.strip()).resolve().is_relative_to(Path(course).resolve())


def _horovod_imports() -> bool:
    done = subprocess.run([sys.executable, "-c", "import mgpu, horovod.tensorflow.keras"], capture_output=True)
    return done.returncode == 0


# ---- writing the badges and cells -----------------------------------------------------------------

def head_commit(rev: str = "HEAD") -> str:
    return subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=paths.ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()


def pin(commit: str) -> list[Path]:
    """Writes the badge and the first cell, pinned to ``commit``, into every notebook (the assessment
gets the cell only); returns them."""
    import nbformat

    from mgpu.runtime import course

    written = []
    for path in [*course.course_notebooks(), *ASSESSMENTS]:
        notebook = nbformat.read(path, as_version=4)
        if path not in ASSESSMENTS:  # the assessment's student version is not on GitHub: no badge
            title = notebook.cells[0]
            lines = [line for line in title.source.splitlines() if BADGE_IMAGE not in line]
            title.source = "\n".join([lines[0], "", badge(path.name), *lines[1:]]).replace("\n\n\n", "\n\n")
        cell = next((c for c in notebook.cells if c.cell_type == "code" and c.source.startswith(CELL_MARK)), None)
        if cell is None:
            cell = nbformat.v4.new_code_cell()
            notebook.cells.insert(1, cell)
        cell.source = first_cell(commit)
        if path in ASSESSMENTS:  # every cell of an assessment is nbgrader's; this one is locked
            cell.metadata.update({"deletable": False, "editable": False, "nbgrader": {
                "grade": False, "grade_id": "colab", "locked": True, "schema_version": 3, "solution": False}})
        nbformat.write(notebook, path)
        written.append(path)
    _pin_readme()
    return written


def _pin_readme() -> None:
    readme = paths.ROOT / "README.md"
    lines = []
    for line in readme.read_text().splitlines():
        found = re.match(r"^\| `(\d\d_[a-z_]+)` \|", line)
        if found:
            line = re.sub(r" \[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)", "", line)
            line = line.replace(f"| `{found.group(1)}` |", f"| `{found.group(1)}` {badge(found.group(1) + '.ipynb')} |", 1)
        lines.append(line)
    readme.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.runtime.colab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pinning = sub.add_parser("pin", help="write the badges and first cells, pinned to REV")
    pinning.add_argument("rev", nargs="?", default="HEAD")
    args = parser.parse_args(argv)
    commit = head_commit(args.rev)
    for path in pin(commit):
        print(f"pinned {path.relative_to(paths.ROOT)} to {commit[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
