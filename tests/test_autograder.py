"""The grader's parts without a full run: decision, measurement, validation, locked cells, release,
bad input on the command line, and skipping on a rerun."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from autograder import course as course_mod
from autograder import epochs, grade, isolation, measure, safe_read, validate
from autograder.measure import EpochMeasurement
from mgpu import assessment

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "assignments" / "source" / "assessment" / "assessment.ipynb"


# ------------------------------------------------------------------------------------ decide

def _epochs(*accuracies, step=10.0):
    return [EpochMeasurement(i, step * (i + 1), a) for i, a in enumerate(accuracies)]


def test_two_consecutive_epochs_at_target_within_budget_pass():
    outcome = measure.decide(_epochs(0.5, 0.8, 0.81, 0.7), target=0.8, budget_s=100)
    assert outcome.passed and outcome.reached_epoch == 2 and outcome.reached_seconds == 30.0
    assert "2 consecutive epochs at epoch 2" in outcome.reason


def test_one_epoch_at_target_is_not_enough():
    outcome = measure.decide(_epochs(0.85, 0.7, 0.9), target=0.8, budget_s=100)
    assert not outcome.passed and "not for 2 consecutive epochs" in outcome.reason


def test_a_gap_in_the_saved_epochs_breaks_the_streak():
    epochs = [EpochMeasurement(0, 10, 0.9), EpochMeasurement(2, 30, 0.9)]
    assert not measure.decide(epochs, target=0.8, budget_s=100).passed


def test_reaching_the_target_after_the_budget_fails_with_the_time():
    outcome = measure.decide(_epochs(0.9, 0.9, step=70), target=0.8, budget_s=100)
    assert not outcome.passed and "140 s > 100 s budget" in outcome.reason


def test_low_accuracy_reason_names_measured_and_target():
    outcome = measure.decide(_epochs(0.5, 0.61), target=0.75, budget_s=100)
    assert outcome.reason.startswith("accuracy 0.610 < 0.750 target")


def test_an_epoch_whose_weights_did_not_move_is_not_a_second_epoch():
    # One good epoch copied to the next number (change 0), or copied with a little noise.
    for change in (0.0, 1e-5):
        epochs = _epochs(0.5, 0.85, 0.85)
        epochs[1].change, epochs[2].change = 0.2, change
        outcome = measure.decide(epochs, target=0.8, budget_s=100)
        assert not outcome.passed and "epoch(s) 2 did not count" in outcome.reason, outcome.reason
    epochs = _epochs(0.5, 0.85, 0.86)
    epochs[1].change, epochs[2].change = 0.2, 0.05  # honest epochs move by several percent
    assert measure.decide(epochs, target=0.8, budget_s=100).passed


def test_an_epoch_that_computes_what_the_one_before_computed_is_not_a_second_epoch():
    # Weights moved (a rescaled layer, permuted units) but the held-out logits did not.
    epochs = _epochs(0.5, 0.85, 0.85)
    epochs[1].change, epochs[2].change = 0.2, 0.63
    epochs[1].output_change, epochs[2].output_change = 0.3, 1e-7
    outcome = measure.decide(epochs, target=0.8, budget_s=100)
    assert not outcome.passed and "epoch(s) 2 did not count" in outcome.reason and "compute" in outcome.reason
    epochs[2].output_change = 0.05
    assert measure.decide(epochs, target=0.8, budget_s=100).passed


def test_a_first_saved_epoch_already_at_the_target_is_held_for_review():
    outcome = measure.decide(_epochs(0.86, 0.87), target=0.8, budget_s=100, first_epoch_accuracy=0.64)
    assert not outcome.passed and outcome.review.startswith("held for review: the first epoch the run saved")
    assert "0.64" in outcome.review and outcome.reason == outcome.review
    assert measure.decide(_epochs(0.6, 0.86, 0.87), target=0.8, budget_s=100).review == ""


def test_no_epochs_and_rejected_epochs_have_reasons():
    assert "no weights saved" in measure.decide([], 0.8, 100).reason
    rejected = [EpochMeasurement(0, 5, None, "epoch_000.npz: weight 0 has shape (1,)")]
    assert "rejected" in measure.decide(rejected, 0.8, 100).reason


# ----------------------------------------------------------------------------------- measure

def test_measurer_agrees_with_keras_on_the_same_weights(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 255, size=(1500, 28, 28), dtype=np.uint8)
    model = assessment.reference_model(seed=5)
    y = np.argmax(model.predict(x, verbose=0), axis=-1)
    y[: len(y) // 3] = (y[: len(y) // 3] + 1) % 10  # a third made wrong on purpose
    expected = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=-1) == y))
    assessment.save_weights_atomically(model.get_weights(), tmp_path / "epoch_000.npz")
    np.savez(tmp_path / "epoch_001.npz", np.zeros(3))
    moved = [w + 0.01 for w in model.get_weights()]
    assessment.save_weights_atomically(moved, tmp_path / "epoch_002.npz")
    assessment.save_weights_atomically(moved, tmp_path / "epoch_003.npz")
    files = {e: tmp_path / f"epoch_{e:03d}.npz" for e in range(4)}
    measured = measure.Measurer(x, y, (28, 28), 10).measure(files, {0: 1.5}, {4: "epoch_004.npz is a link"})
    assert measured[0].accuracy == pytest.approx(expected) and measured[0].seconds == 1.5
    assert measured[1].accuracy is None and "arrays" in measured[1].rejected
    assert measured[2].change is None  # epoch 1 was rejected: nothing to compare with
    assert measured[3].change == 0.0 and measured[3].weights_sha256 == measured[2].weights_sha256
    assert measured[4].accuracy is None and measured[4].rejected == "epoch_004.npz is a link"
    assert measured[3].output_change == 0.0 and measured[2].output_change is None
    assert np.array_equal(measure.decode_predictions(measured[0].predictions), np.argmax(model.predict(x, verbose=0), -1))


def _rescaled(weights, alpha):
    """The same function, other weights: the first convolution's output times alpha (ReLU commutes
    with a positive scale, max-pooling too), the second convolution's kernel divided by alpha."""
    w = [np.array(v) for v in weights]
    w[0], w[1], w[2] = w[0] * alpha, w[1] * alpha, w[2] / alpha
    return w


