"""Notebook 03's JPEG folder and input pipelines: correct files, correct batches, honest diagnoses."""

import io
import json
import math
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from mgpu.lesson03 import imagefolder, pipeline
from mgpu.runtime import accelerator, data


@pytest.fixture(scope="module")
def small_dataset():
    x = np.random.default_rng(0).integers(0, 256, size=(200, 28, 28), dtype=np.uint8)
    y = (np.arange(200) % 10).astype(np.uint8)
    return data.Dataset("tiny", x, y, x[:20], y[:20], class_names=tuple(f"class {i}" for i in range(10)),
                        real=False, fingerprint=data.fingerprint("tiny", x, y))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MGPU_DATA_DIR", str(tmp_path))
    return tmp_path


def test_folder_of_balanced_decodable_jpegs_and_matching_tfrecords(small_dataset, cache):
    folder = imagefolder.build_image_folder(small_dataset, n_images=40, short_side=64, shards=4, verbose=False)
    assert len(folder.files) == 40 and sorted(np.bincount(folder.labels)) == [4] * 10
    for relative, label in zip(folder.files, folder.labels):
        assert relative.startswith(f"train/{label}_class_{label}/")
        with Image.open(folder.root / relative) as picture:
            assert picture.format == "JPEG" and picture.mode == "RGB" and min(picture.size) == 64
            assert max(picture.size) <= round(64 * 4 / 3)
    encoded = set()
    for path in folder.tfrecord_paths():
        for record in tf.data.TFRecordDataset(path):
            example = tf.train.Example.FromString(record.numpy())
            encoded.add(example.features.feature["image/encoded"].bytes_list.value[0])
    assert encoded == {(folder.root / f).read_bytes() for f in folder.files}
    manifest = json.loads((folder.root / "manifest.json").read_text())
    assert manifest["source_fingerprint"] == small_dataset.fingerprint


