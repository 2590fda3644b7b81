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

from mgpu.launch import available_cores

PROFILES = ("cpu", "gpu", "colab")
#: The stack the course is pinned to (see requirements.txt).
PINNED = {"tensorflow": "2.15.1", "keras": "2.15.0", "horovod": "0.28.1"}


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
        versions={"TensorFlow": tensorflow_version(), "Keras": _version("keras"),
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
    if not machine.python.startswith("3.11."):
        found.append(f"Python {machine.python}: the course needs 3.11. Fix: `make setup` with "
                     "PYTHON=/path/to/python3.11, or `conda env create -f environment.yml`.")
    for name, dist in (("TensorFlow", "tensorflow"), ("Keras", "keras"), ("Horovod", "horovod")):
        have, want = machine.versions.get(name), PINNED[dist]
        if have != want:
            found.append(f"{name} {have or 'is not installed'} (the course pins {want}). Fix: `make setup`.")
    if machine.versions.get("Keras", "").startswith("3"):
        found.append("Keras 3 is installed: Horovod's DistributedOptimizer would silently stop "
                     "all-reducing. Fix: `pip install keras==2.15.0`.")
    if not machine.horovod_built.get("TensorFlow"):
        found.append("Horovod cannot be imported with TensorFlow. Fix: `make setup` (it builds Horovod "
                     "after TensorFlow).")
    elif not machine.horovod_built.get("Gloo"):
        found.append("Horovod was built without Gloo. Fix: remove .venv and run `make setup`.")
    if profile == "gpu" and machine.horovod_built and not machine.horovod_built.get("NCCL"):
        found.append("GPUs found but Horovod was built without NCCL. Fix: install the CUDA toolkit "
                     "and run `rm -rf .venv && make setup`.")
    if profile == "gpu" and workers > len(machine.gpus):
        found.append(f"{workers} workers but {len(machine.gpus)} GPU(s): use workers={len(machine.gpus)}.")
    return found
