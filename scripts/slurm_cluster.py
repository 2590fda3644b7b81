"""A throw-away two-node Slurm cluster on this one machine, for the tests (and, later, for grading
submissions as Slurm jobs and running multi-node Horovod jobs under Slurm).

    python scripts/slurm_cluster.py up|down|status [--dir DIR]      (default DIR: build/slurm-cluster)

`up` writes slurm.conf, gres.conf and cgroup.conf into DIR, which holds everything the cluster
uses (state, spool, logs, pid files, its own munge key and socket), starts munged, slurmctld and
two slurmd (nodes n1 and n2 on free ports of 127.0.0.1, each with 2 CPUs, 12288 MB and two fake
GPUs, Gres=gpu:2; declared, not measured: each job is held to its own --mem), waits until both nodes are idle and prints the SLURM_CONF to export: Slurm's
commands find this cluster only through it. `down` stops all of it, removes the cgroup folders
slurmd made (slurm_n1, slurm_n2) and is safe to call twice or after a crash. `status` says what runs.

The daemons run as the current user (root: slurmd needs it for cgroups), without systemd, on
cgroup v1. It installs nothing; Debian's packages are:
apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge
Importable: up(folder) returns the environment for Slurm's commands; down(folder) what was left.
"""

import argparse
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "build" / "slurm-cluster"
NODES = ("n1", "n2")
CPUS, MEMORY_MB, GPUS = 2, 12288, 2  # per node, whatever the machine has (SlurmdParameters=config_overrides)
INSTALL = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
COMMANDS = ("munged", "slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "srun")
MARK = "MGPU_SLURM_CLUSTER"  # in the daemons' environment, and so in slurmstepd's: finds them all
CGROUPS = Path("/sys/fs/cgroup")


class ClusterError(RuntimeError):
    """The cluster could not be brought up: why, in the first line (the logs' tails may follow)."""


def _which(name: str) -> str | None:  # the daemons are in /usr/sbin, which a PATH may lack
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin:/usr/bin")


def missing() -> list[str]:
    """The commands the cluster needs that are not installed."""
    return [name for name in COMMANDS if _which(name) is None]


def client_env(folder=DEFAULT_DIR) -> dict:
    """os.environ with SLURM_CONF pointing Slurm's commands at this cluster."""
    return {**os.environ, "SLURM_CONF": str(Path(folder).resolve() / "slurm.conf")}


def pid_files(folder=DEFAULT_DIR) -> dict[str, Path]:
    run = Path(folder).resolve() / "run"
    return {"munged": run / "munged.pid", "slurmctld": run / "slurmctld.pid",
            **{f"slurmd {n}": run / f"slurmd-{n}.pid" for n in NODES}}


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name: state, parent, process group..., or []."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _alive(pid) -> bool:
    return bool(pid) and _stat(pid)[:1] not in ([], ["Z"])  # a zombie has ended (init reaps it)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _marked() -> dict[int, str]:
    """{pid: cluster folder} of the live processes whose environment carries MARK."""
    mine, pid = {os.getpid()}, os.getpid()
    while pid > 1:  # never this process or its ancestors, whatever their environment
        pid = int(_stat(pid)[1])
        mine.add(pid)
    found, prefix = {}, f"{MARK}=".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine:
            try:
                marks = [v for v in (entry / "environ").read_bytes().split(b"\0") if v.startswith(prefix)]
            except OSError:
                continue
            if marks and _alive(int(entry.name)):
                found[int(entry.name)] = marks[0][len(prefix):].decode()
    return found


def processes(folder=DEFAULT_DIR) -> list[int]:
    """The live processes of the cluster in folder: its daemons and what they started."""
    return sorted(pid for pid, owner in _marked().items() if owner == str(Path(folder).resolve()))


def cgroup_folders() -> list[Path]:
    """The cgroup v1 folders of nodes n1 and n2 (slurm_n1, slurm_n2 in each controller)."""
    return sorted(d for ctl in CGROUPS.iterdir() for n in NODES if (d := ctl / f"slurm_{n}").is_dir())


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:  # all bound at once: distinct
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def write_config(folder: Path) -> None:
    munge = folder / "munge"
    for sub in ["state", "log", "run", "tmp", "dev", "munge", *(f"spool/{n}" for n in NODES)]:
        (folder / sub).mkdir(parents=True, exist_ok=True)
    munge.chmod(0o711)  # munged refuses a socket folder that not everyone may enter
    key = munge / "munge.key"
    if not key.exists():  # a key of its own: nothing in /etc/munge is used
        key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    ctld_port, *node_ports = _free_ports(1 + len(NODES))
    nodes, gres = [], ["AutoDetect=off"]
    for node, port in zip(NODES, node_ports):
        nodes.append(f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                     f"CPUs={CPUS} RealMemory={MEMORY_MB} Gres=gpu:{GPUS} State=UNKNOWN")
        for i in range(GPUS):  # fake GPUs: character devices like /dev/null (CUDA_VISIBLE_DEVICES
            device = folder / "dev" / f"{node}-gpu{i}"  # stays unset with plain files)
            if not device.exists():
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        gres.append(f"NodeName={node} Name=gpu File={folder}/dev/{node}-gpu[0-{GPUS - 1}]")
    (folder / "slurm.conf").write_text("\n".join([
        "ClusterName=mgpu", f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}", "SlurmUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge}/munge.socket",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool/%n",
        f"SlurmctldPidFile={folder}/run/slurmctld.pid", f"SlurmdPidFile={folder}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/log/slurmctld.log", f"SlurmdLogFile={folder}/log/slurmd-%n.log",
        f"TmpFS={folder}/tmp", "SlurmdParameters=config_overrides", "MailProg=/bin/true",
        "ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup", "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory", "GresTypes=gpu",
        f"DefMemPerCPU={MEMORY_MB // CPUS}", "MpiDefault=none", "ReturnToService=2",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        # No database (sacct has none): scontrol keeps a finished job 10 minutes, jobcomp.txt for good.
        "MinJobAge=600", "JobCompType=jobcomp/filetxt", f"JobCompLoc={folder}/log/jobcomp.txt",
        "KillWait=2", "MessageTimeout=10", "SlurmdTimeout=60", "InactiveLimit=0",
        *nodes, f"PartitionName=main Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP", ""]))
    (folder / "gres.conf").write_text("\n".join(gres + [""]))
    (folder / "cgroup.conf").write_text("\n".join([  # --mem enforced; the fake GPUs are not devices to fence
        "CgroupPlugin=cgroup/v1", f"CgroupMountpoint={CGROUPS}", "ConstrainRAMSpace=yes",
        "ConstrainSwapSpace=yes", "AllowedSwapSpace=0", "ConstrainCores=no", "ConstrainDevices=no", ""]))


