"""A Horovod job inside a Slurm allocation, without ssh and without MPI (notebook 10).

``horovodrun`` starts the workers of other machines with ssh, and ``srun --mpi=pmix`` needs a Horovod
built against MPI. A Gloo worker needs neither: it only reads a few ``HOROVOD_*`` variables (where the
rendezvous server is, its rank, local rank and cross rank) and meets the others through that server.
So Slurm can start the workers itself, and the batch script does by hand what ``horovodrun`` does:

1. the host plan from the allocation: ``n1:2,n2:2`` from ``scontrol show hostnames $SLURM_JOB_NODELIST``
   and ``SLURM_TASKS_PER_NODE`` (``2(x2)``), placed by Horovod's own code (:func:`mgpu.lesson10.multinode.slots`);
2. Horovod's own rendezvous server (``horovod.runner.http.http_server.RendezvousServer``), started on
   the first node with that plan, at the first node's ``NodeAddr`` (an address the other nodes reach,
   not a node name that may not resolve);
3. ``srun``, one task per slot: each task finds its slot in the plan from ``SLURM_NODEID`` and
   ``SLURM_LOCALID``, sets the variables Horovod's Gloo launcher would have set, and runs the program.

Each task talks over the interface through which it reaches the rendezvous address (a
``HOROVOD_GLOO_IFACE`` set before ``sbatch`` wins), and a program run by :mod:`mgpu.runtime._worker` pins one
GPU per local rank (:func:`mgpu.runtime.launch.pin_gpu`): every task of a node must then see all of the node's
GPUs, so ask for them per node (``--gres=gpu:N``), not per task.

This is not a path Horovod documents. It rests on what Horovod 0.28.1's launcher gives each Gloo
worker (``gloo_run.create_slot_env_vars`` and ``create_run_env_vars``) and on its rendezvous server's
scopes (``global``, ``local_<host>``, ``cross_<local rank>``); ``tests/test_slurm_horovod.py`` runs it
on the course's two-node test cluster (``scripts/slurm_cluster.py``) and checks every rank's place and
weights.

- :func:`batch_script` writes the ``sbatch`` script; :func:`function_command` turns a Python function
  into the program it runs (the launcher's worker, :mod:`mgpu.runtime._worker`, so ``launch.run``'s functions
  run unchanged); :func:`submit`, :func:`follow` and :func:`collect` queue it, follow it with a line
  per change of state, and read each rank's status and rank 0's return value.
- :func:`reach_slurm` finds a Slurm to submit to: the one ``SLURM_CONF`` or ``sinfo`` points at, else
  the course's test cluster, started for the ``with`` block and always brought down after it.
- ``python -m mgpu.lesson10.slurm_horovod hosts | rendezvous | task`` are the three steps the script calls.

The job folder must be one every node sees (a shared home or project folder; on the test cluster
all nodes are this machine).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shlex
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
from typing import Any, Callable, Iterator, Mapping, Sequence

from mgpu.lesson10 import multinode
from mgpu.runtime import launch, paths

#: Job states squeue shows while a job has not ended.
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                 "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STOPPED", "RESV_DEL_HOLD"}
#: Seconds each worker's Gloo waits for the others at hvd.init() (Horovod's default, 30, is short
#: for four TensorFlow processes starting on two cores).
GLOO_TIMEOUT_SECONDS = 120
#: How to get a Slurm (for the line that says no Slurm was found).
HOW_TO_GET_SLURM = ("open this notebook where sbatch works (a cluster's login node), or run it as root on "
                    "Linux with Debian's Slurm installed (apt-get install slurmctld slurmd slurm-client munge): "
                    "it then starts the course's two-node test cluster, scripts/slurm_cluster.py, and stops it after")


# --------------------------------------------------------------------------------------------
# The host plan from the allocation


def tasks_per_node(text: str) -> list[int]:
    """Slurm's compact ``SLURM_TASKS_PER_NODE`` (``"2(x2),1"``) as one count per node (``[2, 2, 1]``)."""
    counts = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"cannot read SLURM_TASKS_PER_NODE={text!r}: expected counts like 2(x2),1")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def plan_hosts(nodes: Sequence[str], counts: Sequence[int]) -> str:
    """Horovod's ``-H`` string for the allocation: each node with its number of tasks (``n1:2,n2:2``)."""
    if len(nodes) != len(counts):
        raise ValueError(f"{len(nodes)} nodes ({', '.join(nodes)}) but tasks for {len(counts)}: {list(counts)}")
    return ",".join(f"{node}:{count}" for node, count in zip(nodes, counts) if count > 0)


