"""Command line: ``python -m autograder grade COURSE_DIR --assignment A --profile P --workers N``.

Grades every submission under ``COURSE_DIR/submitted/<student>/<assignment>/`` (or first imports a
folder or zip of notebooks with ``--submissions``), then prints one line per student and where
the gradebook, the CSV and the HTML report are. Bad input gives one line naming the fix and exit
status 2; graded submissions, passed or not, give 0.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    grade = sub.add_parser("grade", help="grade every submission of an assignment")
    grade.add_argument("course_dir", help="the nbgrader course folder (this repo's: assignments/)")
    grade.add_argument("--assignment", default="assessment")
    grade.add_argument("--profile", default="cpu", help="row of mgpu.assessment.PROFILES (cpu, ...)")
    grade.add_argument("--workers", type=int, default=2, help="Horovod workers per submission")
    grade.add_argument("--submissions", help="a folder or zip of notebooks to import into submitted/ first")
    grade.add_argument("--force", action="store_true", help="regrade submissions already graded")
    grade.add_argument("--jobs", type=int, default=None,
                       help="submissions graded at once (default: cores // workers on cpu, else 1)")
    grade.add_argument("--timeout", type=float, default=None, help="seconds before a run is killed "
                       "(default: the profile's)")
    grade.add_argument("--no-isolation", action="store_true",
                       help="run without the network/mount namespaces (debugging only)")
    grade.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    from autograder.course import CourseError
    from mgpu import assessment

    if not os.path.isdir(args.course_dir):
        print(f"error: no course folder {args.course_dir}: pass the folder that holds nbgrader_config.py "
              "and source/ (this repo's is assignments/)", file=sys.stderr)
        return 2
    try:
        profile = assessment.profile(args.profile, args.workers)
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print("error: --jobs must be at least 1", file=sys.stderr)
        return 2

    from autograder import grade as grading

    try:
        verdicts = grading.grade_course(args.course_dir, args.assignment, profile,
                                        submissions=args.submissions, force=args.force, jobs=args.jobs,
                                        isolate=not args.no_isolation, timeout_s=args.timeout,
                                        progress=not args.no_progress)
    except CourseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for v in verdicts:
        print(f"{v.student:<24} {'PASS' if v.passed else 'FAIL'}  {v.score:4.1f}/{v.max_score:.0f}  "
              f"{v.total_seconds:5.0f} s  {v.reason}")
    results = os.path.join(os.path.abspath(args.course_dir), "autograder", args.assignment)
    print(f"gradebook: {os.path.join(os.path.abspath(args.course_dir), 'gradebook.db')}\n"
          f"csv:       {os.path.join(results, 'grades.csv')}\nreport:    {os.path.join(results, 'report.html')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
