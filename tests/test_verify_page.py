"""The static certificate-checking page (autograder/verify_page.py and verify_page.js) in headless
Chromium: the verdicts and reasons of certificates.verify (valid, tampered, revoked, other key,
unreadable) from a #cert= link and from the page's file inputs, the PDF's embedded record, the
canonical bytes against Python's, the browser's Ed25519 (WebCrypto) against OpenSSL's, no verdict
where the browser has no Ed25519; and the `page` command.

The browser tests need Chromium (Debian: `apt-get install chromium`; .ci/run installs it); without
one they are skipped. Every browser is started in a session of its own with its own HOME and
profile under a temporary folder, and killed after use; the module checks at the end that no
process of theirs is left.
"""

import base64
import fcntl
import html
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from autograder import certificates, verify_page
from autograder.certificates import CertificateError

ROOT = Path(__file__).resolve().parents[1]
CHANGED = "the signature does not match: a field was changed after signing"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium, chromium-browser or google-chrome on "
                                    "PATH: install one (apt-get install chromium; .ci/run does) to test the page")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-crash-reporter", "--no-first-run",
         "--disable-extensions", "--disable-background-networking")
BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
#: RFC 8032: the order of the base point, and the field's prime.
L = 2 ** 252 + 27742317777372353535851937790883648493
P = 2 ** 255 - 19


from test_certificates import _fields, _fields_2  # noqa: E402  (the same certificate fields as the CLI tests)


def _json_bytes(document) -> bytes:
    """A certificate's .json as certificates.issue writes it."""
    return json.dumps(document, indent=2, ensure_ascii=False).encode() + b"\n"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


# ------------------------------------------------------------------------- the browser, by hand

#: Process groups of every browser started here, for the check that none is left.
_GROUPS: set[int] = set()


def _browser_env(root: Path) -> dict:
    home = Path(tempfile.mkdtemp(prefix="home-", dir=root))
    return {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache")}


def _leftovers(root: Path) -> list[int]:
    """Processes of the browsers started here: naming ``root`` (Chromium's crash handler starts a
    session of its own, with its database under our HOME), or Chromium's in one of their groups."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if state != "Z" and (str(root) in cmdline or (int(pgrp) in _GROUPS and "chrom" in cmdline)):
            found.append(int(entry.name))
    return found


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser_root(tmp_path_factory):
    """A folder for the browsers' HOMEs and profiles; at the end, no process of theirs may be left."""
    root = tmp_path_factory.mktemp("chromium")
    yield root
    deadline = time.monotonic() + 15
    while _leftovers(root) and time.monotonic() < deadline:   # crash handlers exit a moment after
        time.sleep(0.2)
    left = _leftovers(root)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"chromium processes were left running: {left} (killed now)"


def _chromium(root: Path, *args: str, timeout: float = 120) -> str:
    """Run headless Chromium once (e.g. --dump-dom URL); its stdout. The whole group is killed after."""
    profile = tempfile.mkdtemp(prefix="profile-", dir=root)
    process = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_browser_env(root),
                               start_new_session=True)
    _GROUPS.add(process.pid)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        _kill_group(process)
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    return stdout.decode()


def _open(root: Path, page: Path, fragment: str, virtual_time: bool = True) -> "_Dom":
    """The page's DOM once its script has run on ``page#fragment``."""
    budget = ("--virtual-time-budget=10000",) if virtual_time else ()
    return _Dom(_chromium(root, *budget, "--dump-dom", f"{page.as_uri()}#{fragment}"))


class _Dom:
    """What the tests read in a dumped DOM: the verdict, the reason, the fields table, the debug output."""

    def __init__(self, text: str):
        self.text = text
        match = re.search(r'<section id="verdict"[^>]*>', text)
        assert match, text[-3000:]
        attribute = re.search(r'data-verdict="([^"]*)"', match.group(0))
        self.verdict = attribute.group(1) if attribute else None
        self.reason = self._text("reason")
        self.elapsed_ms = self._text("elapsed-ms")
        self.debug = self._text("debug-output")
        self.support_line = self._text("browser-support")
        support = re.search(r'<p [^>]*id="browser-support"[^>]*>', text)
        attribute = re.search(r'data-support="([^"]*)"', support.group(0)) if support else None
        self.support = attribute.group(1) if attribute else None
        table = re.search(r'<table id="fields"( hidden="")?>(.*?)</table>', text, re.S)
        rows = re.findall(r'<th scope="row">(.*?)</th><td>(.*?)</td>', table.group(2), re.S)
        self.fields = None if table.group(1) else {html.unescape(k): html.unescape(v) for k, v in rows}

    def _text(self, element_id: str) -> str:
        match = re.search(rf'<(\w+) [^>]*?id="{element_id}"[^>]*>(.*?)</\1>', self.text, re.S)
        return html.unescape(re.sub(r"<[^>]+>", "", match.group(2))) if match else None


#: Moves fds argv[1] and argv[2] to 3 and 4, then executes argv[3:].
_PIPE_EXEC = """import os, sys
for source, target in ((int(sys.argv[1]), 3), (int(sys.argv[2]), 4)):
    os.dup2(source, target)
    os.close(source)
os.execv(sys.argv[3], sys.argv[3:])
"""