def allocation_hosts(environ: Mapping[str, str] | None = None) -> str:
    """The plan of the allocation this process runs in: ``scontrol show hostnames $SLURM_JOB_NODELIST``
    with ``SLURM_TASKS_PER_NODE``."""
    environ = os.environ if environ is None else environ
    missing = [v for v in ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE") if not environ.get(v)]
    if missing:
        raise RuntimeError(f"{' and '.join(missing)} not set: run this inside a Slurm allocation (sbatch or salloc)")
    names = subprocess.run(["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]], capture_output=True,
                           text=True, timeout=30, check=True, env=dict(environ)).stdout.split()
    return plan_hosts(names, tasks_per_node(environ["SLURM_TASKS_PER_NODE"]))


# --------------------------------------------------------------------------------------------
# Each task's Horovod variables


def task_slot(hosts: str, environ: Mapping[str, str]):
    """This task's slot in Horovod's plan for ``hosts``: the node is ``SLURM_NODEID`` (the plan's hosts are
    the allocation's nodes in Slurm's order), the local rank ``SLURM_LOCALID``."""
    plan = multinode.slots(hosts)
    node_names = list(dict.fromkeys(s.hostname for s in plan))
    node, local = int(environ["SLURM_NODEID"]), int(environ["SLURM_LOCALID"])
    if int(environ.get("SLURM_NTASKS", len(plan))) != len(plan):
        raise RuntimeError(f"srun started {environ['SLURM_NTASKS']} tasks but the plan {hosts} has {len(plan)} "
                           "slots: run srun with the allocation's tasks (no -n)")
    if node >= len(node_names):
        raise RuntimeError(f"task on node {node} of a plan with {len(node_names)} nodes ({hosts})")
    name = environ.get("SLURMD_NODENAME")
    if name and name != node_names[node]:
        raise RuntimeError(f"SLURM_NODEID {node} is {name}, not {node_names[node]} as in the plan {hosts}")
    for slot in plan:
        if slot.hostname == node_names[node] and slot.local_rank == local:
            return slot
    raise RuntimeError(f"{node_names[node]} has no local rank {local} in the plan {hosts}: more tasks on a node "
                       "than the allocation gave it")


def interface_towards(address: str, port: int = 9) -> str:
    """The network interface this machine reaches ``address`` from: the one holding the source address
    the kernel picks for it (no packet is sent). 127.0.0.1 gives ``lo``."""
    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, port))
        source = probe.getsockname()[0]
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == source for a in addresses):
            return name
    raise RuntimeError(f"no interface holds {source}, this machine's address towards {address}")