def test_a_disguised_copy_of_an_epoch_moves_the_weights_but_not_the_logits(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 255, size=(600, 28, 28), dtype=np.uint8)
    model = assessment.reference_model(seed=3)
    y = np.argmax(model.predict(x, verbose=0), axis=-1)
    assessment.save_weights_atomically(model.get_weights(), tmp_path / "epoch_000.npz")
    assessment.save_weights_atomically(_rescaled(model.get_weights(), 3.0), tmp_path / "epoch_001.npz")
    files = {e: tmp_path / f"epoch_{e:03d}.npz" for e in range(2)}
    first, second = measure.Measurer(x, y, (28, 28), 10).measure(files, {})
    assert second.change > 100 * measure.MIN_EPOCH_CHANGE and second.output_change < 1e-5 < measure.MIN_OUTPUT_CHANGE
    assert second.predictions == first.predictions and second.weights_sha256 != first.weights_sha256


# ---------------------------------------------------------------------------------- validate

REQUIRED = {"training_program": None}


def test_malformed_json_is_rejected(tmp_path):
    path = tmp_path / "a.ipynb"
    path.write_text('{"cells": [')
    with pytest.raises(validate.InvalidSubmission, match="not a well-formed notebook"):
        validate.load_submission(path, REQUIRED)


def test_json_that_is_not_a_notebook_is_rejected(tmp_path):
    path = tmp_path / "a.ipynb"
    path.write_text('{"cells": [{"cell_type": "code"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    with pytest.raises(validate.InvalidSubmission, match="not a valid notebook"):
        validate.load_submission(path, REQUIRED)


def test_oversized_notebook_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "MAX_NOTEBOOK_BYTES", 1000)
    path = tmp_path / "a.ipynb"
    shutil.copyfile(SOURCE, path)
    with pytest.raises(validate.InvalidSubmission, match="limit: clear its outputs"):
        validate.load_submission(path, REQUIRED)


def test_a_missing_student_cell_is_named(tmp_path):
    notebook = nbformat.read(SOURCE, as_version=4)
    notebook.cells = [c for c in notebook.cells
                      if c.metadata.get("nbgrader", {}).get("grade_id") != "training_program"]
    path = tmp_path / "a.ipynb"
    nbformat.write(notebook, path)
    with pytest.raises(validate.InvalidSubmission, match="cells missing from the notebook: training_program"):
        validate.load_submission(path, REQUIRED)
    assert validate.load_submission(SOURCE, REQUIRED).cells


# -------------------------------------------------------------------- course, release, cells

@pytest.fixture(scope="module")
def course_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("course")
    course_mod.copy_course(folder)
    return folder


def test_release_has_no_solution_code_and_no_hidden_tests(course_dir):
    release = nbformat.read(course_dir / "release" / "assessment" / "assessment.ipynb", as_version=4)
    text = "\n".join(c.source for c in release.cells)
    program = next(c.source for c in release.cells
                   if c.metadata.get("nbgrader", {}).get("grade_id") == "training_program")
    source_text = SOURCE.read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "weights_in_sync"):
        assert marker in source_text and marker not in text, marker
    for solution_code in ("import horovod", "hvd.init()", "hvd.DistributedOptimizer(optimizer)",
                          "x[rank::size]", "BroadcastGlobalVariablesCallback"):
        assert solution_code in source_text and solution_code not in program, solution_code
    # the release still holds the working single-process program and every graded cell
    assert "model.fit(" in text and "def train():" in text
    ids = {c.metadata.get("nbgrader", {}).get("grade_id") for c in release.cells}
    assert {"parameters", "setup", "training_program", "run_training", "outcome"} <= ids


def test_untouched_cells_are_not_reported_and_modified_locked_cells_are_restored(course_dir):
    course = course_mod.Course(course_dir, "assessment")
    for name in ("source", "release"):
        notebook = nbformat.read(course_dir / name / "assessment" / "assessment.ipynb", as_version=4)
        assert course.restore_locked_cells(notebook, "assessment") == [], name
    notebook = nbformat.read(course_dir / "release" / "assessment" / "assessment.ipynb", as_version=4)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in notebook.cells}
    original_setup = cells["setup"].source
    cells["setup"].source = "def protected_callbacks():\n    return []"
    cells["outcome"].source = 'print("PASSED")'
    cells["training_program"].source += "\n# my own change"  # editable: never restored
    assert sorted(course.restore_locked_cells(notebook, "assessment")) == ["outcome", "setup"]
    assert cells["setup"].source == original_setup
    assert "list_saved_epochs" in cells["outcome"].source
    assert cells["training_program"].source.endswith("# my own change")


def test_unexecuted_test_cells_get_an_error_and_nbgrader_scores_them_zero(course_dir):
    from nbgrader.utils import determine_grade

    notebook = nbformat.read(course_dir / "release" / "assessment" / "assessment.ipynb", as_version=4)
    tests = [c for c in course_mod.grade_cells(notebook) if c.metadata.nbgrader.grade_id != "outcome"]
    assert tests and all(determine_grade(c)[0] == determine_grade(c)[1] for c in tests)  # the trap
    marked = course_mod.mark_unexecuted_tests(notebook, "cell run_training failed")
    assert sorted(marked) == sorted(c.metadata.nbgrader.grade_id for c in tests)
    assert all(determine_grade(c)[0] == 0 for c in tests)


