"""How long does grading take? The demonstration cohort, graded with one command, timed.

Builds a fresh copy of the course (``assignments/``) in ``build/autograder_benchmark/``, writes the
five-submission demonstration cohort (:mod:`autograder.cohort`), runs

    python -m autograder grade COURSE --assignment assessment --profile P --workers N

as a subprocess on the wall clock, and reads the grader's records. It prints, and writes to
``build/results/autograder_benchmark.json`` (with ``--only``: ``autograder_<students>_<profile>_<workers>.json``):

- ``cohort_seconds``: the whole command (start-up, release, data, every submission, reports);
- ``overhead_s_per_submission``: mean over submissions of the grader's total time for it minus the
  notebook's own run (validation, restore, measurement, autograde, feedback);
- ``cohort_size`` and ``correct_verdicts`` (pass/fail and reasons as :data:`autograder.cohort.EXPECTED`);
- the reference solution's measured run (the numbers that justify the profile's target and budget):
  its held-out accuracy per epoch and when the target was reached on the grader's clock.

    python benchmarks/autograder_cohort.py                        # cpu profile, 2 workers, 5 submissions
    python benchmarks/autograder_cohort.py --only reference       # re-measure the reference alone
    python benchmarks/autograder_cohort.py --assignment zero1     # Assessment B's cohort

Assessment B's cohort (:func:`autograder.cohort.zero1_notebooks`, ``--assignment zero1``): the
reference (passes), the release, unsharded (fails), and ``tests/redteam_zero1/fake_sharded.py``, which
does not shard but says it does (fails); written to ``build/results/autograder_benchmark_zero1.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="grade only these demo students (default: all five)")
    parser.add_argument("--assignment", default="assessment", choices=["assessment", "zero1"])
    args = parser.parse_args(argv)

    from autograder import cohort
    from autograder import course as course_mod
    from mgpu.runtime import paths, results

    course_dir = paths.build_dir() / "autograder_benchmark" / "course"
    shutil.rmtree(course_dir, ignore_errors=True)
    course_mod.copy_course(course_dir, args.assignment)
    if args.assignment == "zero1":
        fake = (ROOT / "tests" / "redteam_zero1" / "fake_sharded.py").read_text()
        students = cohort.write_demo_cohort(course_dir, "zero1",
                                            cohort.zero1_notebooks(course_dir, {"fake_sharded": fake}))
        expected = cohort.EXPECTED_ZERO1
    else:
        students = cohort.write_demo_cohort(course_dir)
        expected = cohort.EXPECTED
    for student in set(students) - set(args.only or students):
        shutil.rmtree(course_dir / "submitted" / student)
    students = sorted(args.only or students)

    command = [sys.executable, "-m", "autograder", "grade", str(course_dir), "--assignment", args.assignment,
               "--profile", args.profile, "--workers", str(args.workers)]
    print("$", " ".join(command), flush=True)
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    cohort_seconds = time.monotonic() - started
    if done.returncode != 0:
        print(f"the grader failed with status {done.returncode}", file=sys.stderr)
        return 1

    records = {s: json.loads((course_dir / "autograder" / args.assignment / f"{s}.json").read_text())
               for s in students}
    correct = 0
    for student, record in records.items():
        passes, words = expected[student]
        ok = record["passed"] is passes and all(w in record["reason"] for w in words)
        correct += ok
        print(f"{student:<15} {'pass' if record['passed'] else 'fail'}  {'as expected' if ok else 'UNEXPECTED'}"
              f"  notebook {record['notebook_seconds']:5.1f} s  overhead {record['overhead_seconds']:4.1f} s"
              f"  {record['reason'][:110]}")
    overheads = [r["overhead_seconds"] for r in records.values()]
    values = {
        "assignment": args.assignment, "profile": args.profile, "workers": args.workers,
        "cohort_size": len(records), "cohort_seconds": cohort_seconds, "correct_verdicts": correct,
        "overhead_s_per_submission": statistics.mean(overheads),
        "overhead_s_max": max(overheads),
        "notebook_seconds": {s: r["notebook_seconds"] for s, r in records.items()},
    }
    reference = records.get("reference")
    if reference and args.assignment == "zero1":
        measured = reference["measured"]["zero1"]
        values["reference_weights_max_abs_diff"] = measured["weights_max_abs_diff"]
        values["reference_state_over_dp"] = max(measured["state_bytes_per_rank"].values()) / measured["state_dp_bytes"]
        values["reference_comm_over_dp"] = measured["comm_over_dp"]
    elif reference:
        values["reference_reached_seconds"] = reference["reached_seconds"]
        values["reference_best_accuracy"] = reference["accuracy"]
        values["reference_notebook_seconds"] = reference["notebook_seconds"]
        values["reference_accuracy_by_epoch"] = {str(e["epoch"]): e["accuracy"] for e in reference["epochs"]}
        values["reference_seen_s_by_epoch"] = {str(e["epoch"]): e["seconds"] for e in reference["epochs"]}
        values["target_accuracy"] = reference["target_accuracy"]
        values["time_budget_s"] = reference["time_budget_s"]
    # The whole cohort is the benchmark; a partial run (--only) is kept apart so it never replaces it.
    stem = ("autograder_benchmark" if not args.only
            else f"autograder_{'_'.join(students)}_{args.profile}_{args.workers}")
    if args.assignment != "assessment":
        stem += f"_{args.assignment}"
    path = results.write_results(stem, values, dataset=None, smoke=args.profile == "cpu", seed=0)
    print(f"\ncohort of {len(records)} graded in {cohort_seconds:.0f} s; grader overhead "
          f"{values['overhead_s_per_submission']:.1f} s per submission (mean); {correct}/{len(records)} "
          f"verdicts as expected\n-> {path}")
    return 0 if correct == len(records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
