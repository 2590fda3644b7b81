"""Reference GPU numbers (mgpu.runtime.reference): the copy in data/reference/ and the questions 03 asks of it."""

import pytest

from mgpu.runtime import reference


def test_the_reference_says_where_it_was_measured_and_holds_what_03_reads():
    ref = reference.load()
    assert "H100" in ref["gpu"] and ref["gpu"] in reference.provenance() and "2026-11-26" in reference.provenance()
    rows = reference.call_costs(threads=2)
    assert [r["batch"] for r in rows] == sorted(r["batch"] for r in rows) and len(rows) >= 5
    assert all(r["cpu_us"] > 0 and r["gpu_with_copies_us"] > 0 and r["gpu_resident_us"] > 0 for r in rows)
    assert all({"batch", "cpu16_us", "gpu_with_copies_us"} <= set(r) for r in ref["mlp_784_512_512_10"])
    with pytest.raises(ValueError, match="no tiny-model rows for 3 threads"):
        reference.call_costs(threads=3)
    with pytest.raises(FileNotFoundError, match="checkout is incomplete"):
        reference.load("no_such_gpu")


def test_crossover_is_the_first_batch_where_the_gpu_is_faster():
    rows = [{"batch": 100, "cpu": 5.0, "gpu": 4.0}, {"batch": 1, "cpu": 1.0, "gpu": 9.0},
            {"batch": 10, "cpu": 2.0, "gpu": 3.0}]
    assert reference.crossover(rows, "cpu", "gpu") == 100
    assert reference.crossover(rows[1:], "cpu", "gpu") is None


def test_matmul_rows_hold_each_size_once_with_its_dtypes():
    rows = reference.matmul_rows()
    assert [r["n"] for r in rows] == sorted({r["n"] for r in rows})
    assert all(r["float32"] > 0 and r["float16"] > 0 for r in rows)
    # Tensor-core shapes: at 4096 float16 runs several times float32, and more than at 4095.
    by_n = {r["n"]: r for r in rows}
    assert by_n[4096]["float16"] / by_n[4096]["float32"] > by_n[4095]["float16"] / by_n[4095]["float32"] > 1
