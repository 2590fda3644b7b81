"""A static HTML page that checks the course's certificates in a browser, with no server and no install.

``write_page`` writes one self-contained file (``python -m autograder page`` calls it): the course's
public key (raw 32 bytes, hex) and its key ID, the revocation list as it is when the page is written,
and a script that does what :func:`autograder.certificates.verify` does, in the same order and with
the same reasons: readable (the ``.json``, or the record embedded in the ``.pdf``), a certificate
(every field with its type), the key ID, the Ed25519 signature, and only then revocation. The
verdict is one of ``valid``, ``tampered`` (the signature does not match, or not a certificate),
``revoked``, ``other-key`` and ``unreadable``.

Everything runs in the page, from a ``file://`` URL too: SHA-512 and Ed25519 (RFC 8032, with
BigInt) are written out in the script, and so is a JSON reader that keeps what ``JSON.parse``
loses (``600.0`` is a float, ``600`` an int; a lone surrogate stays one), so the page rebuilds the
exact bytes Python signed: ``json.dumps(..., sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` in UTF-8, floats written as Python's ``repr`` writes them. The page sends
nothing anywhere (its Content-Security-Policy allows no connection).

Ways in:

- the two file pickers: the certificate (``.json`` or ``.pdf``) and, optionally, a newer
  ``revoked.txt``, used in addition to the list embedded at generation time;
- ``verify.html#cert=<base64url of the .json or .pdf bytes>``: verified on load (and on every
  change of the fragment);
- for tests, ``#sha512=<b64url>,<b64url>,...`` and ``#canonical=<b64url of JSON>,...`` write one
  hex SHA-512 per item (of the bytes, or of the canonical bytes of the JSON value) into
  ``#debug-output``; the functions are also on ``window.mgpuCertificates``.

The verdict is in ``#verdict`` (``data-verdict``), the reason in ``#reason``, the signed fields in
``#fields`` when the signature is valid (also for a revoked certificate), and the milliseconds the
check took in ``#elapsed-ms``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from autograder import certificates

PAGE_FILE = "verify.html"


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
        "format": certificates.FORMAT,
        "public_key": raw.hex(),
        "key_id": certificates.key_id(public_key),
        "revoked": _revocations(revoked),
        "generated_at": generated_at,
        "course_name": course_name,
        "fields": [[name, kind.__name__] for name, kind in certificates.FIELDS.items()],
        "signature_bytes": certificates.SIGNATURE_BYTES,
        "max_file_bytes": certificates.MAX_FILE_BYTES,
        "pdf_marker": certificates.PDF_MARKER,
    }
    assert "</" not in _SCRIPT and "</" not in _STYLE
    policy = (f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; "
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
        "@@SCRIPT@@": _SCRIPT,
    }
    text = _PAGE
    for placeholder, value in replacements.items():
        text = text.replace(placeholder, value)
    return text


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
footer { margin-top: 1rem; }
"""

