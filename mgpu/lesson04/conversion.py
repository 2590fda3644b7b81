"""Notebook 04's training script, from one process to Horovod, one conversion step at a time.

:func:`script` renders the lab's Keras training script (a small ResNet on the course's images) with
any subset of the conversion steps in :data:`STEPS` switched on; :func:`diff` shows what one step
changes, as a unified diff; :func:`write_script` puts a variant on disk for ``python`` or
``horovodrun``. Every variant writes ``report.json`` (rank 0's throughput, history and, once Horovod
is initialised, the largest weight difference between ranks), which the notebook reads.

:func:`mirrored_script` is the naive alternative: one process driving several devices with
``tf.distribute.MirroredStrategy``, over logical CPU devices when there is no GPU.

The template is plain Python in which a line ending in ``# @step`` exists only when ``step`` is
enabled and a line ending in ``# @!step`` only when it is not; the markers are removed on rendering.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

#: The conversion steps in the order the lab applies them, with what each one does.
STEPS: dict[str, str] = {
    "init": "import Horovod and call hvd.init(): every process learns its rank and the size",
    "pin": "pin one GPU per process, the GPU of its local rank (a no-op on a CPU)",
    "rank0_output": "progress bars and logs only from rank 0",
    "distributed_optimizer": "wrap the optimizer: gradients are averaged by all-reduce before each update",
    "scale_lr": "multiply the learning rate by size (the batch grew size-fold) and warm it up over the first epochs",
    "broadcast": "broadcast rank 0's initial variables so that every rank starts from the same model",
    "shard": "each rank reads its own 1/size of the data; steps per epoch divided by size",
    "metric_average": "average the epoch's metrics over the ranks (MetricAverageCallback)",
    "checkpoint_rank0": "only rank 0 writes checkpoints",
}

_TEMPLATE = '''\
"""Train a small CNN on the course's images (two convolution layers, or a small ResNet): notebook 04's training script."""
import argparse
import json
import os
import time

import numpy as np

from mgpu.runtime import (accelerator, callbacks, data, models)  # first: on TensorFlow 2.16+ it makes tf.keras Keras 2, as Horovod needs
import tensorflow as tf
import horovod.tensorflow.keras as hvd  # @init

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch", type=int, default=64, help="images per step on each process")
parser.add_argument("--lr", type=float, default=0.015, help="learning rate for one process (momentum 0.9)")
parser.add_argument("--warmup-epochs", type=float, default=2.0, help="epochs to ramp the scaled rate up")  # @scale_lr
parser.add_argument("--model", choices=["cnn", "resnet"], default="cnn",
                    help="the two-layer CNN, or the small ResNet (12x the arithmetic per image, 0.4x the weights)")
parser.add_argument("--width", type=int, default=16, help="channels of the first ResNet stage")
parser.add_argument("--blocks", type=int, default=1, help="residual blocks per stage")
parser.add_argument("--train-images", type=int, default=16384)
parser.add_argument("--val-images", type=int, default=2000)
parser.add_argument("--compression", choices=["none", "fp16"], default="none")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--out", default="run", help="folder for the log, the checkpoint and report.json")
args = parser.parse_args()

hvd.init()  # @init
rank, local_rank, size = hvd.rank(), hvd.local_rank(), hvd.size()  # @init
rank, local_rank, size = 0, 0, 1  # @!init

# One GPU per process: the process of local rank k sees only this host's GPU number k.
gpus = tf.config.list_physical_devices("GPU")  # @pin
for gpu in gpus:  # @pin
    tf.config.experimental.set_memory_growth(gpu, True)  # @pin
if gpus:  # @pin
    tf.config.set_visible_devices(gpus[local_rank], "GPU")  # @pin

talk = rank == 0  # @rank0_output
talk = True  # @!rank0_output
save_here = rank == 0  # @checkpoint_rank0
save_here = True  # @!checkpoint_rank0

# Each process shuffles differently; like most scripts, this also gives each its own initial weights.
tf.keras.utils.set_random_seed(args.seed + rank)
dataset = data.load("auto", seed=args.seed, verbose=talk)
x, y = dataset.x_train[:args.train_images], dataset.y_train[:args.train_images]
x_val, y_val = dataset.x_test[:args.val_images], dataset.y_test[:args.val_images]
x, y = x[rank::size], y[rank::size]  # @shard
steps_per_epoch = args.train_images // (args.batch * size)  # @shard
steps_per_epoch = args.train_images // args.batch  # @!shard
train = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=args.seed + rank)
         .repeat().batch(args.batch).prefetch(tf.data.AUTOTUNE))

if args.model == "resnet":
    model = models.small_resnet(x.shape[1:], len(dataset.class_names), width=args.width,
                                blocks=args.blocks, seed=args.seed + rank)
else:
    model = models.small_cnn(x.shape[1:], len(dataset.class_names), seed=args.seed + rank)
lr = args.lr * size  # @scale_lr
lr = args.lr  # @!scale_lr
optimizer = tf.keras.optimizers.SGD(lr, momentum=0.9)
compression = hvd.Compression.fp16 if args.compression == "fp16" else hvd.Compression.none  # @distributed_optimizer
optimizer = hvd.DistributedOptimizer(optimizer, compression=compression)  # @distributed_optimizer
model.compile(optimizer=optimizer,
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

throughput = callbacks.Throughput(args.batch * size, warmup_batches=2)
# Launched with a device profile (the course's simulated accelerator, for a machine without a GPU
# per worker), each step takes this worker's modelled device's time; otherwise this does nothing.
device = accelerator.ModelledDevice(args.batch)
fit_callbacks = [throughput, device]
fit_callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=0))  # @broadcast
fit_callbacks.append(hvd.callbacks.MetricAverageCallback())  # @metric_average
# From lr / size up to lr over the warm-up (Goyal et al. 2017); as the rate rises, Horovod rescales  # @scale_lr
# the momentum's velocity by the same factor (the paper's momentum correction).  # @scale_lr
fit_callbacks.append(hvd.callbacks.LearningRateWarmupCallback(  # @scale_lr
    initial_lr=lr, warmup_epochs=args.warmup_epochs, steps_per_epoch=steps_per_epoch))  # @scale_lr
# After any warm-up the rate falls to zero along half a cosine (Loshchilov & Hutter 2017), so the
# final accuracy says where training settled, not where its last large step landed.
decay_from = args.warmup_epochs  # @scale_lr
decay_from = 0.0  # @!scale_lr
fit_callbacks.append(callbacks.CosineDecay(lr, decay_from, args.epochs, steps_per_epoch))
fit_callbacks.append(callbacks.WallClockCSVLogger(os.path.join(args.out, "log.csv"), enabled=talk))
# HDF5 locks the file it writes: two ranks saving to one file would stop the job, so a rank other
# than 0 that saves gets a file of its own.
checkpoint = "checkpoint.weights.h5" if rank == 0 else f"checkpoint.rank{{rank}}.weights.h5"
if save_here:
    fit_callbacks.append(tf.keras.callbacks.ModelCheckpoint(
        os.path.join(args.out, checkpoint), save_weights_only=True))

os.makedirs(args.out, exist_ok=True)
started = time.perf_counter()
history = model.fit(train, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
                    validation_data=(x_val, y_val), callbacks=fit_callbacks, verbose=2 if talk else 0)
seconds = time.perf_counter() - started

# ---- Measurements for the lab (not part of the conversion) ----
report = {{"size": size, "steps_per_epoch": steps_per_epoch,
          "seconds": seconds, "images_per_s": throughput.median,
          "device": device.profile.name if device.active else None, "device_overruns": device.overruns,
          "device_steps": device.steps,
          "history": {{k: [float(v) for v in vs] for k, vs in history.history.items()}}}}
# Not part of the conversion: the lab gathers every rank's weights to measure their spread.  # @init
flat = np.concatenate([w.ravel() for w in model.get_weights()])  # @init
every_rank = hvd.allgather(tf.constant(flat[None, :])).numpy()  # @init
report["weight_spread"] = float(np.abs(every_rank - every_rank[0]).max())  # @init
report["weight_scale"] = float(np.abs(every_rank[0]).mean())  # @init
if rank == 0:
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f)
'''

_MARKER = re.compile(r"\s+# @(!?)(\w+)$")


def _check_steps(steps) -> list[str]:
    unknown = set(steps) - set(STEPS)
    if unknown:
        raise ValueError(f"unknown conversion step(s) {sorted(unknown)}: choose from {list(STEPS)}")
    return [s for s in STEPS if s in steps]


def _lines(steps) -> list[tuple[str, str | None, bool]]:
    """(line without marker, step or None, present-when-enabled) for every template line."""
    _check_steps(steps)
    text = _TEMPLATE.format()
    out = []
    for line in text.splitlines():
        match = _MARKER.search(line)
        if match:
            out.append((line[:match.start()], match.group(2), match.group(1) == ""))
        else:
            out.append((line, None, True))
    return out


def script(steps_enabled=()) -> str:
    """The training script with exactly the conversion steps in ``steps_enabled``."""
    enabled = set(_check_steps(steps_enabled))
    kept = [line for line, step, when in _lines(enabled) if step is None or (step in enabled) == when]
    return "\n".join(kept) + "\n"


def step_lines(step: str) -> tuple[list[str], list[str]]:
    """The lines ``step`` adds and the lines it removes."""
    _check_steps([step])
    lines = _lines([])
    return ([line for line, s, when in lines if s == step and when],
            [line for line, s, when in lines if s == step and not when])


def cumulative(upto: str) -> list[str]:
    """The steps up to and including ``upto``, in the lab's order."""
    names = list(STEPS)
    return names[: names.index(upto) + 1]


