"""Reading what a run wrote, as hostile data: never a link, never blocking, never more than a cap.

Every file the grader reads from a run (epoch files, facts files, a Slurm node's ``result.json``)
and every submitted notebook is read by :func:`read_regular`: opened relative to a folder
descriptor with ``O_NOFOLLOW | O_NONBLOCK``, a regular file only, its size counted while reading.
What it refuses raises :class:`Rejected`, whose message is the one-line reason.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path


class Rejected(ValueError):
    """A file of the run the grader will not take; the message says why, in one line."""


def read_regular(folder_fd: int, name: str, max_bytes: int, owner: int | None = None, *,
                 fix: str = "save with the locked callback") -> bytes:
    """The bytes of ``name`` in the folder open as ``folder_fd``, read as hostile data.

    Never follows a link and never blocks: only a regular file of at most ``max_bytes`` (counted
    while reading, not trusted from a stat), owned by ``owner`` when given; otherwise
    :class:`Rejected` with the reason (and ``fix``, what to do instead).
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Rejected(f"{name} is a link, not a file: {fix}") from None
        raise Rejected(f"{name} could not be opened ({error.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Rejected(f"{name} is not a regular file (a folder, fifo or device): {fix}")
        if owner is not None and info.st_uid != owner:
            raise Rejected(f"{name} was not written by a Horovod worker the grader started")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            cap = f"{max_bytes / 1e6:.0f} MB" if max_bytes >= 1e6 else f"{max_bytes / 1e3:.0f} kB" \
                if max_bytes >= 1e3 else f"{max_bytes} bytes"
            raise Rejected(f"{name} is larger than the {cap} a file may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_path(path: str | os.PathLike, max_bytes: int, *, fix: str) -> bytes:
    """:func:`read_regular` for a path: its last component is never followed (a link is refused)."""
    path = Path(path)
    try:
        folder_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise Rejected(f"{path.name} could not be opened ({error.strerror})") from None
    try:
        return read_regular(folder_fd, path.name, max_bytes, fix=fix)
    finally:
        os.close(folder_fd)


def read_outputs(output: Path, pattern: str, max_bytes: int, owner: int | None) -> dict[str, bytes | Rejected]:
    """Every file of ``output`` whose name matches ``pattern`` (a regex): its bytes, or why it was refused."""
    found: dict[str, bytes | Rejected] = {}
    try:
        folder_fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return found
    try:
        for name in sorted(os.listdir(folder_fd)):
            if re.fullmatch(pattern, name):
                try:
                    found[name] = read_regular(folder_fd, name, max_bytes, owner)
                except Rejected as error:
                    found[name] = error
    finally:
        os.close(folder_fd)
    return found