def horovod_environment(slot, rendezvous_address: str, port: int, interface: str) -> dict[str, str]:
    """The variables a Gloo worker reads at ``hvd.init()``: where the rendezvous is, which interface to
    talk over, and this worker's place (the same values ``horovodrun --gloo`` gives it)."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": interface,
        "NCCL_SOCKET_IFNAME": interface,
        "HOROVOD_HOSTNAME": slot.hostname,  # names the local scope: the same string on all ranks of a node
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


def task_environment(hosts: str, rendezvous_address: str, port: int,
                     environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of one Slurm task: its own, plus its Horovod variables, plus the launcher's
    thread count (``SLURM_CPUS_PER_TASK``) for :func:`mgpu.runtime.launch.pin_gpu`. ``HOROVOD_GLOO_IFACE``, if
    set already, is kept (the ``--network-interface`` of ``horovodrun``)."""
    environ = dict(os.environ if environ is None else environ)
    address = socket.gethostbyname(rendezvous_address)
    interface = environ.get("HOROVOD_GLOO_IFACE") or interface_towards(address, port)
    env = {**environ, **horovod_environment(task_slot(hosts, environ), address, port, interface)}
    env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(GLOO_TIMEOUT_SECONDS))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if environ.get("SLURM_CPUS_PER_TASK"):
        env.setdefault(launch.THREADS_VARIABLE, environ["SLURM_CPUS_PER_TASK"])
    return env


# --------------------------------------------------------------------------------------------
# The rendezvous server


def serve_rendezvous(hosts: str, port_file: str | os.PathLike, *, stop: threading.Event | None = None) -> None:
    """Run Horovod's rendezvous server for the plan of ``hosts`` until ``stop`` is set, SIGTERM arrives
    or the process that started this one ends. The port it listens on (every interface) is written
    to ``port_file`` once it listens."""
    from horovod.runner.http.http_server import RendezvousServer

    plan = multinode.slots(hosts)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(plan)
    port_file = Path(port_file)
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, port_file)
    print(f"[rendezvous] Horovod's rendezvous server on port {port} for {hosts}:", flush=True)
    for s in plan:
        print(f"[rendezvous]   rank {s.rank}: {s.hostname}, local rank {s.local_rank}, cross rank {s.cross_rank}",
              flush=True)
    parent = os.getppid()
    try:
        while not stop.wait(0.5):
            if os.getppid() != parent:  # the batch script ended without stopping this server
                break
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------
# The batch script


def batch_script(command: Sequence[str], *, nodes: int, tasks_per_node: int, cpus_per_task: int = 1,
                 gpus_per_node: int = 0, time_limit: str = "00:10:00", job_name: str = "mgpu-horovod",
                 output: str | os.PathLike | None = None, python: str | None = None,
                 workdir: str | os.PathLike | None = None) -> str:
    """A Slurm batch script that runs ``command`` as a Horovod job on every task of the allocation, with
    Horovod's rendezvous started here and the workers started by ``srun`` (no ssh, no MPI). ``python``
    is the interpreter that imports :mod:`mgpu` on every node (default: this one)."""
    if nodes < 1 or tasks_per_node < 1 or cpus_per_task < 1:
        raise ValueError("a job needs at least one node, one task per node and one CPU per task")
    if not command:
        raise ValueError("no program to run: pass e.g. ['python', 'train.py']")
    py = shlex.quote(python or sys.executable)
    program = " ".join(shlex.quote(str(part)) for part in command)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        *([f"#SBATCH --gres=gpu:{gpus_per_node}"] if gpus_per_node else []),
        f"#SBATCH --time={time_limit}",
        *([f"#SBATCH --output={output}"] if output else []),
        "set -euo pipefail",
        *([f"cd {shlex.quote(str(workdir))}"] if workdir else []),
        "# 1. Horovod's host plan from the allocation (node names and SLURM_TASKS_PER_NODE), e.g. "
        + ",".join(f"n{i + 1}:{tasks_per_node}" for i in range(min(nodes, 3))) + (",..." if nodes > 3 else ""),
        f"hosts=$({py} -m mgpu.lesson10.slurm_horovod hosts)",
        "# 2. An address of this node (the first) that the other nodes reach: its NodeAddr",
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'address=$(scontrol show node "$first" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        "# 3. Horovod's rendezvous server on this node, for that plan; it writes its port to a file",
        "port_file=$(mktemp)",
        f'{py} -m mgpu.lesson10.slurm_horovod rendezvous "$hosts" "$port_file" &',
        "server=$!",
        "trap 'kill $server 2>/dev/null; rm -f \"$port_file\"' EXIT",
        'until [ -s "$port_file" ]; do',
        '  kill -0 $server 2>/dev/null || { echo "the rendezvous server did not start" >&2; exit 1; }',
        "  sleep 0.1",
        "done",
        'port=$(cat "$port_file")',
        "# 4. One task per slot: each sets its HOROVOD_* variables from SLURM_NODEID and SLURM_LOCALID,",
        "#    then runs the program; one failed task ends the others",
        f'srun --kill-on-bad-exit=1 {py} -m mgpu.lesson10.slurm_horovod task "$hosts" "$address" "$port" -- {program}',
        "",
    ]
    return "\n".join(lines)