def diff(a: str, b: str, name_a: str = "before", name_b: str = "after", context: int = 1) -> str:
    """A unified diff of two scripts, as ``git diff`` would show it."""
    return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                        fromfile=name_a, tofile=name_b, n=context))


def write_script(path, steps_enabled=()) -> Path:
    """Write the variant with ``steps_enabled`` to ``path`` (folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script(steps_enabled))
    return path


def ranks_printing(output: str) -> int:
    """How many ranks printed Keras progress: horovodrun prefixes each worker's line with ``[rank]``."""
    return len(set(re.findall(r"^\[(\d+)\]<stdout>:.* - loss: ", output, re.M)))


def run_report(run, out_dir, train_images: int) -> dict:
    """What one version's run did: rank 0's ``report.json`` plus the files it left, the number of
    checkpoint files, how many ranks printed progress and the launch's seconds; or, for a run that
    failed, ``{"failed": reason}`` (the reason and the end of its output, whole)."""
    if not run.ok:
        return {"failed": f"{run.failure_reason()}\n{run.output[-3000:]}"}
    out_dir = Path(out_dir)
    report = json.loads((out_dir / "report.json").read_text())
    files = sorted(p.name for p in out_dir.iterdir())
    report.update(files=files, checkpoints=sum(f.startswith("checkpoint") for f in files),
                  ranks_printing=ranks_printing(run.output), train_images=train_images, launch_s=run.seconds)
    return report


