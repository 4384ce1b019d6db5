"""The background check of a ``--passthrough`` mount's plain copies (:mod:`fabric.cache.files`).

The kernel reads a copy unchecked, so no copy is served whose last check (read whole against
its checksum) is older than the copies' ``recheck_after`` (a day). Done at an open, the check
costs the open a read of the whole file (a restore then reads the disk once for the check,
then the page cache). The scrub does it beforehand: from start-up, one copy after another,
most recently opened first (the likeliest to be read next), at the idle I/O priority where the
kernel offers one, so that a mount up for a while serves its first opens at once. An open of
a copy the scrub is reading does not wait for it (that read yields to every other reader's):
it checks the copy itself (what the scrub has read of it comes from the page cache). Then it
sleeps until the oldest check goes stale and checks that copy again, so a copy damaged at
rest is found and removed within a day (opens after that read the file from chunks; one
open already is not undone).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading

from fabric.cache.files import FileCopies

log = logging.getLogger("fabric.cache")

#: The least seconds between two passes (a copy that cannot be read is not tried again at once).
MIN_PAUSE = 60.0
#: ``ioprio_set`` by machine (the idle class: the scrub's reads wait for every other reader's).
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_CLASS_SHIFT = 13


class CopyScrub:
    """A thread that checks ``copies`` ahead of their opens, and again as their checks go stale."""

    def __init__(self, copies: FileCopies) -> None:
        self.copies = copies
        self.pause = min(MIN_PAUSE, copies.recheck_after)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fabric-scrub", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        _idle_io_priority()
        while not self._stop.is_set():
            for key in self.copies.unchecked():
                if self._stop.is_set():
                    return
                try:
                    self.copies.check_copy(key)
                except OSError as exc:  # (an I/O error of the disk: the open will meet it too)
                    log.warning("scrub: cannot read copy %s: %s", key, exc)
            if self._stop.wait(max(self.pause, self.copies.next_check_due())):
                return


def _idle_io_priority() -> None:
    """Put the calling thread in the idle I/O class, where the kernel has one (best effort)."""
    number = _IOPRIO_SET.get(platform.machine())
    if number is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 1, 0, _IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT) != 0:  # IOPRIO_WHO_PROCESS, this thread
        log.debug("scrub: idle I/O priority refused: %s", os.strerror(ctypes.get_errno()))
