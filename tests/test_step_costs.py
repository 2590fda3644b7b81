"""Notebook 04's in-worker measurements on 2 real Horovod workers: the all-reduce check and step costs."""

import math

import numpy as np
import pytest

from mgpu.lesson04 import allreduce, step_costs
from mgpu.runtime import launch

pytestmark = pytest.mark.slow


def _both():
    check = step_costs.allreduce_check(1001, 5)
    costs = step_costs.step_costs_by_batch([8], width=4, blocks=1, steps=2, warmup=1, train_images=256,
                                           noise_steps=4)
    return check, costs


def test_allreduce_check_and_step_costs_on_two_workers():
    check, costs = launch.run(_both, 2, verbose=False).value
    assert check["size"] == 2 and check["inputs"].shape == (2, 1001)
    ring, _ = allreduce.ring_allreduce(list(check["inputs"]))
    assert np.abs(ring[0] - check["horovod_sum"]).max() < 1e-5
    c = costs[8]
    assert c["size"] == 2 and c["gradient_bytes"] == 4 * c["parameters"]
    for key in ("compute_s", "allreduce_none_s", "allreduce_fp16_s"):
        assert 0 < c[key] < 60, key
    assert c["noise_pairs"] == 2 + 4  # timed uncompressed steps plus the noise-only ones
    assert math.isfinite(c["trace_sigma"]) and c["trace_sigma"] > 0
