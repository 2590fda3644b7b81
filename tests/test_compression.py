"""mgpu.compression: 2-bit packing, byte counts, the Measured wrapper, and training with per-tensor
compressors on real Horovod workers. The 2-bit compressors are notebook 07's own, taken from its cells
(one instance per gradient tensor with error feedback, holding its residual)."""

import math

import numpy as np
import pytest

import mgpu  # noqa: F401  (before tensorflow)
from mgpu import compression, launch


# --------------------------------------------------------------------------------------------
# Encoding and bytes


@pytest.mark.parametrize("size", [1, 3, 4, 5, 17, 1000])
def test_pack_2bit_round_trips_and_takes_a_quarter_byte_per_value(size):
    t = 0.01
    rng = np.random.default_rng(size)
    values = (rng.integers(-1, 2, size) * np.float32(t)).astype(np.float32)
    payload = compression.pack_2bit(values, t)
    assert len(payload) == math.ceil(size / 4)
    back = compression.unpack_2bit(payload, t, values.shape)
    assert back.dtype == np.float32 and np.array_equal(back, values)
    grid = values[: size - size % 2].reshape(-1, 2) if size > 1 else values.reshape(1, 1)
    assert np.array_equal(compression.unpack_2bit(compression.pack_2bit(grid, t), t, grid.shape), grid)


def test_pack_2bit_refuses_values_that_are_not_quantised_and_unpack_refuses_a_wrong_length():
    with pytest.raises(ValueError, match="quantise first"):
        compression.pack_2bit(np.array([0.01, 0.005], np.float32), 0.01)
    payload = compression.pack_2bit(np.zeros(8, np.float32), 0.5)
    with pytest.raises(ValueError):
        compression.unpack_2bit(payload, 0.5, (9,))
    with pytest.raises(ValueError, match="corrupt"):
        compression.unpack_2bit(bytes([0b11]), 0.5, (1,))


def test_wire_bytes_per_scheme():
    sizes = [10, 3, 1000]
    assert compression.wire_bytes(sizes, "float32") == 4 * 1013
    assert compression.wire_bytes(sizes, "float16") == 2 * 1013
    assert compression.wire_bytes(sizes, "2bit") == 3 + 1 + 250
    with pytest.raises(KeyError):
        compression.wire_bytes(sizes, "1bit")


# --------------------------------------------------------------------------------------------
# A 2-bit compressor with error feedback, as a Horovod compressor


def _compressors():
    """Notebook 07's 2-bit compressors, without and with error feedback, defined by running its cells."""
    import nbformat
    import tensorflow as tf

    from mgpu import course

    notebook = next(p for p in course.course_notebooks() if p.name.startswith("07"))
    cells = nbformat.read(notebook, as_version=4).cells
    quantise = next(c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id") == "twobit_quantise_solution")
    classes = next(c.source for c in cells if "class TwoBitErrorFeedback" in c.source)
    namespace = {"tf": tf, "np": np, "compression": compression, "__name__": "notebook07_compressors"}
    exec(compile(quantise, "twobit_quantise_solution", "exec"), namespace)
    exec(compile(classes, "compressors", "exec"), namespace)
    return namespace["TwoBitCompressor"], namespace["TwoBitErrorFeedback"]


def test_measured_two_bit_error_feedback_round_trip_and_the_sent_sum_follows_the_true_sum():
    import tensorflow as tf

    two_bit, error_feedback = _compressors()
    t = 0.1
    shape = (3, 4)
    rng = np.random.default_rng(0)
    plain = compression.Measured(two_bit(t))
    fed = compression.Measured(error_feedback(t, tf.Variable(tf.zeros(shape))))
    true_sum, fed_sum, plain_sum = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for step in range(300):
        g = rng.uniform(-0.03, 0.07, size=shape).astype(np.float32)  # always below t: plain sends nothing
        sent, ctx = fed.compress(tf.constant(g))
        values = fed.decompress(sent, ctx).numpy()
        assert set(np.unique(values)) <= {np.float32(-t), np.float32(0), np.float32(t)}
        # Round trip through the 2-bit encoding is exact.
        assert np.array_equal(compression.unpack_2bit(compression.pack_2bit(values, t), t, shape), values)
        # The residual carried is exactly what was meant minus what was sent.
        true_sum += g
        fed_sum += values
        np.testing.assert_allclose(fed.inner.residual.numpy(), true_sum - fed_sum, atol=1e-4)
        plain_sum += plain.decompress(*plain.compress(tf.constant(g))).numpy()
    assert np.all(np.abs(fed_sum - true_sum) <= t + 1e-4), "error feedback keeps the sent sum within t of the true one"
    assert np.all(true_sum > 3) and np.all(plain_sum == 0), "without it, values below t are never sent"
    assert fed.values == 12 and fed.bytes == 48, "Measured records the size handed to Horovod (float32)"
    assert int(fed.total.numpy()) == 300 * 12 and 0 < int(fed.nonzero.numpy()) < 300 * 12
    assert int(plain.nonzero.numpy()) == 0


def _train(variant_names):
    import horovod.tensorflow as hvd

    two_bit, error_feedback = _compressors()
    t = 0.01
    factories = {
        "none": lambda vs: [hvd.Compression.none] * len(vs),
        "fp16": lambda vs: [hvd.Compression.fp16] * len(vs),
        "2bit-ef": lambda vs: [error_feedback(t, v) for v in vs],
        "2bit": lambda vs: [two_bit(t)] * len(vs),
    }
    return compression.train_with_compressors({k: factories[k] for k in variant_names}, train_images=1024,
                                              val_images=500, epochs=1, batch=32, lr=0.1, seeds=(0,),
                                              verbose=False)


@pytest.mark.slow
def test_training_with_per_tensor_compressors_on_two_horovod_workers():
    reports = launch.run(_train, 2, args=(["none", "fp16", "2bit-ef", "2bit"],), verbose=False).value
    by = {r["variant"]: r for r in reports}
    assert set(by) == {"none", "fp16", "2bit-ef", "2bit"}
    for r in reports:
        assert r["workers"] == 2 and r["steps"] == 1024 // 64
        assert r["weight_spread_across_ranks"] == 0.0, f"{r['variant']}: the ranks' weights differ"
        assert r["values_per_step"] == sum(r["tensor_sizes"]) == 784 * 128 + 128 + 128 * 10 + 10
    assert by["fp16"]["allreduce_bytes_per_step"] * 2 == by["none"]["allreduce_bytes_per_step"]
    assert by["2bit"]["allreduce_bytes_per_step"] == by["none"]["allreduce_bytes_per_step"], \
        "quantised values still travel as float32"
    # Error feedback sends more of the values than the plain quantiser, which drops everything below t.
    assert by["2bit-ef"]["nonzero_fraction"] > by["2bit"]["nonzero_fraction"]
    assert by["none"]["val_accuracy"] > 0.2, "16 steps of SGD should leave chance (0.1) behind"
