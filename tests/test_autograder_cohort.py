"""End to end: one command grades a cohort of five (reference, unconverted, crashing, infinite loop,
fake accuracy) on real Horovod workers, with the expected verdicts and reasons; and, with its run step on
a two-node Slurm cluster (``--backend slurm``), reference, unconverted and a time-out get the same verdicts."""

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder import cohort, stop
from autograder import course as course_mod
from mgpu import assessment

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
#: The runs' time-out (the profile's is 120 s): the reference's notebook takes 15-25 s, and the
#: infinite loop is cut sooner (CI time).
LOCAL_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course_dir = tmp_path_factory.mktemp("cohort")
    course_mod.copy_course(course_dir)
    students = cohort.write_demo_cohort(course_dir)
    hashes = {s: course_mod.file_sha256(course_dir / "submitted" / s / "assessment" / "assessment.ipynb")
              for s in students}
    profile = assessment.profile("cpu", 2)
    result = subprocess.run([sys.executable, "-m", "autograder", "grade", str(course_dir),
                             "--assignment", "assessment", "--profile", "cpu", "--workers", "2",
                             "--timeout", str(LOCAL_TIMEOUT_S)],
                            cwd=ROOT, capture_output=True, text=True, timeout=20 * 60)
    assert result.returncode == 0, result.stderr[-3000:]
    return course_dir, students, hashes, profile, result