class _DevTools:
    """One Chromium driven over the DevTools protocol on --remote-debugging-pipe: the browser reads
    commands on its fd 3 and writes replies and events on its fd 4, each a JSON text ended by NUL.
    This is what drives the page's file inputs (DOM.setFileInputFiles)."""

    def __init__(self, root: Path):
        commands_in, self._commands = os.pipe()
        self._replies, replies_out = os.pipe()
        # The browser's ends go to fds >= 10 first, so a small exec helper can put them on 3 and 4
        # without clobbering either (the shell, dash, takes no fd above 9).
        child_in, child_out = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (commands_in, replies_out))
        os.close(commands_in)
        os.close(replies_out)
        profile = tempfile.mkdtemp(prefix="profile-", dir=root)
        self.process = subprocess.Popen([sys.executable, "-c", _PIPE_EXEC, str(child_in), str(child_out), CHROMIUM,
                                         *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                                         "about:blank"], pass_fds=(child_in, child_out),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=_browser_env(root), start_new_session=True)
        _GROUPS.add(self.process.pid)
        os.close(child_in)
        os.close(child_out)
        self._buffer, self._id = b"", 0

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._commands, data):]
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no reply from chromium to {method} in {timeout} s")
                if select.select([self._replies], [], [], remaining)[0]:
                    chunk = os.read(self._replies, 1 << 20)
                    if not chunk:
                        raise EOFError(f"chromium closed its pipe during {method}")
                    self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str, before: str | None = None) -> str:
        """A new tab on ``url``, loaded; its session id. ``before``: a script run in the page before
        the page's own (Page.addScriptToEvaluateOnNewDocument), e.g. to take a browser feature away."""
        target = self.call("Target.createTarget", {"url": "about:blank" if before else url})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        if before:
            self.call("Page.enable", {}, session)
            self.call("Page.addScriptToEvaluateOnNewDocument", {"source": before}, session)
            self.call("Page.navigate", {"url": url}, session)
            self.wait(session, f"location.href === {json.dumps(url)}")
        self.wait(session, "document.readyState === 'complete' && !!window.mgpuCertificates")
        return session

    def evaluate(self, session: str, expression: str, timeout: float = 120):
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True}, session, timeout)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"the page raised: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def wait(self, session: str, expression: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while not self.evaluate(session, expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout} s: {expression}")
            time.sleep(0.05)

    def set_file(self, session: str, selector: str, path: Path) -> None:
        document = self.call("DOM.getDocument", {}, session)["root"]["nodeId"]
        node = self.call("DOM.querySelector", {"nodeId": document, "selector": selector}, session)["nodeId"]
        self.call("DOM.setFileInputFiles", {"files": [str(path)], "nodeId": node}, session)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, TimeoutError, EOFError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(self.process)
        os.close(self._commands)
        os.close(self._replies)


@pytest.fixture(scope="module")
def devtools(browser_root):
    if CHROMIUM is None:
        pytest.skip("no chromium, chromium-browser or google-chrome on PATH")
    browser = _DevTools(browser_root)
    yield browser
    browser.close()


def _page_verdict(browser: _DevTools, session: str) -> dict:
    return browser.evaluate(session, """({verdict: document.getElementById("verdict").dataset.verdict ?? null,
        reason: document.getElementById("reason").textContent, fieldsShown: !document.getElementById("fields").hidden,
        lists: document.getElementById("revocations").textContent})""")


def _verify_in_page(browser: _DevTools, session: str, items: list[tuple[str, bytes]]) -> list[list[str]]:
    """verifyBytes(bytes, name) in the page for each (name, bytes): [verdict, reason] each."""
    payload = json.dumps([[name, base64.b64encode(data).decode()] for name, data in items])
    return browser.evaluate(session, f"""(() => {{
        const api = window.mgpuCertificates;
        return Promise.all({payload}.map(async ([name, data]) => {{
            const result = await api.verifyBytes(api.b64decode(data), name);
            return [result.verdict, result.reason];
        }}));
    }})()""")


# ------------------------------------------------------------------------------- the course

@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """Keys, certificates (a genuine one, one on the embedded revocation list, one by another key) and
    the page, written with that list."""
    folder = tmp_path_factory.mktemp("course")
    private_path, public_path = certificates.init_keys(folder / "keys")
    other_private, _ = certificates.init_keys(folder / "other-keys")
    private, public = certificates.load_private_key(private_path), certificates.load_public_key(public_path)
    genuine = certificates.issue(_fields(), private, folder / "issued")
    revoked = certificates.issue(_fields(name="Mallory", student_id="s666"), private, folder / "issued")
    other = certificates.issue(_fields(), certificates.load_private_key(other_private), folder / "other")
    zero1 = certificates.issue(_fields_2(), private, folder / "issued")  # Assessment B's, format 2
    revoked_id = revoked.json.stem
    # A reason with markup and a placeholder of the page's template in it: shown as text, the page still working.
    listed = {revoked_id: "shared account </script><b>&amp;</b> @@SCRIPT@@", "f" * 32: "another certificate"}
    page = verify_page.write_page(folder / "verify.html", public, listed)
    return {"folder": folder, "private": private, "public": public, "public_path": public_path, "page": page,
            "genuine": genuine, "revoked": revoked, "other": other, "zero1": zero1, "listed": listed}