def test_folder_is_cached_and_a_failed_build_leaves_nothing(small_dataset, cache, monkeypatch):
    first = imagefolder.build_image_folder(small_dataset, n_images=20, short_side=64, verbose=False)
    stamp = (first.root / "manifest.json").stat().st_mtime_ns
    again = imagefolder.build_image_folder(small_dataset, n_images=20, short_side=64, verbose=False)
    assert (again.root / "manifest.json").stat().st_mtime_ns == stamp
    calls = {"n": 0}
    real_render = imagefolder._render

    def failing_render(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # as if the user stopped the build
        return real_render(*args)

    monkeypatch.setattr(imagefolder, "_render", failing_render)
    with pytest.raises(KeyboardInterrupt):
        imagefolder.build_image_folder(small_dataset, n_images=30, short_side=64, verbose=False)
    leftovers = [p.name for p in cache.iterdir() if "n30" in p.name]
    assert leftovers == []


@pytest.mark.parametrize("stage", [s.name for s in pipeline.STAGES if not s.needs_gpu])
def test_every_stage_yields_crops_of_the_right_shape_type_and_range(small_dataset, cache, stage):
    folder = imagefolder.build_image_folder(small_dataset, n_images=40, short_side=64, shards=4, verbose=False)
    batches = pipeline.fill_cache(stage, folder, batch_size=8, image_size=48)()
    images, labels = next(batches)
    images, labels = np.asarray(images), np.asarray(labels)
    assert images.shape == (8, 48, 48, 3) and labels.shape == (8,)
    assert set(labels.tolist()) <= set(range(10))
    if pipeline.STAGES[[s.name for s in pipeline.STAGES].index(stage)].uint8:
        assert images.dtype == np.uint8
    else:
        assert images.dtype == np.float32
        # normalised with mean 0.5 and std 0.25: pixels in [-2, 2]
        assert images.min() >= -2.0001 and images.max() <= 2.0001 and images.std() > 0.05


def test_batched_crops_are_windows_of_each_image_possibly_mirrored():
    tf.random.set_seed(3)
    images = tf.reshape(tf.range(6 * 10 * 10 * 3, dtype=tf.float32), (6, 10, 10, 3))
    crops = pipeline._batch_crop_flip(images, 4).numpy()
    source = images.numpy()
    for crop, image in zip(crops, source):
        windows = [image[t:t + 4, l:l + 4] for t in range(7) for l in range(7)]
        assert any(np.array_equal(crop, w) or np.array_equal(crop, w[:, ::-1]) for w in windows)


def test_bottleneck_diagnosis_follows_the_numbers():
    serial = pipeline.StageResult(pipeline.STAGES[0], pipeline_rate=100.0, train_rate=50.0, ceiling_rate=100.0)
    assert serial.waiting_share == pytest.approx(0.5) and serial.bottleneck == "input pipeline"
    assert "waits about 50%" in pipeline.describe_bottleneck(serial)
    starved = pipeline.StageResult(pipeline.STAGES[4], pipeline_rate=80.0, train_rate=78.0, ceiling_rate=100.0)
    assert starved.bottleneck == "input pipeline" and "input-bound" in pipeline.describe_bottleneck(starved)
    fed = pipeline.StageResult(pipeline.STAGES[5], pipeline_rate=500.0, train_rate=90.0, ceiling_rate=100.0)
    text = pipeline.describe_bottleneck(fed)
    assert fed.bottleneck == "compute" and "compute-bound" in text and "sharing the machine" in text and "10%" in text
    assert "host-device" in pipeline.describe_bottleneck(fed, on_gpu=True)
    # Prefetched batches at about the model's rate: fed, with no margin, whatever the pipeline alone measured.
    close = pipeline.StageResult(pipeline.STAGES[4], pipeline_rate=95.0, train_rate=97.0, ceiling_rate=100.0)
    assert close.bottleneck == "compute" and "just fed" in pipeline.describe_bottleneck(close)


def test_a_pipeline_with_a_margin_is_not_called_the_bottleneck_when_training_falls_short():
    # The learner's run: cache's pipeline alone delivered 852 images/s against the model's 440, training
    # reached less than 0.9 of the ceiling; that is not the input's fault, and the sentence must not say so.
    cache = pipeline.StageResult(pipeline.STAGES[5], pipeline_rate=852.0, train_rate=370.0, ceiling_rate=440.0)
    assert cache.fraction_of_ceiling < pipeline.FED
    assert cache.bottleneck == "shared machine"
    text = pipeline.describe_bottleneck(cache)
    assert text.startswith("cache: not input-bound, slowed by sharing the machine.")
    assert "1.9x what the model needs" in text and "not from the pipeline's speed alone" in text
    # Short of the ceiling with a pipeline alone only just above the model: input-bound, and said without
    # claiming the pipeline was slower than the model.
    tight = pipeline.StageResult(pipeline.STAGES[4], pipeline_rate=105.0, train_rate=80.0, ceiling_rate=100.0)
    assert tight.bottleneck == "input pipeline"
    text = pipeline.describe_bottleneck(tight)
    assert "input-bound" in text and "has little margin over" in text and "does not keep up" not in text
    # Short of the ceiling with a pipeline alone only 1.2-1.5x the model: still counted as input-bound.
    thin = pipeline.StageResult(pipeline.STAGES[6], pipeline_rate=130.0, train_rate=71.0, ceiling_rate=100.0)
    assert thin.bottleneck == "input pipeline"
    # A prefetching stage at the ceiling although its pipeline alone timed slower: just fed, no margin.
    ahead = pipeline.StageResult(pipeline.STAGES[4], pipeline_rate=70.0, train_rate=93.0, ceiling_rate=100.0)
    assert ahead.bottleneck == "compute" and "just fed" in pipeline.describe_bottleneck(ahead)
    # At the ceiling with a margin: compute-bound, nothing missing to explain.
    fed = pipeline.StageResult(pipeline.STAGES[6], pipeline_rate=300.0, train_rate=99.0, ceiling_rate=100.0)
    assert fed.bottleneck == "compute" and "missing" not in pipeline.describe_bottleneck(fed)


def test_the_best_stage_is_chosen_on_the_same_ceiling_for_every_stage():
    # The learner's run: uint8_transfer reached its own (lower) ceiling but trained slower than the stages
    # after prefetch; on the float32 model's ceiling timed beside it, it is not the best.
    names = {s.name: s for s in pipeline.STAGES}
    results = [
        pipeline.StageResult(names["naive"], 300.0, 200.0, 440.0),
        pipeline.StageResult(names["prefetch"], 450.0, 380.0, 440.0),
        pipeline.StageResult(names["cache"], 852.0, 430.0, 445.0),
        pipeline.StageResult(names["batched_augment"], 800.0, 425.0, 440.0),
        pipeline.StageResult(names["uint8_transfer"], 900.0, 271.0, 275.0, reference_rate=442.0),
        pipeline.StageResult(names["mixed_precision"], None, None, None),
    ]
    uint8 = results[4]
    assert uint8.fraction_of_ceiling > max(r.fraction_of_ceiling for r in results[:4])  # the old, unfair choice
    assert uint8.fraction_of_reference == pytest.approx(271 / 442)
    assert results[2].fraction_of_reference == results[2].fraction_of_ceiling
    assert pipeline.best_stage(results).stage.name == "cache"
    assert "0.62x the float32 model" in pipeline.describe_bottleneck(uint8)
    # Where the changed model trains faster than the float32 one (a GPU), it wins on the same scale.
    gpu = results[:4] + [pipeline.StageResult(names["mixed_precision"], 5000.0, 900.0, 950.0, reference_rate=445.0)]
    assert pipeline.best_stage(gpu).stage.name == "mixed_precision"
    with pytest.raises(ValueError):
        pipeline.best_stage([results[-1]])
    table = pipeline.stages_table(results, 32)
    assert table.rows[4]["of its ceiling"] == pytest.approx(271 / 275)
    assert table.rows[4]["of float32 ceiling"] == pytest.approx(271 / 442)


def test_stages_before_prefetch_do_not_work_ahead_and_host_threads_give_a_private_pool(small_dataset, cache):
    folder = imagefolder.build_image_folder(small_dataset, n_images=40, short_side=64, shards=4, verbose=False)
    names = [s.name for s in pipeline.STAGES if not s.needs_gpu and s.name != "naive"]
    for stage in names:
        options = pipeline.tf_dataset(stage, folder, 8, 48, host_threads=1).options()
        ahead = names.index(stage) >= names.index("prefetch")
        # tf.data's own prefetch and its asynchronous map-and-batch would make a sequential stage overlap.
        assert (options.experimental_optimization.inject_prefetch is False) is not ahead, stage
        assert (options.experimental_optimization.map_and_batch_fusion is False) is not ahead, stage
        assert options.threading.private_threadpool_size == 1 and options.threading.max_intra_op_parallelism == 1
    assert pipeline.tf_dataset("cache", folder, 8, 48).options().threading.private_threadpool_size is None
    images, _ = next(pipeline.fill_cache("uint8_transfer", folder, 8, 48, host_threads=1)())
    assert images.shape == (8, 48, 48, 3)
    with pytest.raises(ValueError, match="host_threads"):
        pipeline.on_host(tf.data.Dataset.range(3), 0)


def test_the_best_stage_leaves_out_impossible_measurements_and_later_stages_that_are_no_gain():
    names = {s.name: s for s in pipeline.STAGES}
    results = [
        pipeline.StageResult(names["naive"], 100.0, 30.0, 100.0, modelled=True),
        pipeline.StageResult(names["prefetch"], 80.0, 78.0, 100.0, modelled=True),
        pipeline.StageResult(names["cache"], 300.0, 97.0, 100.0, modelled=True),
        # Above the sanity limit: a busy machine during the measurement, not a pipeline faster than the device.
        pipeline.StageResult(names["batched_augment"], 400.0, 130.0, 100.0, modelled=True),
        # A little faster than cache, but within the tie: no gain over the earlier stage.
        pipeline.StageResult(names["uint8_transfer"], 500.0, 99.0, 100.0, modelled=True),
    ]
    assert [r.stage.name for r in pipeline.sound(results)] == ["naive", "prefetch", "cache", "uint8_transfer"]
    assert pipeline.best_stage(results).stage.name == "cache"
    assert pipeline.first_fed(results).stage.name == "cache"
    assert "left out" in pipeline.describe_bottleneck(results[3])
    # A clearly faster later stage does win; nothing sound and fed: no first fed stage.
    results[4] = pipeline.StageResult(names["uint8_transfer"], 500.0, 100.0, 100.0, modelled=True)
    results[2] = pipeline.StageResult(names["cache"], 300.0, 90.0, 100.0, modelled=True)
    assert pipeline.best_stage(results).stage.name == "uint8_transfer"
    assert pipeline.first_fed(results[:2]) is None
    with pytest.raises(ValueError, match="sound"):
        pipeline.best_stage([results[3]])


def test_on_the_modelled_device_each_sentence_gives_the_prediction_of_the_two_rates():
    names = {s.name: s for s in pipeline.STAGES}
    serial = pipeline.StageResult(names["naive"], 100.0, 48.0, 300.0, modelled=True)
    assert serial.predicted_fraction == pytest.approx(0.25)  # 10 ms + 3.3 ms per image
    text = pipeline.describe_bottleneck(serial)
    assert text.startswith("naive: starved, waits for every batch") and "predicts 0.25x" in text
    assert "measured 0.16x" in text
    # One definition of fed, measured and predicted alike: at least FED of the device's rate.
    starved = pipeline.StageResult(names["prefetch"], 150.0, 140.0, 300.0, modelled=True)
    assert starved.predicted_fraction == pytest.approx(0.5) and starved.bottleneck == "input pipeline"
    text = pipeline.describe_bottleneck(starved)
    assert text.startswith("prefetch: starved, 0.47x") and "predicts 0.50x." in text and "fell short" not in text
    fed = pipeline.StageResult(names["cache"], 900.0, 295.0, 300.0, modelled=True)
    assert fed.predicted_fraction == 1.0 and pipeline.describe_bottleneck(fed).startswith("cache: fed, 0.98x")
    # Short although the pipeline alone was faster: on the device nothing is shared, so not "shared machine".
    short = pipeline.StageResult(names["cache"], 900.0, 200.0, 300.0, modelled=True)
    assert short.bottleneck == "input pipeline" and "ran slower while feeding" in pipeline.describe_bottleneck(short)
    close = pipeline.StageResult(names["cache"], 310.0, 200.0, 300.0, modelled=True)
    assert "so little margin" in pipeline.describe_bottleneck(close)
    table = pipeline.stages_table([serial, fed, pipeline.StageResult(names["mixed_precision"], None, None, None)], 32)
    assert "accelerator /s" in table.columns and "of float32 ceiling" not in table.columns
    assert table.rows[0]["predicted"] == pytest.approx(0.25)


def test_the_device_step_takes_its_time_and_holds_no_core():
    profile = accelerator.Profile("d", 0.004, 0.001)  # 4 ms per image: 40 ms for a batch of 10
    step = pipeline.device_step(profile, 10)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(3):
        step("any", "batch")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.12 and cpu < 0.05
    # On its clock the device takes exactly its time: the program's late wake-ups are not counted.
    assert step.late >= 0 and 0.12 <= wall - step.late < 0.17  # (a busy machine can also delay the calls)
    before = step.clock()
    step()
    assert 0.04 <= step.clock() - before < 0.09
    line = profile.line(math_runs=False)
    assert "4.00 ms per image" in line and "without the model's math" in line and "math runs for real" not in line
    assert profile.line().startswith("Timed on the simulated accelerator 'd': each worker's math runs for real")


def test_alone_and_training_interleave_rounds_of_one_pipeline_after_a_drain():
    drawn = []

    def source():
        while True:
            drawn.append(time.perf_counter())
            yield "images", "labels"

    profile = accelerator.Profile("d", 0.001, 0.001)  # 10 ms for a batch of 10
    step = pipeline.device_step(profile, 10)
    alone, training = pipeline.alone_and_training(source(), step, 10, repeats=3, calls_per_round=2, drain=4)
    assert len(alone.rounds) == len(training.rounds) == 3
    assert len(drawn) == 4 + 3 * (4 + 2) + 3 * (4 + 1 + 2)  # warm-up; rounds drain 4, training takes 1 untimed
    assert all(rate < 1000 * 1.01 for rate in training.rounds) and alone.median > 5 * training.median
    only, none = pipeline.alone_and_training(source(), None, 10, repeats=2, calls_per_round=2, drain=0)
    assert none is None and len(only.rounds) == 2


def test_the_device_sits_between_the_naive_loader_and_the_tuned_pipeline():
    profile = pipeline.device_between(100.0, 900.0, "uint8_transfer", cores=2)
    assert 1 / profile.train_s_per_example == pytest.approx(300.0)  # 3x faster than the one, 3x slower than the other
    assert "geometric mean" in profile.basis and "uint8_transfer, 900/s" in profile.basis and "3.0x" in profile.basis
    assert "2 cores" in profile.basis
    with pytest.raises(ValueError, match="must be faster"):
        pipeline.device_between(900.0, 100.0)


def test_calibrated_stages_are_timed_against_the_device_and_never_above_it(small_dataset, cache):
    folder = imagefolder.build_image_folder(small_dataset, n_images=40, short_side=96, shards=4, verbose=False)
    try:
        device = pipeline.calibrate_device(folder, batch_size=8, image_size=64, repeats=3, steps_per_round=2)
    except RuntimeError as error:  # tiny JPEGs decode fast: on a busy machine the two can come out level
        assert "too busy" in str(error)
        device = None
    if device is not None:
        assert device.naive_rate < device.rate < device.tuned_rate
        assert device.factor == pytest.approx(device.tuned_rate / device.rate)
    # A device of 40 ms for a batch of 8.
    slow = accelerator.Profile("slow", 0.005, 0.001)
    results = pipeline.measure_stages(folder, batch_size=8, image_size=64, width=0.1, repeats=3, steps_per_round=3,
                                      device=slow, progress=False)
    timed = [r for r in results if r.train_rate is not None]
    assert len(timed) == len(pipeline.STAGES) - 1 and all(r.modelled for r in results)
    for r in timed:  # the device's rate is the ceiling, and on its clock no stage can train faster
        assert r.ceiling_rate == pytest.approx(200)
        assert r.fraction_of_ceiling <= 1.001
