"""The red-team corpus graded as one cohort, with real kernels and real Horovod workers.

Each case must end with the right verdict and reason, never crash the grader, never change
another student's grade, and leave the gradebook consistent; nothing outside a run's work folder
may be read or written, and no process may survive. The verdicts table goes to
``build/results/redteam.json``.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder import certificates, cgroups, stop
from autograder import course as course_mod
from mgpu.runtime import paths

import corpus

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BY_NAME = corpus.BY_NAME


#: A secret in the instructor's environment: no run may see it.
TOKEN = "instructor-token-5d1e"


#: The runs' time-out here: the cases that run take at most about 25 s; the two that never end (a hung
#: all-reduce, a full disk) are cut at this instead of the profile's 120 s (CI time).
TIMEOUT_S = 60


def grade(course_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", "grade", str(course_dir), "--assignment",
                           "assessment", "--profile", "cpu", "--workers", "2", "--no-progress",
                           "--timeout", str(TIMEOUT_S), *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=3600,
                          env=dict(os.environ, INSTRUCTOR_TOKEN=TOKEN))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course_dir = tmp_path_factory.mktemp("redteam")
    course_mod.copy_course(course_dir)
    subprocess.run([sys.executable, "-m", "autograder", "keys", "init", "--course", str(course_dir)],
                   check=True, capture_output=True, cwd=ROOT)
    context = corpus.Context(course_dir, corpus.leaked_weights(course_dir))
    corpus.write_corpus(context)
    before = {p: sha(p) for p in [*(course_dir / "submitted").rglob("*.ipynb"), *(course_dir / ".keys").iterdir(),
                                  course_dir / "source" / "assessment" / "assessment.ipynb"]}
    started = time.monotonic()
    result = grade(course_dir)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = {r["student"]: r for r in
               (json.loads(p.read_text()) for p in (course_dir / "autograder" / "assessment").glob("*.json"))}
    table = {name: {"what": BY_NAME[name].what, "expected": "pass" if BY_NAME[name].passes else "fail",
                    "verdict": "pass" if r["passed"] else "fail", "reason": r["reason"], "notes": r.get("notes"),
                    "score": r["score"], "max_score": r["max_score"], "run_status": r["run_status"],
                    "notebook_seconds": round(r["notebook_seconds"], 1)}
             for name, r in sorted(records.items())}
    out = paths.ROOT / "build" / "results" / "redteam.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cases": len(corpus.CASES), "grading_seconds": round(seconds, 1),
                               "verdicts": table}, indent=1))
    return {"dir": course_dir, "records": records, "before": before, "stdout": result.stdout}


@pytest.mark.parametrize("name", [case.name for case in corpus.CASES])
def test_each_case_gets_its_verdict_and_reason(graded, name):
    case = BY_NAME[name]
    record = graded["records"][name]
    said = record["reason"] + " | " + "; ".join(record.get("notes") or [])
    assert record["passed"] is case.passes, said
    for words in case.words:
        assert words in said, f"{words!r} not in: {said}"


def test_the_gradebook_holds_one_consistent_grade_per_submission(graded):
    from nbgrader.api import Gradebook

    course = course_mod.Course(graded["dir"], "assessment")
    with Gradebook(course.db_url) as gb:
        submissions = [s.student.id for s in gb.find_assignment("assessment").submissions]
        assert sorted(submissions) == sorted(c.name for c in corpus.CASES)
        for name, record in graded["records"].items():
            notebook = gb.find_submission_notebook("assessment", "assessment", name)
            assert notebook.max_score == 10, name  # edited points never count
            assert notebook.score == pytest.approx(record["score"]), name
    # The outcome's 6 points go exactly to the runs whose outcome the grader measured as reached, and
    # every pass has them (a run that reaches it but fails a test keeps them and does not pass).
    for name, record in graded["records"].items():
        assert (record["cell_scores"]["outcome"][0] == 6) is record["outcome_passed"], name
        assert record["outcome_passed"] or not record["passed"], name


def test_the_submissions_the_key_and_the_solution_are_untouched_and_no_process_is_left(graded):
    for path, digest in graded["before"].items():
        assert sha(path) == digest, path
    assert stop.processes_of_runs() == []
    for controller in cgroups.CONTROLLERS:
        folder = cgroups.own_cgroup_dir(controller)
        assert folder is None or not list(folder.glob(f"{cgroups.CGROUP_PREFIX}*"))


def test_nothing_outside_the_work_folder_is_readable_or_writable(graded):
    text = _outputs(graded["dir"], "outside_the_work_folder")
    for name in ("gradebook", "solution", "other student", "signing key", "grading secret", "records"):
        assert f"blocked {name}" in text and f"blocked writing {name}" in text, text
    assert "READ " not in text and "WROTE " not in text
    assert "umount: refused" in text and "blocked gradebook after umount" in text
    assert "running as uid 0" not in text
    assert "other work folders: ['" in text and "cells_reordered" not in text.split("other work folders:")[1]
    assert not list((graded["dir"]).rglob("planted.json"))
    private = (graded["dir"] / ".keys" / "signing_key.pem").read_text().splitlines()[1]
    for folder in ("autograder", "feedback", "executed"):
        for path in (graded["dir"] / folder).rglob("*"):
            if path.is_file():
                assert private.encode() not in path.read_bytes(), path


def test_the_host_beside_the_course_is_out_of_sight_and_read_only(graded):
    text = _outputs(graded["dir"], "reads_the_host")
    assert "blocked host files" in text and "READ " not in text, text
    assert "blocked git" in text and all(f"blocked project {n}" in text for n in (".git", "tests", "assignments", "build"))
    for folder in ("/var/tmp", "/run/lock", "/etc", "/usr/local"):
        if os.path.isdir(folder):
            assert f"blocked writing {folder}" in text, text
            assert not os.path.exists(os.path.join(folder, "mgpu-host-write"))
    assert "WROTE" not in text


def test_the_network_is_unreachable(graded):
    text = _outputs(graded["dir"], "network")
    assert text.count("blocked ") == 4 and "CONNECTED" not in text and "DOWNLOADED" not in text, text


def test_the_test_split_is_out_of_reach(graded):
    text = _outputs(graded["dir"], "test_split_reached_for")
    assert "data folder holds: ['dataset.json', 'train.npz', 'val.npz']" in text
    assert "data cache visible: []" in text and "fashion_mnist: unavailable" in text
    assert "private images" in graded["records"]["test_split_reached_for"]["heldout"]


def test_kernel_side_tricks_do_not_reach_the_graders_tests(graded):
    for name in ("monkeypatched_tests_and_assert", "fake_facts_files", "test_cell_edited"):
        scores = graded["records"][name]["cell_scores"]
        assert scores["test_horovod_init"][0] == 0 and scores["test_distributed_training"][0] == 0, name
    # The kernel cannot write where the workers leave their facts.
    assert "could not write facts: PermissionError" in _outputs(graded["dir"], "fake_facts_files")
    assert "FORGED" not in _outputs(graded["dir"], "kernel_writes_worker_facts")
    for name in ("kernel_writes_worker_facts", "extra_horovod_processes", "planted_modules"):
        scores = graded["records"][name]["cell_scores"]
        assert scores["test_horovod_init"][0] == 0 and scores["test_distributed_training"][0] == 0, name
    # Processes of the kernel's that claim Horovod's variables are not workers: only the two the
    # launch service started were seen.
    assert graded["records"]["extra_horovod_processes"]["horovod_workers_seen"] == 2


def test_an_optimizer_named_like_horovods_that_does_not_average_fails_the_optimizer_test(graded):
    scores = graded["records"]["fake_distributed_optimizer"]["cell_scores"]
    assert scores["test_horovod_init"][0] == 2 and scores["test_distributed_training"][0] == 0


def test_nothing_a_run_planted_ran_in_the_grader(graded):
    assert not Path("/tmp/PLANTED-RAN").exists()
    for folder in ("autograder", "feedback", "executed"):
        for path in (graded["dir"] / folder).rglob("*"):
            if path.is_file() and path.suffix in (".json", ".html", ".ipynb", ".csv"):
                text = path.read_text(errors="replace")
                assert "all tests passed" not in text or "planted_modules" in str(path), path


def test_runs_leave_nothing_for_each_other_and_see_no_secret_of_the_graders(graded):
    reader = _outputs(graded["dir"], "zz_reads_what_others_left")
    assert "FOUND LEFT-BEHIND" not in reader and "token: None" in reader, reader
    assert "INSTRUCTOR_TOKEN" not in reader.split("environment:")[1].splitlines()[0]
    assert "left a file in /tmp" in _outputs(graded["dir"], "leaves_files_for_the_next_run")
    assert not list(Path("/tmp").glob("mgpu-left-behind")) and not list(Path("/dev/shm").glob("mgpu-left-behind"))


def test_paths_from_the_run_are_never_followed(graded):
    text = _outputs(graded["dir"], "output_links")
    assert "could not replace output/: PermissionError" in text and "REPLACED" not in text
    epochs = graded["records"]["output_links"]["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2] and all(e["accuracy"] is None for e in epochs)
    assert "rejected: link" in graded["records"]["symlinked_submission"]["reason"] or \
        "link" in graded["records"]["symlinked_submission"]["reason"]


def test_a_run_that_fills_its_disk_fails_alone_and_the_reports_are_written(graded):
    record = graded["records"]["fills_its_disk"]
    assert not record["passed"]
    assert (graded["dir"] / "autograder" / "assessment" / "report.html").exists()
    assert (graded["dir"] / "autograder" / "assessment" / "grades.csv").read_text().count("\n") >= len(corpus.CASES)


def test_honest_twins_are_not_taken_for_copies(graded):
    # Two students with the reference program: different data orders, different weights.
    for name in ("locked_cells_missing", "cells_reordered"):
        assert graded["records"][name]["copied_from"] == []
    hashes = [{e["weights_sha256"] for e in graded["records"][name]["epochs"]}
              for name in ("locked_cells_missing", "cells_reordered")]
    assert not hashes[0] & hashes[1]


def test_practice_profile_on_generated_data_earns_no_certificate(graded):
    assert not (graded["dir"] / "autograder" / "assessment" / "certificates").exists()
    for name, record in graded["records"].items():
        assert record["certificate"] == "", name
        if record["passed"]:
            assert "generated data" in record["certificate_note"], name
            assert "practice profile cpu" in record["certificate_note"], name
    # The signing step agrees: nothing to sign, no record changed.
    records = {p.name: p.read_text() for p in (graded["dir"] / "autograder" / "assessment").glob("*.json")}
    result = subprocess.run([sys.executable, "-m", "autograder", "certify", str(graded["dir"]), "--assignment",
                             "assessment", "--profile", "cpu", "--workers", "2"], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0 and result.stdout.startswith("no certificate issued"), result.stdout + result.stderr
    assert not (graded["dir"] / "autograder" / "assessment" / "certificates").exists()
    assert {p.name: p.read_text() for p in (graded["dir"] / "autograder" / "assessment").glob("*.json")} == records


def test_a_rerun_regrades_nothing_and_changes_nothing(graded):
    records = {p.name: p.read_text() for p in (graded["dir"] / "autograder" / "assessment").glob("*.json")}
    result = grade(graded["dir"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"skipping {len(corpus.CASES)} submission(s) already graded" in result.stdout
    after = {p.name: p.read_text() for p in (graded["dir"] / "autograder" / "assessment").glob("*.json")}
    assert after == records


def test_passes_on_an_official_profile_with_real_data_get_a_certificate_that_verifies(graded, tmp_path):
    """The certificate step (certify, after grading) on the corpus's real records, as if its profile
    were official and its data Fashion-MNIST (which this machine cannot download): only the passes
    get one."""
    import dataclasses
    import shutil

    from autograder import certify
    from autograder import grade as grading
    from mgpu import assessment

    course_dir = tmp_path / "official"
    shutil.copytree(graded["dir"], course_dir, symlinks=True)
    profile = dataclasses.replace(assessment.profile("cpu", 2), official=True)
    results = course_dir / "autograder" / "assessment"
    for record in grading.load_verdicts(results):
        record["dataset_real"], record["certificate_note"] = True, ""
        (results / f"{record['student']}.json").write_text(json.dumps(record, indent=1))
    issued = certify.issue_certificates(course_dir, "assessment", profile, log=lambda *a: None)
    assert sorted(issued) == sorted(n for n, r in graded["records"].items() if r["passed"])
    folder = course_dir / "autograder" / "assessment" / "certificates"
    for student in issued:
        record = json.loads((course_dir / "autograder" / "assessment" / f"{student}.json").read_text())
        document = json.loads((folder / f"{record['certificate']}.json").read_text())
        fields = document["certificate"]
        assert fields["student_id"] == student and fields["accuracy"] == record["accuracy"]
        assert fields["submission_sha256"] == record["submission_sha256"] and fields["workers"] == 2
        verify = [sys.executable, "-m", "autograder", "verify", "--course", str(course_dir)]
        ok = subprocess.run([*verify, str(folder / f"{record['certificate']}.pdf")], capture_output=True,
                            text=True, cwd=ROOT)
        assert ok.returncode == 0 and ok.stdout.startswith("VALID"), ok.stdout + ok.stderr
        document["certificate"]["accuracy"] = 0.99
        forged = tmp_path / "forged.json"
        forged.write_text(json.dumps(document))
        bad = subprocess.run([*verify, str(forged)], capture_output=True, text=True, cwd=ROOT)
        assert bad.returncode == 1 and "field was changed" in bad.stdout
    # A rerun issues nothing twice.
    assert certify.issue_certificates(course_dir, "assessment", profile, log=lambda *a: None) == []


def _outputs(course_dir: Path, student: str) -> str:
    executed = nbformat.read(course_dir / "executed" / student / "assessment" / "assessment.ipynb", as_version=4)
    return "".join(str(o.get("text", "")) for c in executed.cells if c.cell_type == "code" for o in c.outputs)
