"""Notebook 10's faults: an elastic Horovod job that survives a SIGKILL, a restart from a checkpoint that
redoes its steps bit for bit, and a hang whose stalled rank is named. The multi-process tests start real
horovodrun jobs (a few tens of seconds together on an idle 2-core machine)."""

import json
import os
import signal
import time

import pytest

from mgpu.lesson10 import faults, saved

#: What Horovod's stall inspector prints (through horovodrun's prefixes) when it works.
HOROVOD_STALL_OUTPUT = """\
[0]<stderr>:[2026-11-26 23:01:02.000000: W /tmp/horovod/common/stall_inspector.cc:107] One or more tensors were \
submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more \
than 2 seconds. This may indicate that different ranks are trying to submit different tensors or that only subset of \
ranks is submitting tensors, which will cause deadlock.
[0]<stderr>:Missing ranks:
[0]<stderr>:0!: [val_accuracy]
[0]<stderr>:1!: [val_accuracy]
[0]<stderr>:2!: [gradient_a, gradient_b]
[0]<stderr>:3!: [val_accuracy]
[0]<stderr>:One or more rank (marked by "!") is stalled for longer than 4 seconds. Will shutdown.
"""


def test_the_stall_report_is_read_and_names_the_rank_missing_what_all_others_submitted():
    report = faults.stall_report(HOROVOD_STALL_OUTPUT)
    assert report == {0: ["val_accuracy"], 1: ["val_accuracy"], 2: ["gradient_a", "gradient_b"], 3: ["val_accuracy"]}
    assert faults.stall_named_rank(report) == 2
    assert faults.stall_report("[0]<stdout>:nothing stalled\n") is None
    excerpt = faults.stall_excerpt(HOROVOD_STALL_OUTPUT)
    assert excerpt.splitlines()[1:] == ["Missing ranks:", "0!: [val_accuracy]", "1!: [val_accuracy]",
                                        "2!: [gradient_a, gradient_b]", "3!: [val_accuracy]",
                                        'One or more rank (marked by "!") is stalled for longer than 4 seconds. Will shutdown.']
    with pytest.raises(ValueError, match="no rank alone"):
        faults.stall_named_rank({0: ["a"], 1: ["a"]})


def test_the_progress_summary_finds_the_rollback_and_the_seconds_lost():
    events = [{"t": t, "event": "step", "size": 4, "step": s, "examples": 128 * s} for t, s in [(1, 1), (2, 2), (3, 3)]]
    events += [{"t": 3.1, "event": "commit", "step": 2, "examples": 256},
               {"t": 9.0, "event": "reset", "size": 3, "step": 2, "examples": 256},
               {"t": 10.0, "event": "step", "size": 3, "step": 3, "examples": 352},
               {"t": 11.0, "event": "step", "size": 3, "step": 4, "examples": 448},
               {"t": 15.0, "event": "reset", "size": 4, "step": 4, "examples": 448},
               {"t": 16.0, "event": "step", "size": 4, "step": 5, "examples": 576}]
    summary = faults.progress_summary(events, killed_at=3.5)
    assert summary["sizes"] == [[4, 3], [3, 2], [4, 1]]
    assert (summary["step_at_kill"], summary["rolled_back_to_step"], summary["steps_rolled_back"]) == (3, 2, 1)
    assert summary["workers_after_failure"] == 3 and summary["workers_after_join"] == 4
    assert summary["seconds_lost"] == pytest.approx(11.0 - 3.5)  # back at 384 examples with the step of 448
    assert summary["seconds_join_pause"] == pytest.approx(5.0)


def test_four_names_of_this_machine_are_four_hosts_to_horovod():
    assert faults.loopback_hosts(4) == ["localhost", "127.0.0.1", "127.0.1", "127.1"]


@pytest.mark.slow
def test_an_elastic_job_survives_a_sigkill_and_rolls_back_to_a_commit(tmp_path):
    hosts = faults.loopback_hosts(3)
    config = dict(seed=3, n_train=1536, n_test=256, width=16, batch=32, lr=0.02, epochs=2, commit_every=4, device_ms=20)
    with faults.Job(saved.elastic_train, (config,), tmp_path / "job", np=3, min_np=2, max_np=3, cooldown=(1, 2),
                    discovery={h: 1 for h in hosts}, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}) as job:
        job.wait_for(lambda events: any(e.get("step", 0) >= 22 for e in events), 300, "step 22")
        victim = job.worker_on(hosts[-1])
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.time()
        job.set_hosts({h: 1 for h in hosts[:-1]})
        status = job.wait(timeout=300)
    assert status == 0, job.output[-3000:]
    assert not faults.leftover_processes(job)
    events = job.progress()
    summary = faults.progress_summary(events, killed_at)
    assert summary["workers_after_failure"] == 2
    # the reset callback set the rate for the new number of workers (the notebook's exercise)
    assert [(e["size"], round(e["lr"], 6)) for e in events if e["event"] == "reset"] == [(2, 0.04)]
    assert summary["rolled_back_to_step"] % config["commit_every"] == 0
    assert summary["rolled_back_to_step"] <= summary["step_at_kill"]
    assert summary["sizes"][0][0] == 3 and summary["sizes"][-1][0] == 2
    result = job.result()
    assert result["size"] == 2 and 0.0 <= result["accuracy"] <= 1.0
    # Every epoch ran to its end: 1536 examples in steps of 3 x 32, then of 2 x 32.
    assert result["examples"] == 2 * 1536


