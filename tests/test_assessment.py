"""mgpu.assessment: the data hand-off, the weights files the grader reads, the locked callbacks."""

import io
import json
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from mgpu.runtime import data, launch
from mgpu import assessment


@pytest.fixture(scope="module")
def dataset():
    return data.load("synthetic", verbose=False)


def test_export_writes_train_and_validation_only(dataset, tmp_path):
    x_test, y_test = assessment.export_data(dataset, tmp_path, train_images=500, val_images=100, test_images=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset.json", "train.npz", "val.npz"]
    x, y, x_val, y_val, info = assessment.load_data(tmp_path)
    assert x.shape[0] == 500 and x_val.shape[0] == 100 and len(y) == 500 and len(y_val) == 100
    assert info["fingerprint"] == dataset.fingerprint and tuple(info["image_shape"]) == dataset.image_shape
    # the held-out images are the test split's, returned and never written
    np.testing.assert_array_equal(x_test, dataset.x_test[:300])
    np.testing.assert_array_equal(y_test, dataset.y_test[:300])
    written = np.concatenate([x.reshape(len(x), -1), x_val.reshape(len(x_val), -1)])
    test_rows = {row.tobytes() for row in x_test.reshape(len(x_test), -1)}
    assert not any(row.tobytes() in test_rows for row in written)
    # validation and training images are disjoint slices of the training split
    np.testing.assert_array_equal(x_val, dataset.x_train[-100:])


def test_practice_data_matches_what_the_grader_hands_out(tmp_path):
    row = assessment.profile("cpu", 2)
    assessment.prepare_practice_data(tmp_path / "practice", "cpu", 2)
    assert assessment.has_data(tmp_path / "practice")
    x, _, x_val, _, info = assessment.load_data(tmp_path / "practice")
    assert len(x) == row.train_images and len(x_val) == row.val_images
    assert info["name"] == data.load(row.dataset, verbose=False).name


def test_missing_data_folder_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir"):
        assessment.load_data(tmp_path / "nowhere")


def test_weights_round_trip_into_the_reference_model(tmp_path):
    trained = assessment.reference_model(seed=3)
    path = assessment.save_weights_atomically(trained.get_weights(), tmp_path / "epoch_000.npz")
    fresh = assessment.reference_model(seed=0)
    x = np.random.default_rng(0).integers(0, 255, size=(8, 28, 28), dtype=np.uint8)
    assert not np.allclose(fresh(x).numpy(), trained(x).numpy())
    assessment.load_epoch_weights(path, fresh)
    np.testing.assert_allclose(fresh(x).numpy(), trained(x).numpy(), rtol=1e-6)
    assert list(assessment.epoch_files(tmp_path)) == [0]
    assert not list(tmp_path.glob("*.tmp"))


def _reject(path, match):
    with pytest.raises(assessment.WeightsRejected, match=match):
        assessment.load_epoch_weights(path, assessment.reference_model())


def test_weights_of_another_architecture_are_rejected_with_the_reason(tmp_path):
    weights = assessment.reference_model().get_weights()
    np.savez(tmp_path / "fewer.npz", *weights[:-1])
    _reject(tmp_path / "fewer.npz", f"holds {len(weights) - 1} arrays, the reference model has {len(weights)}")
    wrong = [*weights[:-1], np.zeros((weights[-1].shape[0] + 1,), np.float32)]
    np.savez(tmp_path / "shape.npz", *wrong)
    _reject(tmp_path / "shape.npz", f"weight {len(weights) - 1} has shape")


def test_pickled_or_non_numpy_files_are_never_loaded(tmp_path):
    weights = assessment.reference_model().get_weights()
    objects = [np.array([{"evil": 1}], dtype=object) if i == 0 else w for i, w in enumerate(weights)]
    np.savez(tmp_path / "pickled.npz", *objects)
    _reject(tmp_path / "pickled.npz", "not a plain numpy")
    (tmp_path / "text.npz").write_text("not a zip")
    _reject(tmp_path / "text.npz", "not a plain numpy")
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("arr_0.npy", b"\0" * (assessment.MAX_WEIGHTS_BYTES + 1))
    _reject(tmp_path / "bomb.npz", "unpacks to")


def _npy_member(shape, descr="<f4", data=b"") -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    header += " " * (63 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


def test_a_header_is_checked_before_numpy_allocates_what_it_declares(tmp_path):
    weights = assessment.reference_model().get_weights()

    def npz(name, first: bytes):
        with zipfile.ZipFile(tmp_path / name, "w") as archive:
            archive.writestr("arr_0.npy", first)
            for i, weight in enumerate(weights[1:], 1):
                buffer = io.BytesIO()
                np.save(buffer, weight)
                archive.writestr(f"arr_{i}.npy", buffer.getvalue())
        return tmp_path / name

    # A terabyte declared (numpy would try to allocate it: MemoryError), then the right shape with
    # too few bytes behind it; both refused from the header alone.
    _reject(npz("huge.npz", _npy_member((10 ** 12,), data=b"\0" * 64)), r"weight 0 has shape \(1000000000000,\)")
    _reject(npz("short.npz", _npy_member(weights[0].shape, data=b"\0" * 64)), "declares more bytes than")
    _reject(npz("object.npz", _npy_member(weights[0].shape, descr="|O")), "not a plain numpy")
    full = np.zeros(weights[0].shape, np.float32).tobytes()
    model = assessment.reference_model()
    assessment.load_epoch_weights(npz("honest.npz", _npy_member(weights[0].shape, data=full)), model)
    assert not model.get_weights()[0].any()


def test_profile_lookup_errors_name_the_choices():
    row = next(iter(assessment.PROFILES.values()))
    assert assessment.profile(row.name, row.workers) is row
    with pytest.raises(KeyError, match="choose one of"):
        assessment.profile("no-such-profile", 2)
    with pytest.raises(KeyError, match="--workers"):
        assessment.profile(row.name, 97)


def test_protected_callbacks_in_one_process_save_every_epoch_and_report_no_horovod(tmp_path):
    model = assessment.reference_model()
    model.compile(tf.keras.optimizers.SGD(0.01), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(64, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=64)
    # target 2.0 can never be reached: training runs every epoch
    model.fit(x, y, epochs=3, batch_size=16, validation_data=(x, y), verbose=0,
              callbacks=assessment.protected_callbacks(tmp_path, target_accuracy=2.0, time_budget_s=600))
    assert list(assessment.epoch_files(tmp_path)) == [0, 1, 2]
    facts = assessment.read_run_facts(tmp_path)
    assert facts.processes == 1 and facts.horovod_sizes == [1]
    assert facts.distributed_optimizer is False and facts.weights_in_sync is None
    assert facts.epochs_done == 3


def test_the_stop_rule_waits_further_above_the_target_when_the_splits_are_small(tmp_path):
    from mgpu.runtime import callbacks

    def threshold(data_dir):
        [stop] = [c for c in assessment.protected_callbacks(tmp_path / "out", 0.80, 600, data_dir)
                  if isinstance(c, callbacks.StopAtAccuracy)]
        return stop.target

    dataset = data.load("synthetic", verbose=False)
    small, large = tmp_path / "small", tmp_path / "large"
    assessment.export_data(dataset, small, train_images=1000, val_images=500, test_images=1000)
    assessment.export_data(dataset, large, train_images=1000, val_images=5000, test_images=10000)
    # 500 and 1000 images: accuracies at 0.80 differ by 2.5 x sqrt(0.16 (1/500 + 1/1000)) = 0.054 or less
    # most of the time; 5000 and 10000 images need no more than the floor of 0.02.
    assert threshold(small) == pytest.approx(0.80 + 2.5 * (0.16 * (1 / 500 + 1 / 1000)) ** 0.5)
    assert threshold(large) == pytest.approx(0.80 + assessment.STOP_MARGIN)
    assert threshold(None) == pytest.approx(0.80 + assessment.STOP_MARGIN)  # sizes unknown: the floor
    # a run's stop rule can only end training late: it never waits less than the floor
    assert threshold(small) > threshold(large)


def test_no_facts_means_training_never_ran(tmp_path):
    with pytest.raises(AssertionError, match="no training process reported"):
        assessment.read_run_facts(tmp_path)


def _train_on_workers(output_dir, convert):
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    from mgpu import assessment

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.integers(0, 255, size=(64, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=64)
    model = assessment.reference_model(seed=hvd.rank())  # different initial weights per rank
    optimizer = tf.keras.optimizers.SGD(0.01)
    callbacks = []
    if convert:
        optimizer = hvd.DistributedOptimizer(optimizer)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, epochs=2, batch_size=16, validation_data=(x, y), verbose=0,
              callbacks=callbacks + assessment.protected_callbacks(output_dir, 2.0, 600))


@pytest.mark.slow
@pytest.mark.parametrize("convert", [True, False], ids=["converted", "not-converted"])
def test_facts_tell_a_horovod_conversion_from_none(tmp_path, convert):
    launch.run(_train_on_workers, 2, args=(str(tmp_path), convert), verbose=False, timeout=300)
    facts = assessment.read_run_facts(tmp_path)
    assert facts.processes == 2 and facts.horovod_sizes == [2, 2]
    assert facts.distributed_optimizer is convert
    assert facts.weights_in_sync is convert
    # only rank 0 saved weights
    assert list(assessment.epoch_files(tmp_path)) == [0, 1]
    records = [json.loads(p.read_text()) for p in tmp_path.glob("facts-*.json")]
    assert sorted(r["rank"] for r in records) == [0, 1]


def test_an_optimizer_altered_on_its_instance_is_named():
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    assert assessment.replaced_methods(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))) == []
    # A learning rate given as a function lives on the instance too, and is not an alteration.
    assert assessment.replaced_methods(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(lambda: 0.1))) == []
    patched = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    patched._allreduce = lambda grads, variables: list(grads)  # the copy the probe steps would still average
    assert assessment.replaced_methods(patched) == ["_allreduce"]
    inner = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.1))
    inner._allreduce_grads = lambda grads, variables: grads
    assert assessment.replaced_methods(inner) == ["_allreduce_grads"]


def test_weights_holding_nan_or_infinity_are_rejected_with_the_reason(tmp_path):
    weights = assessment.reference_model().get_weights()
    for bad in (np.nan, np.inf):
        broken = [w.copy() for w in weights]
        broken[0].flat[3] = bad
        np.savez(tmp_path / "diverged.npz", *broken)
        _reject(tmp_path / "diverged.npz", "weight 0 holds NaN or infinite values")