def function_command(fn: Callable[..., Any], folder: str | os.PathLike, args: Sequence[Any] = (),
                     kwargs: dict[str, Any] | None = None, python: str | None = None) -> list[str]:
    """Pickle ``fn(*args, **kwargs)`` into ``folder`` as :func:`mgpu.runtime.launch.run` does and return the
    command that runs it on a Horovod worker (``python -m mgpu.runtime._worker FOLDER``): each rank leaves its
    status there, and rank 0 its return value (:func:`collect`)."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("status-*.json"), folder / "result.pkl"]:
        stale.unlink(missing_ok=True)
    launch.write_function_job(folder, fn, args, kwargs)
    return [python or sys.executable, "-m", "mgpu.runtime._worker", str(folder)]


# --------------------------------------------------------------------------------------------
# Submitting and following a job


@dataclass
class SlurmJobEnd:
    """How a job ended: its id, final state (COMPLETED, FAILED, TIMEOUT, CANCELLED...), Slurm's exit code
    (``0:0``), its nodes (``n[1-2]``, and one name each in Slurm's order), and the seconds from ``sbatch``
    to the end as seen by :func:`follow`."""

    job_id: str
    state: str
    exit_code: str = ""
    nodes: str = ""
    node_names: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def returncode(self) -> int | None:
        head = self.exit_code.split(":")[0]
        return int(head) if head.isdigit() else None


def slurm_command(*args: str, env: Mapping[str, str] | None = None, timeout: float = 30,
                  check: bool = True) -> subprocess.CompletedProcess:
    """A Slurm command (sbatch, squeue, scontrol, scancel) with a timeout: never waits forever."""
    done = subprocess.run(list(args), env=dict(env) if env is not None else None, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done


def submit(script: str, folder: str | os.PathLike, *, env: Mapping[str, str] | None = None) -> str:
    """Write ``script`` to ``folder/job.sh``, queue it with ``sbatch`` and return the job id.

    The job runs with this process's environment (``sbatch`` exports it), plus this package on
    ``PYTHONPATH`` and the launcher's marker (:data:`mgpu.runtime.launch.LAUNCH_MARKER`, the job's id for
    :func:`mgpu.runtime.launch.marked_processes`)."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.sh"
    path.write_text(script)
    env = dict(os.environ if env is None else env)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env[launch.LAUNCH_MARKER] = marker_of(folder)
    out = slurm_command("sbatch", "--parsable", "--chdir", str(folder), str(path), env=env).stdout
    return out.strip().split(";")[0]


def marker_of(folder: str | os.PathLike) -> str:
    """The marker :func:`submit` puts in the environment of every process of the job in ``folder``."""
    return f"slurm-{uuid.uuid5(uuid.NAMESPACE_URL, str(Path(folder).resolve())).hex}"


