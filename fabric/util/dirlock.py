"""One process per directory: an advisory ``flock(2)`` on the directory itself.

A cache, a spoke's state or a hub's data directory assumes it is its only user
(a cache indexes its files and removes stray temporaries at start). A
:class:`DirLock` keeps a second *process* out with a clear error naming the
directory and, where the kernel tells (``/proc/locks``), the pid holding it.
The lock is taken on the directory's own descriptor, so no lock file joins the
directory's contents, and the kernel drops it when the holder exits, however
it exits: a crash never leaves a stale lock behind.

Within one process the lock is shared: opening a directory again (a restart
simulated in a test, two objects over one directory) takes a reference to the
lock already held, and the directory is unlocked when the last holder releases it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from types import TracebackType

from fabric.errors import Conflict


class DirectoryInUse(Conflict):
    """Another process holds the directory's lock."""

    code = "directory_in_use"


# Locks this process holds: (device, inode) of the directory -> [fd, holders].
_held: dict[tuple[int, int], list[int]] = {}
_held_lock = threading.Lock()


class DirLock:
    """Hold ``directory``'s lock (creating the directory) until :meth:`release` or the end of
    a ``with`` block. ``what`` names the directory's role in the error ("cache directory").

    Raises :class:`DirectoryInUse` when another process holds it.
    """

    def __init__(self, directory: str, what: str = "directory") -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with _held_lock:
            st = os.fstat(fd)
            self._key: tuple[int, int] | None = (st.st_dev, st.st_ino)
            held = _held.get(self._key)
            if held is not None:
                os.close(fd)
                held[1] += 1
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = lock_holder(st.st_dev, st.st_ino)
                by = f"process {holder}" if holder else "another process"
                raise DirectoryInUse(
                    f"{what} {directory} is in use by {by}; stop it or use another directory",
                    directory=directory,
                    pid=holder,
                ) from None
            _held[self._key] = [fd, 1]

    def release(self) -> None:
        """Give the lock up (idempotent); the directory is unlocked when this process's last holder releases it."""
        with _held_lock:
            if self._key is None:
                return
            key, self._key = self._key, None
            held = _held[key]
            held[1] -= 1
            if held[1] == 0:
                del _held[key]
                os.close(held[0])  # closing the descriptor drops the flock

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.release()


def lock_holder(dev: int, ino: int) -> int | None:
    """The pid holding a flock on the file ``(dev, ino)``, from ``/proc/locks`` (Linux); None if unknown."""
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    with contextlib.suppress(OSError), open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"; waiters read "1: -> FLOCK ...".
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want:
                with contextlib.suppress(ValueError):
                    return int(fields[4])
    return None
