"""Command line: ``python -m autograder grade|practice|calibrate|certify|keys|verify|revoke|page``.

``grade COURSE_DIR --assignment A --profile P --workers N`` grades every submission under
``COURSE_DIR/submitted/<student>/<assignment>/`` (or first imports a folder or zip of notebooks with
``--submissions``); with ``--backend slurm --shared-dir DIR [--partition P] [--account A]`` the
notebooks run as a Slurm job array (:mod:`autograder.slurm`) and the rest stays here. It then prints one line per student and where the gradebook, the CSV and the HTML
report are. Graded submissions, passed or not, give exit status 0. ``grade`` never loads the
signing key: it notes which passes are eligible for a certificate. The profile is the course's
calibrated row (``COURSE_DIR/autograder/profiles.json``) when it has one, else the built-in practice
row; an official row calibrated on other hardware is refused unless ``--allow-other-hardware``.

``practice NOTEBOOK --profile P --workers N`` grades one notebook the way ``grade`` would, in a private
copy of the course (:mod:`autograder.practice`), and prints what the grader would say: exit status 0
for a pass, 1 otherwise; no certificate.

``calibrate COURSE_DIR --profile P --workers N --dataset D --runs R`` grades the reference solution R
times on this machine and writes the profile row it measured, with its calibration, into
``COURSE_DIR/autograder/profiles.json`` (:mod:`autograder.calibrate`).

Certificates (:mod:`autograder.certificates`):

- ``certify COURSE_DIR --assignment A --profile P --workers N [--key PEM]`` signs them afterwards
  (:mod:`autograder.certify`), in a process that runs no submission code: it refuses while a
  grader holds the course, then prints one line per certificate issued and where they are;
- ``keys init [--course COURSE_DIR | --key-dir DIR] [--force]`` makes the course's signing key pair
  and prints the public key (never the private one);
- ``verify CERT [--public-key PEM | --course COURSE_DIR] [--revoked FILE]`` checks a certificate's
  .pdf or .json: ``VALID: ...`` and status 0, or ``INVALID: <reason>`` and status 1;
- ``revoke CERT_ID --reason "..." [--course COURSE_DIR | --revoked FILE]`` adds it to the list;
- ``page [--course COURSE_DIR | --public-key PEM] [--revoked FILE] [--out FILE]`` writes the static
  HTML page that checks a certificate in a browser (:mod:`autograder.verify_page`), with the public
  key and the revocation list as it is now embedded (default: COURSE/autograder/verify.html).

Bad input gives one line naming the fix and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_grade_parser(sub)
    _add_practice_parser(sub)
    _add_calibrate_parser(sub)
    _add_certify_parser(sub)
    _add_certificate_commands(sub)
    return parser


def _add_grade_parser(sub) -> None:
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
    grade.add_argument("--allow-other-hardware", action="store_true",
                       help="grade with an official row calibrated on other hardware (its target and budget may not hold)")
    grade.add_argument("--backend", choices=["local", "slurm"], default="local",
                       help="where the notebooks run: this machine (default), or a Slurm cluster as a job array")
    grade.add_argument("--shared-dir", help="slurm: a folder every node sees at the same path (default: "
                       "shared_dir in COURSE/autograder/slurm.json)")
    grade.add_argument("--partition", help="slurm: the partition to submit to (default: the cluster's)")
    grade.add_argument("--account", help="slurm: the account to charge (default: yours)")


def _add_practice_parser(sub) -> None:
    practice = sub.add_parser("practice", help="grade your own notebook the way the grader would, before submitting")
    practice.add_argument("notebook", help="your assessment.ipynb")
    practice.add_argument("--course", default="assignments", help="the course folder whose profiles apply "
                          "(default: assignments)")
    practice.add_argument("--profile", default="cpu")
    practice.add_argument("--workers", type=int, default=2)
    practice.add_argument("--keep", action="store_true", help="keep the private graded copy (under build/)")
    practice.add_argument("--no-isolation", action="store_true", help="run without the sandbox's namespaces")


def _add_calibrate_parser(sub) -> None:
    calibrate = sub.add_parser("calibrate", help="measure a profile row on this machine from the reference solution")
    calibrate.add_argument("course_dir", help="the nbgrader course folder (this repo's: assignments/)")
    calibrate.add_argument("--assignment", default="assessment")
    calibrate.add_argument("--profile", required=True, help="the row's name, e.g. gpu")
    calibrate.add_argument("--workers", type=int, required=True)
    calibrate.add_argument("--dataset", required=True, help="mgpu.runtime.data name (a real one makes an official row)")
    calibrate.add_argument("--runs", type=int, default=5, help="reference runs, one at a time (default 5)")
    calibrate.add_argument("--train-images", type=int, default=6000)
    calibrate.add_argument("--val-images", type=int, default=1000)
    calibrate.add_argument("--test-images", type=int, default=2000)
    calibrate.add_argument("--margin", type=float, default=1.5, help="budget = this x the slowest run's time to target")
    calibrate.add_argument("--accuracy-margin", type=float, default=0.02,
                           help="target = the weakest run's two-epoch accuracy less this (or less 3 standard "
                                "errors of an epoch's held-out accuracy, if more)")
    calibrate.add_argument("--no-isolation", action="store_true")


def _add_certify_parser(sub) -> None:
    certify = sub.add_parser("certify", help="sign the certificates of the eligible passes (after grade)")
    certify.add_argument("course_dir", help="the nbgrader course folder (this repo's: assignments/)")
    certify.add_argument("--assignment", default="assessment")
    certify.add_argument("--profile", default="cpu", help="the profile the passes were graded on")
    certify.add_argument("--workers", type=int, default=2, help="the Horovod workers they were graded with")
    certify.add_argument("--key", help="the signing key (default: COURSE_DIR/.keys/signing_key.pem), e.g. "
                         "on removable media")
    certify.add_argument("--allow-other-hardware", action="store_true",
                         help="sign passes graded with an official row calibrated on other hardware")


def grade_command(args) -> int:
    """``grade``: every submission of the assignment, one line per student, then where the reports are."""
    from autograder.course import CourseError

    if not os.path.isdir(args.course_dir):
        print(f"error: no course folder {args.course_dir}: pass the folder that holds nbgrader_config.py "
              "and source/ (this repo's is assignments/)", file=sys.stderr)
        return 2
    profile = _profile(args.course_dir, args.profile, args.workers, args.allow_other_hardware)
    if profile is None:
        return 2
    if args.jobs is not None and args.jobs < 1:
        print("error: --jobs must be at least 1", file=sys.stderr)
        return 2

    from autograder import grade as grading

    try:
        runner = None
        if args.backend == "slurm":
            from autograder import slurm

            runner = slurm.SlurmRunner(slurm.ClusterSettings.load(
                args.course_dir, shared_dir=args.shared_dir, partition=args.partition, account=args.account))
            signal.signal(signal.SIGTERM, _stopped)  # cancel the jobs on the way out
        elif args.shared_dir or args.partition or args.account:
            print("error: --shared-dir, --partition and --account are for --backend slurm", file=sys.stderr)
            return 2
        verdicts = grading.grade_course(args.course_dir, args.assignment, profile,
                                        submissions=args.submissions, force=args.force, jobs=args.jobs,
                                        isolate=not args.no_isolation, timeout_s=args.timeout,
                                        progress=not args.no_progress, runner=runner)
    except CourseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for v in verdicts:
        print(f"{v.student:<24} {'PASS' if v.passed else 'FAIL'}  {v.score:4.1f}/{v.max_score:.0f}  "
              f"{v.total_seconds:5.0f} s  {v.reason}"
              + (f"  [certificate {v.certificate}]" if v.certificate else ""))
    results = os.path.join(os.path.abspath(args.course_dir), "autograder", args.assignment)
    print(f"gradebook: {os.path.join(os.path.abspath(args.course_dir), 'gradebook.db')}\n"
          f"csv:       {os.path.join(results, 'grades.csv')}\nreport:    {os.path.join(results, 'report.html')}")
    return 0


def _stopped(signum, frame):
    """SIGTERM as an exception, so that the grader's clean-up (cancelling its Slurm jobs) runs."""
    raise SystemExit(128 + signum)


