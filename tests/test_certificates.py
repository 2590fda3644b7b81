"""Signed certificates: keys, issuing (JSON, PDF, PNG), verification against tampering and junk,
revocation, eligibility, the keys/verify/revoke commands, and signing apart from grading (grade
notes, certify signs). Real Ed25519 keys, real files."""

import base64
import dataclasses
import fcntl
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import certificates
from autograder.certificates import FIELDS, CertificateError
from mgpu import assessment

ROOT = Path(__file__).resolve().parents[1]
CHANGED = "the signature does not match: a field was changed after signing"


def _fields(**changes):
    fields = {
        "name": "Ada Lovelace", "student_id": "s1815", "course": certificates.COURSE_NAME,
        "course_id": "mgpu-2026", "assignment": "assessment", "accuracy": 0.8731, "target_accuracy": 0.85,
        "reached_seconds": 59.4, "time_budget_s": 90.0, "profile": "gpu", "workers": 4,
        "dataset": "fashion_mnist", "dataset_fingerprint": "sha256:3f2a9c0d11e4b7a8",
        "submission_sha256": "5e" * 32, "grader_version": "a8ed7363ab4497b1fcabfa14727578cda0387fd6",
        "calibration": "calibrated on 4 x NVIDIA A100-SXM4-40GB 2026-11-26: 5 reference runs reached the target in 41-47 s",
    }
    fields.update(changes)
    return fields


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The course's key pair and a second, unrelated one."""
    folder = tmp_path_factory.mktemp("keys")
    private_path, public_path = certificates.init_keys(folder / "course")
    other_private, other_public = certificates.init_keys(folder / "other")
    return {"private": certificates.load_private_key(private_path),
            "public": certificates.load_public_key(public_path),
            "other_private": certificates.load_private_key(other_private),
            "other_public": certificates.load_public_key(other_public),
            "public_path": public_path, "private_path": private_path}


@pytest.fixture(scope="module")
def issued(keys, tmp_path_factory):
    return certificates.issue(_fields(), keys["private"], tmp_path_factory.mktemp("issued"))


@pytest.fixture
def document(issued):
    return json.loads(issued.json.read_text())


# ------------------------------------------------------------------------------------ issuing

