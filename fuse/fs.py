"""The FUSE filesystem: mfusepy operations translated to data-plane calls.

Read-only mounts of a commit or tag are immutable: listings, entries and
chunks are cached for good, and the kernel keeps its page cache and
attribute cache (the second epoch is served by the kernel). Branch mounts
follow the head with close-to-open coherence: ``open`` fetches the current
entry and ``opendir`` lists the directory anew.

With ``--rw`` (branches only), writes go to local temporary files
(:mod:`fuse.writer`) and are staged on the branch when the file is closed,
fsynced or renamed; metadata changes (chmod, chown, utimens, mkdir, rmdir,
rename, symlink, unlink) are staged at once, each as one atomic
:meth:`~fabric.plane.dataplane.DataPlane.stage` call. ``fabric commit`` (or the
mount's own ``--commit-interval`` / ``--commit-on-unmount``) turns staged
changes into a commit.

Errors (also listed in ``fabric mount --help``):

- ``EROFS``: any change on a read-only mount (commit, tag, or branch without ``--rw``).
- ``EPERM``: ``link`` (hard links), ``mknod`` of devices, FIFOs and sockets.
- ``EOPNOTSUPP``: extended attributes (``setxattr``/``getxattr``; ``listxattr`` too),
  ``fallocate`` modes other than plain allocation.
- ``EINVAL``: ``rename`` with ``RENAME_EXCHANGE`` or ``RENAME_WHITEOUT``; a name the
  repository refuses.
- ``EILSEQ``: a file name that is not valid UTF-8.
- ``ENAMETOOLONG``: a name over 255 bytes or a path over 4096 bytes.
- ``EIO``: the server stayed unreachable for longer than ``--server-timeout``, or
  sent data that failed verification twice. The mount stays usable.
- ``EACCES``: the token may not read (or write) the repository.

Times: mtime is stored with each entry; atime and ctime are kept by the
mount for the session (they start equal to mtime after a remount), and
directory mtimes move with the entries created and removed in them for the
session (``utimens`` on a directory is stored).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import stat as S
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

import mfusepy

from fabric.errors import (
    BadRequest,
    FabricError,
    Forbidden,
    InvalidName,
    InvalidPath,
    NotFound,
    RangeNotSatisfiable,
    StorageFull,
    Unauthorized,
)
from fabric.cache.lru import BytesLRU
from fabric.format.model import DEFAULT_DIR_MODE, DIR, FILE, SYMLINK, Entry
from fabric.format.paths import check_path

from .namespace import Namespace, split
from .reader import Fetcher, FileReader, chunk_disk_cache
from .retry import Health, ServerGone
from .stats import Stats
from .writer import WFile

log = logging.getLogger("fabric.fuse")

_libfuse = mfusepy._libfuse
_libfuse.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_libfuse.fuse_invalidate_path.restype = ctypes.c_int

UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FOREVER = 365 * 24 * 3600.0
BLKSIZE = 1024 * 1024
#: Sibling readahead: when files of a directory are opened in order, fetch the next ones' chunks.
SIBLINGS_AHEAD = 512
SIBLINGS_BYTES = 16 * 1024 * 1024
FUSE_CAP_READDIRPLUS_AUTO = 1 << 14
FUSE_CAP_HANDLE_KILLPRIV = 1 << 20
#: Readers kept for an immutable mount (which reads by path).
READERS = 4096
#: How often files that could not be staged at close are tried again.
FLUSH_RETRY = 5.0


@dataclass
class MountConfig:
    repo: str
    ref: str
    writable: bool = False
    uid: int = 0  # owner of entries that record none
    gid: int = 0
    attr_timeout: float = 1.0  # branch mounts
    server_timeout: float = 120.0
    readahead: int = 32 * 1024 * 1024
    memory_cache: int = 512 * 1024 * 1024
    cache_dir: str | None = None
    cache_size: int = 10 * 1024**3
    write_dir: str | None = None
    commit_interval: float = 0.0
    commit_on_unmount: bool = False
    commit_message: str = "fabric mount"
    durability: str = "local"
    fetch_workers: int = 4


def fs_errno(exc: BaseException) -> int:
    """The errno a filesystem caller should see for an exception."""
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return exc.errno
    if isinstance(exc, ServerGone):
        return errno.EIO
    if isinstance(exc, NotFound):
        return errno.ENOENT
    if isinstance(exc, StorageFull):
        return errno.ENOSPC
    if isinstance(exc, InvalidPath):
        if "longer than" in exc.message:
            return errno.ENAMETOOLONG
        if "UTF-8" in exc.message:
            return errno.EILSEQ
        return errno.EINVAL
    if isinstance(exc, InvalidName):
        return errno.EINVAL
    if isinstance(exc, (Unauthorized, Forbidden)):
        return errno.EACCES
    if isinstance(exc, (BadRequest, RangeNotSatisfiable)):
        return errno.EINVAL
    return errno.EIO


def op(fn: Callable) -> Callable:
    """Wrap an operation: latency stats, and every failure turned into an errno."""
    name = fn.__name__

    @wraps(fn)
    def wrapper(self: FabricFS, *args: Any) -> Any:
        t0 = time.perf_counter()
        failed = True
        try:
            out = fn(self, *args)
            failed = False
            return out
        except mfusepy.FuseOSError:
            raise
        except Exception as exc:
            code = fs_errno(exc)
            if code == errno.EIO:
                log.error("%s%r failed: %s", name, args[:1], exc, exc_info=not isinstance(exc, (FabricError, ServerGone)))
            else:
                log.debug("%s%r: %s", name, args[:1], exc)
            raise mfusepy.FuseOSError(code) from exc
        finally:
            self.stats.record(name, time.perf_counter() - t0, failed)

    return wrapper


def _err(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


def rel(path: str | None) -> str | None:
    """FUSE path ('/a/b') -> repository path ('a/b'); the root is ''."""
    return None if path is None else path.lstrip("/")


class RHandle:
    """A read handle pinned to one version of a file (snapshot isolation)."""

    __slots__ = ("entry", "path", "reader")

    def __init__(self, entry: Entry, reader: FileReader, path: str) -> None:
        self.entry = entry
        self.reader = reader
        self.path = path  # as opened (for attribute changes through the handle)


class WHandle:
    """A handle on a file with local state (opened for writing, or read while being written)."""

    __slots__ = ("reader", "reader_base", "wf", "writable")

    def __init__(self, wf: WFile, writable: bool) -> None:
        self.wf = wf
        self.writable = writable
        self.reader: FileReader | None = None  # reads of the unchanged base version
        self.reader_base: Entry | None = None


def content_sig(entry: Entry) -> tuple:
    """What identifies a version of a file, whether its chunk list is inline or an object."""
    if entry.md5:
        return (entry.size, entry.md5, entry.mtime_ns)
    return (entry.size, entry.mtime_ns, entry.chunklist, entry.chunks[:4])


class FabricFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, plane, config: MountConfig, *, branch: bool, commit_id: str, commit_time: float) -> None:
        self.plane = plane
        self.cfg = config
        self.repo = config.repo
        self.branch = config.ref if branch else None
        self.immutable = not branch
        self.writable = config.writable and branch
        self.commit_id = commit_id
        self.stats = Stats()
        self.read_bytes = 0
        self.health = Health(config.server_timeout)
        disk = chunk_disk_cache(config.cache_dir, config.cache_size) if config.cache_dir else None
        self.memory = BytesLRU(config.memory_cache)
        self.fetcher = Fetcher(plane, self.health, self.memory, disk, config.fetch_workers)
        mtime_ns = int(commit_time * 1e9)
        self.implicit = Entry(DIR, 0, DEFAULT_DIR_MODE, mtime_ns, uid=config.uid, gid=config.gid)
        self.mu = threading.RLock()  # namespace changes of a --rw mount
        self.ns = Namespace(
            plane,
            self.health,
            self.repo,
            config.ref if branch else commit_id,
            self.implicit,
            None if self.immutable else config.attr_timeout,
            self.mu if self.writable else None,
        )
        self.root = {"mode": DEFAULT_DIR_MODE, "uid": config.uid, "gid": config.gid, "mtime": mtime_ns, "ctime": mtime_ns, "atime": mtime_ns}
        self.handles: dict[int, RHandle | WHandle] = {}
        self.dir_handles: dict[int, str] = {}
        self.dir_snapshots: dict[int, list] = {}
        self.readers: OrderedDict[str, FileReader] = OrderedDict()
        self.readers_lock = threading.Lock()
        self._fh = itertools.count(1)
        self.wfiles: dict[str, WFile] = {}
        self.times: dict[str, dict[str, int]] = {}  # session-local atime/ctime (and directory mtime) overrides
        self.kernel_sig: dict[str, tuple] = {}
        self.write_dir = config.write_dir
        self.on_ready: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._committer: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------
    def init_with_config(self, conn, config) -> None:
        if config is not None:
            config.use_ino = 0
            config.hard_remove = 1  # unlinked open files stay readable through their handle
            # Handle-based operations get no path (they may outlive it); an immutable mount
            # has no open handles at all (see open) and reads by path.
            config.nullpath_ok = 0 if self.immutable else 1
            if self.immutable:
                config.kernel_cache = 1
                config.entry_timeout = config.attr_timeout = config.negative_timeout = FOREVER
            else:
                config.kernel_cache = 0
                config.entry_timeout = config.attr_timeout = self.cfg.attr_timeout
                config.negative_timeout = self.cfg.attr_timeout if not self.writable else 0.0
        if conn is not None:
            conn.want &= ~FUSE_CAP_HANDLE_KILLPRIV  # the kernel clears setuid/setgid bits itself
            # Every readdir is a READDIRPLUS (names with attributes): listings come whole from
            # memory, and `ls -l`/find then need no lookup per entry.
            conn.want &= ~FUSE_CAP_READDIRPLUS_AUTO
            conn.max_readahead = max(conn.max_readahead, min(self.cfg.readahead, 1 << 30))
            conn.max_background = max(conn.max_background, 64)
            conn.congestion_threshold = max(conn.congestion_threshold, 48)
        if self.writable:
            threading.Thread(target=self._flush_loop, name="fabric-flush", daemon=True).start()
        if self.writable and self.cfg.commit_interval > 0:
            self._committer = threading.Thread(target=self._commit_loop, name="fabric-commit", daemon=True)
            self._committer.start()
        if self.on_ready is not None:
            threading.Thread(target=self.on_ready, name="fabric-ready", daemon=True).start()

    def destroy(self, path: str) -> None:
        self._stop.set()
        if self.writable:
            failed = self.flush_all()
            if self.cfg.commit_on_unmount:
                try:
                    if failed:
                        raise RuntimeError(f"{len(failed)} file(s) could not be staged, first {failed[0]}")
                    self.commit_now("unmount")
                except Exception as exc:  # noqa: BLE001 - the changes stay staged on the branch
                    log.error("commit at unmount failed (changes stay staged on the branch): %s", exc)
        self.fetcher.close()
        log.info("unmounted; operation latencies:\n%s", self.stats.report())

    # -- commits and background flushing ---------------------------------------------
    def flush_all(self, closed_only: bool = False) -> list[str]:
        """Stage every file with unstaged changes (``closed_only``: not those still open for
        writing, which may be half written); return the paths that failed."""
        failed = []
        for wf in list(self.wfiles.values()):
            if closed_only and wf.opens > 0:
                continue
            try:
                self._sync(wf)
            except Exception as exc:  # noqa: BLE001
                log.error("cannot stage %s: %s", wf.path, exc)
                failed.append(wf.path or "?")
            self._maybe_drop(wf)
        return failed

    def commit_now(self, why: str) -> str | None:
        assert self.branch is not None
        try:
            c = self.health.call(self.plane.commit, self.repo, self.branch, f"{self.cfg.commit_message} ({why})")
        except BadRequest as exc:
            if "nothing to commit" in exc.message:
                return None
            raise
        log.info("committed %s on %s@%s (%s)", c.id[:12], self.repo, self.branch, why)
        return c.id

    def _flush_loop(self) -> None:
        """Stage files whose staging failed at close (server away) once the server is back."""
        while not self._stop.wait(FLUSH_RETRY):
            for wf in list(self.wfiles.values()):
                if wf.opens == 0 and wf.dirty and not wf.unlinked:
                    try:
                        self._sync(wf)
                        log.info("staged %s after an earlier failure", wf.path)
                    except Exception as exc:  # noqa: BLE001 - next round
                        log.debug("still cannot stage %s: %s", wf.path, exc)
                    self._maybe_drop(wf)

    def _commit_loop(self) -> None:
        while not self._stop.wait(self.cfg.commit_interval):
            try:
                self.flush_all(closed_only=True)  # files still being written wait for their close
                self.commit_now("interval")
            except Exception as exc:  # noqa: BLE001 - try again next interval
                log.error("interval commit failed: %s", exc)

    # -- attributes ------------------------------------------------------------------
    def _st(self, path: str, e: Entry) -> dict[str, Any]:
        kind = e.kind
        t = self.times.get(path)
        mtime = e.mtime_ns
        if kind == DIR:
            mode = S.S_IFDIR | (e.mode & 0o7777)
            # Exact when the listing is at hand; else 1, which tools read as "not counted"
            # (never an undercount, which would make find skip subdirectories).
            d = self.ns.cached(path)
            nlink = 2 + d.subdirs() if d is not None else 1
            size = 4096
        elif kind == SYMLINK:
            mode = S.S_IFLNK | 0o777
            nlink = 1
            size = len(e.target.encode("utf-8", "surrogateescape"))
        else:
            mode = S.S_IFREG | (e.mode & 0o7777)
            nlink = 1
            size = e.size
        if t:
            mtime = t.get("mtime", mtime)
        return {
            "st_mode": mode,
            "st_nlink": nlink,
            "st_size": size,
            "st_uid": e.uid if e.uid is not None else self.cfg.uid,
            "st_gid": e.gid if e.gid is not None else self.cfg.gid,
            "st_mtime": mtime,
            "st_atime": t.get("atime", mtime) if t else mtime,
            "st_ctime": t.get("ctime", mtime) if t else mtime,
            "st_blocks": (size + 511) // 512,
            "st_blksize": BLKSIZE,
        }

    def _wf_st(self, wf: WFile) -> dict[str, Any]:
        return {
            "st_mode": S.S_IFREG | (wf.mode & 0o7777),
            "st_nlink": 0 if wf.unlinked else 1,
            "st_size": wf.size,
            "st_uid": wf.uid,
            "st_gid": wf.gid,
            "st_mtime": wf.mtime_ns,
            "st_atime": wf.atime_ns,
            "st_ctime": wf.ctime_ns,
            "st_blocks": (wf.size + 511) // 512,
            "st_blksize": BLKSIZE,
        }

    def _root_st(self) -> dict[str, Any]:
        r = self.root
        return {
            "st_mode": S.S_IFDIR | r["mode"],
            "st_nlink": 2 + d.subdirs() if (d := self.ns.cached("")) is not None else 1,
            "st_size": 4096,
            "st_uid": r["uid"],
            "st_gid": r["gid"],
            "st_mtime": r["mtime"],
            "st_atime": r["atime"],
            "st_ctime": r["ctime"],
            "st_blocks": 8,
            "st_blksize": BLKSIZE,
        }

    def _entry(self, p: str) -> Entry | None:
        """What the mount shows at ``p`` (local unstaged files first), None if nothing."""
        wf = self.wfiles.get(p)
        if wf is not None:
            return wf.stat_entry()
        return self.ns.lookup(p)

    @op
    def getattr(self, path: str | None, fh: Any = None) -> dict[str, Any]:
        if fh is not None:
            h = self.handles.get(fh.fh)
            if isinstance(h, WHandle):
                return self._wf_st(h.wf)
            if isinstance(h, RHandle) and path is None:
                return self._st("", h.entry)
        p = rel(path)
        if p is None:
            raise _err(errno.ENOENT)
        if p == "":
            return self._root_st()
        wf = self.wfiles.get(p)
        if wf is not None:
            return self._wf_st(wf)
        e = self.ns.lookup(p)
        if e is None and self.branch is not None and not self.writable:
            # Close-to-open for names too: a name the cached listing lacks may have been
            # created since; ask (the kernel caches the answer for --attr-timeout).
            try:
                e = self.health.call(self.plane.stat, self.repo, self.branch, p)
            except NotFound:
                e = None
            if e is not None:
                self.ns.invalidate(split(p)[0])
        if e is None:
            raise _err(errno.ENOENT)
        return self._st(p, e)

    @op
    def readlink(self, path: str) -> str:
        e = self._entry(rel(path) or "")
        if e is None:
            raise _err(errno.ENOENT)
        if e.kind != SYMLINK:
            raise _err(errno.EINVAL)
        return e.target

    @op
    def statfs(self, path: str) -> dict[str, int]:
        return {
            "f_bsize": BLKSIZE,
            "f_frsize": 4096,
            "f_blocks": 1 << 40,
            "f_bfree": 1 << 39,
            "f_bavail": 1 << 39,
            "f_files": 1 << 32,
            "f_ffree": 1 << 31,
            "f_favail": 1 << 31,
            "f_namemax": 255,
        }

    # -- directories -------------------------------------------------------------------
    @op
    def opendir(self, path: str, fi: Any = None) -> int:
        p = rel(path) or ""
        if not self.immutable:
            # Close-to-open: an opendir sees every change completed before it.
            self.ns.invalidate(p)
        e = self.ns.lookup(p) if p else self.implicit
        if e is None:
            raise _err(errno.ENOENT)
        if e is not None and e.kind != DIR:
            raise _err(errno.ENOTDIR)
        if fi is not None and self.immutable:
            fi.cache_readdir = 1
            fi.keep_cache = 1
        fh = next(self._fh)
        self.dir_handles[fh] = p  # readdir gets no path (nullpath_ok)
        return fh

    @op
    def readdir(self, path: str | None, fh: int) -> list:
        p = self.dir_handles.get(fh)
        if p is None:
            p = rel(path) or ""
        d = self.ns.dir(p)
        out: list = [(".", S.S_IFDIR, 0), ("..", S.S_IFDIR, 0)]
        names = d.children
        for name, e in names.items():
            t = S.S_IFDIR if e.kind == DIR else S.S_IFLNK if e.kind == SYMLINK else S.S_IFREG
            out.append((name, t, 0))
        if self.wfiles:
            prefix = p + "/" if p else ""
            for wp, wf in list(self.wfiles.items()):
                if wp.startswith(prefix) and "/" not in wp[len(prefix) :] and wp[len(prefix) :] not in names and not wf.unlinked:
                    out.append((wp[len(prefix) :], S.S_IFREG, 0))
        return out

    def readdir_snapshot(self, fh: int, refresh: bool) -> list[tuple[str, dict[str, Any]]]:
        """Names with their attributes (READDIRPLUS: the kernel then needs no lookups),
        computed at the first call of a directory handle and served by offset after."""
        snap = self.dir_snapshots.get(fh)
        if snap is None or refresh:
            snap = self.dir_snapshots[fh] = [(".", {"st_mode": S.S_IFDIR}), ("..", {"st_mode": S.S_IFDIR})]
            snap += self._readdir_plus(fh)
        return snap

    def _readdir_plus(self, fh: int) -> list[tuple[str, dict[str, Any]]]:
        p = self.dir_handles.get(fh, "")
        d = self.ns.dir(p)
        prefix = p + "/" if p else ""
        out = []
        for name, e in list(d.children.items()):
            full = prefix + name
            wf = self.wfiles.get(full)
            out.append((name, self._wf_st(wf) if wf is not None else self._st(full, e)))
        if self.wfiles:
            for wp, wf in list(self.wfiles.items()):
                name = wp[len(prefix) :]
                if wp.startswith(prefix) and "/" not in name and name not in d.children and not wf.unlinked:
                    out.append((name, self._wf_st(wf)))
        return out

    def releasedir(self, path: str | None, fh: int) -> int:
        self.dir_handles.pop(fh, None)
        self.dir_snapshots.pop(fh, None)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # directory changes are staged when they happen

    # -- reading -----------------------------------------------------------------------
    def _fresh_file(self, p: str) -> Entry:
        """:meth:`_fresh_entry` of a path that must be a file to be opened: ENOENT, EISDIR or EINVAL."""
        e = self._fresh_entry(p)
        if e is None:
            raise _err(errno.ENOENT)
        if e.kind == DIR:
            raise _err(errno.EISDIR)
        if e.kind != FILE:
            raise _err(errno.EINVAL)
        return e

    def _fresh_entry(self, p: str) -> Entry | None:
        """The current entry with its chunk list (branch: asked anew; commit: cached)."""
        if self.immutable:
            e = self.ns.lookup(p)
            if e is not None and e.kind == FILE and e.chunklist and not e.chunks:
                e = self.health.call(self.plane.stat_chunks, self.repo, self.commit_id, p)
                self.ns.update(p, e)
            return e
        try:
            e = self.health.call(self.plane.stat_chunks, self.repo, self.branch, p)
        except NotFound:
            self.ns.update(p, None)
            return None
        cached = self.ns.lookup(p)
        if cached is None or content_sig(cached) != content_sig(e) or cached.mode != e.mode or cached.uid != e.uid:
            self.ns.update(p, e)
        return e

    def _invalidate(self, p: str) -> None:
        """Make the kernel forget its cached attributes and pages of ``p`` (close-to-open)."""
        try:
            ctx = _libfuse.fuse_get_context()
            _libfuse.fuse_invalidate_path(ctx.contents.fuse, ("/" + p).encode("utf-8", "surrogateescape"))
        except Exception as exc:  # noqa: BLE001 - best effort; attributes expire anyway
            log.debug("cannot invalidate %s: %s", p, exc)

    def _new_fh(self, h: RHandle | WHandle) -> int:
        fh = next(self._fh)
        self.handles[fh] = h
        return fh

    @op
    def open(self, path: str, fi: Any) -> int:
        if self.immutable:
            # Nothing to pin per open: answering ENOSYS makes the kernel stop sending opens
            # (and keep its page cache), which saves a round trip per file and epoch.
            raise _err(errno.ENOSYS)
        p = rel(path) or ""
        flags = fi.flags
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & os.O_TRUNC)
        if writing and not self.writable:
            raise _err(errno.EROFS)
        wf = self.wfiles.get(p)
        if writing:
            wf = self._wfile(p)
            with wf.lock:
                if flags & os.O_TRUNC and (wf.size or wf.fd is None):
                    wf.materialize(None)
                    wf.truncate(0)
                wf.opens += 1
            fi.fh = self._new_fh(WHandle(wf, True))
            fi.keep_cache = 0
            return 0
        if wf is not None:
            with wf.lock:
                wf.opens += 1
            fi.fh = self._new_fh(WHandle(wf, False))
            fi.keep_cache = 0
            return 0
        e = self._fresh_file(p)
        sig = content_sig(e)
        old = self.kernel_sig.get(p)
        if old is not None and old != sig and any(
            isinstance(h, RHandle) and h.path == p and content_sig(h.entry) == old for h in list(self.handles.values())
        ):
            # Handles of the old version are open and keep reading it from the page cache
            # (snapshot isolation): this one reads the new version around the cache.
            fi.direct_io = 1
        else:
            if old != sig:
                # The kernel may hold the old size and pages: drop them before this open returns.
                self._invalidate(p)
            fi.keep_cache = 1 if old == sig else 0
            self.kernel_sig[p] = sig
        fi.fh = self._new_fh(RHandle(e, FileReader(self.fetcher, e.chunks, self.cfg.readahead), p))
        self._prefetch_siblings(p)
        return 0

    def _prefetch_siblings(self, p: str) -> None:
        """Files of one directory opened in order: fetch the next ones' chunks in one request."""
        parent, name = split(p)
        d = self.ns.cached(parent)
        if d is None:
            return
        names, index = d.files()
        i = index.get(name)
        if i is None:
            return
        sequential = (i - 1) in d.recent or i <= d.prefetched_to
        d.recent.add(i)
        if len(d.recent) > 256:
            d.recent = set(sorted(d.recent)[-64:])
        if not sequential or d.prefetched_to >= i + SIBLINGS_AHEAD // 2:
            return  # still half a window ahead: the next request goes out when the reader gets closer
        start = max(i + 1, d.prefetched_to + 1)
        chunks: list[tuple[bytes, int]] = []
        size = 0
        j = start
        while j < len(names) and j <= i + SIBLINGS_AHEAD and size < SIBLINGS_BYTES:
            e = d.children.get(names[j])
            if e is not None and e.kind == FILE:
                chunks.extend(e.chunks)
                size += e.size
            j += 1
        d.prefetched_to = j - 1
        if chunks:
            self.fetcher.prefetch(chunks)

    def _path_reader(self, p: str) -> FileReader:
        """Immutable mounts read by path (no open handles): one reader per recently read file."""
        r = self.readers.get(p)
        if r is not None:
            return r
        e = self._fresh_entry(p)
        if e is None:
            raise _err(errno.ENOENT)
        if e.kind != FILE:
            raise _err(errno.EISDIR if e.kind == DIR else errno.EINVAL)
        with self.readers_lock:
            r = self.readers.get(p)
            if r is None:
                r = self.readers[p] = FileReader(self.fetcher, e.chunks, self.cfg.readahead)
                while len(self.readers) > READERS:
                    self.readers.popitem(last=False)
        self._prefetch_siblings(p)
        return r

    @op
    def read(self, path: str | None, size: int, offset: int, fi: Any) -> list[tuple[bytes, int, int]]:
        """``(bytes, lo, hi)`` pieces that :meth:`FabricFUSE.read` copies straight into the kernel's buffer."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("read %s offset %d size %d fh %d", path, offset, size, fi.fh)
        self.read_bytes += size  # asked by the kernel (what its page cache lacked)
        h = self.handles.get(fi.fh)
        if h is None and self.immutable and path is not None:
            return self._path_reader(rel(path) or "").read_parts(offset, size)
        if isinstance(h, RHandle):
            return h.reader.read_parts(offset, size)
        if isinstance(h, WHandle):
            wf = h.wf
            with wf.lock:
                if wf.fd is not None:
                    data = wf.read(offset, size)
                    return [(data, 0, len(data))]
                base = wf.base
            assert base is not None
            if h.reader is None or h.reader_base is not base:
                h.reader, h.reader_base = self._reader_for(base), base
            return h.reader.read_parts(offset, size)
        raise _err(errno.EBADF)

    def _reader_for(self, e: Entry) -> FileReader:
        if e.chunklist and not e.chunks:
            raise _err(errno.EIO)
        return FileReader(self.fetcher, e.chunks, self.cfg.readahead)

    @op
    def release(self, path: str | None, fi: Any) -> int:
        h = self.handles.pop(fi.fh, None)
        if isinstance(h, WHandle):
            wf = h.wf
            with wf.lock:
                wf.opens -= 1
            try:
                if h.writable:
                    self._sync(wf)
            finally:
                self._maybe_drop(wf)
        return 0

    # -- writing -------------------------------------------------------------------------
    def _need_rw(self) -> None:
        if not self.writable:
            raise _err(errno.EROFS)

    def _caller(self) -> tuple[int, int]:
        uid, gid, _ = mfusepy.fuse_get_context()
        return uid, gid

    def _wfile(self, p: str) -> WFile:
        """The local state of an existing file ``p``, created on first need."""
        with self.mu:
            wf = self.wfiles.get(p)
            if wf is not None:
                return wf
        known = self.ns.lookup(p)
        e = self._fresh_file(p)
        if known is not None and content_sig(known) != content_sig(e):
            self._invalidate(p)  # changed elsewhere since the kernel saw it: its size is stale
        if e.chunklist and not e.chunks:
            e = self.health.call(self.plane.stat_chunks, self.repo, self.branch, p)
        with self.mu:
            wf = self.wfiles.get(p)
            if wf is None:
                uid = e.uid if e.uid is not None else self.cfg.uid
                gid = e.gid if e.gid is not None else self.cfg.gid
                wf = WFile(p, e, self._write_dir(), e.mode, uid, gid)
                t = self.times.pop(p, None)
                if t:
                    wf.atime_ns = t.get("atime", wf.atime_ns)
                    wf.ctime_ns = t.get("ctime", wf.ctime_ns)
                self.wfiles[p] = wf
            return wf

    def _write_dir(self) -> str:
        if self.write_dir is None:
            import tempfile

            self.write_dir = tempfile.mkdtemp(prefix="fabric-mount-")
        return self.write_dir

    def _materialize(self, wf: WFile) -> None:
        if wf.fd is None:
            base = wf.base
            wf.materialize(self._reader_for(base) if base is not None and base.size else None)

    def _parent_gid_mode(self, p: str, mode: int, is_dir: bool) -> tuple[int, int, int]:
        """Owner of a new entry: the caller, with the group (and setgid bit) of a setgid parent."""
        uid, gid = self._caller()
        parent, _ = split(p)
        if parent == "":
            pmode, pgid = self.root["mode"], self.root["gid"]
        else:
            pe = self._entry(parent)
            if pe is None:
                raise _err(errno.ENOENT)
            if pe.kind != DIR:
                raise _err(errno.ENOTDIR)
            pmode = pe.mode
            pgid = pe.gid if pe.gid is not None else self.cfg.gid
        if pmode & S.S_ISGID:
            gid = pgid
            if is_dir:
                mode |= S.S_ISGID
        return uid, gid, mode

    def _check_new(self, p: str) -> None:
        check_path(p)
        if self._entry(p) is not None:
            raise _err(errno.EEXIST)

    def _bump_dir(self, d: str, now: int | None = None) -> None:
        now = now or time.time_ns()
        if d == "":
            self.root["mtime"] = self.root["ctime"] = now
        else:
            t = self.times.setdefault(d, {})
            t["mtime"] = t["ctime"] = now

    @op
    def create(self, path: str, mode: int, fi: Any) -> int:
        self._need_rw()
        p = rel(path) or ""
        self._check_new(p)
        uid, gid, mode = self._parent_gid_mode(p, mode & 0o7777, False)
        with self.mu:
            wf = WFile(p, None, self._write_dir(), mode, uid, gid)
            wf.opens += 1
            self.wfiles[p] = wf
            self.times.pop(p, None)
            self.kernel_sig.pop(p, None)
            self._bump_dir(split(p)[0], wf.mtime_ns)
        fi.fh = self._new_fh(WHandle(wf, True))
        fi.keep_cache = 0
        return 0

    @op
    def mknod(self, path: str, mode: int, dev: int) -> int:
        self._need_rw()
        if not S.S_ISREG(mode):
            raise _err(errno.EPERM)  # devices, FIFOs and sockets are not stored
        p = rel(path) or ""
        self._check_new(p)
        uid, gid, mode = self._parent_gid_mode(p, mode & 0o7777, False)
        wf = WFile(p, None, self._write_dir(), mode, uid, gid)
        with self.mu:
            self.wfiles[p] = wf
        self._sync_and_forget(wf)
        return 0

    @op
    def write(self, path: str | None, data: bytes, offset: int, fi: Any) -> int:
        h = self.handles.get(fi.fh)
        if not isinstance(h, WHandle) or not h.writable:
            raise _err(errno.EBADF)
        wf = h.wf
        with wf.lock:
            self._materialize(wf)
            return wf.write(data, offset)

    @op
    def truncate(self, path: str | None, length: int, fh: Any = None) -> int:
        self._need_rw()
        h = self.handles.get(fh.fh) if fh is not None else None
        if isinstance(h, WHandle):
            wf = h.wf
        else:
            p = rel(path) if path is not None else h.path if isinstance(h, RHandle) else None
            if p is None:
                raise _err(errno.ENOENT)
            wf = self._wfile(p)
        with wf.lock:
            if length == 0:
                wf.materialize(None)
            else:
                self._materialize(wf)
            wf.truncate(length)
        if wf.opens == 0:
            self._sync_and_forget(wf)
        return 0

    @op
    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fi: Any) -> int:
        if mode != 0:
            raise _err(errno.EOPNOTSUPP)
        h = self.handles.get(fi.fh)
        if not isinstance(h, WHandle) or not h.writable:
            raise _err(errno.EBADF)
        with h.wf.lock:
            self._materialize(h.wf)
            h.wf.allocate(offset, size)
        return 0

    @op
    def flush(self, path: str | None, fi: Any) -> int:
        if not self.writable:
            raise _err(errno.ENOSYS)  # nothing to flush: the kernel stops asking
        h = self.handles.get(fi.fh)
        if isinstance(h, WHandle) and h.writable:
            # A close while another thread syncs this very version (an fsync, or a forked child
            # closing its copy of the descriptor) does not wait for it.
            self._sync(h.wf, wait_for_running=False)
        return 0

    @op
    def fsync(self, path: str | None, datasync: int, fi: Any) -> int:
        h = self.handles.get(fi.fh)
        if isinstance(h, WHandle):
            self._sync(h.wf)
        return 0

    def _sync(self, wf: WFile, wait_for_running: bool = True) -> None:
        """Stage ``wf``'s current content and attributes on the branch (if anything changed)."""
        if not wait_for_running and wf.syncing >= wf.generation:
            return
        with wf.lock:
            if not wf.dirty or wf.unlinked:
                return
            gen = wf.syncing = wf.generation
            content_changed = wf.fd is not None and wf.synced_content < wf.content_generation

            def upload() -> Entry:
                if not content_changed:
                    return wf.attrs_entry()
                sink = self.plane.chunk_sink()
                entry = wf.build_entry(sink)
                sink.close()
                return entry

            try:
                entry = self.health.call(upload)
                with self.mu:
                    if wf.unlinked or wf.path is None:
                        return
                    p = wf.path
                    self.health.call(self.plane.stage, self.repo, self.branch, {p: entry})
                    wf.base = entry
                    wf.synced_generation = gen
                    if content_changed:
                        wf.synced_content = gen
                    wf.last_error = None
                    self.ns.update(p, entry)
                    self.kernel_sig[p] = content_sig(entry)
            except Exception as exc:
                wf.last_error = exc
                raise
            finally:
                wf.syncing = 0

    def _sync_and_forget(self, wf: WFile) -> None:
        """Stage a file no handle has open, then let its local state go (even if staging failed)."""
        try:
            self._sync(wf)
        finally:
            self._maybe_drop(wf)

    def _maybe_drop(self, wf: WFile) -> None:
        """Forget a file's local state once it is staged and no handle uses it."""
        with wf.lock:
            if wf.opens > 0 or (wf.dirty and not wf.unlinked):
                return
            with self.mu:
                if wf.path is not None and self.wfiles.get(wf.path) is wf:
                    del self.wfiles[wf.path]
                    t = self.times.setdefault(wf.path, {})
                    t["atime"], t["ctime"] = wf.atime_ns, wf.ctime_ns
            wf.close()

    # -- namespace changes ---------------------------------------------------------------
    def _stage(self, changes: dict[str, Entry | None]) -> None:
        self.health.call(self.plane.stage, self.repo, self.branch, changes)
        for p, e in changes.items():
            self.ns.update(p, e)

    def _keep_parent(self, p: str, changes: dict[str, Entry | None]) -> None:
        """Removing ``p`` may empty an implicit parent directory: give it a marker so it stays."""
        parent, _ = split(p)
        if parent and parent not in changes:
            pe = self.ns.lookup(parent)
            if self.ns.is_implicit(pe):
                now = time.time_ns()
                changes[parent] = Entry(DIR, 0, self.implicit.mode, now, uid=self.implicit.uid, gid=self.implicit.gid)

    @op
    def mkdir(self, path: str, mode: int) -> int:
        self._need_rw()
        p = rel(path) or ""
        self._check_new(p)
        uid, gid, mode = self._parent_gid_mode(p, mode & 0o7777, True)
        now = time.time_ns()
        with self.mu:
            self._stage({p: Entry(DIR, 0, mode, now, uid=uid, gid=gid)})
            self.ns.set_loaded(p, {})
            self.times.pop(p, None)
            self._bump_dir(split(p)[0], now)
        return 0

    @op
    def rmdir(self, path: str) -> int:
        self._need_rw()
        p = rel(path) or ""
        if p == "":
            raise _err(errno.EBUSY)
        with self.mu:
            e = self.ns.lookup(p)
            if e is None:
                raise _err(errno.ENOENT)
            if e.kind != DIR:
                raise _err(errno.ENOTDIR)
            self.ns.invalidate(p)
            if self.ns.dir(p).children or any(w.startswith(p + "/") for w in self.wfiles):
                raise _err(errno.ENOTEMPTY)
            changes: dict[str, Entry | None] = {p: None}
            self._keep_parent(p, changes)
            self._stage(changes)
            self.times.pop(p, None)
            self._bump_dir(split(p)[0])
        return 0

    @op
    def unlink(self, path: str) -> int:
        self._need_rw()
        p = rel(path) or ""
        with self.mu:
            wf = self.wfiles.pop(p, None)
            on_server = True
            if wf is not None:
                wf.unlinked = True
                wf.path = None
                on_server = wf.on_server
            else:
                e = self.ns.lookup(p)
                if e is None:
                    raise _err(errno.ENOENT)
                if e.kind == DIR:
                    raise _err(errno.EISDIR)
            if on_server:
                changes: dict[str, Entry | None] = {p: None}
                self._keep_parent(p, changes)
                self._stage(changes)
            self.times.pop(p, None)
            self.kernel_sig.pop(p, None)
            self._bump_dir(split(p)[0])
        if wf is not None:
            self._maybe_drop(wf)
        return 0

    @op
    def symlink(self, path: str, target: str) -> int:
        self._need_rw()
        p = rel(path) or ""
        self._check_new(p)
        uid, gid, _ = self._parent_gid_mode(p, 0o777, False)
        now = time.time_ns()
        try:
            size = len(target.encode("utf-8"))
        except UnicodeEncodeError:
            raise _err(errno.EILSEQ) from None
        with self.mu:
            self._stage({p: Entry(SYMLINK, size, 0o777, now, uid=uid, gid=gid, target=target)})
            self.times.pop(p, None)
            self._bump_dir(split(p)[0], now)
        return 0

    @op
    def link(self, target: str, source: str) -> int:
        raise _err(errno.EPERM)  # hard links are not supported

    @op
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        self._need_rw()
        if flags & ~RENAME_NOREPLACE:
            raise _err(errno.EINVAL)  # RENAME_EXCHANGE / RENAME_WHITEOUT
        src, dst = rel(old) or "", rel(new) or ""
        check_path(dst)
        if src == dst:
            return 0
        # Stage what is still local first (outside the namespace lock: uploads can be long).
        for wp, wf in list(self.wfiles.items()):
            if wp == src or wp.startswith(src + "/"):
                self._sync(wf)
        with self.mu:
            se = self._entry(src)
            if se is None:
                raise _err(errno.ENOENT)
            de = self._entry(dst)
            if de is not None and flags & RENAME_NOREPLACE:
                raise _err(errno.EEXIST)
            changes: dict[str, Entry | None] = {}
            now = time.time_ns()
            if se.kind == DIR:
                if de is not None:
                    if de.kind != DIR:
                        raise _err(errno.ENOTDIR)
                    self.ns.invalidate(dst)
                    if self.ns.dir(dst).children or any(w.startswith(dst + "/") for w in self.wfiles):
                        raise _err(errno.ENOTEMPTY)
                moved = self._walk_fresh(src)
                for path, e in moved:
                    changes[path] = None
                for path, e in moved:
                    changes[dst + path[len(src) :]] = e
                changes[src] = None
                changes[dst] = None if self.ns.is_implicit(se) else se
                if changes[dst] is None and not moved:
                    changes[dst] = Entry(DIR, 0, se.mode, se.mtime_ns, uid=se.uid, gid=se.gid)
            else:
                if de is not None and de.kind == DIR:
                    raise _err(errno.EISDIR)
                fe = self._fresh_entry(src) if se.kind == FILE else se
                if fe is None:
                    raise _err(errno.ENOENT)
                changes[src] = None
                changes[dst] = fe
            self._keep_parent(src, changes)
            self.health.call(self.plane.stage, self.repo, self.branch, changes)
            # Caches: listings below both names are stale; parents get the moved entries.
            self.ns.invalidate_tree(src)
            self.ns.invalidate_tree(dst)
            for path, e in changes.items():
                self.ns.update(path, e)
            if se.kind == DIR and changes[dst] is None:
                self.ns.update(dst, self.implicit)
            self._move_local(src, dst, se.kind == DIR, now)
            self._bump_dir(split(src)[0], now)
            self._bump_dir(split(dst)[0], now)
        return 0

    def _walk_fresh(self, d: str) -> list[tuple[str, Entry]]:
        def walk() -> list[tuple[str, Entry]]:
            return list(self.plane.walk(self.repo, self.branch, d + "/"))

        return self.health.call(walk)

    def _move_local(self, src: str, dst: str, is_dir: bool, now: int) -> None:
        """Carry local state (open files, session times, kernel cache signatures) to the new name."""

        def moved(p: str) -> str | None:
            if p == src:
                return dst
            if is_dir and p.startswith(src + "/"):
                return dst + p[len(src) :]
            return None

        for table in (self.wfiles, self.times, self.kernel_sig):
            for p in [p for p in table if p == dst or (is_dir and p.startswith(dst + "/"))]:
                if table is self.wfiles:
                    w = self.wfiles.pop(p)
                    w.unlinked, w.path = True, None
                else:
                    table.pop(p)
            for p in [p for p in table if moved(p) is not None]:
                q = moved(p)
                value = table.pop(p)
                table[q] = value  # type: ignore[index]
                if table is self.wfiles:
                    value.path = q  # type: ignore[union-attr]
        t = self.times.setdefault(dst, {})
        t["ctime"] = now
        w = self.wfiles.get(dst)
        if w is not None:
            w.ctime_ns = now

    # -- attribute changes -------------------------------------------------------------------
    def _target(self, path: str | None, fi: Any) -> tuple[str | None, WFile | None]:
        """What a setattr applies to: a path, and the local file state if there is one."""
        if path is not None:
            p = rel(path)
            return p, self.wfiles.get(p or "")
        h = self.handles.get(fi.fh) if fi is not None else None
        if isinstance(h, WHandle):
            return h.wf.path, h.wf
        if isinstance(h, RHandle):
            return h.path, self.wfiles.get(h.path)
        raise _err(errno.ENOENT)

    def _setattr(
        self,
        path: str | None,
        fi: Any,
        change: Callable[[Entry], Entry],
        wf_change: Callable[[WFile], None],
        root_change: Callable[[dict], None],
    ) -> None:
        self._need_rw()
        p, wf = self._target(path, fi)
        now = time.time_ns()
        if p == "":
            root_change(self.root)
            self.root["ctime"] = now
            return
        if wf is not None:
            with wf.lock:
                wf_change(wf)
                wf.ctime_ns = now
                wf.generation += 1
            if wf.opens == 0:
                self._sync_and_forget(wf)
            return
        with self.mu:
            e = self.ns.lookup(p)
            if e is None:
                raise _err(errno.ENOENT)
            if self.ns.is_implicit(e):
                t = self.times.get(p, {})
                e = Entry(DIR, 0, e.mode, t.get("mtime", e.mtime_ns), uid=e.uid, gid=e.gid)
            new = change(e)
            self._stage({p: new})
            self.times.setdefault(p, {})["ctime"] = now

    @op
    def chmod(self, path: str | None, mode: int, fi: Any = None) -> int:
        m = mode & 0o7777

        def root(r: dict) -> None:
            r["mode"] = m

        def wfc(wf: WFile) -> None:
            wf.mode = m

        self._setattr(path, fi, lambda e: e.with_(mode=m), wfc, root)
        return 0

    @op
    def chown(self, path: str | None, uid: int, gid: int, fi: Any = None) -> int:
        def pick(old: int | None, new: int, default: int) -> int:
            return (old if old is not None else default) if new < 0 else new

        def root(r: dict) -> None:
            r["uid"] = pick(r["uid"], uid, self.cfg.uid)
            r["gid"] = pick(r["gid"], gid, self.cfg.gid)

        def wfc(wf: WFile) -> None:
            wf.uid = pick(wf.uid, uid, self.cfg.uid)
            wf.gid = pick(wf.gid, gid, self.cfg.gid)

        def ent(e: Entry) -> Entry:
            return e.with_(uid=pick(e.uid, uid, self.cfg.uid), gid=pick(e.gid, gid, self.cfg.gid))

        self._setattr(path, fi, ent, wfc, root)
        return 0

    @op
    def utimens(self, path: str | None, times: tuple[int, int] | None = None, fi: Any = None) -> int:
        now = time.time_ns()
        atime, mtime = times if times is not None else (UTIME_NOW, UTIME_NOW)
        atime = now if atime == UTIME_NOW else None if atime == UTIME_OMIT else int(atime)
        mtime = now if mtime == UTIME_NOW else None if mtime == UTIME_OMIT else int(mtime)
        if mtime is None:
            # atime only: kept by the mount for the session, nothing to store.
            p, wf = self._target(path, fi)
            if p == "":
                self.root["atime"] = atime
                self.root["ctime"] = now
                return 0
            if wf is not None:
                wf.atime_ns = atime if atime is not None else wf.atime_ns
                wf.ctime_ns = now
                return 0
            if p is None or self._entry(p) is None:
                raise _err(errno.ENOENT)
            t = self.times.setdefault(p, {})
            if atime is not None:
                t["atime"] = atime
            t["ctime"] = now
            return 0

        def root(r: dict) -> None:
            r["mtime"] = mtime
            if atime is not None:
                r["atime"] = atime

        def wfc(wf: WFile) -> None:
            wf.mtime_ns = mtime
            if atime is not None:
                wf.atime_ns = atime

        self._setattr(path, fi, lambda e: e.with_(mtime_ns=mtime), wfc, root)
        p, wf = self._target(path, fi)
        if p and wf is None:
            t = self.times.setdefault(p, {})
            t.pop("mtime", None)  # the stored mtime is the one set now
            if atime is not None:
                t["atime"] = atime
        return 0


