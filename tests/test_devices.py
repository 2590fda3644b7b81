"""Device choice without hardware: one GPU per local rank (fake device lists), CPU thread split."""

import pytest

from mgpu.runtime import launch


def test_each_local_rank_gets_its_own_gpu():
    gpus = ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    chosen = [launch.choose_gpu(rank, gpus, local_size=4) for rank in range(4)]
    assert chosen == gpus  # one each, none shared


def test_fewer_workers_than_gpus_is_fine():
    assert launch.choose_gpu(1, ["a", "b", "c", "d"], local_size=2) == "b"


def test_more_workers_than_gpus_is_refused_with_the_fix():
    with pytest.raises(launch.LaunchError, match="start at most 2 workers per host"):
        launch.choose_gpu(0, ["a", "b"], local_size=4)


def test_local_rank_without_a_gpu_is_refused():
    with pytest.raises(launch.LaunchError, match="local rank 2 has no GPU"):
        launch.choose_gpu(2, ["a", "b"])


def test_no_gpu_means_cpu():
    assert launch.choose_gpu(3, [], local_size=4) is None


@pytest.mark.parametrize("workers, cores, threads", [(1, 2, 2), (2, 2, 1), (4, 2, 1), (4, 16, 4), (3, 8, 2)])
def test_threads_split_the_cores(workers, cores, threads):
    assert launch.threads_per_worker(workers, cores) == threads


def test_zero_workers_is_an_error():
    with pytest.raises(ValueError, match="at least 1"):
        launch.threads_per_worker(0, 2)