def hostnames(nodelist: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Slurm's compact node list (``n[1-2]``) as one name per node (``scontrol show hostnames``)."""
    if not nodelist or nodelist == "(null)":
        return []
    return slurm_command("scontrol", "show", "hostnames", nodelist, env=env, timeout=15).stdout.split()


def job_fields(job_id: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """scontrol's fields of a job ({} once slurmctld has forgotten it)."""
    done = slurm_command("scontrol", "show", "job", "-o", job_id, env=env, timeout=15, check=False)
    return dict(f.split("=", 1) for f in done.stdout.split() if "=" in f) if done.returncode == 0 else {}


def follow(job_id: str, *, env: Mapping[str, str] | None = None, timeout: float = 300, interval: float = 0.2,
           progress: Callable[[str], None] | None = print) -> SlurmJobEnd:
    """Ask squeue every ``interval`` seconds until the job has ended; say each change of state in one
    line (``progress``, None for silence). After ``timeout`` seconds the job is cancelled and the end
    says ``timed_out``; a job that has still not ended 60 s after that raises TimeoutError."""
    started, last, cancelled_at = time.monotonic(), None, None
    while True:
        asked = slurm_command("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T|%R", env=env, timeout=15,
                              check=False)
        state, _, reason = asked.stdout.strip().partition("|")
        if asked.returncode == 0 and not state:  # no longer listed (squeue forgets a job after MinJobAge)
            state = job_fields(job_id, env).get("JobState", "ENDED")
        if state and state != last:  # nothing when squeue did not answer: ask again
            if progress:
                # %R is the reason a job waits, "(Resources)", or the nodes it runs on
                where = "" if reason in ("", "(None)") else f" {reason}" if reason.startswith("(") else f" on {reason}"
                progress(f"[slurm] job {job_id}: {state}{where} after {time.monotonic() - started:.1f} s")
            last = state
        if state and state not in ACTIVE_STATES:
            break
        waited = time.monotonic() - started
        if cancelled_at is None and waited > timeout:
            cancelled_at = waited
            slurm_command("scancel", job_id, env=env, timeout=15, check=False)
            if progress:
                progress(f"[slurm] job {job_id}: still {last} after {timeout:g} s, cancelled")
        elif cancelled_at is not None and waited > cancelled_at + 60:
            raise TimeoutError(f"Slurm job {job_id} is still {last} 60 s after it was cancelled")
        time.sleep(interval)
    timed_out = cancelled_at is not None
    seconds = time.monotonic() - started
    fields = job_fields(job_id, env)
    nodes = fields.get("NodeList", "")
    return SlurmJobEnd(job_id=job_id, state=fields.get("JobState", state), exit_code=fields.get("ExitCode", ""),
                       nodes=nodes, node_names=hostnames(nodes, env), seconds=seconds, timed_out=timed_out,
                       fields=fields)


def collect(folder: str | os.PathLike, num_workers: int, end: SlurmJobEnd) -> launch.LaunchResult:
    """Each rank's status and rank 0's return value from the job folder of :func:`function_command`,
    with the job's output (``slurm-<id>.out`` in the folder unless the script named another)."""
    folder = Path(folder)
    out = folder / f"slurm-{end.job_id}.out"
    output = out.read_text(errors="replace") if out.exists() else ""
    result = launch._collect(num_workers, folder, end.returncode, output, end.timed_out, end.seconds,
                             ["sbatch", str(folder / "job.sh")])
    return result


# --------------------------------------------------------------------------------------------
# Finding a Slurm


@dataclass
class SlurmAccess:
    """A Slurm to submit to: ``env`` for its commands (None when there is none) and one line saying
    which one it is, or why there is none and how to get one."""

    env: dict[str, str] | None
    note: str
    started_here: bool = False


def cluster_script():
    """scripts/slurm_cluster.py as a module (the course's test cluster), or None outside the repository."""
    path = paths.ROOT / "scripts" / "slurm_cluster.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("mgpu_slurm_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sinfo_answers(env: Mapping[str, str]) -> bool:
    if shutil.which("sinfo", path=env.get("PATH")) is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h", "-o", "%P"], env=dict(env), capture_output=True,
                              timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@contextlib.contextmanager
def reach_slurm(cluster_folder: str | os.PathLike | None = None, *, start: bool = True) -> Iterator[SlurmAccess]:
    """The Slurm this machine reaches, for a ``with`` block: the one ``SLURM_CONF`` names or ``sinfo``
    answers for; else (``start``) the course's two-node test cluster, started in ``cluster_folder`` (by
    default a new folder in /tmp: munged's socket path must stay short) and brought down when the block
    ends, however it ends; else none, with the reason and how to get one."""
    env = dict(os.environ)
    if env.get("SLURM_CONF") or _sinfo_answers(env):
        where = f"SLURM_CONF={env['SLURM_CONF']}" if env.get("SLURM_CONF") else "sinfo answers"
        yield SlurmAccess(env, f"Slurm: this machine's ({where}); the job waits in its queue like any other")
        return
    cluster = cluster_script()
    why = busy = None
    if cluster is None:
        why = "the course's scripts/slurm_cluster.py is not in this checkout"
    elif cluster.missing():
        why = f"Slurm is not installed ({', '.join(cluster.missing())} missing)"
    elif not start:
        why = "the course's test cluster is not started here (start=False)"
    if why is None:
        own_folder = cluster_folder is None
        folder = Path(tempfile.mkdtemp(prefix="mgpu-slurm-") if own_folder else cluster_folder).resolve()
        began = time.monotonic()
        try:
            cluster_env = cluster.up(folder)
        except cluster.ClusterError as error:
            why = str(error).splitlines()[0].removeprefix(f"Slurm cluster in {folder} did not start: ")
            other = re.search(r"another Slurm cluster runs from (\S+): ", why)
            if other:  # a test cluster of another notebook or test holds the nodes' names: Slurm is busy, not absent
                busy = other.group(1)
            why = f"the course's test cluster did not start: {why}"
        else:
            try:
                yield SlurmAccess(dict(cluster_env), f"Slurm: the course's two-node test cluster (nodes n1, n2 on "
                                  f"this machine), started in {time.monotonic() - began:.2f} s; it is stopped "
                                  "when this cell ends", started_here=True)
            finally:
                left = cluster.down(folder)
                if left:
                    print(f"[slurm] the test cluster in {folder} left {', '.join(left)}", file=sys.stderr)
                elif own_folder:
                    shutil.rmtree(folder, ignore_errors=True)
            return
    if busy is not None:
        yield SlurmAccess(None, f"Slurm is busy: another test cluster runs from {busy}; stop it with "
                          f"`python scripts/slurm_cluster.py down --dir {busy}` and run this cell again. "
                          "The Slurm run is skipped.")
        return
    yield SlurmAccess(None, f"No Slurm here ({why}): the Slurm run is skipped. To run it, {HOW_TO_GET_SLURM}.")


# --------------------------------------------------------------------------------------------
# The three steps the batch script calls


def _task(hosts: str, address: str, port: str, command: Sequence[str]) -> int:
    if not command:
        print("mgpu.lesson10.slurm_horovod task: no program after --", file=sys.stderr)
        return 2
    env = task_environment(hosts, address, int(port))
    os.execvpe(command[0], list(command), env)
    return 127  # pragma: no cover - exec does not return


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.lesson10.slurm_horovod",
                                     description="The steps of a Horovod job inside a Slurm allocation.")
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("hosts", help="print Horovod's host plan of this allocation (n1:2,n2:2)")
    server = steps.add_parser("rendezvous", help="run Horovod's rendezvous server for HOSTS")
    server.add_argument("hosts")
    server.add_argument("port_file")
    task = steps.add_parser("task", help="run a program as this Slurm task's Horovod worker")
    task.add_argument("hosts")
    task.add_argument("address")
    task.add_argument("port")
    task.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.step == "hosts":
        print(allocation_hosts())
        return 0
    if args.step == "rendezvous":
        serve_rendezvous(args.hosts, args.port_file)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return _task(args.hosts, args.address, args.port, command)


if __name__ == "__main__":
    sys.exit(main())