def test_outcome_cell_carries_the_measurement_and_its_score(course_dir):
    from nbgrader.utils import determine_grade

    notebook = nbformat.read(course_dir / "release" / "assessment" / "assessment.ipynb", as_version=4)
    assert course_mod.set_outcome(notebook, False, ["epoch 0: 0.5"], "accuracy 0.500 < 0.850 target")
    outcome = next(c for c in course_mod.grade_cells(notebook) if c.metadata.nbgrader.grade_id == "outcome")
    assert determine_grade(outcome)[0] == 0
    course_mod.set_outcome(notebook, True, ["epoch 0: 0.9"], "")
    assert determine_grade(outcome)[0] == determine_grade(outcome)[1] > 0


# ------------------------------------------------------------------------------ command line

def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["grade", "/no/such/course"], "no course folder /no/such/course: pass the folder"),
    (["grade", "{course}", "--assignment", "nope"], "unknown assignment 'nope'"),
    (["grade", "{course}", "--profile", "tpu"], "unknown profile 'tpu'"),
    (["grade", "{course}", "--workers", "97"], "no measured target for 97 workers"),
])
def test_bad_input_gives_one_line_naming_the_fix(course_dir, args, message):
    result = _cli(*[a.format(course=course_dir) for a in args])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_a_zip_or_folder_of_notebooks_is_imported_as_submissions(course_dir, tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "batch.zip", "w") as archive:
        archive.write(SOURCE, "hand-in/Ada Lovelace.ipynb")
        archive.writestr("hand-in/notes.txt", "not a notebook")
    course = course_mod.Course(course_dir, "assessment")
    assert course.import_submissions(tmp_path / "batch.zip") == (["Ada_Lovelace"], [])
    target = course_dir / "submitted" / "Ada_Lovelace" / "assessment" / "assessment.ipynb"
    assert target.read_bytes() == SOURCE.read_bytes()
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copyfile(SOURCE, folder / "grace.ipynb")
    assert course.import_submissions(folder) == (["grace"], [])
    with pytest.raises(course_mod.CourseError, match="no .ipynb files"):
        (tmp_path / "empty").mkdir()
        course.import_submissions(tmp_path / "empty")
    shutil.rmtree(course_dir / "submitted")


def _zip_with_bad_crc(path, good: bytes) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("bad.ipynb", good)
        archive.writestr("fine.ipynb", good)
    data = bytearray(path.read_bytes())
    start = data.index(good)  # bad.ipynb's stored bytes come first: flip one of them
    data[start + 10] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_import_reads_only_regular_files_and_refuses_the_rest_by_name(course_dir, tmp_path):
    import zipfile

    from autograder import report, validate

    course = course_mod.Course(course_dir, "assessment")
    secret = course_dir / "source" / "assessment" / "assessment.ipynb"
    folder = tmp_path / "hand-in"
    folder.mkdir()
    shutil.copyfile(SOURCE, folder / "ok.ipynb")
    (folder / "link.ipynb").symlink_to(secret)
    (folder / "zero.ipynb").symlink_to("/dev/zero")
    os.mkfifo(folder / "fifo.ipynb")
    (folder / "folder.ipynb").mkdir()
    (folder / "big.ipynb").write_bytes(b" " * (validate.MAX_NOTEBOOK_BYTES + 1))
    shutil.copyfile(SOURCE, folder / "Ann B.ipynb")   # both are the student id Ann_B:
    shutil.copyfile(SOURCE, folder / "Ann_B.ipynb")   # neither may replace the other
    for nameless in (".ipynb", "..ipynb", "...ipynb", "_.ipynb"):  # no student id in the name: listed, not lost
        shutil.copyfile(SOURCE, folder / nameless)
    imported, refused = course.import_submissions(folder)
    assert imported == ["ok"]
    reasons = {entry["name"]: entry["reason"] for entry in refused}
    assert set(reasons) == {"link.ipynb", "zero.ipynb", "fifo.ipynb", "folder.ipynb", "big.ipynb",
                            "Ann B.ipynb", "Ann_B.ipynb", ".ipynb", "..ipynb", "...ipynb", "_.ipynb"}
    assert all("hidden file" in reasons[n] for n in (".ipynb", "..ipynb", "...ipynb"))
    assert "holds no student id" in reasons["_.ipynb"]
    assert "is a link" in reasons["link.ipynb"] and "is a link" in reasons["zero.ipynb"]
    assert "not a regular file" in reasons["fifo.ipynb"] and "not a regular file" in reasons["folder.ipynb"]
    assert "larger than" in reasons["big.ipynb"] and "Ann_B.ipynb" in reasons["Ann B.ipynb"]
    assert sorted(p.name for p in (course_dir / "submitted").iterdir()) == ["ok"]
    assert report.refused_imports(course.results_dir()) == sorted(refused, key=lambda e: e["name"])
    assert "not imported" in report.csv_text([], refused)

    # A zip: a bad CRC refuses that entry alone; a declared size over the limit is refused unread.
    _zip_with_bad_crc(tmp_path / "crc.zip", SOURCE.read_bytes())
    imported, refused = course.import_submissions(tmp_path / "crc.zip")
    assert imported == ["fine"] and [e["name"] for e in refused] == ["bad.ipynb"]
    assert "unreadable zip entry" in refused[0]["reason"]
    assert not (course_dir / "submitted" / "bad").exists()
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb.ipynb", b"\0" * (64 * 2**20))  # 64 MiB of zeros: ~64 kB compressed
    assert (tmp_path / "bomb.zip").stat().st_size < 2**20
    with pytest.raises(course_mod.CourseError, match=r"nothing imported .* \(bomb.ipynb: 64.0 MB unpacked"):
        course.import_submissions(tmp_path / "bomb.zip")
    assert not (course_dir / "submitted" / "bomb").exists()
    assert [e["name"] for e in report.refused_imports(course.results_dir())] == ["bomb.ipynb"]
    shutil.rmtree(course_dir / "submitted")  # the module's course is shared: leave it as found
    course.refused_imports_path().unlink()