def _address(data: bytes) -> int:
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


FUSE_READDIR_PLUS = 1
FUSE_FILL_DIR_PLUS = 2


class FabricFUSE(mfusepy.FUSE):
    """mfusepy's FUSE with what fabric needs beyond it: cacheable directory handles,
    READDIRPLUS (names with attributes), rename flags, and file handles on setattr."""

    def read(self, path: bytes | None, buf, size: int, offset: int, fip) -> int:
        """Copy each piece once, into the kernel's buffer (no joined copy of the whole read)."""
        parts = self.operations.read(self._p(path), size, offset, fip.contents)
        dst = ctypes.cast(buf, ctypes.c_void_p).value or 0
        n = 0
        for data, lo, hi in parts:
            k = hi - lo
            if k <= 0:
                continue
            if lo == 0:
                ctypes.memmove(dst + n, data, k)
            else:
                ctypes.memmove(dst + n, _address(data) + lo, k)
            n += k
        return n

    def readdir_fuse_3(self, path, buf, filler, offset, fip, flags):
        if not flags & FUSE_READDIR_PLUS:
            return super().readdir_fuse_3(path, buf, filler, offset, fip, flags)
        # Entries are passed with offsets: libfuse 3.14 drops the attributes of
        # READDIRPLUS entries that come without offsets.
        ops = self.operations
        t0 = time.perf_counter()
        failed = True
        try:
            fh = fip.contents.fh
            items = ops.readdir_snapshot(fh, refresh=offset == 0)
            st = mfusepy.c_stat()
            size = ctypes.sizeof(st)
            for i in range(offset, len(items)):
                name, attrs = items[i]
                ctypes.memset(ctypes.byref(st), 0, size)
                mfusepy.set_st_attrs(st, attrs, use_ns=True)
                plus = FUSE_FILL_DIR_PLUS if i >= 2 else 0
                if filler(buf, name.encode(self.encoding, self.errors), st, i + 1, plus) != 0:
                    break
            failed = False
            return 0
        except Exception as exc:  # noqa: BLE001
            code = fs_errno(exc)
            log.log(logging.ERROR if code == errno.EIO else logging.DEBUG, "readdirplus failed: %s", exc)
            return -code
        finally:
            ops.stats.record("readdirplus", time.perf_counter() - t0, failed)

    def opendir(self, path: bytes, fip) -> int:
        fi = fip.contents
        fi.fh = self.operations.opendir(path.decode(self.encoding, self.errors), fi)
        return 0

    # libfuse gives no path with a file handle (nullpath_ok): pass the handle on.
    def _p(self, path: bytes | None) -> str | None:
        return None if path is None else path.decode(self.encoding, self.errors)

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip) -> int:
        return self.operations.chmod(self._p(path), mode, fip.contents if fip else None)

    def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip) -> int:
        if ctypes.c_uint32(uid + 1).value == 0:
            uid = -1
        if ctypes.c_uint32(gid + 1).value == 0:
            gid = -1
        return self.operations.chown(self._p(path), uid, gid, fip.contents if fip else None)

    def truncate_fuse_3(self, path: bytes | None, length: int, fip) -> int:
        return self.operations.truncate(self._p(path), length, fip.contents if fip else None)

    def utimens_fuse_3(self, path: bytes | None, buf, fip) -> int:
        times = None
        if buf:
            times = (
                mfusepy.time_of_timespec(buf.contents.actime, use_ns=True),
                mfusepy.time_of_timespec(buf.contents.modtime, use_ns=True),
            )
        return self.operations.utimens(self._p(path), times, fip.contents if fip else None)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(old.decode(self.encoding, self.errors), new.decode(self.encoding, self.errors), flags)
