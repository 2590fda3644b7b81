"""The grader's Slurm backend on a real two-node cluster (tests/slurm_fixtures.py): stopping the
grader cancels its jobs and leaves nothing; a grader killed outright has its jobs cancelled by the
next run; Slurm's memory kill gets the local backend's verdict; bad cluster settings and a refused
sbatch give one line naming the fix and record nothing. (The cohort's verdicts, local against
Slurm, are in tests/test_autograder_cohort.py.)"""

import errno
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder import cohort, safe_read, sandbox, slurm, stop
from autograder import course as course_mod

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course whose only submission never returns (an idle time-out)."""
    course_dir = tmp_path_factory.mktemp("course")
    course_mod.copy_course(course_dir)
    cohort.write_demo_cohort(course_dir, notebooks={"time_out": cohort.cluster_notebooks(course_dir)["time_out"]})
    return course_dir


def _grade(course_dir, shared, *extra, env=None):
    return [sys.executable, "-m", "autograder", "grade", str(course_dir), "--profile", "cpu", "--workers", "2",
            "--backend", "slurm", "--shared-dir", str(shared), "--no-progress", *extra]


def _wait_running(cluster, timeout=60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = cluster.run("squeue", "-h", "-r", "-o", "%i %T").stdout.split("\n")
        running = [line.split()[0] for line in lines if line.endswith(" RUNNING")]
        if running and stop.processes_of_runs():  # the notebook's own processes are up on the node
            return running[0]
        time.sleep(0.2)
    raise AssertionError(f"no grading job ran within {timeout} s: {cluster.run('squeue', '-h').stdout}")


def _no_record(course_dir):
    return not (course_dir / "autograder" / "assessment" / "time_out.json").exists()


def test_stopping_the_grader_cancels_its_jobs_and_leaves_nothing(slurm_cluster, course, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    grader = subprocess.Popen(_grade(course, shared), cwd=ROOT, env=slurm_cluster.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    element = _wait_running(slurm_cluster)
    stopped = time.monotonic()
    grader.send_signal(signal.SIGTERM)
    output, _ = grader.communicate(timeout=60)
    assert grader.returncode != 0 and "cancelled Slurm job array" in output, output
    deadline = time.monotonic() + 30
    while (slurm_cluster.run("squeue", "-h").stdout.strip() or stop.processes_of_runs()) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"\n[slurm] SIGTERM to the grader -> job {element} gone, no process left: {time.monotonic() - stopped:.1f} s")
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""
    assert slurm_cluster.job(element)["JobState"] == "CANCELLED"
    assert stop.processes_of_runs() == []
    assert list(shared.iterdir()) == [] and _no_record(course)


def test_a_killed_graders_jobs_are_cancelled_by_the_next_run(slurm_cluster, course, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    grader = subprocess.Popen(_grade(course, shared), cwd=ROOT, env=slurm_cluster.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    element = _wait_running(slurm_cluster)
    grader.kill()  # no clean-up at all: the job runs on, its folder stays
    grader.wait()
    assert slurm_cluster.job(element)["JobState"] == "RUNNING" and len(list(shared.iterdir())) == 1
    rerun = subprocess.run(_grade(course, shared, "--timeout", "5"), cwd=ROOT, env=slurm_cluster.env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "cancelled 1 Slurm job(s) left by an interrupted grading run" in rerun.stdout, rerun.stdout
    assert slurm_cluster.job(element)["JobState"] == "CANCELLED"
    record = json.loads((course / "autograder" / "assessment" / "time_out.json").read_text())
    assert (record["run_status"], record["reason"].split(";")[0]) == ("timeout", "timed out after 5 s")
    assert list(shared.iterdir()) == [] and stop.processes_of_runs() == []


def test_a_run_over_the_jobs_memory_gets_the_memory_verdict(slurm_cluster, tmp_path):
    course_dir = tmp_path / "course"
    course_mod.copy_course(course_dir)
    cohort.write_demo_cohort(course_dir, notebooks={"reference": cohort.demo_notebooks(course_dir)["reference"]})
    # The site's own sbatch options come last: a --mem far below what the run needs.
    (course_dir / "autograder").mkdir(exist_ok=True)
    (course_dir / "autograder" / "slurm.json").write_text(json.dumps({"sbatch_args": ["--mem=300M"]}))
    shared = tmp_path / "shared"
    shared.mkdir()
    done = subprocess.run(_grade(course_dir, shared), cwd=ROOT, env=slurm_cluster.env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((course_dir / "autograder" / "assessment" / "reference.json").read_text())
    # The kernel stopped the run inside the job's 300 MB, far under the sandbox's own cap: the
    # verdict says whose cap it was.
    assert record["run_status"] == "memory" and record["reason"].startswith("memory limit exceeded"), record["reason"]
    assert "cluster's --mem is too small" in record["reason"] and not record["passed"], record["reason"]
    assert stop.processes_of_runs() == []


def test_slurms_own_time_and_memory_kills_get_the_local_verdicts(tmp_path, monkeypatch):
    """When Slurm ends an element before its runner reports (its --time, or a --mem kill of the runner
    itself), the verdict is the local backend's; any other end without a result is the grader's fault."""
    runner = slurm.SlurmRunner.__new__(slurm.SlurmRunner)
    runner.job_id, runner.timeout_s, runner.memory_mb = "7", 120, 6000
    runner.folder = runner.shared = tmp_path
    for state, status, reason in (("TIMEOUT", "timeout", "timed out after 120 s"),
                                  ("OUT_OF_MEMORY", "memory", "memory limit exceeded: more than 6000 MB")):
        run, facts = runner.outcome(slurm._Task(3, tmp_path, state=state, node="n2"), None)
        assert (run.status, facts, run.epoch_files) == (status, {}, {}) and run.reason.startswith(reason), run.reason
    ran_ok = sandbox.RunResult(status="ok", reason="", seconds=30.0, notebook=None)
    run, _ = runner.outcome(slurm._Task(3, tmp_path, state="OUT_OF_MEMORY"), (ran_ok, {}, {}))
    assert run.status == "memory"  # the job's state wins over a runner that saw nothing wrong
    for state in ("NODE_FAIL", "CANCELLED", "COMPLETED", ""):
        with pytest.raises(slurm.SlurmError, match=f"ended {state or 'unseen'}.* without a result"):
            runner.outcome(slurm._Task(3, tmp_path, state=state), None)
    # Without a result on a full shared folder: the disk's fault (the cohort stops), never a verdict.
    free_mb = shutil.disk_usage(tmp_path).free / 2**20
    monkeypatch.setattr(slurm, "MIN_FREE_MB", free_mb + 1024)
    with pytest.raises(OSError, match="is full") as full:
        runner.outcome(slurm._Task(3, tmp_path, state="FAILED"), None)
    assert full.value.errno == errno.ENOSPC


def test_bad_settings_and_a_refused_sbatch_give_one_line_and_record_nothing(slurm_cluster, course, tmp_path):
    results = course / "autograder" / "assessment"
    before = {p.name: p.read_bytes() for p in results.glob("*")} if results.exists() else {}

    def grade(*args, env=slurm_cluster.env, shared=tmp_path):
        done = subprocess.run(_grade(course, shared, "--force", *args), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, (done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1, done.stderr
        return lines[0]

    assert "does not exist or is not writable" in grade(shared=tmp_path / "nowhere")
    assert "which every run needs" in grade(shared=ROOT)  # runs never see the shared folder
    assert "SLURM_CONF names" in grade(env={**slurm_cluster.env, "SLURM_CONF": str(tmp_path / "none.conf")})
    dead = tmp_path / "dead.conf"  # a controller nobody runs
    dead.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=9", (slurm_cluster.folder / "slurm.conf").read_text()))
    assert "Slurm does not answer" in grade(env={**slurm_cluster.env, "SLURM_CONF": str(dead)})
    refused = grade("--partition", "nosuch")
    assert "sbatch refused the grading jobs" in refused and "check --partition" in refused
    (course / "autograder").mkdir(exist_ok=True)
    settings = course / "autograder" / slurm.SETTINGS_FILE
    try:
        settings.write_text('{"shared_dir": 3, "queue": "x"}')
        invalid = grade()
        assert "is not valid" in invalid and "shared_dir, partition, account, sbatch_args" in invalid
    finally:
        settings.unlink()
    assert list(tmp_path.glob("mgpu-grade-*")) == []
    assert ({p.name: p.read_bytes() for p in results.glob("*")} if results.exists() else {}) == before
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""
    local = subprocess.run([sys.executable, "-m", "autograder", "grade", str(course), "--partition", "p"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert local.returncode == 2 and "for --backend slurm" in local.stderr


def test_the_array_asks_for_the_profiles_cores_gpus_memory_and_time(course, tmp_path):
    from mgpu import assessment

    runner = slurm.SlurmRunner.__new__(slurm.SlurmRunner)  # no cluster needed to build the request
    runner.settings = slurm.ClusterSettings(str(tmp_path), partition="gpu", account="course42",
                                            sbatch_args=["--qos=short"])
    runner.array_name, runner.folder, runner.timeout_s = "mgpu-grade-x", tmp_path, 150
    for name, gres in (("cpu", []), ("gpu", ["--gres=gpu:4"])):
        runner.profile = assessment.Profile(name, "fashion_mnist", 4, 6000, 1000, 2000, 0.85, 120, 150, 8000)
        runner.memory_mb = 8000
        args = runner.sbatch_args(300, 16)
        assert args[:6] == ["--array=0-299%16", "--job-name=mgpu-grade-x", "--ntasks=1", "--cpus-per-task=4",
                            f"--mem={8000 * 5 // 4 + slurm.RUNNER_MEMORY_MB}M", "--time=5"], args
        assert args[-3:] == ["--partition=gpu", "--account=course42", "--qos=short"], args  # the site's last
        assert [a for a in args if a.startswith("--gres")] == gres and "--export=NONE" in args, args


def test_the_grader_reads_the_shared_folder_as_hostile_data(tmp_path):
    """A result in the shared folder is copied out without following links or reading past caps:
    an epoch file that is a link (to the grader's secret, say) is rejected, never read."""
    from autograder import node_run

    task = tmp_path / "task"
    (task / "result").mkdir(parents=True)
    secret = tmp_path / "grading_secret"
    secret.write_text("0123456789abcdef\n")
    (task / "result" / "epoch_000.npz").write_bytes(b"PK weights")
    (task / "result" / "epoch_001.npz").symlink_to(secret)
    run = sandbox.RunResult(status="ok", reason="", seconds=9.0, notebook=None, epoch_seen_s={0: 4.0, 1: 8.0},
                            epoch_files={0: task / "result" / "epoch_000.npz", 1: task / "result" / "epoch_001.npz"})
    record = {"run": run.to_json(), "node": "n1", "slurm_node": "n1",
              "facts": {"facts-7.json": {"data": "e30="}, "facts-8.json": {"rejected": "a link"}}}
    (task / "result" / "result.json").write_text(json.dumps(record))
    keep = tmp_path / "kept"
    got, facts, _ = node_run.read_result(task, keep)
    assert got.epoch_files == {0: keep / "epoch_000.npz"} and (keep / "epoch_000.npz").read_bytes() == b"PK weights"
    assert "is a link" in got.epoch_rejected[1] and not (keep / "epoch_001.npz").exists()
    assert got.epoch_seen_s == {0: 4.0, 1: 8.0} and facts["facts-7.json"] == b"{}"
    assert isinstance(facts["facts-8.json"], safe_read.Rejected)
    # The record itself: a link is refused, and so is a file that is not a run's result.
    (task / "result" / "result.json").unlink()
    assert node_run.read_result(task, keep) is None  # not written (yet)
    (task / "result" / "result.json").symlink_to(secret)
    with pytest.raises(ValueError, match="is a link"):
        node_run.read_result(task, keep)
    (task / "result" / "result.json").unlink()
    (task / "result" / "result.json").write_text(json.dumps({"run": {"status": "ok"}, "facts": {}}))
    with pytest.raises(ValueError, match="not a run's result"):
        node_run.read_result(task, keep)
    record["run"]["epoch_files"] = {"0": "../../grading_secret"}
    (task / "result" / "result.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="is not its file's name"):
        node_run.read_result(task, keep)
