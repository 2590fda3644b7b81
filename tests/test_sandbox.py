"""The sandbox a submission runs in: network off and folders hidden where the OS allows it, the
grader's time-out and memory limit, a dead kernel, and no process left behind (real kernels)."""

import os
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from autograder import cgroups, epochs, isolation, sandbox

pytestmark = pytest.mark.slow


def _notebook(folder, *cells):
    runs = folder / "runs"  # the grader's folder of work folders
    runs.mkdir(exist_ok=True)
    return _notebook_in(isolation.RunFolder(runs / "work"), *cells)


def _notebook_in(work, *cells):
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                 "display_name": "Python 3"}})
    parameters = nbformat.v4.new_code_cell('secret_dir = ""\noutput_dir = ""')
    parameters.metadata["tags"] = ["parameters"]
    notebook.cells = [parameters, *[nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in cells]]
    nbformat.write(notebook, work.nb / "submission.ipynb")
    return work


# A process the notebook leaves running in a session of its own, with a duration no other
# process on the machine has (its pid means nothing outside the run's PID namespace).
ORPHAN = """
import random, subprocess
duration = f"{random.randint(10**6, 10**7)}.5"
child = subprocess.Popen(["sleep", duration], start_new_session=True)
open("orphan.pid", "w").write(duration)
"""


def _run(work, **kwargs):
    secret = work.root.parents[1] / "secret"
    options = dict(parameters={"secret_dir": str(secret), "output_dir": str(work.output)},
                   keep=work.root.parent / "kept", timeout_s=120, memory_limit_mb=4000, hide=[secret],
                   work_parent=work.root.parent)
    options.update(kwargs)
    try:
        return sandbox.run_notebook(work, "submission.ipynb", **options)
    finally:
        (work.root.parent / "orphan.pid").write_text((work.nb / "orphan.pid").read_text()
                                                     if (work.nb / "orphan.pid").exists() else "none")
        work.remove()


def _orphan_gone(work):
    duration = (work.root.parent / "orphan.pid").read_text()
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == ["sleep", duration] and proc.info["status"] != psutil.STATUS_ZOMBIE:
            return False
    return True


def _outputs(notebook_json):
    notebook = nbformat.reads(notebook_json, as_version=4)
    return "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)


def test_network_is_off_folders_are_hidden_the_kernel_cannot_write_output_and_nothing_survives(tmp_path, monkeypatch):
    monkeypatch.setenv("INSTRUCTOR_TOKEN", "s3cret")  # the grader's environment never reaches a run
    available, why = isolation.isolation_available()
    if not available:
        pytest.skip(why)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "labels.npy").write_text("the test labels")
    (tmp_path / "runs" / "other-student").mkdir(parents=True)
    (tmp_path / "runs" / "other-student" / "notebook.ipynb").write_text("{}")
    path = _notebook(tmp_path, """
        import os, socket, time
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=3)
            print("network: on")
        except OSError:
            print("network: off")
        print("secret files visible:", os.listdir(secret_dir) if os.path.exists(secret_dir) else [])
        print("other runs visible:", sorted(os.listdir("../..")))
        print("environment:", sorted(os.environ))
        print("tmp:", os.listdir("/tmp"), "shm:", os.listdir("/dev/shm"))
        try:
            open(os.path.join(output_dir, "epoch_000.npz"), "wb").write(b"x")
            print("kernel wrote output")
        except OSError as error:
            print("kernel cannot write output:", type(error).__name__)
        """, ORPHAN)
    (tmp_path / "host-tmp-file").write_text("x")
    result = _run(path)
    assert result.status == "ok" and result.reason == "" and result.isolation == "", (result.status, result.reason)
    text = _outputs(result.notebook)
    assert "network: off" in text and "secret files visible: []" in text
    assert "other runs visible: ['work']" in text
    assert "kernel cannot write output: PermissionError" in text and result.epoch_seen_s == {}
    assert "host-tmp-file" not in text.split("tmp:")[1].splitlines()[0] and "shm: []" in text, text
    shown = text.split("environment:")[1].splitlines()[0]
    assert "INSTRUCTOR_TOKEN" not in shown and "MGPU_GRADE_ID" in shown
    # the hidden folder is still there for the grader
    assert (tmp_path / "secret" / "labels.npy").exists()
    assert _orphan_gone(path)