def test_load_submission_refuses_odd_metadata_of_any_type_with_one_line(tmp_path):
    """Seeded random damage to the nbgrader metadata: the answer is a notebook or InvalidSubmission."""
    import copy
    import random

    release = nbformat.read(SOURCE, as_version=4)
    values = [None, "locked", 3, 2.5, True, [], ["grade_id"], {}, {"grade_id": None},
              {"grade_id": ["x"]}, {"grade_id": {"a": 1}}, {"grade_id": 7}, {"solution": "yes"},
              {"grade_id": "setup", "locked": "no"}, "x" * 1000, [[[]]]]
    rng = random.Random(0)
    outcomes = {"loaded": 0, "refused": 0}
    for trial in range(60):
        notebook = copy.deepcopy(release)
        for _ in range(rng.randint(1, 3)):
            cell = rng.choice(notebook.cells)
            where = rng.choice(["nbgrader", "grade_id", "metadata"])
            value = copy.deepcopy(rng.choice(values))
            if where == "nbgrader":
                cell.metadata["nbgrader"] = value
            elif where == "grade_id" and isinstance(cell.metadata.get("nbgrader"), dict):
                cell.metadata["nbgrader"]["grade_id"] = value
            else:
                cell.metadata[rng.choice(["tags", "jupyter", "x"])] = value
        path = tmp_path / f"{trial}.ipynb"
        path.write_text(json.dumps(notebook))
        try:
            validate.load_submission(path, {"training_program": None})
            outcomes["loaded"] += 1
        except validate.InvalidSubmission as error:
            assert "\n" not in str(error) and ": " in str(error)
            outcomes["refused"] += 1
    assert outcomes["loaded"] and outcomes["refused"]
    notebook = copy.deepcopy(release)
    notebook.cells[0].metadata["nbgrader"] = "locked"
    (tmp_path / "str.ipynb").write_text(json.dumps(notebook))
    with pytest.raises(validate.InvalidSubmission, match="nbgrader metadata is not a mapping"):
        validate.load_submission(tmp_path / "str.ipynb", {})
    (tmp_path / "link.ipynb").symlink_to(SOURCE)
    with pytest.raises(validate.InvalidSubmission, match="is a link"):
        validate.load_submission(tmp_path / "link.ipynb", {})
    os.mkfifo(tmp_path / "fifo.ipynb")
    with pytest.raises(validate.InvalidSubmission, match="not a regular file"):
        validate.load_submission(tmp_path / "fifo.ipynb", {})
    assert course_mod.file_sha256(tmp_path / "fifo.ipynb") != course_mod.file_sha256(SOURCE)
    assert course_mod.file_sha256(tmp_path / "link.ipynb") != course_mod.file_sha256(SOURCE)


# --------------------------------------------------------------------------------- rerun skip

@pytest.mark.slow
def test_rerun_skips_graded_submissions_unless_forced_or_changed(course_dir):
    # Rejected submissions are graded in seconds (never run), two at a time here.
    for name, text in (("broken", "{ not json"), ("empty", '{"cells": []}')):
        folder = course_dir / "submitted" / name / "assessment"
        folder.mkdir(parents=True)
        (folder / "assessment.ipynb").write_text(text)
    student = course_dir / "submitted" / "broken" / "assessment"
    profile = next(iter(assessment.PROFILES.values()))
    logs = []
    first = grade.grade_course(course_dir, "assessment", profile, jobs=2, progress=False, log=logs.append)
    assert [v.student for v in first] == ["broken", "empty"] and not any(v.passed for v in first)
    assert "rejected: not a well-formed notebook" in first[0].reason
    assert "rejected: not a valid notebook" in first[1].reason or "cells missing" in first[1].reason
    course = course_mod.Course(course_dir, "assessment")
    assert all(score == 0 for name in ("broken", "empty") for score, _ in course.scores(name).values())
    assert grade.grade_course(course_dir, "assessment", profile, progress=False, log=logs.append) == []
    assert any("skipping 2 submission(s) already graded" in line for line in logs)
    assert len(grade.grade_course(course_dir, "assessment", profile, force=True, progress=False,
                                  log=logs.append)) == 2
    (student / "assessment.ipynb").write_text("{ still not json")
    again = grade.grade_course(course_dir, "assessment", profile, progress=False, log=logs.append)
    assert [v.student for v in again] == ["broken"]
    record = json.loads((course_dir / "autograder" / "assessment" / "broken.json").read_text())
    assert record["submission_sha256"] == course_mod.file_sha256(student / "assessment.ipynb")
    csv_lines = (course_dir / "autograder" / "assessment" / "grades.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and csv_lines[1].startswith("broken,False")


@pytest.mark.slow
def test_a_kernel_that_dies_is_graded_with_zeros_and_the_reason(tmp_path):
    course = course_mod.copy_course(tmp_path)
    notebook = nbformat.read(tmp_path / "release" / "assessment" / "assessment.ipynb", as_version=4)
    program = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "training_program")
    program.source = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would"
    folder = tmp_path / "submitted" / "oom" / "assessment"
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / "assessment.ipynb")
    [verdict] = grade.grade_course(tmp_path, "assessment", assessment.profile("cpu", 2), progress=False,
                                   log=lambda line: None)
    assert not verdict.passed and verdict.run_status == "kernel_died"
    assert verdict.reason.startswith("kernel died (it exited, crashed or ran out of memory)")
    # nbgrader recorded the submission (it drops it when its own kernel dies), every cell at zero
    scores = course.scores("oom")
    assert scores and all(score == 0 for score, _ in scores.values())
    assert Path(verdict.feedback).exists()


