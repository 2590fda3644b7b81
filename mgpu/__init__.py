"""mgpu: the library behind the course "Deep learning on multiple GPUs".

The notebooks stay narrative; the code they call lives here, one module per concern:

- ``mgpu.download``  fetching official dataset files with SHA-256 checks, atomically and resumably
- ``mgpu.synthetic`` the offline default dataset, generated deterministically
- ``mgpu.data``      dataset registry, cache, ``auto`` choice and fingerprints
- ``mgpu.launch``    running a function or script on N data-parallel Horovod workers
- ``mgpu.hardware``  what this machine has and which hardware profile the course uses
- ``mgpu.accelerator`` the simulated accelerator: a modelled device per worker where GPUs are fewer than workers
- ``mgpu.reference`` measurements on a real GPU (H100) shown where the machine has none
- ``mgpu.callbacks`` Keras callbacks shared by the labs and the assessment (throughput, time, targets)
- ``mgpu.allreduce`` a from-scratch ring all-reduce in numpy, to step through
- ``mgpu.optimizers`` LARS and LAMB, the large-batch optimizers TensorFlow 2.15 lacks
- ``mgpu.sgd``       notebook 01's toy problems: the linear neuron, the noise ball, GD's rate, the saddle
- ``mgpu.measure``   the benchmark harness (warm-up, repetitions, median) and FLOP counts
- ``mgpu.imagefolder`` notebook 03's folder of JPEG files and TFRecord shards
- ``mgpu.alexnet``   AlexNet (single tower) and the training step notebook 03's pipelines feed
- ``mgpu.pipeline``  notebook 03's input pipelines, stage by stage, and their measurement
- ``mgpu.models``    small Keras models (CNN, MLP, ResNet-style) for the labs
- ``mgpu.multimodel`` many small MLPs trained side by side in one batched computation (notebook 02's sweeps)
- ``mgpu.batch_study`` notebook 02's batch-size studies: steps-to-target, fits, scaling rules, warm-up
- ``mgpu.noise_scale`` the two-batch gradient noise scale estimator (McCandlish et al. 2018)
- ``mgpu.sharpness`` epsilon-sharpness and 1-D interpolation (Keskar et al. 2017)
- ``mgpu.keras_runs`` throughput and time-to-accuracy runs with the course callbacks
- ``mgpu.conversion`` notebook 04's training script, one Horovod conversion step at a time
- ``mgpu.recipes``   notebook 05's accuracy-at-scale recipes (LR scaling, warm-up, momentum, LARS/LAMB)
- ``mgpu.step_costs`` time in compute vs all-reduce per step, and per-worker gradient norms
- ``mgpu.timeline``  reading Horovod's timeline
- ``mgpu.async_sgd`` notebook 06's parameter-server runs: the toy's problem, traffic counts, the uneven split,
  stragglers on Horovod, TensorFlow's ParameterServerStrategy in a child process
- ``mgpu.model_parallel`` notebook 09's pipelines: GPipe schedules, bubble accounting, the timing harness
- ``mgpu.compression`` notebook 07's 2-bit packing, byte counts, training with per-tensor compressors
- ``mgpu.multinode`` notebook 10's host plans, multi-machine commands and their dry run
- ``mgpu.slurm_horovod`` notebook 10's Horovod job inside a Slurm allocation, started by srun without ssh or MPI
- ``mgpu.serving``   notebook 11's inference server (Triton), load generator and queueing model
- ``mgpu.assessment`` the assessment's fixed model, data hand-off, locked callbacks and targets table
- ``mgpu.results``   each notebook's headline numbers (``build/results``) and figures
- ``mgpu.plots``     the course's figures, one call each
- ``mgpu.course``    executing the notebooks headless with papermill
- ``mgpu.paths``     where the checkout, the build folder and its parts are
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