def node_states(folder=DEFAULT_DIR) -> dict[str, str]:
    """{node: state} as sinfo reports it ({} if slurmctld does not answer)."""
    try:
        out = subprocess.run([_which("sinfo"), "-h", "-N", "-o", "%N %T"], env=client_env(folder),
                             capture_output=True, text=True, timeout=10).stdout
    except subprocess.TimeoutExpired:
        return {}
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def up(folder=DEFAULT_DIR, timeout: float = 30) -> dict:
    """Start the cluster in folder; return the environment for Slurm's commands (SLURM_CONF set)."""
    if missing():
        raise ClusterError(f"Slurm is not installed ({', '.join(missing())} missing): {INSTALL}")
    if os.geteuid() != 0:
        raise ClusterError("slurmd must run as root here (it makes cgroups and runs jobs as their users)")
    if not (CGROUPS / "memory" / "tasks").exists():
        raise ClusterError(f"no cgroup v1 memory controller in {CGROUPS} (Slurm 22.05's cgroup v2 needs systemd)")
    folder = Path(folder).resolve()
    others = set(_marked().values()) - {str(folder)}
    if others:  # the nodes' names, and so their cgroup folders, would be the same
        raise ClusterError(f"another Slurm cluster runs from {others.pop()}: stop it first (down --dir)")
    down(folder)  # whatever a crash left in this folder
    write_config(folder)
    munge, conf = folder / "munge", str(folder / "slurm.conf")
    # --force: munged wants every folder above its socket open to all, not so pytest's 0700 tmp folders.
    commands = [[_which("munged"), "--force", f"--socket={munge}/munge.socket", f"--key-file={munge}/munge.key",
                 f"--pid-file={pid_files(folder)['munged']}", f"--log-file={folder}/log/munged.log",
                 f"--seed-file={munge}/munged.seed"],
                [_which("slurmctld"), "-c", "-f", conf], *([_which("slurmd"), "-N", n, "-f", conf] for n in NODES)]
    deadline, states = time.monotonic() + timeout, {}
    try:
        for command in commands:  # each daemonizes: the command returns once the daemon has forked
            done = subprocess.run(command, env={**client_env(folder), MARK: str(folder)}, capture_output=True,
                                  text=True, timeout=timeout)
            if done.returncode:
                output = (done.stderr + done.stdout).strip()
                raise ClusterError(f"{Path(command[0]).name} exited {done.returncode}: {output}")
        while time.monotonic() < deadline:
            states = node_states(folder)
            if all(states.get(n) == "idle" for n in NODES):
                return client_env(folder)
            time.sleep(0.2)
        raise ClusterError(f"nodes not idle after {timeout:g} s (sinfo: {states or 'no answer'})")
    except (ClusterError, subprocess.TimeoutExpired) as error:
        tails = [f"  {log.name}: {line}" for log in sorted((folder / "log").glob("*.log"))
                 for line in log.read_text(errors="replace").splitlines()[-5:]]
        down(folder)
        raise ClusterError("\n".join([f"Slurm cluster in {folder} did not start: {error}", *tails])) from None