def _facts(folder, size, distributed, in_sync):
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        (folder / f"facts-{100 + rank}.json").write_text(json.dumps(
            {"pid": 100 + rank, "rank": rank if size > 1 else 0, "horovod_size": size,
             "distributed_optimizer": distributed, "steps_per_epoch": 10, "epochs_done": 2,
             "weights_in_sync": in_sync}))


@pytest.mark.slow
@pytest.mark.parametrize("size, distributed, in_sync, failing", [
    (2, True, True, []),
    (1, False, None, ["test_horovod_init", "test_distributed_training"]),
    (2, True, False, ["test_distributed_training"]),  # the hidden test
], ids=["converted", "unconverted", "not-in-sync"])
def test_the_graders_clean_test_pass_runs_the_locked_tests_with_hidden_ones(course_dir, tmp_path, size,
                                                                           distributed, in_sync, failing):
    from autograder import checks

    course = course_mod.Course(course_dir, "assessment")
    cells = course.source_cells("assessment")
    folder = tmp_path / "runs" / "checks"
    _facts(folder / "output", size, distributed, in_sync)
    (folder / "data").mkdir()
    (folder / "empty").mkdir()
    for name in ("train.npz", "val.npz", "dataset.json"):
        (folder / "data" / name).write_text("")  # has_data() only looks for the files
    tests = [{"grade_id": g, "source": cells[g].source} for g in ("test_horovod_init", "test_distributed_training")]
    parameters = {"workers": 2, "profile": "cpu", "data_dir": str(folder / "data"),
                  "output_dir": str(folder / "output"), "time_budget_s": 90.0, "target_accuracy": 0.8}
    results = checks.run_tests(folder, cells["parameters"].source, parameters, [cells["setup"].source], tests,
                               hide=[course_dir], work_parent=tmp_path / "runs")
    assert [r["grade_id"] for r in results if not r["passed"]] == failing
    for result in results:
        if not result["passed"]:
            assert result["ename"] == "AssertionError" and result["evalue"]


@pytest.mark.slow
def test_the_clean_test_pass_imports_nothing_from_its_folder_and_sees_no_secret(course_dir, tmp_path, monkeypatch):
    """Modules planted where the pass starts (and where a run could write) never stand in for the grader's."""
    from autograder import checks

    monkeypatch.setenv("INSTRUCTOR_TOKEN", "s3cret")
    course = course_mod.Course(course_dir, "assessment")
    cells = course.source_cells("assessment")
    folder = tmp_path / "runs" / "checks"
    _facts(folder / "output", 1, False, None)
    (folder / "data").mkdir()
    (folder / "empty").mkdir()
    for name in ("train.npz", "val.npz", "dataset.json"):
        (folder / "data" / name).write_text("")
    planted = 'print("PLANTED"); raise SystemExit(0)\n'
    for where in (folder, folder / "empty"):
        (where / "mgpu").mkdir()
        (where / "mgpu" / "__init__.py").write_text(planted)
        (where / "autograder").mkdir()
        (where / "autograder" / "__init__.py").write_text(planted)
        (where / "autograder" / "checks.py").write_text(planted)
        (where / "json.py").write_text(planted)
        (where / "sitecustomize.py").write_text(planted)
    spy = ('import os\nprint("token", os.environ.get("INSTRUCTOR_TOKEN"), "uid", os.getuid(), '
           '"course", os.path.exists(%r))\n' % str(course_dir / "gradebook.db"))
    tests = [{"grade_id": "test_horovod_init", "source": cells["test_horovod_init"].source},
             {"grade_id": "spy", "source": spy}]
    parameters = {"workers": 2, "profile": "cpu", "data_dir": str(folder / "data"),
                  "output_dir": str(folder / "output"), "time_budget_s": 90.0, "target_accuracy": 0.8}
    results = checks.run_tests(folder, cells["parameters"].source, parameters, [cells["setup"].source], tests,
                               hide=[course_dir], work_parent=tmp_path / "runs")
    assert not results[0]["passed"] and "hvd.size()" in results[0]["evalue"]  # the real test ran, and failed
    assert "PLANTED" not in json.dumps(results)
    if isolation.isolation_available()[0]:
        assert results[1]["stdout"].strip() == f"token None uid {isolation.RUN_UID} course False", results[1]
    else:
        assert results[1]["stdout"].startswith("token None"), results[1]


def test_facts_files_not_written_by_a_seen_worker_are_discarded():
    from autograder import grade

    files = {f"facts-{100 + rank}.json": json.dumps({"pid": 100 + rank, "rank": rank, "horovod_size": 2}).encode()
             for rank in range(2)}
    files["facts-999.json"] = json.dumps({"pid": 999, "rank": 0, "horovod_size": 2}).encode()
    files["facts-7.json"] = b"[" * 100000  # junk
    files["facts-8.json"] = safe_read.Rejected("facts-8.json was not written by a Horovod worker the grader started")
    workers = {100: {"rank": 0, "size": 2, "host_pid": 5000}, 101: {"rank": 0, "size": 2, "host_pid": 5001}}
    # 100 is a seen worker; 101 claims rank 1 but horovodrun gave it rank 0; 999 and 7 were never seen.
    kept, discarded = grade.vet_facts(files, workers)
    assert list(kept) == ["facts-100.json"] and discarded == 4


def test_run_files_are_read_as_hostile_data(tmp_path):
    """No link is followed, no fifo blocks, sizes are counted while reading, and the owner is checked."""
    import os

    (tmp_path / "good.json").write_text("{}")
    (tmp_path / "big.json").write_bytes(b"x" * 5000)
    os.symlink("/dev/zero", tmp_path / "zero.json")
    os.symlink(tmp_path / "good.json", tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "folder.json").mkdir()
    found = safe_read.read_outputs(tmp_path, r".*\.json", 1000, owner=None)
    assert found["good.json"] == b"{}"
    assert "larger than" in str(found["big.json"])
    assert "is a link" in str(found["zero.json"]) and "is a link" in str(found["link.json"])
    assert "not a regular file" in str(found["fifo.json"]) and "not a regular file" in str(found["folder.json"])
    owner = os.stat(tmp_path / "good.json").st_uid
    assert "not written by a Horovod worker" in str(safe_read.read_outputs(tmp_path, "good.json", 1000, owner + 1)["good.json"])


