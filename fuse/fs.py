"""The FUSE filesystem: mfusepy operations translated to data-plane calls.

:class:`FabricFS` is the table of callbacks. Each turns the FUSE path into a
repository path, runs in :func:`~fuse.errors.op` (latency statistics, failures
as errnos) and hands the call to the part of the mount that owns it:
:mod:`fuse.read_path` (open and read), :mod:`fuse.write_path` (files being
written and their staging), :mod:`fuse.namespace_changes` (mkdir, rmdir,
unlink, symlink, rename), :mod:`fuse.attrs` (getattr and attribute changes),
:mod:`fuse.directories` (directory handles and listings), :mod:`fuse.links`
(hard links) and :mod:`fuse.commits` (background staging and commits). They share
:class:`~fuse.state.MountState`; every data-plane call goes through one
:class:`~fabric.plane.retry.RetryingPlane`, so the mount rides out server restarts; during
an outage, only some of libfuse's threads may wait for the server (:mod:`fuse.outage`).

Read-only mounts of a commit or tag are immutable: listings, entries and
chunks are cached for good, and the kernel keeps its page cache and
attribute cache (the second epoch is served by the kernel). Branch mounts
follow the head with close-to-open coherence: ``open`` fetches the current
entry and ``opendir`` lists the directory anew.

With ``--rw`` (branches only), writes go to local temporary files
(:mod:`fuse.writer`) and are staged on the branch when the file is closed,
fsynced or renamed (with ``--writeback``, in the background after fsync or close:
:mod:`fuse.writeback`); metadata changes (chmod, chown, utimens, mkdir, rmdir,
rename, symlink, unlink, mknod of FIFOs, sockets and devices) are staged at once, each as one atomic
:meth:`~fabric.plane.dataplane.DataPlane.stage` call. ``fabric commit`` (or the
mount's own ``--commit-interval`` / ``--commit-on-unmount``) turns staged
changes into a commit.

Errors (also listed in ``fabric mount --help``):

- ``EROFS``: any change on a read-only mount (commit, tag, or branch without ``--rw``).
- ``EPERM``: ``link`` of a directory; ``mknod`` of a device by a caller without CAP_MKNOD
  (the kernel's check, as on ext4); chmod, chown or utimens of a directory that shadows a file or symlink of its name (its marker
  would overwrite that entry; see :mod:`fabric.format.namespace`).
- ``EOPNOTSUPP``: extended attributes (``setxattr``/``getxattr``; ``listxattr`` too),
  ``fallocate`` modes other than plain allocation.
- ``EINVAL``: ``rename`` with ``RENAME_EXCHANGE`` or ``RENAME_WHITEOUT``; a name the
  repository refuses.
- ``EILSEQ``: a file name that is not valid UTF-8.
- ``ENAMETOOLONG``: a name over 255 bytes (for every call: its lookup comes first, as on
  ext4) or a path over 4096 bytes.
- ``EIO``: the server stayed unreachable for longer than ``--server-timeout`` (or is
  unreachable while as many requests wait for it as may: :mod:`fuse.outage`), or
  sent data that failed verification twice. The mount stays usable.
- ``EACCES``: the token may not read (or write) the repository.

Times: mtime and ctime are stored with each entry; a directory whose entries
are created, removed or renamed gets a marker with its new times, staged in
the same call as the change. atime, and the root's times (it has no entry),
are kept by the mount for the session.

Hard links share one entry at each name (:mod:`fabric.format.links`): a write or
an attribute change through one name is staged at all of them; ``st_ino`` comes
from :mod:`fuse.inodes`. An open file whose last name is unlinked lives on
under a hidden name (:mod:`fuse.unlinked`) until its last close.
"""

from __future__ import annotations

import errno
import logging
import os
import stat as S
import threading
from collections.abc import Callable
from typing import Any

import mfusepy