def _python(course, path_or_document, revoked=None):
    return certificates.verify(path_or_document, course["public"], course["listed"] if revoked is None else revoked)


# ------------------------------------------------------------------------ verdicts from a link

@needs_chromium
def test_a_genuine_certificate_is_valid_with_its_signed_fields_shown(course, browser_root):
    data = course["genuine"].json.read_bytes()
    dom = _open(browser_root, course["page"], "cert=" + _b64url(data))
    expected = _python(course, course["genuine"].json)
    assert dom.verdict == "valid" and dom.reason == expected.reason, dom.reason
    assert dom.fields == {name: str(value) for name, value in expected.certificate.items()}
    assert dom.fields["name"] == "Ada Lovelace" and dom.fields["accuracy"] == "0.8731"
    assert float(dom.elapsed_ms) > 0
    # The one line naming the browsers the page needs; this one passed the page's Ed25519 self-test.
    assert dom.support == "yes" and "Chrome or Edge 137+, Firefox 129+ or Safari 17+" in dom.support_line


@needs_chromium
def test_a_certificate_with_one_field_changed_is_tampered(course, browser_root):
    text = course["genuine"].json.read_text(encoding="utf-8")
    assert text.count('"accuracy": 0.8731,') == 1
    edited = text.replace('"accuracy": 0.8731,', '"accuracy": 0.9731,').encode()
    dom = _open(browser_root, course["page"], "cert=" + _b64url(edited))
    assert dom.verdict == "tampered" and dom.reason == CHANGED and dom.fields is None
    assert _python(course, json.loads(edited)).reason == CHANGED


def _with_signature(document: dict, signature: bytes) -> bytes:
    return _json_bytes({**document, "signature": base64.b64encode(signature).decode()})


@needs_chromium
def test_one_flipped_byte_of_the_signature_is_tampered(course, browser_root):
    document = json.loads(course["genuine"].json.read_text())
    signature = bytearray(base64.b64decode(document["signature"]))
    signature[40] ^= 0x01                                            # a bit of S
    data = _with_signature(document, bytes(signature))
    dom = _open(browser_root, course["page"], "cert=" + _b64url(data))
    assert dom.verdict == "tampered" and dom.reason == CHANGED and dom.fields is None
    assert _python(course, json.loads(data)).reason == CHANGED


@needs_chromium
def test_a_certificate_on_the_embedded_revocation_list_is_revoked_with_the_reason(course, browser_root):
    dom = _open(browser_root, course["page"], "cert=" + _b64url(course["revoked"].json.read_bytes()))
    expected = _python(course, course["revoked"].json)
    assert dom.verdict == "revoked" and dom.reason == expected.reason
    assert dom.reason.startswith("revoked: shared account </script><b>&amp;</b> @@SCRIPT@@ (the signature is valid")
    assert dom.fields["name"] == "Mallory"                       # genuine, so its fields are shown


@needs_chromium
def test_a_certificate_signed_by_another_key_is_other_key(course, browser_root):
    dom = _open(browser_root, course["page"], "cert=" + _b64url(course["other"].json.read_bytes()))
    expected = _python(course, course["other"].json)
    assert dom.verdict == "other-key" and dom.reason == expected.reason and dom.fields is None
    assert f"not this course's key ({certificates.key_id(course['public'])})" in dom.reason


@needs_chromium
def test_garbage_is_unreadable(course, browser_root):
    garbage = random.Random(3).randbytes(3000)
    path = course["folder"] / "garbage.json"
    path.write_bytes(garbage)
    dom = _open(browser_root, course["page"], "cert=" + _b64url(garbage))
    assert dom.verdict == "unreadable" and dom.reason == _python(course, path).reason
    assert dom.reason.startswith("not JSON: the file is not UTF-8 text")
    broken_link = _open(browser_root, course["page"], "cert=not*base64")
    assert broken_link.verdict == "unreadable" and "not base64url" in broken_link.reason


@needs_chromium
def test_the_pdf_is_checked_through_its_embedded_record(course, browser_root):
    pdf = course["genuine"].pdf.read_bytes()
    dom = _open(browser_root, course["page"], "cert=" + _b64url(pdf))
    assert dom.verdict == "valid" and dom.reason == _python(course, course["genuine"].pdf).reason
    assert dom.fields["certificate_id"] == course["genuine"].json.stem
    # A second, edited record appended to the PDF: seen, as the command line sees it.
    document = json.loads(course["genuine"].json.read_text())
    document["certificate"]["accuracy"] = 0.99
    twice = course["folder"] / "twice.pdf"
    twice.write_bytes(pdf + b"\n/Keywords (" + certificates.PDF_MARKER.encode()
                      + base64.b64encode(json.dumps(document).encode()) + b")")
    dom = _open(browser_root, course["page"], "cert=" + _b64url(twice.read_bytes()))
    assert dom.verdict == "unreadable" and dom.reason == _python(course, twice).reason
    assert "2 different embedded certificates" in dom.reason


