"""scripts/slurm_cluster.py: the two-node Slurm cluster the grading jobs and multi-node Horovod jobs
will run on comes up with both nodes idle, runs job arrays with a fake GPU and a memory limit each,
ends a job over its --mem as OUT_OF_MEMORY, spreads a two-node srun over both nodes, and leaves no
process and no cgroup folder behind. Prints its set-up and tear-down times and a job's overhead
(see them with -s, or in the lines marked [slurm]). The last test brings the cluster down: it stays last."""

import os
import sys
import time
from pathlib import Path

from slurm_fixtures import script


def _report(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n[slurm] {line}")


def test_both_nodes_are_up_and_idle_with_two_cpus_and_two_gpus(slurm_cluster, capsys):
    _report(capsys, f"set-up (up, until both nodes idle): {slurm_cluster.setup_seconds:.2f} s")
    assert script.node_states(slurm_cluster.folder) == {"n1": "idle", "n2": "idle"}
    assert os.environ["SLURM_CONF"] == str(slurm_cluster.folder / "slurm.conf")
    for node in script.NODES:
        fields = slurm_cluster.run("scontrol", "show", "node", "-o", node, timeout=15).stdout
        assert f"CPUTot={script.CPUS} " in fields and f"Gres=gpu:{script.GPUS} " in fields, fields
    ok, report = script.status(slurm_cluster.folder)
    assert ok and "n1 idle, n2 idle" in report, report


def test_a_job_array_runs_each_element_with_a_gpu_and_its_memory(slurm_cluster, tmp_path):
    job_id = slurm_cluster.submit(
        "--array=0-1", "--gres=gpu:1", "--mem=100M", "--time=1", "-o", f"{tmp_path}/%a.out", "--wrap",
        f"echo $SLURM_ARRAY_TASK_ID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES > {tmp_path}/task-$SLURM_ARRAY_TASK_ID")
    assert slurm_cluster.wait(job_id) == {f"{job_id}_0": "COMPLETED", f"{job_id}_1": "COMPLETED"}
    lines = {path.name: path.read_text().split() for path in tmp_path.glob("task-*")}
    assert sorted(lines) == ["task-0", "task-1"], lines
    for name, (task, node, gpu) in lines.items():
        assert name == f"task-{task}" and node in script.NODES and gpu in {"0", "1"}, lines
    if lines["task-0"][1] == lines["task-1"][1]:  # on the same node: each its own GPU
        assert lines["task-0"][2] != lines["task-1"][2], lines


def test_a_job_over_its_memory_ends_out_of_memory(slurm_cluster, tmp_path):
    out = tmp_path / "oom.out"
    eat = "block = b'x' * (400 << 20); print('survived')"  # 400 MB written, against --mem=100M
    job_id = slurm_cluster.submit("--mem=100M", "--time=1", "-o", str(out), "--wrap", f"{sys.executable} -c \"{eat}\"")
    assert slurm_cluster.wait(job_id) == {job_id: "OUT_OF_MEMORY"}
    job = slurm_cluster.job(job_id)
    assert (job["JobState"], job["Reason"]) == ("OUT_OF_MEMORY", "OutOfMemory"), job
    assert "survived" not in out.read_text() and "oom-kill event" in out.read_text(), out.read_text()
    # Without a database sacct has nothing; jobcomp/filetxt keeps the end of every job for good.
    record = [line for line in (slurm_cluster.folder / "log" / "jobcomp.txt").read_text().splitlines()
              if line.startswith(f"JobId={job_id} ")]
    assert len(record) == 1 and " JobState=OUT_OF_MEMORY " in record[0], record


def test_a_two_node_srun_puts_one_task_on_each_node(slurm_cluster):
    tasks = slurm_cluster.run("srun", "-N", "2", "-n", "2", "--immediate=30", "--time=1", "bash", "-c",
                              "echo $SLURM_PROCID $SLURM_NODEID $SLURMD_NODENAME", timeout=60).stdout
    assert sorted(tasks.split("\n")[:-1]) == ["0 0 n1", "1 1 n2"], tasks
    # More tasks than the cluster's 4 CPUs would wait forever; --immediate makes it an error at once.
    too_many = slurm_cluster.run("srun", "-n", "5", "--immediate", "true", timeout=30, check=False)
    assert too_many.returncode != 0 and "Unable to allocate resources" in too_many.stderr, too_many


def test_a_trivial_job_completes_and_its_overhead_is_printed(slurm_cluster, capsys):
    start = time.monotonic()
    slurm_cluster.run("sbatch", "--wait", "-o", "/dev/null", "--wrap", "true", timeout=60)
    waited = time.monotonic() - start
    start = time.monotonic()
    assert slurm_cluster.wait(slurm_cluster.submit("-o", "/dev/null", "--wrap", "true")).popitem()[1] == "COMPLETED"
    _report(capsys, f"a trivial job: sbatch --wait {waited:.2f} s (its first look is after 2 s); "
                    f"submitted to COMPLETED, squeue every 0.1 s: {time.monotonic() - start:.2f} s")


def _naming(folder: Path) -> list[str]:
    """Live processes whose command line or environment names the cluster's folder: the daemons
    (-f DIR/slurm.conf, munged's --socket), a batch job's shell and what it runs (SLURM_CONF)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            named = str(folder).encode() in (proc / "environ").read_bytes() or str(folder) in line
            if named and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(f"{proc.name}: {line}")
        except (OSError, IndexError):
            pass
    return found


def test_down_leaves_no_process_and_no_cgroup_folder_and_can_run_twice(slurm_cluster, capsys):
    # A job still running when the cluster goes down: its slurmstepd, shell and sleep must go too.
    slurm_cluster.submit("-o", "/dev/null", "--wrap", "sleep 300")
    deadline = time.monotonic() + 30
    while not any("sleep 300" in line for line in _naming(slurm_cluster.folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any("sleep 300" in line for line in _naming(slurm_cluster.folder))
    pids = slurm_cluster.processes()  # 4 daemons, slurmscriptd, slurmstepd
    assert len(pids) >= 6 and script.cgroup_folders(), pids
    start = time.monotonic()
    assert slurm_cluster.down() == []
    _report(capsys, f"tear-down (down, one job running): {time.monotonic() - start:.2f} s")
    assert not [pid for pid in pids if script._alive(pid)]
    assert slurm_cluster.processes() == [] and _naming(slurm_cluster.folder) == []
    assert script.cgroup_folders() == []
    start = time.monotonic()
    assert slurm_cluster.down() == [] and time.monotonic() - start < 5  # twice: nothing to do
    ok, report = script.status(slurm_cluster.folder)
    assert not ok and "its processes: none" in report, report
