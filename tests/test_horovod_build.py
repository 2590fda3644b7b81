"""The course's Horovod build: patches that say why and apply to the real sdist, a cache key that
changes with anything the build depends on, and one-line diagnoses of failed builds."""

import hashlib
import shutil
import subprocess
import sys
import tarfile

import pytest

from mgpu.runtime import horovod_build


def test_each_patch_says_what_it_fixes_before_its_diff():
    for patch in horovod_build.patches():
        text = patch.read_text()
        head = text.split("\n--- a/", 1)[0]
        assert "--- a/" in text and len(head.split()) >= 30, f"{patch.name}: explain what it fixes and why"


def test_the_wheel_key_names_python_tensorflow_kind_and_patches(tmp_path, monkeypatch):
    key = horovod_build.wheel_key("cpu")
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert key.startswith(f"{python}-tf{horovod_build._tensorflow_version()}-cpu-patches")
    assert horovod_build.wheel_key("gpu") != key
    copy = tmp_path / "patches"
    shutil.copytree(horovod_build.PATCH_DIR, copy)
    monkeypatch.setattr(horovod_build, "PATCH_DIR", copy)
    assert horovod_build.wheel_key("cpu") == key
    first = sorted(copy.glob("*.patch"))[0]
    first.write_text(first.read_text() + "\n")
    assert horovod_build.wheel_key("cpu") != key  # an edited patch is a new build


def test_a_cached_wheel_is_found_only_under_its_own_key(tmp_path):
    assert horovod_build.cached_wheel("cpu", tmp_path) is None
    folder = tmp_path / horovod_build.wheel_key("cpu")
    folder.mkdir()
    (folder / "horovod-0.28.1-cp313-cp313-linux_x86_64.whl").write_bytes(b"")
    assert horovod_build.cached_wheel("cpu", tmp_path).parent == folder
    assert horovod_build.cached_wheel("gpu", tmp_path) is None


@pytest.mark.parametrize("log, says", [
    ("CMake Error: CMake 3.13 or higher is required.", "cmake >= 3.13"),
    ("fatal error: Python.h: No such file or directory", "python3"),
    ("-- No CMAKE_CXX_COMPILER could be found.", "build-essential"),
    ("1 out of 2 hunks FAILED -- saving rejects to file CMakeLists.txt.rej\npatch failed", "fetch the course again"),
    ("mpi_ops.cc:12: error: tensorflow/core/framework/op.h not found", "against TensorFlow"),
])
def test_a_failed_build_is_diagnosed_in_one_line_naming_the_fix(log, says):
    message = horovod_build.diagnose(log, "cpu")
    assert says in message and "\n" not in message


@pytest.mark.slow
def test_the_patches_apply_to_horovods_published_sdist(tmp_path):
    """Against the sdist PyPI serves (checked by its SHA-256), every patch applies cleanly, in order."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                           ":all:", f"horovod=={horovod_build.VERSION}", "-d", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
    sdist = tmp_path / f"horovod-{horovod_build.VERSION}.tar.gz"
    assert hashlib.sha256(sdist.read_bytes()).hexdigest() == horovod_build.SDIST_SHA256
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    source = tmp_path / f"horovod-{horovod_build.VERSION}"
    for patch in horovod_build.patches():
        applied = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)], cwd=source,
                                 capture_output=True, text=True)
        assert applied.returncode == 0, f"{patch.name}: {applied.stdout}{applied.stderr}"
    assert "xla_mpi_ops.cc" in (source / "horovod/tensorflow/CMakeLists.txt").read_text()  # kept for 2.15
    assert "distutils" not in (source / "horovod/runner/js_run.py").read_text()
