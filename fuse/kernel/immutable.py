"""An immutable mount (a commit or tag) served on the kernel's FUSE protocol, with passthrough.

``fabric mount --passthrough`` serves a commit this way instead of through libfuse
(:mod:`fuse.libfuse`): names, attributes, listings and reads are :class:`~fuse.fs.FabricFS`'s,
as on any immutable mount, and cached for good by the kernel. What changes is ``open``:

- a file with a complete plain copy in the cache directory (:mod:`fabric.cache.files`) is
  opened with ``FOPEN_PASSTHROUGH`` and that copy as its backing file: the kernel reads it
  as it reads a local file, and no read of it reaches this process (a copy whose last
  check is more than a day old is read whole and checked first: by the scrub,
  :mod:`fabric.cache.scrub`, which starts at INIT, or by its first open if that comes first,
  outside the lock other opens take);
- any other file is opened with the kernel's page cache kept (as libfuse's mount keeps it),
  its reads answered from chunks, and the bytes served are written to its copy as well
  (a file of at least 1 MiB), which is complete once every byte has been read once.

The kernel lets an inode be open either way but not both at once (``ETXTBSY``): while a
file has opens of one kind, its new opens are of the same kind; and all passthrough opens
of an inode share one backing file, kept until its last close.

Without passthrough in the kernel (or with a kernel that does not offer it at INIT), every
open is of the second kind: the mount works, at libfuse's speed.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat as S
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from fabric.cache.files import FileCopies, Filling
from fabric.cache.scrub import CopyScrub
from fabric.format.model import FILE, Entry
from fuse.copies import copy_key
from fuse.errors import op
from fuse.fs import FabricFS
from fuse.kernel import protocol as P
from fuse.kernel.session import Session
from fuse.libfuse import FOREVER, MAX_THREADS
from fuse.namespace import join
from fuse.outage import begin_op, end_op

log = logging.getLogger("fabric.fuse")

ROOT_ID = 1
#: Seconds the kernel keeps names and attributes (an immutable mount's never change).
TTL = int(FOREVER)
#: The kernel's background requests (readahead) in flight, and where it starts to hold back.
MAX_BACKGROUND, CONGESTION = 64, 48
#: The callback names :mod:`fuse.outage` knows, by opcode.
OP_NAMES = {P.LOOKUP: "getattr", P.GETATTR: "getattr", P.READLINK: "readlink", P.OPEN: "open", P.READ: "read",
            P.STATFS: "statfs", P.OPENDIR: "opendir", P.READDIR: "readdir", P.READDIRPLUS: "readdir"}
_NO_HANDLE = SimpleNamespace(fh=0)


@dataclass
class _FileIO:
    """How one inode's file is open: from its copy (passthrough) or from chunks (cached)."""

    key: str | None  # its copy's name (None: not copied)
    size: int
    cached_opens: int = 0
    passthrough_opens: int = 0
    backing_id: int | None = None
    backing_fd: int = -1
    filling: Filling | None = None


