"""Several machines (notebook 10): where each rank of a job runs, and the commands that
start a job across machines, checked without running them.

- :func:`slots` asks Horovod's own host parser and slot assignment which host, local rank and cross
  rank each rank gets for ``-H host1:4,host2:4`` or a host file: the plan ``horovodrun`` follows.
- :func:`horovodrun_argv` builds the command a learner types on the first machine (Gloo or MPI,
  ``-H`` or ``--hostfile``, the network interface); :func:`dry_run` parses it with ``horovodrun``'s
  own argument parser and matches ``-np`` against the slots, so a typo fails here, not on the cluster.
- :func:`slurm_script` writes a Slurm batch script that runs the same job inside an allocation
  through ``horovodrun`` (which needs ssh between the nodes); :func:`check_shell` checks its syntax
  with ``bash -n``, and :func:`script_command` expands its ``horovodrun`` line in a stand-in
  allocation. :mod:`mgpu.lesson10.slurm_horovod` runs a job under Slurm without ssh and without MPI.
- :func:`check_local_hosts` lets :func:`mgpu.runtime.launch.run` spread workers over several names of this
  machine (``localhost``, ``127.0.0.1``, given as ``-H`` or a host file): Horovod counts each name as a
  machine of its own, which gives a real two-node job on one computer.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

#: The environment a multi-machine job usually needs, and why (values are examples to adapt).
NETWORK_VARIABLES = {
    "HOROVOD_GLOO_IFACE": "the network interface Gloo's workers talk over (`--network-interface eth0` sets it "
                          "and NCCL_SOCKET_IFNAME)",
    "NCCL_SOCKET_IFNAME": "the interface NCCL uses between machines, e.g. eth0 or ib0 (not docker0 or lo)",
    "NCCL_IB_DISABLE": "1 forces TCP sockets where InfiniBand is absent or broken",
    "NCCL_DEBUG": "INFO prints which transport NCCL chose (IB, sockets, NVLink) for each pair of GPUs",
    "CUDA_VISIBLE_DEVICES": "the GPUs a worker may see; the course pins one GPU per local rank instead",
}

#: Names this machine answers to without a network hop.
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def _parse(hosts: str | None, hostfile: str | os.PathLike | None):
    from horovod.runner.common.util import hosts as hvd_hosts

    if (hosts is None) == (hostfile is None):
        raise ValueError("give either hosts ('host1:4,host2:4') or a hostfile, not both or neither")
    if hostfile is not None and not Path(hostfile).read_text().strip():
        raise ValueError(f"{hostfile} lists no host: write one 'host slots=N' line per machine")
    try:
        if hostfile is not None:
            return hvd_hosts.parse_hosts(hvd_hosts.parse_host_files(str(hostfile)))
        return hvd_hosts.parse_hosts(hosts)
    except (IndexError, ValueError) as error:
        raise ValueError(f"cannot read the hosts {hosts or hostfile!s}: {error or 'bad syntax'}; "
                         "write them as host:slots,host:slots (or 'host slots=N' lines in a file)") from None


def _assign(parsed, np: int | None):
    from horovod.runner.common.util import hosts as hvd_hosts

    available = sum(h.slots for h in parsed)
    np = available if np is None else np
    if not 1 <= np <= available:
        raise ValueError(f"-np {np} asks for more processes than the {available} slots the hosts offer: "
                         "add hosts or slots, or lower -np")
    return hvd_hosts.get_host_assignments(parsed, np, np)


def slots(hosts: str | None = None, hostfile: str | os.PathLike | None = None, np: int | None = None):
    """Horovod's assignment of ``np`` ranks (default: every slot) to the hosts: one SlotInfo per rank
    with ``hostname``, ``rank``, ``local_rank``, ``cross_rank``, ``size``, ``local_size``, ``cross_size``."""
    return _assign(_parse(hosts, hostfile), np)


def slot_rows(assignment) -> list[dict]:
    """One row per rank, for a Table: where it runs and which GPU it pins (its local rank)."""
    return [{"rank": s.rank, "host": s.hostname, "local rank": s.local_rank, "cross rank": s.cross_rank,
             "GPU on its host": s.local_rank} for s in assignment]


def write_hostfile(path: str | os.PathLike, slots_by_host: Mapping[str, int]) -> Path:
    """A host file in the format ``horovodrun --hostfile`` and ``mpirun`` read: ``host slots=N`` lines."""
    bad = {h: n for h, n in slots_by_host.items() if not isinstance(n, int) or n < 1}
    if not slots_by_host or bad:
        raise ValueError(f"every host needs a positive number of slots, got {dict(slots_by_host)}")
    path = Path(path)
    path.write_text("".join(f"{host} slots={n}\n" for host, n in slots_by_host.items()))
    return path


def horovodrun_argv(np: int, command: Sequence[str], *, hosts: str | None = None,
                    hostfile: str | os.PathLike | None = None, mpi: bool = False,
                    network_interface: str | None = None) -> list[str]:
    """The ``horovodrun`` command for ``np`` processes over ``hosts`` or ``hostfile``.

    Gloo (the default here) needs only ssh between the machines and Horovod's own rendezvous; MPI
    (``mpi=True``) needs an MPI installation and a Horovod built against it, and then also runs
    under ``srun`` or ``mpirun`` directly.
    """
    argv = ["horovodrun", "-np", str(np)]
    argv += ["-H", hosts] if hosts is not None else ["--hostfile", str(hostfile)]
    argv.append("--mpi" if mpi else "--gloo")
    if network_interface:
        argv += ["--network-interface", network_interface]
    return argv + list(command)


def dry_run(argv: Sequence[str]):
    """Parse a ``horovodrun`` command with horovodrun's own parser and check ``-np`` against the
    hosts' slots, without starting anything. Returns the parsed arguments; raises ValueError with
    horovodrun's message for a command it would refuse."""
    from horovod.runner import launch as hvd_launch

    argv = list(argv)
    if not argv or Path(argv[0]).name != "horovodrun":
        raise ValueError(f"not a horovodrun command: {' '.join(argv)[:80]}")
    saved, err = sys.argv, io.StringIO()
    sys.argv = argv
    try:
        with contextlib.redirect_stderr(err):
            args = hvd_launch.parse_args()
    except SystemExit:
        lines = [l for l in err.getvalue().splitlines() if l.strip()]
        raise ValueError(f"horovodrun would refuse it: {lines[-1] if lines else 'bad arguments'}") from None
    finally:
        sys.argv = saved
    if not args.command:
        raise ValueError("horovodrun is given no program to run: end the command with `python train.py`")
    if args.hosts is None and args.hostfile is None:
        raise ValueError("no hosts: pass -H host1:4,host2:4 or --hostfile FILE")
    if args.num_proc is None:
        raise ValueError("no -np: say how many processes to start, e.g. -np 8")
    slots(args.hosts, args.hostfile, args.num_proc)
    return args


