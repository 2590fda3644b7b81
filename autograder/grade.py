"""Grading a cohort: validate, restore, run, measure, autograde, feed back, report.

:func:`grade_course` is what ``python -m autograder grade`` calls. For each submission in
``submitted/<student>/<assignment>/`` it:

1. validates the notebook (:mod:`autograder.validate`) and restores its locked cells from the
   gradebook with nbgrader's checksums (reported as "locked cell modified: restored");
2. runs it in a fresh work folder holding only that notebook, a data folder with the training and
   validation arrays, and an empty output folder (:mod:`autograder.sandbox`), with papermill's
   parameters set from the profile;
3. measures every saved epoch on the held-out test split (:mod:`autograder.measure`), on the
   grader's clock: total time is the grader's clock from starting the notebook's process, and the
   outcome's time is when the epoch completing the 2-epoch streak was first seen;
4. writes the outcome into the outcome cell, gives unexecuted test cells an error, and runs
   nbgrader's autograde (no execution) and generate_feedback;
5. writes ``autograder/<assignment>/<student>.json`` and, for the cohort, ``grades.csv`` and
   ``report.html`` (:mod:`autograder.report`).

A rerun skips every submission already graded from the same notebook file (by SHA-256) unless
``force``. Several submissions run at once when the machine has cores for several jobs.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from autograder import course as course_mod
from autograder import measure, report, sandbox, validate
from mgpu import assessment


@dataclass
class Verdict:
    """One submission's grade, as recorded in ``autograder/<assignment>/<student>.json``."""

    student: str
    assignment: str
    submission_sha256: str
    passed: bool
    reasons: list[str]
    outcome_passed: bool = False         # the grader's measurement alone (tests aside)
    score: float = 0.0
    max_score: float = 0.0
    cell_scores: dict = field(default_factory=dict)
    run_status: str = ""
    accuracy: float | None = None        # best measured held-out accuracy
    reached_seconds: float | None = None  # grader's clock at the epoch completing the streak
    notebook_seconds: float = 0.0        # the notebook's own run (papermill process), grader's clock
    total_seconds: float = 0.0           # everything the grader did for this submission
    epochs: list = field(default_factory=list)  # [{epoch, seconds, accuracy, rejected}]
    restored_cells: list = field(default_factory=list)
    peak_memory_mb: float = 0.0
    isolation: str = ""
    profile: str = ""
    workers: int = 0
    target_accuracy: float = 0.0
    time_budget_s: float = 0.0
    feedback: str = ""
    graded_at: str = ""

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def overhead_seconds(self) -> float:
        return self.total_seconds - self.notebook_seconds


def load_verdicts(results_dir: Path) -> list[dict]:
    verdicts = []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            verdicts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return verdicts