from fuse.attrs import Attributes
from fuse.checkpoint_commits import CheckpointCommits
from fuse.commits import Committer
from fuse.config import MountConfig
from fuse.directories import Directories
from fuse.errors import err, op
from fuse.libfuse import MAX_THREADS, WAIT_RESERVE, configure
from fuse.links import Links
from fuse.namespace_changes import NamespaceChanges
from fuse.outage import MountHealth, MountPlane
from fuse.read_path import ReadPath
from fuse.state import MountState, rel
from fuse.stats import Stats
from fuse.unlinked import Unlinked
from fuse.write_path import WritePath

log = logging.getLogger("fabric.fuse")


class FabricFS(mfusepy.Operations):
    """The callbacks of one mount, each handed to the part that owns it (see the module docstring)."""

    use_ns = True

    def __init__(self, plane: Any, config: MountConfig, *, branch: bool, commit_id: str, commit_time: float) -> None:
        # At most MAX_THREADS - WAIT_RESERVE FUSE threads wait for an unreachable server (fuse.outage).
        self.health = MountHealth(config.server_timeout, MAX_THREADS - WAIT_RESERVE)
        self.state = MountState(MountPlane(plane, self.health), config, branch=branch, commit_id=commit_id, commit_time=commit_time)
        self.stats = Stats()
        self.reads = ReadPath(self.state)
        self.writes = WritePath(self.state, self.reads)
        self.unlinked = Unlinked(self.state, self.writes)
        self.attrs = Attributes(self.state, self.writes, self.unlinked)
        self.dirs = Directories(self.state, self.attrs)
        self.changes = NamespaceChanges(self.state, self.writes, self.reads)
        self.links = Links(self.state, self.writes, self.reads)
        self.commits = Committer(self.state, self.writes)
        self.checkpoints = CheckpointCommits(self.state, self.writes) if config.commit_checkpoints and self.state.writable else None
        self.on_ready: Callable[[], None] | None = None

    # -- lifecycle ---------------------------------------------------------------
    def init_with_config(self, conn, config) -> None:
        st = self.state
        configure(conn, config, st.cfg, immutable=st.immutable, writable=st.writable)
        self.commits.start()
        if self.checkpoints is not None:
            self.checkpoints.start()
        if self.on_ready is not None:
            threading.Thread(target=self.on_ready, name="fabric-ready", daemon=True).start()

    def destroy(self, path: str) -> None:
        if self.checkpoints is not None:
            self.checkpoints.stop()
        self.commits.stop()
        if self.writes.writeback is not None:
            self.writes.writeback.shutdown()
        if self.writes.seeds is not None:
            self.writes.seeds.close()
        self.reads.close()
        if self.state.streams is not None:
            self.state.streams.shutdown()
        log.info("unmounted; operation latencies:\n%s", self.stats.report())

    # -- attributes ------------------------------------------------------------------
    @op
    def getattr(self, path: str | None, fh: Any = None) -> dict[str, Any]:
        return self.attrs.getattr(rel(path), fh)

    @op
    def readlink(self, path: str) -> str:
        return self.attrs.readlink(rel(path) or "")

    @op
    def statfs(self, path: str) -> dict[str, int]:
        return self.attrs.statfs()

    @op
    def chmod(self, path: str | None, mode: int, fi: Any = None) -> int:
        self.attrs.chmod(rel(path), mode, fi)
        return 0

    @op
    def chown(self, path: str | None, uid: int, gid: int, fi: Any = None) -> int:
        self.attrs.chown(rel(path), uid, gid, fi)
        return 0

    @op
    def utimens(self, path: str | None, times: tuple[int, int] | None = None, fi: Any = None) -> int:
        self.attrs.utimens(rel(path), times, fi)
        return 0

    # -- directories -------------------------------------------------------------------
    @op
    def opendir(self, path: str, fi: Any = None) -> int:
        return self.dirs.opendir(rel(path) or "", fi)

    @op
    def readdir(self, path: str | None, fh: int) -> list:
        return self.dirs.readdir(rel(path) or "", fh)

    def readdir_snapshot(self, fh: int, refresh: bool) -> list[tuple[str, dict[str, Any]]]:
        """Names with their attributes, for :meth:`~fuse.libfuse.FabricFUSE.readdir_fuse_3` (READDIRPLUS)."""
        items = self.dirs.snapshot(fh, refresh)
        if len(items) >= 2 and "st_ino" not in items[0][1]:
            # '.' and '..' need inode numbers too (use_ino): readdir(3) hides entries numbered 0.
            p = self.dirs.paths.get(fh, "")
            items[0][1]["st_ino"] = self.state.inodes.of(p, None)
            items[1][1]["st_ino"] = self.state.inodes.of(p.rpartition("/")[0], None)
        return items

    def releasedir(self, path: str | None, fh: int) -> int:
        self.dirs.release(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # directory changes are staged when they happen

    # -- files -------------------------------------------------------------------------
    @op
    def open(self, path: str, fi: Any) -> int:
        if self.state.immutable:
            # Nothing to pin per open: answering ENOSYS makes the kernel stop sending opens
            # (and keep its page cache), which saves a round trip per file and epoch.
            raise err(errno.ENOSYS)
        p = rel(path) or ""
        flags = fi.flags
        if (flags & os.O_ACCMODE) != os.O_RDONLY or flags & os.O_TRUNC:
            self.writes.open_for_writing(p, fi, truncate=bool(flags & os.O_TRUNC))
        elif (wf := self.state.files.get(p)) is None or not self.writes.open_for_reading(wf, fi):
            self.reads.open(p, fi)
        return 0

    @op
    def read(self, path: str | None, dst: memoryview, offset: int, fi: Any) -> int:
        """Copy the bytes at ``offset`` into ``dst``, the kernel's buffer (:meth:`FabricFUSE.read`)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("read %s offset %d size %d fh %d", path, offset, len(dst), fi.fh)
        return self.reads.read(rel(path), dst, offset, fi.fh)

    @op
    def release(self, path: str | None, fi: Any) -> int:
        self.writes.release(fi.fh)
        self.unlinked.drop_closed()
        return 0

    @op
    def create(self, path: str, mode: int, fi: Any) -> int:
        self.writes.create(rel(path) or "", mode, fi)
        return 0

    @op
    def mknod(self, path: str, mode: int, dev: int) -> int:
        if S.S_ISREG(mode):
            self.writes.mknod(rel(path) or "", mode)
        else:
            self.changes.mknod(rel(path) or "", mode, dev)  # FIFOs, sockets, devices
        return 0

    @op
    def write(self, path: str | None, data: bytes | memoryview, offset: int, fi: Any) -> int:
        return self.writes.write(fi.fh, data, offset)

    @op
    def truncate(self, path: str | None, length: int, fh: Any = None) -> int:
        self.writes.truncate(rel(path), length, fh)
        return 0

    @op
    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fi: Any) -> int:
        self.writes.fallocate(fi.fh, mode, offset, size)
        return 0

    @op
    def flush(self, path: str | None, fi: Any) -> int:
        self.writes.flush(fi.fh)
        return 0

    @op
    def fsync(self, path: str | None, datasync: int, fi: Any) -> int:
        self.writes.fsync(fi.fh)
        return 0

    # -- namespace changes ---------------------------------------------------------------
    @op
    def mkdir(self, path: str, mode: int) -> int:
        self.changes.mkdir(rel(path) or "", mode)
        return 0

    @op
    def rmdir(self, path: str) -> int:
        self.changes.rmdir(rel(path) or "")
        return 0

    @op
    def unlink(self, path: str) -> int:
        p = rel(path) or ""
        if self.unlinked.file(p) is not None:
            self.unlinked.forget(p)
        else:
            self.changes.unlink(p)
        return 0

    @op
    def symlink(self, path: str, target: str) -> int:
        self.changes.symlink(rel(path) or "", target)
        return 0

    @op
    def link(self, target: str, source: str) -> int:
        """``target``: the new name of the file at ``source``."""
        self.links.link(rel(source) or "", rel(target) or "")
        return 0

    @op
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        src, dst = rel(old) or "", rel(new) or ""
        if self.unlinked.hides(src, dst):
            self.unlinked.hide(src, dst, self.changes.unlink)
        else:
            self.changes.rename(src, dst, flags)
            if self.checkpoints is not None:
                self.checkpoints.renamed(dst)
        return 0