@needs_chromium
def test_a_non_canonical_s_and_a_bad_r_encoding_are_rejected(course, browser_root):
    """RFC 8032 5.1.7: S >= L is refused (S + L would otherwise verify too), and R must decode."""
    document = json.loads(course["genuine"].json.read_text())
    signature = base64.b64decode(document["signature"])
    s = int.from_bytes(signature[32:], "little")
    cases = {"S + L": signature[:32] + (s + L).to_bytes(32, "little"),
             "R with y = p": P.to_bytes(32, "little") + signature[32:],
             "R with x = 0 and the sign bit": (1 | 1 << 255).to_bytes(32, "little") + signature[32:]}
    for label, forged in cases.items():
        data = _with_signature(document, forged)
        assert _python(course, json.loads(data)).reason == CHANGED, label
        dom = _open(browser_root, course["page"], "cert=" + _b64url(data))
        assert dom.verdict == "tampered" and dom.reason == CHANGED, label


# ------------------------------------------------------------- a browser without Ed25519

#: Scripts run before the page's own, each taking Ed25519 away as a browser may lack it.
_WITHOUT_ED25519 = {
    # No WebCrypto at all (a page served over plain http:// from another host gets no crypto.subtle).
    "no crypto.subtle": 'Object.defineProperty(Crypto.prototype, "subtle", {get() { return undefined; }});',
    # WebCrypto without Ed25519 (Chromium before 137, Firefox before 129): importKey refuses the name.
    "importKey refuses Ed25519": """
        const importKey = SubtleCrypto.prototype.importKey;
        SubtleCrypto.prototype.importKey = function (format, data, algorithm, ...rest) {
            if (String(algorithm.name || algorithm).toLowerCase() === "ed25519") {
                return Promise.reject(new DOMException("Unrecognized name.", "NotSupportedError"));
            }
            return importKey.call(this, format, data, algorithm, ...rest);
        };""",
    # A broken Ed25519 that accepts every signature: the page's self-test must catch it, not say "valid".
    "verify says yes to everything": "SubtleCrypto.prototype.verify = async function () { return true; };",
}


@needs_chromium
@pytest.mark.parametrize("lack", list(_WITHOUT_ED25519))
def test_a_browser_without_ed25519_gets_no_verdict_and_one_line_saying_why(course, devtools, lack):
    """Genuine or tampered, the signature cannot be judged: no verdict, and the one line that says so
    (also in place of the line naming the browsers). What needs no signature is still found."""
    text = course["genuine"].json.read_text(encoding="utf-8")
    cases = {"genuine": (text.encode(), None), "tampered": (text.replace('"workers": 4', '"workers": 8').encode(), None),
             "garbage": (b"\xff not a certificate", "unreadable"),
             "other key": (course["other"].json.read_bytes(), "other-key")}
    message = None
    for label, (data, verdict) in cases.items():
        session = devtools.open(f"{course['page'].as_uri()}#cert={_b64url(data)}", before=_WITHOUT_ED25519[lack])
        devtools.wait(session, "document.getElementById('verdict-word').textContent !== 'No certificate chosen yet' "
                               "&& document.getElementById('browser-support').dataset.support !== undefined")
        shown = devtools.evaluate(session, """({verdict: document.getElementById("verdict").dataset.verdict ?? null,
            word: document.getElementById("verdict-word").textContent,
            reason: document.getElementById("reason").textContent,
            fieldsShown: !document.getElementById("fields").hidden,
            support: document.getElementById("browser-support").dataset.support,
            supportLine: document.getElementById("browser-support").textContent,
            message: window.mgpuCertificates.NO_ED25519})""")
        message = shown["message"]
        assert shown["support"] == "no" and shown["supportLine"] == message, (label, shown)
        if verdict is None:
            assert shown["verdict"] is None and shown["word"] == "No verdict" and shown["reason"] == message \
                and not shown["fieldsShown"], (label, shown)
        else:
            assert shown["verdict"] == verdict, (label, shown)
    assert message.startswith("This browser cannot check the signature: its WebCrypto does not verify Ed25519.")
    assert "\n" not in message and "Chrome or Edge 137+, Firefox 129+ or Safari 17+" in message


# -------------------------------------------------------------------- the page's file inputs