def _add_certificate_commands(sub) -> None:
    keys = sub.add_parser("keys", help="the course's certificate signing key")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    init = keys_sub.add_parser("init", help="make the signing key pair (private key mode 0600)")
    where = init.add_mutually_exclusive_group()
    where.add_argument("--course", default="assignments", help="course folder: keys go to COURSE/.keys/ "
                       "(default: assignments)")
    where.add_argument("--key-dir", help="put the key pair in this folder instead")
    init.add_argument("--force", action="store_true",
                      help="replace an existing key (certificates signed with it stop verifying)")

    verify = sub.add_parser("verify", help="check a certificate's signature and revocation")
    verify.add_argument("cert", help="the certificate's .pdf or .json")
    key = verify.add_mutually_exclusive_group()
    key.add_argument("--public-key", help="the course's public_key.pem (no revocation list unless --revoked)")
    key.add_argument("--course", default="assignments", help="course folder: its .keys/public_key.pem and "
                     "autograder/revoked.txt (default: assignments)")
    verify.add_argument("--revoked", help="revocation list (default with --course: COURSE/autograder/revoked.txt)")

    revoke = sub.add_parser("revoke", help="add a certificate ID to the revocation list")
    revoke.add_argument("certificate_id", help="the 32 hex digits of the certificate's file name")
    revoke.add_argument("--reason", required=True, help="one line, shown when the certificate is verified")
    where = revoke.add_mutually_exclusive_group()
    where.add_argument("--course", default="assignments", help="course folder: COURSE/autograder/revoked.txt "
                       "(default: assignments)")
    where.add_argument("--revoked", help="the revocation list file instead")

    page = sub.add_parser("page", help="write the HTML page that checks a certificate in a browser")
    key = page.add_mutually_exclusive_group()
    key.add_argument("--course", default="assignments", help="course folder: its .keys/public_key.pem and "
                     "autograder/revoked.txt; the page goes to COURSE/autograder/verify.html (default: assignments)")
    key.add_argument("--public-key", help="the course's public_key.pem instead (no revocation list unless --revoked)")
    page.add_argument("--revoked", help="the revocation list to embed (default with --course: "
                      "COURSE/autograder/revoked.txt)")
    page.add_argument("--out", help="the page to write (default: COURSE/autograder/verify.html; with --public-key: "
                      "verify.html in the current folder)")


