"""Faults in the grader itself: killed part-way through a cohort, then rerun; the disk filling up
while it writes. No grade may be lost or doubled, no file half-written, no process left behind."""

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder import course as course_mod
from autograder import cgroups, stop

import corpus
from test_redteam import ROOT, grade

pytestmark = pytest.mark.slow
#: Cheap submissions: no Horovod training, each graded in seconds.
CHEAP = ("network", "fake_weights_files", "malformed_json", "kernel_os_exit")


def write_cheap_cohort(course_dir: Path) -> None:
    course_mod.copy_course(course_dir)
    context = corpus.Context(course_dir)
    for name in CHEAP:
        built = corpus.BY_NAME[name].build(context)
        folder = course_dir / "submitted" / name / "assessment"
        folder.mkdir(parents=True)
        path = folder / "assessment.ipynb"
        if isinstance(built, bytes):
            path.write_bytes(built)
        else:
            nbformat.write(built, path)


def _describe(pids: list[int]) -> list[str]:
    import psutil

    described = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            described.append(f"{pid} {proc.status()} ppid={proc.ppid()} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            continue
    return described


def gradebook_submissions(course_dir: Path) -> list[str]:
    from nbgrader.api import Gradebook

    course = course_mod.Course(course_dir, "assessment")
    with Gradebook(course.db_url) as gb:
        return sorted(s.student.id for s in gb.find_assignment("assessment").submissions)


def test_a_grader_killed_mid_cohort_leaves_no_process_and_its_rerun_grades_each_once(tmp_path):
    course_dir = tmp_path / "course"
    write_cheap_cohort(course_dir)
    results = course_dir / "autograder" / "assessment"
    grader = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(course_dir), "--no-progress",
                               "--jobs", "1"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    # Kill it while a submission runs (its kernel started), after at least one was recorded.
    running_since = None
    while time.monotonic() < deadline:
        running = bool(list(results.glob("*.json")) and stop.processes_of_runs())
        running_since = (running_since or time.monotonic()) if running else None
        if running_since and time.monotonic() - running_since > 1.0:
            break
        time.sleep(0.2)
    else:
        grader.kill()
        pytest.fail("the grader never had a run in flight after a recorded grade")
    recorded_before = sorted(p.stem for p in results.glob("*.json"))
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    gone_by = time.monotonic() + 15  # dying processes need a moment of CPU on a busy machine
    while stop.processes_of_runs() and time.monotonic() < gone_by:
        time.sleep(0.5)
    assert stop.processes_of_runs() == [], f"the run outlived the grader: {_describe(stop.processes_of_runs())}"
    assert 0 < len(recorded_before) < len(CHEAP)

    rerun = grade(course_dir)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"skipping {len(recorded_before)} submission(s) already graded" in rerun.stdout
    assert sorted(p.stem for p in results.glob("*.json")) == sorted(CHEAP)
    assert gradebook_submissions(course_dir) == sorted(CHEAP)
    assert not list(results.glob(".*tmp"))
    lines = (results / "grades.csv").read_text().strip().splitlines()
    assert len(lines) == 1 + len(CHEAP)
    assert "cleaned up after an interrupted grading run" in rerun.stdout
    for controller in cgroups.CONTROLLERS:
        folder = cgroups.own_cgroup_dir(controller)
        assert folder is None or not list(folder.glob(f"{cgroups.CGROUP_PREFIX}*"))


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare to mount a small disk")
def test_a_full_disk_gives_one_clear_line_and_nothing_half_written(tmp_path):
    course_dir = tmp_path / "course"
    course_mod.copy_course(course_dir)
    folder = course_dir / "submitted" / "malformed_json" / "assessment"
    folder.mkdir(parents=True)
    (folder / "assessment.ipynb").write_bytes(corpus.malformed_json(None))
    results = course_dir / "autograder"
    results.mkdir()
    # The results folder on a 24 kB disk: the record fits, the HTML report (with its plot) does not.
    script = (f'mount -t tmpfs -o size=24k tmpfs "{results}" && '
              f'"$0" -m autograder grade "{course_dir}" --no-progress; status=$?; '
              f'ls -a "{results}/assessment"; cat "{results}/assessment/malformed_json.json" > /dev/null && '
              'echo record-complete; exit $status')
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    if "Operation not permitted" in done.stderr:
        pytest.skip("mounting a tmpfs is not allowed here")
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "disk full" in errors[0] and "run the same command again" in errors[0], done.stderr
    listing = done.stdout.split()
    assert not [name for name in listing if name.endswith(".tmp")], listing
    assert "report.html" not in listing and "record-complete" in done.stdout
    # Outside that small disk, the rerun grades it once and writes every report.
    rerun = grade(course_dir)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert gradebook_submissions(course_dir) == ["malformed_json"]
    assert (results / "assessment" / "report.html").exists()