@needs_chromium
def test_the_file_inputs_read_the_pdf_and_a_newer_revocation_list(course, devtools, tmp_path):
    """Driven through the inputs themselves: the certificate's .pdf, then a newer revoked.txt, which
    revokes what the embedded list did not; a broken list gives no verdict."""
    session = devtools.open(course["page"].as_uri())
    devtools.set_file(session, "#cert-file", course["genuine"].pdf)
    devtools.wait(session, "document.getElementById('verdict').dataset.verdict !== undefined")
    shown = _page_verdict(devtools, session)
    assert shown["verdict"] == "valid" and shown["fieldsShown"], shown

    broken = tmp_path / "broken.txt"
    broken.write_text("# newer list\n" + "a" * 31 + " typo\n")
    devtools.set_file(session, "#revoked-file", broken)
    devtools.wait(session, "document.getElementById('revocations').dataset.state === 'error'")
    shown = _page_verdict(devtools, session)
    assert shown["verdict"] is None and "broken.txt line 2: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' is not a " \
        "certificate ID (32 hex digits): fix or remove the line" in shown["reason"], shown
    with pytest.raises(CertificateError, match="line 2: 'a{31}' is not a certificate ID"):
        certificates.read_revocations(broken)
    devtools.set_file(session, "#cert-file", course["genuine"].json)        # still no verdict with that list
    time.sleep(1)
    assert _page_verdict(devtools, session)["verdict"] is None

    newer = tmp_path / "revoked.txt"
    certificates.revoke(newer, "e" * 32, "an older revocation")
    certificates.revoke(newer, course["genuine"].json.stem.upper(), "regraded: the run did not use 4 workers")
    devtools.set_file(session, "#revoked-file", newer)
    devtools.wait(session, "document.getElementById('revocations').dataset.state === 'loaded'")
    devtools.wait(session, "document.getElementById('verdict').dataset.verdict === 'revoked'")
    shown = _page_verdict(devtools, session)
    expected = certificates.verify(course["genuine"].pdf, course["public"], certificates.read_revocations(newer))
    assert shown["reason"] == expected.reason and shown["fieldsShown"], shown
    assert "and 2 in revoked.txt, used as well" in shown["lists"]
    # The embedded list still counts beside the loaded one.
    assert _verify_in_page(devtools, session, [("x", course["revoked"].json.read_bytes())])[0][0] == "revoked"


# --------------------------------------------------------------- the same reasons as Python

def _junk(document: dict, pdf: bytes) -> dict[str, bytes]:
    """Damaged, odd and equivalent certificates: each must get Python's verdict and reason."""
    text = _json_bytes(document).decode()

    def edited(**changes):
        return _json_bytes({**json.loads(json.dumps(document)), **changes})

    def in_certificate(**changes):
        return edited(certificate={**document["certificate"], **changes})

    def replace(old, new):
        assert old in text, old
        return text.replace(old, new, 1).encode()

    certificate_id, signature = document["certificate"]["certificate_id"], document["signature"]
    payload = base64.b64encode(_json_bytes(document))
    assert payload in pdf
    return {
        "empty file": b"",
        "whitespace only": b" \n\t",
        "random bytes": random.Random(0).randbytes(4096),
        "a PDF header and junk": b"%PDF-1.4\n" + random.Random(1).randbytes(512),
        "a PDF with a payload that is not base64": pdf.replace(payload, payload[:20] + b"=" + payload[21:]),
        "a PDF with bad padding": pdf.replace(payload, payload.rstrip(b"=")[:-1]),
        # Base64 only as b64encode writes it, in both (found by an attack on the page: Python's own decoder
        # takes extra "=" after a whole group and the page took "xxx==").
        "a PDF payload with extra padding": pdf.replace(payload, payload + b"==="),
        "a PDF payload of a padded group with one = too many": pdf.replace(
            payload, base64.b64encode(_json_bytes(document) + b"  ").rstrip(b"=") + b"=="),
        "a PDF payload that is only padding": pdf.replace(payload, b"="),
        "a signature with extra padding": edited(signature=signature + "==="),
        "a JSON list": b"[1, 2, 3]",
        "a JSON string": b'"certificate"',
        "not UTF-8": b'{"format": "\xff\xfe"}',
        "a byte-order mark": b"\xef\xbb\xbf" + _json_bytes(document),
        "deeply nested": b"[" * 100000 + b"]" * 100000,
        "extra data": _json_bytes(document) + b"{}",
        "truncated": _json_bytes(document)[:300],
        "an invalid escape": replace('"Ada Lovelace"', '"Ada \\q"'),
        "a bad \\u escape": replace('"Ada Lovelace"', '"Ada \\u12G4"'),
        "a bad low surrogate escape": replace('"Ada Lovelace"', '"Ada \\ud83d\\uZZZZ"'),
        "a raw control character": replace('"Ada Lovelace"', '"Ada\x01Lovelace"'),
        "a single-quoted key": replace('"name"', "'name'"),
        "a missing colon": replace('"name":', '"name"'),
        "a doubled comma": replace('"grader_version"', ', "grader_version"'),
        "NaN accuracy": replace('"accuracy": 0.8731', '"accuracy": NaN'),
        "-Infinity accuracy": replace('"accuracy": 0.8731', '"accuracy": -Infinity'),
        "huge float": replace('"accuracy": 0.8731', '"accuracy": 1e999'),
        "huge integer": replace('"workers": 4', '"workers": ' + "9" * 5000),
        "big integer": replace('"accuracy": 0.8731', '"accuracy": -' + "7" * 200),
        "integer accuracy": replace('"accuracy": 0.8731', '"accuracy": 1'),
        "float workers": replace('"workers": 4', '"workers": 4.0'),
        "workers is a bool": replace('"workers": 4', '"workers": true'),
        "workers is null": replace('"workers": 4', '"workers": null'),
        "accuracy as a string": replace('"accuracy": 0.8731', '"accuracy": "0.9"'),
        "lone surrogate": replace("Ada Lovelace", "Ada \\ud800"),
        "missing signature": _json_bytes({k: v for k, v in document.items() if k != "signature"}),
        "missing format": _json_bytes({k: v for k, v in document.items() if k != "format"}),
        "non-base64 signature": edited(signature="not base64 at all!"),
        "non-ASCII signature": edited(signature="é" + document["signature"][1:]),
        "signature without padding": edited(signature=document["signature"].rstrip("=")),
        "signature with extra padding": edited(signature=document["signature"] + "AAAA=="),
        # 64 bytes are 86 base64 digits and "==": the last digit's 4 low bits are unused; Python ignores them.
        "signature with other unused bits": edited(signature=signature[:85] + BASE64[BASE64.index(signature[85]) ^ 0xF]
                                                   + "=="),
        "short signature": edited(signature=base64.b64encode(b"x" * 12).decode()),
        "signature is a number": edited(signature=12345),
        "key id is a list": edited(key_id=["nested", {"junk": [None]}]),
        "key id with a surrogate": json.dumps({**document, "key_id": "\ud800" + "x" * 50}).encode(),
        "wrong format": edited(format="mgpu-certificate/2"),
        "a long odd format": edited(format="it's \"quoted\"\t\x07\u00ad\u2028 " + "long " * 20),
        "format is a float": edited(format=1e-05),
        "certificate is a list": edited(certificate=[document["certificate"]]),
        "an unknown field": in_certificate(grade="A+"),
        "an unknown field with an astral name": in_certificate(**{"𝔤𝔯𝔞𝔡𝔢": 1}),
        "an extra top-level key": edited(note="trust me"),
        "a missing field": _json_bytes({**document, "certificate": {k: v for k, v in document["certificate"].items()
                                                                    if k != "dataset"}}),
        "a changed name": in_certificate(name="Ada Lovelace!"),
        # Equivalent to the signed record: valid, as Python says.
        "compact": json.dumps(document, separators=(",", ":")).encode(),
        "ASCII escapes": json.dumps(document, ensure_ascii=True).encode(),
        "the same float written longer": replace('"accuracy": 0.8731', '"accuracy": 0.87310'),
        "the same float with an exponent": replace('"accuracy": 0.8731', '"accuracy": 8.731E-1'),
        "a repeated key, the last one signed": replace('"name": "Ada Lovelace"', '"name": "Eve", "name": "Ada Lovelace"'),
        "a repeated key, the last one not": replace('"name": "Ada Lovelace"', '"name": "Ada Lovelace", "name": "Eve"'),
        "upper-case certificate ID": replace(certificate_id, certificate_id.upper()),
        "too large": b" " * (certificates.MAX_FILE_BYTES + 1),
    }


