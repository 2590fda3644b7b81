"""scripts/setup.sh refuses what cannot work, with the cause and the fix, before touching anything."""

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fake_python(folder: Path, version: str) -> Path:
    fake = folder / "python-fake"
    major, minor = version.split(".")[:2]
    fake.write_text(f"#!/bin/sh\n# reports Python {version}\n"
                    f"exec python3 -c \"import sys; sys.exit(({major}, {minor}) not in ((3, 11), (3, 12), (3, 13)))\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


def test_a_python_without_a_course_stack_is_refused_with_the_fix(tmp_path):
    venv = tmp_path / "venv"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": str(_fake_python(tmp_path, "3.10.12")),
                              "VENV": str(venv)}, timeout=120)
    assert run.returncode != 0
    assert "is not Python 3.11, 3.12 or 3.13" in run.stderr and "PYTHON=/path/to/python3.11" in run.stderr
    assert not venv.exists()  # nothing was created