def test_each_epoch_file_is_kept_as_it_was_when_first_seen(tmp_path):
    output, keep = tmp_path / "output", tmp_path / "keep"
    output.mkdir()
    (output / "epoch_000.npz").write_bytes(b"first")
    keeper = epochs.EpochKeeper(output, keep, owner=None)
    keeper.poll(1.0)
    (output / "epoch_000.npz").write_bytes(b"rewritten later")  # a placeholder overwritten after the fact
    (output / "epoch_001.npz").write_bytes(b"second")
    keeper.poll(2.0)
    keeper.poll(3.0)
    assert keeper.seen == {0: 1.0, 1: 2.0}
    assert (keep / "epoch_000.npz").read_bytes() == b"first" and keeper.rewritten() == [0]
    keeper.close()


def test_a_run_that_saves_deletes_and_saves_again_cannot_fill_the_graders_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(epochs, "MAX_KEPT_EPOCHS", 3)
    monkeypatch.setattr(epochs, "MAX_KEPT_BYTES", 250)
    output, keep = tmp_path / "output", tmp_path / "keep"
    output.mkdir()
    keeper = epochs.EpochKeeper(output, keep, owner=None)
    for epoch in range(6):  # each file copied, then deleted: the run's own disk never fills
        (output / f"epoch_{epoch:03d}.npz").write_bytes(b"x" * 100)
        keeper.poll(float(epoch))
        (output / f"epoch_{epoch:03d}.npz").unlink()
    assert sorted(keeper.files) == [0, 1] and keeper.kept_bytes == 200
    assert "larger than" in keeper.rejected[2]  # only 50 bytes were left to keep
    assert all("was not kept" in keeper.rejected[e] for e in (3, 4, 5))
    assert sum(p.stat().st_size for p in keep.iterdir()) <= 250
    keeper.close()


def test_the_executed_notebook_gives_outputs_only_to_cells_it_did_not_change(course_dir):
    course = course_mod.Course(course_dir, "assessment")
    canonical = nbformat.read(course.release_dir() / "assessment.ipynb", as_version=4)
    executed = nbformat.from_dict(canonical)
    for cell in executed.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"ran {cell.metadata.nbgrader['grade_id']}")]
            cell.execution_count = 1
    merged, altered = grade.merge_outputs(canonical, nbformat.writes(executed))
    assert altered == ""
    texts = {c.metadata.nbgrader["grade_id"]: "".join(o.get("text", "") for o in c.outputs)
             for c in merged.cells if c.cell_type == "code"}
    assert texts["setup"] == "ran setup" and texts["test_horovod_init"] == "" and texts["outcome"] == ""
    # A kernel that rewrote its own notebook (a cell's source changed, junk instead of JSON): no outputs at all.
    executed.cells[2].source = "print('something else')"
    merged, altered = grade.merge_outputs(canonical, nbformat.writes(executed))
    assert altered == "a cell's source differs from the one the grader ran"
    assert all(not c.get("outputs") for c in merged.cells if c.cell_type == "code")
    assert grade.merge_outputs(canonical, "{not json")[1].startswith("not a valid notebook")


# ------------------------------------------------------------------------------------- copies

def _record(student, *epochs, target=0.8):
    return {"student": student, "target_accuracy": target,
            "epochs": [{"epoch": e, "accuracy": a, "weights_sha256": sha, "predictions": measure.encode_predictions(p)}
                       for e, a, sha, p in epochs]}


def test_copies_are_found_by_identical_weights_or_by_predictions_however_the_weights_were_disguised():
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 10, 2000)
    shared = truth.copy()
    shared[:100] = (shared[:100] + 1) % 10  # an 95%-accurate model
    honest = shared.copy()
    flip = rng.choice(2000, 120, replace=False)  # another honest run: disagrees on 6% (measured: 5.5-8%)
    honest[flip] = (honest[flip] + 3) % 10
    near = shared.copy()
    near[:10] = (near[:10] + 5) % 10  # a copy with a little noise: 0.5% changed
    records = [_record("alice", (3, 0.95, "a3", shared)),
               _record("bob", (4, 0.95, "b4", shared)),        # other weights, the same function
               _record("carol", (5, 0.93, "c5", honest)),
               _record("dave", (2, 0.95, "a3", truth)),        # alice's very weights
               _record("erin", (6, 0.95, "e6", near)),
               _record("frank", (1, 0.5, "f1", shared))]       # below the target: not compared
    partners = grade.copy_partners(records)
    assert partners["alice"] == {"bob": 3, "dave": 3, "erin": 3}
    assert partners["bob"] == {"alice": 4, "erin": 4} and partners["dave"] == {"alice": 2}
    assert "carol" not in partners and "frank" not in partners


def test_reports_show_no_hidden_characters_and_no_spreadsheet_formulas():
    from autograder import report

    sneaky = "RuntimeError: boom\x00\x1b[2J fake\u202eSSAP\u200b"
    records = [{"student": "mallory", "passed": False, "reason": sneaky, "copied_from": []},
               {"student": "eve", "passed": False, "reason": '=HYPERLINK("http://x","click")', "copied_from": []}]
    text = report.csv_text(records, [{"name": "@nameless.ipynb", "reason": "-1+1"}])
    assert "\x00" not in text and "\x1b" not in text and "\u202e" not in text and "\u200b" not in text
    assert "RuntimeError: boom[2J fakeSSAP" in text
    assert "'=HYPERLINK" in text and "'@nameless.ipynb" in text and "'-1+1" in text
    page = report.html_text(records, next(iter(assessment.PROFILES.values())))
    assert "\x00" not in page and "\u202e" not in page and "RuntimeError: boom[2J fakeSSAP" in page


