"""Faults (notebook 10): the machinery around its fault jobs; the training functions themselves are the
notebook's (``elastic_train``, ``checkpoint_train``: its ``#@save`` cells, in :mod:`mgpu.lesson10.saved`).

- :data:`LOOPBACK_NAMES`: four names of this machine that Horovod counts as four machines. Elastic Horovod
  blacklists the *host* of a failed worker, so four workers on one ``localhost`` would all be lost with
  one; each worker gets a host of its own instead. :func:`loopback_hosts` checks them with Horovod's own
  test of "is this host local".
- :class:`Job` starts ``horovodrun`` in the background (elastic with a host discovery script, or on fixed
  hosts), lets the caller watch the progress log the workers write, find a worker's process, SIGKILL it and
  change the hosts the discovery script reports; it always ends every process of the job (the launcher's
  marker, :mod:`mgpu.runtime.launch`), whatever happened.
- What the training functions use: :func:`register_worker`, :func:`log_event` (the progress log),
  :func:`toy_task`, :func:`small_model`, :func:`write_json`, :func:`flat_weights`.
- :func:`progress_summary` reads an elastic run's log: the sizes, the rollback, the seconds lost;
  :func:`trace_diff` compares a restarted run's weights with the killed run's, step by step.
- :func:`uneven_epoch` is the hang: uneven shards give one rank one step fewer, so it never submits the
  last gradient all-reduce. :func:`stall_report` reads the stall inspector's "Missing ranks:" report
  (under Gloo it needs the course's patch ``05-gloo-stall-inspector-ranks``: Horovod 0.28.1's
  ``GlooController`` reserves its list of ranks instead of sizing it, so its inspector checks no rank),
  :func:`stall_excerpt` gives it as printed, and :func:`stall_named_rank` names the rank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import psutil

from mgpu.runtime import launch

#: Names of this machine that resolve to its loopback address: Horovod starts their workers without ssh,
#: and counts each name as a machine of its own (``127.0.1`` and ``127.1`` are short forms of 127.0.0.1).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "127.0.1", "127.1")


def loopback_hosts(count: int) -> list[str]:
    """``count`` names from :data:`LOOPBACK_NAMES`, each checked to be local by Horovod's own test (the
    name resolves to an address of one of this machine's interfaces)."""
    from horovod.runner.util import network

    if not 1 <= count <= len(LOOPBACK_NAMES):
        raise ValueError(f"between 1 and {len(LOOPBACK_NAMES)} loopback hosts, not {count}")
    local = network.get_local_host_addresses()
    names = list(LOOPBACK_NAMES[:count])
    foreign = [n for n in names if network.resolve_host_address(n) not in local]
    if foreign:
        raise RuntimeError(f"{foreign}: Horovod does not see these names as this machine here")
    return names


# --------------------------------------------------------------------------------------------
# A job in the background


