"""Notebook 10: the host plans, the dry run of multi-machine commands, and a real
two-node Horovod job on this machine's two names (localhost and 127.0.0.1)."""

import pytest

from mgpu.lesson10 import multinode
from mgpu.runtime import launch


def test_slots_follow_horovods_assignment_host_by_host():
    plan = multinode.slots("host1:4,host2:4")
    assert [(s.hostname, s.rank, s.local_rank, s.cross_rank) for s in plan[3:5]] == [
        ("host1", 3, 3, 0), ("host2", 4, 0, 1)]
    assert {s.size for s in plan} == {8} and {s.local_size for s in plan} == {4}
    # Fewer processes than slots fill the first host first.
    assert [s.hostname for s in multinode.slots("a:2,b:2", np=3)] == ["a", "a", "b"]
    with pytest.raises(ValueError, match="more processes than the 4 slots"):
        multinode.slots("a:2,b:2", np=5)
    with pytest.raises(ValueError, match="host:slots"):
        multinode.slots("a:2;b")
    rows = multinode.slot_rows(plan)
    assert rows[5] == {"rank": 5, "host": "host2", "local rank": 1, "cross rank": 1, "GPU on its host": 1}


def test_a_hostfile_gives_the_same_plan_as_the_hosts_flag(tmp_path):
    path = multinode.write_hostfile(tmp_path / "hosts", {"node1": 3, "node2": 1})
    assert path.read_text() == "node1 slots=3\nnode2 slots=1\n"
    from_file = multinode.slots(hostfile=path)
    from_flag = multinode.slots("node1:3,node2:1")
    assert [(s.hostname, s.local_rank) for s in from_file] == [(s.hostname, s.local_rank) for s in from_flag]
    with pytest.raises(ValueError, match="positive number of slots"):
        multinode.write_hostfile(tmp_path / "bad", {"node1": 0})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="lists no host"):
        multinode.slots(hostfile=tmp_path / "empty")


def test_the_dry_run_accepts_what_horovodrun_accepts_and_refuses_the_rest(tmp_path):
    argv = multinode.horovodrun_argv(8, ["python", "train.py"], hosts="host1:4,host2:4", network_interface="eth0")
    args = multinode.dry_run(argv)
    assert (args.num_proc, args.hosts, args.use_gloo, args.nics, args.command) == (
        8, "host1:4,host2:4", True, {"eth0"}, ["python", "train.py"])
    hostfile = multinode.write_hostfile(tmp_path / "hosts", {"n1": 2, "n2": 2})
    assert multinode.dry_run(multinode.horovodrun_argv(4, ["python", "t.py"], hostfile=hostfile, mpi=True)).use_mpi
    refusals = {
        "more processes than": ["horovodrun", "-np", "9", "-H", "h1:4,h2:4", "python", "t.py"],
        "invalid int value": ["horovodrun", "-np", "four", "-H", "h1:4", "python", "t.py"],
        "unrecognized arguments": ["horovodrun", "-np", "2", "--hosts-file", "x", "python", "t.py"],
        "no program": ["horovodrun", "-np", "2", "-H", "h1:2"],
        "no hosts": ["horovodrun", "-np", "2", "python", "t.py"],
        "not a horovodrun command": ["mpirun", "-np", "2", "python", "t.py"],
    }
    for message, bad in refusals.items():
        with pytest.raises(ValueError, match=message):
            multinode.dry_run(bad)


def test_the_slurm_script_is_valid_bash_and_asks_for_what_it_runs():
    script = multinode.slurm_script(2, 4, ["python", "train.py"], gpus_per_node=4, time="00:10:00")
    multinode.check_shell(script)
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=4\n" in script
    assert "#SBATCH --gres=gpu:4\n" in script and "#SBATCH --time=00:10:00\n" in script
    assert 'horovodrun -np "$SLURM_NTASKS" -H "$hosts" --gloo python train.py' in script
    assert "--gres" not in multinode.slurm_script(1, 2, ["python", "t.py"])
    with pytest.raises(ValueError, match="not valid bash"):
        multinode.check_shell(script.replace("$(scontrol", "$((scontrol"))


def test_the_slurm_scripts_horovodrun_line_expands_to_the_allocations_command():
    script = multinode.slurm_script(2, 4, ["python", "train.py"], gpus_per_node=4)
    argv = multinode.script_command(script, nodes=["node01", "node02"], environ={
        "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4"})
    assert argv == ["horovodrun", "-np", "8", "-H", "node01:4,node02:4", "--gloo", "python", "train.py"]
    assert multinode.dry_run(argv).num_proc == 8
    with pytest.raises(ValueError, match="failed before"):  # set -u: a variable the allocation did not set
        multinode.script_command(script, nodes=["node01"], environ={"SLURM_JOB_NODELIST": "node01"})
    with pytest.raises(ValueError, match="0 lines"):
        multinode.script_command("#!/bin/bash\necho hi\n", nodes=["a"], environ={})


def test_the_launcher_takes_only_this_machines_names():
    multinode.check_local_hosts("localhost:2,127.0.0.1:2", 4)
    with pytest.raises(ValueError, match="not this machine"):
        multinode.check_local_hosts("gpu-node-7:4", 4)
    with pytest.raises(ValueError, match="more processes than the 3 slots"):
        multinode.check_local_hosts("localhost:2,127.0.0.1:1", 4)
    with pytest.raises(ValueError, match="cannot be combined with hosts"):
        launch.run(print, 2, hosts="localhost:1,127.0.0.1:1", cores_per_worker=1)


def test_the_launcher_takes_a_hostfile_like_the_hosts_flag(tmp_path):
    hostfile = multinode.write_hostfile(tmp_path / "hosts", {"localhost": 2, "127.0.0.1": 2})
    multinode.check_local_hosts(None, 4, hostfile=hostfile)
    command = launch.horovodrun_command(4, ["python", "-m", "mgpu.runtime._worker", "job"], 60, hostfile=hostfile)
    assert command[command.index("--hostfile") + 1] == str(hostfile) and "-H" not in command
    assert multinode.dry_run(command).hostfile == str(hostfile)  # horovodrun's own parser takes it
    foreign = multinode.write_hostfile(tmp_path / "cluster", {"gpu1": 4})
    with pytest.raises(ValueError, match="not this machine"):
        launch.run(print, 4, hostfile=foreign)
    with pytest.raises(ValueError, match="either hosts"):
        multinode.check_local_hosts("localhost:4", 4, hostfile=hostfile)


def _where_and_sum():
    import mgpu  # noqa: F401  (Keras 2 on every stack)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    where = (hvd.rank(), hvd.local_rank(), hvd.cross_rank(), hvd.local_size(), hvd.cross_size())
    total = float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum).numpy())
    return hvd.allgather_object((where, total))


@pytest.mark.slow
def test_a_two_node_job_on_this_machines_two_names_follows_horovods_plan():
    gathered = launch.run(_where_and_sum, 4, hosts="localhost:2,127.0.0.1:2", verbose=False).value
    plan = multinode.slots("localhost:2,127.0.0.1:2")
    assert sorted(where for where, _ in gathered) == [
        (s.rank, s.local_rank, s.cross_rank, s.local_size, s.cross_size) for s in plan]
    assert [where[2] for where, _ in sorted(gathered)] == [0, 0, 1, 1]
    # The all-reduce spans both "machines": every rank got 1 + 2 + 3 + 4.
    assert [total for _, total in gathered] == [10.0] * 4
