"""What this machine has, which hardware profile the course uses on it, and what is wrong.

Profiles (the notebooks and the grader take one):

- ``cpu``:   N Horovod processes over Gloo on the CPU cores ("simulated GPUs"): CI, laptops.
- ``gpu``:   one process per GPU, NCCL all-reduce: workstations and servers with 1-8 GPUs.
- ``colab``: the one Colab GPU (or CPU) with the same notebooks.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from dataclasses import dataclass, field

from mgpu.runtime.launch import available_cores

PROFILES = ("cpu", "gpu", "colab")
#: The course's two stacks, by Python version: the pinned one (requirements.txt) and the current one
#: (requirements-current.txt, also Colab's). "keras" is the Keras 2 that tf.keras is: keras itself on
#: TensorFlow 2.15, tf_keras on 2.16+ (mgpu sets TF_USE_LEGACY_KERAS=1).
STACKS = {
    "pinned": {"python": ("3.11",), "tensorflow": "2.15.1", "keras": "2.15.0", "horovod": "0.28.1"},
    "current": {"python": ("3.12", "3.13"), "tensorflow": "2.20.0", "keras": "2.20.1", "horovod": "0.28.1"},
}


def stack_for(python: str) -> str | None:
    """``pinned`` or ``current`` for a Python version string, None when the course supports neither."""
    minor = ".".join(python.split(".")[:2])
    return next((name for name, stack in STACKS.items() if minor in stack["python"]), None)


@dataclass
class Machine:
    """A description of this machine, for the setup check."""

    cpu: str
    cores: int
    memory_gib: float
    gpus: list[str]
    python: str
    versions: dict[str, str | None]
    horovod_built: dict[str, bool] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str]]:
        built = ", ".join(k for k, v in self.horovod_built.items() if v) or "nothing"
        return [
            ("CPU", f"{self.cpu} ({self.cores} cores available)"),
            ("Memory", f"{self.memory_gib:.1f} GiB"),
            ("GPUs", ", ".join(self.gpus) if self.gpus else "none"),
            ("Python", self.python),
            *((name, version or "not installed") for name, version in self.versions.items()),
            ("Horovod built with", built),
        ]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def tensorflow_version() -> str | None:
    return _version("tensorflow") or _version("tensorflow-cpu")


def keras_2_version() -> str | None:
    """The version of the Keras that tf.keras is under the course: tf_keras where it is installed
    (TensorFlow 2.16+), else keras (2.15 on the pinned stack; 3.x would be a problem)."""
    return _version("tf_keras") or _version("keras")


def in_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def list_gpus() -> list[str]:
    import tensorflow as tf

    return [gpu.name for gpu in tf.config.list_physical_devices("GPU")]


def describe_machine() -> Machine:
    import psutil

    built = {}
    try:
        import horovod.tensorflow as hvd

        built = {"TensorFlow": True, "Gloo": hvd.gloo_built(), "NCCL": hvd.nccl_built() > 0,
                 "MPI": hvd.mpi_built()}
    except ImportError:
        pass
    return Machine(
        cpu=_cpu_name(), cores=available_cores(), memory_gib=psutil.virtual_memory().total / 2**30,
        gpus=list_gpus(), python=platform.python_version(),
        versions={"TensorFlow": tensorflow_version(), "Keras": keras_2_version(),
                  "Horovod": _version("horovod"), "nbgrader": _version("nbgrader"),
                  "papermill": _version("papermill")},
        horovod_built=built,
    )


def detect_profile(machine: Machine | None = None) -> str:
    """``colab`` in Colab, ``gpu`` where TensorFlow sees a GPU, else ``cpu``."""
    if in_colab():
        return "colab"
    gpus = machine.gpus if machine is not None else list_gpus()
    return "gpu" if gpus else "cpu"


def problems(machine: Machine, profile: str, workers: int) -> list[str]:
    """What stops the course from running as intended here, each with its fix. Empty = ready."""
    found = []
    stack = stack_for(machine.python)
    if stack is None:
        found.append(f"Python {machine.python}: the course runs on 3.11 (pinned stack) or 3.12/3.13 (current "
                     "stack). Fix: `make setup` with PYTHON=/path/to/python3.12 (or 3.11), or "
                     "`conda env create -f environment.yml`.")
    else:
        want = STACKS[stack]
        tf_version, keras_version = machine.versions.get("TensorFlow") or "", machine.versions.get("Keras") or ""
        if in_colab() and stack == "current":
            # Colab's own TensorFlow is kept (never downgraded): any 2.16+ with tf_keras of the same minor.
            minor = ".".join(tf_version.split(".")[:2])
            if _version_tuple(tf_version) < (2, 16) or not keras_version.startswith(minor + "."):
                found.append(f"TensorFlow {tf_version or 'missing'} with Keras {keras_version or 'missing'}: "
                             f"Colab needs TensorFlow 2.16+ and tf_keras {minor}.*. Fix: run the first cell again.")
        else:
            for name, key in (("TensorFlow", "tensorflow"), ("Keras", "keras")):
                have = machine.versions.get(name)
                if have != want[key]:
                    found.append(f"{name} {have or 'is not installed'} (the {stack} stack pins {want[key]}). "
                                 "Fix: `make setup`.")
        if machine.versions.get("Horovod") != want["horovod"]:
            found.append(f"Horovod {machine.versions.get('Horovod') or 'is not installed'} (the course builds "
                         f"{want['horovod']}). Fix: `make setup`.")
    if keras_version_is_3(machine.versions.get("Keras")):
        found.append("tf.keras is Keras 3: Horovod's DistributedOptimizer would silently stop all-reducing. "
                     "Fix: `pip install keras==2.15.0` (Python 3.11) or `pip install tf_keras` with TensorFlow "
                     "2.16+ (the course then sets TF_USE_LEGACY_KERAS=1).")
    if not machine.horovod_built.get("TensorFlow"):
        found.append("Horovod cannot be imported with TensorFlow. Fix: `make setup` (it builds Horovod "
                     "after TensorFlow).")
    elif not machine.horovod_built.get("Gloo"):
        found.append("Horovod was built without Gloo. Fix: remove .venv and run `make setup`.")
    if profile == "gpu" and machine.horovod_built and not machine.horovod_built.get("NCCL"):
        found.append("GPUs found but Horovod was built without NCCL. Fix: install the CUDA toolkit "
                     "and run `rm -rf .venv && make setup`.")
    return found


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


def keras_version_is_3(version: str | None) -> bool:
    return bool(version) and version.startswith("3")