def test_time_out_kills_the_whole_tree(tmp_path):
    path = _notebook(tmp_path, ORPHAN, "import time\ntime.sleep(600)")
    result = _run(path, timeout_s=15)
    assert result.status == "timeout" and result.reason == "timed out after 15 s"
    assert 15 <= result.seconds < 60
    assert _orphan_gone(path)


def test_memory_limit_kills_the_run_with_the_reason(tmp_path):
    path = _notebook(tmp_path, ORPHAN, "import numpy as np\nx = np.ones(200 * 2**20)  # 1.6 GB\nimport time\ntime.sleep(60)")
    result = _run(path, memory_limit_mb=600)
    assert result.status == "memory" and "memory limit exceeded" in result.reason and "600 MB" in result.reason
    assert result.peak_memory_mb > 600
    assert _orphan_gone(path)


def test_printing_past_the_output_cap_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "MAX_RESULT_BYTES", 4 * 2**20)
    path = _notebook(tmp_path, ORPHAN, "for i in range(8):\n    print('x' * 2**20)")
    result = _run(path)
    assert result.status == "output" and result.reason == (
        "output limit exceeded: the executed notebook, with what its cells printed, passed 4 MB, the grader's cap "
        "(print less)"), result.reason
    assert _orphan_gone(path)


FILL = """
import os
with open(os.path.join({folder!r}, "big"), "wb") as file:
    for _ in range(64):
        file.write(b"x" * 2**20)
"""

MANY_FILES = """
import os
os.makedirs("many", exist_ok=True)
for i in range(100000):
    open(f"many/{i}", "w").close()
"""


@pytest.mark.parametrize("where", ["run", "tmp", "shm"])
def test_a_full_disk_is_named_with_its_cap(tmp_path, monkeypatch, where):
    if os.geteuid() != 0:
        pytest.skip("the run's own file system is a tmpfs only as root")
    available, why = isolation.isolation_available()
    if where != "run" and not available:
        pytest.skip(why)
    monkeypatch.setattr(isolation, "TMP_MB", 16)
    monkeypatch.setattr(isolation, "SHM_MB", 16)
    runs = tmp_path / "runs"
    runs.mkdir()
    work = isolation.RunFolder(runs / "work", disk_mb=16)
    folder = {"run": str(work.nb), "tmp": "/tmp", "shm": "/dev/shm"}[where]
    path = _notebook_in(work, FILL.format(folder=folder), "print('after')")
    result = _run(path)
    name = {"run": "the run's own file system", "tmp": "/tmp", "shm": "/dev/shm"}[where]
    assert result.status == "disk", (result.status, result.reason)
    assert result.reason.startswith(f"disk limit reached: {name} was full (its cap is 16 MB)"), result.reason
    if where != "run":  # (a full run folder also stops papermill writing the executed notebook)
        assert "No space left on device" in result.reason, result.reason


