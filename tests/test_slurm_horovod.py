"""mgpu.lesson10.slurm_horovod: a Horovod job inside a Slurm allocation, started by srun without ssh and without
MPI. The pieces against Horovod's own launcher (the variables each Gloo worker gets, the plan), then
a real job of 2 nodes x 2 tasks on the course's test cluster: every rank trains from its own random
start, ends with rank 0's weights exactly, sits where Horovod's plan puts it, and nothing of the job
is left running. A rank that fails ends the job at once. Prints the job's time from sbatch to its end
and the weights' spread (lines marked [slurm], or -s)."""

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mgpu.lesson10 import multinode, slurm_horovod
from mgpu.runtime import launch


def _report(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n[slurm] {line}")


# --------------------------------------------------------------------------------------------
# The pieces, without a cluster


def test_the_allocations_tasks_per_node_become_horovods_hosts():
    assert slurm_horovod.tasks_per_node("2(x2)") == [2, 2]
    assert slurm_horovod.tasks_per_node("3,1") == [3, 1]
    assert slurm_horovod.tasks_per_node("2(x2),1") == [2, 2, 1]
    assert slurm_horovod.plan_hosts(["n1", "n2", "n3"], [2, 2, 1]) == "n1:2,n2:2,n3:1"
    with pytest.raises(ValueError, match="2\\(x2\\),1"):
        slurm_horovod.tasks_per_node("2x2")
    with pytest.raises(ValueError, match="2 nodes"):
        slurm_horovod.plan_hosts(["n1", "n2"], [4])
    with pytest.raises(RuntimeError, match="inside a Slurm allocation"):
        slurm_horovod.allocation_hosts({})


def _task_env(node: int, local: int, **extra) -> dict:
    return {"SLURM_NODEID": str(node), "SLURM_LOCALID": str(local), "SLURM_NTASKS": "4", **extra}


def test_each_task_takes_its_slot_in_horovods_plan_from_its_node_and_local_id():
    plan = multinode.slots("n1:2,n2:2")
    for slot in plan:
        env = _task_env(plan.index(slot) // 2, slot.local_rank, SLURMD_NODENAME=slot.hostname)
        assert slurm_horovod.task_slot("n1:2,n2:2", env) == slot
    with pytest.raises(RuntimeError, match="is n2, not n1"):
        slurm_horovod.task_slot("n1:2,n2:2", _task_env(0, 0, SLURMD_NODENAME="n2"))
    with pytest.raises(RuntimeError, match="no local rank 2"):
        slurm_horovod.task_slot("n1:2,n2:2", _task_env(1, 2))
    with pytest.raises(RuntimeError, match="started 5 tasks"):
        slurm_horovod.task_slot("n1:2,n2:2", {**_task_env(0, 0), "SLURM_NTASKS": "5"})


def test_a_task_gets_the_variables_horovods_gloo_launcher_gives_a_worker():
    from horovod.runner import gloo_run

    slot = multinode.slots("n1:2,n2:2")[3]
    ours = slurm_horovod.horovod_environment(slot, "127.0.0.1", 4321, "lo")
    theirs = {**gloo_run.create_slot_env_vars(slot), **gloo_run.create_run_env_vars("127.0.0.1", ["lo"], 4321)}
    assert ours == {key: str(value) for key, value in theirs.items()}
    assert (ours["HOROVOD_RANK"], ours["HOROVOD_LOCAL_RANK"], ours["HOROVOD_CROSS_RANK"]) == ("3", "1", "1")
    assert slurm_horovod.interface_towards("127.0.0.1") == "lo"
    env = slurm_horovod.task_environment("n1:2,n2:2", "localhost", 4321,
                                         {**_task_env(1, 0), "SLURM_CPUS_PER_TASK": "3", "PATH": "/bin"})
    where = (env["HOROVOD_RANK"], env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_IFACE"])
    assert where == ("2", "127.0.0.1", "lo")  # the name is resolved; the interface is the one towards it
    assert env[launch.THREADS_VARIABLE] == "3" and env["PATH"] == "/bin"
    chosen = slurm_horovod.task_environment("n1:2,n2:2", "127.0.0.1", 1,
                                            {**_task_env(0, 0), "HOROVOD_GLOO_IFACE": "ib0"})
    assert chosen["HOROVOD_GLOO_IFACE"] == "ib0"  # a site's choice (--network-interface) is kept


def test_the_batch_script_is_valid_bash_and_starts_the_rendezvous_before_srun():
    script = slurm_horovod.batch_script(["python", "train.py", "--epochs", "2"], nodes=2, tasks_per_node=4,
                                        gpus_per_node=4, time_limit="00:20:00", output="out/%j.txt")
    multinode.check_shell(script)
    for line in ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:4",
                 "#SBATCH --time=00:20:00", "#SBATCH --output=out/%j.txt"]:
        assert line + "\n" in script
    assert script.index("mgpu.lesson10.slurm_horovod rendezvous") < script.index("srun --kill-on-bad-exit=1")
    assert script.rstrip().endswith('task "$hosts" "$address" "$port" -- python train.py --epochs 2')
    assert "ssh" not in script and "mpi" not in script.lower()
    assert "--gres" not in slurm_horovod.batch_script(["python", "t.py"], nodes=1, tasks_per_node=1)


def test_the_rendezvous_server_answers_with_the_plans_scopes(tmp_path):
    import threading
    import urllib.request

    stop = threading.Event()
    server = threading.Thread(target=slurm_horovod.serve_rendezvous, args=("n1:2,n2:2", tmp_path / "port"),
                              kwargs={"stop": stop}, daemon=True)
    server.start()
    deadline = time.monotonic() + 20
    while not (tmp_path / "port").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    port = int((tmp_path / "port").read_text())
    try:
        put = urllib.request.Request(f"http://127.0.0.1:{port}/local_n2/key", data=b"value", method="PUT")
        assert urllib.request.urlopen(put, timeout=5).status == 200
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/local_n2/key", timeout=5).read() == b"value"
    finally:
        stop.set()
        server.join(timeout=10)
    assert not server.is_alive()


def test_without_slurm_the_notebook_is_told_why_and_how_to_get_one(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm_horovod, "_sinfo_answers", lambda env: False)
    with slurm_horovod.reach_slurm(start=False) as slurm:
        assert slurm.env is None and slurm.note.startswith("No Slurm here (")
        assert "apt-get install slurmctld slurmd slurm-client munge" in slurm.note and "\n" not in slurm.note


def test_the_course_cluster_is_started_for_the_block_and_stopped_however_it_ends(monkeypatch):
    from slurm_fixtures import script

    if script.missing():
        pytest.skip(f"Slurm is not installed: {script.INSTALL}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm_horovod, "_sinfo_answers", lambda env: False)
    with pytest.raises(KeyboardInterrupt):
        with slurm_horovod.reach_slurm() as slurm:
            assert slurm.started_here and "test cluster" in slurm.note, slurm.note
            folder = Path(slurm.env["SLURM_CONF"]).parent
            assert script.node_states(folder) == {"n1": "idle", "n2": "idle"}
            raise KeyboardInterrupt  # the learner stops the cell
    assert script.processes(folder) == [] and script.cgroup_folders() == [] and not folder.exists()


# --------------------------------------------------------------------------------------------
# On the two-node test cluster


def _train(folder: str, steps: int) -> None:
    """Each rank: a random start of its own, broadcast from rank 0, `steps` steps of synchronous SGD with
    DistributedGradientTape on data of its own; leaves its place and weights in folder/rank-<r>.json."""
    import os

    import mgpu  # noqa: F401  (Keras 2 on every stack)
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    tf.keras.utils.set_random_seed(100 + hvd.rank())
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activation="tanh"),
                                 tf.keras.layers.Dense(1)])
    start = [w.numpy().tolist() for w in model.weights]
    optimizer = tf.keras.optimizers.SGD(0.05)
    hvd.broadcast_variables(model.variables, root_rank=0)
    rng = np.random.default_rng(hvd.rank())
    for _ in range(steps):
        x = rng.normal(size=(16, 4)).astype("float32")
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - x.sum(axis=1, keepdims=True)) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    record = {"rank": hvd.rank(), "local_rank": hvd.local_rank(), "cross_rank": hvd.cross_rank(),
              "size": hvd.size(), "local_size": hvd.local_size(), "cross_size": hvd.cross_size(),
              "node": os.environ["SLURMD_NODENAME"], "procid": int(os.environ["SLURM_PROCID"]),
              "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "threads": os.environ.get("MGPU_THREADS_PER_WORKER"),
              "start": start, "final": [w.numpy().tolist() for w in model.weights]}
    Path(folder, f"rank-{hvd.rank()}.json").write_text(json.dumps(record))


