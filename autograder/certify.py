"""Signing certificates, in a step of its own: ``python -m autograder certify``.

``grade`` runs the students' notebooks and never loads the course's signing key: it only notes in
each record whether the pass can earn a certificate. ``certify`` signs afterwards, in a process
that runs no submission code: it refuses while a grader holds the course (it takes the course's
lock, ``COURSE_DIR/.grader.lock``, so no run is alive while the key is loaded), reads the records
in ``COURSE_DIR/autograder/<assignment>/`` (both through :mod:`autograder.records`, which ``grade``
uses too), checks each again with
:func:`autograder.certificates.why_no_certificate` and signs one certificate for every eligible
pass that has none yet. It imports nothing that runs a notebook (no TensorFlow, papermill,
nbclient or nbgrader: the student's name is read from the gradebook with SQLAlchemy), so the key
is never in the memory of a process that runs, or has just run, submission code.

The key is ``COURSE_DIR/.keys/signing_key.pem`` unless ``key_path`` (``--key``) names another,
e.g. on removable media kept off the grading machine.
"""

from __future__ import annotations

from pathlib import Path

from autograder import certificates, report
from autograder import records as records_mod
from autograder import course as course_mod


def command(course_dir, assignment: str, profile) -> str:
    """The command line that signs the certificates of ``profile``'s passes in this course."""
    return (f"python -m autograder certify {course_dir} --assignment {assignment} --profile {profile.name} "
            f"--workers {profile.workers}")


def _course_directory(root: Path):
    """The ``CourseDirectory`` section of the course's ``nbgrader_config.py`` (read with traitlets alone)."""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = Config()
    if (root / "nbgrader_config.py").exists():
        config.merge(PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config())
    return config.CourseDirectory


def _student_name(db_url: str, student: str) -> str:
    """The student's first and last name in the gradebook, or their ID when it has none.

    Read with SQLAlchemy, not nbgrader's API, which would import nbconvert's notebook runner.
    """
    import sqlalchemy

    url = sqlalchemy.engine.make_url(db_url)
    if url.get_backend_name() == "sqlite" and not Path(url.database or "").is_file():
        return student  # connecting would create an empty gradebook
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as connection:
            row = connection.execute(sqlalchemy.text("SELECT first_name, last_name FROM student WHERE id = :id"),
                                     {"id": student}).first()
    except sqlalchemy.exc.SQLAlchemyError:
        row = None
    finally:
        engine.dispose()
    name = " ".join(n for n in (row or ()) if n)
    return name.strip() or student


def issue_certificates(course_dir, assignment: str, profile, *, key_path=None, log=print) -> list[str]:
    """A signed certificate for every pass of ``profile`` that earns one and has none yet; returns the students.

    Refuses (:class:`course_mod.CourseError`) while a grader holds the course, and when there are no
    records; a missing or unusable key raises :class:`certificates.CertificateError`. Records graded
    under another profile or number of workers are left alone; a record that cannot earn a
    certificate gets the reason in its ``certificate_note``.
    """
    root = Path(course_dir).resolve()
    results = root / "autograder" / assignment
    if not results.is_dir():
        raise course_mod.CourseError(f"no records in {results}: grade the assignment first (python -m autograder "
                                     f"grade {course_dir} --assignment {assignment} ...)")
    key_path = Path(key_path) if key_path else certificates.default_key_dir(root) / certificates.PRIVATE_KEY_FILE
    if not key_path.is_file():
        raise certificates.CertificateError(f"no signing key {key_path}: make one with python -m autograder keys "
                                            f"init --course {course_dir}, or pass --key PATH to it")
    with records_mod.course_lock(root, "a grader", "certify once it has finished"):
        section = _course_directory(root)
        course_id = str(section.get("course_id") or root.name)
        db_url = str(section.get("db_url") or f"sqlite:///{root / 'gradebook.db'}")
        out_dir = results / "certificates"
        records = records_mod.load_verdicts(results)
        issued, changed = [], False
        private_key = None
        for record in records:
            on_profile = (record.get("profile"), record.get("workers")) == (profile.name, profile.workers)
            if record.get("certificate") or not on_profile:
                continue
            why = certificates.why_no_certificate(profile, bool(record.get("dataset_real")),
                                                  bool(record.get("passed")), record.get("isolation", ""),
                                                  certificates.accuracy_in_time(record))
            if why is None:
                if private_key is None:
                    private_key = certificates.load_private_key(key_path)
                files = certificates.issue({
                    "name": _student_name(db_url, record["student"]), "student_id": record["student"],
                    "course": certificates.COURSE_NAME, "course_id": course_id,
                    "assignment": record["assignment"], "accuracy": float(record["accuracy"]),
                    "target_accuracy": float(record["target_accuracy"]),
                    "reached_seconds": float(record["reached_seconds"]),
                    "time_budget_s": float(record["time_budget_s"]), "profile": record["profile"],
                    "workers": int(record["workers"]), "dataset": record["dataset"],
                    "dataset_fingerprint": record["dataset_fingerprint"],
                    "submission_sha256": record["submission_sha256"],
                    "grader_version": certificates.grader_version(),
                    "calibration": record.get("calibration") or profile.calibration}, private_key, out_dir)
                record["certificate"], record["certificate_note"] = files.json.stem, ""
                issued.append(record["student"])
                log(f"{record['student']:<24} certificate {files.json.stem}  {files.pdf}")
            elif record.get("certificate_note") == why:
                continue
            else:
                record["certificate_note"] = why
            records_mod.write_record(results, record)
            changed = True
        if changed:
            report.write_reports(results, records, profile, report.refused_imports(results))
        if issued:
            log(f"issued {len(issued)} certificate(s) into {out_dir}")
        else:
            log(f"no certificate issued: no pass graded on profile {profile.name} with {profile.workers} workers "
                f"in {results} is due one (each record's certificate_note says why)")
    return issued