def test_only_workers_that_fit_the_horovodrun_the_launch_service_started_count():
    from autograder import sandbox

    def run(launched, *workers):
        return sandbox.RunResult(status="ok", reason="", notebook="", seconds=1.0, worker_uid=65533,
                                 launched=launched,
                                 horovod_workers={pid: {"rank": r, "size": s, "host_pid": pid} for pid, r, s in workers})

    assert len(run([2], (10, 0, 2), (11, 1, 2)).workers_that_ran()) == 2
    # One real worker (-np 1) whose child claims rank 1 of 2, or which rewrote its own size: one worker.
    assert list(run([1], (10, 0, 1), (12, 1, 2)).workers_that_ran()) == [10]
    assert run([1], (10, 0, 2), (12, 1, 2)).workers_that_ran() == {}
    # A child of a real worker that repeats its rank is not a second worker.
    assert list(run([2], (10, 0, 2), (11, 1, 2), (13, 1, 2)).workers_that_ran()) == [10, 11]
    # Without the launch service nothing tells them apart: every process with the variables counts.
    assert len(sandbox.RunResult(status="ok", reason="", notebook="", seconds=1.0,
                                 horovod_workers={1: {"rank": 0, "size": 1, "host_pid": 1}}).workers_that_ran()) == 1


def test_a_worker_that_did_not_train_its_share_is_named():
    def workers(*cpu):
        return {10 + r: {"rank": r, "size": len(cpu), "host_pid": 10 + r, "cpu_s": 5.0 + c, "train_cpu_s": c}
                for r, c in enumerate(cpu)}

    assert grade.idle_worker(workers(40.0, 35.0)) == ""  # data parallel: close CPU times
    assert grade.idle_worker(workers(41.0)) == ""         # one worker: nothing to compare
    reason = grade.idle_worker(workers(40.0, 3.0))
    assert reason.startswith("Horovod worker rank 1 used 3.0 s of CPU while the epochs were saved, against 40.0 s "
                             "for rank 0") and "share" in reason
    # The start-up (importing TensorFlow, loading data) is left out: a rank that left after it is idle.
    idle = workers(8.0, 0.0)
    assert idle[11]["cpu_s"] / idle[10]["cpu_s"] > 1 / 3 and grade.idle_worker(idle).startswith("Horovod worker rank 1")
    # Fewer than two epochs seen: no window to compare.
    assert grade.idle_worker({1: {"rank": 0, "cpu_s": 9.0}, 2: {"rank": 1, "cpu_s": 1.0}}) == ""


def test_training_outside_the_counted_workers_is_named():
    from autograder import sandbox

    def run(kernel_before, kernel_during, workers_training=16.0, launched=(2,)):
        workers = {10 + r: {"rank": r, "size": 2, "host_pid": 10 + r, "cpu_at_first_epoch": 8.0,
                            "cpu_at_last_epoch": 8.0 + workers_training / 2, "train_cpu_s": workers_training / 2}
                   for r in range(2)}
        first = 16.0 + kernel_before
        return sandbox.RunResult(status="ok", reason="", notebook="", seconds=1.0, worker_uid=65533,
                                 launched=list(launched), horovod_workers=workers, epoch_seen_s={0: 20.0, 1: 30.0},
                                 run_cpu_s={"first_epoch": first, "last_epoch": first + workers_training + kernel_during})

    honest = run(kernel_before=6.0, kernel_during=0.05)  # the reference: the kernel's start-up, then it waits
    assert grade.cpu_split(honest) == {"workers_before": 16.0, "others_before": 6.0, "workers_training": 16.0,
                                       "others_training": 0.05}
    assert grade.not_data_parallel(honest) == ""
    trained_first = grade.not_data_parallel(run(kernel_before=40.0, kernel_during=0.0, workers_training=4.0))
    assert trained_first.startswith("the Horovod workers did not do the run's training: processes other than the 2 workers "
                                    "used 40.0 s of CPU (0.0 s while the epochs were saved), against 20.0 s")
    # Training beside the workers while they save: caught by the share while saving, however much they burn.
    assert "did not do the run's training" in grade.not_data_parallel(run(kernel_before=6.0, kernel_during=10.0,
                                                            workers_training=30.0))
    assert grade.not_data_parallel(run(6.0, 0.05, launched=(1, 2))).startswith(
        "the run started 2 Horovod launches (-np 1, 2)")
    # One epoch saved: no training to weigh (the outcome fails on its own).
    single = run(40.0, 0.0)
    single.epoch_seen_s = {0: 20.0}
    assert grade.not_data_parallel(single) == ""
    # Without a cpuacct cgroup nothing is measured, so nothing is said.
    unmeasured = run(40.0, 0.0)
    unmeasured.run_cpu_s = {"first_epoch": None, "last_epoch": None}
    assert grade.cpu_split(unmeasured) == {} and grade.not_data_parallel(unmeasured) == ""


def test_an_epoch_whose_change_cannot_be_told_never_counts_as_moved():
    same = np.array([1.0, np.nan, 2.0])
    assert measure._relative(same, same.copy()) == 0.0
    assert measure._relative(np.array([1.0, np.inf]), np.array([1.0, 2.0])) == 0.0
    assert measure._relative(np.array([1.0, 2.2]), np.array([1.0, 2.0])) > 0.05


