"""What fabric needs from libfuse beyond mfusepy's defaults: the connection settings
asked for at INIT, invalidating the kernel's cache of a path, and :class:`FabricFUSE`
(cacheable directory handles, READDIRPLUS, rename flags, file handles on setattr,
reads copied straight into the kernel's buffer, callbacks marked for :mod:`fuse.outage`)."""

from __future__ import annotations

import ctypes
import errno
import logging
import time
from typing import Any

import mfusepy

from fuse.config import MountConfig
from fuse.errors import fs_errno
from fuse.outage import begin_op, end_op

log = logging.getLogger("fabric.fuse")

_libfuse = mfusepy._libfuse
_libfuse.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_libfuse.fuse_invalidate_path.restype = ctypes.c_int

FOREVER = 365 * 24 * 3600.0
#: libfuse's worker threads. Every request runs Python, under one GIL: past a few threads,
#: more only contend for it (measured in bench/RESULTS.md, issue 21: 32 threads cost a
#: third more CPU per byte read than 4-8). Slow requests wait on the fetcher's own
#: workers, so a few threads still keep the disk and the network busy.
MAX_THREADS = 8
#: Threads kept from requests that wait for an unreachable server (:mod:`fuse.outage`): a
#: lookup, a listing, a close or a read of cached data is answered during an outage.
WAIT_RESERVE = 3
FUSE_CAP_READDIRPLUS_AUTO = 1 << 14
FUSE_CAP_HANDLE_KILLPRIV = 1 << 20
FUSE_READDIR_PLUS = 1
FUSE_FILL_DIR_PLUS = 2


def configure(conn: Any, config: Any, cfg: MountConfig, *, immutable: bool, writable: bool) -> None:
    """Fill in libfuse's connection (``conn``) and mount (``config``) settings at INIT."""
    if config is not None:
        config.use_ino = 1  # st_ino as fuse.inodes gives it: the names of a hard-link group share one
        config.hard_remove = 0  # libfuse keeps unlinked open files under hidden names (fuse.unlinked)
        # Handle-based operations get no path (they may outlive it); an immutable mount
        # has no open handles at all (see open) and reads by path.
        config.nullpath_ok = 0 if immutable else 1
        if immutable:
            config.kernel_cache = 1
            config.entry_timeout = config.attr_timeout = config.negative_timeout = FOREVER
        else:
            config.kernel_cache = 0
            config.entry_timeout = config.attr_timeout = cfg.attr_timeout
            config.negative_timeout = cfg.attr_timeout if not writable else 0.0
    if conn is not None:
        conn.want &= ~FUSE_CAP_HANDLE_KILLPRIV  # the kernel clears setuid/setgid bits itself
        # Every readdir is a READDIRPLUS (names with attributes): listings come whole from
        # memory, and `ls -l`/find then need no lookup per entry.
        conn.want &= ~FUSE_CAP_READDIRPLUS_AUTO
        conn.max_readahead = max(conn.max_readahead, min(cfg.readahead, 1 << 30))
        conn.max_background = max(conn.max_background, 64)
        conn.congestion_threshold = max(conn.congestion_threshold, 48)


def invalidate_path(p: str) -> None:
    """Make the kernel forget its cached attributes and pages of ``p`` (close-to-open).

    Only from inside a filesystem operation (it needs the calling context)."""
    try:
        ctx = _libfuse.fuse_get_context()
        _libfuse.fuse_invalidate_path(ctx.contents.fuse, ("/" + p).encode("utf-8", "surrogateescape"))
    except Exception as exc:  # noqa: BLE001 - best effort; attributes expire anyway
        log.debug("cannot invalidate %s: %s", p, exc)


class FabricFUSE(mfusepy.FUSE):
    """mfusepy's FUSE with what fabric needs beyond it: cacheable directory handles,
    READDIRPLUS (names with attributes), rename flags, and file handles on setattr."""

    def _wrapper(self, func, *args, **kwargs):
        """Every callback: marks its thread as a FUSE thread for :mod:`fuse.outage` (which bounds
        the threads waiting for an unreachable server) and gives back its place at return."""
        begin_op(getattr(func, "__name__", ""))
        try:
            return super()._wrapper(func, *args, **kwargs)
        finally:
            end_op()

    def read(self, path: bytes | None, buf, size: int, offset: int, fip) -> int:
        """The operations copy the bytes once, straight into the kernel's buffer."""
        dst = memoryview((ctypes.c_char * size).from_address(ctypes.cast(buf, ctypes.c_void_p).value or 0)).cast("B")
        return self.operations.read(self._p(path), dst, offset, fip.contents)

    def write(self, path: bytes | None, buf, size: int, offset: int, fip) -> int:
        """The operations get the kernel's bytes in place (a view valid during the call only),
        so they reach the local file in one copy."""
        data = memoryview((ctypes.c_char * size).from_address(ctypes.cast(buf, ctypes.c_void_p).value or 0)).cast("B")
        return self.operations.write(self._p(path), data, offset, fip.contents)

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