class ImmutableMount:
    """The requests of one immutable mount (see the module docstring)."""

    def __init__(self, fs: FabricFS, session: Session, copies: FileCopies | None) -> None:
        self.fs, self.session, self.copies = fs, session, copies
        self.stats = fs.stats  # (for fuse.errors.op)
        self.passthrough = False  # the kernel took it at INIT
        self.scrub: CopyScrub | None = None  # checks the copies ahead of their opens, from INIT
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {ROOT_ID: ""}  # nodeid -> path
        self._ids: dict[str, int] = {"": ROOT_ID}
        self._lookups: dict[int, int] = {}
        self._next_id = ROOT_ID + 1
        self._io: dict[int, _FileIO] = {}
        self._handles: dict[int, tuple[int, bool]] = {}  # fh -> (nodeid, passthrough)
        self._next_fh = 1
        self.passthrough_opens = self.cached_opens = self.read_requests = 0
        self._ops = {
            P.INIT: self._init, P.LOOKUP: self._lookup, P.FORGET: self._forget, P.BATCH_FORGET: self._batch_forget,
            P.GETATTR: self._getattr, P.READLINK: self._readlink, P.OPEN: self._open, P.READ: self._read,
            P.RELEASE: self._release, P.OPENDIR: self._opendir, P.READDIR: self._readdir,
            P.READDIRPLUS: self._readdirplus, P.RELEASEDIR: self._releasedir, P.STATFS: self._statfs,
            P.INTERRUPT: _nothing, P.DESTROY: _nothing,
        }

    def handle(self, op: int, nodeid: int, arg: memoryview) -> Any:
        fn = self._ops.get(op)
        if fn is not None:
            return fn(nodeid, arg)
        # Changes cannot happen (the mount is read-only); the rest (xattrs, access, flush,
        # fsync, locks) is ENOSYS, which the kernel remembers: it does not ask again.
        raise OSError(errno.EROFS if op in P.CHANGES else errno.ENOSYS, "")

    def snapshot(self) -> dict[str, Any]:
        return {
            "passthrough": self.passthrough,
            "passthrough_opens": self.passthrough_opens,
            "cached_opens": self.cached_opens,
            "read_requests": self.read_requests,
            "threads": self.session.readers.threads() if self.session.readers is not None else 0,
            "copies": self.copies.snapshot() if self.copies is not None else None,
        }

    # -- set-up ------------------------------------------------------------------------------
    def _init(self, nodeid: int, arg: memoryview) -> bytes:
        major, minor, max_readahead, flags, flags2 = P.INIT_IN.unpack_from(arg)
        if major != P.MAJOR or minor < 36:
            raise OSError(errno.EPROTO, f"FUSE {major}.{minor} is too old")
        offered = flags | (flags2 << 32 if flags & P.INIT_EXT else 0)
        want = offered & (P.ASYNC_READ | P.MAX_PAGES | P.INIT_EXT | P.DO_READDIRPLUS
                          | P.PARALLEL_DIROPS | P.CACHE_SYMLINKS)
        if self.copies is not None and offered & P.PASSTHROUGH:
            want |= P.PASSTHROUGH
            self.passthrough = True
            if self.copies.check:
                self.scrub = CopyScrub(self.copies)
        elif self.copies is not None:
            log.warning("the kernel (FUSE %d.%d) does not offer passthrough: files are read through the mount", major, minor)
        self.fs.init_with_config(None, None)  # (starts the mount's threads; reports it ready)
        return P.INIT_OUT.pack(P.MAJOR, min(minor, P.MINOR), max_readahead, want & 0xFFFFFFFF, MAX_BACKGROUND,
                               CONGESTION, 4096, 1, 256, 0, want >> 32, 1 if self.passthrough else 0)

    # -- names ---------------------------------------------------------------------------------
    def _path(self, nodeid: int) -> str:
        path = self._paths.get(nodeid)
        if path is None:
            raise OSError(errno.ESTALE, "")
        return path

    def _remember(self, path: str) -> int:
        """The nodeid of ``path``, one lookup more."""
        with self._lock:
            nodeid = self._ids.get(path)
            if nodeid is None:
                nodeid, self._next_id = self._next_id, self._next_id + 1
                self._ids[path], self._paths[nodeid] = nodeid, path
            self._lookups[nodeid] = self._lookups.get(nodeid, 0) + 1
            return nodeid

    def _lookup(self, parent: int, arg: memoryview) -> bytes:
        name = bytes(arg).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        path = join(self._path(parent), name)
        try:
            st = self.fs.getattr("/" + path)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return P.entry_out(0, None, TTL)  # absent for good: the kernel remembers it
            raise
        return P.entry_out(self._remember(path), st, TTL)

    def _forget(self, nodeid: int, arg: memoryview) -> None:
        self._drop_lookups(nodeid, P.FORGET_IN.unpack_from(arg)[0])

    def _batch_forget(self, nodeid: int, arg: memoryview) -> None:
        count = P.BATCH_FORGET_IN.unpack_from(arg)[0]
        for i in range(count):
            self._drop_lookups(*P.FORGET_ONE.unpack_from(arg, P.BATCH_FORGET_IN.size + i * P.FORGET_ONE.size))

    def _drop_lookups(self, nodeid: int, n: int) -> None:
        with self._lock:
            left = self._lookups.get(nodeid, 0) - n
            if left > 0 or nodeid == ROOT_ID:
                self._lookups[nodeid] = max(left, 0)
                return
            self._lookups.pop(nodeid, None)
            path = self._paths.pop(nodeid, None)
            if path is not None:
                self._ids.pop(path, None)
            io = self._io.pop(nodeid, None)
        if io is not None and io.filling is not None and self.copies is not None:
            self.copies.drop(io.filling, "")

    def _getattr(self, nodeid: int, arg: memoryview) -> bytes:
        return P.ATTR_OUT.pack(TTL, 0, 0) + P.attr(self.fs.getattr("/" + self._path(nodeid)))

    def _readlink(self, nodeid: int, arg: memoryview) -> bytes:
        return self.fs.readlink("/" + self._path(nodeid)).encode("utf-8", "surrogateescape")

    def _statfs(self, nodeid: int, arg: memoryview) -> bytes:
        s = self.fs.statfs("/")
        return P.KSTATFS.pack(s["f_blocks"], s["f_bfree"], s["f_bavail"], s["f_files"], s["f_ffree"],
                              s["f_bsize"], s["f_namemax"], s["f_frsize"], 0)

    # -- files -----------------------------------------------------------------------------------
    def _open(self, nodeid: int, arg: memoryview) -> bytes:
        flags = P.OPEN_IN.unpack_from(arg)[0]
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise OSError(errno.EROFS, "")
        path = self._path(nodeid)
        io = self._io.get(nodeid) or self._file_io(nodeid, path)
        # The copy is opened (and, the first time, read whole to check it) outside the lock.
        fd = self.copies.open(io.key, io.size) if io.key and self.copies and io.backing_id is None and not io.cached_opens else None
        try:
            with self._lock:
                fh, self._next_fh = self._next_fh, self._next_fh + 1
                if io.cached_opens == 0 and self._backing(io, fd):
                    if io.backing_fd == fd:
                        fd = None  # (the backing file now)
                    io.passthrough_opens += 1
                    self._handles[fh] = (nodeid, True)
                    self.passthrough_opens += 1
                    reply = P.OPEN_OUT.pack(fh, P.FOPEN_PASSTHROUGH, io.backing_id)
                else:
                    io.cached_opens += 1
                    self._handles[fh] = (nodeid, False)
                    self.cached_opens += 1
                    if io.key is not None and self.copies is not None and (io.filling is None or io.filling.failed):
                        io.filling = self.copies.filling(io.key, io.size)
                    return P.OPEN_OUT.pack(fh, P.FOPEN_KEEP_CACHE, 0)
        finally:
            if fd is not None:
                os.close(fd)
        if self.fs.reads.opens is not None:
            self.fs.reads.opens.opened(path)  # (its reads never reach the mount)
        return reply

    def _file_io(self, nodeid: int, path: str) -> _FileIO:
        """The open state of a file, made at its first open: what its copy is called."""
        e = self.open(path)
        key = None
        if self.copies is not None and self.passthrough and e.size >= self.copies.min_size:
            key = copy_key(e)
        with self._lock:
            return self._io.setdefault(nodeid, _FileIO(key, e.size))

    @op
    def open(self, path: str) -> Entry:
        """The entry an open of ``path`` opens (timed and failing as an open: ENOENT, EISDIR...).
        A file whose chunk list is an object is known by that object's id, so that opening its
        copy costs no request for the list."""
        e = self.fs.state.ns.lookup(path)
        if e is None or e.kind != FILE or not e.chunklist:
            e = self.fs.reads.fresh_file(path)
        return e

    def _backing(self, io: _FileIO, fd: int | None) -> bool:
        """Whether ``io`` has a backing file: one already, or ``fd`` (its copy) registered now
        (``io.backing_fd`` then; otherwise ``fd`` stays the caller's). Under the lock."""
        if io.backing_id is not None:
            return True
        if fd is None:
            return False
        try:
            io.backing_id = self.session.backing_open(fd)
        except OSError as exc:
            log.warning("the kernel refused a backing file: %s", exc)
            return False
        io.backing_fd = fd
        return True

    def _read(self, nodeid: int, arg: memoryview) -> memoryview:
        fh, offset, size, _ = P.READ_IN.unpack_from(arg)
        self.read_requests += 1
        dst = memoryview(bytearray(size))
        n = self.fs.read("/" + self._path(nodeid), dst, offset, _NO_HANDLE)
        io = self._io.get(nodeid)
        if io is not None and io.filling is not None:
            io.filling.write(dst[:n], offset)
        return dst[:n]

    def _release(self, nodeid: int, arg: memoryview) -> None:
        fh = P.RELEASE_IN.unpack_from(arg)[0]
        close: tuple[int, int] | None = None
        with self._lock:
            held = self._handles.pop(fh, None)
            if held is None:
                return
            io = self._io.get(held[0])
            if io is None:
                return
            if held[1]:
                io.passthrough_opens -= 1
                if io.passthrough_opens == 0 and io.backing_id is not None:
                    close = (io.backing_id, io.backing_fd)
                    io.backing_id, io.backing_fd = None, -1
            else:
                io.cached_opens -= 1
        if close is not None:
            try:
                self.session.backing_close(close[0])
            finally:
                os.close(close[1])

    # -- directories -----------------------------------------------------------------------------
    def _opendir(self, nodeid: int, arg: memoryview) -> bytes:
        fh = self.fs.opendir("/" + self._path(nodeid), SimpleNamespace(cache_readdir=0, keep_cache=0))
        return P.OPEN_OUT.pack(fh, P.FOPEN_KEEP_CACHE | P.FOPEN_CACHE_DIR, 0)

    def _releasedir(self, nodeid: int, arg: memoryview) -> None:
        self.fs.releasedir(None, P.RELEASE_IN.unpack_from(arg)[0])

    @op
    def readdirplus(self, fh: int, refresh: bool) -> list[tuple[str, dict[str, Any]]]:
        """A directory's names with their attributes (timed and failing as libfuse's READDIRPLUS)."""
        return self.fs.readdir_snapshot(fh, refresh)

    def _readdir(self, nodeid: int, arg: memoryview) -> bytes:
        return self._listing(nodeid, arg, plus=False)

    def _readdirplus(self, nodeid: int, arg: memoryview) -> bytes:
        return self._listing(nodeid, arg, plus=True)

    def _listing(self, nodeid: int, arg: memoryview, plus: bool) -> bytes:
        """The entries from the READ's offset that fit its size; with ``plus``, each with its
        attributes (one lookup of it for the kernel)."""
        fh, offset, size, _ = P.READ_IN.unpack_from(arg)
        items = self.readdirplus(fh, offset == 0)
        parent = self._path(nodeid)
        out = bytearray()
        for i in range(offset, len(items)):
            name, st = items[i]
            raw = name.encode("utf-8", "surrogateescape")
            if len(out) + (P.ENTRY_OUT.size + P.ATTR.size if plus else 0) + P.dirent_size(raw) > size:
                break
            if plus:
                # '.' and '..' come without an entry (nodeid 0): the kernel looks them up itself.
                dots = name in (".", "..")
                out += P.entry_out(0, None, 0) if dots else P.entry_out(self._remember(join(parent, name)), st, TTL)
            out += P.dirent(raw, st.get("st_ino", 0), i + 1, st.get("st_mode", S.S_IFDIR))
        return bytes(out)