def _expected_verdict(path: Path, reason: str) -> str:
    try:
        certificates.read_certificate(path)
    except CertificateError:
        return "unreadable"
    for prefix, verdict in (("valid:", "valid"), ("revoked:", "revoked"), ("signed by another key", "other-key")):
        if reason.startswith(prefix):
            return verdict
    return "tampered"


@needs_chromium
def test_damaged_and_odd_certificates_get_pythons_verdict_and_reason(course, devtools, tmp_path):
    document = json.loads(course["genuine"].json.read_text())
    cases = _junk(document, course["genuine"].pdf.read_bytes())
    cases["revoked"] = course["revoked"].json.read_bytes()
    cases["other key"] = course["other"].json.read_bytes()
    # Assessment B's format: genuine, its sentence edited, presented as format 1, and format 1's fields as 2.
    zero1 = json.loads(course["zero1"].json.read_text())
    cases["assessment B"] = course["zero1"].json.read_bytes()
    cases["assessment B edited"] = _json_bytes({**zero1, "certificate": {
        **zero1["certificate"], "achievement": zero1["certificate"]["achievement"].replace("0.998", "0.5")
        .replace("1.00x", "0.50x")}})
    cases["assessment B as format 1"] = _json_bytes({**zero1, "format": certificates.FORMAT})
    cases["format 1 as 2"] = _json_bytes({**document, "format": certificates.FORMAT_2})
    expected, items = {}, []
    for index, (label, data) in enumerate(cases.items()):
        path = tmp_path / f"case{index}.json"
        path.write_bytes(data)
        reason = _python(course, path).reason
        expected[label] = [_expected_verdict(path, reason), reason]
        items.append((str(path), data))
    session = devtools.open(course["page"].as_uri())
    got = dict(zip(cases, _verify_in_page(devtools, session, items)))
    wrong = {label: (got[label], expected[label]) for label in cases if got[label] != expected[label]}
    assert not wrong, json.dumps(wrong, indent=1, ensure_ascii=False)
    verdicts = {verdict for verdict, _ in expected.values()}
    assert verdicts == {"valid", "tampered", "revoked", "other-key", "unreadable"}


# ------------------------------------------------------------------ canonical bytes, Ed25519

def _awkward_certificates() -> list[dict]:
    """Certificates whose canonical bytes are easy to get wrong (signed as they are, bypassing complete)."""
    base = certificates.complete(_fields())
    return [
        {**base, "name": "Zoë 李", "reached_seconds": 600.0, "accuracy": 1e-05, "target_accuracy": 0.1 + 0.2},
        {**base, "name": 'say "hi" \\ back\\slash \'quote\'', "time_budget_s": 1e16, "reached_seconds": 5e-324},
        {**base, "name": "tab\tnew\nline\rret\x00nul\x01\x1f\x7f\b\f", "accuracy": 0.5, "workers": 10 ** 20},
        {**base, "name": "🎓👩🏽‍🔬 \u2028\u2029\ufeff \U0001d518\U0001d52b", "reached_seconds": 1.7976931348623157e308,
         "time_budget_s": 123456789.125, "profile": "\u00e9\u0301 \uffff"},
        {**base, "dataset": "0.0001", "reached_seconds": 0.0001, "time_budget_s": 9999999999999998.0,
         "target_accuracy": -0.0},
    ]