def test_issue_writes_json_pdf_and_png_named_by_the_certificate_id(issued):
    document = json.loads(issued.json.read_text(encoding="utf-8"))
    certificate_id = document["certificate"]["certificate_id"]
    assert certificates.CERTIFICATE_ID.fullmatch(certificate_id)
    assert [p.name for p in (issued.json, issued.pdf, issued.png)] == [f"{certificate_id}.{s}" for s in
                                                                     ("json", "pdf", "png")]
    assert document["format"] == "mgpu-certificate/1" and set(document["certificate"]) == set(FIELDS)
    assert document["certificate"]["issued_at"].endswith("+00:00")
    assert len(base64.b64decode(document["signature"])) == 64
    assert not [p for p in issued.json.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_signed_certificate_verifies_from_the_json_and_from_the_pdf(issued, keys):
    for path in (issued.json, issued.pdf):
        result = certificates.verify(path, keys["public"])
        assert result.valid, result.reason
        assert result.reason.startswith("valid: Ada Lovelace (student s1815), Deep learning on multiple GPUs")
        assert "accuracy 0.873 (target 0.850)" in result.reason
        assert result.certificate == json.loads(issued.json.read_text())["certificate"]


def test_the_pdf_embeds_exactly_the_json_document(issued):
    assert issued.pdf.read_bytes().startswith(b"%PDF-")
    assert certificates.read_certificate(issued.pdf) == json.loads(issued.json.read_text())


def test_the_png_preview_is_an_a4_landscape_image(issued):
    from PIL import Image

    with Image.open(issued.png) as image:
        assert image.format == "PNG"
        width, height = image.size
    assert width >= 1000 and abs(width / height - 297 / 210) < 0.01


def test_whole_numbers_for_measured_values_are_stored_as_floats(keys, tmp_path):
    files = certificates.issue(_fields(time_budget_s=90, accuracy=1), keys["private"], tmp_path)
    certificate = json.loads(files.json.read_text())["certificate"]
    assert certificate["time_budget_s"] == 90.0 and isinstance(certificate["time_budget_s"], float)
    assert certificates.verify(files.json, keys["public"]).valid


@pytest.mark.parametrize("changes, field", [
    ({"accuracy": None}, "accuracy"),
    ({"workers": "4"}, "workers"),
    ({"workers": True}, "workers"),
    ({"name": ""}, "name"),
    ({"name": "Ada\nLovelace"}, "name"),
    ({"submission_sha256": "abc"}, "submission_sha256"),
    ({"issued_at": "2026-11-22T10:00:00"}, "issued_at"),
    ({"certificate_id": "../../etc/passwd"}, "certificate_id"),
    ({"accuracy": 1.5}, "accuracy"),
    ({"accuracy": float("nan")}, "accuracy"),
    ({"favourite_colour": "blue"}, "favourite_colour"),
])
def test_issue_refuses_bad_fields_naming_the_field_and_writes_nothing(keys, tmp_path, changes, field):
    out_dir = tmp_path / "out"
    with pytest.raises(CertificateError, match=field) as error:
        certificates.issue(_fields(**changes), keys["private"], out_dir)
    assert len(str(error.value).splitlines()) == 1
    assert not out_dir.exists()


@pytest.mark.parametrize("missing", [f for f in FIELDS if f not in ("certificate_id", "issued_at")])
def test_issue_with_a_missing_field_writes_nothing(keys, tmp_path, missing):
    fields = _fields()
    del fields[missing]
    with pytest.raises(CertificateError, match=f"field {missing} is missing"):
        certificates.issue(fields, keys["private"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_failure_while_writing_leaves_no_temporary_files(keys, tmp_path, monkeypatch):
    calls = []

    def failing_replace(source, target):
        calls.append(target)
        raise OSError("disk full")

    monkeypatch.setattr(certificates.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        certificates.issue(_fields(), keys["private"], tmp_path)
    assert calls and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------- tampering

def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.001
    return value + "x"


@pytest.mark.parametrize("field", list(FIELDS))
def test_changing_any_single_field_breaks_the_signature(document, keys, field):
    document["certificate"][field] = _changed(document["certificate"][field])
    result = certificates.verify(document, keys["public"])
    assert not result.valid and result.reason == CHANGED and result.certificate is None


def test_a_pdf_whose_embedded_record_was_edited_is_invalid(issued, keys, tmp_path):
    document = json.loads(issued.json.read_text())
    document["certificate"]["accuracy"] = 0.99
    edited = base64.b64encode(json.dumps(document).encode())
    original = base64.b64encode(issued.json.read_bytes())
    forged = tmp_path / "forged.pdf"
    forged.write_bytes(issued.pdf.read_bytes().replace(original, edited))
    assert certificates.verify(forged, keys["public"]).reason == CHANGED
    # Appending a second record (an incremental update) is seen, not resolved in the forger's favour.
    twice = tmp_path / "twice.pdf"
    twice.write_bytes(issued.pdf.read_bytes() + b"\n/Keywords (" + certificates.PDF_MARKER.encode() + edited + b")")
    result = certificates.verify(twice, keys["public"])
    assert not result.valid and "2 different embedded certificates" in result.reason


def test_a_certificate_signed_by_another_key_names_both_key_ids(keys, tmp_path):
    files = certificates.issue(_fields(), keys["other_private"], tmp_path)
    result = certificates.verify(files.pdf, keys["public"])
    other_id, course_id = certificates.key_id(keys["other_public"]), certificates.key_id(keys["public"])
    assert not result.valid
    assert result.reason == f"signed by another key (key id '{other_id}'), not this course's key ({course_id})"


def test_a_forged_key_id_with_another_keys_signature_is_invalid(keys):
    document = certificates.sign(certificates.complete(_fields()), keys["other_private"])
    document["key_id"] = certificates.key_id(keys["public"])
    result = certificates.verify(document, keys["public"])
    assert not result.valid and result.reason == CHANGED


def test_another_certificates_signature_does_not_fit(keys):
    first = certificates.sign(certificates.complete(_fields()), keys["private"])
    second = certificates.sign(certificates.complete(_fields()), keys["private"])
    first["signature"] = second["signature"]
    assert certificates.verify(first, keys["public"]).reason == CHANGED


# -------------------------------------------------------------------------- malformed input

def _junk_documents(document):
    def edited(**changes):
        return {**json.loads(json.dumps(document)), **changes}

    certificate = document["certificate"]
    return {
        "empty file": b"",
        "random bytes": random.Random(0).randbytes(4096),
        "a PDF header and junk": b"%PDF-1.4\n" + random.Random(1).randbytes(512),
        "a JSON list": b"[1, 2, 3]",
        "a JSON string": b'"certificate"',
        "not UTF-8": b'{"format": "\xff\xfe"}',
        "deeply nested": b"[" * 100000 + b"]" * 100000,
        "NaN accuracy": json.dumps(edited(certificate={**certificate, "accuracy": float("nan")})).encode(),
        "huge number": json.dumps(edited()).replace('"accuracy": 0.8731', '"accuracy": 1e999').encode(),
        "huge integer": json.dumps(edited()).replace('"workers": 4', '"workers": ' + "9" * 5000).encode(),
        "lone surrogate": json.dumps(edited()).replace("Ada Lovelace", "Ada \\ud800").encode(),
        "missing signature": json.dumps({k: v for k, v in document.items() if k != "signature"}).encode(),
        "non-base64 signature": json.dumps(edited(signature="not base64 at all!")).encode(),
        "short signature": json.dumps(edited(signature=base64.b64encode(b"x" * 12).decode())).encode(),
        "signature is a number": json.dumps(edited(signature=12345)).encode(),
        "key id is a list": json.dumps(edited(key_id=["nested", {"junk": [None]}])).encode(),
        "wrong format": json.dumps(edited(format="mgpu-certificate/2")).encode(),
        "certificate is a list": json.dumps(edited(certificate=[certificate])).encode(),
        "an unknown field": json.dumps(edited(certificate={**certificate, "grade": "A+"})).encode(),
        "an extra top-level key": json.dumps(edited(note="trust me")).encode(),
        "workers is a bool": json.dumps(edited(certificate={**certificate, "workers": True})).encode(),
        "accuracy as a string": json.dumps(edited(certificate={**certificate, "accuracy": "0.9"})).encode(),
    }


def test_malformed_inputs_are_invalid_with_a_one_line_reason_and_never_raise(document, keys, tmp_path):
    for label, data in _junk_documents(document).items():
        path = tmp_path / "junk.json"
        path.write_bytes(data)
        result = certificates.verify(path, keys["public"])
        assert not result.valid and result.certificate is None, label
        assert result.reason and len(result.reason.splitlines()) == 1 and len(result.reason) < 300, label
    assert not certificates.verify(tmp_path / "missing.json", keys["public"]).valid
    assert "file missing" in certificates.verify(tmp_path / "missing.json", keys["public"]).reason
    assert not certificates.verify(tmp_path, keys["public"]).valid            # a folder
    assert not certificates.verify(12345, keys["public"]).valid                # not a path at all


def test_random_byte_edits_of_a_certificate_never_raise_and_never_forge(issued, keys, tmp_path):
    original = issued.json.read_bytes()
    expected = json.loads(original)
    rng = random.Random(7)
    path = tmp_path / "edited.json"
    for _ in range(300):
        data = bytearray(original)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        result = certificates.verify(path, keys["public"])
        if result.valid:   # an edit of whitespace only leaves the signed record as it was
            assert json.loads(bytes(data)) == expected


# ------------------------------------------------------------------------------- revocation

def test_a_revoked_certificate_is_invalid_with_the_lists_reason(issued, keys, tmp_path):
    certificate_id = json.loads(issued.json.read_text())["certificate"]["certificate_id"]
    listed = tmp_path / "revoked.txt"
    assert certificates.revoke(listed, "f" * 32, "another student's certificate")
    assert certificates.verify(issued.pdf, keys["public"], certificates.read_revocations(listed)).valid
    assert certificates.revoke(listed, certificate_id.upper(), "issued by a grader bug, regraded")
    assert not certificates.revoke(listed, certificate_id, "twice")
    result = certificates.verify(issued.pdf, keys["public"], certificates.read_revocations(listed))
    assert not result.valid and result.reason.startswith("revoked: issued by a grader bug, regraded")
    assert result.certificate["certificate_id"] == certificate_id      # genuine, and revoked
    assert certificates.verify(issued.json, keys["public"], {certificate_id}).reason.startswith("revoked")


def test_revocation_is_checked_only_for_a_genuine_signature(document, keys):
    certificate_id = document["certificate"]["certificate_id"]
    document["certificate"]["name"] = "Mallory"
    assert certificates.verify(document, keys["public"], {certificate_id: "x"}).reason == CHANGED


def test_the_revocation_list_format(tmp_path):
    listed = tmp_path / "revoked.txt"
    assert certificates.read_revocations(listed) == {}
    listed.write_text("# revoked\n\n" + "a" * 32 + "\n" + "B" * 32 + "\tcopied   submission \n")
    assert certificates.read_revocations(listed) == {"a" * 32: "no reason given", "b" * 32: "copied   submission"}
    with pytest.raises(CertificateError, match="not a certificate ID"):
        certificates.revoke(listed, "not-an-id", "x")
    with pytest.raises(CertificateError, match="reason"):
        certificates.revoke(listed, "c" * 32, "  ")
    certificates.revoke(listed, "c" * 32, "two\nlines")
    assert certificates.read_revocations(listed)["c" * 32] == "two lines"
    listed.write_text("a" * 31 + " typo\n")
    with pytest.raises(CertificateError, match="line 1"):
        certificates.read_revocations(listed)


# ------------------------------------------------------------------------------------- keys

def test_init_keys_refuses_to_replace_a_key_without_force(tmp_path):
    private_path, public_path = certificates.init_keys(tmp_path)
    before = private_path.read_bytes()
    with pytest.raises(CertificateError, match="stop verifying.*--force"):
        certificates.init_keys(tmp_path)
    assert private_path.read_bytes() == before
    certificates.init_keys(tmp_path, force=True)
    assert private_path.read_bytes() != before
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gitignore", "public_key.pem", "signing_key.pem"]


def test_a_signing_key_readable_by_others_is_refused(tmp_path):
    private_path, _ = certificates.init_keys(tmp_path)
    private_path.chmod(0o640)
    with pytest.raises(CertificateError, match=f"chmod 600 {private_path}"):
        certificates.load_private_key(private_path)
    with pytest.raises(CertificateError, match="keys init"):
        certificates.load_private_key(tmp_path / "missing.pem")


def test_key_id_is_the_start_of_the_sha256_of_the_raw_public_key(keys):
    import hashlib

    from cryptography.hazmat.primitives import serialization

    raw = keys["public"].public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert certificates.key_id(keys["public"]) == hashlib.sha256(raw).hexdigest()[:16]


# ------------------------------------------------------------------------------ eligibility

def test_practice_profiles_generated_data_and_unisolated_runs_earn_no_certificate():
    practice = assessment.profile("cpu", 2)
    official = dataclasses.replace(practice, name="gpu", dataset="fashion_mnist", official=True)
    assert certificates.why_no_certificate(official, dataset_is_real=True, passed=True) is None
    assert certificates.why_no_certificate(dataclasses.replace(practice, dataset="fashion_mnist"), True, True) == (
        "practice profile cpu: report only, certificates are issued on official profiles")
    assert certificates.why_no_certificate(official, dataset_is_real=False, passed=True) == (
        "generated data (fashion_mnist): certificates are issued on the real dataset only")
    both = certificates.why_no_certificate(practice, dataset_is_real=False, passed=True)
    assert "generated data (synthetic)" in both and "practice profile cpu" in both and "\n" not in both
    assert certificates.why_no_certificate(official, True, passed=False).startswith("not passed")
    # A run the sandbox could not isolate (a cluster node whose jobs run as an ordinary user) earns none.
    unisolated = certificates.why_no_certificate(official, True, True, isolation="unshare --net --mount --pid refused")
    assert unisolated == ("the run was not isolated (unshare --net --mount --pid refused): certificates are issued "
                          "for isolated runs only")


# ----------------------------------------------------------------------------- command line

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_keys_init_prints_the_public_key_and_never_the_private_one(tmp_path):
    key_dir = tmp_path / "keys"
    result = _cli("keys", "init", "--key-dir", key_dir)
    assert result.returncode == 0, result.stderr
    private_path, public_path = key_dir / "signing_key.pem", key_dir / "public_key.pem"
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_path.stat().st_mode) == 0o644
    secret_lines = [line for line in private_path.read_text().splitlines() if not line.startswith("-----")]
    assert secret_lines
    for line in secret_lines:
        assert line not in result.stdout and line not in result.stderr
    assert public_path.read_text().splitlines()[1] in result.stdout
    assert certificates.key_id(certificates.load_public_key(public_path)) in result.stdout

    before = private_path.read_bytes()
    again = _cli("keys", "init", "--key-dir", key_dir)
    assert again.returncode == 2 and private_path.read_bytes() == before
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--force" in lines[0]


def test_verify_and_revoke_commands_exit_0_valid_1_invalid_2_bad_input(issued, keys, tmp_path):
    public = keys["public_path"]
    valid = _cli("verify", issued.pdf, "--public-key", public)
    assert valid.returncode == 0 and valid.stdout.startswith("VALID: Ada Lovelace"), valid.stderr

    document = json.loads(issued.json.read_text())
    document["certificate"]["workers"] = 8
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(document))
    invalid = _cli("verify", tampered, "--public-key", public)
    assert invalid.returncode == 1 and invalid.stdout.strip() == f"INVALID: {CHANGED}"

    listed = tmp_path / "revoked.txt"
    certificate_id = document["certificate"]["certificate_id"]
    assert _cli("revoke", certificate_id, "--reason", "shared account", "--revoked", listed).returncode == 0
    revoked = _cli("verify", issued.json, "--public-key", public, "--revoked", listed)
    assert revoked.returncode == 1 and revoked.stdout.startswith("INVALID: revoked: shared account")

    for args, message in ((["verify", issued.pdf, "--public-key", tmp_path / "none.pem"], "keys init"),
                          (["verify", tmp_path / "none.pdf", "--public-key", public], "no certificate file"),
                          (["verify", issued.pdf, "--course", tmp_path / "no-course"], "--public-key"),
                          (["revoke", "123", "--reason", "x", "--revoked", listed], "not a certificate ID")):
        bad = _cli(*args)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and message in lines[0], bad.stderr


def test_verify_with_a_course_folder_uses_its_keys_and_revocation_list(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    assert _cli("keys", "init", "--course", course).returncode == 0
    files = certificates.issue(_fields(), certificates.load_private_key(course / ".keys" / "signing_key.pem"),
                               tmp_path / "out")
    assert _cli("verify", files.json, "--course", course).returncode == 0
    certificate_id = files.json.stem
    assert _cli("revoke", certificate_id, "--reason", "withdrawn", "--course", course).returncode == 0
    assert (course / "autograder" / "revoked.txt").exists()
    result = _cli("verify", files.json, "--course", course)
    assert result.returncode == 1 and "revoked: withdrawn" in result.stdout


# ------------------------------------------------------------------ grade notes, certify signs

#: ``python -m autograder`` with the cpu row made official (no official row exists yet); prints on
#: stderr which modules that run notebooks (or TensorFlow) the process imported.
OFFICIAL_CPU = """
import dataclasses, json, sys
from mgpu import assessment
row = assessment.profile("cpu", 2)
assessment.PROFILES[row.key] = dataclasses.replace(row, official=True)
from autograder.__main__ import main
code = main(sys.argv[1:])
runners = {"tensorflow", "keras", "horovod", "papermill", "nbclient", "nbconvert", "nbgrader", "jupyter_client",
           "ipykernel"}
print("imported:", json.dumps(sorted({m.split(".")[0] for m in sys.modules} & runners)), file=sys.stderr)
sys.exit(code)
"""


def _official_cli(*args):
    return subprocess.run([sys.executable, "-c", OFFICIAL_CPU, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _graded_course(tmp_path, student="s1815", **changes) -> Path:
    """A course folder holding one record as the grader writes it: a pass on cpu, 2 workers, real data."""
    from dataclasses import asdict

    from autograder.grade import Verdict

    course = tmp_path / "course"
    shutil.copytree(ROOT / "assignments" / "source", course / "source")
    shutil.copyfile(ROOT / "assignments" / "nbgrader_config.py", course / "nbgrader_config.py")
    profile = assessment.profile("cpu", 2)
    verdict = Verdict(student, "assessment", "5e" * 32, True, [], outcome_passed=True, score=10.0, max_score=10.0,
                      run_status="ok", accuracy=0.8731, reached_seconds=59.4, profile=profile.name,
                      workers=profile.workers, target_accuracy=profile.target_accuracy,
                      time_budget_s=profile.time_budget_s, dataset="fashion_mnist",
                      dataset_fingerprint="sha256:3f2a9c0d11e4b7a8", dataset_real=True)
    for name, value in changes.items():
        setattr(verdict, name, value)
    results = course / "autograder" / "assessment"
    results.mkdir(parents=True)
    record = asdict(verdict) | {"reason": verdict.reason, "overhead_seconds": verdict.overhead_seconds}
    (results / f"{student}.json").write_text(json.dumps(record, indent=1))
    return course


def _record(course, student="s1815") -> dict:
    return json.loads((course / "autograder" / "assessment" / f"{student}.json").read_text())


def test_grading_never_refers_to_the_signing_key():
    source = (ROOT / "autograder" / "grade.py").read_text()
    for word in ("signing_key", "load_private_key", "issue_certificates", "PRIVATE_KEY_FILE", "certificates.issue"):
        assert word not in source, word


def test_grade_notes_an_official_pass_and_signs_nothing_then_certify_signs_it(tmp_path, monkeypatch):
    from autograder import grade as grading
    from nbgrader.api import Gradebook

    course = _graded_course(tmp_path)
    assert _cli("keys", "init", "--course", course).returncode == 0
    official = dataclasses.replace(assessment.profile("cpu", 2), official=True)
    grader = grading.CohortGrader(course, "assessment", official)
    with Gradebook(grader.course.db_url) as gb:
        gb.add_student("s1815", first_name="Ada", last_name="Lovelace")

    def no_key(*args, **kwargs):
        raise AssertionError("grading touched the signing key")

    monkeypatch.setattr(certificates, "load_private_key", no_key)
    monkeypatch.setattr(certificates, "issue", no_key)
    logged = []
    assert grading.note_certificates(grader, grading.load_verdicts(grader.course.results_dir()),
                                     logged.append) == ["s1815"]
    record = _record(course)
    folder = course / "autograder" / "assessment" / "certificates"
    assert record["certificate"] == "" and not folder.exists()
    sign = f"python -m autograder certify {course} --assignment assessment --profile cpu --workers 2"
    assert record["certificate_note"] == f"eligible: run {sign} to sign"
    assert len(logged) == 1 and sign in logged[0]

    result = _official_cli("certify", course, "--assignment", "assessment", "--profile", "cpu", "--workers", "2")
    assert result.returncode == 0, result.stderr
    record = _record(course)
    assert record["certificate"] and record["certificate_note"] == ""
    pdf = folder / f"{record['certificate']}.pdf"
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and record["certificate"] in lines[0] and str(pdf) in lines[0]
    assert lines[1] == f"issued 1 certificate(s) into {folder}"
    assert record["certificate"] in (course / "autograder" / "assessment" / "grades.csv").read_text()
    valid = _cli("verify", pdf, "--course", course)
    assert valid.returncode == 0 and valid.stdout.startswith("VALID: Ada Lovelace (student s1815)"), valid.stdout
    fields = json.loads((folder / f"{record['certificate']}.json").read_text())["certificate"]
    assert fields["course_id"] == "mgpu-assessment" and fields["accuracy"] == 0.8731 and fields["workers"] == 2

    again = _official_cli("certify", course, "--profile", "cpu", "--workers", "2")
    assert again.returncode == 0 and again.stdout.startswith("no certificate issued"), again.stdout
    assert _record(course) == record and len(list(folder.glob("*.json"))) == 1


def test_certify_never_imports_tensorflow_or_a_notebook_runner(tmp_path):
    course = _graded_course(tmp_path)
    assert _cli("keys", "init", "--course", course).returncode == 0
    result = _official_cli("certify", course, "--profile", "cpu", "--workers", "2")
    assert result.returncode == 0 and _record(course)["certificate"], result.stderr
    assert result.stderr.strip().splitlines()[-1] == "imported: []"


def test_certify_refuses_while_a_grader_holds_the_course(tmp_path):
    course = _graded_course(tmp_path)
    assert _cli("keys", "init", "--course", course).returncode == 0
    before = _record(course)
    fd = os.open(course / ".grader.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = _official_cli("certify", course, "--profile", "cpu", "--workers", "2")
    finally:
        os.close(fd)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("imported:")]
    assert result.returncode == 2 and len(lines) == 1 and "a grader is working on" in lines[0], result.stderr
    assert result.stdout == "" and _record(course) == before
    assert not (course / "autograder" / "assessment" / "certificates").exists()


def test_certify_without_a_key_names_keys_init_or_key_and_accepts_a_key_elsewhere(tmp_path):
    course = _graded_course(tmp_path)
    missing = _official_cli("certify", course, "--profile", "cpu", "--workers", "2")
    lines = [line for line in missing.stderr.strip().splitlines() if not line.startswith("imported:")]
    assert missing.returncode == 2 and len(lines) == 1, missing.stderr
    assert "keys init" in lines[0] and "--key" in lines[0] and _record(course)["certificate"] == ""

    private_path, public_path = certificates.init_keys(tmp_path / "usb")
    result = _official_cli("certify", course, "--profile", "cpu", "--workers", "2", "--key", private_path)
    assert result.returncode == 0, result.stderr
    assert not (course / ".keys").exists()
    pdf = course / "autograder" / "assessment" / "certificates" / f"{_record(course)['certificate']}.pdf"
    valid = _cli("verify", pdf, "--public-key", public_path)
    assert valid.returncode == 0 and valid.stdout.startswith("VALID: s1815 (student s1815)"), valid.stdout


def test_certify_signs_no_practice_pass_no_failure_and_no_other_profile(tmp_path):
    course = _graded_course(tmp_path)
    assert _cli("keys", "init", "--course", course).returncode == 0
    practice = _cli("certify", course, "--assignment", "assessment", "--profile", "cpu", "--workers", "2")
    assert practice.returncode == 0 and practice.stdout.startswith("no certificate issued"), practice.stderr
    assert _record(course)["certificate_note"] == (
        "practice profile cpu: report only, certificates are issued on official profiles")

    failed = _graded_course(tmp_path / "failed", passed=False, reasons=["target not reached"])
    assert _cli("keys", "init", "--course", failed).returncode == 0
    assert _official_cli("certify", failed, "--profile", "cpu", "--workers", "2").returncode == 0
    assert _record(failed)["certificate"] == "" and _record(failed)["certificate_note"].startswith("not passed")

    other = _graded_course(tmp_path / "other", workers=4)
    assert _cli("keys", "init", "--course", other).returncode == 0
    assert _official_cli("certify", other, "--profile", "cpu", "--workers", "2").returncode == 0
    assert _record(other)["certificate"] == "" and _record(other)["certificate_note"] == ""
    assert not (other / "autograder" / "assessment" / "certificates").exists()

    for args, message in (([tmp_path / "none"], "no course folder"),
                          ([course, "--assignment", "nothing"], "grade the assignment first"),
                          ([course, "--profile", "nothing"], "nothing")):
        bad = _cli("certify", *args)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and message in lines[0], bad.stderr
