"""Input pipelines for notebook 03, from a naive Python loop to a tuned ``tf.data`` pipeline.

Every stage yields ``(images, labels)`` batches of ``image_size`` x ``image_size`` RGB crops (random
crop and horizontal flip of the stored JPEGs), so the same training step can consume any of them
and the same harness (:mod:`mgpu.runtime.measure`) can time them. Each stage adds one idea to the one
before it:

1. ``naive``: a Python loop that opens and decodes each JPEG with PIL, crops and normalises in numpy.
2. ``tf_sequential``: the same work as a ``tf.data`` graph, one image at a time.
3. ``parallel_map``: decoding in parallel, ``num_parallel_calls=AUTOTUNE``.
4. ``interleave``: reading several TFRecord shards at once instead of one file per image.
5. ``prefetch``: preparing the next batches while the current one trains.
6. ``cache``: decoding and resizing once; later epochs read decoded pixels from memory.
7. ``batched_augment``: random crops and flips applied to whole batches (one vectorised op).
8. ``uint8_transfer``: batches stay ``uint8``; the model normalises on the device (4x fewer bytes).
9. ``mixed_precision``: float16 compute on a GPU (skipped on a CPU, which has no fast float16).

``host_threads`` (every function that builds a pipeline takes it) gives the ``tf.data`` stages a
private pool of that many threads (:func:`on_host`); ``None`` leaves ``tf.data`` on TensorFlow's
shared threads.

Without a GPU, notebook 03 times the stages against the course's simulated accelerator
(:mod:`mgpu.runtime.accelerator`): a modelled device whose training step is a wait that holds no core
(:func:`device_step`), so every core is the host's, as beside a GPU. :func:`calibrate_device` sets
its speed between the naive loader's and the tuned pipeline's, timed alone on the machine at hand.
:func:`alone_and_training` times a pipeline alone and feeding the device in interleaved rounds, each
round starting with the pipeline's buffer drained, so both see the same machine. With a GPU, the GPU's
real training step is timed instead.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf
from PIL import Image

from mgpu.runtime.accelerator import Profile
from mgpu.lesson03.alexnet import MEAN, STD

AUTOTUNE = tf.data.AUTOTUNE


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    needs_gpu: bool = False
    uint8: bool = False     # batches are uint8; the model normalises
    overlaps: bool = True   # the next batch is prepared while the current one trains


STAGES = (
    Stage("naive", "Python loop, PIL decode", overlaps=False),
    Stage("tf_sequential", "tf.data, sequential decode", overlaps=False),
    Stage("parallel_map", "+ parallel map (AUTOTUNE)", overlaps=False),
    Stage("interleave", "+ interleaved TFRecord reads", overlaps=False),
    Stage("prefetch", "+ prefetch"),
    Stage("cache", "+ cache of decoded images"),
    Stage("batched_augment", "+ augmentation after batching"),
    Stage("uint8_transfer", "+ uint8 batches, normalise on device", uint8=True),
    Stage("mixed_precision", "+ mixed precision (GPU)", needs_gpu=True, uint8=True),
)

_MEAN = np.asarray(MEAN, np.float32)
_STD = np.asarray(STD, np.float32)


# ---- the naive loader -------------------------------------------------------------------------

def naive_batches(paths, labels, batch_size: int, image_size: int, seed: int = 0) -> Iterator:
    """What a first attempt looks like: one image at a time, in Python, on one core."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels, np.int32)
    while True:
        order = rng.permutation(len(paths))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            images = []
            for index in order[start:start + batch_size]:
                with Image.open(paths[index]) as picture:
                    pixels = np.asarray(picture.convert("RGB"))
                top = rng.integers(0, pixels.shape[0] - image_size + 1)
                left = rng.integers(0, pixels.shape[1] - image_size + 1)
                crop = pixels[top:top + image_size, left:left + image_size]
                if rng.random() < 0.5:
                    crop = crop[:, ::-1]
                images.append((crop.astype(np.float32) / 255.0 - _MEAN) / _STD)
            yield np.stack(images), labels[order[start:start + batch_size]]


# ---- tf.data pieces ----------------------------------------------------------------------------

def _normalize(images):
    return (tf.cast(images, tf.float32) / 255.0 - _MEAN) / _STD


def _random_crop_flip(image, image_size):
    image = tf.image.random_crop(image, (image_size, image_size, 3))
    return tf.image.random_flip_left_right(image)


#: A random crop (and, half the time, a left-right mirror) of one image: the image-by-image way to augment.
random_crop_flip = _random_crop_flip


