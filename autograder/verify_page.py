"""A static HTML page that checks the course's certificates in a browser, with no server and no install.

``write_page`` writes one self-contained file (``python -m autograder page`` calls it): the course's
public key (raw 32 bytes, hex) and its key ID, the revocation list as it is when the page is written,
and a script that does what :func:`autograder.certificates.verify` does, in the same order and with
the same reasons: readable (the ``.json``, or the record embedded in the ``.pdf``), a certificate
(every field with its type), the key ID, the Ed25519 signature, and only then revocation. The
verdict is one of ``valid``, ``tampered`` (the signature does not match, or not a certificate),
``revoked``, ``other-key`` and ``unreadable``.

Everything runs in the page, from a ``file://`` URL too. The signature is verified by the browser
(Ed25519 in WebCrypto, ``crypto.subtle``: Chrome and Edge 137+, Firefox 129+, Safari 17+, named
in one line of the page; where the browser cannot verify Ed25519, that line and the verdict say so
instead, and no verdict that needs the signature is given). The script rebuilds the exact bytes Python signed, with a JSON reader
that keeps what ``JSON.parse`` loses (``600.0`` is a float, ``600`` an int; a lone surrogate stays
one): ``json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` in UTF-8,
floats written as Python's ``repr`` writes them. The page sends nothing anywhere (its
Content-Security-Policy allows no connection).

The script is ``verify_page.js`` beside this module (package data). Its text is inlined into the
page when the page is written, so the page stays one file to publish and to open from ``file://``
(a ``<script src>`` beside it would be a second file to lose or to publish out of step, and its
Content-Security-Policy pins the inlined script by its SHA-256).

Ways in:

- the two file pickers: the certificate (``.json`` or ``.pdf``) and, optionally, a newer
  ``revoked.txt``, used in addition to the list embedded at generation time;
- ``verify.html#cert=<base64url of the .json or .pdf bytes>``: verified on load (and on every
  change of the fragment);
- for tests, ``#canonical=<b64url of JSON>,...`` writes the hex of each JSON value's canonical
  bytes into ``#debug-output``; the functions are also on ``window.mgpuCertificates``.

The verdict is in ``#verdict`` (``data-verdict``), the reason in ``#reason``, the signed fields in
``#fields`` when the signature is valid (also for a revoked certificate), and the milliseconds the
check took in ``#elapsed-ms``. ``#browser-support`` has ``data-support="yes"`` once the browser has
verified RFC 8032's test vector (and refused it with one bit changed), ``"no"`` where it cannot.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import importlib.resources
import json
import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from autograder import certificates

PAGE_FILE = "verify.html"
SCRIPT_FILE = "verify_page.js"


@functools.cache
def _script() -> str:
    """The page's script, ``verify_page.js`` (package data), inlined into every page written."""
    return importlib.resources.files(__package__).joinpath(SCRIPT_FILE).read_text(encoding="utf-8")


def default_page_path(course_dir: str | os.PathLike) -> Path:
    """``COURSE_DIR/autograder/verify.html``, beside the revocation list."""
    return Path(course_dir) / "autograder" / PAGE_FILE


def _revocations(revoked: Mapping[str, str] | None) -> dict[str, str]:
    if revoked is None:
        return {}
    if not isinstance(revoked, Mapping):
        raise TypeError("revoked is read_revocations(path): a dict of certificate ID to reason, or None")
    listed = {}
    for certificate_id, reason in revoked.items():
        normalised = str(certificate_id).strip().lower()
        if not certificates.CERTIFICATE_ID.fullmatch(normalised):
            raise certificates.CertificateError(f"{str(certificate_id)[:40]!r} in the revocation list is not a "
                                                "certificate ID (32 hex digits): fix the list")
        listed[normalised] = str(reason)
    return listed


