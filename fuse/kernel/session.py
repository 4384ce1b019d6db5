"""One FUSE mount made with mount(2) and served on its ``/dev/fuse`` descriptor.

:class:`Session` mounts, reads requests in a few threads (the kernel hands each request to
one reader), passes them to a :class:`Handler` and writes the answers back. A request the
handler answers with an ``OSError`` gets its errno; any other failure is logged and answered
``EIO``. Serving ends when the file system is unmounted (reads of ``/dev/fuse`` fail with
``ENODEV``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import struct
import threading
from typing import Protocol

from fuse.kernel import protocol as P

log = logging.getLogger("fabric.fuse")

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


class Handler(Protocol):
    def handle(self, op: int, nodeid: int, arg: memoryview) -> bytes | memoryview | list | None:
        """The answer's body (``None``: empty; a list: pieces written as one answer)."""


class Session:
    """A FUSE mount at ``mountpoint`` (made here, as root) and its request loop."""

    def __init__(self, mountpoint: str, source: str, *, allow_other: bool, read_only: bool, fstype: str = "fuse.fabric") -> None:
        self.mountpoint = mountpoint
        self.dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        opts = f"fd={self.dev},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},default_permissions"
        if allow_other:
            opts += ",allow_other"
        flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
        if _libc.mount(source.encode(), os.fsencode(mountpoint), fstype.encode(), flags, opts.encode()) != 0:
            code = ctypes.get_errno()
            os.close(self.dev)
            raise OSError(code, f"mount {mountpoint}: {os.strerror(code)}")

    def serve(self, handler: Handler, threads: int, on_thread: tuple | None = None) -> None:
        """Answer requests in ``threads`` threads until unmounted (blocks). ``on_thread``:
        ``(begin, end)`` called around each request with the opcode (:mod:`fuse.outage`)."""
        workers = [threading.Thread(target=self._loop, args=(handler, on_thread), name=f"fabric-fuse-{i}", daemon=True)
                   for i in range(max(1, threads))]
        for t in workers:
            t.start()
        for t in workers:
            while t.is_alive():
                t.join(0.5)  # (a timed wait: the main thread still takes signals)
        os.close(self.dev)

    def unmount(self) -> None:
        """Detach the mount (the loop then ends once the kernel lets go of it)."""
        if _libc.umount2(os.fsencode(self.mountpoint), MNT_DETACH) != 0:
            log.warning("cannot unmount %s: %s", self.mountpoint, os.strerror(ctypes.get_errno()))

    # -- backing files (passthrough) --------------------------------------------------------
    def backing_open(self, fd: int) -> int:
        """Register ``fd`` with the kernel as a backing file; its id for an OPEN answer."""
        return fcntl.ioctl(self.dev, P.BACKING_OPEN, bytearray(P.BACKING_MAP.pack(fd, 0, 0)), True)

    def backing_close(self, backing_id: int) -> None:
        fcntl.ioctl(self.dev, P.BACKING_CLOSE, bytearray(struct.pack("<I", backing_id)), True)

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self, handler: Handler, on_thread: tuple | None) -> None:
        buf = bytearray(P.REQUEST_BUFFER)
        view = memoryview(buf)
        while True:
            try:
                n = os.readv(self.dev, [buf])
            except OSError as exc:
                if exc.errno == errno.ENODEV:  # unmounted
                    return
                if exc.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):  # (ENOENT: an interrupted request)
                    continue
                raise
            if n < P.IN_HEADER.size:
                continue
            length, op, unique, nodeid = P.IN_HEADER.unpack_from(buf)[:4]
            arg = view[P.IN_HEADER.size : min(length, n)]
            if on_thread is not None:
                on_thread[0](op)
            try:
                body = handler.handle(op, nodeid, arg)
                if op not in P.NO_REPLY:
                    self._reply(unique, body)
            except OSError as exc:
                if op not in P.NO_REPLY:
                    self._reply(unique, None, exc.errno or errno.EIO)
            except Exception:  # noqa: BLE001 - one request fails, the mount goes on
                log.exception("FUSE request %d failed", op)
                if op not in P.NO_REPLY:
                    self._reply(unique, None, errno.EIO)
            finally:
                if on_thread is not None:
                    on_thread[1]()

    def _reply(self, unique: int, body: bytes | memoryview | list | None, error: int = 0) -> None:
        pieces = body if isinstance(body, list) else [body] if body else []
        size = P.OUT_HEADER.size + sum(len(p) for p in pieces)
        try:
            os.writev(self.dev, [P.OUT_HEADER.pack(size, -error, unique), *pieces])
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # (the request was interrupted meanwhile)
                raise
