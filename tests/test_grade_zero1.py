"""Assessment B (ZeRO-1) through the grader's command, end to end on real Horovod workers.

One ``grade --assignment zero1`` grades a cohort of six through the sandbox: the reference solution
twice (two students with the same code: honest ZeRO-1 runs end with the same weights, and that is
no copy), the release (plain data parallelism: too much state per worker) and the three red-team
cases of ``tests/redteam_zero1/`` (one that does not shard but reports that it does, one that reads
the reference weights, one that gathers the full state on every rank). The verdicts come from the
evidence files the grader copied out of each run; the clean test pass reads the same copies;
``certify`` signs the passes' certificates, which name Assessment B and state the grader's
measurements. Through Slurm, the reference's evidence comes back from the node and gets the same
verdict.
"""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder import cohort
from autograder import course as course_mod

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION\n", re.M)
# student: (passes, words its reason must hold)
REDTEAM = Path(__file__).resolve().parent / "redteam_zero1"
CASES = ("fake_sharded", "reads_reference", "gathers_state")
EXPECTED = {"reference": (True, ()), "same_code": (True, ()),
            "plain_dp": (False, ("state: a worker holds too much optimizer state",)),
            **{case: cohort.EXPECTED_ZERO1[case] for case in CASES}}


def _program(notebook, source):
    cell = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "training_program")
    cell.source = source


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course_dir = tmp_path_factory.mktemp("zero1 course")  # a space in the path, as some homes have
    course = course_mod.copy_course(course_dir, "zero1")
    release = nbformat.read(course.release_dir() / "zero1.ipynb", as_version=4)
    source = nbformat.read(ROOT / "assignments" / "source" / "zero1" / "zero1.ipynb", as_version=4)
    solution = next(c.source for c in source.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") == "training_program")
    programs = {"reference": SOLUTION_MARKER.sub("", solution), "same_code": SOLUTION_MARKER.sub("", solution),
                "plain_dp": None, **{case: (REDTEAM / f"{case}.py").read_text() for case in CASES}}
    for student, program in programs.items():
        notebook = nbformat.from_dict(release)
        if program is not None:
            _program(notebook, program)
        folder = course_dir / "submitted" / student / "zero1"
        folder.mkdir(parents=True)
        nbformat.write(notebook, folder / "zero1.ipynb")
    result = subprocess.run([sys.executable, "-m", "autograder", "grade", str(course_dir), "--assignment", "zero1",
                             "--profile", "cpu", "--workers", "2"], cwd=ROOT, capture_output=True, text=True,
                            timeout=20 * 60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return course_dir, result


def _record(course_dir, student):
    return json.loads((course_dir / "autograder" / "zero1" / f"{student}.json").read_text())


def test_every_verdict_and_reason_is_the_expected_one(graded):
    course_dir, result = graded
    with open(course_dir / "autograder" / "zero1" / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == sorted(EXPECTED)
    for student, (passes, words) in EXPECTED.items():
        assert (rows[student]["passed"] == "True") is passes, \
            (student, rows[student]["reason"], _record(course_dir, student)["notes"])
        for word in words:
            assert word in rows[student]["reason"], (student, word, rows[student]["reason"])
    assert rows["reference"]["reason"] == "" and rows["same_code"]["reason"] == ""


def test_the_grader_measured_from_its_copies_of_the_evidence(graded):
    course_dir, _ = graded
    records = {s: _record(course_dir, s) for s in EXPECTED}
    seeds = {r["measured"]["zero1"]["data_seed"] for r in records.values()}
    assert len(seeds) == 1  # one seed per cohort, drawn by the grader
    reference = records["reference"]["measured"]["zero1"]
    assert reference["weights_max_abs_diff"] <= 1e-5
    assert 0.9 <= reference["comm_over_dp"] <= 1.01
    assert set(reference["collectives"]) >= {"REDUCESCATTER", "ALLGATHER"}
    plain = records["plain_dp"]["measured"]["zero1"]
    assert max(plain["state_bytes_per_rank"].values()) > plain["state_bound_bytes"]
    # Two honest runs end with identical weights here: neither is failed as a copy.
    assert not records["reference"]["copied_from"] and not records["same_code"]["copied_from"]


def test_the_clean_test_pass_reads_the_evidence(graded):
    course_dir, _ = graded
    course = course_mod.Course(course_dir, "zero1")
    reference, plain = course.scores("reference"), course.scores("plain_dp")
    assert all(s == m > 0 for s, m in reference.values()), reference
    assert plain["test_workers_and_state"][0] == 0 and plain["test_weights_and_communication"][0] > 0, plain
    assert plain["outcome"][0] == 0


def test_certify_signs_the_passes_certificates_naming_assessment_b_with_the_graders_numbers(graded):
    course_dir, _ = graded
    assert _record(course_dir, "reference")["certificate_note"].startswith("eligible: run python -m autograder "
                                                                          "certify")
    keys = subprocess.run([sys.executable, "-m", "autograder", "keys", "init", "--course", str(course_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert keys.returncode == 0, keys.stderr[-2000:]
    certify = subprocess.run([sys.executable, "-m", "autograder", "certify", str(course_dir), "--assignment", "zero1",
                              "--profile", "cpu", "--workers", "2"], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    assert certify.returncode == 0, certify.stderr[-2000:]
    records = {s: _record(course_dir, s) for s in EXPECTED}
    assert records["reference"]["certificate"] and records["same_code"]["certificate"]
    assert not records["plain_dp"].get("certificate") and records["plain_dp"]["certificate_note"].startswith("not passed")
    pdf = course_dir / "autograder" / "zero1" / "certificates" / f"{records['reference']['certificate']}.pdf"
    verified = subprocess.run([sys.executable, "-m", "autograder", "verify", str(pdf), "--course", str(course_dir)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and verified.stdout.startswith("VALID: "), verified.stdout + verified.stderr
    measured = records["reference"]["measured"]["zero1"]
    assert "Assessment B: shard the optimizer (ZeRO-1) (zero1): final weights within" in verified.stdout
    assert f"{measured['weights_max_abs_diff']:.1e} of plain data parallelism's" in verified.stdout
    assert f"{measured['comm_over_dp']:.2f}x its bytes sent per step" in verified.stdout
    assert f"seed {measured['data_seed']}" in verified.stdout


# ------------------------------------------------------------------- the same through Slurm (two nodes, one machine)

def test_on_slurm_the_evidence_comes_back_and_the_verdicts_are_the_local_ones(graded, slurm_cluster, tmp_path):
    local_dir, _ = graded
    course_dir, shared = tmp_path / "course", tmp_path / "shared"
    shared.mkdir()
    course_mod.copy_course(course_dir, "zero1")
    for student in ("reference",):
        folder = course_dir / "submitted" / student / "zero1"
        folder.mkdir(parents=True)
        (folder / "zero1.ipynb").write_bytes((local_dir / "submitted" / student / "zero1" / "zero1.ipynb").read_bytes())
    result = subprocess.run([sys.executable, "-m", "autograder", "grade", str(course_dir), "--assignment", "zero1",
                             "--profile", "cpu", "--workers", "2", "--backend", "slurm", "--shared-dir", str(shared),
                             "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=10 * 60,
                            env=slurm_cluster.env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for student in ("reference",):
        mine, local = _record(course_dir, student), _record(local_dir, student)
        assert mine["backend"] == "slurm" and mine["run_host"] in ("n1", "n2"), mine
        same = ("passed", "outcome_passed", "run_status", "score", "max_score", "cell_scores")
        assert {k: mine[k] for k in same} == {k: local[k] for k in same}, (student, mine["reason"], local["reason"])
        assert mine["measured"]["zero1"]["state_bytes_per_rank"], mine["reason"]  # read from the node's evidence
    assert list(shared.iterdir()) == []