def _script_json(value) -> str:
    """JSON safe inside <script>: no "<", ">" or "&" outside a \\u escape."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode("ascii") + "'"


def page_html(public_key: Ed25519PublicKey, revoked: Mapping[str, str] | None = None,
              course_name: str = certificates.COURSE_NAME, generated_at: str | None = None) -> str:
    """The page's text (see the module's docstring); ``write_page`` writes it."""
    if not isinstance(public_key, Ed25519PublicKey):
        raise TypeError(f"public_key must be an Ed25519PublicKey (load_public_key), not a {type(public_key).__name__}")
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    generated_at = generated_at or datetime.now(timezone.utc).isoformat(timespec="seconds")
    config = {
        "formats": {fmt: [[name, kind.__name__] for name, kind in fields.items()]
                    for fmt, fields in certificates.FORMATS.items()},
        "format_2": certificates.FORMAT_2,
        "public_key": raw.hex(),
        "key_id": certificates.key_id(public_key),
        "revoked": _revocations(revoked),
        "generated_at": generated_at,
        "course_name": course_name,
        "signature_bytes": certificates.SIGNATURE_BYTES,
        "max_file_bytes": certificates.MAX_FILE_BYTES,
        "pdf_marker": certificates.PDF_MARKER,
    }
    script = _script()
    assert "</" not in script and "</" not in _STYLE
    policy = (f"default-src 'none'; script-src {_csp_hash(script)}; style-src {_csp_hash(_STYLE)}; "
              "img-src 'none'; connect-src 'none'; form-action 'none'; base-uri 'none'")
    listed = len(config["revoked"])
    replacements = {
        "@@POLICY@@": html.escape(policy),
        "@@COURSE@@": html.escape(course_name),
        "@@KEY_ID@@": html.escape(config["key_id"]),
        "@@PUBLIC_KEY@@": html.escape(config["public_key"]),
        "@@GENERATED_AT@@": html.escape(generated_at),
        "@@LISTED@@": f"{listed} certificate{'' if listed == 1 else 's'}",
        "@@STYLE@@": _STYLE,
        "@@CONFIG@@": _script_json(config),
        "@@SCRIPT@@": script,
    }
    # One pass, so that a placeholder inside a value (a revocation reason, the course's name) stays text.
    return re.sub(r"@@[A-Z_]+@@", lambda match: replacements[match.group(0)], _PAGE)


def write_page(out_path: str | os.PathLike, public_key: Ed25519PublicKey, revoked: dict[str, str] | None,
               course_name: str = certificates.COURSE_NAME) -> Path:
    """Write the page to ``out_path`` (through a temporary file and a rename); return the path.

    ``revoked`` is :func:`certificates.read_revocations`' mapping of ID to reason (or None): the
    list as it is now is embedded, and a newer ``revoked.txt`` can be loaded in the page.
    """
    out_path = Path(out_path)
    text = page_html(public_key, revoked, course_name)
    certificates._write_files_atomically({out_path: text.encode("utf-8")})
    return out_path


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="@@POLICY@@">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Check a certificate: @@COURSE@@</title>
<style>@@STYLE@@</style>
</head>
<body>
<header>
  <p class="course">@@COURSE@@</p>
  <h1>Check a certificate of competency</h1>
  <p class="small" id="browser-support">Needs a browser that verifies Ed25519 signatures itself (WebCrypto):
  Chrome or Edge 137+, Firefox 129+ or Safari 17+.</p>
  <p class="small">Everything happens in this page: the certificate is not sent anywhere.
  The check reads the signed record in the file (the <code>.json</code>, or the one embedded in the
  <code>.pdf</code>), not the drawing: compare the fields shown below with what you were told.</p>
</header>
<section class="inputs">
  <label><span>Certificate (<code>.pdf</code> or <code>.json</code>)</span>
    <input type="file" id="cert-file" accept=".pdf,.json,application/pdf,application/json"></label>
  <label><span>Newer revocation list (optional, <code>revoked.txt</code>)</span>
    <input type="file" id="revoked-file" accept=".txt,text/plain"></label>
  <p class="small" id="revocations">Revocation list embedded on @@GENERATED_AT@@: @@LISTED@@.</p>
</section>
<section id="verdict" class="verdict" aria-live="polite">
  <p id="verdict-word">No certificate chosen yet</p>
  <p id="reason">Choose a certificate above, or open a link ending in <code>#cert=...</code>.</p>
  <p class="small">Checked in <span id="elapsed-ms">-</span> ms.</p>
</section>
<table id="fields" hidden>
  <caption>The signed fields</caption>
  <tbody id="fields-body"></tbody>
</table>
<footer class="small">
  <p>Course key id <code>@@KEY_ID@@</code>; public key (Ed25519, raw, hex)
  <code class="key">@@PUBLIC_KEY@@</code>. The same check on the command line:
  <code>python -m autograder verify CERT.pdf --public-key public_key.pem</code>.</p>
</footer>
<pre id="debug-output" hidden></pre>
<script type="application/json" id="mgpu-config">@@CONFIG@@</script>
<script>@@SCRIPT@@</script>
</body>
</html>
"""

_STYLE = r"""
body { font-family: system-ui, sans-serif; color: #1b2a41; max-width: 60rem; margin: 1.2rem auto; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin: 0.2rem 0 0.4rem; }
.course { color: #5b6676; text-transform: uppercase; letter-spacing: 0.05em; margin: 0; font-size: 0.85rem; }
.small { font-size: 0.85rem; color: #5b6676; margin: 0.3rem 0; }
.inputs { display: flex; flex-wrap: wrap; gap: 0.4rem 2rem; margin: 0.8rem 0; }
.inputs label { display: flex; flex-direction: column; gap: 0.2rem; font-size: 0.9rem; }
.inputs .small { flex-basis: 100%; }
.verdict { border: 2px solid #b8c0cc; border-radius: 6px; padding: 0.5rem 1rem; background: #f4f6f8; }
#verdict-word { font-size: 1.8rem; font-weight: bold; margin: 0.2rem 0; }
#reason { margin: 0.2rem 0; overflow-wrap: anywhere; }
.verdict[data-verdict="valid"] { border-color: #1e7b34; background: #e8f5eb; }
.verdict[data-verdict="valid"] #verdict-word { color: #1e7b34; }
.verdict[data-verdict="tampered"], .verdict[data-verdict="unreadable"] { border-color: #b3261e; background: #fbeaea; }
.verdict[data-verdict="tampered"] #verdict-word, .verdict[data-verdict="unreadable"] #verdict-word { color: #b3261e; }
.verdict[data-verdict="revoked"], .verdict[data-verdict="other-key"] { border-color: #a35c00; background: #fdf1e1; }
.verdict[data-verdict="revoked"] #verdict-word, .verdict[data-verdict="other-key"] #verdict-word { color: #a35c00; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.9rem; }
caption { text-align: left; font-weight: bold; padding-bottom: 0.3rem; }
th, td { text-align: left; padding: 0.1rem 0.8rem 0.1rem 0; vertical-align: top; }
th { font-weight: normal; color: #5b6676; font-family: ui-monospace, monospace; }
td { overflow-wrap: anywhere; }
code.key { overflow-wrap: anywhere; }
#browser-support[data-support="no"] { color: #b3261e; font-weight: bold; }
footer { margin-top: 1rem; }
"""