def _records(course_dir):
    with open(course_dir / "autograder" / "assessment" / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def test_every_verdict_and_reason_is_the_expected_one(graded):
    course_dir, students, _, _, result = graded
    rows = _records(course_dir)
    assert sorted(rows) == sorted(cohort.EXPECTED)
    for student, (passes, words) in cohort.EXPECTED.items():
        row = rows[student]
        assert (row["passed"] == "True") is passes, (student, row["reason"])
        for word in words:
            assert word in row["reason"], (student, word, row["reason"])
        assert student in result.stdout and ("PASS" if passes else "FAIL") in result.stdout
    assert rows["reference"]["reason"] == ""


def test_gradebook_scores_follow_the_measurement_and_unexecuted_tests_score_zero(graded):
    course_dir, _, _, _, _ = graded
    course = course_mod.Course(course_dir, "assessment")
    for student, (passes, _) in cohort.EXPECTED.items():
        scores = course.scores(student)
        score, maximum = scores["outcome"]
        record = json.loads((course_dir / "autograder" / "assessment" / f"{student}.json").read_text())
        # the outcome cell's score is the grader's measurement, whatever the tests say
        assert (score == maximum) is record["outcome_passed"], (student, scores, record["reason"])
        if passes:
            assert record["outcome_passed"]
        if record["outcome_passed"]:
            assert record["reached_seconds"] <= record["time_budget_s"]
        elif student in ("crashing", "infinite_loop", "fake_accuracy"):
            assert score == 0
        if student in ("crashing", "infinite_loop"):  # papermill never reached the tests
            assert all(s == 0 for s, _ in scores.values()), (student, scores)
    reference = course.scores("reference")
    assert all(s == m > 0 for s, m in reference.values())


def test_the_reference_passes_on_the_graders_own_measurements(graded):
    course_dir, _, _, profile, _ = graded
    record = json.loads((course_dir / "autograder" / "assessment" / "reference.json").read_text())
    accuracies = [e["accuracy"] for e in record["epochs"]]
    seen = [e["seconds"] for e in record["epochs"]]
    assert seen == sorted(seen) and 0 < seen[0] and seen[-1] <= record["notebook_seconds"] + 1
    reached = record["reached_seconds"]
    assert reached is not None and reached <= profile.time_budget_s
    streak_end = [e for e in record["epochs"] if e["seconds"] == reached][0]["epoch"]
    assert all(a >= profile.target_accuracy for a in accuracies[streak_end - 1:streak_end + 1])
    assert record["total_seconds"] >= record["notebook_seconds"] > 0


def test_feedback_and_report_are_written_without_hidden_tests(graded):
    course_dir, students, _, _, _ = graded
    for student in students:
        feedback = course_dir / "feedback" / student / "assessment" / "assessment.html"
        text = feedback.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "weights_in_sync" not in text
    html = (course_dir / "autograder" / "assessment" / "report.html").read_text()
    assert all(student in html for student in students)
    assert "data:image/png;base64," in html and "1 of 5 passed" in html


def test_submissions_untouched_and_no_process_left(graded):
    course_dir, students, hashes, _, _ = graded
    for student in students:
        path = course_dir / "submitted" / student / "assessment" / "assessment.ipynb"
        assert course_mod.file_sha256(path) == hashes[student]
    assert stop.processes_of_runs() == []


def test_a_rerun_skips_what_is_graded(graded):
    course_dir, students, _, _, _ = graded
    result = subprocess.run([sys.executable, "-m", "autograder", "grade", str(course_dir), "--profile", "cpu",
                             "--workers", "2", "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"skipping {len(students)} submission(s) already graded" in result.stdout


# ------------------------------------------------------------------------------------------------
# The same grader with its run step on a Slurm cluster (tests/slurm_fixtures.py: two nodes on this
# machine): reference, unconverted and a time-out get the local backend's verdicts (those above).

SLURM_TIMEOUT_S = 50  # the time-out here (the reference's notebook takes 15-25 s); the local cohort above ran with LOCAL_TIMEOUT_S


@pytest.fixture(scope="module")
def graded_on_slurm(graded, slurm_cluster, tmp_path_factory):
    course_dir = tmp_path_factory.mktemp("cohort-slurm")
    shared = tmp_path_factory.mktemp("shared")
    course_mod.copy_course(course_dir)
    cohort.write_demo_cohort(course_dir, notebooks=cohort.cluster_notebooks(course_dir))
    command = [sys.executable, "-m", "autograder", "grade", str(course_dir), "--profile", "cpu", "--workers", "2",
               "--backend", "slurm", "--shared-dir", str(shared), "--timeout", str(SLURM_TIMEOUT_S), "--no-progress"]
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=10 * 60, env=slurm_cluster.env)
    seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    return course_dir, shared, command, result, seconds


def _record(course_dir, student):
    return json.loads((course_dir / "autograder" / "assessment" / f"{student}.json").read_text())


def test_on_slurm_every_verdict_is_the_local_backends(graded, graded_on_slurm, capsys):
    local_dir = graded[0]
    course_dir, _, _, result, seconds = graded_on_slurm
    with capsys.disabled():
        print(f"\n[slurm] grading reference, unconverted and time_out as a Slurm job array on two nodes: "
              f"{seconds:.1f} s (the time-out at {SLURM_TIMEOUT_S} s)")
    for student, local_student in (("reference", "reference"), ("unconverted", "unconverted"),
                                   ("time_out", "infinite_loop")):
        mine, local = _record(course_dir, student), _record(local_dir, local_student)
        same = ("passed", "outcome_passed", "run_status", "score", "max_score", "cell_scores", "isolation",
                "horovod_workers_seen", "restored_cells", "discarded_facts")
        if student == "time_out":  # a worker asleep and one spinning differ in what the watchdog sees by the cut
            same = tuple(k for k in same if k != "horovod_workers_seen")
        assert {k: mine[k] for k in same} == {k: local[k] for k in same}, (student, mine["reason"], local["reason"])
        timeout_words = lambda reason, s: reason.replace(f"timed out after {s} s", "timed out after N s")
        assert timeout_words(mine["reason"], SLURM_TIMEOUT_S) == timeout_words(local["reason"], LOCAL_TIMEOUT_S), \
            (student, mine["reason"], local["reason"])
        assert (mine["backend"], local["backend"]) == ("slurm", "local")
        assert mine["run_host"] in ("n1", "n2") and re.fullmatch(r"\d+_[0-2]", mine["slurm_job"]), mine
        assert mine["queue_seconds"] >= 0 and local["queue_seconds"] == 0
        print_line = [line for line in result.stdout.splitlines() if line.startswith(student + " ")]
        assert print_line and ("PASS" if mine["passed"] else "FAIL") in print_line[0], result.stdout
    assert _record(course_dir, "reference")["passed"]
    assert f"timed out after {SLURM_TIMEOUT_S} s" in _record(course_dir, "time_out")["reason"]
    reference = _record(course_dir, "reference")
    assert reference["run_cpu_s"] and len(reference["epochs"]) >= 2  # measured here, from the node's epoch files


def test_on_slurm_nothing_is_left_and_a_rerun_skips_what_is_graded(graded_on_slurm, slurm_cluster):
    course_dir, shared, command, _, _ = graded_on_slurm
    assert list(shared.iterdir()) == []  # the staged cohort is gone
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""
    assert stop.processes_of_runs() == []
    rerun = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=slurm_cluster.env)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "skipping 3 submission(s) already graded" in rerun.stdout + rerun.stderr
    assert "submitted Slurm job array" not in rerun.stdout + rerun.stderr
