"""What does grading through Slurm cost? The same cohort graded locally and as a Slurm job array, side by side.

Brings up the project's two-node test cluster (``scripts/slurm_cluster.py``, in
``build/autograder_slurm/cluster``; root and Debian's Slurm packages needed), builds two fresh
copies of the course with the cluster cohort of :func:`autograder.cohort.cluster_notebooks`
(reference, unconverted, time_out), and grades one with

    python -m autograder grade COURSE --profile cpu --workers 2 --timeout T

and the other with ``--backend slurm --shared-dir ...`` added, in this order, on the wall clock.
It prints, and writes to ``build/results/autograder_slurm.json``:

- ``cluster_up_s`` / ``cluster_down_s``: bringing the test cluster up (until both nodes are idle)
  and down (no daemon, process or cgroup folder left);
- ``cohort_local_s`` / ``cohort_slurm_s``: the whole grading command, each backend;
- ``overhead_local_s`` / ``overhead_slurm_s``: per submission that ran, the grader's time on it
  minus the notebook's own run and (Slurm) its wait in the queue, averaged: for Slurm this is the
  node's runner (data in, results out), the poller's delay and reading the result back;
- ``queue_slurm_s``: each element's wait from sbatch until the grader saw it running;
- ``trivial_array_s``: an array of 4 elements that run ``true`` (``--cpus-per-task=1``), from
  sbatch to the last one's end, asking squeue every 0.1 s: Slurm's own cost per job here;
- ``same_verdicts``: whether both backends gave every student the same pass/fail, status and score.

    python benchmarks/autograder_slurm.py [--timeout 60]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _grade(course_dir: Path, timeout: float, env: dict, *extra: str) -> tuple[float, dict]:
    command = [sys.executable, "-m", "autograder", "grade", str(course_dir), "--profile", "cpu", "--workers", "2",
               "--timeout", str(timeout), "--no-progress", *extra]
    print("$", " ".join(command), flush=True)
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30 * 60)
    seconds = time.monotonic() - start
    print(done.stdout, end="", flush=True)
    if done.returncode:
        raise SystemExit(f"grading failed ({done.returncode}): {done.stderr[-2000:]}")
    records = {p.stem: json.loads(p.read_text())
               for p in (course_dir / "autograder" / "assessment").glob("*.json") if p.stem not in ("grades",)}
    return seconds, {s: r for s, r in records.items() if "student" in r}


def _trivial_array(env: dict, count: int = 4) -> float:
    start = time.monotonic()
    job = subprocess.run(["sbatch", "--parsable", f"--array=0-{count - 1}", "--cpus-per-task=1", "--mem=50M",
                          "-o", "/dev/null", "--wrap", "true"], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    while True:
        out = subprocess.run(["squeue", "-h", "-r", "-j", job, "-t", "all", "-o", "%T"], env=env,
                             capture_output=True, text=True).stdout.split()
        if len(out) == count and all(s == "COMPLETED" for s in out):
            return time.monotonic() - start
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60, help="the runs' time-out (s), both backends")
    args = parser.parse_args(argv)

    from autograder import cohort
    from autograder import course as course_mod
    from mgpu.lesson10 import slurm_horovod
    from mgpu.runtime import paths, results

    script = slurm_horovod.cluster_script()
    base = paths.build_dir() / "autograder_slurm"
    shutil.rmtree(base / "courses", ignore_errors=True)
    courses = {name: base / "courses" / name for name in ("local", "slurm")}
    for course_dir in courses.values():
        course_mod.copy_course(course_dir)
        cohort.write_demo_cohort(course_dir, notebooks=cohort.cluster_notebooks(course_dir))
    shared = base / "shared"
    shared.mkdir(parents=True, exist_ok=True)

    figures: dict[str, object] = {}
    start = time.monotonic()
    env = script.up(base / "cluster")
    figures["cluster_up_s"] = round(time.monotonic() - start, 2)
    try:
        figures["trivial_array_s"] = round(_trivial_array(env), 2)
        figures["cohort_local_s"], local = _grade(courses["local"], args.timeout, env)
        figures["cohort_slurm_s"], on_slurm = _grade(courses["slurm"], args.timeout, env, "--backend", "slurm",
                                                     "--shared-dir", str(shared))
    finally:
        start = time.monotonic()
        left = script.down(base / "cluster")
        figures["cluster_down_s"] = round(time.monotonic() - start, 2)
    if left:
        print(f"the cluster left {left}", file=sys.stderr)
    for name, records in (("local", local), ("slurm", on_slurm)):
        figures[f"overhead_{name}_s"] = round(statistics.mean(
            r["overhead_seconds"] for r in records.values() if r["notebook_seconds"] > 0), 2)
    figures["queue_slurm_s"] = {s: r["queue_seconds"] for s, r in sorted(on_slurm.items())}
    keys = ("passed", "run_status", "score")
    figures["same_verdicts"] = sorted(local) == sorted(on_slurm) and all(
        [local[s][k] for k in keys] == [on_slurm[s][k] for k in keys] for s in local)
    figures["timeout_s"] = args.timeout
    for student in sorted(local):
        print(f"{student:<12} local: notebook {local[student]['notebook_seconds']:5.1f} s, grader "
              f"{local[student]['total_seconds']:5.1f} s | slurm ({on_slurm[student]['slurm_job']} on "
              f"{on_slurm[student]['run_host']}): queued {on_slurm[student]['queue_seconds']:4.1f} s, notebook "
              f"{on_slurm[student]['notebook_seconds']:5.1f} s, grader {on_slurm[student]['total_seconds']:5.1f} s")
    print(json.dumps(figures, indent=1))
    print(results.write_results("autograder_slurm", figures, smoke=False, seed=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
