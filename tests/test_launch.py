"""The launcher: N real Horovod workers, failures, time-outs, Ctrl-C, and no orphan processes."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from mgpu.runtime import launch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _alive(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _worker_pids(folder: Path):
    return [int(p.read_text()) for p in folder.glob("pid-*")]


def _sum_of_ranks(scale):
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum)
    return {"size": hvd.size(), "rank": hvd.rank(), "total": float(total.numpy()[0]) * scale,
            "threads": tf.config.threading.get_intra_op_parallelism_threads()}


def _record_pid_then(folder, behaviour):
    """Each rank writes its pid, then rank 1 misbehaves while the others wait in an all-reduce."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    Path(folder, f"pid-{hvd.rank()}").write_text(str(os.getpid()))
    if hvd.rank() == 1:
        if behaviour == "raise":
            raise ValueError("rank one is broken")
        if behaviour == "exit":
            os._exit(3)
        if behaviour == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a user would
        if behaviour == "hang":
            time.sleep(3600)
    if behaviour == "hang-all":
        time.sleep(3600)
    hvd.allreduce(tf.constant([1.0]))
    return "done"


def test_four_workers_all_reduce_and_return_rank0_value():
    result = launch.run(_sum_of_ranks, 4, args=(2.0,), verbose=False)
    assert result.ok and result.returncode == 0
    assert result.rank_status == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}
    assert result.value["rank"] == 0 and result.value["size"] == 4
    assert result.value["total"] == 2.0 * (0 + 1 + 2 + 3)
    # the cores are split between the workers
    assert result.value["threads"] == launch.threads_per_worker(4)


def _print_on_every_rank():
    import horovod.tensorflow as hvd

    hvd.init()
    print(f"result of rank {hvd.rank()}", flush=True)
    print(f"warning from rank {hvd.rank()}", file=sys.stderr, flush=True)
    return hvd.rank()


def test_verbose_rank0_shows_only_what_rank_0_prints(capsys):
    launch.run(_print_on_every_rank, 2, verbose="rank0")
    shown = capsys.readouterr().out
    assert shown == "result of rank 0\n", shown
    launch.run(_print_on_every_rank, 2, verbose=False)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="'rank0'"):
        launch.run(_print_on_every_rank, 2, verbose="all")


def test_rank0_echo_joins_lines_split_across_reads(capsys):
    echo = launch._Echo("rank0")
    for chunk in ("[1]<stdout>:other\n[0]<std", "out>:first part", " and the rest\n[0]<stderr>:noise\n"):
        echo(chunk)
    assert capsys.readouterr().out == "first part and the rest\n"