def _decode_file(path, label):
    return tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label


_FEATURES = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
             "image/class/label": tf.io.FixedLenFeature([], tf.int64)}


def decode_record(record):
    """One TFRecord of the folder's shards: its decoded JPEG (uint8, height x width x 3) and label."""
    parsed = tf.io.parse_single_example(record, _FEATURES)
    return tf.io.decode_jpeg(parsed["image/encoded"], channels=3), tf.cast(parsed["image/class/label"], tf.int32)


def square(image, side):
    """Resize the short side to ``side`` and take the centre square: a fixed shape to cache."""
    return tf.image.resize_with_crop_or_pad(tf.image.resize(image, (side, side), preserve_aspect_ratio=True,
                                                            antialias=False), side, side)


def _batch_crop_flip(images, image_size):
    """Per-image random crops and flips for a whole batch with two gathers (no per-image ops)."""
    n, side = tf.shape(images)[0], tf.shape(images)[1]
    top = tf.random.uniform((n, 1), 0, side - image_size + 1, dtype=tf.int32)
    left = tf.random.uniform((n, 1), 0, side - image_size + 1, dtype=tf.int32)
    columns = left + tf.range(image_size)[None, :]
    flip = tf.random.uniform((n, 1)) < 0.5
    columns = tf.where(flip, tf.reverse(columns, axis=[1]), columns)
    rows = tf.gather(images, top + tf.range(image_size)[None, :], batch_dims=1)
    return tf.gather(rows, columns, axis=2, batch_dims=1)


