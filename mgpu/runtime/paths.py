"""Where the course keeps things: the checkout, its ignored build folder, and the figures and
results the notebooks write (``build/figures``, ``build/results``).

``MGPU_BUILD_DIR`` moves the build folder (the tests use it to keep their output separate).
"""

import os
from pathlib import Path

_PACKAGE_PARENT = Path(__file__).resolve().parents[2]
#: The course checkout; when the package is installed elsewhere (e.g. Colab), the working folder.
ROOT = _PACKAGE_PARENT if (_PACKAGE_PARENT / "pyproject.toml").exists() else Path.cwd()


def build_dir() -> Path:
    return Path(os.environ.get("MGPU_BUILD_DIR") or ROOT / "build")


def results_dir() -> Path:
    return build_dir() / "results"


def figures_dir() -> Path:
    return build_dir() / "figures"