def _nothing(nodeid: int, arg: memoryview) -> None:
    return None


def serve(fs: FabricFS, mountpoint: str, source: str, *, allow_other: bool,
          serving: Callable[[ImmutableMount], None] = lambda mount: None) -> None:
    """Mount ``fs`` (an immutable mount) at ``mountpoint`` and serve it until unmounted (blocks);
    SIGINT and SIGTERM unmount it. ``serving`` is told the mount once it is made."""
    cfg = fs.state.cfg
    copies_dir = cfg.copies_dir or cfg.cache_dir
    copies = FileCopies(copies_dir, cfg.copies_budget, check=cfg.check_copies) if copies_dir else None
    try:
        session = Session(mountpoint, source, allow_other=allow_other, read_only=True)
    except BaseException:
        if copies is not None:
            copies.close()
        raise
    mount = ImmutableMount(fs, session, copies)
    serving(mount)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: session.unmount())
    try:
        session.serve(mount, MAX_THREADS, (lambda op: begin_op(OP_NAMES.get(op, "")), end_op))
    finally:
        if mount.scrub is not None:
            mount.scrub.close()
        fs.destroy("/")
        if copies is not None:
            copies.close()
        log.info("opens from copies (passthrough): %d, from chunks: %d; READ requests: %d; copies: %s",
                 mount.passthrough_opens, mount.cached_opens, mount.read_requests, copies.snapshot() if copies else None)