def _without_hidden_prefetch(ds: tf.data.Dataset) -> tf.data.Dataset:
    """tf.data quietly works ahead of the consumer: it adds a prefetch after parallel maps, turns
    sequential maps into parallel ones, and fuses a map with the batch after it into one asynchronous
    step. Switch all three off so the stages before ``prefetch`` show what they really do (with the
    fusion on, a "sequential" pipeline overlapped training by a whole batch)."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.map_and_batch_fusion = False
    return ds.with_options(options)


def on_host(ds: tf.data.Dataset, host_threads: int | None) -> tf.data.Dataset:
    """``ds`` running on a private pool of ``host_threads`` threads (the host's cores), each of its
    functions on one thread; ``None`` returns ``ds`` as it is."""
    if host_threads is None:
        return ds
    if host_threads < 1:
        raise ValueError(f"host_threads must be at least 1, got {host_threads}")
    options = tf.data.Options()
    options.threading.private_threadpool_size = host_threads
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


def tf_dataset(stage: str, folder, batch_size: int, image_size: int, seed: int = 0,
               host_threads: int | None = None) -> tf.data.Dataset:
    """The ``tf.data`` pipeline of one stage (every stage but ``naive``), repeating forever."""
    return on_host(_stage_dataset(stage, folder, batch_size, image_size, seed), host_threads)


def _stage_dataset(stage: str, folder, batch_size: int, image_size: int, seed: int) -> tf.data.Dataset:
    names = [s.name for s in STAGES]
    if stage not in names or stage == "naive":
        raise ValueError(f"unknown tf.data stage {stage!r}: choose one of {', '.join(names[1:])}")
    level = names.index(stage)
    tf.random.set_seed(seed)
    crop = lambda image, label: (_normalize(_random_crop_flip(image, image_size)), label)  # noqa: E731
    parallel = AUTOTUNE if level >= names.index("parallel_map") else None

    if level < names.index("interleave"):
        files = tf.data.Dataset.from_tensor_slices((folder.paths(), np.asarray(folder.labels, np.int32)))
        ds = files.shuffle(len(folder.files), seed=seed).repeat()
        ds = ds.map(_decode_file, num_parallel_calls=parallel).map(crop, num_parallel_calls=parallel)
        return _without_hidden_prefetch(ds.batch(batch_size, drop_remainder=True))

    shards = tf.data.Dataset.from_tensor_slices(folder.tfrecord_paths()).shuffle(len(folder.tfrecords), seed=seed)
    records = shards.interleave(tf.data.TFRecordDataset, cycle_length=min(8, len(folder.tfrecords)),
                                num_parallel_calls=AUTOTUNE, deterministic=False)
    if level < names.index("cache"):
        ds = records.repeat().map(decode_record, num_parallel_calls=AUTOTUNE).map(crop, num_parallel_calls=AUTOTUNE)
        ds = ds.batch(batch_size, drop_remainder=True)
        return ds.prefetch(AUTOTUNE) if level >= names.index("prefetch") else _without_hidden_prefetch(ds)

    side = folder.short_side
    decoded = records.map(decode_record, num_parallel_calls=AUTOTUNE)
    decoded = decoded.map(lambda image, label: (tf.cast(square(image, side), tf.uint8), label),
                          num_parallel_calls=AUTOTUNE).cache()
    ds = decoded.shuffle(len(folder.files), seed=seed).repeat()
    if level == names.index("cache"):
        ds = ds.map(crop, num_parallel_calls=AUTOTUNE).batch(batch_size, drop_remainder=True)
        return ds.prefetch(AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda images, labels: (_batch_crop_flip(images, image_size), labels), num_parallel_calls=AUTOTUNE)
    if STAGES[level].uint8:
        ds = ds.map(lambda images, labels: (tf.cast(images, tf.uint8), labels))
    else:
        ds = ds.map(lambda images, labels: (_normalize(images), labels))
    return ds.prefetch(AUTOTUNE)


def batches(stage: str, folder, batch_size: int, image_size: int, seed: int = 0,
            host_threads: int | None = None) -> Iterator:
    """An endless iterator of ``(images, labels)`` batches from ``stage``."""
    if stage == "naive":  # one Python thread, whatever host_threads says
        return naive_batches(folder.paths(), folder.labels, batch_size, image_size, seed)
    return iter(tf_dataset(stage, folder, batch_size, image_size, seed, host_threads))


def fill_cache(stage: str, folder, batch_size: int, image_size: int, seed: int = 0,
               host_threads: int | None = None) -> Callable[[], Iterator]:
    """For caching stages, one pass that decodes every file, so timing sees only cached epochs.

    Returns a function that gives a fresh iterator over the (now filled) pipeline.
    """
    dataset = None if stage == "naive" else tf_dataset(stage, folder, batch_size, image_size, seed, host_threads)
    if dataset is not None and [s.name for s in STAGES].index(stage) >= [s.name for s in STAGES].index("cache"):
        iterator = iter(dataset)
        for _ in range(-(-len(folder.files) // batch_size) + 1):
            next(iterator)
        return lambda: iterator
    return lambda: batches(stage, folder, batch_size, image_size, seed, host_threads)


# ---- the modelled device -----------------------------------------------------------------------

class DeviceStep:
    """A training step on the modelled device ``profile``: it takes the profile's time for a batch of
    ``batch_size`` from the moment it is called (once its batch has arrived), a wait that holds no core
    and runs none of the model's math. Its arguments (the batch) are ignored.

    A device's step takes exactly its time; a sleeping program is woken a little late, more so on a
    busy machine. :meth:`clock` is ``time.perf_counter`` without that lateness (:attr:`late`, summed
    over the steps): time the steps with it, and the device takes exactly its time.
    """

    def __init__(self, profile: Profile, batch_size: int):
        self.seconds = profile.train_step_s(batch_size)
        self.late = 0.0

    def __call__(self, *batch) -> None:
        deadline = time.perf_counter() + self.seconds
        while (left := deadline - time.perf_counter()) > 0:  # sleep can wake early: wait out the rest
            time.sleep(left)
        self.late += time.perf_counter() - deadline

    def clock(self) -> float:
        return time.perf_counter() - self.late


def device_step(profile: Profile, batch_size: int) -> DeviceStep:
    """The modelled device's training step for batches of ``batch_size`` (:class:`DeviceStep`)."""
    return DeviceStep(profile, batch_size)


#: Batches drawn, untimed, before a prefetching pipeline is timed: more than its buffer holds (tf.data's
#: AUTOTUNE keeps a few batches ready), so the timing sees the pipeline's pace, not a buffer filled while
#: nothing was drawn.
DRAIN = 10


def alone_and_training(iterator, step, batch_size: int, *, repeats: int = 5, calls_per_round: int = 6,
                       drain: int = DRAIN):
    """Two :class:`mgpu.runtime.measure.Rate` of one pipeline (``iterator``): alone (batches drawn as fast as it
    delivers them) and feeding ``step`` (a :class:`DeviceStep`, or None to time it alone only).

    Their rounds interleave (alone, training, alone, ...), so a change in the machine's load touches both
    alike. Each round first draws ``drain`` batches untimed: whatever the pipeline prepared ahead during
    the previous round is used up, and every round times the pipeline's own pace from an empty buffer. A
    training round then takes one batch untimed and times, per call, the device's step on the batch in
    hand and the wait for the next: a pipeline faster than the device has the next batch ready (it was
    prepared during the step), one slower makes each call take its own time per batch.
    """
    from mgpu.runtime.measure import Rate, measure_rate

    clock = step.clock if step is not None else time.perf_counter
    held = []  # the batch in hand: a training call is the device's step on it, then the next batch

    def train():
        step(*held[0])
        held[0] = next(iterator)

    calls = {"alone": lambda: next(iterator)}
    if step is not None:
        calls["training"] = train
    rates = {name: Rate() for name in calls}
    for _ in range(max(drain, 2)):  # warm-up: the first batches also trace the pipeline's functions
        next(iterator)
    for _ in range(repeats):
        for name, call in calls.items():
            for _ in range(drain):
                next(iterator)
            if name == "training":  # the first batch, untimed: from an empty buffer it is not prepared ahead
                held[:] = [next(iterator)]
            one = measure_rate(call, batch_size, warmup=0, repeats=1, calls_per_round=calls_per_round, clock=clock)
            rates[name].rounds += one.rounds
            rates[name].seconds_per_call += one.seconds_per_call
    return rates["alone"], rates.get("training")


@dataclass
class DeviceCalibration:
    """The modelled device of notebook 03 and the two rates that set it."""

    profile: Profile
    naive_rate: float    # images/s the naive loader delivers alone
    tuned_rate: float    # images/s the tuned pipeline delivers alone, timed in rounds interleaved with the naive one's
    tuned: str           # the stage timed as the tuned pipeline

    @property
    def rate(self) -> float:
        """Images/s the device trains at."""
        return 1 / self.profile.train_s_per_example

    @property
    def factor(self) -> float:
        """How many times faster than the naive loader, and slower than the tuned pipeline, the device is."""
        return self.rate / self.naive_rate


def device_between(naive_rate: float, tuned_rate: float, tuned: str = "uint8_transfer",
                   cores: int | None = None) -> Profile:
    """The modelled device at the geometric mean of two rates alone (images/s): as many times faster than
    the naive loader as it is slower than the tuned pipeline."""
    if not 0 < naive_rate < tuned_rate:
        raise ValueError(f"the tuned pipeline ({tuned_rate:,.0f} images/s) must be faster than the naive loader "
                         f"({naive_rate:,.0f}/s)")
    rate = math.sqrt(naive_rate * tuned_rate)
    factor = rate / naive_rate
    where = f" on this machine's {cores} cores" if cores else " on this machine"
    return Profile(
        name="sim-fed-device", train_s_per_example=1 / rate, eval_s_per_example=1 / (3 * rate),
        basis=(f"Its speed, {rate:,.0f} images/s, is the geometric mean of what the naive loader ({naive_rate:,.0f}/s) "
               f"and the tuned pipeline ({tuned}, {tuned_rate:,.0f}/s) deliver alone{where}: {factor:.1f}x "
               f"the one, 1/{factor:.1f} of the other."))


def calibrate_device(folder, *, batch_size: int, image_size: int, seed: int = 0, host_threads: int | None = None,
                     repeats: int = 5, steps_per_round: int = 3, tuned: str = "uint8_transfer",
                     cores: int | None = None, attempts: int = 3) -> DeviceCalibration:
    """A modelled device that the naive loader cannot feed and the tuned pipeline can, on this machine.

    The naive loader and the tuned pipeline (``tuned``, by default every idea of :data:`STAGES` a CPU
    can use) are timed alone as :func:`measure_stages` times them (:func:`alone_and_training`, each
    round after a drained buffer); the device trains at the geometric mean of their rates
    (:func:`device_between`). If the tuned
    pipeline does not come out faster (a machine too busy to time anything), it is timed again, up to
    ``attempts`` times.
    """
    for attempt in range(attempts):
        naive = batches("naive", folder, batch_size, image_size, seed)
        naive_rate = alone_and_training(naive, None, batch_size, repeats=repeats, calls_per_round=steps_per_round,
                                        drain=0)[0].median
        ready = fill_cache(tuned, folder, batch_size, image_size, seed, host_threads)()
        tuned_rate = alone_and_training(ready, None, batch_size, repeats=repeats,
                                        calls_per_round=2 * steps_per_round)[0].median
        del ready  # its cache: memory the stages will need
        if tuned_rate > naive_rate:
            break
    else:
        raise RuntimeError(f"the tuned pipeline ({tuned_rate:,.0f} images/s) was not faster than the naive loader "
                           f"({naive_rate:,.0f}/s) in {attempts} attempts: the machine is too busy to time them; "
                           "close other programs and run the cell again")
    return DeviceCalibration(device_between(naive_rate, tuned_rate, tuned, cores), naive_rate, tuned_rate, tuned)


# ---- measuring the stages ----------------------------------------------------------------------

#: Training at this fraction of the ceiling or more counts as fed (the model, not the input, limits it).
FED = 0.9
#: A pipeline alone below this multiple of the model's ceiling has no margin over it ("just fed").
JUST_FED = 1.2
#: A pipeline alone at least this multiple of the model's ceiling has a clear margin: it is not what holds
#: training back, even when training falls short of the ceiling.
MARGIN = 1.5
#: No pipeline can make training faster than the ceiling: a stage measured above this multiple of the ceiling
#: beside it was timed while the machine was busy, and is not a candidate for the best stage.
SANE = 1.15
#: Stages whose training is within this fraction of the fastest sound stage's are tied: the best stage is the
#: first of them, so that a later stage measured a little faster is not presented as a gain.
TIED = 0.05


@dataclass
class StageResult:
    stage: Stage
    pipeline_rate: float | None  # images/s the pipeline alone delivers (no training)
    train_rate: float | None     # images/s of training fed by the pipeline
    ceiling_rate: float | None   # images/s of the device this stage feeds, on data already on it, same rounds
    # images/s of the lab's float32 model on data already on the device, timed in the same rounds; None when
    # the stage feeds that model (then it is ceiling_rate). Stages that change the model (uint8 input,
    # mixed precision) on a GPU have their own ceiling; this one puts every stage on the same scale.
    reference_rate: float | None = None
    modelled: bool = False       # the device is the simulated accelerator (a wait that holds no core)

    @property
    def fraction_of_ceiling(self) -> float | None:
        """Training over the ceiling of the model this stage feeds (its own model: for uint8 stages, not the lab's)."""
        if self.train_rate is None:
            return None
        return self.train_rate / self.ceiling_rate

    @property
    def fraction_of_reference(self) -> float | None:
        """Training over the float32 model's ceiling timed beside it: the same scale for every stage."""
        if self.train_rate is None:
            return None
        return self.train_rate / (self.reference_rate if self.reference_rate is not None else self.ceiling_rate)

    @property
    def predicted_fraction(self) -> float | None:
        """The fraction of the ceiling the two rates predict: without prefetching a step takes preparing
        *plus* training; with it, the longer of the two."""
        if self.train_rate is None:
            return None
        if self.stage.overlaps:
            return min(1.0, self.pipeline_rate / self.ceiling_rate)
        return self.pipeline_rate / (self.pipeline_rate + self.ceiling_rate)

    @property
    def waiting_share(self) -> float | None:
        """Share of each step spent waiting for the batch, if preparing it does not overlap training."""
        if self.train_rate is None or self.stage.overlaps:
            return None
        return (1 / self.pipeline_rate) / (1 / self.pipeline_rate + 1 / self.ceiling_rate)

    @property
    def bottleneck(self) -> str:
        """What limits training: "input pipeline", "compute", or "shared machine".

        A prefetching stage that trains at ``FED`` of the ceiling or more is compute-bound. Below that,
        it is input-bound only if its pipeline alone has no margin over the model (less than ``MARGIN``
        x the ceiling); a pipeline that alone delivers well above what the model needs is not short of
        speed, and what is missing comes from the two sharing the machine ("shared machine"). On the
        modelled device nothing is shared (its step holds no core): short of ``FED`` is input-bound.
        """
        if self.train_rate is None:
            return "not run"
        if self.stage.overlaps:  # what training reached says it; the pipeline alone is timed apart
            if self.fraction_of_ceiling >= FED:
                return "compute"
            if self.modelled:
                return "input pipeline"
            return "input pipeline" if self.pipeline_rate < MARGIN * self.ceiling_rate else "shared machine"
        return "input pipeline" if self.waiting_share > 0.1 else "compute"


def sound(results: list[StageResult]) -> list[StageResult]:
    """The trained stages whose measurement is possible: at most ``SANE`` x the ceiling beside them."""
    return [r for r in results if r.train_rate is not None and r.fraction_of_ceiling <= SANE]


def best_stage(results: list[StageResult]) -> StageResult:
    """The stage whose training went fastest, each measured against the same ceiling (the float32 model's).

    Every stage trains the same network on the same images, so what counts is images of training per
    second. Comparing each stage's fraction of *its own* model's ceiling would favour a stage that slows the
    model down (a lower ceiling is easier to reach); raw images/s would favour a stage measured while the
    machine happened to be faster. The fraction of the float32 model's ceiling, timed in the same rounds,
    is neither. A stage measured above ``SANE`` x its ceiling is left out (the machine was busy), and of the
    stages within ``TIED`` of the fastest the first is chosen: a later one is no gain over it.
    """
    candidates = sound(results)
    if not candidates:
        raise ValueError("no stage was trained with a sound measurement")
    top = max(r.fraction_of_reference for r in candidates)
    return next(r for r in candidates if r.fraction_of_reference >= (1 - TIED) * top)


def first_fed(results: list[StageResult]) -> StageResult | None:
    """The first stage whose training reached ``FED`` of the ceiling in a sound measurement, or None."""
    return next((r for r in sound(results) if r.fraction_of_reference >= FED), None)


def _describe_on_device(r: StageResult) -> str:
    """The sentence of a stage timed on the modelled device: the two rates, the prediction, the measurement."""
    p, d = r.pipeline_rate, r.ceiling_rate
    measured = f"measured {r.fraction_of_ceiling:.2f}x"
    if not r.stage.overlaps:
        return (f"{r.stage.name}: starved, waits for every batch. A step takes preparing the batch ({1e3 / p:.2f} ms "
                f"per image alone) plus the accelerator's step ({1e3 / d:.2f} ms per image), which predicts "
                f"{r.predicted_fraction:.2f}x the accelerator's rate; {measured}.")
    verdict = "fed" if r.fraction_of_ceiling >= FED else "starved"
    predicted = r.predicted_fraction
    if (predicted >= FED) == (r.fraction_of_ceiling >= FED):
        agreement = "."
    elif predicted >= FED and min(p, d) * JUST_FED > max(p, d):
        agreement = ("; it fell short: with so little margin, batches slower than the average empty the buffer "
                     "and the accelerator waits.")
    elif predicted >= FED:
        agreement = "; it fell short: the pipeline ran slower while feeding than alone."
    else:
        agreement = "; it did better: the pipeline ran faster while feeding than alone."
    return (f"{r.stage.name}: {verdict}, {r.fraction_of_ceiling:.2f}x the accelerator's rate. Batches are prepared "
            f"during the accelerator's step, so a step takes about the longer of the two: its pipeline alone "
            f"({p:,.0f} images/s) beside the accelerator ({d:,.0f}/s) predicts {predicted:.2f}x{agreement}")


def describe_bottleneck(r: StageResult, on_gpu: bool = False) -> str:
    """One sentence, from the measurements, on what limits training at this stage and why."""
    if r.train_rate is None:
        return f"{r.stage.name}: not run here (it needs a GPU)."
    if r.fraction_of_ceiling > SANE:
        return (f"{r.stage.name}: measured {r.fraction_of_ceiling:.2f}x the ceiling beside it, which no pipeline can "
                f"reach: the machine was busy while it was timed, so this stage is left out of the comparison.")
    if r.modelled:
        return _describe_on_device(r)
    measured = f"training reaches {r.fraction_of_ceiling:.2f}x the ceiling"
    own_model = ""
    if r.reference_rate is not None:
        own_model = (f" (This stage's model differs from the float32 one: its ceiling is "
                     f"{r.ceiling_rate / r.reference_rate:.2f}x the float32 model's {r.reference_rate:,.0f}/s timed "
                     f"beside it, and its training {r.fraction_of_reference:.2f}x that.)")
    if not r.stage.overlaps:
        kind = "input-bound" if r.bottleneck == "input pipeline" else "compute-bound"
        return (f"{r.stage.name}: {kind}. Without prefetching, the next batch is mostly prepared after the step "
                f"asks for it, so the model waits about {r.waiting_share:.0%} of every step (pipeline alone "
                f"{r.pipeline_rate:,.0f} images/s, model {r.ceiling_rate:,.0f}/s): the waiting predicts "
                f"{1 - r.waiting_share:.2f}x the ceiling; {measured}.{own_model}")
    if r.bottleneck == "input pipeline":
        pace = ("does not keep up with" if r.pipeline_rate < r.ceiling_rate else
                "has little margin over")
        return (f"{r.stage.name}: input-bound. Batches are prepared during the previous step, but the pipeline "
                f"(alone {r.pipeline_rate:,.0f} images/s) {pace} the {r.ceiling_rate:,.0f}/s the "
                f"model can train on; {measured}.{own_model}")
    if r.pipeline_rate < JUST_FED * r.ceiling_rate:
        return (f"{r.stage.name}: just fed. Batches are prepared during the previous step; the pipeline alone "
                f"({r.pipeline_rate:,.0f} images/s, timed on its own) has no margin over the model "
                f"({r.ceiling_rate:,.0f}/s), yet {measured}: fed for now, but a slower moment of the pipeline "
                f"would show at once.{own_model}")
    gap = 1 - r.fraction_of_ceiling
    sharing = ("host-device copies and scheduling" if on_gpu else
               "caches, memory bandwidth, the threads that launch each step")
    reason = ("" if gap <= 0.02 else f"; the missing {gap:.0%} comes from the pipeline and the model sharing the "
              f"machine ({sharing}), not from the pipeline's speed alone")
    kind = ("compute-bound" if r.bottleneck == "compute" else
            "not input-bound, slowed by sharing the machine")
    return (f"{r.stage.name}: {kind}. Batches are prepared during the previous step, and the pipeline alone "
            f"could deliver {r.pipeline_rate:,.0f} images/s, {r.pipeline_rate / r.ceiling_rate:.1f}x what the "
            f"model needs; {measured}{reason}.{own_model}")


def measure_stages(folder, *, batch_size: int, image_size: int, width: float, repeats: int = 5,
                   steps_per_round: int = 3, seed: int = 0, have_gpu: bool = False,
                   host_threads: int | None = None, device: Profile | None = None,
                   prepared: dict | None = None, progress: bool = True) -> list[StageResult]:
    """Time every stage: the pipeline alone, and training fed by it beside the ceiling.

    ``device``: a modelled device (:func:`calibrate_device`); each step is its wait
    (:func:`device_step`, timed on its clock) and the ceiling is its rate; each stage is timed alone and
    training in interleaved rounds (:func:`alone_and_training`). Without one, the step is AlexNet's
    real training step (on a GPU, where there is one) and the ceiling the same step on a batch already
    on the device. The ceiling is re-measured in rounds interleaved with each stage's, so the ratio
    stays fair on a machine whose speed drifts. ``prepared``: stages already filled, by name (a
    function giving an iterator, as :func:`fill_cache` returns), reused instead of filled again.
    """
    from tqdm.auto import tqdm

    from mgpu.runtime.measure import measure_rate, measure_side_by_side

    prepared = dict(prepared or {})
    results = []
    if device is not None:
        for stage in tqdm(STAGES, desc="pipeline stages", disable=not progress):
            if stage.needs_gpu:
                results.append(StageResult(stage, None, None, None, modelled=True))
                continue
            fresh = prepared.pop(stage.name, None) or fill_cache(stage.name, folder, batch_size, image_size, seed,
                                                                 host_threads)
            # Alone and training in interleaved rounds of one iterator, each round after a drained buffer (a
            # stage that does not prefetch still has a parallel map's few images in flight: one batch drains it).
            alone, training = alone_and_training(fresh(), device_step(device, batch_size), batch_size,
                                                 repeats=repeats, calls_per_round=2 * steps_per_round,
                                                 drain=DRAIN if stage.overlaps else 1)
            pipeline_rate, train_rate = alone.median, training.median
            results.append(StageResult(stage, pipeline_rate, train_rate, 1 / device.train_s_per_example,
                                       modelled=True))
        return results

    from mgpu.lesson03 import alexnet

    float_model = alexnet.alexnet(image_size, width=width, seed=seed)
    uint8_model = alexnet.alexnet(image_size, width=width, uint8_input=True, seed=seed)
    steps = {False: alexnet.make_train_step(float_model), True: alexnet.make_train_step(uint8_model)}
    # Synthetic batches already in memory (on the GPU, if there is one), in each model's input type.
    on_device = {False: tf.random.normal((batch_size, image_size, image_size, 3), seed=seed),
                 True: tf.cast(tf.random.uniform((batch_size, image_size, image_size, 3), 0, 256, seed=seed),
                               tf.uint8)}
    on_device_labels = tf.zeros((batch_size,), tf.int32)

    for stage in tqdm(STAGES, desc="pipeline stages", disable=not progress):
        if stage.needs_gpu and not have_gpu:
            results.append(StageResult(stage, None, None, None))
            continue
        if stage.needs_gpu:
            tf.keras.mixed_precision.set_global_policy("mixed_float16")
            try:
                step = alexnet.make_train_step(alexnet.alexnet(image_size, width=width, uint8_input=True, seed=seed))
            finally:
                tf.keras.mixed_precision.set_global_policy("float32")
        else:
            step = steps[stage.uint8]
        # The ceiling of the model this stage feeds: the same step on a batch already in memory. A stage that
        # changes the model also times the float32 model's ceiling in the same rounds (the common scale).
        ceiling_batch = on_device[stage.uint8]
        changes_model = stage.uint8 or stage.needs_gpu
        fresh = prepared.pop(stage.name, None) or fill_cache(stage.name, folder, batch_size, image_size, seed,
                                                             host_threads)
        alone = fresh()
        pipeline_rate = measure_rate(lambda: next(alone), batch_size, warmup=2, repeats=repeats,
                                     calls_per_round=steps_per_round * 2).median
        feeding = fresh()
        calls = {"ceiling": lambda: step(ceiling_batch, on_device_labels).numpy(),
                 "train": lambda: step(*next(feeding)).numpy()}
        if changes_model:
            calls["reference"] = lambda: steps[False](on_device[False], on_device_labels).numpy()
        rates = measure_side_by_side(calls, batch_size, warmup=2, repeats=repeats, calls_per_round=steps_per_round)
        results.append(StageResult(stage, pipeline_rate, rates["train"].median, rates["ceiling"].median,
                                   rates["reference"].median if changes_model else None))
    return results


def stages_table(results: list[StageResult], batch_size: int):
    """The stages side by side (a :class:`mgpu.runtime.tables.Table`): images/s of the pipeline alone, of
    training fed by it and of the ceiling beside it; training as a fraction of that ceiling (the model the
    stage feeds), the fraction the two rates predict, and, where a stage changed the model, of the float32
    model's ceiling (the same scale for every stage); ms per batch."""
    from mgpu.runtime.tables import Table

    two_models = any(r.reference_rate is not None for r in results)
    ceiling = "accelerator /s" if any(r.modelled for r in results) else "ceiling /s"
    rows = []
    for r in results:
        if r.train_rate is None:
            rows.append({"stage": r.stage.name, "pipeline alone /s": "(needs a GPU)"})
            continue
        row = {"stage": r.stage.name, "pipeline alone /s": r.pipeline_rate, "training /s": r.train_rate,
               ceiling: r.ceiling_rate, "of its ceiling": r.fraction_of_ceiling, "predicted": r.predicted_fraction}
        if two_models:
            row["of float32 ceiling"] = r.fraction_of_reference
        row.update({"ms/batch in": 1e3 * batch_size / r.pipeline_rate,
                    "ms/batch train": 1e3 * batch_size / r.train_rate})
        rows.append(row)
    formats = {"pipeline alone /s": ",.0f", "training /s": ",.0f", ceiling: ",.0f", "of its ceiling": ".2f",
               "predicted": ".2f", "of float32 ceiling": ".2f", "ms/batch in": ".1f", "ms/batch train": ".1f"}
    table = Table(rows)
    return Table(rows, formats={k: v for k, v in formats.items() if k in table.columns})


def profile_training(step, iterator, logdir, steps: int = 5) -> list:
    """Record TensorFlow's profiler trace of ``steps`` training steps into ``logdir``.

    Open it with ``tensorboard --logdir <logdir>`` (the Profile tab: trace viewer and the
    input-pipeline analyser). Returns the trace files written.
    """
    from pathlib import Path

    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    step(*next(iterator)).numpy()  # traced and warmed before recording
    tf.profiler.experimental.start(str(logdir))
    try:
        for number in range(steps):
            with tf.profiler.experimental.Trace("train", step_num=number, _r=1):
                step(*next(iterator)).numpy()
    finally:
        tf.profiler.experimental.stop()
    return sorted(logdir.rglob("*.xplane.pb"))


def crop_costs(batch_size: int, side: int, image_size: int, *, repeats: int = 5, calls_per_round: int = 3,
               seed: int = 0) -> dict[str, float]:
    """Milliseconds to crop and flip one batch of ``side`` x ``side`` uint8 squares on this machine, image by
    image (as the ``cache`` stage does, in its map) and with the two gathers of ``batched_augment``; medians
    of rounds interleaved with each other."""
    from mgpu.runtime.measure import measure_side_by_side

    squares = tf.cast(tf.random.uniform((batch_size, side, side, 3), 0, 256, seed=seed), tf.uint8)
    by_image = tf.function(lambda: tf.stack([_random_crop_flip(squares[i], image_size) for i in range(batch_size)]))
    gathers = tf.function(lambda: _batch_crop_flip(squares, image_size))
    rates = measure_side_by_side({"image by image": lambda: by_image().numpy(), "two gathers": lambda: gathers().numpy()},
                                 batch_size, warmup=2, repeats=repeats, calls_per_round=calls_per_round)
    return {name: 1e3 * batch_size / rate.median for name, rate in rates.items()}
