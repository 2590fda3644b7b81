"""Notebook 04's script variants: each compiles, holds exactly its steps, and each step's diff is its own.

The slow test runs the fully converted script on 2 real Horovod workers.
"""

import itertools
import json
import re

import numpy as np
import pytest

from mgpu.lesson04 import conversion
from mgpu.runtime import launch

STEPS = list(conversion.STEPS)


def _changed_lines(diff_text):
    return sorted(line for line in diff_text.splitlines()
                  if line[:1] in "+-" and not line.startswith(("+++", "---")))


@pytest.mark.parametrize("count", range(len(STEPS) + 1))
def test_cumulative_variants_compile(count):
    compile(conversion.script(STEPS[:count]), f"train_{count}.py", "exec")


def test_every_subset_holds_exactly_its_steps():
    for r in range(len(STEPS) + 1):
        for enabled in itertools.combinations(STEPS, r):
            lines = set(conversion.script(enabled).splitlines())
            for step in STEPS:
                added, removed = conversion.step_lines(step)
                assert added, f"step {step} adds no line"
                on = step in enabled
                assert all((line in lines) == on for line in added), (enabled, step)
                assert all((line in lines) != on for line in removed), (enabled, step)
            assert "# @" not in conversion.script(enabled)


def test_diff_of_each_step_shows_only_that_steps_lines():
    for i, step in enumerate(STEPS):
        before, after = conversion.script(STEPS[:i]), conversion.script(STEPS[:i + 1])
        added, removed = conversion.step_lines(step)
        expected = sorted(["+" + line for line in added] + ["-" + line for line in removed])
        assert _changed_lines(conversion.diff(before, after)) == expected, step


def test_baseline_knows_nothing_of_horovod_and_converted_has_every_call():
    assert "hvd" not in conversion.script([])
    converted = conversion.script(STEPS)
    for call in ("hvd.init()", "hvd.local_rank()", "hvd.DistributedOptimizer", "BroadcastGlobalVariablesCallback",
                 "MetricAverageCallback", "x[rank::size]", "save_here = rank == 0", "talk = rank == 0"):
        assert call in converted, call


def test_unknown_step_is_refused():
    with pytest.raises(ValueError, match="unknown conversion step"):
        conversion.script(["init", "warp_drive"])


def test_mirrored_script_compiles():
    compile(conversion.mirrored_script(), "mirrored.py", "exec")


def test_small_resnet_shapes_and_seed():
    from mgpu.runtime import models

    a = models.small_resnet((28, 28), 10, width=4, blocks=1, seed=3)
    b = models.small_resnet((28, 28), 10, width=4, blocks=1, seed=3)
    assert a(np.zeros((2, 28, 28), np.uint8)).shape == (2, 10)
    assert all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))


@pytest.mark.slow
def test_converted_script_on_two_workers_writes_from_rank0_only_and_ranks_agree(tmp_path):
    script = conversion.write_script(tmp_path / "train_hvd.py", STEPS)
    out = tmp_path / "run"
    args = ["--epochs", "1", "--batch", "16", "--width", "4", "--train-images", "256",
            "--val-images", "64", "--out", str(out)]
    result = launch.run_script(script, 2, args, cwd=tmp_path, verbose=False)
    assert result.ok
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.weights.h5", "log.csv", "report.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "train_hvd.py"]
    # only rank 0 prints progress (horovodrun prefixes each line with [rank])
    assert set(re.findall(r"^\[(\d+)\]<stdout>:.* - loss: ", result.output, re.M)) == {"0"}
    report = json.loads((out / "report.json").read_text())
    assert report["size"] == 2 and report["steps_per_epoch"] == 256 // (16 * 2)
    assert report["weight_spread"] < 1e-6


@pytest.mark.slow
def test_every_rank_saves_its_own_checkpoint_until_checkpoint_rank0(tmp_path):
    """Before the last step all ranks save; each must have a file of its own (HDF5 locks the file)."""
    script = conversion.write_script(tmp_path / "train_step8.py", STEPS[:-1])
    out = tmp_path / "run"
    args = ["--epochs", "2", "--batch", "16", "--width", "4", "--train-images", "256",
            "--val-images", "64", "--out", str(out)]
    result = launch.run_script(script, 2, args, cwd=tmp_path, verbose=False, check=False)
    assert result.ok, result.failure_reason()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.rank1.weights.h5", "checkpoint.weights.h5",
                                                      "log.csv", "report.json"]


def test_ranks_printing_counts_the_ranks_whose_keras_progress_horovodrun_prefixed():
    output = ("[0]<stdout>:16/16 - 3s - loss: 2.1\n[1]<stdout>:16/16 - 3s - loss: 2.2\n"
              "[1]<stdout>:Epoch 2/2\n[2]<stderr>:warning - loss: nothing\n[3]<stdout>:16/16 - loss: 2.0\n")
    assert conversion.ranks_printing(output) == 3
    assert conversion.ranks_printing("16/16 - loss: 2.1\n") == 0
