"""Signed certificates of competency: the course's Ed25519 key, issuing, verifying, revoking.

A pass earns a certificate when :func:`why_no_certificate` finds no reason against it (Assessment A:
an official profile with the real dataset; Assessment B: two workers or more). Both name the
assessment passed: A's format, ``mgpu-certificate/1`` (:data:`FIELDS`), states the accuracy reached
in time with typed numbers; B's, ``mgpu-certificate/2`` (:data:`FIELDS_2`), carries the
assessment's title (:data:`ASSESSMENTS`) and the grader's measurements in one signed sentence
(``achievement``). :func:`issue` writes three files named by the certificate's ID:

- ``<id>.json``: the signed record, ``{"format": ..., "certificate": {...}, "key_id": ...,
  "signature": ...}``. The signature (Ed25519, base64) covers the canonical JSON of ``format``,
  ``certificate`` and ``key_id`` (sorted keys, no spaces, UTF-8), so changing any field, the
  format or the key ID breaks it;
- ``<id>.pdf``: the certificate to hand out (A4 landscape), with the JSON file embedded in its
  metadata (``Keywords``, base64), so the PDF alone can be verified;
- ``<id>.png``: the same page as a preview.

:func:`verify` checks the embedded record, never the drawing: what it reports as valid is the
signed fields, which is why ``python -m autograder verify`` prints them. A certificate ID is
``secrets.token_hex(16)``: 128 random bits as 32 lowercase hex digits.

The key pair lives in ``COURSE_DIR/.keys/`` (:func:`default_key_dir`; the grader's sandbox hides
the course folder from student code): ``signing_key.pem`` (PKCS8, unencrypted, mode 0600 from its
creation) and ``public_key.pem``, which anyone may have to check a certificate. The revocation
list (:func:`read_revocations`, :func:`revoke`) is a text file, one certificate ID per line with
an optional reason after it; verification consults it only once the signature is valid.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
import os
import re
import secrets
import stat
import subprocess
import textwrap
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

FORMAT = "mgpu-certificate/1"       # Assessment A's: an accuracy reached in time
FORMAT_2 = "mgpu-certificate/2"     # an assessment named by its title, its outcome one signed sentence
COURSE_NAME = "Deep learning on multiple GPUs"
PRIVATE_KEY_FILE = "signing_key.pem"
PUBLIC_KEY_FILE = "public_key.pem"
#: The prefix of the PDF's ``Keywords`` entry that carries the base64 of the JSON file.
PDF_MARKER = "mgpu-certificate:"
#: Nothing bigger is read as a certificate (an issued PDF is a few tens of kB).
MAX_FILE_BYTES = 5 * 1024 * 1024
CERTIFICATE_ID = re.compile(r"[0-9a-f]{32}")
SIGNATURE_BYTES = 64
A4_LANDSCAPE_INCHES = (297 / 25.4, 210 / 25.4)
PREVIEW_DPI = 120

#: Every field of a certificate, in the order the JSON file lists them, with its JSON type.
FIELDS: dict[str, type] = {
    "certificate_id": str,
    "name": str,
    "student_id": str,
    "course": str,
    "course_id": str,
    "assignment": str,
    "issued_at": str,             # UTC, ISO 8601
    "accuracy": float,            # the grader's measurement on the held-out split
    "target_accuracy": float,
    "reached_seconds": float,     # grader's clock
    "time_budget_s": float,
    "profile": str,
    "workers": int,
    "dataset": str,
    "dataset_fingerprint": str,
    "submission_sha256": str,
    "grader_version": str,        # git commit of the grader's checkout, or "unknown"
    "calibration": str,           # where the profile's target and budget come from (autograder.calibrate)
}
#: Every field of a certificate of :data:`FORMAT_2` (Assessment B's), in the order its JSON file lists them.
FIELDS_2: dict[str, type] = {
    "certificate_id": str,
    "name": str,
    "student_id": str,
    "course": str,
    "course_id": str,
    "assignment": str,            # the assignment's folder name (zero1)
    "assessment": str,            # its title, from ASSESSMENTS
    "issued_at": str,             # UTC, ISO 8601
    "achievement": str,           # what the grader measured, one sentence with the numbers
    "profile": str,
    "workers": int,
    "data": str,                  # what the run trained on (B: data drawn from a seed the grader chose)
    "submission_sha256": str,
    "grader_version": str,
}
#: The fields of each format this course signs and verifies.
FORMATS: dict[str, dict[str, type]] = {FORMAT: FIELDS, FORMAT_2: FIELDS_2}
#: The title each assignment's certificate names it by (its folder name in ``source/`` -> title).
ASSESSMENTS = {"assessment": "Assessment A: a training program scaled to several workers with Horovod",
               "zero1": "Assessment B: shard the optimizer (ZeRO-1)"}
_DOCUMENT_KEYS = ("format", "certificate", "key_id", "signature")
#: Base64 exactly as ``base64.b64encode`` writes it (groups of four, padding only to end the last):
#: what the grader writes is all it accepts, so this check and the browser page's agree on every
#: input, whatever Python's own decoder tolerates in one version or another.
#: (A length that is a multiple of four with at most two trailing "=" is exactly that.)
_CANONICAL_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_PDF_PAYLOAD = re.compile(rb"\(" + re.escape(PDF_MARKER.encode()) + rb"([A-Za-z0-9+/=]*)\)")


class CertificateError(Exception):
    """Bad input for keys, certificates or the revocation list; the message names the fix."""


@dataclass(frozen=True)
class CertificateFiles:
    json: Path
    pdf: Path
    png: Path


@dataclass(frozen=True)
class Verification:
    valid: bool
    reason: str                    # one line: "valid: ..." or what is wrong
    #: The signed fields when the signature is valid (also for a revoked certificate), else None.
    certificate: dict | None = None


# ------------------------------------------------------------------------------------ files

def _write_files_atomically(contents: dict[Path, bytes], mode: int = 0o644) -> None:
    """Write every file to a temporary file beside it, then rename them all into place.

    Temporary files are created with ``mode`` (O_EXCL, so never someone else's file) and removed
    if anything fails, so no file is ever half-written.
    """
    temporaries: dict[Path, str] = {}
    try:
        for path, data in contents.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            temporaries[path] = tmp
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)   # exactly ``mode`` whatever the umask, before any byte
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for path, tmp in temporaries.items():
            os.replace(tmp, path)
    finally:
        for tmp in temporaries.values():
            Path(tmp).unlink(missing_ok=True)


def _show(value: Any, limit: int = 40) -> str:
    """A value for a one-line message: short repr of text and numbers, the type of anything else."""
    if isinstance(value, str):
        text = repr(value[:limit])
    elif isinstance(value, int) and value.bit_length() > 128:
        text = f"a {value.bit_length()}-bit integer"
    elif isinstance(value, (int, float)) or value is None:
        text = repr(value)
    else:
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ------------------------------------------------------------------------------------- keys

def default_key_dir(course_dir: str | os.PathLike) -> Path:
    """``COURSE_DIR/.keys``: where ``keys init`` puts the course's key pair."""
    return Path(course_dir) / ".keys"


def default_revocation_list(course_dir: str | os.PathLike) -> Path:
    """``COURSE_DIR/autograder/revoked.txt``."""
    return Path(course_dir) / "autograder" / "revoked.txt"


def init_keys(key_dir: str | os.PathLike, force: bool = False) -> tuple[Path, Path]:
    """Make the course's key pair in ``key_dir``; return (private key path, public key path).

    The private key is created with mode 0600 (never readable by others, not even for a moment);
    both files are written to temporary files first and renamed, so a crash leaves no half key.
    An existing key is only replaced with ``force``. A ``.gitignore`` of ``*`` keeps the folder
    out of git.
    """
    key_dir = Path(key_dir)
    private_path, public_path = key_dir / PRIVATE_KEY_FILE, key_dir / PUBLIC_KEY_FILE
    existing = [p for p in (private_path, public_path) if p.exists()]
    if existing and not force:
        raise CertificateError(f"{existing[0]} already exists: replacing the key would make every certificate "
                               "signed with the old key stop verifying; pass --force to replace it anyway")
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption())
    public_pem = private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo)
    if not (key_dir / ".gitignore").exists():
        _write_files_atomically({key_dir / ".gitignore": b"# The course's signing key: never in git.\n*\n"})
    _write_files_atomically({private_path: private_pem}, mode=0o600)
    _write_files_atomically({public_path: public_pem}, mode=0o644)
    return private_path, public_path


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The signing key; refuses a file that group or others can read."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        raise CertificateError(f"no signing key {path}: make one with `python -m autograder keys init`") from None
    if mode & 0o077:
        raise CertificateError(f"signing key {path} is readable by others (mode {mode:04o}): run chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as error:
        raise CertificateError(f"{path} is not an unencrypted PEM private key ({error}): make one with "
                               "`python -m autograder keys init`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CertificateError(f"{path} is a {type(key).__name__}, not an Ed25519 key: make one with "
                               "`python -m autograder keys init`")
    return key


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    """The public key that checks the course's certificates."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CertificateError(f"no public key {path}: make the course's keys with `python -m autograder keys init` "
                               "or pass --public-key PEM") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as error:
        raise CertificateError(f"{path} is not a PEM public key ({error}): pass the course's public_key.pem "
                               "with --public-key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise CertificateError(f"{path} is a {type(key).__name__}, not an Ed25519 key: pass the course's "
                               "public_key.pem with --public-key")
    return key


def public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex digits of the SHA-256 of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# ----------------------------------------------------------------------------------- fields

def format_of(certificate: dict) -> str:
    """The format whose fields ``certificate`` has (:data:`FORMAT_2` when it has an ``achievement``)."""
    return FORMAT_2 if isinstance(certificate, dict) and "achievement" in certificate else FORMAT


def _type_problem(certificate: Any, fmt: str = FORMAT) -> str | None:
    """Why ``certificate`` does not have exactly the fields of ``fmt`` with their types, or None."""
    if not isinstance(certificate, dict):
        return f"not a certificate: its certificate is a {type(certificate).__name__}, not an object"
    fields = FORMATS[fmt]
    for name in certificate:
        if name not in fields:
            return f"unknown field {_show(name)}: not a field of {fmt}"
    for name, kind in fields.items():
        if name not in certificate:
            return f"field {name} is missing"
        value = certificate[name]
        if kind is float:
            if not isinstance(value, float) or not math.isfinite(value):
                return f"field {name} is {_show(value)}: expected a finite number with a decimal point"
        elif kind is int:
            if not isinstance(value, int) or isinstance(value, bool):
                return f"field {name} is {_show(value)}: expected a whole number"
        elif not isinstance(value, str):
            return f"field {name} is {_show(value)}: expected a string"
        else:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"field {name} is not valid Unicode text"
    return None


def complete(fields: dict) -> dict:
    """The certificate for ``fields``: ID and time filled in, numbers as floats, values checked.

    Raises :class:`CertificateError` naming the first missing or bad field.
    """
    if not isinstance(fields, dict):
        raise CertificateError(f"certificate fields must be a dict, not a {type(fields).__name__}")
    certificate = {"certificate_id": secrets.token_hex(16),
                   "issued_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    certificate.update(fields)
    fmt = format_of(certificate)
    for name, kind in FORMATS[fmt].items():
        value = certificate.get(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            certificate[name] = float(value)
    certificate = {name: certificate[name] for name in FORMATS[fmt] if name in certificate} | certificate
    problem = _type_problem(certificate, fmt)
    if problem:
        raise CertificateError(f"cannot issue: {problem}")
    for name, kind in FORMATS[fmt].items():
        value = certificate[name]
        if kind is str and (not value.strip() or any(c in value for c in "\r\n\t\x00")):
            raise CertificateError(f"cannot issue: field {name} must be non-empty text on one line")
    if not CERTIFICATE_ID.fullmatch(certificate["certificate_id"]):
        raise CertificateError("cannot issue: field certificate_id must be 32 lowercase hex digits "
                               "(leave it out to get a random one)")
    if not re.fullmatch(r"[0-9a-f]{64}", certificate["submission_sha256"]):
        raise CertificateError("cannot issue: field submission_sha256 must be 64 lowercase hex digits")
    try:
        issued = datetime.fromisoformat(certificate["issued_at"])
    except ValueError:
        issued = None
    if issued is None or issued.utcoffset() is None or issued.utcoffset().total_seconds() != 0:
        raise CertificateError("cannot issue: field issued_at must be an ISO 8601 time in UTC "
                               "(e.g. 2026-11-22T10:00:00+00:00; leave it out for now)")
    for name in ("accuracy", "target_accuracy"):
        if name in certificate and not 0.0 <= certificate[name] <= 1.0:
            raise CertificateError(f"cannot issue: field {name} must be between 0 and 1")
    for name in ("reached_seconds", "time_budget_s"):
        if name in certificate and certificate[name] < 0:
            raise CertificateError(f"cannot issue: field {name} must not be negative")
    if certificate["workers"] < 1:
        raise CertificateError("cannot issue: field workers must be at least 1")
    return certificate


def grader_version() -> str:
    """The git commit of the grader's checkout, or "unknown" (e.g. installed without git)."""
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else "unknown"


# ---------------------------------------------------------------------------------- signing

def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _signed_bytes(certificate: dict, signer_key_id: str, fmt: str = FORMAT) -> bytes:
    return _canonical({"format": fmt, "certificate": certificate, "key_id": signer_key_id})


def sign(certificate: dict, private_key: Ed25519PrivateKey) -> dict:
    """The signed document for a complete certificate (every field of its format, with its type)."""
    fmt = format_of(certificate)
    problem = _type_problem(certificate, fmt)
    if problem:
        raise CertificateError(f"cannot sign: {problem}")
    signer = key_id(private_key.public_key())
    signature = private_key.sign(_signed_bytes(certificate, signer, fmt))
    return {"format": fmt, "certificate": certificate, "key_id": signer,
            "signature": base64.b64encode(signature).decode("ascii")}


def issue(fields: dict, private_key: Ed25519PrivateKey, out_dir: str | os.PathLike) -> CertificateFiles:
    """Sign ``fields`` and write ``<certificate_id>.json``, ``.pdf`` and ``.png`` into ``out_dir``.

    ``certificate_id`` and ``issued_at`` are filled in when absent; every other field of
    its format (:data:`FIELDS`, or :data:`FIELDS_2` when ``achievement`` is given) is required. Bad fields raise :class:`CertificateError` before anything is written.
    """
    document = sign(complete(fields), private_key)
    text = json.dumps(document, indent=2, ensure_ascii=False).encode() + b"\n"
    pdf, png = _render(document["certificate"], document["key_id"], text)
    out_dir = Path(out_dir)
    files = CertificateFiles(*(out_dir / f"{document['certificate']['certificate_id']}.{suffix}"
                               for suffix in ("json", "pdf", "png")))
    _write_files_atomically({files.png: png, files.pdf: pdf, files.json: text})
    return files


# -------------------------------------------------------------------------------- rendering

def _render(certificate: dict, signer_key_id: str, json_bytes: bytes) -> tuple[bytes, bytes]:
    """The certificate page as PDF (with the JSON file embedded) and as a PNG preview."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    c = certificate             # every text is drawn with parse_math=False: a "$" in a name stays a "$"
    issued = datetime.fromisoformat(c["issued_at"])
    ink, accent, muted = "#1b2a41", "#8a6d1f", "#5b6676"
    fig = Figure(figsize=A4_LANDSCAPE_INCHES)
    fig.patch.set_facecolor("white")
    for inset, width, colour in ((0.02, 3.0, ink), (0.032, 0.8, accent)):
        fig.add_artist(Rectangle((inset, inset * 297 / 210), 1 - 2 * inset, 1 - 2 * inset * 297 / 210,
                                 transform=fig.transFigure, fill=False, linewidth=width, edgecolor=colour))

    def line(y, text, size, **style):
        fig.text(0.5, y, text, ha="center", va="center", fontsize=size, color=style.pop("color", ink),
                 parse_math=False, **style)

    line(0.88, c["course"].upper(), 15, color=muted, family="DejaVu Sans")
    line(0.79, "Certificate of competency", 36, family="DejaVu Serif")
    line(0.70, "This certifies that", 14, color=muted, family="DejaVu Serif", style="italic")
    line(0.615, c["name"], min(40.0, 40.0 * 30 / max(len(c["name"]), 1)), family="DejaVu Serif", weight="bold")
    line(0.555, f"student {c['student_id']}", 11, color=muted)
    title = c.get("assessment") or ASSESSMENTS.get(c["assignment"], c["assignment"])
    if "achievement" in c:  # FORMAT_2: the title and the grader's sentence, both signed
        achievement = (f"has passed {title} on {c['workers']} workers: {c['achievement']} (profile {c['profile']}, "
                       f"data {c['data']}).")
        data_row = ("Data", c["data"][:64])
    else:
        achievement = (f"has trained the reference model with Horovod on {c['workers']} workers to "
                       f"{c['accuracy']:.3f} held-out accuracy (target {c['target_accuracy']:.3f}) in "
                       f"{c['reached_seconds']:.0f} s (budget {c['time_budget_s']:.0f} s), profile {c['profile']}, "
                       f"dataset {c['dataset']}.")
        data_row = ("Dataset fingerprint", c["dataset_fingerprint"][:64])
    wrapped = textwrap.wrap(achievement, 90)
    line(0.455, "\n".join(wrapped), 14 if len(wrapped) <= 3 else 12, family="DejaVu Serif", linespacing=1.5)
    line(0.345, f"Issued {issued.day} {issued:%B %Y}", 13, family="DejaVu Serif")
    submission = c["submission_sha256"]
    details = [("Certificate ID", c["certificate_id"]),
               ("Assessment", f"{title} ({c['assignment']}, course {c['course_id']})"[:88]),
               data_row,
               ("Submission SHA-256", f"{submission[:16]}\u2026{submission[-8:]}"),
               ("Signing key ID", signer_key_id),
               ("Issued (UTC)", c["issued_at"]),
               ("Grader version", c["grader_version"][:16])]
    if "calibration" in c:
        details.append(("Calibration", c["calibration"][:88] + ("\u2026" if len(c["calibration"]) > 88 else "")))
    for row, (label, value) in enumerate(details):
        y = 0.265 - row * 0.026
        fig.text(0.09, y, label, fontsize=9, color=muted, va="center")
        fig.text(0.27, y, value, fontsize=9, color=ink, va="center", family="DejaVu Sans Mono", parse_math=False)
    fig.text(0.5, 0.07, f"Verify: python -m autograder verify {c['certificate_id']}.pdf   (or the .json). The signed "
             "record is embedded in this PDF; the check reads it, not this page.",
             ha="center", va="center", fontsize=8.5, color=muted, parse_math=False)
    metadata = {"Title": f"Certificate of competency: {c['name']}", "Author": c["course"],
                "Subject": f"{FORMAT} {c['certificate_id']}",
                "Keywords": PDF_MARKER + base64.b64encode(json_bytes).decode("ascii"),
                "CreationDate": issued}
    pdf, png = io.BytesIO(), io.BytesIO()
    with matplotlib.rc_context({"pdf.fonttype": 42}):
        fig.savefig(pdf, format="pdf", metadata=metadata)
        fig.savefig(png, format="png", dpi=PREVIEW_DPI)
    return pdf.getvalue(), png.getvalue()


# ------------------------------------------------------------------------------ verification

def _b64decode(text: str | bytes) -> bytes:
    """Canonical base64 (:data:`_CANONICAL_BASE64`) to bytes; ``binascii.Error`` for anything else."""
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="replace")
    if not isinstance(text, str) or len(text) % 4 or not _CANONICAL_BASE64.fullmatch(text):
        raise binascii.Error("not canonical base64")
    return base64.b64decode(text, validate=True)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise CertificateError("not JSON: the file is not UTF-8 text (pass the certificate's .json or .pdf)") from None
    except (ValueError, RecursionError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CertificateError(f"not JSON: {message[:80]} (pass the certificate's .json or .pdf)") from None


def read_certificate(path: str | os.PathLike) -> dict:
    """The signed document in a certificate's ``.json``, or embedded in its ``.pdf`` (by content).

    Raises :class:`CertificateError` with the reason it cannot be read; nothing is checked here
    beyond being a JSON object.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CertificateError(f"{path} has {size} bytes: too large to be a certificate")
        data = path.read_bytes()
    except FileNotFoundError:
        raise CertificateError(f"file missing: {path}") from None
    except OSError as error:
        raise CertificateError(f"cannot read {path}: {error.strerror or error}") from None
    if data.startswith(b"%PDF-"):
        payloads = set(_PDF_PAYLOAD.findall(data))
        if not payloads:
            raise CertificateError("a PDF without an embedded certificate: pass a PDF written by the grader, "
                                   "or the .json")
        if len(payloads) > 1:
            raise CertificateError(f"a PDF with {len(payloads)} different embedded certificates: it was edited "
                                   "after it was issued")
        try:
            data = _b64decode(payloads.pop())
        except (binascii.Error, ValueError):
            raise CertificateError("the PDF's embedded certificate is not base64: it was edited after it "
                                   "was issued") from None
    document = _parse_json(data)
    if not isinstance(document, dict):
        raise CertificateError(f"not a certificate: a JSON {type(document).__name__}, expected an object "
                               f"with {', '.join(_DOCUMENT_KEYS)}")
    return document


def _document_problem(document: Any) -> str | None:
    if not isinstance(document, dict):
        return f"not a certificate: a {type(document).__name__}, expected an object with {', '.join(_DOCUMENT_KEYS)}"
    fmt = document.get("format")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        return (f"not a certificate: format {_show(fmt)}, expected "
                f"{' or '.join(repr(name) for name in FORMATS)}")
    for name in _DOCUMENT_KEYS:
        if name not in document:
            return f"not a certificate: no {name}"
    for name in document:
        if name not in _DOCUMENT_KEYS:
            return f"not a certificate: unexpected key {_show(name)} beside {', '.join(_DOCUMENT_KEYS)}"
    problem = _type_problem(document["certificate"], fmt)
    if problem:
        return problem
    for name in ("key_id", "signature"):
        if not isinstance(document[name], str):
            return f"{name} is {_show(document[name])}: expected a string"
    return None


def _normalised(revoked: Mapping[str, str] | Collection[str] | None) -> dict[str, str]:
    if isinstance(revoked, (str, bytes, os.PathLike)):
        raise TypeError("revoked is the list's contents: pass read_revocations(path), not the path")
    if not revoked:
        return {}
    if isinstance(revoked, Mapping):
        return {str(k).lower(): str(v) for k, v in revoked.items()}
    return {str(k).lower(): "on the revocation list" for k in revoked}


def verify(path_or_document: str | os.PathLike | dict, public_key: Ed25519PublicKey,
           revoked: Mapping[str, str] | Collection[str] | None = None) -> Verification:
    """Is this certificate (a file path, or a document already read) signed by ``public_key``?

    ``revoked`` is :func:`read_revocations`' mapping of ID to reason (or a set of IDs). The order of
    the checks: readable, a certificate, every field with its type, the key ID, the signature, and
    only then revocation, so a revoked certificate's reason is only shown for a genuine one. Never
    raises on bad input: every failure is ``Verification(valid=False, reason)``.
    """
    if isinstance(path_or_document, dict):
        document = path_or_document
    elif isinstance(path_or_document, (str, os.PathLike)):
        try:
            document = read_certificate(path_or_document)
        except CertificateError as error:
            return Verification(False, str(error))
    else:
        return Verification(False, f"not a certificate: a {type(path_or_document).__name__}, "
                                   "expected a file path or a JSON object")
    problem = _document_problem(document)
    if problem:
        return Verification(False, problem)
    certificate, expected = document["certificate"], key_id(public_key)
    if document["key_id"] != expected:
        return Verification(False, f"signed by another key (key id {_show(document['key_id'])}), not this "
                                   f"course's key ({expected})")
    changed = "the signature does not match: a field was changed after signing"
    try:
        signature = _b64decode(document["signature"])
    except (binascii.Error, ValueError):
        return Verification(False, f"{changed} (the signature is not base64)")
    if len(signature) != SIGNATURE_BYTES:
        return Verification(False, f"{changed} (the signature has {len(signature)} bytes, not {SIGNATURE_BYTES})")
    try:
        public_key.verify(signature, _signed_bytes(certificate, document["key_id"], document["format"]))
    except InvalidSignature:
        return Verification(False, changed)
    revocations = _normalised(revoked)
    if certificate["certificate_id"].lower() in revocations:
        return Verification(False, f"revoked: {revocations[certificate['certificate_id'].lower()]} (the signature "
                                   "is valid; the ID is on the course's revocation list)", certificate)
    c = certificate
    if document["format"] == FORMAT_2:
        return Verification(True, f"valid: {c['name']} (student {c['student_id']}), {c['course']}, "
                                  f"{c['assessment']} ({c['assignment']}): {c['achievement']}; {c['workers']} "
                                  f"workers, profile {c['profile']}, data {c['data']}, issued {c['issued_at']}",
                            certificate)
    return Verification(True, f"valid: {c['name']} (student {c['student_id']}), {c['course']}, {c['assignment']}: "
                              f"accuracy {c['accuracy']:.3f} (target {c['target_accuracy']:.3f}) in "
                              f"{c['reached_seconds']:.0f} s (budget {c['time_budget_s']:.0f} s) on {c['workers']} "
                              f"workers, profile {c['profile']}, dataset {c['dataset']}, issued {c['issued_at']}",
                        certificate)


# -------------------------------------------------------------------------------- revocation

def _certificate_id(text: str) -> str:
    normalised = text.strip().lower()
    if not CERTIFICATE_ID.fullmatch(normalised):
        raise CertificateError(f"{_show(text)} is not a certificate ID: expected 32 hex digits, as in the "
                               "certificate's file name")
    return normalised


def read_revocations(path: str | os.PathLike) -> dict[str, str]:
    """Certificate ID -> reason from a revocation list (a missing file is an empty list).

    One ID per line, the reason after the first whitespace; blank lines and ``#`` comments are
    ignored. A line that does not start with an ID is an error (it would silently revoke nothing).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        raise CertificateError(f"cannot read the revocation list {path}: {error}") from None
    revocations = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        first, *rest = line.split(None, 1)
        reason = rest[0] if rest else ""
        try:
            revocations[_certificate_id(first)] = reason.strip() or "no reason given"
        except CertificateError:
            raise CertificateError(f"{path} line {number}: {_show(first)} is not a certificate ID (32 hex "
                                   "digits): fix or remove the line") from None
    return revocations


def revoke(path: str | os.PathLike, certificate_id: str, reason: str) -> bool:
    """Add ``certificate_id`` to the revocation list at ``path``; False if it was already there.

    The list is rewritten through a temporary file and a rename, so it is never half-written.
    """
    path = Path(path)
    certificate_id = _certificate_id(certificate_id)
    reason = " ".join(str(reason).split())
    if not reason:
        raise CertificateError("give a reason for the revocation: --reason \"...\"")
    existing = read_revocations(path)
    if certificate_id in existing:
        return False
    text = path.read_text(encoding="utf-8") if path.exists() else (
        "# Revoked certificates: one ID per line, then the reason (python -m autograder revoke).\n")
    if text and not text.endswith("\n"):
        text += "\n"
    _write_files_atomically({path: (text + f"{certificate_id} {reason}\n").encode()})
    return True


# ------------------------------------------------------------------------------- eligibility

def why_no_certificate(profile, dataset_is_real: bool, passed: bool, isolation: str = "",
                       assignment: str = "assessment") -> str | None:
    """None when a certificate is due, else every reason it is not, in one line.

    ``profile`` is an :class:`mgpu.assessment.Profile` (its ``name``, ``workers``, ``dataset`` and
    ``official``); ``isolation`` is the run's record of what the sandbox could not do ('' when it
    was whole): a run that could see or write outside its folder (no namespaces, say on a cluster
    node where jobs run as an ordinary user) could have forged what the grader read, so it earns no
    certificate. What else a pass needs is the assignment's: Assessment A's accuracy in time counts
    only against a target and budget calibrated on the real dataset (an official profile);
    Assessment B's (``zero1``) is measured against a reference run the grader makes itself on data it
    draws, on any profile, and needs the state sharded over two workers or more.
    """
    reasons = []
    if not passed:
        reasons.append("not passed: certificates are issued for a pass only")
    elif assignment not in ASSESSMENTS:
        reasons.append(f"assignment {assignment} has no certificate (certificates.ASSESSMENTS lists those that do)")
    if isolation:
        reasons.append(f"the run was not isolated ({isolation}): certificates are issued for isolated runs only")
    if assignment == "zero1":
        if profile.workers < 2:
            reasons.append(f"{profile.workers} worker: sharding needs 2 workers or more for a certificate")
        return "; ".join(reasons) or None
    if not dataset_is_real:
        reasons.append(f"generated data ({profile.dataset}): certificates are issued on the real dataset only")
    if not profile.official:
        reasons.append(f"practice profile {profile.name}: report only, certificates are issued on official profiles")
    return "; ".join(reasons) or None


def zero1_achievement(measured: dict) -> str:
    """Assessment B's signed sentence, from the grader's measurements (a record's ``measured["zero1"]``)."""
    top = max(measured["state_bytes_per_rank"].values())
    return (f"final weights within {measured['weights_max_abs_diff']:.1e} of plain data parallelism's "
            f"(tolerance {measured['weights_tolerance']:.0e}), at most {top / 1e3:.0f} kB of optimizer state "
            f"on one worker where plain data parallelism holds {measured['state_dp_bytes'] / 1e3:.0f} kB "
            f"(limit {measured['state_bound_bytes'] / 1e3:.0f} kB), and {measured['comm_over_dp']:.2f}x its "
            f"bytes sent per step")