_SCRIPT = r"""
"use strict";
(() => {
const CONFIG = JSON.parse(document.getElementById("mgpu-config").textContent);
const FORMAT = CONFIG.format;
const DOCUMENT_KEYS = ["format", "certificate", "key_id", "signature"];
const CHANGED = "the signature does not match: a field was changed after signing";

/** Why a file cannot be read as a certificate (certificates.CertificateError). */
class CertificateError extends Error {}
/** What Python's json.loads raises (ValueError, JSONDecodeError, RecursionError), as its text. */
class JsonError extends Error {}
/** json's StopIteration: no JSON value starts at pos. */
class NoValue { constructor(pos) { this.pos = pos; } }

// ===================================================================== bytes, text, base64

const hex = (n, width) => n.toString(16).padStart(width, "0");
const bytesToHex = (bytes) => Array.from(bytes, (b) => hex(b, 2)).join("");
const hexToBytes = (text) => Uint8Array.from(text.match(/../g) || [], (pair) => parseInt(pair, 16));
const codePoints = (text) => Array.from(text);   // Python's view of a str: one item per code point

/** The string of code points s[start:end] (in slices: a spread of millions of arguments would throw). */
function fromCodePoints(s, start, end) {
  let out = "";
  for (let i = start; i < end; i += 0x4000) out += String.fromCodePoint(...s.slice(i, Math.min(i + 0x4000, end)));
  return out;
}

function concatBytes(...parts) {
  const out = new Uint8Array(parts.reduce((total, part) => total + part.length, 0));
  let at = 0;
  for (const part of parts) { out.set(part, at); at += part.length; }
  return out;
}

/** Bytes as a string of the same char codes (for regular expressions over a PDF's bytes). */
function latin1(bytes) {
  let out = "";
  for (let i = 0; i < bytes.length; i += 0x8000) out += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return out;
}

/** UTF-8 as Python's bytes.decode("utf-8"): strict, and a BOM is kept as U+FEFF. */
function decodeUtf8(bytes) {
  try { return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes); }
  catch (error) { return null; }
}

/** UTF-8 as Python's str.encode(): a lone surrogate cannot be encoded. */
function encodeUtf8(text) {
  if (/\p{Cs}/u.test(text)) throw new Error("a lone surrogate cannot be encoded as UTF-8");
  return new TextEncoder().encode(text);
}

const BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/** Canonical base64 only, as Python's b64encode writes it and certificates._b64decode accepts it:
 *  groups of four, "=" only to complete the last group; null for anything else. */
function b64decode(text) {
  if (text.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(text)) return null;
  const data = text.replace(/=+$/, "");
  const out = new Uint8Array(Math.floor(data.length * 3 / 4));
  let bits = 0, held = 0, n = 0;
  for (const ch of data) {
    bits = ((bits << 6) | BASE64.indexOf(ch)) & 0xffff;
    held += 6;
    if (held >= 8) { held -= 8; out[n++] = (bits >> held) & 0xff; }
  }
  return out;
}

/** base64url (or plain base64), padded or not, as in the page's #cert= links. */
function b64urlDecode(text) {
  const plain = text.replace(/-/g, "+").replace(/_/g, "/").replace(/=+$/, "");
  return b64decode(plain + "=".repeat((4 - plain.length % 4) % 4));
}

// ============================================================================ SHA-512
// FIPS 180-4, section 6.4, on 64-bit words held in BigInt. The constants are computed as the
// standard defines them rather than copied: the first 64 bits of the fractional parts of the
// cube roots of the first 80 primes (K) and of the square roots of the first 8 primes (H0).

const MASK64 = (1n << 64n) - 1n;

function integerRoot(n, k) {            // floor(n ** (1/k)) for a BigInt n >= 0, by Newton's method
  if (n < 2n) return n;
  const K = BigInt(k);
  let x = 1n << BigInt(Math.ceil(n.toString(2).length / k));   // a start above the root
  for (;;) {
    const y = ((K - 1n) * x + n / x ** (K - 1n)) / K;
    if (y >= x) return x;
    x = y;
  }
}

function firstPrimes(count) {
  const primes = [];
  for (let candidate = 2; primes.length < count; candidate++) {
    if (primes.every((p) => candidate % p !== 0)) primes.push(candidate);
  }
  return primes;
}

const PRIMES = firstPrimes(80);
const SHA512_K = PRIMES.map((p) => integerRoot(BigInt(p) << 192n, 3) & MASK64);
const SHA512_H0 = PRIMES.slice(0, 8).map((p) => integerRoot(BigInt(p) << 128n, 2) & MASK64);

const rotr = (x, n) => ((x >> n) | (x << (64n - n))) & MASK64;

function sha512(message) {
  // 5.1.2 padding: a 1 bit, zeros, then the length in bits as a 128-bit big-endian number.
  const padded = new Uint8Array(Math.ceil((message.length + 17) / 128) * 128);
  padded.set(message);
  padded[message.length] = 0x80;
  const view = new DataView(padded.buffer);
  const bitLength = BigInt(message.length) * 8n;
  view.setBigUint64(padded.length - 16, bitLength >> 64n);
  view.setBigUint64(padded.length - 8, bitLength & MASK64);

  const H = SHA512_H0.slice();
  const W = new Array(80);
  for (let block = 0; block < padded.length; block += 128) {
    // 6.4.2 step 1: the message schedule.
    for (let t = 0; t < 16; t++) W[t] = view.getBigUint64(block + 8 * t);
    for (let t = 16; t < 80; t++) {
      const s0 = rotr(W[t - 15], 1n) ^ rotr(W[t - 15], 8n) ^ (W[t - 15] >> 7n);     // sigma0
      const s1 = rotr(W[t - 2], 19n) ^ rotr(W[t - 2], 61n) ^ (W[t - 2] >> 6n);      // sigma1
      W[t] = (s1 + W[t - 7] + s0 + W[t - 16]) & MASK64;
    }
    // Steps 2 to 4: the eight working variables, 80 rounds.
    let [a, b, c, d, e, f, g, h] = H;
    for (let t = 0; t < 80; t++) {
      const S1 = rotr(e, 14n) ^ rotr(e, 18n) ^ rotr(e, 41n);                           // Sigma1
      const ch = (e & f) ^ ((e ^ MASK64) & g);
      const T1 = (h + S1 + ch + SHA512_K[t] + W[t]) & MASK64;
      const S0 = rotr(a, 28n) ^ rotr(a, 34n) ^ rotr(a, 39n);                           // Sigma0
      const maj = (a & b) ^ (a & c) ^ (b & c);
      const T2 = (S0 + maj) & MASK64;
      [h, g, f, e, d, c, b, a] = [g, f, e, (d + T1) & MASK64, c, b, a, (T1 + T2) & MASK64];
    }
    // Step 5: the intermediate hash value.
    [a, b, c, d, e, f, g, h].forEach((word, i) => { H[i] = (H[i] + word) & MASK64; });
  }
  const digest = new Uint8Array(64);
  const out = new DataView(digest.buffer);
  H.forEach((word, i) => out.setBigUint64(8 * i, word));
  return digest;
}

// ============================================================================ Ed25519
// RFC 8032, section 5.1: edwards25519, points in extended coordinates (X, Y, Z, T), x = X/Z,
// y = Y/Z, x*y = T/Z.

const P = 2n ** 255n - 19n;                                   // the field's prime
const L = 2n ** 252n + 27742317777372353535851937790883648493n;   // the order of the base point

const mod = (a, m = P) => { const r = a % m; return r < 0n ? r + m : r; };

function modPow(base, exponent, m = P) {
  let result = 1n;
  base = mod(base, m);
  while (exponent > 0n) {
    if (exponent & 1n) result = (result * base) % m;
    base = (base * base) % m;
    exponent >>= 1n;
  }
  return result;
}

const inverse = (a) => modPow(a, P - 2n);                     // Fermat: a^(p-2) = 1/a mod p
const D = mod(-121665n * inverse(121666n));                   // the curve's d
const SQRT_M1 = modPow(2n, (P - 1n) / 4n);                    // a square root of -1
const IDENTITY = [0n, 1n, 1n, 0n];

/** Point addition, RFC 8032 5.1.4. These formulas are complete: they also double a point. */
function pointAdd([X1, Y1, Z1, T1], [X2, Y2, Z2, T2]) {
  const A = mod((Y1 - X1) * (Y2 - X2)), B = mod((Y1 + X1) * (Y2 + X2));
  const C = mod(T1 * 2n * D * T2), Dz = mod(Z1 * 2n * Z2);
  const E = B - A, F = Dz - C, G = Dz + C, H = B + A;
  return [mod(E * F), mod(G * H), mod(F * G), mod(E * H)];
}

/** [k]point by double-and-add, lowest bit first. */
function scalarMultiply(k, point) {
  let result = IDENTITY, addend = point;
  while (k > 0n) {
    if (k & 1n) result = pointAdd(result, addend);
    addend = pointAdd(addend, addend);
    k >>= 1n;
  }
  return result;
}

/** Same point? Compare x and y without dividing: X1/Z1 = X2/Z2 and Y1/Z1 = Y2/Z2. */
const pointsEqual = ([X1, Y1, Z1], [X2, Y2, Z2]) =>
  mod(X1 * Z2) === mod(X2 * Z1) && mod(Y1 * Z2) === mod(Y2 * Z1);

const littleEndian = (bytes) => bytes.reduceRight((n, byte) => (n << 8n) | BigInt(byte), 0n);

/** Point decoding, RFC 8032 5.1.3; null where the RFC says decoding fails. */
function decodePoint(bytes) {
  if (bytes.length !== 32) return null;
  // Step 1: y is the low 255 bits, x_0 the top bit; y must be below p.
  const whole = littleEndian(bytes);
  const x0 = whole >> 255n, y = whole & ((1n << 255n) - 1n);
  if (y >= P) return null;
  // Step 2: x^2 = (y^2 - 1) / (d y^2 + 1); the candidate root x = u v^3 (u v^7)^((p-5)/8).
  const u = mod(y * y - 1n), v = mod(D * y * y + 1n);
  let x = mod(u * modPow(v, 3n) * modPow(u * modPow(v, 7n), (P - 5n) / 8n));
  // Step 3: v x^2 = u: x is a root; = -u: x * sqrt(-1) is; otherwise there is none.
  const vxx = mod(v * x * x);
  if (vxx === u) { /* x is right */ }
  else if (vxx === mod(-u)) x = mod(x * SQRT_M1);
  else return null;
  // Step 4: x = 0 with x_0 = 1 fails; otherwise pick the root whose parity is x_0.
  if (x === 0n && x0 === 1n) return null;
  if ((x & 1n) !== x0) x = P - x;
  return [x, y, 1n, mod(x * y)];
}

/** The base point B: y = 4/5, x even. */
const BASE = decodePoint(Uint8Array.from({ length: 32 }, (_, i) =>
  Number((mod(4n * inverse(5n)) >> BigInt(8 * i)) & 0xffn)));

/** Ed25519 verification, RFC 8032 5.1.7. */
function ed25519Verify(publicKey, message, signature) {
  if (publicKey.length !== 32 || signature.length !== 64) return false;
  // Step 1: decode A and R as points, S as an integer; S >= L is a non-canonical signature.
  const A = decodePoint(publicKey);
  const R = decodePoint(signature.subarray(0, 32));
  const S = littleEndian(signature.subarray(32));
  if (A === null || R === null || S >= L) return false;
  // Step 2: k = SHA-512(R || A || M) as a little-endian integer (dom2 is empty for Ed25519).
  const k = mod(littleEndian(sha512(concatBytes(signature.subarray(0, 32), publicKey, message))), L);
  // Step 3: [S]B = R + [k]A. The RFC allows this check instead of the one multiplied by the
  // cofactor 8; it is the one OpenSSL, behind Python's cryptography, makes.
  return pointsEqual(scalarMultiply(S, BASE), pointAdd(R, scalarMultiply(k, A)));
}

// ============================================================= Python's json, and its values
// A JSON value is held as Python's json.loads would make it: {type: "dict", map}, {type: "list",
// items}, {type: "str", value}, {type: "int", big}, {type: "float", value}, {type: "bool", value}
// or {type: "NoneType"}; type is the name of Python's type.

const NONE = { type: "NoneType" };

/** json.loads(text, parse_constant=<reject>) as CPython's C scanner does it, with its error texts
 *  ("Expecting value: line 1 column 1 (char 0)", ...); positions count code points. */
function loadsPython(text) {
  const s = Array.from(text, (ch) => ch.codePointAt(0));
  const n = s.length;
  const MAX_DEPTH = 990;           // about where Python's recursion limit stops json
  const isSpace = (c) => c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
  const isDigit = (c) => c >= 0x30 && c <= 0x39;
  const skip = (i) => { while (i < n && isSpace(s[i])) i++; return i; };
  const startsWith = (i, word) => Array.from(word).every((ch, k) => s[i + k] === ch.charCodeAt(0));

  function fail(message, pos) {   // json.JSONDecodeError's text
    let line = 1, lastNewline = -1;
    for (let i = 0; i < pos; i++) if (s[i] === 0x0a) { line++; lastNewline = i; }
    throw new JsonError(`${message}: line ${line} column ${pos - lastNewline} (char ${pos})`);
  }

  function value(i, depth) {
    if (i >= n) throw new NoValue(i);
    const c = s[i];
    if (c === 0x22) return string(i + 1);
    if (c === 0x7b || c === 0x5b) {
      if (depth >= MAX_DEPTH) {
        throw new JsonError("maximum recursion depth exceeded while decoding a JSON " +
                            (c === 0x7b ? "object" : "array") + " from a unicode string");
      }
      return c === 0x7b ? object(i + 1, depth + 1) : array(i + 1, depth + 1);
    }
    if (startsWith(i, "null")) return [NONE, i + 4];
    if (startsWith(i, "true")) return [{ type: "bool", value: true }, i + 4];
    if (startsWith(i, "false")) return [{ type: "bool", value: false }, i + 5];
    for (const constant of ["NaN", "Infinity", "-Infinity"]) {
      if (startsWith(i, constant)) throw new JsonError(`${constant} is not a number JSON allows`);
    }
    return number(i);
  }

  function number(start) {
    let i = start, isFloat = false;
    if (s[i] === 0x2d && ++i >= n) throw new NoValue(start);              // "-"
    if (s[i] >= 0x31 && s[i] <= 0x39) { i++; while (i < n && isDigit(s[i])) i++; }
    else if (s[i] === 0x30) i++;                                          // one leading 0 only
    else throw new NoValue(start);
    if (i < n - 1 && s[i] === 0x2e && isDigit(s[i + 1])) {               // a fraction
      isFloat = true;
      i += 2;
      while (i < n && isDigit(s[i])) i++;
    }
    if (i < n - 1 && (s[i] === 0x65 || s[i] === 0x45)) {                  // an exponent, or back off
      const exponentStart = i++;
      if (i < n - 1 && (s[i] === 0x2d || s[i] === 0x2b)) i++;
      while (i < n && isDigit(s[i])) i++;
      if (isDigit(s[i - 1])) isFloat = true;
      else i = exponentStart;
    }
    const literal = fromCodePoints(s, start, i);
    if (isFloat) return [{ type: "float", value: Number(literal) }, i];  // both round correctly
    const digits = literal.replace("-", "").length;
    if (digits > 4300) {
      throw new JsonError("Exceeds the limit (4300 digits) for integer string conversion: value has " +
                          `${digits} digits; use sys.set_int_max_str_digits() to increase the limit`);
    }
    return [{ type: "int", big: BigInt(literal) }, i];
  }

  function hex4(i) {                          // the value of 4 hex digits at s[i], or -1
    let u = 0;
    for (let k = i; k < i + 4; k++) {
      const c = s[k];
      if (c >= 0x30 && c <= 0x39) u = u * 16 + c - 0x30;               // 0-9
      else if (c >= 0x61 && c <= 0x66) u = u * 16 + c - 0x61 + 10;      // a-f
      else if (c >= 0x41 && c <= 0x46) u = u * 16 + c - 0x41 + 10;      // A-F
      else return -1;
    }
    return u;
  }

  function string(end) {                       // end: just after the opening quote
    const begin = end - 1, parts = [];
    for (;;) {
      let next = end;
      for (; next < n; next++) {
        if (s[next] === 0x22 || s[next] === 0x5c) break;
        if (s[next] <= 0x1f) fail("Invalid control character at", next);
      }
      if (next >= n) fail("Unterminated string starting at", begin);
      const c = s[next];
      parts.push(fromCodePoints(s, end, next));
      next++;
      if (c === 0x22) return [{ type: "str", value: parts.join("") }, next];
      if (next === n) fail("Unterminated string starting at", begin);
      if (s[next] !== 0x75) {                  // \" \\ \/ \b \f \n \r \t
        end = next + 1;
        const simple = { 0x22: '"', 0x5c: "\\", 0x2f: "/", 0x62: "\b", 0x66: "\f", 0x6e: "\n", 0x72: "\r",
                         0x74: "\t" }[s[next]];
        if (simple === undefined) fail("Invalid \\escape", end - 2);
        parts.push(simple);
        continue;
      }
      next++;                                  // \uXXXX, and a surrogate pair joined
      end = next + 4;
      if (end >= n) fail("Invalid \\uXXXX escape", next - 1);
      let u = hex4(next);
      if (u < 0) fail("Invalid \\uXXXX escape", end - 5);
      if (u >= 0xd800 && u <= 0xdbff && end + 6 < n && s[end] === 0x5c && s[end + 1] === 0x75) {
        const low = hex4(end + 2);
        if (low < 0) fail("Invalid \\uXXXX escape", end + 1);
        if (low >= 0xdc00 && low <= 0xdfff) {
          u = 0x10000 + ((u - 0xd800) << 10) + (low - 0xdc00);
          end += 6;
        }
      }
      parts.push(String.fromCodePoint(u));     // a lone surrogate stays one, as in Python
    }
  }

  function object(i, depth) {
    const map = new Map();                     // a repeated key keeps its place and takes the last value
    i = skip(i);
    if (i >= n || s[i] !== 0x7d) {
      for (;;) {
        if (i >= n || s[i] !== 0x22) fail("Expecting property name enclosed in double quotes", i);
        let key, item;
        [key, i] = string(i + 1);
        i = skip(i);
        if (i >= n || s[i] !== 0x3a) fail("Expecting ':' delimiter", i);
        [item, i] = value(skip(i + 1), depth);
        map.set(key.value, item);
        i = skip(i);
        if (i < n && s[i] === 0x7d) break;
        if (i >= n || s[i] !== 0x2c) fail("Expecting ',' delimiter", i);
        i = skip(i + 1);
      }
    }
    return [{ type: "dict", map }, i + 1];
  }

  function array(i, depth) {
    const items = [];
    i = skip(i);
    if (i >= n || s[i] !== 0x5d) {
      for (;;) {
        let item;
        [item, i] = value(i, depth);
        items.push(item);
        i = skip(i);
        if (i < n && s[i] === 0x5d) break;
        if (i >= n || s[i] !== 0x2c) fail("Expecting ',' delimiter", i);
        i = skip(i + 1);
      }
    }
    return [{ type: "list", items }, i + 1];
  }

  if (s[0] === 0xfeff) fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0);
  let result, end;
  try { [result, end] = value(skip(0), 0); }
  catch (error) { if (error instanceof NoValue) fail("Expecting value", error.pos); throw error; }
  end = skip(end);
  if (end !== n) fail("Extra data", end);
  return result;
}

/** The shortest digits that read back as x > 0, and the decimal point's place: x = 0.DIGITS * 10^point.
 *  ECMAScript's Number::toString gives the shortest round-trip digits, the closest when several are,
 *  as Python's repr does. */
function shortestDigits(x) {
  const [mantissa, exponent = "0"] = String(x).split("e");
  const [whole, fraction = ""] = mantissa.split(".");
  let digits = whole + fraction, point = whole.length + Number(exponent);
  const zeros = /^0*/.exec(digits)[0].length;
  digits = digits.slice(zeros).replace(/0+$/, "");
  return [digits, point - zeros];
}

/** Python's repr(float): "600.0", "1e-05", "0.30000000000000004", "1e+16", "inf". */
function floatRepr(x) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [digits, point] = shortestDigits(Math.abs(x));
  if (point > -4 && point <= 16) {                       // positional, always with a fraction
    if (point <= 0) return `${sign}0.${"0".repeat(-point)}${digits}`;
    if (point >= digits.length) return `${sign}${digits}${"0".repeat(point - digits.length)}.0`;
    return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
  }
  const exponent = point - 1;                           // scientific, two exponent digits at least
  return `${sign}${digits[0]}${digits.length > 1 ? "." + digits.slice(1) : ""}e` +
         `${exponent < 0 ? "-" : "+"}${String(Math.abs(exponent)).padStart(2, "0")}`;
}

/** Python's format(x, f".{places}f"): the exact binary value rounded half to even. */
function fixed(x, places) {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  const sign = x < 0 || Object.is(x, -0) ? "-" : "";
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, Math.abs(x));
  const bits = view.getBigUint64(0);
  const biased = Number(bits >> 52n), fraction = bits & ((1n << 52n) - 1n);
  const mantissa = biased === 0 ? fraction : fraction | (1n << 52n);
  const shift = (biased === 0 ? 1 : biased) - 1075;    // |x| = mantissa * 2^shift exactly
  let scaled = mantissa * 10n ** BigInt(places), q;
  if (shift >= 0) q = scaled << BigInt(shift);
  else {
    const divisor = 1n << BigInt(-shift), r = scaled % divisor;
    q = scaled / divisor;
    if (2n * r > divisor || (2n * r === divisor && (q & 1n))) q += 1n;
  }
  const text = q.toString().padStart(places + 1, "0");
  return sign + (places ? `${text.slice(0, -places)}.${text.slice(-places)}` : text);
}

const NON_PRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;

/** Python's repr(str). */
function strRepr(text) {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of text) {
    const c = ch.codePointAt(0);
    if (ch === quote || ch === "\\") out += "\\" + ch;
    else if (ch === "\t") out += "\\t";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch !== " " && NON_PRINTABLE.test(ch)) {
      out += c < 0x100 ? "\\x" + hex(c, 2) : c < 0x10000 ? "\\u" + hex(c, 4) : "\\U" + hex(c, 8);
    } else out += ch;
  }
  return out + quote;
}

const bitLength = (big) => (big < 0n ? -big : big).toString(2).replace(/^0$/, "").length;

/** certificates._show: a value for a one-line message. */
function show(value, limit = 40) {
  let text;
  if (value.type === "str") text = strRepr(codePoints(value.value).slice(0, limit).join(""));
  else if (value.type === "int" && bitLength(value.big) > 128) text = `a ${bitLength(value.big)}-bit integer`;
  else if (value.type === "int") text = value.big.toString();
  else if (value.type === "float") text = floatRepr(value.value);
  else if (value.type === "bool") text = value.value ? "True" : "False";
  else if (value.type === "NoneType") text = "None";
  else text = `a ${value.type}`;
  const points = codePoints(text);
  return points.length <= limit ? text : points.slice(0, limit - 3).join("") + "...";
}

/** A JSON string as json.dumps(ensure_ascii=False) writes it. */
function quoteJson(text) {
  const escapes = { '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f" };
  return '"' + text.replace(/[\x00-\x1f"\\]/g, (ch) => escapes[ch] || "\\u" + hex(ch.charCodeAt(0), 4)) + '"';
}

/** Python's order of str keys: by code point (not by UTF-16 unit, as JavaScript's sort is). */
function compareCodePoints(a, b) {
  const x = codePoints(a), y = codePoints(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

/** json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False) */
function canonicalText(value) {
  switch (value.type) {
    case "dict":
      return "{" + [...value.map.keys()].sort(compareCodePoints)
        .map((key) => quoteJson(key) + ":" + canonicalText(value.map.get(key))).join(",") + "}";
    case "list": return "[" + value.items.map(canonicalText).join(",") + "]";
    case "str": return quoteJson(value.value);
    case "int": return value.big.toString();
    case "float":
      if (Number.isNaN(value.value)) return "NaN";
      if (!Number.isFinite(value.value)) return value.value > 0 ? "Infinity" : "-Infinity";
      return floatRepr(value.value);
    case "bool": return value.value ? "true" : "false";
    default: return "null";
  }
}

const canonicalBytes = (value) => encodeUtf8(canonicalText(value));

// ===================================================================== certificates.verify

/** certificates.read_certificate on a file's bytes: the JSON document (a dict), or CertificateError. */
function readCertificate(bytes, name) {
  if (bytes.length > CONFIG.max_file_bytes) {
    throw new CertificateError(`${name} has ${bytes.length} bytes: too large to be a certificate`);
  }
  if (latin1(bytes.subarray(0, 5)) === "%PDF-") {
    const marker = CONFIG.pdf_marker.replace(/[.*+?^${}()|[\]\\/-]/g, "\\$&");
    const pattern = new RegExp(`\\(${marker}([A-Za-z0-9+/=]*)\\)`, "g");
    const payloads = new Set(Array.from(latin1(bytes).matchAll(pattern), (match) => match[1]));
    if (payloads.size === 0) {
      throw new CertificateError("a PDF without an embedded certificate: pass a PDF written by the grader, or the .json");
    }
    if (payloads.size > 1) {
      throw new CertificateError(`a PDF with ${payloads.size} different embedded certificates: it was edited after ` +
                                 "it was issued");
    }
    bytes = b64decode([...payloads][0]);
    if (bytes === null) {
      throw new CertificateError("the PDF's embedded certificate is not base64: it was edited after it was issued");
    }
  }
  const text = decodeUtf8(bytes);
  if (text === null) {
    throw new CertificateError("not JSON: the file is not UTF-8 text (pass the certificate's .json or .pdf)");
  }
  let document;
  try { document = loadsPython(text); }
  catch (error) {
    if (!(error instanceof JsonError)) throw error;
    const message = codePoints(error.message).slice(0, 80).join("");
    throw new CertificateError(`not JSON: ${message} (pass the certificate's .json or .pdf)`);
  }
  if (document.type !== "dict") {
    throw new CertificateError(`not a certificate: a JSON ${document.type}, expected an object with ` +
                               DOCUMENT_KEYS.join(", "));
  }
  return document;
}

/** certificates._type_problem */
function typeProblem(certificate) {
  if (certificate.type !== "dict") {
    return `not a certificate: its certificate is a ${certificate.type}, not an object`;
  }
  const fields = new Map(CONFIG.fields);
  for (const name of certificate.map.keys()) {
    if (!fields.has(name)) return `unknown field ${show({ type: "str", value: name })}: not a field of ${FORMAT}`;
  }
  for (const [name, kind] of fields) {
    if (!certificate.map.has(name)) return `field ${name} is missing`;
    const value = certificate.map.get(name);
    if (kind === "float") {
      if (value.type !== "float" || !Number.isFinite(value.value)) {
        return `field ${name} is ${show(value)}: expected a finite number with a decimal point`;
      }
    } else if (kind === "int") {
      if (value.type !== "int") return `field ${name} is ${show(value)}: expected a whole number`;
    } else if (value.type !== "str") {
      return `field ${name} is ${show(value)}: expected a string`;
    } else if (/\p{Cs}/u.test(value.value)) {
      return `field ${name} is not valid Unicode text`;
    }
  }
  return null;
}

/** certificates._document_problem */
function documentProblem(document) {
  const format = document.map.has("format") ? document.map.get("format") : NONE;
  if (format.type !== "str" || format.value !== FORMAT) {
    return `not a certificate: format ${show(format)}, expected ${strRepr(FORMAT)}`;
  }
  for (const name of DOCUMENT_KEYS) {
    if (!document.map.has(name)) return `not a certificate: no ${name}`;
  }
  for (const name of document.map.keys()) {
    if (!DOCUMENT_KEYS.includes(name)) {
      return `not a certificate: unexpected key ${show({ type: "str", value: name })} beside ${DOCUMENT_KEYS.join(", ")}`;
    }
  }
  const problem = typeProblem(document.map.get("certificate"));
  if (problem) return problem;
  for (const name of ["key_id", "signature"]) {
    const value = document.map.get(name);
    if (value.type !== "str") return `${name} is ${show(value)}: expected a string`;
  }
  return null;
}

/** The bytes the course signed: certificates._signed_bytes. */
function signedBytes(certificate, keyId) {
  const map = new Map([["format", { type: "str", value: FORMAT }], ["certificate", certificate],
                       ["key_id", { type: "str", value: keyId }]]);
  return canonicalBytes({ type: "dict", map });
}

/** A plain object of the signed fields, each value as Python prints it. */
function fieldsShown(certificate) {
  const shown = {};
  for (const [name, value] of certificate.map) {
    shown[name] = value.type === "float" ? floatRepr(value.value) : value.type === "int" ? value.big.toString()
                                                                                           : value.value;
  }
  return shown;
}

/** certificates.verify on a parsed document, in its order: a certificate, the key ID, the signature,
 *  then revocation. Returns {verdict, reason, fields (when the signature is valid)}. */
function verifyDocument(document, newerRevocations) {
  const problem = documentProblem(document);
  if (problem) return { verdict: "tampered", reason: problem };
  const certificate = document.map.get("certificate"), keyId = document.map.get("key_id");
  if (keyId.value !== CONFIG.key_id) {
    return { verdict: "other-key",
             reason: `signed by another key (key id ${show(keyId)}), not this course's key (${CONFIG.key_id})` };
  }
  const signature = b64decode(document.map.get("signature").value);
  if (signature === null) return { verdict: "tampered", reason: `${CHANGED} (the signature is not base64)` };
  if (signature.length !== CONFIG.signature_bytes) {
    return { verdict: "tampered",
             reason: `${CHANGED} (the signature has ${signature.length} bytes, not ${CONFIG.signature_bytes})` };
  }
  if (!ed25519Verify(hexToBytes(CONFIG.public_key), signedBytes(certificate, keyId.value), signature)) {
    return { verdict: "tampered", reason: CHANGED };
  }
  const c = fieldsShown(certificate), values = certificate.map;
  const id = c.certificate_id.toLowerCase();
  const reason = (newerRevocations && newerRevocations.get(id)) ??
                 (Object.hasOwn(CONFIG.revoked, id) ? CONFIG.revoked[id] : undefined);
  if (reason !== undefined) {
    return { verdict: "revoked", fields: c,
             reason: `revoked: ${reason} (the signature is valid; the ID is on the course's revocation list)` };
  }
  const f = (name, places) => fixed(values.get(name).value, places);
  return { verdict: "valid", fields: c,
           reason: `valid: ${c.name} (student ${c.student_id}), ${c.course}, ${c.assignment}: accuracy ` +
                   `${f("accuracy", 3)} (target ${f("target_accuracy", 3)}) in ${f("reached_seconds", 0)} s ` +
                   `(budget ${f("time_budget_s", 0)} s) on ${c.workers} workers, profile ${c.profile}, dataset ` +
                   `${c.dataset}, issued ${c.issued_at}` };
}

/** The whole check on a file's bytes. */
function verifyBytes(bytes, name, newerRevocations) {
  let document;
  try { document = readCertificate(bytes, name); }
  catch (error) {
    if (error instanceof CertificateError) return { verdict: "unreadable", reason: error.message };
    throw error;
  }
  return verifyDocument(document, newerRevocations);
}

// ============================================================ the revocation list (revoked.txt)

const PY_SPACE = "\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const LINE_BREAK = /\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]/;     // str.splitlines()
const strip = (text) => text.replace(new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, "g"), "");

/** certificates.read_revocations on the text of a list: Map of ID to reason, or CertificateError. */
function parseRevocations(text, name) {
  const listed = new Map();
  const lines = text.split(LINE_BREAK);
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  lines.forEach((raw, index) => {
    const line = strip(raw);
    if (!line || line.startsWith("#")) return;
    const [, first, rest = ""] = new RegExp(`^([^${PY_SPACE}]+)(?:[${PY_SPACE}]+([^]*))?$`).exec(line);
    const id = strip(first).toLowerCase();
    if (!/^[0-9a-f]{32}$/.test(id)) {
      throw new CertificateError(`${name} line ${index + 1}: ${show({ type: "str", value: first })} is not a ` +
                                 "certificate ID (32 hex digits): fix or remove the line");
    }
    listed.set(id, strip(rest) || "no reason given");
  });
  return listed;
}

// ============================================================================== the page

const $ = (id) => document.getElementById(id);
const WORDS = { valid: "VALID", tampered: "TAMPERED", revoked: "REVOKED", "other-key": "OTHER KEY",
                unreadable: "UNREADABLE" };
// The last certificate ({bytes, name}); the newer list loaded ({name, listed}); why that list is unusable.
const page = { certificate: null, newer: null, listError: null };

function showMessage(word, reason) {
  $("verdict").removeAttribute("data-verdict");
  $("verdict-word").textContent = word;
  $("reason").textContent = reason;
  $("fields").hidden = true;
}

function check() {
  if (page.listError) {             // as the command line, which stops on a bad list: no verdict without it
    showMessage("No verdict", `The revocation list ${page.listError}. Load a corrected list, or reload the page to ` +
                "check against the embedded list only.");
    return;
  }
  if (!page.certificate) return;
  const started = performance.now();
  let result;
  try { result = verifyBytes(page.certificate.bytes, page.certificate.name, page.newer && page.newer.listed); }
  catch (error) { showMessage("No verdict", `the check failed inside this page (${error}): use the command line`); return; }
  const elapsed = performance.now() - started;
  $("verdict").dataset.verdict = result.verdict;
  $("verdict-word").textContent = WORDS[result.verdict];
  $("reason").textContent = result.reason;
  $("elapsed-ms").textContent = elapsed.toFixed(1);
  const body = $("fields-body");
  body.replaceChildren();
  for (const [name, value] of Object.entries(result.fields || {})) {
    const row = body.insertRow(), label = document.createElement("th");
    label.scope = "row";
    label.textContent = name;
    row.append(label);
    row.insertCell().textContent = value;
  }
  $("fields").hidden = !result.fields;
}

async function readFile(file) {
  if (file.size > CONFIG.max_file_bytes) return null;
  return new Uint8Array(await file.arrayBuffer());
}

$("cert-file").addEventListener("change", async (event) => {
  const file = event.target.files[0];
  if (!file) return;
  const bytes = await readFile(file);
  if (bytes === null) {
    page.certificate = null;
    $("verdict").dataset.verdict = "unreadable";
    $("verdict-word").textContent = WORDS.unreadable;
    $("reason").textContent = `${file.name} has ${file.size} bytes: too large to be a certificate`;
    $("fields").hidden = true;
    return;
  }
  page.certificate = { bytes, name: file.name };
  check();
});

$("revoked-file").addEventListener("change", async (event) => {
  const file = event.target.files[0];
  if (!file) return;
  const embedded = `Revocation list embedded on ${CONFIG.generated_at}: ${Object.keys(CONFIG.revoked).length}`;
  const bytes = await readFile(file);
  const text = bytes === null ? null : decodeUtf8(bytes);
  page.newer = null;
  page.listError = null;
  try {
    if (text === null) throw new CertificateError(`cannot read the revocation list ${file.name}: not UTF-8 text`);
    page.newer = { name: file.name, listed: parseRevocations(text, file.name) };
  } catch (error) {
    if (!(error instanceof CertificateError)) throw error;
    page.listError = `${file.name} cannot be used (${error.message})`;
    $("revocations").dataset.state = "error";
    $("revocations").textContent = `${embedded}; ${file.name} is not used: ${error.message}`;
    check();
    return;
  }
  $("revocations").dataset.state = "loaded";
  $("revocations").textContent = `${embedded}, and ${page.newer.listed.size} in ${file.name}, used as well.`;
  check();
});

/** #cert=..., and the test hooks #sha512=... and #canonical=... */
function fromFragment() {
  const parts = new Map(location.hash.replace(/^#/, "").split("&").filter(Boolean).map((part) => {
    const at = part.indexOf("=");
    return at < 0 ? [part, ""] : [part.slice(0, at), part.slice(at + 1)];
  }));
  const debug = [];
  for (const [hook, run] of [["sha512", (bytes) => bytesToHex(sha512(bytes))],
                             ["canonical", (bytes) => bytesToHex(sha512(canonicalBytes(loadsPython(decodeUtf8(bytes)))))]]) {
    if (!parts.has(hook)) continue;
    for (const item of parts.get(hook).split(",")) {
      const bytes = b64urlDecode(item);
      try { debug.push(bytes === null ? "error: not base64url" : run(bytes)); }
      catch (error) { debug.push(`error: ${error.message}`); }
    }
  }
  if (debug.length) {
    $("debug-output").textContent = debug.join("\n");
    $("debug-output").hidden = false;
  }
  if (parts.has("cert")) {
    const bytes = b64urlDecode(parts.get("cert"));
    if (bytes === null) {
      page.certificate = null;
      $("verdict").dataset.verdict = "unreadable";
      $("verdict-word").textContent = WORDS.unreadable;
      $("reason").textContent = "the link's #cert= is not base64url: copy the whole link";
      $("fields").hidden = true;
      return;
    }
    page.certificate = { bytes, name: "the certificate in the link" };
    check();
  }
}

window.addEventListener("hashchange", fromFragment);
window.mgpuCertificates = { verifyBytes, readCertificate, loadsPython, canonicalBytes, canonicalText, sha512,
                            ed25519Verify, decodePoint, parseRevocations, floatRepr, fixed, strRepr, b64decode,
                            b64urlDecode, bytesToHex, hexToBytes, encodeUtf8 };
fromFragment();
})();
"""
