"""mgpu.lesson07.compression and notebook 07's exercises: the 2-bit quantiser with error feedback, its codes packed
four to a byte and all-gathered through Horovod, the wire log, and training with per-tensor reducers on
real Horovod workers. The notebook's own solutions are taken from its cells."""

import math

import nbformat
import numpy as np
import pytest

import mgpu  # noqa: F401  (before tensorflow)
from mgpu.lesson07 import compression
from mgpu.runtime import course, launch


def _notebook_cells():
    notebook = next(p for p in course.course_notebooks() if p.name.startswith("07"))
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nbformat.read(notebook, as_version=4).cells
            if "nbgrader" in c.metadata}


# --------------------------------------------------------------------------------------------
# Codes, packing, bytes (one process)


@pytest.mark.parametrize("size", [1, 3, 4, 5, 17, 1000])
def test_pack_codes_round_trips_and_takes_a_quarter_byte_per_value(size):
    codes = np.random.default_rng(size).integers(0, 4, size).astype(np.uint8)
    packed = compression.pack_codes(codes)
    assert packed.dtype == np.uint8 and packed.size == math.ceil(size / 4)
    assert np.array_equal(compression.unpack_codes(packed, size), codes)
    assert compression.pack_codes([1, 2, 3, 0, 3]).tolist() == [1 + 2 * 4 + 3 * 16, 3]


def test_pack_codes_refuses_a_code_above_3_and_unpack_a_wrong_length():
    with pytest.raises(ValueError):
        compression.pack_codes([4])
    with pytest.raises(ValueError):
        compression.unpack_codes(np.zeros(2, np.uint8), 9)


def test_wire_bytes_per_scheme():
    sizes = [10, 3, 1000]
    assert compression.wire_bytes(sizes, "float32") == 4 * 1013
    assert compression.wire_bytes(sizes, "float16") == 2 * 1013
    assert compression.wire_bytes(sizes, "2bit") == 3 + 1 + 250
    with pytest.raises(KeyError):
        compression.wire_bytes(sizes, "1bit")


def _solutions():
    """Notebook 07's solutions of both exercises, defined by running their cells."""
    import tensorflow as tf

    cells = _notebook_cells()
    namespace = {"tf": tf, "np": np, "__name__": "notebook07_solutions"}
    for grade_id in ("twobit_quantise_solution", "twobit_allreduce_solution"):
        exec(compile(cells[grade_id], grade_id, "exec"), namespace)
    return namespace


@pytest.mark.parametrize("quantise", ["library", "notebook"])
def test_twobit_quantise_matches_numpy_and_the_residual_is_what_was_lost(quantise):
    import tensorflow as tf

    fn = compression.twobit_quantise if quantise == "library" else _solutions()["twobit_quantise"]
    rng = np.random.default_rng(1)
    values, residual = rng.normal(size=(7, 9)).astype(np.float32), rng.normal(0, 0.1, (7, 9)).astype(np.float32)
    codes, scale, new_residual = fn(tf.constant(values), tf.constant(residual))
    corrected = values + residual
    assert codes.dtype == tf.uint8 and codes.shape == (7, 9)
    assert np.isclose(float(scale), np.mean(np.abs(corrected)), rtol=1e-6)
    reference = compression.reference_codes(corrected, scale.numpy())
    assert np.array_equal(codes.numpy(), reference) and set(np.unique(reference)) == {0, 1, 2, 3}
    levels = (reference.astype(np.float32) - np.float32(1.5)) * scale.numpy()
    assert np.array_equal(new_residual.numpy(), corrected - levels)
    # Each value went to its nearest level: no residual exceeds half a level's spacing, bar the values beyond 2 scales.
    inside = np.abs(corrected) <= 2 * scale.numpy()
    assert np.all(np.abs(new_residual.numpy()[inside]) <= 0.5 * scale.numpy() + 1e-6)


# --------------------------------------------------------------------------------------------
# On real Horovod workers