def summary(report: dict) -> str:
    """One line for a version as it ends (the notebook's progress)."""
    if "failed" in report:
        return "FAILED\n" + report["failed"]
    return (f"{report['steps_per_epoch']} steps/epoch, val acc {report['history']['val_accuracy'][-1]:.3f}, "
            f"weight spread {report['weight_spread']:.3g}, {report['ranks_printing']} rank(s) printing, "
            f"{report['checkpoints']} checkpoint file(s)")


def versions_table(runs: dict):
    """The versions side by side (a :class:`mgpu.runtime.tables.Table`); a failed version shows FAILED."""
    from mgpu.runtime.tables import Table

    rows = []
    for label, r in runs.items():
        if "failed" in r:
            rows.append({"version": label, "images": "FAILED (see above)"})
            continue
        # No images/s: the short versions run too few steps for a throughput worth reading.
        rows.append({"version": label, "images": r["train_images"], "steps/epoch": r["steps_per_epoch"],
                     "val acc": r["history"]["val_accuracy"][-1],
                     "weight spread": r["weight_spread"], "ranks printing": r["ranks_printing"],
                     "checkpoints": r["checkpoints"]})
    return Table(rows, formats={"val acc": ".3f", "weight spread": ".3g"})


_MIRRORED = '''\
"""The naive multi-device approach: one process, MirroredStrategy over several devices."""
import argparse
import json
import time

import numpy as np

import mgpu  # first: on TensorFlow 2.16+ it makes tf.keras the Keras 2 API the course uses
import tensorflow as tf

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--devices", type=int, default=4)
parser.add_argument("--batch", type=int, default=64, help="images per device per step")
parser.add_argument("--width", type=int, default=16)
parser.add_argument("--blocks", type=int, default=1)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--out", default="mirrored.json")
args = parser.parse_args()

# Without GPUs, split the CPU into logical devices. This must happen before TensorFlow creates its
# devices, which is why it runs in its own process and not in the notebook.
gpus = tf.config.list_physical_devices("GPU")
if gpus:
    names = [f"/gpu:{i}" for i in range(min(args.devices, len(gpus)))]
else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    names = [f"/cpu:{i}" for i in range(args.devices)]

from mgpu.runtime import data, models  # noqa: E402  (after the device set-up)

dataset = data.load("auto", seed=args.seed, verbose=False)


def rate(strategy, global_batch):
    """Images/s of training steps under ``strategy``, and of reading its input alone."""
    with strategy.scope():
        model = models.small_resnet(dataset.x_train.shape[1:], len(dataset.class_names),
                                    width=args.width, blocks=args.blocks, seed=args.seed)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    n = global_batch * (args.steps + 3)
    ds = tf.data.Dataset.from_tensor_slices((dataset.x_train[:n], dataset.y_train[:n])).batch(global_batch)
    # 3 warm-up steps, then timed ones; one fit call so both strategies pay the same overheads.
    model.fit(ds.take(3), verbose=0)
    started = time.perf_counter()
    model.fit(ds.skip(3), verbose=0)
    train = args.steps * global_batch / (time.perf_counter() - started)
    dist = strategy.experimental_distribute_dataset(ds)
    started = time.perf_counter()
    for i, batch in enumerate(dist):
        pass
    feed = (i + 1) * global_batch / (time.perf_counter() - started)
    return train, feed


b = args.batch
one = tf.distribute.OneDeviceStrategy(names[0])
mirrored = tf.distribute.MirroredStrategy(names)
result = {"devices": names}
result["one_device_batch_b"], result["feed_one_b"] = rate(one, b)
result["one_device_batch_nb"], result["feed_one_nb"] = rate(one, b * len(names))
result["mirrored_batch_nb"], result["feed_mirrored_nb"] = rate(mirrored, b * len(names))
with open(args.out, "w") as f:
    json.dump(result, f)
print(json.dumps(result, indent=1))
'''


def mirrored_script() -> str:
    """A script measuring MirroredStrategy over ``--devices`` devices against one device."""
    return _MIRRORED