def default_jobs(workers: int, profile_name: str) -> int:
    """Submissions graded at once: one per ``workers`` cores on CPU, one otherwise."""
    from mgpu.launch import available_cores

    return max(1, available_cores() // workers) if profile_name == "cpu" else 1


class CohortGrader:
    """Grades the submissions of one assignment of one course under one profile."""

    def __init__(self, course_dir, assignment: str, profile: assessment.Profile, *, isolate: bool = True,
                 timeout_s: float | None = None, log=print):
        self.course = course_mod.Course(course_dir, assignment)
        self.profile = profile
        self.isolate = isolate
        self.timeout_s = timeout_s or profile.timeout_s
        self.log = log
        self.notebook_id = self.course.notebook_ids()[0]
        self._nbgrader_lock = threading.Lock()
        self._data_ready = False

    # ------------------------------------------------------------------------------ set-up

    def prepare(self, work_root: Path) -> None:
        """Release + gradebook, the held-out data and the measuring model (once per cohort)."""
        from mgpu import data

        self.course.ensure_release()
        self.required_cells = self.course.source_cells(self.notebook_id)
        self.work_root = work_root
        dataset = data.load(self.profile.dataset, verbose=False)
        self.data_template = work_root / "data-template"
        x_test, y_test = assessment.export_data(dataset, self.data_template, self.profile.train_images,
                                                self.profile.val_images, self.profile.test_images)
        self.dataset_name, self.fingerprint = dataset.name, dataset.fingerprint
        self.measurer = measure.Measurer(x_test, y_test, dataset.image_shape, dataset.num_classes)
        # What the run must not see: the course (gradebook, source, other students), the data cache.
        keep = [Path(sys.prefix).resolve(), sandbox.REPO_ROOT / "mgpu", work_root]
        candidates = [self.course.root, data.cache_dir()]
        self.hidden = [p.resolve() for p in candidates if p.exists()
                       and not any(_inside(k, p.resolve()) for k in keep)]

    # ---------------------------------------------------------------------- one submission

    def needs_grading(self, student: str, force: bool) -> bool:
        if force:
            return True
        record = self.course.results_dir() / f"{student}.json"
        notebook = self.course.submitted_dir(student) / f"{self.notebook_id}.ipynb"
        if not record.exists() or not notebook.exists() or not self.course.is_graded(student):
            return True
        try:
            previous = json.loads(record.read_text())
        except ValueError:
            return True
        return previous.get("submission_sha256") != course_mod.file_sha256(notebook)

    def grade(self, student: str) -> Verdict:
        started = time.monotonic()
        submitted = self.course.submitted_dir(student)
        path = submitted / f"{self.notebook_id}.ipynb"
        verdict = Verdict(student, self.course.assignment,
                          course_mod.file_sha256(path) if path.exists() else "", False, [],
                          profile=self.profile.name, workers=self.profile.workers,
                          target_accuracy=self.profile.target_accuracy,
                          time_budget_s=self.profile.time_budget_s)
        try:
            notebook = validate.load_submission(path, self.required_cells)
        except validate.InvalidSubmission as error:
            verdict.reasons.append(f"rejected: {error}")
            verdict.run_status = "invalid"
            # nbgrader still records the submission, with zeros: grade the release, unexecuted.
            notebook = nbformat.read(self.course.release_dir() / f"{self.notebook_id}.ipynb", as_version=4)
            self.course.restore_locked_cells(notebook, self.notebook_id)
            course_mod.mark_unexecuted_tests(notebook, "the submission was rejected")
            course_mod.set_outcome(notebook, False, ["not run: the submission was rejected"], str(error))
            return self._finish(verdict, notebook, started)

        verdict.restored_cells = self.course.restore_locked_cells(notebook, self.notebook_id)
        if verdict.restored_cells:
            verdict.reasons.append(f"locked cell modified: restored ({', '.join(verdict.restored_cells)})")

        # One failing test must not stop papermill before the other tests and the outcome cell.
        for cell in course_mod.grade_cells(notebook):
            tags = cell.metadata.setdefault("tags", [])
            if "raises-exception" not in tags:
                tags.append("raises-exception")
        work = Path(tempfile.mkdtemp(prefix=f"{student[:20]}-", dir=self.work_root))
        try:
            shutil.copytree(self.data_template, work / "data")
            (work / "output").mkdir()
            nbformat.write(notebook, work / f"{self.notebook_id}.ipynb")
            parameters = {"workers": self.profile.workers, "profile": self.profile.name, "data_dir": "data",
                          "output_dir": "output", "time_budget_s": float(self.profile.time_budget_s),
                          "target_accuracy": float(self.profile.target_accuracy)}
            run = sandbox.run_notebook(work / f"{self.notebook_id}.ipynb", parameters,
                                       output_dir=work / "output", timeout_s=self.timeout_s,
                                       memory_limit_mb=self.profile.memory_limit_mb, hide=self.hidden,
                                       work_parent=self.work_root, isolate=self.isolate)
            verdict.notebook_seconds = run.seconds
            verdict.run_status = run.status
            verdict.peak_memory_mb = run.peak_memory_mb
            verdict.isolation = run.isolation
            if run.status != "ok":
                verdict.reasons.insert(0, run.reason)
            epochs = self.measurer.measure(work / "output", run.epoch_seen_s)
        finally:
            shutil.rmtree(work, ignore_errors=True)

        outcome = measure.decide(epochs, self.profile.target_accuracy, self.profile.time_budget_s)
        verdict.epochs = [asdict(e) for e in outcome.epochs]
        verdict.accuracy = outcome.best_accuracy
        verdict.reached_seconds = outcome.reached_seconds

        executed = nbformat.reads(run.notebook, as_version=4) if run.notebook else notebook
        why = run.reason or "an earlier cell failed"
        course_mod.mark_unexecuted_tests(executed, why)
        lines = [f"Measured by the grader on {len(self.measurer.y_test)} held-out test images "
                 f"({self.dataset_name}); target {self.profile.target_accuracy:.3f} for "
                 f"{assessment.CONSECUTIVE_EPOCHS} consecutive epochs within {self.profile.time_budget_s:.0f} s.",
                 "epoch  seen at (s)  accuracy"]
        lines += [f"{e.epoch:5d}  {e.seconds:11.1f}  " + (f"{e.accuracy:.3f}" if e.accuracy is not None
                                                           else f"rejected: {e.rejected}")
                  for e in outcome.epochs]
        lines.append(("PASSED: " if outcome.passed else "NOT REACHED: ") + outcome.reason)
        course_mod.set_outcome(executed, outcome.passed, lines, outcome.reason)
        if not outcome.passed:
            verdict.reasons.append(outcome.reason)
        verdict.passed = verdict.outcome_passed = outcome.passed  # tests are added in _finish
        return self._finish(verdict, executed, started)

    def _finish(self, verdict: Verdict, executed, started: float) -> Verdict:
        timestamp = self.course.submitted_dir(verdict.student) / "timestamp.txt"
        course_mod.condense_test_tracebacks(executed)
        with self._nbgrader_lock:
            self.course.autograde(verdict.student, executed, self.notebook_id, timestamp)
            scores = self.course.scores(verdict.student)
            feedback = self.course.feedback(verdict.student)
        verdict.cell_scores = {k: list(v) for k, v in scores.items()}
        verdict.score = sum(s for s, _ in scores.values())
        verdict.max_score = sum(m for _, m in scores.values())
        failed_tests = [_test_failure(cell) for cell in course_mod.grade_cells(executed)
                        if cell.metadata["nbgrader"]["grade_id"] != course_mod.OUTCOME_CELL
                        and scores.get(cell.metadata["nbgrader"]["grade_id"], (0, 1))[0]
                        < scores.get(cell.metadata["nbgrader"]["grade_id"], (0, 1))[1]]
        if verdict.run_status == "ok":  # after a failed run, the run's reason says it all
            verdict.reasons.extend(failed_tests)
        verdict.passed = bool(verdict.passed and not failed_tests and verdict.run_status == "ok")
        verdict.feedback = str(feedback) if feedback else ""
        verdict.total_seconds = time.monotonic() - started
        verdict.graded_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        folder = self.course.results_dir()
        folder.mkdir(parents=True, exist_ok=True)
        record = asdict(verdict) | {"reason": verdict.reason, "overhead_seconds": verdict.overhead_seconds}
        report.write_atomically(folder / f"{verdict.student}.json", json.dumps(record, indent=1))
        return verdict


def _inside(path: Path, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(folder)
        return True
    except ValueError:
        return False


def _test_failure(cell) -> str:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            value = str(output.get("evalue", "")).strip().splitlines()
            return f"test {cell.metadata['nbgrader']['grade_id']} failed: {output.get('ename')}: " \
                   f"{value[0] if value else ''}"
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            return f"test {cell.metadata['nbgrader']['grade_id']} wrote to stderr (nbgrader scores that 0)"
    return f"test {cell.metadata['nbgrader']['grade_id']} failed"


def grade_course(course_dir, assignment: str, profile: assessment.Profile, *, submissions=None,
                 force: bool = False, jobs: int | None = None, isolate: bool = True,
                 timeout_s: float | None = None, progress: bool = True, log=print) -> list[Verdict]:
    """Grade every (new or changed) submission; write the CSV and HTML reports; return the verdicts."""
    grader = CohortGrader(course_dir, assignment, profile, isolate=isolate, timeout_s=timeout_s, log=log)
    if submissions is not None:
        imported = grader.course.import_submissions(submissions)
        log(f"imported {len(imported)} submission(s) into {grader.course.root / 'submitted'}")
    students = grader.course.students()
    if not students:
        raise course_mod.CourseError(f"no submissions in {grader.course.root / 'submitted'}/<student>/"
                                     f"{assignment}/: collect them there or pass --submissions FOLDER_OR_ZIP")
    todo = [s for s in students if grader.needs_grading(s, force)]
    skipped = len(students) - len(todo)
    if skipped:
        log(f"skipping {skipped} submission(s) already graded (unchanged); --force regrades them")
    verdicts: list[Verdict] = []
    if todo:
        jobs = jobs or default_jobs(profile.workers, profile.name)
        ok, note = sandbox.isolation_available() if isolate else (False, "isolation switched off")
        if not ok:
            log(f"note: {note}")
        work_root = Path(tempfile.mkdtemp(prefix="mgpu-grade-"))
        try:
            grader.prepare(work_root)
            from tqdm import tqdm

            bar = tqdm(total=len(todo), desc="grading", unit="submission", disable=not progress,
                       file=sys.stderr)
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = {pool.submit(grader.grade, s): s for s in todo}
                for future in as_completed(futures):
                    try:
                        verdict = future.result()
                    except Exception as error:  # a grader fault must not lose the rest of the cohort
                        log(f"grader error on {futures[future]} (not recorded; a rerun retries it): "
                            f"{type(error).__name__}: {error}")
                        bar.update()
                        continue
                    verdicts.append(verdict)
                    bar.set_postfix_str(f"{verdict.student}: {'pass' if verdict.passed else 'fail'}")
                    bar.update()
            bar.close()
        finally:
            shutil.rmtree(work_root, ignore_errors=True)
    records = load_verdicts(grader.course.results_dir())
    report.write_reports(grader.course.results_dir(), records, profile)
    return sorted(verdicts, key=lambda v: v.student)