def _wait_gone(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _kill(pids, sig, group=False) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig) if group and os.getpgid(pid) == pid else os.kill(pid, sig)
        except OSError:
            pass


def down(folder=DEFAULT_DIR) -> list[str]:
    """Stop everything the cluster in folder runs and remove its cgroup folders; return what is
    still there (nothing, normally). Safe to call twice, or on a folder where nothing runs."""
    folder = Path(folder).resolve()
    files = pid_files(folder)
    ours = set(processes(folder))  # a pid file of a crashed cluster may name someone else's process now
    daemons = [p for name, f in files.items() if name != "munged" and (p := _pid(f)) in ours]
    if _pid(files["slurmctld"]) in ours:
        try:  # stops slurmctld and both slurmd
            subprocess.run([_which("scontrol"), "shutdown"], env=client_env(folder), capture_output=True, timeout=15)
        except subprocess.TimeoutExpired:
            pass
        _wait_gone(daemons, 10)
    for sig in (signal.SIGTERM, signal.SIGKILL):  # each daemon leads its own process group (setsid)
        _kill([p for p in daemons if _alive(p)], sig, group=True)
        if not _wait_gone(daemons, 5):
            break
    munged = _pid(files["munged"])
    # slurmstepd and job processes that outlived slurmd: by environment, then by cgroup.
    _kill([p for p in processes(folder) if p != munged], signal.SIGKILL)
    alone = not set(_marked().values()) - {str(folder)}  # else slurm_n1, slurm_n2 are another cluster's
    if alone:
        _remove_cgroups()
    if munged in ours:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            _kill([munged], sig)
            if not _wait_gone([munged], 5):
                break
    left = [f"process {p}" for p in _wait_gone(processes(folder), 5)]
    left += [f"cgroup {d}" for d in cgroup_folders() if alone]
    for f in files.values():
        f.unlink(missing_ok=True)
    return left


def _remove_cgroups(seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while (folders := cgroup_folders()) and time.monotonic() < deadline:
        for top in folders:
            for state in top.rglob("freezer.state"):  # a frozen process cannot die
                try:
                    state.write_text("THAWED")
                except OSError:
                    pass
            _kill([int(p) for procs in top.rglob("cgroup.procs") for p in procs.read_text().split()], signal.SIGKILL)
            for path, _, _ in sorted(os.walk(top), key=lambda walked: -len(walked[0])):  # deepest first
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        time.sleep(0.1)


def status(folder=DEFAULT_DIR) -> tuple[bool, str]:
    """(all four daemons run, a report: each daemon, the nodes, all processes and cgroup folders)."""
    folder = Path(folder).resolve()
    pids = {name: _pid(path) for name, path in pid_files(folder).items()}
    lines = [f"Slurm cluster in {folder}:"]
    lines += [f"  {name}: " + (f"running (pid {pid})" if _alive(pid) else "not running") for name, pid in pids.items()]
    if _alive(pids["slurmctld"]):
        lines.append("  nodes: " + (", ".join(f"{n} {s}" for n, s in node_states(folder).items()) or "no answer"))
    lines.append(f"  its processes: {', '.join(map(str, processes(folder))) or 'none'}")
    lines.append(f"  cgroup folders of n1, n2: {', '.join(map(str, cgroup_folders())) or 'none'}")
    return all(map(_alive, pids.values())), "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the cluster's folder (%(default)s)")
    args = parser.parse_args(argv)
    folder = args.dir.resolve()
    if args.command == "up":
        start = time.monotonic()
        try:
            up(folder)
        except ClusterError as error:
            print(f"slurm_cluster: {error}", file=sys.stderr)
            return 1
        print(f"Slurm cluster up in {time.monotonic() - start:.1f} s: nodes {' '.join(NODES)} idle, "
              f"{CPUS} CPUs, {MEMORY_MB} MB and gpu:{GPUS} (fake) each.\n"
              f"Use it with:  export SLURM_CONF={folder / 'slurm.conf'}\n"
              f"Stop it with: python {sys.argv[0]} down --dir {folder}")
        return 0
    if args.command == "down":
        left = down(folder)
        print(f"Slurm cluster in {folder}: " + (f"still there: {', '.join(left)}" if left else "stopped"))
        return 1 if left else 0
    ok, report = status(folder)
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
