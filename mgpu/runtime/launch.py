"""Run a training function or script on N data-parallel workers.

This is the one launcher the notebooks, the tests and the grader use. It starts the job with
Horovod's own ``horovodrun`` so a learner sees the same command they would type:

- no GPU: N worker processes over Gloo on the CPU cores, each given ``cores // N`` threads so that
  four "simulated GPUs" fit on a laptop; with ``cores_per_worker=k`` each worker is also pinned to
  its own ``k`` cores (local rank r: the r-th slice), so a simulated GPU is a fixed slice of the
  machine and one worker no longer gets every core: N workers can then be N times faster;
- GPUs: one process per GPU, each worker pinned to the GPU of its local rank before TensorFlow
  starts (see :func:`pin_gpu`);
- fewer GPUs than workers (a laptop with one or two, Colab's one): the workers run on the CPU as
  above, with a one-line note, and single-process runs in the notebook still use the GPU
  (see :func:`workers_use_gpus`).

The launcher returns the workers' exit status and rank 0's return value, streams the workers'
output while they run, and never leaves a worker process behind: every process it starts carries
a private marker in its environment and is killed at the end, whether the job finished, one rank
crashed, the time ran out or the user pressed Ctrl-C.

Inside the course's grader (``MGPU_LAUNCH_SPOOL`` set) the launcher does not start ``horovodrun``
itself: it hands the job to the grader's launch service (:mod:`autograder.launch_service`), which
starts the workers as a user the notebook's kernel cannot impersonate, and waits for it the same way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import cloudpickle
import psutil

#: Environment variable that marks every process of one launch (used to find orphans).
LAUNCH_MARKER = "MGPU_LAUNCH_ID"
#: Environment variable telling each worker how many CPU threads it may use.
THREADS_VARIABLE = "MGPU_THREADS_PER_WORKER"
#: Environment variable giving each worker a fixed slice of this many cores (``cores_per_worker``).
CORES_VARIABLE = "MGPU_CORES_PER_WORKER"
#: Seconds Gloo and horovodrun wait for all workers to start; 2-core machines need a lot.
DEFAULT_START_TIMEOUT = 180


class LaunchError(RuntimeError):
    """A distributed run did not succeed; the message says which rank failed and why."""


@dataclass
class LaunchResult:
    """What a distributed run produced."""

    num_workers: int
    returncode: int | None
    rank_status: dict[int, str]
    value: Any = None
    output: str = ""
    timed_out: bool = False
    seconds: float = 0.0
    command: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0
            and not self.timed_out
            and all(self.rank_status.get(r) == "ok" for r in range(self.num_workers))
        )

    def failure_reason(self) -> str:
        """One line saying why the run failed ('' when it succeeded)."""
        if self.ok:
            return ""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s"
        problems = [
            f"rank {r}: {self.rank_status.get(r, 'died without reporting (killed or crashed)')}"
            for r in range(self.num_workers)
            if self.rank_status.get(r) != "ok"
        ]
        detail = "; ".join(problems) if problems else "all ranks reported success"
        first = failed_rank_line(self.output)
        launcher = "the Slurm job" if self.command[:1] == ["sbatch"] else "horovodrun"
        return f"{launcher} exited with status {self.returncode}: {detail}" + (f" ({first})" if first else "")

    def raise_for_status(self) -> "LaunchResult":
        if not self.ok:
            raise LaunchError(self.failure_reason())
        return self


# --------------------------------------------------------------------------------------------
# Devices: threads per worker on CPU, one GPU per local rank otherwise


def free_port() -> int:
    """A TCP port on this machine that nothing listens on now (for a server a lab starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_cores() -> int:
    """CPU cores this process may run on (respects affinity masks and containers)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_per_worker(num_workers: int, cores: int | None = None) -> int:
    """Split the cores evenly between workers, at least one thread each."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    cores = available_cores() if cores is None else cores
    return max(1, cores // num_workers)


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The model of each GPU the driver lists (``nvidia-smi -L``) and CUDA_VISIBLE_DEVICES leaves
    visible, without starting TensorFlow. [] where there is no NVIDIA driver."""
    environ = os.environ if environ is None else environ
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    models = [line.split(":", 1)[1].split(" (UUID")[0].strip() if ":" in line else ""
              for line in listed.splitlines() if line.startswith("GPU ")]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        chosen = [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        models = models[:len(chosen)]
    return models


def visible_gpu_count(environ: dict[str, str] | None = None) -> int:
    """How many GPUs :func:`visible_gpus` finds."""
    return len(visible_gpus(environ))


def workers_use_gpus(num_workers: int, gpus: int) -> bool:
    """One GPU per worker, never shared: with fewer GPUs than workers, the workers use the CPU."""
    return gpus > 0 and num_workers <= gpus


def placement_note(num_workers: int, gpus: int) -> str | None:
    """The one line the launcher prints when workers fall back to the CPU although GPUs exist."""
    if gpus == 0 or workers_use_gpus(num_workers, gpus):
        return None
    return (f"[launch] {num_workers} workers but {gpus} GPU(s) here: the workers run on the CPU over Gloo "
            f"({threads_per_worker(num_workers)} thread(s) each); single-process runs still use the GPU.")


def choose_gpu(local_rank: int, gpus: Sequence[Any], local_size: int | None = None) -> Any | None:
    """The GPU a worker of ``local_rank`` owns: one GPU per local rank, never shared.

    Returns None when there is no GPU (the worker runs on the CPU). Raises when more workers
    were started on this host than it has GPUs, because two workers on one GPU would make
    every measurement in the course wrong without saying so.
    """
    if not gpus:
        return None
    if local_size is not None and local_size > len(gpus):
        raise LaunchError(
            f"{local_size} workers on this host but only {len(gpus)} GPU(s): "
            f"start at most {len(gpus)} workers per host"
        )
    if not 0 <= local_rank < len(gpus):
        raise LaunchError(f"local rank {local_rank} has no GPU (this host has {len(gpus)})")
    return gpus[local_rank]


def core_slice(local_rank: int, cores_per_worker: int, allowed: Sequence[int]) -> list[int]:
    """The cores of the simulated GPU of ``local_rank``: the next ``cores_per_worker`` of ``allowed``.

    Slices follow each other and wrap around when there are more workers than slices, so two
    workers share a slice only when the machine has too few cores for all of them.
    """
    allowed = sorted(allowed)
    k = max(1, min(cores_per_worker, len(allowed)))
    start = (local_rank * k) % len(allowed)
    return [allowed[(start + i) % len(allowed)] for i in range(k)]


def _pin_process_to(cores: Sequence[int]) -> None:
    # Every thread of the process, not only the caller: TensorFlow may already have started some.
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except OSError:  # a thread that ended meanwhile
            pass


def pin_gpu(local_rank: int | None = None, local_size: int | None = None) -> str:
    """Make only this worker's GPU visible to TensorFlow; size CPU threads otherwise.

    Call it before the first TensorFlow operation (the launcher's workers call it for you).
    Returns a short description of the device the worker uses.
    """
    import tensorflow as tf

    if local_rank is None:
        local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
    if local_size is None:
        local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
    gpus = tf.config.list_physical_devices("GPU")
    gpu = choose_gpu(local_rank, gpus, local_size)
    if gpu is not None:
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
        return f"GPU {gpu.name}"
    threads = int(os.environ.get(THREADS_VARIABLE, "0")) or threads_per_worker(local_size)
    cores_per_worker = int(os.environ.get(CORES_VARIABLE, "0"))
    if cores_per_worker:
        cores = core_slice(local_rank, cores_per_worker, os.sched_getaffinity(0))
        _pin_process_to(cores)
        threads = len(cores)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    except RuntimeError:
        pass  # TensorFlow already started: its thread pools are fixed now.
    pinned = f" on cores {sorted(os.sched_getaffinity(0))}" if cores_per_worker else ""
    return f"CPU ({threads} thread{'s' if threads > 1 else ''}{pinned})"


# --------------------------------------------------------------------------------------------
# Process clean-up


def marked_processes(launch_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries this launch's marker."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(LAUNCH_MARKER) == launch_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def kill_processes(procs: list[psutil.Process], grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


def _kill_launch(popen: subprocess.Popen, launch_id: str) -> None:
    """End horovodrun, its process group and every marked process, wherever it re-parented."""
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait()
    # Horovod starts each worker in a session of its own, so the group kill above does not
    # reach them; the marker does. Loop: a dying middleman may still be forking.
    for _ in range(3):
        procs = marked_processes(launch_id)
        if not procs:
            return
        kill_processes(procs)


# --------------------------------------------------------------------------------------------
# Launching


def horovodrun_command(num_workers: int, worker_argv: Sequence[str], start_timeout: int,
                       hosts: str | None = None, hostfile: str | os.PathLike | None = None) -> list[str]:
    """The horovodrun command line for ``num_workers`` workers over Gloo: all on this machine, or
    spread over ``hosts`` (``"localhost:2,127.0.0.1:2"``) or a ``hostfile`` (checked by :func:`_launch`)."""
    horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if horovodrun is None:
        raise LaunchError("horovodrun not found: run `make setup` (it builds Horovod into .venv)")
    return [
        horovodrun,
        "-np", str(num_workers),
        *(["--hostfile", str(hostfile)] if hostfile is not None else ["-H", hosts or f"localhost:{num_workers}"]),
        "--gloo",
        "--start-timeout", str(start_timeout),
        *worker_argv,
    ]


class _Echo:
    """What of the workers' output reaches the caller's screen: ``verbose=True`` everything,
    ``"rank0"`` only rank 0's standard output without horovodrun's ``[0]<stdout>:`` prefix (one
    line per result a training function prints, none of the libraries' warnings), False nothing."""

    PREFIX = "[0]<stdout>:"

    def __init__(self, verbose: bool | str):
        if verbose not in (True, False, "rank0"):
            raise ValueError(f"verbose must be True, False or 'rank0', not {verbose!r}")
        self.verbose, self.partial = verbose, ""

    def __call__(self, text: str) -> None:
        if not self.verbose:
            return
        if self.verbose is True:
            sys.stdout.write(text)
        else:
            lines = (self.partial + text).split("\n")
            self.partial = lines.pop()
            shown = [line[len(self.PREFIX):] for line in lines if line.startswith(self.PREFIX)]
            if shown:
                sys.stdout.write("\n".join(shown) + "\n")
        sys.stdout.flush()


def _stream(pipe, sink: list[str], echo: _Echo) -> None:
    for line in iter(pipe.readline, ""):
        sink.append(line)
        echo(line)
    pipe.close()


#: Set by the grader's sandbox: the folder where its launch service takes jobs.
SPOOL_VARIABLE = "MGPU_LAUNCH_SPOOL"


def _job_folder() -> tempfile.TemporaryDirectory:
    """The job's folder: in the grader's spool when a launch service runs, else a temporary one."""
    # Under the service the workers' files belong to another user: the kernel cannot delete them,
    # and the run's private /tmp goes with the run.
    return tempfile.TemporaryDirectory(prefix="mgpu-launch-", dir=os.environ.get(SPOOL_VARIABLE) or None,
                                       ignore_cleanup_errors=True)


def _launch_via_service(num_workers: int, job_dir: Path, timeout: float | None, verbose: bool | str,
                        start_timeout: int) -> LaunchResult:
    """Ask the grader's launch service to run the job; follow its log; cancel it on time-out or Ctrl-C."""
    os.chmod(job_dir, 0o1777)  # the workers run as another user and leave their status here
    request = {"workers": num_workers, "start_timeout": start_timeout,
               "threads": threads_per_worker(num_workers), "cwd": os.getcwd()}
    tmp = job_dir / "request.json.tmp"
    tmp.write_text(json.dumps(request))
    os.replace(tmp, job_dir / "request.json")
    lines: list[str] = []
    started = time.monotonic()
    timed_out = False
    exit_file, log_file = job_dir / "exit.json", job_dir / "log"
    position = 0
    echo = _Echo(verbose)

    def follow() -> None:
        nonlocal position
        try:
            with open(log_file, "r", errors="replace") as log:
                log.seek(position)
                text = log.read()
                position = log.tell()
        except OSError:
            return
        if text:
            lines.append(text)
            echo(text)

    try:
        while not exit_file.exists():
            follow()
            if timeout is not None and time.monotonic() - started > timeout:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        if not exit_file.exists():
            (job_dir / "cancel").touch()
            deadline = time.monotonic() + 30
            while not exit_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
    follow()
    try:
        done = json.loads(exit_file.read_text())
    except (OSError, ValueError):
        done = {"returncode": None, "message": "the launch service did not answer"}
    if done.get("message") and not timed_out:
        lines.append(f"launch service: {done['message']}\n")
    returncode = done.get("returncode") if isinstance(done.get("returncode"), int) else None
    return _collect(num_workers, job_dir, returncode, "".join(lines), timed_out,
                    time.monotonic() - started, ["horovodrun (grader's launch service)", "-np", str(num_workers)])


def _collect(num_workers: int, job_dir: Path, returncode: int | None, output: str, timed_out: bool,
             seconds: float, command: list[str]) -> LaunchResult:
    """The result of a finished job: each rank's status file and rank 0's return value."""
    status = {}
    for rank in range(num_workers):
        path = job_dir / f"status-{rank}.json"
        if path.exists():
            try:
                status[rank] = json.loads(path.read_text())["status"]
            except (ValueError, KeyError):
                status[rank] = "wrote an unreadable status file"
    value = None
    result_path = job_dir / "result.pkl"
    if status.get(0) == "ok" and result_path.exists():
        with open(result_path, "rb") as f:
            value = cloudpickle.load(f)
    return LaunchResult(num_workers=num_workers, returncode=returncode, rank_status=status, value=value,
                        output=output, timed_out=timed_out, seconds=seconds, command=command)


def _launch(num_workers: int, job_dir: Path, timeout: float | None, verbose: bool | str,
            env: dict[str, str] | None, start_timeout: int, hosts: str | None = None,
            hostfile: str | os.PathLike | None = None) -> LaunchResult:
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    _Echo(verbose)  # a bad value is refused before anything starts
    if hosts is not None or hostfile is not None:
        from mgpu.lesson10 import multinode

        if env and CORES_VARIABLE in env:
            raise ValueError("cores_per_worker cannot be combined with hosts: the core slices follow the local "
                             "rank, which starts again at 0 on every host")
        multinode.check_local_hosts(hosts, num_workers, hostfile=hostfile)
    if os.environ.get(SPOOL_VARIABLE):
        if hosts is not None or hostfile is not None:
            raise LaunchError("hosts cannot be passed under the grader: its launch service runs every worker "
                              "on the grading machine")
        if env:
            raise LaunchError(f"env={sorted(env)} cannot be passed under the grader: its launch service "
                              "starts the workers with the grader's environment")
        return _launch_via_service(num_workers, job_dir, timeout, verbose, start_timeout)
    launch_id = uuid.uuid4().hex
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env[LAUNCH_MARKER] = launch_id
    child_env.setdefault(THREADS_VARIABLE, str(threads_per_worker(num_workers)))
    child_env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(start_timeout))
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    gpus = visible_gpu_count(child_env)
    note = placement_note(num_workers, gpus)
    if note:
        print(note, flush=True)
        child_env["CUDA_VISIBLE_DEVICES"] = ""  # each worker then sizes its CPU threads (pin_gpu)
    # The workers import this package even when it is not installed (a fresh clone).
    package_root = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, child_env.get("PYTHONPATH")) if p)
    command = horovodrun_command(
        num_workers, [sys.executable, "-m", "mgpu.runtime._worker", str(job_dir)], start_timeout, hosts, hostfile
    )

    lines: list[str] = []
    started = time.monotonic()
    popen = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True, errors="replace", env=child_env, start_new_session=True,
    )
    reader = threading.Thread(target=_stream, args=(popen.stdout, lines, _Echo(verbose)), daemon=True)
    reader.start()
    timed_out = False
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # Also runs on KeyboardInterrupt, which then propagates to the caller.
        _kill_launch(popen, launch_id)
        reader.join(timeout=10)
    return _collect(num_workers, job_dir, popen.returncode, "".join(lines), timed_out,
                    time.monotonic() - started, command)