def _flat(weights) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(w, dtype=np.float32)) for w in weights])


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _left_behind(cluster, folder: Path, seconds: float = 15) -> tuple[list, list]:
    """The job's processes still alive (by the launcher's marker) and the slurmstepd still running,
    once they have had `seconds` to go."""
    deadline = time.monotonic() + seconds
    while True:
        marked = launch.marked_processes(slurm_horovod.marker_of(folder))
        steps = [pid for pid in cluster.processes() if "slurmstepd" in _command_line(pid)]
        if (not marked and not steps) or time.monotonic() > deadline:
            return marked, steps
        time.sleep(0.2)


def _submit(cluster, folder: Path, fn, args, **script_options):
    command = slurm_horovod.function_command(fn, folder, args=args)
    script = slurm_horovod.batch_script(command, nodes=2, tasks_per_node=2, output=folder / "slurm-%j.out",
                                        time_limit="2", **script_options)
    started = time.monotonic()
    job_id = slurm_horovod.submit(script, folder, env=cluster.env)
    end = slurm_horovod.follow(job_id, env=cluster.env, timeout=90, progress=None)
    return end, time.monotonic() - started


@pytest.mark.slow
def test_a_two_node_horovod_job_trains_with_the_right_weights_on_every_rank(slurm_cluster, tmp_path, capsys):
    with slurm_horovod.reach_slurm() as slurm:  # SLURM_CONF names a Slurm: that one, not a cluster of its own
        assert slurm.env["SLURM_CONF"] == slurm_cluster.env["SLURM_CONF"] and not slurm.started_here
    end, seconds = _submit(slurm_cluster, tmp_path, _train, (str(tmp_path), 5), gpus_per_node=2)
    result = slurm_horovod.collect(tmp_path, 4, end)
    assert end.state == "COMPLETED" and result.ok, (end, result.failure_reason(), result.output[-3000:])
    assert end.node_names == ["n1", "n2"] and end.returncode == 0, end
    records = sorted((json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")), key=lambda r: r["rank"])
    plan = multinode.slots("n1:2,n2:2")
    assert [(r["rank"], r["local_rank"], r["cross_rank"], r["node"]) for r in records] == [
        (s.rank, s.local_rank, s.cross_rank, s.hostname) for s in plan]
    assert all((r["size"], r["local_size"], r["cross_size"]) == (4, 2, 2) for r in records)
    assert [r["procid"] for r in records] == [0, 1, 2, 3]  # Slurm's block order is Horovod's
    # Slurm gives each node's tasks both GPUs of --gres=gpu:2; local ranks 0 and 1 pin different ones.
    assert all(r["gpus"] == "0,1" and r["threads"] == "1" for r in records), records
    starts = [_flat(r["start"]) for r in records]
    assert min(float(np.abs(s - starts[0]).max()) for s in starts[1:]) > 0.01, "the ranks started alike"
    finals = [_flat(r["final"]) for r in records]
    spread = max(float(np.abs(f - finals[0]).max()) for f in finals)
    assert spread == 0.0, f"the ranks ended {spread:.3g} apart"
    assert float(np.abs(finals[0] - starts[0]).max()) > 1e-3, "rank 0's weights did not move: nothing trained"
    assert "[rendezvous]   rank 3: n2, local rank 1, cross rank 1" in result.output, result.output
    marked, steps = _left_behind(slurm_cluster, tmp_path)
    assert marked == [] and steps == [], f"left running: {marked}, slurmstepd {steps}"
    _report(capsys, f"2 nodes x 2 tasks, 5 steps: sbatch to COMPLETED {end.seconds:.1f} s "
                    f"({seconds:.1f} s with the submission); max |w - rank 0's w| over ranks = {spread}")


@pytest.mark.slow
def test_a_failing_rank_ends_the_whole_job_at_once(slurm_cluster, tmp_path, capsys):
    # Rank 3 (from the HOROVOD_RANK its task was given) fails at once; the others would wait 300 s.
    program = "import os, sys, time; sys.exit(3) if os.environ['HOROVOD_RANK'] == '3' else time.sleep(300)"
    script = slurm_horovod.batch_script([sys.executable, "-c", program], nodes=2, tasks_per_node=2,
                                        output=tmp_path / "slurm-%j.out", time_limit="2")
    job_id = slurm_horovod.submit(script, tmp_path, env=slurm_cluster.env)
    end = slurm_horovod.follow(job_id, env=slurm_cluster.env, timeout=60, progress=None)
    assert end.state == "FAILED" and end.returncode != 0 and not end.timed_out, end
    assert end.seconds < 30, end  # srun --kill-on-bad-exit ended the three others
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert "task 3: Exited with exit code 3" in output and "tasks 0-1: Terminated" in output, output
    marked, steps = _left_behind(slurm_cluster, tmp_path)
    assert marked == [] and steps == [], f"left running: {marked}, slurmstepd {steps}"
    _report(capsys, f"a failing rank: sbatch to FAILED {end.seconds:.1f} s")


@pytest.mark.slow
def test_a_job_past_its_time_is_cancelled_and_leaves_nothing_running(slurm_cluster, tmp_path, capsys):
    script = slurm_horovod.batch_script(["sleep", "300"], nodes=2, tasks_per_node=2, output=tmp_path / "slurm-%j.out",
                                        time_limit="2")
    job_id = slurm_horovod.submit(script, tmp_path, env=slurm_cluster.env)
    lines = []
    end = slurm_horovod.follow(job_id, env=slurm_cluster.env, timeout=4, progress=lines.append)
    assert end.timed_out and end.state == "CANCELLED", (end, lines)
    assert any("RUNNING on n[1-2]" in line for line in lines) and any("cancelled" in line for line in lines), lines
    marked, steps = _left_behind(slurm_cluster, tmp_path)
    assert marked == [] and steps == [], f"left running: {marked}, slurmstepd {steps}"
    _report(capsys, f"a job past its time-out (4 s): cancelled, ended after {end.seconds:.1f} s")


def test_a_busy_test_cluster_is_reported_as_busy_with_how_to_stop_it(monkeypatch):
    class Cluster:  # stands in for scripts/slurm_cluster.py when another test cluster holds the nodes
        class ClusterError(RuntimeError):
            pass

        @staticmethod
        def missing():
            return []

        @classmethod
        def up(cls, folder):
            raise cls.ClusterError("another Slurm cluster runs from /tmp/mgpu-slurm-other: stop it first (down --dir)")

    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm_horovod, "_sinfo_answers", lambda env: False)
    monkeypatch.setattr(slurm_horovod, "cluster_script", lambda: Cluster)
    with slurm_horovod.reach_slurm() as slurm:
        assert slurm.env is None and slurm.note.startswith("Slurm is busy: another test cluster runs from "
                                                           "/tmp/mgpu-slurm-other;")
        assert "`python scripts/slurm_cluster.py down --dir /tmp/mgpu-slurm-other`" in slurm.note