@pytest.mark.slow
def test_the_notebooks_allgather_exercise_passes_its_test_cell_on_two_workers():
    """The notebook's test cell of exercise 2 (two steps on 2 real workers, checked against numpy) with its solution."""
    import tensorflow as tf

    namespace = _solutions()
    namespace.update({"launch": launch, "compression": compression, "seed": 3})
    exec(compile(_notebook_cells()["twobit_allreduce_tests"], "twobit_allreduce_tests", "exec"), namespace)
    runs = namespace["gc_runs"]
    assert len(runs) == 2 and all(len(r["wire"]) == 2 for r in runs)
    assert all(e["op"] == "allgather" for r in runs for w in r["wire"] for e in w)
    assert isinstance(namespace["gc_runs"][0]["averages"][0], np.ndarray) and tf is not None


def _library_and_training(variant_names):
    """On each worker: two steps of the library's twobit_allreduce (recorded), then a short training per variant."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rng = np.random.default_rng([5, hvd.rank()])
    gradients = [rng.normal(0, 1, (6, 11)).astype(np.float32) for _ in range(2)]
    residual, steps = tf.zeros((6, 11)), []
    for g in gradients:
        with compression.wire_log(keep_values=True) as wire:
            average, residual = compression.twobit_allreduce(tf.constant(g), residual)
        steps.append({"gradient": g, "average": average.numpy(), "residual": residual.numpy(), "wire": wire})
    steps = hvd.allgather_object(steps)

    factories = {
        "none": lambda vs: [hvd.Compression.none] * len(vs),
        "fp16": lambda vs: [hvd.Compression.fp16] * len(vs),
        "2bit-ef": lambda vs: [compression.ErrorFeedback(compression.twobit_allreduce, v) for v in vs],
        "2bit": lambda vs: [compression.ErrorFeedback(compression.twobit_allreduce, v, feedback=False) for v in vs],
    }
    reports = compression.train_with_compressors({k: factories[k] for k in variant_names}, train_images=1024,
                                                 val_images=500, epochs=1, batch=32, lr=0.1, seeds=(0,),
                                                 verbose=False)
    return steps, reports


@pytest.mark.slow
def test_library_allreduce_and_training_with_per_tensor_reducers_on_two_horovod_workers():
    steps, reports = launch.run(_library_and_training, 2, args=(["none", "fp16", "2bit-ef", "2bit"],),
                                verbose=False).value
    # The library's 2-bit all-reduce: 17 bytes of codes and a scale on the wire, the numpy average on both workers.
    residuals = [np.zeros((6, 11), np.float32)] * 2
    for step in range(2):
        levels = []
        for rank in range(2):
            s = steps[rank][step]
            wire = {e["dtype"]: e for e in s["wire"]}
            assert [e["bytes"] for e in s["wire"]] == [17, 4] and set(wire) == {"uint8", "float32"}
            corrected = s["gradient"] + residuals[rank]
            scale = np.float32(wire["float32"]["value"][0])
            codes = compression.reference_codes(corrected, scale)
            assert np.array_equal(wire["uint8"]["value"], compression.pack_codes(codes))
            levels.append((codes.astype(np.float32) - np.float32(1.5)) * scale)
            residuals[rank] = corrected - levels[-1]
            assert np.array_equal(s["residual"], residuals[rank])
        for rank in range(2):
            assert np.array_equal(steps[rank][step]["average"], np.mean(levels, axis=0))

    by = {r["variant"]: r for r in reports}
    assert set(by) == {"none", "fp16", "2bit-ef", "2bit"}
    sizes = [784 * 128, 128, 128 * 10, 10]
    for r in reports:
        assert r["workers"] == 2 and r["steps"] == 1024 // 64
        assert r["weight_spread_across_ranks"] == 0.0, f"{r['variant']}: the ranks' weights differ"
        assert r["tensor_sizes"] == sizes
    # The bytes handed to Horovod, from one trace of the step: float32, half of it, and 2-bit codes plus scales.
    assert by["none"]["wire_bytes_per_step"] == 4 * sum(sizes)
    assert {e["op"] for e in by["none"]["wire"]} == {"allreduce"}
    assert by["fp16"]["wire_bytes_per_step"] == 2 * sum(sizes)
    for name in ("2bit-ef", "2bit"):
        assert by[name]["wire_bytes_per_step"] == compression.wire_bytes(sizes, "2bit") + 4 * len(sizes)
        assert {e["op"] for e in by[name]["wire"]} == {"allgather"}
    assert by["none"]["val_accuracy"] > 0.2, "16 steps of SGD should leave chance (0.1) behind"
