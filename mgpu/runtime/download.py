"""Fetch official dataset files safely: verified, atomic, resumable and shared between workers.

The course trains on real datasets (Fashion-MNIST, CIFAR-10) when they are available. They are
downloaded once into a local cache with :func:`fetch`, which guarantees:

* **Verified.** A file only ever appears at ``dest`` after its SHA-256 matched the expected value.
  A file already at ``dest`` is trusted only if its SHA-256 matches; otherwise it is replaced.
* **Atomic.** Bytes go to ``<dest>.part``; after verification the data is flushed, fsync'ed and
  moved into place with :func:`os.replace`. A killed download never leaves a file at ``dest``.
* **Resumable.** If ``<dest>.part`` exists, the download continues with an HTTP
  ``Range: bytes=N-`` request (and starts over if the server does not honour it).
* **Safe with several processes.** Horovod starts one process per GPU and each may call
  :func:`fetch` for the same file. An exclusive ``fcntl.flock`` on ``<dest>.lock`` lets exactly
  one of them download; the others wait and then find the verified file.
* **Clear errors.** Failures raise :class:`DownloadError` (or :class:`ChecksumError`) whose
  message is one line saying what failed and how to fix it, including how to place the file by
  hand (useful on clusters without internet access).

``file://`` URLs work too, for tests and for users with a local mirror.

Only the standard library and tqdm are used.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

__all__ = ["DownloadError", "ChecksumError", "fetch", "sha256_file"]

CHUNK_SIZE = 1024 * 1024  # 1 MiB, for hashing and for reading the response body
USER_AGENT = "mgpu-course-downloader/1.0 (+python-urllib)"
_HEX64 = re.compile(r"[0-9a-f]{64}")


class DownloadError(RuntimeError):
    """A file could not be downloaded; the message is one line that names the fix."""


class ChecksumError(DownloadError):
    """The downloaded bytes did not have the expected SHA-256 (the bad file was deleted)."""


def sha256_file(path: str | os.PathLike) -> str:
    """Return the hex SHA-256 of the file at ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(CHUNK_SIZE)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def _one_line(text: object) -> str:
    """Collapse any whitespace (including newlines) so error messages stay on one line."""
    return " ".join(str(text).split())


