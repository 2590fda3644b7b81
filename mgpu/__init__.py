"""mgpu: the library behind the course "Deep learning on multiple GPUs".

The notebooks stay narrative; the code they call lives here. ``mgpu.runtime`` is what every lesson
shares; each ``mgpu.lessonNN`` holds what only notebook NN (and lessons after it) use, with that
notebook's figures. Each package's docstring maps its modules.

- ``mgpu.lesson00``   notebook 00's figures (the setup check)
- ``mgpu.lesson01``   notebook 01 (GD vs SGD): the toy problems and their figures
- ``mgpu.lesson02``   notebook 02 (batch size): batch-size studies, noise scale, sharpness, batched MLPs,
  Keras runs
- ``mgpu.lesson03``   notebook 03 (input pipeline): JPEG folders and shards, AlexNet, the pipelines
- ``mgpu.lesson04``   notebook 04 (Horovod): the conversion, the ring all-reduce, step costs
- ``mgpu.lesson05``   notebook 05 (accuracy at scale): the recipes, LARS and LAMB
- ``mgpu.lesson06``   notebook 06 (sync or async): parameter servers, staleness, stragglers
- ``mgpu.lesson07``   notebook 07 (communication): gradient compression
- ``mgpu.lesson09``   notebook 09 (model parallelism): GPipe schedules, bubbles, the timing harness
- ``mgpu.lesson10``   notebook 10 (several machines): host plans, multi-machine commands, Slurm
- ``mgpu.lesson11``   notebook 11 (serving): load generator, queueing model, inference server, float16
- ``mgpu.runtime``    the course's runtime: launching workers, hardware, the simulated accelerator, data,
  models, measurement, results, figures' shared parts, running the notebooks, Colab
- ``mgpu.assessment`` the assessment's fixed model, data hand-off, locked callbacks and targets table
"""

import os as _os

# TensorFlow's C++ INFO lines (CPU feature notes) only clutter notebook cells and test logs;
# warnings and errors still show. Set TF_CPP_MIN_LOG_LEVEL=0 to see everything.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")



def _tensorflow_2_16_or_later() -> bool:
    import importlib.metadata

    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= (2, 16)
    return False


def _use_keras_2() -> None:
    """On TensorFlow 2.16 and later (the current stack: Python 3.12/3.13, Colab), tf.keras is Keras 3
    unless TF_USE_LEGACY_KERAS=1 when it is first used; Horovod 0.28.1 needs the Keras 2 API, which
    tf_keras gives. TensorFlow 2.15 (the pinned stack) has no such switch. Import mgpu first."""
    import sys

    if not _tensorflow_2_16_or_later():
        return
    _os.environ["TF_USE_LEGACY_KERAS"] = "1"
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        # TensorFlow binds tf.keras on first use: if that happened before the flag was set, it is Keras 3.
        if not tf.keras.__name__.startswith("tf_keras"):
            raise ImportError(
                f"tf.keras was used before mgpu was imported, so it is Keras 3 ({tf.keras.__name__}), which "
                "Horovod 0.28.1 cannot average: restart the kernel and import mgpu before tensorflow "
                "(or set TF_USE_LEGACY_KERAS=1 before importing it)."
            )


_use_keras_2()

__version__ = "0.1.0"