@pytest.mark.slow
def test_a_worker_that_joins_after_a_failure_ends_the_job_cleanly_under_its_own_rank(tmp_path):
    # Kill rank 0 of 3, so that the ranks are dealt anew, then bring its host back: the new worker is
    # started with the HOROVOD_RANK of a survivor. Each worker must report under the rank it ends with (once
    # two wrote the same status file at the same moment and one crashed, failing the whole job).
    hosts = faults.loopback_hosts(3)
    # ~25 s of steps after the kill: time for the host's cool-down and a new worker's start on a slow machine
    config = dict(seed=4, n_train=3072, n_test=256, width=16, batch=32, lr=0.02, epochs=12, commit_every=4,
                  device_ms=40, join_timeout=60)
    with faults.Job(saved.elastic_train, (config,), tmp_path / "job", np=3, min_np=2, max_np=3, cooldown=(1, 2),
                    discovery={h: 1 for h in hosts}, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}) as job:
        job.wait_for(lambda events: any(e.get("step", 0) >= 10 for e in events), 300, "step 10")
        victim = next(w for w in job.workers() if w["rank"] == 0)
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.time()
        job.set_hosts({h: 1 for h in hosts if h != victim["host"]})
        after_kill = lambda events: [e for e in events if e["t"] > killed_at and e["event"] == "reset"]
        job.wait_for(lambda events: any(e["size"] == 2 for e in after_kill(events)), 300, "the survivors to regroup")
        job.set_hosts({h: 1 for h in hosts})
        job.wait_for(lambda events: any(e["size"] == 3 for e in after_kill(events)), 300, "a new worker to join")
        status = job.wait(timeout=300)
    assert status == 0, job.output[-3000:]
    assert not faults.leftover_processes(job)
    assert sorted(p.name for p in job.job_dir.glob("status-*")) == ["status-0.json", "status-1.json", "status-2.json"]
    assert all(json.loads(p.read_text())["status"] == "ok" for p in job.job_dir.glob("status-*.json"))
    assert job.result()["size"] == 3


@pytest.mark.slow
def test_a_restart_from_the_checkpoint_redoes_the_lost_steps_bit_for_bit(tmp_path):
    # step_s: an idle machine ran all 12 steps before the kill after step 6 landed (started_at 12)
    config = dict(seed=5, n_train=1024, width=16, batch=16, lr=0.05, steps=12, checkpoint_every=4, step_s=0.1)
    with faults.Job(saved.checkpoint_train, (config, tmp_path / "trace-1"), tmp_path / "first", np=2,
                    hosts="localhost:2") as job:
        job.wait_for(lambda events: any(e["step"] >= 6 for e in events), 300, "step 6")
        for worker in job.workers():
            os.kill(worker["pid"], signal.SIGKILL)
        job.wait(timeout=60)
    reached = max(e["step"] for e in job.progress())
    with faults.Job(saved.checkpoint_train, (config, tmp_path / "trace-2"), tmp_path / "second", np=2,
                    hosts="localhost:2") as job:
        assert job.wait(timeout=300) == 0, job.output[-3000:]
    assert not faults.leftover_processes(job)
    result = job.result()
    assert result["started_at"] in (4, 8) and result["started_at"] <= reached and result["steps"] == 12
    assert result["rank_spread"] == 0.0
    assert faults.trace_diff(tmp_path / "trace-1", tmp_path / "trace-2", range(result["started_at"], reached + 1),
                             loaded_step=result["started_at"]) == 0.0


@pytest.mark.slow
def test_horovods_stall_inspector_names_the_stalled_rank_under_gloo(tmp_path):
    # Needs the course's patch 05 (Gloo's controller sizes its list of ranks): unpatched, no report. The
    # response cache off: the gradient, all-reduced before, is reported like a new tensor.
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "4",
           "HOROVOD_CACHE_CAPACITY": "0"}
    with faults.Job(faults.uneven_epoch, (3 * 20 - 1, 10, faults.local_steps), tmp_path / "stall", np=3,
                    hosts="localhost:3", env=env) as job:
        status = job.wait(timeout=300)
    assert status not in (None, 0), job.output[-3000:]  # the inspector shut Horovod down: the job failed
    assert not faults.leftover_processes(job)
    report = faults.stall_report(job.output)
    assert report is not None, job.output[-3000:]
    assert faults.stall_named_rank(report) == 2
    assert all(any("val_accuracy" in t for t in report[r]) for r in (0, 1)) and \
        any("gradient" in t for t in report[2]), report
    excerpt = faults.stall_excerpt(job.output)
    assert "One or more tensors were submitted" in excerpt.splitlines()[0], excerpt
    assert "Will shutdown" in excerpt, excerpt
