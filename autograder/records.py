"""The grader's records and the course's lock: what ``grade`` writes and ``certify`` reads.

Each graded submission leaves one record, ``COURSE_DIR/autograder/<assignment>/<student>.json``
(the :class:`autograder.grade.Verdict` as JSON), written whole to a temporary file and renamed
(:func:`write_record`). :func:`load_verdicts` reads them back; a file that is not JSON is skipped.

One process at a time works on a course: ``grade`` holds ``COURSE_DIR/.grader.lock`` while it runs
submissions, and ``certify`` holds it while the signing key is loaded, so the key is never in
memory while a run is alive (:func:`course_lock`). Both modules use this one; neither imports the
other's internals. This module imports nothing that runs a notebook.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path

from autograder import course as course_mod
from autograder import report

#: The course's lock file, in its root folder.
LOCK_FILE = ".grader.lock"


def load_verdicts(results_dir: Path) -> list[dict]:
    verdicts = []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            verdicts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return verdicts


def write_record(results_dir: Path, record: dict) -> None:
    """``record`` as ``results_dir/<student>.json``, written whole (temporary file, then renamed)."""
    report.write_atomically(Path(results_dir) / f"{record['student']}.json", json.dumps(record, indent=1))


@contextmanager
def exclusive(path: Path, busy_message: str):
    """Hold an exclusive lock on ``path`` (made if missing), or raise CourseError(busy_message)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise course_mod.CourseError(busy_message) from None
        yield
    finally:
        os.close(fd)


def course_lock(course_root: Path, who: str, then: str):
    """:func:`exclusive` on the course's lock (``COURSE_DIR/.grader.lock``); when another process holds
    it, CourseError("<who> is working on <course> (lock <path>): <then>")."""
    lock = Path(course_root) / LOCK_FILE
    return exclusive(lock, f"{who} is working on {course_root} (lock {lock}): {then}")
