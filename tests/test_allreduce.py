"""The from-scratch ring all-reduce: exact sums, 2(N-1)/N traffic, and agreement with Horovod."""

import numpy as np
import pytest

from mgpu.lesson04 import allreduce
from mgpu.runtime import launch


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("shape", [(12,), (5, 3), (1,), (10, 10, 3)])
def test_every_worker_ends_with_the_sum(workers, shape):
    rng = np.random.default_rng(workers * 100 + len(shape))
    inputs = [rng.integers(-1000, 1000, size=shape).astype(np.int64) for _ in range(workers)]
    results, _ = allreduce.ring_allreduce(inputs)
    expected = np.sum(inputs, axis=0)
    assert len(results) == workers
    for result in results:
        np.testing.assert_array_equal(result, expected)  # integers: exact


@pytest.mark.parametrize("workers", [2, 3, 4, 8])
def test_each_worker_sends_two_n_minus_one_over_n_of_the_vector(workers):
    vector = np.zeros(workers * 1000, dtype=np.float32)  # divisible: the fraction is exact
    _, sent = allreduce.ring_allreduce([vector] * workers)
    expected = allreduce.ring_traffic_fraction(workers) * vector.nbytes
    assert np.all(sent == expected)


def test_ragged_chunks_still_send_about_the_ideal_amount():
    vector = np.zeros(1001, dtype=np.float64)  # 4 does not divide 1001
    _, sent = allreduce.ring_allreduce([vector] * 4)
    ideal = allreduce.ring_traffic_fraction(4) * vector.nbytes
    assert np.all(np.abs(sent - ideal) <= 2 * 3 * vector.itemsize)  # one element per step at most


def test_steps_follow_the_two_phases():
    steps = list(allreduce.ring_allreduce_steps([np.arange(8.0) * (r + 1) for r in range(4)]))
    assert [s.phase for s in steps] == ["start"] + ["reduce-scatter"] * 3 + ["all-gather"] * 3
    # After reduce-scatter, worker i holds the complete sum of chunk (i + 1) mod 4.
    after_scatter = steps[3]
    total = np.arange(8.0) * 10
    for worker in range(4):
        owned = (worker + 1) % 4
        np.testing.assert_array_equal(after_scatter.chunks[worker][owned], np.array_split(total, 4)[owned])
    # every send goes to the right-hand neighbour
    assert all(j == (i + 1) % 4 for s in steps[1:] for i, j, _ in s.sends)


def test_mismatched_arrays_are_refused():
    with pytest.raises(ValueError, match="same shape and dtype"):
        allreduce.ring_allreduce([np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="at least one"):
        allreduce.ring_allreduce([])


def _horovod_sum(seed):
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    mine = np.random.default_rng(seed + hvd.rank()).normal(size=(37, 3)).astype(np.float32)
    summed = hvd.allreduce(tf.constant(mine), op=hvd.Sum).numpy()
    everyone = hvd.allgather(tf.constant(mine[None])).numpy()
    return {"horovod": summed, "inputs": everyone}


@pytest.mark.slow
def test_agrees_with_horovods_allreduce():
    value = launch.run(_horovod_sum, 4, args=(5,), verbose=False).value
    ours, _ = allreduce.ring_allreduce(list(value["inputs"]))
    # float32 sums in a different order: equal to rounding
    np.testing.assert_allclose(ours[0], value["horovod"], rtol=1e-5, atol=1e-5)