def _with_cores(env: dict[str, str] | None, cores_per_worker: int | None) -> dict[str, str] | None:
    if cores_per_worker is None:
        return env
    if cores_per_worker < 1:
        raise ValueError(f"cores_per_worker must be at least 1, got {cores_per_worker}")
    return {**(env or {}), CORES_VARIABLE: str(cores_per_worker), THREADS_VARIABLE: str(cores_per_worker)}


def run(fn: Callable[..., Any], num_workers: int, args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None, *, timeout: float | None = None,
        verbose: bool | str = True, env: dict[str, str] | None = None,
        start_timeout: int = DEFAULT_START_TIMEOUT, check: bool = True,
        cores_per_worker: int | None = None, hosts: str | None = None,
        hostfile: str | os.PathLike | None = None) -> LaunchResult:
    """Run ``fn(*args, **kwargs)`` on ``num_workers`` Horovod workers; return rank 0's value.

    ``fn`` is sent to the workers with cloudpickle, so a function defined in a notebook works.
    It should call ``hvd.init()`` itself, as a Horovod training script does. ``verbose``: True
    shows every worker's output as it comes, ``"rank0"`` only what rank 0 prints. With ``check``
    (the default) a failed run raises :class:`LaunchError` naming the failed rank. With
    ``cores_per_worker`` (no GPU) each worker runs on its own slice of that many cores. ``hosts``
    (horovodrun's ``-H``, e.g. ``"localhost:2,127.0.0.1:2"``) spreads the workers over several
    host names; Horovod counts each name as a machine of its own, so two names of this machine give
    a two-node job (notebook 10); ``hostfile`` (horovodrun's ``--hostfile``, ``host slots=N``
    lines) does the same from a file. Other machines need a folder shared with them for the job's files,
    which this launcher does not set up: it refuses their names (:mod:`mgpu.lesson10.slurm_horovod` runs a job
    on the nodes of a Slurm allocation).
    """
    with _job_folder() as tmp:
        job_dir = Path(tmp)
        write_function_job(job_dir, fn, args, kwargs)
        result = _launch(num_workers, job_dir, timeout, verbose, _with_cores(env, cores_per_worker),
                         start_timeout, hosts, hostfile)
    return result.raise_for_status() if check else result