def _stepping_grader(calls: list, rejected_at: str = ""):
    """A grader whose steps (but the run) only note that they ran, with a runner that notes what it got."""
    from types import SimpleNamespace

    from autograder import outcomes, runners, sandbox

    def step(name):
        def noted(sub):
            calls.append(name)
            if name == rejected_at:
                sub.rejected = f"rejected at {name}"
            return sub.verdict if name == "grade" else None
        return noted

    class Runner:
        name = "local"

        def prepare(self, spec):
            calls.append(("prepare", spec))

        def run(self, spec):
            calls.append(("run", spec))
            result = sandbox.RunResult(status="ok", reason="", seconds=1.0, notebook=None)
            return runners.RunOutput(result, {}, spec.parameters_in("d", "o"), (lambda: calls.append("cleaned"),))

    grader = grade.CohortGrader.__new__(grade.CohortGrader)
    grader.course = SimpleNamespace(assignment="assessment", submitted_dir=lambda student: Path("/nonexistent"))
    grader.notebook_id, grader.notebook_name, grader.profile = "assessment", "assessment.ipynb", assessment.profile("cpu", 2)
    grader.dataset_name = grader.fingerprint = grader.heldout = ""
    grader.dataset_real, grader.runner, grader.secret = False, Runner(), 7
    grader.x_train, grader.outcome = np.zeros((200, 1)), outcomes.AccuracyInTime()
    grader.run_cohort = runners.Cohort(Path("/course"), "assessment.ipynb", Path("/data"), grader.profile, 60.0, 4000.0)
    for name in grade.STEPS:
        if name != "run":
            setattr(grader, f"step_{name}", step(name))
    return grader


def test_every_step_runs_in_the_declared_order_and_the_runner_gets_a_run_spec_not_the_grader():
    from autograder import runners

    calls = []
    verdict = _stepping_grader(calls).grade("ada")
    names = [c[0] if isinstance(c, tuple) else c for c in calls]
    assert names == ["validate", "rebuild", "prepare", "run", "check", "measure", "cleaned", "grade"]
    assert [n for n in names if n in grade.STEPS] == list(grade.STEPS)
    (_, prepared), (_, ran) = calls[2], calls[3]
    assert prepared is ran and isinstance(ran, runners.RunSpec) and ran.student == "ada"
    assert ran.cohort.workers == 2 and len(ran.kept_images) == 199
    assert ran.parameters["data_dir"] == "" and verdict.run_status == "ok"
    for rejected_at, expected in (("validate", ["validate", "grade"]), ("rebuild", ["validate", "rebuild", "grade"])):
        calls = []
        _stepping_grader(calls, rejected_at).grade("ada")
        assert calls == expected  # a rejected submission is graded as the release, unexecuted


def test_an_assignment_plugs_in_its_own_outcome_without_touching_the_pipeline(monkeypatch):
    from types import SimpleNamespace

    from autograder import outcomes, sandbox

    class Halted:  # another assignment's outcome: here, the run ended well
        def parameters(self, profile):
            return {"steps": 3}

        def open(self, context):
            self.context = context

        def judge(self, run, evidence_dir):
            assert evidence_dir is None  # it declares no evidence
            return outcomes.Judgement(run.status == "ok", "it halted", ["what was measured"],
                                      {"accuracy": 1.0, "halted_at": 3})

    monkeypatch.setitem(outcomes.OUTCOMES, "another", Halted)
    grader = _stepping_grader([])
    grader.outcome = outcomes.outcome_for("another")
    assert grader.run_parameters("d", "o") == {"workers": 2, "profile": "cpu", "data_dir": "d", "output_dir": "o",
                                               "steps": 3}
    cell = nbformat.v4.new_code_cell("", metadata={"nbgrader": {
        "grade_id": "outcome", "grade": True, "solution": False, "locked": True, "points": 1, "schema_version": 3}})
    verdict = grade.Verdict("ada", "another", "", False, [], horovod_workers_seen=2)
    sub = SimpleNamespace(run=sandbox.RunResult(status="ok", reason="", seconds=1.0, notebook=None), verdict=verdict,
                          executed=nbformat.v4.new_notebook(cells=[cell]), evidence_dir=None)
    grade.CohortGrader.step_measure(grader, sub)  # the pipeline's own step (the helper stubs it)
    assert verdict.passed and verdict.outcome_passed and verdict.accuracy == 1.0
    assert verdict.measured == {"halted_at": 3}  # not a field of the record: kept beside them
    assert cell.outputs[0]["text"] == "what was measured\nPASSED: it halted\n"
    with pytest.raises(course_mod.CourseError, match="autograder.outcomes.OUTCOMES"):
        outcomes.outcome_for("nope")


def test_an_outcomes_evidence_is_copied_as_hostile_data_within_its_caps(tmp_path, monkeypatch):
    from autograder import runners

    output = tmp_path / "output"
    output.mkdir()
    (output / "census-0.json").write_text("{}")
    (output / "census-1.json").write_bytes(b"x" * 5000)            # larger than a file may be
    (output / "census-2.json").symlink_to(tmp_path / "secret")     # a link: never followed
    os.mkfifo(output / "census-3.json")                           # would block a reader
    (output / "weights-0.npz").write_bytes(b"w" * 300)
    (output / "weights-1.npz").write_bytes(b"w" * 300)
    (output / "notes.txt").write_text("not evidence")
    (tmp_path / "secret").write_text("the grader's")
    evidence = (r"census-\d\.json|weights-\d\.npz", 1000)
    assert runners.copy_evidence(output, None, tmp_path / "none", None) is None
    copied = runners.copy_evidence(output, evidence, tmp_path / "copied", None)
    assert sorted(p.name for p in copied.iterdir()) == ["census-0.json", "weights-0.npz", "weights-1.npz"]
    owner = os.stat(output / "census-0.json").st_uid
    assert list(runners.copy_evidence(output, evidence, tmp_path / "others", owner + 1).iterdir()) == []
    monkeypatch.setattr(runners, "MAX_EVIDENCE_BYTES", 400)  # in all: the second weights file no longer fits whole
    capped = runners.copy_evidence(output, evidence, tmp_path / "capped", None)
    assert sorted(p.name for p in capped.iterdir()) == ["census-0.json", "weights-0.npz"]