def test_running_out_of_inodes_is_named_with_the_cap(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the run's own file system is a tmpfs only as root")
    runs = tmp_path / "runs"
    runs.mkdir()
    work = isolation.RunFolder(runs / "work", inodes=300)
    result = _run(_notebook_in(work, MANY_FILES))
    assert result.status == "disk", (result.status, result.reason)
    assert result.reason.startswith("inode limit reached: the run's own file system held its cap of 300 files "
                                    "and folders"), result.reason


def test_a_dead_kernel_is_reported(tmp_path):
    path = _notebook(tmp_path, ORPHAN, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "print('after')")
    result = _run(path)
    assert result.status == "kernel_died" and result.reason.startswith("kernel died (it exited, crashed or ran out of memory)")
    assert _orphan_gone(path)


def test_a_fork_bomb_is_stopped_at_the_task_limit_and_leaves_nothing(tmp_path):
    available, why = isolation.isolation_available()
    probe = cgroups.RunCgroups("probe", 100)
    has_pids = "pids" in probe.folders
    probe.remove()
    if not available or not has_pids:
        pytest.skip(why or "no writable pids cgroup")
    (tmp_path / "secret").mkdir()
    path = _notebook(tmp_path, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """)
    result = _run(path, timeout_s=300)
    assert result.status == "tasks" and "too many processes" in result.reason, (result.status, result.reason)
    assert result.seconds < 60
    assert not [p for p in psutil.process_iter() if _marked(p, tmp_path)]


def test_the_host_is_an_allow_list_and_read_only(tmp_path):
    """A run sees the system and the course library, not the host's other folders (submissions,
    other courses, homes), and can write nowhere on the host: not /var/tmp, not /run/lock."""
    available, why = isolation.isolation_available()
    if not available:
        pytest.skip(why)
    # A folder of submissions beside the project (under a top-level folder that is not the system's).
    beside = Path(tempfile.mkdtemp(dir=isolation.REPO_ROOT / "build" if (isolation.REPO_ROOT / "build").is_dir()
                                   else isolation.REPO_ROOT, prefix="submissions-"))
    (beside / "alice.ipynb").write_text("alice's answer")
    writable = [p for p in ("/var/tmp", "/run/lock", "/var/lock") if os.path.isdir(p)]
    try:
        path = _notebook(tmp_path, f"""
            import os, mgpu, autograder
            print("submissions visible:", os.path.exists({str(beside / "alice.ipynb")!r}))
            print("project visible:", sorted(os.listdir({str(isolation.REPO_ROOT)!r})))
            for place in {writable!r}:
                try:
                    open(os.path.join(place, "left-by-a-run"), "w").write("x")
                    print("wrote", place)
                except OSError as error:
                    print("cannot write", place, error.strerror)
            print("own folder writable:", bool(open("mine.txt", "w").write("x")))
            """)
        result = _run(path)
    finally:
        shutil.rmtree(beside)
    text = _outputs(result.notebook)
    assert result.status == "ok", result.reason
    assert "submissions visible: False" in text, text
    shown = text.split("project visible:")[1].splitlines()[0]
    assert "autograder" in shown and "mgpu" in shown and "tests" not in shown and "assignments" not in shown, shown
    assert "wrote" not in text and all(f"cannot write {p}" in text for p in writable), text
    assert "own folder writable: True" in text
    assert not any(os.path.exists(os.path.join(p, "left-by-a-run")) for p in writable)


def test_the_run_is_not_root_and_cannot_undo_the_mounts(tmp_path):
    available, why = isolation.isolation_available()
    if not available:
        pytest.skip(why)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key.pem").write_text("private")
    path = _notebook(tmp_path, """
        import os, subprocess
        print("uid", os.getuid())
        done = subprocess.run(["umount", "-l", secret_dir], capture_output=True)
        print("umount", done.returncode)
        print("visible", os.listdir(secret_dir) if os.path.exists(secret_dir) else [])
        """)
    result = _run(path)
    text = _outputs(result.notebook)
    assert result.status == "ok", result.reason
    assert f"uid {isolation.RUN_UID}" in text and "umount 0" not in text and "visible []" in text, text


def _marked(proc, folder):
    """A process of a run whose work folder is under ``folder`` (other tests' runs are not ours)."""
    try:
        return isolation.GRADE_MARKER in proc.environ() and proc.cwd().startswith(str(folder))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False


HOROVOD_JOB = """
import os, subprocess, sys
from mgpu.runtime import launch

def work(output_dir):
    import horovod.tensorflow as hvd
    hvd.init()
    seccomp = [line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp:")]
    open(os.path.join(output_dir, f"facts-{os.getpid()}.json"), "w").write(f'{{"seccomp": "{seccomp[0]}"}}')
    return os.getuid(), hvd.size()

# A process of the kernel's own that claims to be a Horovod worker.
fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                        env=dict(os.environ, HOROVOD_RANK="0", HOROVOD_SIZE="2"))
result = launch.run(work, 2, args=(output_dir,))
print("workers ran as", result.value)
fake.kill()
seccomp = [line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp:")]
print("seccomp of the kernel", seccomp, "and the workers",
      sorted(open(os.path.join(output_dir, f)).read() for f in os.listdir(output_dir) if f.startswith("facts-")))
"""


def test_horovod_workers_are_started_by_the_launch_service_as_their_own_user(tmp_path):
    """The kernel's launch.run goes through the sandbox's launch service; only its workers count."""
    available, why = isolation.isolation_available()
    if not available or isolation.RUN_UID == "-":
        pytest.skip(why or "runs as root")
    (tmp_path / "secret").mkdir()
    path = _notebook(tmp_path, HOROVOD_JOB)
    result = _run(path, timeout_s=300)
    assert result.status == "ok", result.reason
    text = _outputs(result.notebook)
    assert f"workers ran as ({isolation.WORKER_UID}, 2)" in text, text
    # every process of the run works under the system-call filter (mode 2), the workers too
    assert """seccomp of the kernel ['2'] and the workers ['{"seccomp": "2"}', '{"seccomp": "2"}']""" in text, text
    assert result.worker_uid == int(isolation.WORKER_UID)
    assert sorted(w["rank"] for w in result.horovod_workers.values()) == [0, 1]  # the fake is not one
    assert result.launched == [2] and sorted(w["rank"] for w in result.workers_that_ran().values()) == [0, 1]


CPU_JOB = """
import os, time
from mgpu.runtime import launch

def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass

def work(output_dir):
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    for epoch in (0, 1):
        hvd.allreduce(tf.constant(0.0), name=f"before_{epoch}")  # synchronous, like training steps
        if hvd.rank() == 0:
            open(os.path.join(output_dir, f"epoch_{epoch:03d}.npz"), "wb").write(b"weights")
        hvd.allreduce(tf.constant(0.0), name=f"after_{epoch}")
        if epoch == 0:
            burn(1.5)  # each worker, between the two epoch files
    return 0

burn(3.0)  # the kernel, before the launch
launch.run(work, 2, args=(output_dir,))
"""


@pytest.mark.parametrize("stall_s", [0.0, 1.2, 3.0])
def test_the_runs_cpu_is_split_between_the_workers_and_everything_else(tmp_path, monkeypatch, stall_s):
    """Measured from outside: the kernel's CPU before the first epoch is the others', the workers'
    CPU between the epoch files is theirs (the run's cpuacct cgroup and each worker's own time),
    also when a busy machine holds the watchdog back after a file appears, for most of the workers'
    1.5 s or for longer than it (the marks are interpolated, between the CPU trail's samples, to when
    each file was written, not taken when it was noticed)."""
    from autograder import grade

    available, why = isolation.isolation_available()
    if not available or isolation.RUN_UID == "-":
        pytest.skip(why or "runs as root")
    poll = epochs.EpochKeeper.poll

    def held_back(keeper, now):
        if set(keeper._names()) - set(keeper.seen):
            time.sleep(stall_s)
        poll(keeper, now)
    monkeypatch.setattr(epochs.EpochKeeper, "poll", held_back)
    (tmp_path / "secret").mkdir()
    result = _run(_notebook(tmp_path, CPU_JOB), timeout_s=300)
    assert result.status == "ok", result.reason
    split = grade.cpu_split(result)
    if not split:
        pytest.skip("no cpuacct cgroup here")
    assert split["others_before"] >= 2.5, split          # the kernel's 3 s
    assert 2.6 <= split["workers_training"] <= 4.5, split  # two workers' 1.5 s each
    assert split["others_training"] < 0.5, split          # the kernel waited
    # Here the kernel's 3 s outweigh what the workers did (importing Horovod, 3 s of work): named.
    assert "the Horovod workers did not do the run's training" in grade.not_data_parallel(result), split