def write_function_job(job_dir: Path, fn: Callable[..., Any], args: Sequence[Any] = (),
                       kwargs: dict[str, Any] | None = None) -> None:
    """Leave ``fn(*args, **kwargs)`` in ``job_dir`` for :mod:`mgpu.runtime._worker` (job.pkl, sys_path.json)."""
    with open(Path(job_dir) / "job.pkl", "wb") as f:
        cloudpickle.dump({"kind": "function", "fn": fn, "args": tuple(args), "kwargs": kwargs or {}}, f)
    # Workers see the caller's import path, so a function importable here is importable there.
    (Path(job_dir) / "sys_path.json").write_text(json.dumps([p for p in sys.path if p]))


def run_script(script: str | os.PathLike, num_workers: int, script_args: Sequence[str] = (), *,
               timeout: float | None = None, verbose: bool | str = True, env: dict[str, str] | None = None,
               cwd: str | os.PathLike | None = None, start_timeout: int = DEFAULT_START_TIMEOUT,
               check: bool = True, cores_per_worker: int | None = None) -> LaunchResult:
    """Run a Python training script on ``num_workers`` Horovod workers, like ``horovodrun``.

    The script runs as ``__main__`` with ``sys.argv = [script, *script_args]`` in ``cwd``;
    ``cores_per_worker`` as for :func:`run`.
    """
    script = Path(script).resolve()
    if not script.is_file():
        raise LaunchError(f"no such script: {script}")
    with _job_folder() as tmp:
        job_dir = Path(tmp)
        job = {"kind": "script", "script": str(script), "argv": [str(script), *map(str, script_args)],
               "cwd": str(Path(cwd).resolve()) if cwd else os.getcwd()}
        with open(job_dir / "job.pkl", "wb") as f:
            cloudpickle.dump(job, f)
        result = _launch(num_workers, job_dir, timeout, verbose, _with_cores(env, cores_per_worker),
                         start_timeout)
    return result.raise_for_status() if check else result


def failed_rank_line(output: str) -> str | None:
    """horovodrun's own line naming the first process that failed, if it printed one."""
    match = re.search(r"Process name: (\S+)\s+Exit code: (-?\d+)", output)
    return f"process {match.group(1)} exited with code {match.group(2)}" if match else None
