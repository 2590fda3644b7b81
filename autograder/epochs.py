"""The epoch keeper: each ``epoch_XXX.npz`` of a run, copied the moment the watchdog first sees it.

While the notebook runs, :class:`EpochKeeper` lists the run's ``output/`` on every poll of the
watchdog and copies each new epoch file into a folder of the grader's (read with
:func:`autograder.safe_read.read_regular`: no link followed, regular files only, size capped), with
the time it was seen and when it was written. An epoch is measured as it was when its time was
taken; a later rewrite is reported (:meth:`EpochKeeper.rewritten`) and ignored. At most
:data:`MAX_KEPT_EPOCHS` files and :data:`MAX_KEPT_BYTES` are kept from one run.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from autograder.safe_read import Rejected, read_regular
from mgpu import assessment

#: Largest epoch file the watchdog copies (as mgpu.assessment.MAX_WEIGHTS_BYTES).
MAX_EPOCH_BYTES = assessment.MAX_WEIGHTS_BYTES
#: What the watchdog copies from one run at most: a run could otherwise save, wait for the copy,
#: delete and save again, and fill the grader's disk (or a cluster's shared folder, where a Slurm
#: node's runner keeps its copies) far beyond its own quota. The reference saves one file of
#: 0.4 MB per epoch (12 at most); 200 files and 64 MB (160 such files) are generous.
MAX_KEPT_EPOCHS = 200
MAX_KEPT_BYTES = 64 * 2**20


class EpochKeeper:
    """Copies each epoch file of the run the first time it is seen; notes later rewrites."""

    def __init__(self, output: Path, keep: Path, owner: int | None):
        self.output, self.keep, self.owner = Path(output), Path(keep), owner
        self.keep.mkdir(parents=True, exist_ok=True)
        self.seen: dict[int, float] = {}
        # epoch -> when the file was written (wall clock): its modification time, held between the
        # listing that did not show it and the one that did, so the time a run sets on its own files
        # moves the moment by no more than the time between two listings
        self.written: dict[int, float] = {}
        self.listed_at = time.time()  # when the folder was last listed (wall clock)
        self.files: dict[int, Path] = {}
        self.rejected: dict[int, str] = {}
        self._digests: dict[int, str] = {}
        self.kept_bytes = 0
        try:
            self._fd = os.open(self.output, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def _names(self) -> dict[int, str]:
        if self._fd is None:
            return {}
        try:
            names = os.listdir(self._fd)
        except OSError:
            return {}
        return {int(m.group(1)): name for name in names if (m := assessment.EPOCH_FILE.match(name))}

    def poll(self, now: float) -> None:
        absent_at, self.listed_at = self.listed_at, time.time()
        names = self._names()
        listed = time.time()  # every file listed was there by now
        for epoch, name in sorted(names.items()):
            if epoch in self.seen:
                continue
            self.seen[epoch] = now
            try:  # the link itself, never what it points to
                mtime = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_mtime
            except OSError:
                mtime = listed
            self.written[epoch] = min(max(mtime, absent_at), listed)
            if len(self.seen) > MAX_KEPT_EPOCHS or self.kept_bytes >= MAX_KEPT_BYTES:
                self.rejected[epoch] = (f"{name} was not kept: the run saved more than {MAX_KEPT_EPOCHS} epoch "
                                        f"files or {MAX_KEPT_BYTES // 2**20} MB of them (save one file per epoch)")
                continue
            try:
                data = read_regular(self._fd, name, min(MAX_EPOCH_BYTES, MAX_KEPT_BYTES - self.kept_bytes),
                                    self.owner)
            except Rejected as error:
                self.rejected[epoch] = str(error)
                continue
            copy = self.keep / name
            copy.write_bytes(data)
            self.kept_bytes += len(data)
            self.files[epoch] = copy
            self._digests[epoch] = hashlib.sha256(data).hexdigest()

    def rewritten(self) -> list[int]:
        """Epochs whose file is now different from (or gone since) the copy the grader took."""
        changed = []
        for epoch, digest in self._digests.items():
            try:
                now = read_regular(self._fd, self.files[epoch].name, MAX_EPOCH_BYTES, self.owner)
                same = hashlib.sha256(now).hexdigest() == digest
            except Rejected:
                same = False
            if not same:
                changed.append(epoch)
        return changed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

