"""Tests for mgpu.runtime.download.fetch against a local HTTP server on 127.0.0.1 (no internet needed)."""

from __future__ import annotations

import hashlib
import http.server
import multiprocessing
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from mgpu.runtime.download import ChecksumError, DownloadError, fetch, sha256_file


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# 3 MiB + a bit, so the body spans several 1 MiB read chunks and the offsets are not round.
BLOB = bytes((i * 7 + i // 251) % 256 for i in range(3 * 1024 * 1024 + 12345))
BLOB_SHA = _sha(BLOB)
SEND_CHUNK = 64 * 1024


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):
        srv = self.server
        rng = self.headers.get("Range")
        with srv.lock:
            srv.requests.append((self.path, rng))
        data = srv.blobs.get(self.path)
        if data is None:
            self._send_empty(404)
            return
        if srv.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]

        start = 0
        status = 200
        match = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if match and not srv.ignore_range:
            start = int(match.group(1))
            if start >= len(data):
                self._send_empty(416, {"Content-Range": f"bytes */{len(data)}"})
                return
            status = 206
        body = data[start:]

        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()

        limit = len(body) if srv.drop_after is None else min(srv.drop_after, len(body))
        sent = 0
        while sent < limit:
            if srv.stall_after is not None and sent >= srv.stall_after and not srv.stall.is_set():
                srv.stall.wait(10)  # hold the connection open without sending anything
            piece = body[sent : min(sent + SEND_CHUNK, limit)]
            try:
                self.wfile.write(piece)
            except OSError:
                return
            sent += len(piece)
            if srv.delay:
                time.sleep(srv.delay)
        with srv.lock:
            srv.bytes_sent += sent
        if sent < len(body):
            # Simulate a lost connection: stop mid-body and close the socket.
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _send_empty(self, code, headers=None):
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.blobs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.bytes_sent = 0
        self.drop_after: int | None = None  # (a) close the connection after K body bytes
        self.ignore_range = False  # (b) answer 200 with the whole file even for Range requests
        self.corrupt = False  # (c) flip the first byte of every file served
        self.delay = 0.0  # seconds to sleep after each 64 KiB piece
        self.stall_after: int | None = None  # stop sending (until released) after K bytes
        self.stall = threading.Event()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"

    def gets(self, name: str) -> list[str | None]:
        """The Range header of each request for ``name`` so far (None: no Range)."""
        with self.lock:
            return [rng for path, rng in self.requests if path == "/" + name]


@pytest.fixture
def server():
    srv = _Server()
    srv.blobs["/blob.bin"] = BLOB
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield srv
    finally:
        srv.stall.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def _part(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def test_fresh_download_verifies_and_lands_at_dest(server, tmp_path):
    dest = tmp_path / "sub" / "dir" / "blob.bin"  # parent directories are created
    result = fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert result == dest
    assert dest.read_bytes() == BLOB
    assert not _part(dest).exists()
    assert server.gets("blob.bin") == [None]


def test_progress_bar_path_works(server, tmp_path):
    dest = tmp_path / "blob.bin"
    fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=True)
    assert sha256_file(dest) == BLOB_SHA


def test_sha256_file_matches_hashlib(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(BLOB)
    assert sha256_file(path) == BLOB_SHA
    assert sha256_file(str(path)) == BLOB_SHA


def test_existing_valid_file_makes_no_request(server, tmp_path):
    dest = tmp_path / "blob.bin"
    dest.write_bytes(BLOB)
    assert fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False) == dest
    assert server.requests == []
    # Not even a reachable server is needed.
    assert fetch("http://127.0.0.1:9/unused", dest, BLOB_SHA.upper(), progress=False) == dest


def test_existing_corrupted_dest_is_downloaded_again(server, tmp_path):
    dest = tmp_path / "blob.bin"
    dest.write_bytes(b"not the dataset" * 100)
    fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert dest.read_bytes() == BLOB
    assert server.gets("blob.bin") == [None]


def test_dropped_connection_keeps_part_and_next_call_resumes(server, tmp_path):
    dest = tmp_path / "blob.bin"
    cut = 1_000_003
    server.drop_after = cut
    with pytest.raises(DownloadError) as info:
        fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert not isinstance(info.value, ChecksumError)
    assert "\n" not in str(info.value) and "resume" in str(info.value)
    assert not dest.exists()
    assert _part(dest).read_bytes() == BLOB[:cut]

    server.drop_after = None
    sent_before = server.bytes_sent
    fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert server.gets("blob.bin") == [None, f"bytes={cut}-"]
    assert server.bytes_sent - sent_before == len(BLOB) - cut  # only the rest was sent
    assert sha256_file(dest) == BLOB_SHA
    assert not _part(dest).exists()


def test_server_ignoring_range_still_gives_the_right_file(server, tmp_path):
    dest = tmp_path / "blob.bin"
    _part(dest).write_bytes(BLOB[:500_000])
    server.ignore_range = True
    fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert server.gets("blob.bin") == ["bytes=500000-"]
    assert dest.read_bytes() == BLOB  # the 200 body replaced the .part, it was not appended
    assert not _part(dest).exists()


