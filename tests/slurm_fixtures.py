"""The `slurm_cluster` fixture: a two-node Slurm cluster on this machine (scripts/slurm_cluster.py)
for the module that asks for it, in a folder of its own, always brought down after the module.
Skipped, with the apt-get command, only where Slurm's packages are not installed."""

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from mgpu.lesson10.slurm_horovod import ACTIVE_STATES, cluster_script

script = cluster_script()  # scripts/slurm_cluster.py


@dataclass
class SlurmCluster:
    folder: Path
    env: dict  # os.environ with SLURM_CONF (the fixture also sets it in os.environ while it lives)
    setup_seconds: float

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm command (or any) against this cluster, with a timeout: never waits forever."""
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout, check=check)

    def job(self, job_id: str) -> dict[str, str]:
        """scontrol's fields of a job (slurmctld keeps a finished one for MinJobAge, 10 minutes)."""
        fields = self.run("scontrol", "show", "job", "-o", job_id, timeout=15).stdout.split()
        return dict(field.split("=", 1) for field in fields if "=" in field)

    def submit(self, *args: str) -> str:
        """sbatch ARGS; the job's id."""
        return self.run("sbatch", "--parsable", *args, timeout=30).stdout.strip().split(";")[0]

    def wait(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        """{job or array element: final state} once all have ended, asking squeue every 0.1 s
        (sbatch --wait asks 2 s after submitting, then 8 s and 32 s later)."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.run("squeue", "-h", "-r", "-j", job_id, "-t", "all", "-o", "%i %T", timeout=15).stdout
            states = dict(line.split() for line in out.splitlines())
            if states and not ACTIVE_STATES & set(states.values()):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm job {job_id} is still {states} after {timeout} s")
            time.sleep(0.1)

    def down(self) -> list[str]:
        """Stop the cluster; what is still there (nothing, normally)."""
        return script.down(self.folder)

    def processes(self) -> list[int]:
        return script.processes(self.folder)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    if script.missing():
        pytest.skip(f"Slurm is not installed ({', '.join(script.missing())} missing): {script.INSTALL}")
    folder = tmp_path_factory.mktemp("slurm-cluster")
    start = time.monotonic()
    try:
        env = script.up(folder)
        cluster = SlurmCluster(folder, env, time.monotonic() - start)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", env["SLURM_CONF"])
            yield cluster
    finally:
        left = script.down(folder)
        assert not left, f"the Slurm cluster in {folder} left {left}"
