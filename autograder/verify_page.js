// The script of the certificate-checking page (autograder/verify_page.py inlines this file's text
// into the page it writes, so the page stays one file that works from a file:// URL).
//
// It does what autograder.certificates.verify does, in the same order and with the same reasons.
// The cryptography is the browser's: Ed25519 (RFC 8032) through WebCrypto (crypto.subtle,
// Chromium 137+, Firefox 129+, Safari 17+). What the page does itself is rebuild the exact bytes
// Python signed, with a JSON reader that keeps what JSON.parse loses (600.0 is a float, 600 an int;
// a lone surrogate stays one) and a writer that follows json.dumps(..., sort_keys=True,
// separators=(",", ":"), ensure_ascii=False) with floats written as Python's repr writes them.
"use strict";
(() => {
const CONFIG = JSON.parse(document.getElementById("mgpu-config").textContent);
const FORMATS = new Map(Object.entries(CONFIG.formats));   // format -> [[field, kind], ...]
const FORMAT_2 = CONFIG.format_2;                            // Assessment B's: a title and a sentence
const DOCUMENT_KEYS = ["format", "certificate", "key_id", "signature"];
const CHANGED = "the signature does not match: a field was changed after signing";

/** Why a file cannot be read as a certificate (certificates.CertificateError). */
class CertificateError extends Error {}
/** What Python's json.loads raises (ValueError, JSONDecodeError, RecursionError), as its text. */
class JsonError extends Error {}
/** json's StopIteration: no JSON value starts at pos. */
class NoValue { constructor(pos) { this.pos = pos; } }
/** This browser's WebCrypto cannot verify Ed25519: no verdict is possible here. */
class NoEd25519 extends Error {}

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

// ============================================================= Ed25519, by the browser (WebCrypto)

const ED25519 = { name: "Ed25519" };
const NO_ED25519 = "This browser cannot check the signature: its WebCrypto does not verify Ed25519. Open this " +
                   "page in Chrome or Edge 137+, Firefox 129+ or Safari 17+, or use the command line below.";

/** RFC 8032's first Ed25519 test vector (section 7.1, TEST 1: the empty message). */
const RFC8032_KEY = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
const RFC8032_SIGNATURE = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e" +
                          "39701cf9b46bd25bf5f0595bbe24655141438e7a100b";

/** True if the signature (64 bytes) on message is valid under the raw 32-byte public key; NoEd25519
 *  where the browser has no WebCrypto (e.g. a page served over plain http) or no Ed25519 in it. */
async function ed25519Verify(publicKey, message, signature) {
  const subtle = globalThis.crypto && globalThis.crypto.subtle;
  if (!subtle) throw new NoEd25519("no crypto.subtle in this page");
  let key;
  try { key = await subtle.importKey("raw", publicKey, ED25519, false, ["verify"]); }
  catch (error) { throw new NoEd25519(`crypto.subtle.importKey refused an Ed25519 key (${error.name})`); }
  return subtle.verify(ED25519, key, signature, message);
}

let selfTest = null;

/** Whether this browser verifies Ed25519 right: RFC 8032's vector passes, and fails with one bit changed.
 *  Found once; no signature is judged without it (a verify that says yes to everything gives no verdict). */
function ed25519Works() {
  selfTest ??= (async () => {
    try {
      const key = hexToBytes(RFC8032_KEY), good = hexToBytes(RFC8032_SIGNATURE), bad = good.slice();
      bad[40] ^= 0x01;
      return await ed25519Verify(key, new Uint8Array(0), good) === true &&
             await ed25519Verify(key, new Uint8Array(0), bad) === false;
    } catch (error) { return false; }
  })();
  return selfTest;
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
function typeProblem(certificate, format) {
  if (certificate.type !== "dict") {
    return `not a certificate: its certificate is a ${certificate.type}, not an object`;
  }
  const fields = new Map(FORMATS.get(format));
  for (const name of certificate.map.keys()) {
    if (!fields.has(name)) return `unknown field ${show({ type: "str", value: name })}: not a field of ${format}`;
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
  if (format.type !== "str" || !FORMATS.has(format.value)) {
    return `not a certificate: format ${show(format)}, expected ${[...FORMATS.keys()].map(strRepr).join(" or ")}`;
  }
  for (const name of DOCUMENT_KEYS) {
    if (!document.map.has(name)) return `not a certificate: no ${name}`;
  }
  for (const name of document.map.keys()) {
    if (!DOCUMENT_KEYS.includes(name)) {
      return `not a certificate: unexpected key ${show({ type: "str", value: name })} beside ${DOCUMENT_KEYS.join(", ")}`;
    }
  }
  const problem = typeProblem(document.map.get("certificate"), format.value);
  if (problem) return problem;
  for (const name of ["key_id", "signature"]) {
    const value = document.map.get(name);
    if (value.type !== "str") return `${name} is ${show(value)}: expected a string`;
  }
  return null;
}

/** The bytes the course signed: certificates._signed_bytes. */
function signedBytes(certificate, keyId, format) {
  const map = new Map([["format", { type: "str", value: format }], ["certificate", certificate],
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
 *  then revocation. Resolves to {verdict, reason, fields (when the signature is valid)}; rejects with
 *  NoEd25519 where the browser cannot verify the signature. */
async function verifyDocument(document, newerRevocations) {
  const problem = documentProblem(document);
  if (problem) return { verdict: "tampered", reason: problem };
  const certificate = document.map.get("certificate"), keyId = document.map.get("key_id");
  const format = document.map.get("format").value;
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
  if (!await ed25519Works()) throw new NoEd25519("this browser fails RFC 8032's Ed25519 test vector");
  if (!await ed25519Verify(hexToBytes(CONFIG.public_key), signedBytes(certificate, keyId.value, format), signature)) {
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
  if (format === FORMAT_2) {
    return { verdict: "valid", fields: c,
             reason: `valid: ${c.name} (student ${c.student_id}), ${c.course}, ${c.assessment} (${c.assignment}): ` +
                     `${c.achievement}; ${c.workers} workers, profile ${c.profile}, data ${c.data}, issued ${c.issued_at}` };
  }
  const f = (name, places) => fixed(values.get(name).value, places);
  return { verdict: "valid", fields: c,
           reason: `valid: ${c.name} (student ${c.student_id}), ${c.course}, ${c.assignment}: accuracy ` +
                   `${f("accuracy", 3)} (target ${f("target_accuracy", 3)}) in ${f("reached_seconds", 0)} s ` +
                   `(budget ${f("time_budget_s", 0)} s) on ${c.workers} workers, profile ${c.profile}, dataset ` +
                   `${c.dataset}, issued ${c.issued_at}` };
}

/** The whole check on a file's bytes (a promise of the result). */
async function verifyBytes(bytes, name, newerRevocations) {
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
// The last certificate ({bytes, name}); the newer list loaded ({name, listed}); why that list is unusable;
// the number of the latest check (a check that has been overtaken while it awaited the browser shows nothing).
const page = { certificate: null, newer: null, listError: null, run: 0 };

function showMessage(word, reason) {
  $("verdict").removeAttribute("data-verdict");
  $("verdict-word").textContent = word;
  $("reason").textContent = reason;
  $("fields").hidden = true;
}

function showResult(result, elapsed) {
  $("verdict").dataset.verdict = result.verdict;
  $("verdict-word").textContent = WORDS[result.verdict];
  $("reason").textContent = result.reason;
  if (elapsed !== undefined) $("elapsed-ms").textContent = elapsed.toFixed(1);
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

/** A verdict found without a check (a file too large, a broken link): it overtakes any check under way. */
function showUnreadable(reason) {
  page.run++;
  page.certificate = null;
  showResult({ verdict: "unreadable", reason });
}

async function check() {
  const run = ++page.run;
  if (page.listError) {             // as the command line, which stops on a bad list: no verdict without it
    showMessage("No verdict", `The revocation list ${page.listError}. Load a corrected list, or reload the page to ` +
                "check against the embedded list only.");
    return;
  }
  if (!page.certificate) return;
  const started = performance.now();
  let result;
  try { result = await verifyBytes(page.certificate.bytes, page.certificate.name, page.newer && page.newer.listed); }
  catch (error) {
    if (run !== page.run) return;
    if (error instanceof NoEd25519) showMessage("No verdict", NO_ED25519);
    else showMessage("No verdict", `the check failed inside this page (${error}): use the command line`);
    return;
  }
  if (run === page.run) showResult(result, performance.now() - started);
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
    showUnreadable(`${file.name} has ${file.size} bytes: too large to be a certificate`);
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

/** #cert=..., and the test hook #canonical=<b64url of JSON>,... (the hex of each one's canonical bytes). */
function fromFragment() {
  const parts = new Map(location.hash.replace(/^#/, "").split("&").filter(Boolean).map((part) => {
    const at = part.indexOf("=");
    return at < 0 ? [part, ""] : [part.slice(0, at), part.slice(at + 1)];
  }));
  const debug = [];
  for (const item of parts.has("canonical") ? parts.get("canonical").split(",") : []) {
    const bytes = b64urlDecode(item);
    try { debug.push(bytes === null ? "error: not base64url" : bytesToHex(canonicalBytes(loadsPython(decodeUtf8(bytes))))); }
    catch (error) { debug.push(`error: ${error.message}`); }
  }
  if (debug.length) {
    $("debug-output").textContent = debug.join("\n");
    $("debug-output").hidden = false;
  }
  if (parts.has("cert")) {
    const bytes = b64urlDecode(parts.get("cert"));
    if (bytes === null) {
      showUnreadable("the link's #cert= is not base64url: copy the whole link");
      return;
    }
    page.certificate = { bytes, name: "the certificate in the link" };
    check();
  }
}

/** The line that names the browsers the page needs: kept where this one verifies Ed25519, replaced where not. */
async function showSupport() {
  const works = await ed25519Works();
  $("browser-support").dataset.support = works ? "yes" : "no";
  if (!works) $("browser-support").textContent = NO_ED25519;
}

window.addEventListener("hashchange", fromFragment);
window.mgpuCertificates = { verifyBytes, readCertificate, loadsPython, canonicalBytes, canonicalText, ed25519Verify,
                            ed25519Works, parseRevocations, floatRepr, fixed, strRepr, b64decode, b64urlDecode,
                            bytesToHex, hexToBytes, encodeUtf8, NO_ED25519 };
showSupport();
fromFragment();
})();