def test_part_longer_than_file_gets_416_and_starts_over(server, tmp_path):
    dest = tmp_path / "blob.bin"
    _part(dest).write_bytes(BLOB + b"junk")
    fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert server.gets("blob.bin") == [f"bytes={len(BLOB) + 4}-", None]
    assert dest.read_bytes() == BLOB


def test_complete_part_is_finished_without_downloading_again(server, tmp_path):
    # A run killed after the last byte but before the rename leaves a complete .part.
    dest = tmp_path / "blob.bin"
    _part(dest).write_bytes(BLOB)
    fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert server.gets("blob.bin") == [f"bytes={len(BLOB)}-"]  # answered 416, nothing re-sent
    assert dest.read_bytes() == BLOB
    assert not _part(dest).exists()


def test_wrong_checksum_raises_and_leaves_nothing(server, tmp_path):
    dest = tmp_path / "blob.bin"
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as info:
        fetch(server.url("blob.bin"), dest, wrong, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("blob.bin: SHA-256 mismatch")
    assert wrong in message and BLOB_SHA in message and str(dest) in message
    assert not dest.exists()
    assert not _part(dest).exists()


def test_corrupted_bytes_from_server_are_rejected_then_recovered(server, tmp_path):
    dest = tmp_path / "blob.bin"
    server.corrupt = True
    with pytest.raises(ChecksumError):
        fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert not dest.exists() and not _part(dest).exists()
    server.corrupt = False
    fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False)
    assert dest.read_bytes() == BLOB


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_unreachable_server_gives_one_line_error_with_url_and_dest(tmp_path):
    dest = tmp_path / "blob.bin"
    url = f"http://127.0.0.1:{_closed_port()}/blob.bin"
    with pytest.raises(DownloadError) as info:
        fetch(url, dest, BLOB_SHA, progress=False, timeout=5)
    message = str(info.value)
    assert "\n" not in message
    assert url in message and str(dest) in message and BLOB_SHA in message
    assert "by hand" in message
    assert not dest.exists()


def test_http_404_is_a_download_error(server, tmp_path):
    dest = tmp_path / "missing.bin"
    with pytest.raises(DownloadError, match="HTTP 404") as info:
        fetch(server.url("missing.bin"), dest, BLOB_SHA, progress=False)
    assert not isinstance(info.value, ChecksumError)
    assert "\n" not in str(info.value)
    assert not dest.exists()


def test_stalled_server_times_out_and_keeps_part(server, tmp_path):
    dest = tmp_path / "blob.bin"
    server.stall_after = 3 * SEND_CHUNK
    start = time.monotonic()
    with pytest.raises(DownloadError, match="timed out") as info:
        fetch(server.url("blob.bin"), dest, BLOB_SHA, progress=False, timeout=0.5)
    assert time.monotonic() - start < 5
    assert "\n" not in str(info.value)
    assert not dest.exists()
    assert _part(dest).stat().st_size == 3 * SEND_CHUNK


def test_file_url_and_missing_file_url(tmp_path):
    source = tmp_path / "mirror" / "blob.bin"
    source.parent.mkdir()
    source.write_bytes(BLOB)
    dest = tmp_path / "cache" / "blob.bin"
    assert fetch(source.as_uri(), dest, BLOB_SHA, progress=False) == dest
    assert dest.read_bytes() == BLOB

    missing = (tmp_path / "mirror" / "nope.bin").as_uri()
    with pytest.raises(DownloadError) as info:
        fetch(missing, tmp_path / "cache" / "nope.bin", BLOB_SHA, progress=False)
    assert missing in str(info.value) and "\n" not in str(info.value)


def test_bad_sha256_argument_is_rejected(tmp_path):
    with pytest.raises(ValueError):
        fetch("http://127.0.0.1:9/x", tmp_path / "x", "abc", progress=False)


def _worker(url, dest, sha, gate, results):
    gate.wait(10)
    try:
        path = fetch(url, dest, sha, progress=False, timeout=20)
        results.put((os.getpid(), str(path), sha256_file(path)))
    except BaseException as exc:  # report, do not hang the parent
        results.put((os.getpid(), "error", repr(exc)))


def test_concurrent_processes_download_once(server, tmp_path):
    dest = tmp_path / "shared" / "blob.bin"
    server.delay = 0.01  # ~0.5 s per full download, so the workers surely overlap
    ctx = multiprocessing.get_context("spawn")
    gate = ctx.Event()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(server.url("blob.bin"), dest, BLOB_SHA, gate, results))
        for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    gate.set()
    outcomes = [results.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0

    assert all(out[1:] == (str(dest), BLOB_SHA) for out in outcomes), outcomes
    assert server.gets("blob.bin") == [None]  # exactly one download
    assert server.bytes_sent == len(BLOB)
    assert not _part(dest).exists()