def _matches(path: Path, sha256: str) -> bool:
    """True if ``path`` is a regular file whose SHA-256 is ``sha256``."""
    try:
        return path.is_file() and sha256_file(path) == sha256
    except OSError:
        return False


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (best effort: some filesystems refuse fsync on directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Fetcher:
    """One download of ``url`` to ``dest``; the caller holds the lock."""

    def __init__(self, url: str, dest: Path, sha256: str, progress: bool, timeout: float):
        self.url = url
        self.dest = dest
        self.sha256 = sha256
        self.progress = progress
        self.timeout = timeout
        self.part = dest.with_name(dest.name + ".part")

    # -- errors -------------------------------------------------------------------------------
    def _by_hand(self) -> str:
        return f"download {self.url} by hand and put it at {self.dest} (SHA-256 {self.sha256})"

    def error(self, what: str, *, resumable: bool = False) -> DownloadError:
        fix = "run again to resume, or " if resumable else ""
        return DownloadError(_one_line(f"{what}; {fix}{self._by_hand()}"))

    # -- HTTP ---------------------------------------------------------------------------------
    def _open(self, offset: int):
        headers = {"User-Agent": USER_AGENT}
        if offset > 0:
            headers["Range"] = f"bytes={offset}-"
        request = urllib.request.Request(self.url, headers=headers)
        return urllib.request.urlopen(request, timeout=self.timeout)

    def _connect(self):
        """Open the URL, resuming from the .part file when possible.

        Returns ``(response, offset)``: ``offset`` is the number of bytes already in the .part
        file that the response continues (0 means the response is the whole file).
        """
        offset = self.part.stat().st_size if self.part.exists() else 0
        try:
            response = self._open(offset)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 416 and offset > 0:
                # "Range not satisfiable": the .part is already complete (killed between the
                # last byte and the rename) or longer than the file. Keep it only if it verifies.
                if _matches(self.part, self.sha256):
                    return None, offset
                _remove(self.part)
                return self._open_fresh()
            raise self.error(
                f"could not download {self.url}: HTTP {exc.code} {exc.reason}"
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            raise self.error(f"could not download {self.url}: {self._reason(exc)}") from None

        status = response.getcode()  # None for file:// URLs
        if offset > 0 and status == 206:
            start = self._content_range_start(response.headers.get("Content-Range"))
            if start == offset:
                return response, offset
            # A 206 that does not continue where we stopped cannot be appended: start over.
            response.close()
            return self._open_fresh()
        return response, 0

    def _open_fresh(self):
        try:
            return self._open(0), 0
        except urllib.error.HTTPError as exc:
            exc.close()
            raise self.error(
                f"could not download {self.url}: HTTP {exc.code} {exc.reason}"
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            raise self.error(f"could not download {self.url}: {self._reason(exc)}") from None

    @staticmethod
    def _content_range_start(value: str | None) -> int | None:
        match = re.match(r"\s*bytes\s+(\d+)-", value or "")
        return int(match.group(1)) if match else None

    def _reason(self, exc: BaseException) -> str:
        """A short, one-line description of a network exception."""
        if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
            if not isinstance(exc.reason, BaseException):
                return _one_line(exc.reason)
            exc = exc.reason
        if isinstance(exc, TimeoutError):
            return f"timed out after {self.timeout:g} s"
        if isinstance(exc, OSError) and exc.strerror:
            return _one_line(exc.strerror)
        detail = _one_line(exc)
        return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__

    # -- body ---------------------------------------------------------------------------------
    def _receive(self, response, offset: int) -> None:
        """Write the response body to the .part file (appending after ``offset`` bytes)."""
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.strip().isdigit() else None
        total = offset + expected if expected is not None else None
        received = 0
        mode = "ab" if offset > 0 else "wb"
        with open(self.part, mode) as out, tqdm(
            total=total,
            initial=offset,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=self.dest.name,
            disable=not self.progress,
            leave=False,
        ) as bar:
            if offset > 0 and out.tell() != offset:
                # The .part changed under us; this cannot happen while we hold the lock.
                raise DownloadError(f"{self.part} changed during the download; run again")
            # read1 returns whatever has arrived (up to 1 MiB), so bytes received before a
            # timeout or a lost connection are already in the .part file for resuming.
            read = getattr(response, "read1", response.read)
            try:
                while True:
                    block = read(CHUNK_SIZE)
                    if not block:
                        break
                    out.write(block)
                    received += len(block)
                    bar.update(len(block))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                out.flush()
                raise self.error(
                    f"connection lost while downloading {self.url} after "
                    f"{offset + received} bytes ({self._reason(exc)}); the partial file "
                    f"{self.part.name} was kept",
                    resumable=True,
                ) from None
            finally:
                response.close()
            out.flush()
            os.fsync(out.fileno())
        if expected is not None and received < expected:
            raise self.error(
                f"connection lost while downloading {self.url} after {offset + received} of "
                f"{total} bytes; the partial file {self.part.name} was kept",
                resumable=True,
            )

    def run(self) -> Path:
        response, offset = self._connect()
        if response is not None:
            self._receive(response, offset)
        actual = sha256_file(self.part)
        if actual != self.sha256:
            _remove(self.part)
            raise ChecksumError(
                _one_line(
                    f"{self.dest.name}: SHA-256 mismatch (expected {self.sha256}, got {actual}); "
                    f"the file was deleted; run again, or download {self.url} by hand and put it "
                    f"at {self.dest}"
                )
            )
        # The .part was fsync'ed when it was written; publish it atomically.
        os.replace(self.part, self.dest)
        _fsync_dir(self.dest.parent)
        return self.dest


def _lock(lock_path: Path, name: str, progress: bool) -> int:
    """Open and exclusively flock ``lock_path``; returns the file descriptor."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            if progress:
                print(f"{name}: another process is downloading it; waiting", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fetch(
    url: str,
    dest: str | Path,
    sha256: str,
    *,
    progress: bool = True,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``dest`` and return ``dest`` once its SHA-256 equals ``sha256``.

    An existing ``dest`` with the right SHA-256 is returned without any network access; one
    with the wrong SHA-256 is deleted and downloaded again. Bytes are written to
    ``<dest>.part`` (resumed with an HTTP Range request if it exists), verified, fsync'ed and
    renamed into place atomically. Concurrent calls for the same ``dest`` (from threads or
    processes) are serialised with ``fcntl.flock`` on ``<dest>.lock``: one downloads, the others
    then return the verified file. Parent directories are created.

    Raises:
        ChecksumError: the downloaded bytes have another SHA-256 (the .part is deleted).
        DownloadError: the URL could not be fetched (network error, HTTP error, timeout);
            after a connection loss mid-body the .part is kept so the next call resumes.
        ValueError: ``sha256`` is not 64 hexadecimal digits.
    """
    expected = sha256.strip().lower() if isinstance(sha256, str) else ""
    if not _HEX64.fullmatch(expected):
        raise ValueError(f"sha256 must be 64 hexadecimal digits, got {sha256!r}")
    dest = Path(dest).expanduser()

    # Fast path, no lock: a file only appears at dest via os.replace after verification,
    # so a matching file here is complete and final.
    if dest.exists() and _matches(dest, expected):
        return dest

    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock(dest.with_name(dest.name + ".lock"), dest.name, progress)
    except OSError as exc:
        raise DownloadError(
            _one_line(
                f"cannot write beside {dest} ({exc.strerror or exc}); choose a writable data "
                f"directory, or download {url} by hand and put it at {dest} (SHA-256 {expected})"
            )
        ) from None
    try:
        # Another process may have finished while we waited for the lock.
        if dest.exists():
            if _matches(dest, expected):
                return dest
            _remove(dest)  # wrong bytes: never trusted, never left in place
        return _Fetcher(url, dest, expected, progress, timeout).run()
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
