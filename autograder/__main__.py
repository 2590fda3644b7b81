"""Command line: ``python -m autograder grade|certify|keys|verify|revoke``.

``grade COURSE_DIR --assignment A --profile P --workers N`` grades every submission under
``COURSE_DIR/submitted/<student>/<assignment>/`` (or first imports a folder or zip of notebooks with
``--submissions``), then prints one line per student and where the gradebook, the CSV and the HTML
report are. Graded submissions, passed or not, give exit status 0. ``grade`` never loads the
signing key: it notes which passes are eligible for a certificate.

Certificates (:mod:`autograder.certificates`):

- ``certify COURSE_DIR --assignment A --profile P --workers N [--key PEM]`` signs them afterwards
  (:mod:`autograder.certify`), in a process that runs no submission code: it refuses while a
  grader holds the course, then prints one line per certificate issued and where they are;
- ``keys init [--course COURSE_DIR | --key-dir DIR] [--force]`` makes the course's signing key pair
  and prints the public key (never the private one);
- ``verify CERT [--public-key PEM | --course COURSE_DIR] [--revoked FILE]`` checks a certificate's
  .pdf or .json: ``VALID: ...`` and status 0, or ``INVALID: <reason>`` and status 1;
- ``revoke CERT_ID --reason "..." [--course COURSE_DIR | --revoked FILE]`` adds it to the list.

Bad input gives one line naming the fix and exit status 2.
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
    certify = sub.add_parser("certify", help="sign the certificates of the eligible passes (after grade)")
    certify.add_argument("course_dir", help="the nbgrader course folder (this repo's: assignments/)")
    certify.add_argument("--assignment", default="assessment")
    certify.add_argument("--profile", default="cpu", help="the profile the passes were graded on")
    certify.add_argument("--workers", type=int, default=2, help="the Horovod workers they were graded with")
    certify.add_argument("--key", help="the signing key (default: COURSE_DIR/.keys/signing_key.pem), e.g. "
                         "on removable media")
    _add_certificate_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "certify":
        return _certify_command(args)
    if args.command != "grade":
        return _certificate_command(args)

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
              f"{v.total_seconds:5.0f} s  {v.reason}"
              + (f"  [certificate {v.certificate}]" if v.certificate else ""))
    results = os.path.join(os.path.abspath(args.course_dir), "autograder", args.assignment)
    print(f"gradebook: {os.path.join(os.path.abspath(args.course_dir), 'gradebook.db')}\n"
          f"csv:       {os.path.join(results, 'grades.csv')}\nreport:    {os.path.join(results, 'report.html')}")
    return 0


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


def _no_course(course_dir: str, instead: str) -> str:
    return (f"error: no course folder {course_dir}: pass the folder that holds nbgrader_config.py (this repo's "
            f"is assignments/) or {instead}")


def _certify_command(args) -> int:
    from autograder import certificates, certify
    from autograder.course import CourseError
    from mgpu import assessment

    if not os.path.isdir(args.course_dir):
        print(f"error: no course folder {args.course_dir}: pass the folder that holds nbgrader_config.py "
              "and autograder/ (this repo's is assignments/)", file=sys.stderr)
        return 2
    try:
        profile = assessment.profile(args.profile, args.workers)
    except KeyError as error:
        print(f"error: {error.args[0]}", file=sys.stderr)
        return 2
    try:
        certify.issue_certificates(args.course_dir, args.assignment, profile, key_path=args.key)
    except (CourseError, certificates.CertificateError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def _certificate_command(args) -> int:
    from autograder import certificates

    try:
        if args.command == "keys":
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
        if args.command == "verify":
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
        # revoke
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


if __name__ == "__main__":
    raise SystemExit(main())
