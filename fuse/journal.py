"""The write-back journal of a ``--writeback`` mount: files on the mount's disk that are not
staged yet, so that a mount killed before staging them stages them when it starts again.

Layout, in ``<write-dir>/writeback/``:

- ``<id>.data``: the file's local content. It is the very inode the mount writes to (its
  ``O_TMPFILE`` given a name with ``linkat``), so later writes land in it too; no copy.
- ``<id>.json``: where it goes and its attributes: ``repo``, ``branch``, ``path``, ``mode``,
  ``uid``, ``gid``, ``mtime_ns``, ``ctime_ns``, ``meta``. Written to a temporary name and
  renamed, so it is whole or absent; a ``.data`` without its ``.json`` is a file whose
  record never completed (its fsync had not returned), and is deleted at the next start.
The ``--write-dir`` itself is locked (:class:`~fabric.util.dirlock.DirLock`) by the one mount
that uses it, for its lifetime: a second is refused, and a killed one's lock is gone with it.

A record is written when the file's fsync or close parks it (:mod:`fuse.writeback`) and
removed once the mount has staged the version it recorded, or when the file is unlinked.
With ``--seed-copies`` the ``.data`` of a staged record keeps its name until the file's local
state is dropped, so that its seed can be a hard link (an unnamed file that had a name cannot
take one again).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from fabric.util.dirlock import DirLock
from fabric.util.jsonfile import fsync_dir, write_json

log = logging.getLogger("fabric.fuse")

DIRNAME = "writeback"

_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


def link_fd(fd: int, path: str) -> None:
    """``linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH)``: a name for an open file, also one
    made with ``O_TMPFILE``. Falls back to linking ``/proc/self/fd/N`` (which some kernels
    refuse with EXDEV, others allow where AT_EMPTY_PATH needs a capability)."""
    if _libc.linkat(fd, b"", _AT_FDCWD, os.fsencode(path), _AT_EMPTY_PATH) == 0:
        return
    first = ctypes.get_errno()
    try:
        os.link(f"/proc/self/fd/{fd}", path, follow_symlinks=True)
    except OSError as exc:
        raise OSError(first, f"cannot name the write-back file {path}: {os.strerror(first)}; then {exc.strerror}") from None


@dataclass(frozen=True)
class Record:
    """One parked file, as its ``.json`` names it."""

    id: str
    repo: str
    branch: str
    path: str
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        del out["id"]
        return out


class Journal:
    """The journal directory of one mount, locked for its lifetime."""

    def __init__(self, write_dir: str) -> None:
        self._lock = DirLock(write_dir, "write-back directory (--write-dir)")
        self.dir = os.path.join(write_dir, DIRNAME)
        os.makedirs(self.dir, exist_ok=True)

    def new_id(self) -> str:
        return uuid.uuid4().hex

    def data_path(self, rid: str) -> str:
        return os.path.join(self.dir, rid + ".data")

    def link(self, rid: str, fd: int) -> None:
        """Give the open (``O_TMPFILE``) file ``fd`` the name of record ``rid``'s data."""
        link_fd(fd, self.data_path(rid))

    def write(self, record: Record, durable: bool) -> None:
        """Write ``record`` (replacing an earlier one of its id); ``durable``: on disk, with
        its data's name, before this returns."""
        write_json(os.path.join(self.dir, record.id + ".json"), record.to_json(), durable)
        if durable:
            fsync_dir(self.dir)

    def drop(self, rid: str) -> None:
        """Forget record ``rid`` (its record first: a data file without one is never replayed)."""
        for suffix in (".json", ".data"):
            try:
                os.unlink(os.path.join(self.dir, rid + suffix))
            except FileNotFoundError:
                pass

    def retire(self, rid: str) -> str:
        """Forget record ``rid`` but keep its data's name, which is returned: a name of the file
        for a seed to link (``--seed-copies``). The caller removes it; a start removes it too
        (a ``.data`` without its ``.json``)."""
        try:
            os.unlink(os.path.join(self.dir, rid + ".json"))
        except FileNotFoundError:
            pass
        return self.data_path(rid)

    def records(self) -> list[Record]:
        """The complete records, oldest first; leftovers of incomplete ones are removed."""
        out: list[tuple[float, Record]] = []
        names = set(os.listdir(self.dir))
        for name in sorted(names):
            rid, dot, suffix = name.partition(".")
            if suffix == "json.tmp" or (suffix == "data" and rid + ".json" not in names):
                os.unlink(os.path.join(self.dir, name))
                continue
            if suffix != "json":
                continue
            path = os.path.join(self.dir, name)
            try:
                with open(path) as f:
                    fields = json.load(f)
                record = Record(id=rid, **fields)
            except (OSError, ValueError, TypeError) as exc:
                log.error("write-back journal: %s is unreadable (%s); left in place", path, exc)
                continue
            if rid + ".data" not in names:
                log.error("write-back journal: %s has no data file; dropped", path)
                self.drop(rid)
                continue
            out.append((os.stat(path).st_mtime, record))
        return [r for _, r in sorted(out, key=lambda pair: pair[0])]

    def latest(self) -> tuple[list[Record], int]:
        """:meth:`records`, of two of one file (repository, branch, path) only the later: the
        earlier are dropped (a version saved after them replaced them); and how many were."""
        latest: dict[tuple[str, str, str], Record] = {}
        dropped = 0
        for record in self.records():  # oldest first
            older = latest.pop((record.repo, record.branch, record.path), None)
            if older is not None:
                self.drop(older.id)
                dropped += 1
            latest[(record.repo, record.branch, record.path)] = record
        return list(latest.values()), dropped

    def close(self) -> None:
        self._lock.release()
