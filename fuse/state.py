"""What the parts of a mount share: its target, its plane and directory tree, and the
tables of local state that reads, writes, namespace and attribute changes all consult.

The tables (paths are repository paths, '' the root):

- ``files``: files with local state (being written, or staged but still open), by path;
  while one exists, every read and stat of its path is served from it.
- ``times``: atime kept by the mount for the session; and the mtime and ctime of a
  directory whose change cannot be stored (one that shadows a file of its name: a
  marker would overwrite that file). Other times are stored with the entries
  (``mtime_ns``, ``ctime_ns``; a directory that changes gets a marker, :meth:`MountState.touch_dir`).
- ``root``: the root directory's attributes (it has no entry).
- ``kernel_sig``: the version of each file whose pages and size the kernel may cache.
- ``kernel_attrs``: on a branch mount, the version of each file whose attributes (its
  size) the kernel was last given, by a stat or a listing: not always the one whose pages
  it holds.
- ``handles``: the open file handles.
- ``inodes``: the inode number of each name (:mod:`fuse.inodes`).

Locking: ``mu`` guards these tables and is held only for short in-memory updates,
never across a network call. A change of the namespace holds the names it changes
in ``names`` (:class:`~fuse.pathlocks.PathLocks`) across its network calls, so it
waits only for changes of the same names (or of a directory above them), never for
a round trip elsewhere in the mount.
"""

from __future__ import annotations

import errno
import stat as S
import threading
import time
from typing import Any

import mfusepy

from fabric.format.model import DEFAULT_DIR_MODE, DIR, Entry
from fabric.format.paths import check_path
from fabric.plane.retry import RetryingPlane
from fuse.config import MountConfig
from fuse.errors import err
from fuse.handles import Handles
from fuse.inodes import Inodes
from fuse.namespace import Namespace, split
from fuse.pathlocks import PathLocks
from fuse.streaming import StreamPool
from fuse.writer import WFile


def rel(path: str | None) -> str | None:
    """FUSE path ('/a/b') -> repository path ('a/b'); the root is ''."""
    return None if path is None else path.lstrip("/")


class MountState:
    """The shared view of one mount (see the module docstring for its tables)."""

    def __init__(self, plane: RetryingPlane, config: MountConfig, *, branch: bool, commit_id: str, commit_time: float) -> None:
        self.plane = plane
        self.cfg = config
        self.repo = config.repo
        self.branch = config.ref if branch else None
        self.immutable = not branch
        self.writable = config.writable and branch
        self.commit_id = commit_id
        mtime_ns = int(commit_time * 1e9)
        self.implicit = Entry(DIR, 0, DEFAULT_DIR_MODE, mtime_ns, uid=config.uid, gid=config.gid)
        self.mu = threading.RLock()  # the tables below; never held across a network call
        self.names = PathLocks()  # names being changed (held across network calls)
        self.ns = Namespace(plane, self.repo, config.ref if branch else commit_id, self.implicit, None if self.immutable else config.attr_timeout)
        self.root: dict[str, Any] = {"mode": DEFAULT_DIR_MODE, "uid": config.uid, "gid": config.gid, "mtime": mtime_ns, "ctime": mtime_ns, "atime": mtime_ns}
        self.files: dict[str, WFile] = {}
        self.times: dict[str, dict[str, int]] = {}  # session-local atime (and unstorable directory times)
        self.kernel_sig: dict[str, tuple] = {}
        self.kernel_attrs: dict[str, tuple] = {}
        self.handles = Handles()
        self.inodes = Inodes()  # st_ino of each name (hard links share one)
        #: Background chunking of files written in order (None: every file is chunked at sync).
        self.streams = StreamPool() if self.writable and config.stream_writes else None

    def need_rw(self) -> None:
        if not self.writable:
            raise err(errno.EROFS)

    def entry(self, p: str) -> Entry | None:
        """What the mount shows at ``p`` (local unstaged files first), None if nothing."""
        wf = self.files.get(p)
        if wf is not None:
            return wf.stat_entry()
        return self.ns.lookup(p)

    def stage(self, changes: dict[str, Entry | None]) -> None:
        """Stage ``changes`` on the branch (one atomic call) and reflect them in the listings.

        The caller holds the changed paths in ``names``, not ``mu``."""
        self.plane.stage(self.repo, self.branch, changes)
        with self.mu:
            for p, e in changes.items():
                self.ns.update(p, e)

    def touch_dir(self, d: str, now: int, changes: dict[str, Entry | None]) -> None:
        """An entry of directory ``d`` is created, removed or renamed by ``changes``: its mtime and
        ctime move to ``now``, stored with them (a marker at ``d`` in ``changes``; an implicit
        directory gets one). For the session only where no marker can be: the root (it has
        no entry), a directory that shadows a file or symlink of its name. The caller holds ``d``
        (shared, as the parent of the names it changes), not ``mu``."""
        if d in changes:
            e = changes[d]
            if e is not None and e.kind == DIR:
                changes[d] = e.with_(mtime_ns=now, ctime_ns=now)
            return
        e = self.ns.lookup(d) if d else None
        if e is None or e.kind != DIR or self.ns.shadows(d):
            with self.mu:
                self.bump_dir(d, now)
            return
        if self.ns.is_implicit(e):
            e = Entry(DIR, 0, e.mode, now, uid=e.uid, gid=e.gid)
        changes[d] = e.with_(mtime_ns=now, ctime_ns=now)
        with self.mu:
            t = self.times.get(d)
            if t:
                t.pop("mtime", None)
                t.pop("ctime", None)

    def bump_dir(self, d: str, now: int | None = None) -> None:
        """An entry of directory ``d`` was created or removed: its mtime and ctime move (for the session)."""
        now = now or time.time_ns()
        if d == "":
            self.root["mtime"] = self.root["ctime"] = now
        else:
            t = self.times.setdefault(d, {})
            t["mtime"] = t["ctime"] = now

    def check_new(self, p: str) -> None:
        """``p`` may be created: a valid path with nothing there (EEXIST)."""
        check_path(p)
        if self.entry(p) is not None:
            raise err(errno.EEXIST)

    def new_owner(self, p: str, mode: int, is_dir: bool) -> tuple[int, int, int]:
        """``(uid, gid, mode)`` of a new entry: the caller, with the group (and setgid bit) of a setgid parent."""
        uid, gid, _ = mfusepy.fuse_get_context()
        parent, _ = split(p)
        if parent == "":
            pmode, pgid = self.root["mode"], self.root["gid"]
        else:
            pe = self.entry(parent)
            if pe is None:
                raise err(errno.ENOENT)
            if pe.kind != DIR:
                raise err(errno.ENOTDIR)
            pmode = pe.mode
            pgid = pe.gid if pe.gid is not None else self.cfg.gid
        if pmode & S.S_ISGID:
            gid = pgid
            if is_dir:
                mode |= S.S_ISGID
        return uid, gid, mode