class Job:
    """``horovodrun`` running ``fn(folder, *args)`` in the background, in its own folder.

    Elastic (``discovery=`` the first hosts, ``{host: slots}``): horovodrun runs a host discovery
    script that prints the hosts file of the folder, which :meth:`set_hosts` rewrites. Fixed hosts:
    ``hosts="localhost:2"``. Use it as a context manager: leaving the block ends every process of the
    job (horovodrun, its workers, whatever they started), also on an error or a time-out.
    """

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], folder: str | os.PathLike, *, np: int,
                 hosts: str | None = None, discovery: Mapping[str, int] | None = None,
                 min_np: int | None = None, max_np: int | None = None, cooldown: tuple[int, int] | None = None,
                 env: Mapping[str, str] | None = None, start_timeout: int = launch.DEFAULT_START_TIMEOUT):
        if (hosts is None) == (discovery is None):
            raise ValueError("give hosts= (fixed) or discovery= (elastic), not both or neither")
        self.folder = Path(folder)
        if self.folder.exists():
            shutil.rmtree(self.folder)
        (self.folder / "workers").mkdir(parents=True)
        self.job_dir = self.folder / "job"
        self.job_dir.mkdir()
        launch.write_function_job(self.job_dir, fn, (str(self.folder), *args))
        horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent) + os.pathsep
                                  + os.environ.get("PATH", ""))
        if horovodrun is None:
            raise launch.LaunchError("horovodrun not found: run `make setup` (it builds Horovod into .venv)")
        self.command = [horovodrun, "-np", str(np)]
        if discovery is not None:
            self.set_hosts(discovery)
            script = self.folder / "discover_hosts.sh"
            script.write_text(f"#!/bin/sh\n# prints the hosts that are up, one host:slots a line\ncat '{self.folder / 'hosts'}'\n")
            script.chmod(0o755)
            self.command += ["--min-np", str(min_np or np), "--max-np", str(max_np or np),
                             "--host-discovery-script", str(script)]
            if cooldown:
                self.command += ["--blacklist-cooldown-range", str(cooldown[0]), str(cooldown[1])]
        else:
            self.command += ["-H", hosts]
        self.command += ["--gloo", "--start-timeout", str(start_timeout),
                         sys.executable, "-m", "mgpu.runtime._worker", str(self.job_dir)]
        self.launch_id = uuid.uuid4().hex
        child = dict(os.environ)
        child.update(env or {})
        child[launch.LAUNCH_MARKER] = self.launch_id
        child.setdefault(launch.THREADS_VARIABLE, str(launch.threads_per_worker(max_np or np)))
        child.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(start_timeout))
        child.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        child.setdefault("PYTHONUNBUFFERED", "1")
        child["CUDA_VISIBLE_DEVICES"] = ""
        package_root = str(Path(__file__).resolve().parents[2])
        child["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, child.get("PYTHONPATH")) if p)
        self.lines: list[str] = []
        self.started = time.time()
        self.popen = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, text=True, errors="replace", env=child,
                                      start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in iter(self.popen.stdout.readline, ""):
            self.lines.append(line)
        self.popen.stdout.close()

    # the hosts the discovery script reports ------------------------------------------------
    def set_hosts(self, hosts: Mapping[str, int]) -> None:
        """What the discovery script prints from now on: the machines that are up."""
        tmp = self.folder / "hosts.tmp"
        tmp.write_text("".join(f"{host}:{slots}\n" for host, slots in hosts.items()))
        os.replace(tmp, self.folder / "hosts")

    # what the workers wrote ------------------------------------------------------------------
    @property
    def output(self) -> str:
        return "".join(self.lines)

    def progress(self) -> list[dict]:
        """The events rank 0 logged so far (one dict per step, commit or reset)."""
        return read_progress(self.folder)

    def workers(self) -> list[dict]:
        """The worker processes alive now: ``{"host", "pid"}`` as each registered itself."""
        found = []
        for path in sorted((self.folder / "workers").glob("*.json")):
            info = json.loads(path.read_text())
            if psutil.pid_exists(info["pid"]) and _same_process(info):
                found.append(info)
        return found

    def worker_on(self, host: str) -> dict:
        on_host = [w for w in self.workers() if w["host"] == host]
        if len(on_host) != 1:
            raise RuntimeError(f"{len(on_host)} live workers on {host}, expected one")
        return on_host[0]

    def wait_for(self, condition: Callable[[list[dict]], bool], timeout: float, what: str = "") -> list[dict]:
        """Poll the progress log until ``condition(events)`` holds; fail if the job ends or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.progress()
            if condition(events):
                return events
            if self.popen.poll() is not None:
                raise launch.LaunchError(f"the job ended (status {self.popen.returncode}) before {what or 'the condition'}:"
                                         f"\n{self.output[-3000:]}")
            if time.monotonic() > deadline:
                raise launch.LaunchError(f"waited {timeout:.0f} s for {what or 'the condition'}:\n{self.output[-3000:]}")
            time.sleep(0.02)

    def wait(self, timeout: float) -> int | None:
        """Wait for horovodrun to end; on a time-out end the job. Returns horovodrun's status (None: timed out)."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            return None
        finally:
            self._reader.join(timeout=10)

    def result(self) -> Any:
        """What rank 0 returned (``result.json``), or None."""
        path = self.folder / "result.json"
        return json.loads(path.read_text()) if path.exists() else None

    def close(self) -> None:
        launch._kill_launch(self.popen, self.launch_id)
        self._reader.join(timeout=10)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _same_process(info: dict) -> bool:
    try:
        return abs(psutil.Process(info["pid"]).create_time() - info["created"]) < 1.0
    except psutil.NoSuchProcess:
        return False


def register_worker(folder: str | os.PathLike, rank: int | None = None) -> None:
    """Called by each worker at its start: its host (Horovod's name for its machine), rank and process id."""
    pid = os.getpid()
    info = {"host": os.environ.get("HOROVOD_HOSTNAME", "localhost"), "rank": rank, "pid": pid,
            "created": psutil.Process(pid).create_time()}
    write_json(Path(folder) / "workers" / f"{pid}.json", info)


def write_json(path: str | os.PathLike, payload: Any) -> None:
    """Write JSON through a temporary file renamed over ``path``: a reader never sees half of it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def log_event(folder: str | os.PathLike, **event: Any) -> None:
    """Append one event to the job's progress log (rank 0 calls it), with the wall-clock time."""
    with open(Path(folder) / "progress.jsonl", "a") as log:
        log.write(json.dumps({"t": time.time(), **event}) + "\n")


def read_progress(folder: str | os.PathLike) -> list[dict]:
    path = Path(folder) / "progress.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return events


def leftover_processes(job: Job) -> list[psutil.Process]:
    """Processes of the job still alive (none, after :meth:`Job.close`)."""
    return launch.marked_processes(job.launch_id)


# --------------------------------------------------------------------------------------------
# The task every run here trains on


def toy_task(seed: int, n_train: int, n_test: int, dim: int = 16, classes: int = 8, spread: float = 1.2):
    """A classification task the same on every worker: Gaussian clusters around random centres, some
    overlapping (so accuracy ends below 1)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * spread / np.sqrt(dim) * 3

    def draw(n):
        labels = rng.integers(0, classes, n)
        return (centres[labels] + rng.normal(size=(n, dim))).astype("float32"), labels.astype("int64")

    return (*draw(n_train), *draw(n_test))


def small_model(dim: int, classes: int, width: int):
    """The classifier every fault job trains: one hidden layer of ``width`` units, logits out."""
    import mgpu  # noqa: F401  (Keras 2 on every stack)
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input((dim,)), tf.keras.layers.Dense(width, activation="relu"),
                                tf.keras.layers.Dense(classes)])


def flat_weights(variables) -> np.ndarray:
    """Variables as one float64 vector (to compare runs exactly)."""
    return np.concatenate([np.asarray(v.numpy()).ravel().astype("float64") for v in variables])


# --------------------------------------------------------------------------------------------
# Reading an elastic run's log


def progress_summary(events: Sequence[dict], killed_at: float | None = None) -> dict:
    """What the progress log of an elastic run shows: the number of workers step by step (as runs of
    ``[size, steps]``), the steps rolled back, and, given the time of the kill, the seconds lost: from the
    kill until the job had again trained on as many examples as it had when the worker died."""
    steps = [e for e in events if e["event"] == "step"]
    sizes: list[list[int]] = []
    for e in steps:
        if sizes and sizes[-1][0] == e["size"]:
            sizes[-1][1] += 1
        else:
            sizes.append([e["size"], 1])
    summary: dict[str, Any] = {"sizes": sizes, "steps": steps[-1]["step"] if steps else 0}
    if killed_at is None:
        return summary
    before = [e for e in steps if e["t"] <= killed_at]
    resets = [e for e in events if e["event"] == "reset" and e["t"] > killed_at]
    if not before or not resets:
        raise ValueError("the log shows no step before the kill or no reset after it")
    reached, reset = before[-1], resets[0]
    back = next((e for e in steps if e["t"] > reset["t"] and e["examples"] >= reached["examples"]), None)
    summary.update({
        "step_at_kill": reached["step"], "examples_at_kill": reached["examples"],
        "rolled_back_to_step": reset["step"], "steps_rolled_back": reached["step"] - reset["step"],
        "seconds_to_regroup": reset["t"] - killed_at, "workers_after_failure": reset["size"],
        "seconds_lost": None if back is None else back["t"] - killed_at,
    })
    joins = [e for e in events if e["event"] == "reset" and e["t"] > reset["t"] and e["size"] > reset["size"]]
    if joins:
        summary["workers_after_join"] = joins[0]["size"]
        last = [e for e in steps if e["t"] < joins[0]["t"]]
        nxt = [e for e in steps if e["t"] > joins[0]["t"]]
        summary["seconds_join_pause"] = (nxt[0]["t"] - last[-1]["t"]) if last and nxt else None
    return summary


# --------------------------------------------------------------------------------------------
# Comparing a restarted run with the killed one


def trace_diff(first: str | os.PathLike, second: str | os.PathLike, steps: Iterable[int],
               loaded_step: int | None = None) -> float:
    """The largest absolute difference between two runs' weights (their traces) over ``steps``; at
    ``loaded_step``, the step a restarted ``second`` run loaded, its weights as loaded from the checkpoint."""
    first, second = Path(first), Path(second)

    def weights(trace, step):
        if trace == second and step == loaded_step:
            return np.load(trace / f"loaded-{step:04d}.npy")
        return np.load(trace / f"step-{step:04d}.npy")

    return max(float(np.abs(weights(first, s) - weights(second, s)).max()) for s in steps)


# --------------------------------------------------------------------------------------------
# A hang


def local_steps(shard_size: int, batch: int) -> int:
    """The bug: each worker counts its own full batches, so a worker with a shorter shard stops early."""
    return shard_size // batch


def uneven_epoch(folder: str, n_examples: int, batch: int, steps_for: Callable[[int, int], int]) -> dict:
    """One worker of an epoch over uneven shards: worker ``r`` takes examples ``r, r + size, ...`` of
    ``n_examples`` and runs ``steps_for(len(shard), batch)`` steps, each an all-reduce of its gradient named
    ``gradient``, then all-reduces its accuracy (``val_accuracy``). If the workers do not agree on the number
    of steps, the ones with more wait for the others' last ``gradient`` until Horovod's stall inspector
    (``HOROVOD_STALL_CHECK_TIME_SECONDS``, ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``) reports them and shuts
    Horovod down.
    """
    import mgpu  # noqa: F401
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    register_worker(folder, rank=hvd.rank())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n_examples, 4)).astype("float32")
    shard = x[hvd.rank()::hvd.size()]
    w = tf.Variable(tf.zeros(4))

    @tf.function  # in a graph each all-reduce keeps its name; eagerly, Horovod matches them by order
    def step(xb):
        gradient = tf.reduce_mean(xb, axis=0) - w  # pulls w toward the data's mean
        w.assign_add(0.5 * hvd.allreduce(gradient, name="gradient"))

    @tf.function
    def average(value):
        return hvd.allreduce(value, name="val_accuracy")

    steps = steps_for(len(shard), batch)
    for i in range(steps):
        step(shard[i * batch:(i + 1) * batch])
    average(tf.constant(1.0))
    result = {"rank": hvd.rank(), "shard": len(shard), "steps": steps}
    everyone = hvd.allgather_object(result)
    if hvd.rank() == 0:
        write_json(Path(folder) / "result.json", everyone)
    return result


#: How horovodrun prefixes a worker's line: ``[rank]<stderr>:``.
_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:")


def _last_stall_report(output: str) -> list[str] | None:
    """The lines of the stall inspector's last report in a job's output (its message, "Missing ranks:",
    one line per rank, and the shutdown notice if any), without horovodrun's prefixes; None if none."""
    lines = [_PREFIX.sub("", line) for line in output.splitlines()]
    found = None
    for i, line in enumerate(lines):
        if line.rstrip().endswith("Missing ranks:"):
            start = i - 1 if i and "One or more tensors" in lines[i - 1] else i
            end = i + 1
            while end < len(lines) and re.match(r"^\d+!?: \[", lines[end].strip()):
                end += 1
            if end < len(lines) and "Will shutdown" in lines[end]:
                end += 1
            found = lines[start:end]
    return found


def stall_report(output: str) -> dict[int, list[str]] | None:
    """The stall inspector's last report in a job's output, as ``{rank: [tensors it has not submitted]}``
    (the "Missing ranks:" lines; a ``!`` after a rank marks it for shutdown). None if there is none."""
    report = _last_stall_report(output)
    if report is None:
        return None
    missing = {}
    for entry in report:
        match = re.match(r"^(\d+)!?: \[(.*)\]\s*$", entry.strip())
        if match:
            missing[int(match.group(1))] = [t.strip() for t in match.group(2).split(",") if t.strip() != "..."]
    return missing


def stall_excerpt(output: str) -> str | None:
    """The stall inspector's last report in a job's output as the coordinator printed it; None if none."""
    report = _last_stall_report(output)
    return None if report is None else "\n".join(report)


def stall_named_rank(report: Mapping[int, Sequence[str]]) -> int:
    """The rank that held the others up: the one missing a tensor that every other rank submitted."""
    ranks = set(report)
    for rank in sorted(ranks):
        for tensor in report[rank]:
            if not any(tensor in report[other] for other in ranks - {rank}):
                return rank
    raise ValueError(f"no rank alone is missing a tensor in {dict(report)}")