def slurm_script(nodes: int, tasks_per_node: int, command: Sequence[str], *, gpus_per_node: int = 0,
                 cpus_per_task: int = 4, time: str = "00:30:00", job_name: str = "mgpu-10") -> str:
    """A Slurm batch script (``sbatch job.sh``) that runs ``command`` on every slot of the allocation
    through ``horovodrun``; the hosts come from the allocation, never typed by hand."""
    if nodes < 1 or tasks_per_node < 1:
        raise ValueError("a job needs at least one node and one task per node")
    gres = f"#SBATCH --gres=gpu:{gpus_per_node}\n" if gpus_per_node else ""
    program = " ".join(command)
    return (
        "#!/bin/bash\n"
        f"#SBATCH --job-name={job_name}\n"
        f"#SBATCH --nodes={nodes}\n"
        f"#SBATCH --ntasks-per-node={tasks_per_node}\n"
        f"#SBATCH --cpus-per-task={cpus_per_task}\n"
        f"{gres}"
        f"#SBATCH --time={time}\n"
        "set -euo pipefail\n"
        "# host1:N,host2:N from the nodes Slurm gave this job\n"
        'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/:$SLURM_NTASKS_PER_NODE/" | paste -sd, -)\n'
        f'horovodrun -np "$SLURM_NTASKS" -H "$hosts" --gloo {program}\n'
    )


def script_command(script: str, *, nodes: Sequence[str], environ: Mapping[str, str],
                   program: str = "horovodrun") -> list[str]:
    """The command a batch script's ``program`` line would start, as bash expands it inside an
    allocation of ``nodes`` with the Slurm variables ``environ``: the script runs in bash up to that
    line (``scontrol show hostnames`` answers with ``nodes``), and the line prints its words instead of
    running. Nothing is started; pass the result to :func:`dry_run`."""
    lines = script.splitlines()
    starts = [i for i, line in enumerate(lines) if line.split()[:1] == [program]]
    if len(starts) != 1:
        raise ValueError(f"the script has {len(starts)} lines that run {program}, not one")
    lines[starts[0]] = "printf '%s\\0' " + lines[starts[0]]
    stand_in = "scontrol() { printf '%s\\n' " + " ".join(shlex.quote(n) for n in nodes) + "; }\n"
    done = subprocess.run(["bash", "-c", stand_in + "\n".join(lines[:starts[0] + 1])], capture_output=True, text=True,
                          timeout=30, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ})
    if done.returncode != 0:
        raise ValueError(f"the script failed before its {program} line: {done.stderr.strip()[-300:]}")
    return done.stdout.split("\0")[:-1]


def check_shell(script: str) -> None:
    """Raise ValueError with bash's message if ``script`` is not valid bash (``bash -n``)."""
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    if done.returncode != 0:
        raise ValueError(f"the script is not valid bash: {done.stderr.strip().splitlines()[-1]}")


def _this_machine() -> set[str]:
    names = set(_LOCAL_NAMES)
    with contextlib.suppress(OSError):
        names |= {socket.gethostname(), socket.getfqdn()}
    return names


def check_local_hosts(hosts: str | None, num_workers: int, *, hostfile: str | os.PathLike | None = None) -> None:
    """Refuse, in one line, hosts (``-H`` or a host file) that are not names of this machine or offer
    fewer slots than ``num_workers`` (what :func:`mgpu.runtime.launch.run` can honour)."""
    parsed = _parse(hosts, hostfile)
    foreign = [h.hostname for h in parsed if h.hostname not in _this_machine()]
    if foreign:
        raise ValueError(f"{', '.join(foreign)}: not this machine. The course's launcher runs workers on this "
                         "machine's names only (localhost, 127.0.0.1); start a job on other machines with the "
                         "horovodrun command of notebook 10")
    _assign(parsed, num_workers)