def _cores_of_every_rank():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    per_thread = {sorted(os.sched_getaffinity(int(t)))[0] for t in os.listdir("/proc/self/task")}
    mine = sorted(os.sched_getaffinity(0))
    return {"cores": hvd.allgather_object(mine), "threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "every_thread_on_first_core": hvd.allgather_object(per_thread == {mine[0]} if len(mine) == 1 else True)}


def test_a_simulated_gpu_is_a_fixed_slice_of_the_cores():
    allowed = sorted(os.sched_getaffinity(0))
    result = launch.run(_cores_of_every_rank, 2, cores_per_worker=1, verbose=False)
    assert result.value["cores"] == [launch.core_slice(r, 1, allowed) for r in range(2)]
    assert result.value["threads"] == 1 and all(result.value["every_thread_on_first_core"])
    if len(allowed) >= 2:  # two slices of one core: the workers do not share a core
        assert result.value["cores"][0] != result.value["cores"][1]
    # without it, a worker may run on every core
    assert launch.run(_cores_of_every_rank, 2, verbose=False).value["cores"] == [allowed, allowed]


def test_core_slices_follow_each_other_and_wrap_around():
    assert [launch.core_slice(r, 2, range(8)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [launch.core_slice(r, 1, [4, 6]) for r in range(4)] == [[4], [6], [4], [6]]
    assert launch.core_slice(0, 5, [0, 1]) == [0, 1]
    with pytest.raises(ValueError, match="cores_per_worker"):
        launch.run(_cores_of_every_rank, 1, cores_per_worker=0)


@pytest.mark.parametrize("behaviour, expected", [
    ("raise", "ValueError: rank one is broken"),
    ("exit", "died without reporting"),
    ("kill", "died without reporting"),
])
def test_failure_of_one_rank_is_reported_and_leaves_no_orphans(tmp_path, behaviour, expected):
    result = launch.run(_record_pid_then, 3, args=(str(tmp_path), behaviour), verbose=False, check=False,
                        timeout=240)
    assert not result.ok and not result.timed_out
    assert result.returncode != 0
    assert expected in result.rank_status.get(1, "died without reporting")
    assert "rank 1" in result.failure_reason()
    with pytest.raises(launch.LaunchError, match="rank 1"):
        result.raise_for_status()
    pids = _worker_pids(tmp_path)
    assert len(pids) == 3
    assert _alive(pids) == []


def test_timeout_kills_a_hung_rank_and_the_ranks_waiting_for_it(tmp_path):
    # Rank 1 hangs; ranks 0 and 2 block in an all-reduce that can never complete.
    result = launch.run(_record_pid_then, 3, args=(str(tmp_path), "hang"), verbose=False,
                        check=False, timeout=40)
    assert result.timed_out and not result.ok
    assert result.failure_reason().startswith("timed out after")
    pids = _worker_pids(tmp_path)
    assert len(pids) == 3, result.output[-2000:]
    assert _alive(pids) == []


def test_ctrl_c_in_the_caller_leaves_no_workers(tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from mgpu.runtime import launch
        from test_launch import _record_pid_then
        launch.run(_record_pid_then, 2, args=({str(tmp_path)!r}, "hang-all"), verbose=False)
    """))
    # A shell without job control starts background commands with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give the caller the default, as a terminal would.
    proc = subprocess.Popen([sys.executable, str(caller)], stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while len(_worker_pids(tmp_path)) < 2 and time.time() < deadline:
        time.sleep(0.5)
    pids = _worker_pids(tmp_path)
    assert len(pids) == 2, "workers did not start in time"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    assert _alive(pids) == []


def test_run_script_passes_arguments_and_reports_exit_status(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import horovod.tensorflow as hvd
        hvd.init()
        if hvd.rank() == 0:
            open("out.txt", "w").write(" ".join(sys.argv[1:]) + f" size={hvd.size()}")
        sys.exit(int(sys.argv[1]))
    """))
    ok = launch.run_script(script, 2, ["0", "x"], cwd=tmp_path, verbose=False)
    assert ok.ok and (tmp_path / "out.txt").read_text() == "0 x size=2"
    bad = launch.run_script(script, 2, ["4"], cwd=tmp_path, verbose=False, check=False)
    assert not bad.ok and bad.rank_status[0] == "exited with status 4"


def test_missing_script_is_a_clear_error(tmp_path):
    with pytest.raises(launch.LaunchError, match="no such script"):
        launch.run_script(tmp_path / "nope.py", 2)


def _fake_nvidia_smi(folder: Path, gpus: int) -> Path:
    """An nvidia-smi that lists `gpus` GPUs, as the driver's does, for a machine that has none."""
    lines = "".join(f'echo "GPU {i}: Tesla T4 (UUID: GPU-{i:08d})"\n' for i in range(gpus))
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 1\n{lines}")
    smi.chmod(0o755)
    return folder


def test_visible_gpus_come_from_the_driver_and_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_nvidia_smi(tmp_path, 2)}{os.pathsep}{os.environ['PATH']}")
    assert launch.visible_gpu_count({}) == 2
    assert launch.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "1"}) == 1
    assert launch.visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert launch.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert launch.visible_gpu_count({}) == 0


def _devices_seen():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)
    return {"cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "total": float(total.numpy()[0])}


def test_more_workers_than_gpus_fall_back_to_cpu_workers_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{_fake_nvidia_smi(tmp_path, 1)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert launch.workers_use_gpus(1, 1) and not launch.workers_use_gpus(2, 1)
    result = launch.run(_devices_seen, 2, verbose=False)
    assert result.value == {"cuda_visible": "", "total": 2.0}  # both workers ran, on the CPU
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[launch]")]
    assert notes == [launch.placement_note(2, 1)] and "2 workers but 1 GPU(s)" in notes[0]