@needs_chromium
def test_the_canonical_bytes_are_pythons(course, browser_root, devtools):
    """#canonical= writes the page's canonical bytes in hex; they must be the bytes Python signs,
    whatever the floats, quotes, control characters or non-ASCII text; and each of these
    certificates, signed, is valid in the page."""
    key = certificates.key_id(course["public"])
    signed = [{"format": certificates.FORMAT, "certificate": c, "key_id": key} for c in _awkward_certificates()]
    others = [{"\uffff": 1, "😀": 2, "é": 3, "a": {"b": [1, 2.5, True, False, None, "x"], "A": {}}, "": []},
              [1e-07, 1e21, 1.5e300, -2.5e-10, 100.0, 0, -0, 12345678901234567890123]]
    texts = [json.dumps(value, indent=2, ensure_ascii=False).encode() for value in signed + others]
    texts.append(json.dumps(signed[3], ensure_ascii=True).encode())                  # \ud83c\udf93 escapes
    texts.append(b'{"b": 1.50, "a": 1E2, "c": 0.30000000000000004e0, "d": -0.0}')   # literals Python rewrites
    dom = _open(browser_root, course["page"], "canonical=" + ",".join(map(_b64url, texts)))
    expected = [certificates._canonical(json.loads(text)).hex() for text in texts]
    assert dom.debug.split("\n") == expected
    assert certificates._canonical(signed[0]) == certificates._signed_bytes(signed[0]["certificate"], key)

    session = devtools.open(course["page"].as_uri())
    documents = [certificates.sign(c, course["private"]) for c in _awkward_certificates()]
    results = _verify_in_page(devtools, session, [("awkward", _json_bytes(d)) for d in documents])
    for document, (verdict, reason) in zip(documents, results):
        assert verdict == "valid" and reason == certificates.verify(document, course["public"]).reason


@needs_chromium
def test_floats_are_written_as_pythons_repr_and_format(course, devtools):
    """The canonical bytes write floats as repr does, the reasons as format(x, ".3f") and ".0f" do:
    random doubles of every magnitude, random fractions, and exact halves (which round to even)."""
    rng = random.Random(13)
    values = [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(3000)]
    values += [rng.random() * 10 ** rng.randint(-8, 20) for _ in range(2000)]
    values += [rng.randint(-10 ** 6, 10 ** 6) / 2 ** rng.randint(0, 12) for _ in range(2000)]
    values = [v for v in values if v == v and abs(v) != float("inf")] + [0.0, -0.0, 5e-324, 1e16, 1e-5]
    session = devtools.open(course["page"].as_uri())
    payload = json.dumps([struct.pack("<d", v).hex() for v in values])
    got = devtools.evaluate(session, f"""(() => {{
        const api = window.mgpuCertificates;
        return {payload}.map((bits) => {{
            const x = new DataView(api.hexToBytes(bits).buffer).getFloat64(0, true);
            return [api.floatRepr(x), api.fixed(x, 3), api.fixed(x, 0)];
        }});
    }})()""")
    expected = [[repr(v), format(v, ".3f"), format(v, ".0f")] for v in values]
    wrong = [(v, g, e) for v, g, e in zip(values, got, expected) if g != e]
    assert not wrong, wrong[:5]


@needs_chromium
def test_ed25519_in_the_page_agrees_with_openssl(course, devtools):
    """Random keys and messages signed by cryptography (OpenSSL); the page (the browser's WebCrypto)
    accepts exactly those."""
    rng = random.Random(11)
    cases = []
    for n in (0, 1, 31, 32, 64, 111, 128, 300, 2000):
        private = Ed25519PrivateKey.generate()
        public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        message = rng.randbytes(n)
        signature = private.sign(message)
        cases.append((public, message, signature, True))
        cases.append((public, message + b"!", signature, False))
        cases.append((public, message, signature[:-1] + bytes([signature[-1] ^ 0x10]), False))
    session = devtools.open(course["page"].as_uri())
    payload = json.dumps([[k.hex(), m.hex(), s.hex()] for k, m, s, _ in cases])
    got = devtools.evaluate(session, f"""(() => {{
        const api = window.mgpuCertificates;
        return Promise.all({payload}.map(([k, m, s]) =>
            api.ed25519Verify(api.hexToBytes(k), api.hexToBytes(m), api.hexToBytes(s))));
    }})()""")
    assert got == [expected for *_, expected in cases]


# -------------------------------------------------------------------------- pictures and time

def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@needs_chromium
def test_screenshots_of_a_valid_and_a_tampered_verdict(course, browser_root, tmp_path):
    text = course["genuine"].json.read_text(encoding="utf-8")
    tampered = text.replace('"workers": 4', '"workers": 8').encode()
    for name, data in (("valid", text.encode()), ("tampered", tampered)):
        shot = tmp_path / f"{name}.png"
        _chromium(browser_root, "--virtual-time-budget=10000", f"--screenshot={shot}", "--window-size=1000,800",
                  "--hide-scrollbars", f"{course['page'].as_uri()}#cert={_b64url(data)}")
        assert _png_size(shot) == (1000, 800) and shot.stat().st_size > 10000
        print(f"screenshot of the {name} verdict: {shot}")


