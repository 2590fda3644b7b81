"""Building Horovod 0.28.1 from its sdist, with the course's patches, into a cached wheel.

Horovod publishes no wheels and no release after 0.28.1, which predates TensorFlow 2.16. The course
carries the few changes that make it build and work against TensorFlow 2.20 with tf_keras, one
that makes its warm-up callbacks' momentum correction work with Keras's own optimizers on both
stacks, and one that lets its stall inspector check every rank under Gloo, as patch files in ``patches/horovod-0.28.1/`` (each says what it fixes and why). ``scripts/setup.sh`` and Colab's first cell (``mgpu.runtime.colab``) both call this module:

    python -m mgpu.runtime.horovod_build [--kind cpu|gpu] [--cache DIR]

The wheel is kept under a key made of the Python version, the TensorFlow version, the kind of build
and the patches' hash, so a second setup (or a Colab session with the learner's Drive mounted) installs
it in seconds instead of compiling for minutes. A failed build leaves no wheel behind, and says in one
line what to install or change.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from mgpu.runtime import paths

VERSION = "0.28.1"
# SHA-256 of horovod-0.28.1.tar.gz as PyPI serves it.
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
PATCH_DIR = paths.ROOT / "patches" / f"horovod-{VERSION}"
DEFAULT_CACHE = Path(os.environ.get("MGPU_WHEEL_CACHE", Path.home() / ".cache" / "mgpu" / "wheels"))


class BuildError(RuntimeError):
    """The build failed; the message is one line naming the fix, and the log has the rest."""


def patches() -> list[Path]:
    found = sorted(PATCH_DIR.glob("*.patch"))
    if not found:
        raise BuildError(f"no patches in {PATCH_DIR}: the course checkout is incomplete; fetch it again.")
    return found


def patches_hash() -> str:
    digest = hashlib.sha256()
    for patch in patches():
        digest.update(patch.name.encode() + b"\0" + patch.read_bytes())
    return digest.hexdigest()[:12]


def wheel_key(kind: str) -> str:
    """The cache key: Python, TensorFlow, kind of build and patches (any change means a new build)."""
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{python}-tf{_tensorflow_version()}-{kind}-patches{patches_hash()}"


def _tensorflow_version() -> str:
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    raise BuildError("TensorFlow is not installed in this Python: Horovod is built against it, so install it first.")


def cached_wheel(kind: str, cache: Path) -> Path | None:
    wheels = sorted((cache / wheel_key(kind)).glob(f"horovod-{VERSION}-*.whl"))
    return wheels[0] if wheels else None


def diagnose(log: str, kind: str) -> str:
    """One line saying what most likely broke the build, from its log."""
    low = log.lower()
    if "cmake 3.13 or higher" in low or ("cmake" in low and ("not found" in low or "no such file" in low)):
        return "cmake is missing or too old: install cmake >= 3.13 ('apt-get install cmake' or 'pip install cmake')"
    if "python.h: no such file" in low:
        v = f"{sys.version_info.major}.{sys.version_info.minor}"
        return f"the Python headers are missing: install them ('apt-get install python{v}-dev')"
    if "no cmake_cxx_compiler" in low or "c++: not found" in low or "g++: not found" in low:
        return "no working C++ compiler: install one ('apt-get install build-essential')"
    if kind == "gpu" and "nccl" in low and "error" in low:
        return "the build failed around NCCL: install NCCL (or set HOROVOD_NCCL_HOME), or build for the CPU (MGPU_GPU=0)"
    if "patch" in low and ("failed" in low or "reject" in low):
        return "a course patch did not apply to the sdist: the patches or the sdist changed; fetch the course again"
    if "tensorflow" in low and "error" in low:
        return f"the build failed against TensorFlow {_tensorflow_version()}: check that it imports in this Python"
    return "the build failed (see the log's last lines)"


def _build_environment(kind: str) -> dict[str, str]:
    env = dict(os.environ, HOROVOD_WITH_TENSORFLOW="1", HOROVOD_WITH_GLOO="1", HOROVOD_WITHOUT_MPI="1",
               HOROVOD_WITHOUT_PYTORCH="1", HOROVOD_WITHOUT_MXNET="1", MAKEFLAGS=f"-j{os.cpu_count() or 1}")
    if kind == "gpu":
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
        try:  # TensorFlow's CUDA wheels ship NCCL: point the build at it unless the user did.
            import nvidia.nccl  # type: ignore[import-not-found]

            env.setdefault("HOROVOD_NCCL_HOME", os.path.dirname(nvidia.nccl.__file__))
        except ImportError:
            pass
    else:  # a CPU build has no GPU operations, even if the shell asked for them
        for name in ("HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE", "HOROVOD_GPU_BROADCAST",
                     "HOROVOD_GPU_ALLGATHER"):
            env.pop(name, None)
    return env


def _run(command: list[str], log, cwd: Path | None = None, env: dict | None = None) -> None:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    done = subprocess.run(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, command)


def build(kind: str, cache: Path, log_path: Path) -> Path:
    """Downloads, checks, patches and compiles the sdist; returns the cached wheel."""
    key = wheel_key(kind)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mgpu-horovod-") as work, open(log_path, "w") as log:
        work = Path(work)
        try:
            _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                  f"horovod=={VERSION}", "-d", str(work)], log)
            sdist = work / f"horovod-{VERSION}.tar.gz"
            got = hashlib.sha256(sdist.read_bytes()).hexdigest()
            if got != SDIST_SHA256:
                raise BuildError(f"the downloaded {sdist.name} has SHA-256 {got[:16]}..., not the one the course "
                                 "was tested with: check your pip index, then run setup again")
            with tarfile.open(sdist) as archive:
                archive.extractall(work, filter="data")
            source = work / f"horovod-{VERSION}"
            for patch in patches():
                _run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)], log, cwd=source)
            _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
                  "-w", str(work / "dist"), "."], log, cwd=source, env=_build_environment(kind))
        except subprocess.CalledProcessError:
            log.flush()
            raise BuildError(f"{diagnose(log_path.read_text(errors='replace'), kind)}. Log: {log_path}") from None
        built = next((work / "dist").glob(f"horovod-{VERSION}-*.whl"))
        # Into the cache atomically: a folder appears whole or not at all.
        target = cache / key
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=_mkdir(cache)))
        shutil.copy2(built, staging / built.name)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        return target / built.name


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def ensure(kind: str = "cpu", cache: Path = DEFAULT_CACHE, log_path: Path | None = None,
           verbose: bool = True) -> Path:
    """Installs Horovod from the cached wheel, building it first when there is none. Returns the wheel."""
    say = print if verbose else (lambda *a, **k: None)
    log_path = log_path or paths.build_dir() / "logs" / "horovod-build.log"
    started = time.monotonic()
    wheel = cached_wheel(kind, cache)
    if wheel:
        say(f"[horovod] using the cached wheel {wheel}")
    else:
        say(f"[horovod] building Horovod {VERSION} ({kind}, Gloo{' + NCCL' if kind == 'gpu' else ''}) with "
            f"{len(patches())} course patches; a few minutes on 2 cores, log in {log_path}")
        wheel = build(kind, cache, log_path)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                           str(wheel)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"pip could not install {wheel.name}: {done.stderr.strip().splitlines()[-1:]}")
    say(f"[horovod] installed in {time.monotonic() - started:.0f} s")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.runtime.horovod_build", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where built wheels are kept")
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--key", action="store_true", help="print the cache key and exit")
    args = parser.parse_args(argv)
    try:
        if args.key:
            print(wheel_key(args.kind))
            return 0
        ensure(args.kind, args.cache, args.log)
    except BuildError as error:
        print(f"[horovod] ERROR: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