def _profile(course_dir, name: str, workers: int, allow_other_hardware: bool):
    """The course's calibrated row, else the built-in one; None after printing why neither applies."""
    from autograder import calibrate

    try:
        profile, calibration = calibrate.resolve_profile(course_dir, name, workers,
                                                         allow_other_hardware=allow_other_hardware)
    except calibrate.CalibrationError as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    if calibration:
        print(f"profile {name} ({workers} workers): calibrated on {calibration.get('hardware', {}).get('summary', '?')}, "
              f"{calibration.get('date', '?')} ({calibrate.rows_path(course_dir)})", file=sys.stderr)
    return profile


def practice_command(args) -> int:
    """``practice``: one notebook graded in a private copy of the course; status 0 for a pass, 1 otherwise."""
    from autograder import practice
    from autograder.course import CourseError

    if not os.path.isdir(args.course):
        print(_no_course(args.course, "--course COURSE_DIR"), file=sys.stderr)
        return 2
    profile = _profile(args.course, args.profile, args.workers, allow_other_hardware=True)
    if profile is None:
        return 2
    try:
        verdict = practice.practice(args.notebook, profile, keep=args.keep, isolate=not args.no_isolation,
                                    log=lambda *a, **k: None)
    except (practice.PracticeError, CourseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(practice.summary(verdict))
    return 0 if verdict.passed else 1


def calibrate_command(args) -> int:
    """``calibrate``: a profile row measured from the reference solution, written into the course."""
    from autograder import calibrate
    from autograder.course import CourseError

    if not os.path.isdir(args.course_dir):
        print(_no_course(args.course_dir, "the course folder"), file=sys.stderr)
        return 2
    for flag, value, low in (("--runs", args.runs, 2), ("--workers", args.workers, 1), ("--train-images", args.train_images, 1),
                             ("--val-images", args.val_images, 1), ("--test-images", args.test_images, 1)):
        if value < low:
            print(f"error: {flag} must be at least {low}", file=sys.stderr)
            return 2
    if args.margin < 1:
        print("error: --margin must be at least 1 (the budget covers the slowest reference run)", file=sys.stderr)
        return 2
    command = "python -m autograder calibrate " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else [])
    try:
        row, path = calibrate.calibrate(args.course_dir, args.profile, args.workers, args.dataset, args.runs,
                                        train_images=args.train_images, val_images=args.val_images,
                                        test_images=args.test_images, margin=args.margin,
                                        accuracy_margin=args.accuracy_margin, assignment=args.assignment,
                                        isolate=not args.no_isolation, command=command.strip())
    except (calibrate.CalibrationError, CourseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyError as error:  # an unknown dataset name
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 2
    runs = row["calibration"]["runs"]
    held = [r["streak_accuracy"] for r in runs]
    reached = ", ".join(f"{r['reached_target_s']:.0f}" for r in runs)
    kind = "official" if row["official"] else "practice"
    print(f"{kind} row {row['name']} / {row['dataset']} / {row['workers']} workers -> {path}")
    print(f"  target {row['target_accuracy']:.2f} (the reference held {min(held):.3f}-{max(held):.3f} for two epochs), "
          f"budget {row['time_budget_s']} s (it reached the target at {reached} s), timeout {row['timeout_s']} s, "
          f"memory {row['memory_limit_mb']} MB")
    print(f"  on {row['calibration']['hardware']['summary']}")
    return 0


def _no_course(course_dir: str, instead: str) -> str:
    return (f"error: no course folder {course_dir}: pass the folder that holds nbgrader_config.py (this repo's "
            f"is assignments/) or {instead}")


def certify_command(args) -> int:
    """``certify``: signs the eligible passes' certificates, once grading has finished."""
    from autograder import certificates, certify
    from autograder.course import CourseError
    from mgpu import assessment

    if not os.path.isdir(args.course_dir):
        print(f"error: no course folder {args.course_dir}: pass the folder that holds nbgrader_config.py "
              "and autograder/ (this repo's is assignments/)", file=sys.stderr)
        return 2
    profile = _profile(args.course_dir, args.profile, args.workers, args.allow_other_hardware)
    if profile is None:
        return 2
    try:
        certify.issue_certificates(args.course_dir, args.assignment, profile, key_path=args.key)
    except (CourseError, certificates.CertificateError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def keys_command(args) -> int:
    """``keys init``: the course's signing key pair; prints the public key."""
    from autograder import certificates

    try:
        if args.key_dir is None and not os.path.isdir(args.course):
            print(_no_course(args.course, "--key-dir DIR"), file=sys.stderr)
            return 2
        key_dir = args.key_dir or certificates.default_key_dir(args.course)
        private_path, public_path = certificates.init_keys(key_dir, force=args.force)
        public_key = certificates.load_public_key(public_path)
        print(f"signing key (private, mode 0600, keep it secret): {private_path}\n"
              f"public key:  {public_path}\nkey id:      {certificates.key_id(public_key)}\n\n"
              f"{certificates.public_pem(public_key)}\n"
              "Publish the public key: anyone can then check a certificate with\n"
              "  python -m autograder verify CERT.pdf --public-key public_key.pem")
        return 0
    except certificates.CertificateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def verify_command(args) -> int:
    """``verify``: VALID and status 0, or INVALID: <reason> and status 1."""
    from autograder import certificates

    try:
        if not os.path.isfile(args.cert):
            print(f"error: no certificate file {args.cert}: pass the certificate's .pdf or .json", file=sys.stderr)
            return 2
        if args.public_key is None and not os.path.isdir(args.course):
            print(_no_course(args.course, "--public-key PEM"), file=sys.stderr)
            return 2
        public_key = certificates.load_public_key(
            args.public_key or certificates.default_key_dir(args.course) / certificates.PUBLIC_KEY_FILE)
        revoked_path = args.revoked or (None if args.public_key
                                        else certificates.default_revocation_list(args.course))
        revoked = certificates.read_revocations(revoked_path) if revoked_path else {}
        verification = certificates.verify(args.cert, public_key, revoked)
        if not verification.valid:
            print(f"INVALID: {verification.reason}")
            return 1
        print(f"VALID: {verification.reason.removeprefix('valid: ')}")
        for name, value in verification.certificate.items():
            print(f"  {name:<20} {value}")
        return 0
    except certificates.CertificateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def revoke_command(args) -> int:
    """``revoke``: adds a certificate ID to the revocation list."""
    from autograder import certificates

    try:
        if args.revoked is None and not os.path.isdir(args.course):
            print(_no_course(args.course, "--revoked FILE"), file=sys.stderr)
            return 2
        path = args.revoked or certificates.default_revocation_list(args.course)
        if certificates.revoke(path, args.certificate_id, args.reason):
            print(f"revoked {args.certificate_id.strip().lower()}: {args.reason}\n-> {path}")
        else:
            reason = certificates.read_revocations(path)[args.certificate_id.strip().lower()]
            print(f"{args.certificate_id.strip().lower()} was already revoked ({reason}): {path} unchanged")
        return 0
    except certificates.CertificateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def page_command(args) -> int:
    """``page``: the static HTML page that checks a certificate in a browser."""
    from autograder import certificates

    try:
        return _write_page(args)
    except certificates.CertificateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _write_page(args) -> int:
    from autograder import certificates, verify_page

    if args.public_key is None and not os.path.isdir(args.course):
        print(_no_course(args.course, "--public-key PEM"), file=sys.stderr)
        return 2
    public_key = certificates.load_public_key(
        args.public_key or certificates.default_key_dir(args.course) / certificates.PUBLIC_KEY_FILE)
    if args.revoked is not None and not os.path.isfile(args.revoked):
        print(f"error: no revocation list {args.revoked}: pass the course's revoked.txt, or leave --revoked out",
              file=sys.stderr)
        return 2
    revoked_path = args.revoked or (None if args.public_key else certificates.default_revocation_list(args.course))
    revoked = certificates.read_revocations(revoked_path) if revoked_path else {}
    out = args.out or (verify_page.PAGE_FILE if args.public_key else verify_page.default_page_path(args.course))
    if os.path.isdir(out):
        print(f"error: {out} is a folder: pass the page's file name with --out, e.g. "
              f"{os.path.join(out, verify_page.PAGE_FILE)}", file=sys.stderr)
        return 2
    try:
        path = verify_page.write_page(out, public_key, revoked)
    except OSError as error:
        print(f"error: cannot write {out} ({error.strerror or error}): pass another file with --out", file=sys.stderr)
        return 2
    listed = (f"{len(revoked)} revoked certificate(s), as {revoked_path} lists them now" if revoked_path
              else "none (pass --revoked FILE to embed one)")
    print(f"page:            {path.resolve()}\nkey id:          {certificates.key_id(public_key)}\n"
          f"revocation list: {listed}\n\n"
          "Publish it beside public_key.pem: opened in any browser (a file:// URL too), it checks a certificate's\n"
          ".pdf or .json with nothing sent anywhere. Revoking later needs a new page, or a newer revoked.txt\n"
          "loaded in the page.")
    return 0


#: Each subcommand's function.
COMMANDS = {"grade": grade_command, "practice": practice_command, "calibrate": calibrate_command,
            "certify": certify_command, "keys": keys_command, "verify": verify_command, "revoke": revoke_command,
            "page": page_command}


if __name__ == "__main__":
    raise SystemExit(main())
