"""Assessment B (shard the optimizer, ZeRO-1): the notebook, the grader's decision, the red team.

The slow test starts one Horovod job of 2 workers that runs, one after another, the notebook's
reference solution, its release (plain data parallelism) and the red-team cases of
``tests/redteam_zero1/``, each into its own output folder, then decides every folder with
:func:`mgpu.assessment_zero1.decide`: the reference passes, every other run fails for its reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from mgpu import assessment_zero1 as zero1

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "assignments" / "source" / "zero1" / "zero1.ipynb"
REDTEAM = Path(__file__).resolve().parent / "redteam_zero1"
MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION\n", re.M)
SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION\n", re.M | re.S)
# What each run must get: None = pass; else the areas that must fail and those that must pass.
EXPECTED = {
    "reference": None,
    "plain_dp": ({"state"}, {"weights", "communication"}),
    "fake_sharded": ({"state"}, {"weights", "communication"}),
    "reads_reference": ({"weights", "communication"}, set()),
    "gathers_state": ({"state", "communication"}, {"weights"}),
}


def cells() -> dict[str, nbformat.NotebookNode]:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells}


def program_sources() -> dict[str, str]:
    """The student cell's reference solution and release, and each red-team case's cell."""
    source = cells()["training_program"].source + "\n"
    found = {"reference": MARKER.sub("", source),
             "plain_dp": SOLUTION.sub("", source)}
    for path in sorted(REDTEAM.glob("*.py")):
        found[path.stem] = path.read_text()
    return found


def test_notebook_cells_follow_assessment_a():
    found = cells()
    assert list(found) == ["instructions", "colab", "parameters", "setup", "program_instructions",
                           "training_program", "run_training", "tests_instructions",
                           "test_workers_and_state", "test_weights_and_communication",
                           "outcome_instructions", "outcome"]
    for name, cell in found.items():
        nb = cell.metadata["nbgrader"]
        assert nb["locked"] == (name != "training_program"), name
        assert nb["solution"] == (name == "training_program"), name
        assert cell.get("outputs", []) == [] and cell.get("execution_count") is None
    assert "parameters" in found["parameters"].metadata["tags"]
    assert {found[n].metadata["nbgrader"].get("points") for n in
            ("test_workers_and_state", "test_weights_and_communication", "outcome")} == {3, 4}
    assert "### BEGIN HIDDEN TESTS" in found["test_weights_and_communication"].source
    assert "launch.run(zero1.worker(train), workers)" in found["run_training"].source


def test_release_is_plain_data_parallelism():
    release = program_sources()["plain_dp"]
    assert "hvd.allreduce" in release and "reducescatter" not in release
    assert "make_optimizer" in release and "settings.drive" in release


def test_wire_bytes_from_a_horovod_timeline():
    # The shape of Horovod 0.28.1's events, as it wrote them for 1001 floats on 2 workers.
    events = [{"ph": "B", "name": "ALLREDUCE", "ts": 1, "pid": 1},
              {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 2, "pid": 1}, {"ph": "E", "ts": 3, "pid": 1},
              {"ph": "E", "ts": 4, "pid": 1, "args": {"dtype": "float32", "shape": "[1001]"}},
              {"ph": "B", "name": "REDUCESCATTER", "ts": 5, "pid": 2},
              {"ph": "E", "ts": 6, "pid": 2, "args": {"dtype": "float32", "shape": "[501]"}},
              {"ph": "B", "name": "ALLGATHER", "ts": 7, "pid": 3},
              {"ph": "E", "ts": 8, "pid": 3, "args": {"dtype": "float32", "shape": "[1001]"}}]
    found = zero1.wire_bytes(events, workers=2)
    assert found["ALLREDUCE"] == {"calls": 1, "bytes": 4004.0}
    assert found["REDUCESCATTER"]["bytes"] + found["ALLGATHER"]["bytes"] == pytest.approx(4004 + 2)
    assert "GLOO_ALLREDUCE" not in found


def test_decide_an_empty_folder(tmp_path):
    weights = zero1.initial_weights(0)  # a reference given, so that no TensorFlow starts
    decision = zero1.decide(tmp_path, workers=2, data_seed=0, steps=3, batch_size=4, probe_steps=(1,),
                            reference={1: weights, "final": weights})
    assert not decision.passed
    assert decision.failed("weights") and decision.failed("state") and decision.failed("communication")


def test_bounds_separate_the_layouts():
    psi = zero1.parameter_count()
    for workers in (2, 4):
        assert 12 * -(-psi // workers) < zero1.state_bound_bytes(workers) < 12 * psi
    assert zero1.WEIGHTS_ATOL < 1e-3 * max(float(np.max(np.abs(w))) for w in zero1.initial_weights(0))


def variant_trains(tmp_path: Path, settings_kwargs: dict) -> list:
    trains = []
    for name, source in program_sources().items():
        settings = zero1.Settings(output_dir=str(tmp_path / name), **settings_kwargs)
        namespace = {"__name__": f"zero1_variant_{name}", "settings": settings}
        exec(compile(source, f"<{name}>", "exec"), namespace)
        trains.append((name, namespace["train"]))
    return trains


@pytest.mark.slow
def test_reference_passes_and_every_other_layout_fails(tmp_path):
    from mgpu.runtime import launch

    kwargs = {"workers": 2, "data_seed": 7, "steps": 30, "batch_size": 16, "probe_steps": (14, 29)}
    trains = variant_trains(tmp_path, kwargs)
    assert sorted(n for n, _ in trains) == sorted(EXPECTED), "a red-team case without an expected verdict"
    launch.run(zero1.run_all, 2, args=(trains,), timeout=240)
    settings = zero1.Settings(output_dir="", **kwargs)
    reference = zero1.reference_trajectory(settings, kwargs["probe_steps"])
    verdicts = {}
    for name, expected in EXPECTED.items():
        decision = zero1.decide(tmp_path / name, timeline=None, reference=reference,
                                **{k: v for k, v in kwargs.items()})
        verdicts[name] = {"passed": decision.passed, "reasons": decision.reasons, **{
            k: v for k, v in decision.numbers.items() if k in ("weights_max_abs_diff", "state_bytes_per_rank",
                                                                "comm_over_dp", "collectives")}}
        if expected is None:
            assert decision.passed, f"{name}: {decision}"
        else:
            must_fail, must_pass = expected
            assert not decision.passed, f"{name} passed: {decision}"
            for area in must_fail:
                assert decision.failed(area), f"{name} did not fail on {area}: {decision}"
            for area in must_pass:
                assert not decision.failed(area), f"{name} failed on {area}: {decision}"
    # The same verdicts through the grader's seam (autograder.outcomes), evidence handed over as a folder.
    from types import SimpleNamespace

    outcome = zero1.ShardedOptimizer(data_seed=kwargs["data_seed"])
    outcome.workers, outcome.reference = 2, reference
    assert outcome.parameters(None) == {k: (list(v) if k == "probe_steps" else v) for k, v in kwargs.items()
                                        if k != "workers"}
    for name, expected in EXPECTED.items():
        judged = outcome.judge(SimpleNamespace(), tmp_path / name)
        assert judged.passed == (expected is None), f"{name}: {judged}"
    assert not outcome.judge(SimpleNamespace(), None).passed
    out = ROOT / "build" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "zero1_redteam.json").write_text(json.dumps(verdicts, indent=1, default=str))