@needs_chromium
def test_time_to_verify_in_the_page_and_on_the_command_line(course, browser_root):
    """Not a limit: prints the page's own measurement beside the command line's (pytest -s shows it)."""
    cert = course["genuine"].json
    dom = _open(browser_root, course["page"], "cert=" + _b64url(cert.read_bytes()), virtual_time=False)
    assert dom.verdict == "valid" and float(dom.elapsed_ms) > 0
    command = [sys.executable, "-m", "autograder", "verify", str(cert), "--public-key", str(course["public_path"])]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    cli_s = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    started = time.perf_counter()
    for _ in range(20):
        certificates.verify(cert, course["public"])
    in_process_ms = (time.perf_counter() - started) / 20 * 1000
    print(f"\nverify one certificate: page {float(dom.elapsed_ms):.1f} ms (performance.now() around the check, "
          f"first run in a fresh page); `python -m autograder verify` {cli_s * 1000:.0f} ms wall "
          f"(process start and imports included); certificates.verify in process {in_process_ms:.2f} ms")


# ------------------------------------------------------------------------- the page command

def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _embedded(page: Path) -> dict:
    match = re.search(r'<script type="application/json" id="mgpu-config">(.*?)</script>', page.read_text(), re.S)
    return json.loads(match.group(1))


def test_the_page_command_embeds_the_key_and_the_revocation_list_of_the_moment(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    assert _cli("keys", "init", "--course", course).returncode == 0
    assert _cli("revoke", "c" * 32, "--reason", "withdrawn", "--course", course).returncode == 0
    done = _cli("page", "--course", course)
    page = course / "autograder" / "verify.html"
    assert done.returncode == 0 and f"page:            {page}" in done.stdout, done.stderr
    public = certificates.load_public_key(course / ".keys" / "public_key.pem")
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    config = _embedded(page)
    assert config["public_key"] == raw.hex() and config["key_id"] == certificates.key_id(public)
    assert config["revoked"] == {"c" * 32: "withdrawn"} and "1 revoked certificate(s)" in done.stdout
    assert {fmt: [name for name, _ in fields] for fmt, fields in config["formats"].items()} == {
        certificates.FORMAT: list(certificates.FIELDS), certificates.FORMAT_2: list(certificates.FIELDS_2)}
    assert "signing_key" not in page.read_text() and "PRIVATE" not in page.read_text()

    # With the published key alone: no list unless --revoked, the page in the current folder by default.
    elsewhere = tmp_path / "publish"
    elsewhere.mkdir()
    done = _cli("page", "--public-key", course / ".keys" / "public_key.pem", cwd=elsewhere)
    assert done.returncode == 0 and _embedded(elsewhere / "verify.html")["revoked"] == {}, done.stderr
    done = _cli("page", "--public-key", course / ".keys" / "public_key.pem", "--revoked",
                course / "autograder" / "revoked.txt", "--out", elsewhere / "site" / "check.html")
    assert done.returncode == 0 and _embedded(elsewhere / "site" / "check.html")["revoked"] == {"c" * 32: "withdrawn"}


def test_the_page_command_names_the_fix_for_bad_input(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    assert _cli("keys", "init", "--course", course).returncode == 0
    bad_list = tmp_path / "bad.txt"
    bad_list.write_text("not-an-id reason\n")
    for args, message in ((["--course", tmp_path / "none"], "--public-key PEM"),
                          (["--public-key", tmp_path / "none.pem"], "keys init"),
                          (["--course", course, "--revoked", tmp_path / "none.txt"], "leave --revoked out"),
                          (["--course", course, "--revoked", bad_list], "line 1"),
                          (["--course", course, "--out", tmp_path], "is a folder")):
        done = _cli("page", *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], \
            (args, done.stderr)


def test_the_script_is_package_data_inlined_into_the_page(course):
    """verify_page.js ships with the package (pyproject's package-data) and is the page's one script,
    pinned by the page's Content-Security-Policy; the page loads nothing beside it."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert verify_page.SCRIPT_FILE in setuptools["package-data"]["autograder"]
    script = (ROOT / "autograder" / verify_page.SCRIPT_FILE).read_text(encoding="utf-8")
    page = course["page"].read_text(encoding="utf-8")
    assert f"<script>{script}</script>" in page and html.escape(verify_page._csp_hash(script)) in page
    assert " src=" not in page and "sha512" not in script.lower() and "crypto.subtle" in script


def test_write_page_refuses_a_revocation_list_with_a_bad_id(course, tmp_path):
    with pytest.raises(CertificateError, match="not a certificate ID"):
        verify_page.write_page(tmp_path / "v.html", course["public"], {"123": "x"})
    with pytest.raises(TypeError, match="Ed25519PublicKey"):
        verify_page.write_page(tmp_path / "v.html", course["public_path"], None)
    assert not (tmp_path / "v.html").exists()
