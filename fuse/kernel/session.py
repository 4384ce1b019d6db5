"""One FUSE mount made with mount(2) and served on its ``/dev/fuse`` descriptor.

:class:`Session` mounts, reads requests in a few threads (the kernel hands each request to
one reader), passes them to a :class:`Handler` and writes the answers back. A request the
handler answers with an ``OSError`` gets its errno; any other failure is logged and answered
``EIO``. Serving ends when the file system is unmounted (reads of ``/dev/fuse`` fail with
``ENODEV``).

Threads, as libfuse keeps them: :data:`READERS` threads wait for requests and answer each
one they read. Where every thread is answering and one of those answers has taken
:data:`SLOW` seconds (a read of chunks from the server, a copy being checked), one more
thread is started to read the next request, up to ``threads``; such a thread ends once
enough others wait again. So many quick requests (a second read of many small files: an
open and a release each) are answered by two threads, which pass the GIL between them
alone (1.34x the rate of eight fixed threads in the median, bench/RESULTS.md), and a slow
request holds up no other while fewer than ``threads`` are slow.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Protocol

from fuse.kernel import protocol as P

log = logging.getLogger("fabric.fuse")

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
#: Threads waiting for requests while the mount is quiet.
READERS = 2
#: Seconds an answer may take before another thread is started to read the next request.
SLOW = 0.01


class Handler(Protocol):
    def handle(self, op: int, nodeid: int, arg: memoryview) -> bytes | memoryview | list | None:
        """The answer's body (``None``: empty; a list: pieces written as one answer)."""


class Session:
    """A FUSE mount at ``mountpoint`` (made here, as root) and its request loop."""

    def __init__(self, mountpoint: str, source: str, *, allow_other: bool, read_only: bool, fstype: str = "fuse.fabric") -> None:
        self.mountpoint = mountpoint
        self.readers: _Readers | None = None  # (while it serves)
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
        """Answer requests in up to ``threads`` threads until unmounted (blocks; see the module
        docstring). ``on_thread``: ``(begin, end)`` called around each request with the opcode
        (:mod:`fuse.outage`)."""
        readers = self.readers = _Readers(max(1, threads))
        readers.run(lambda: self._loop(handler, on_thread, readers))
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
    def _loop(self, handler: Handler, on_thread: tuple | None, readers: _Readers) -> None:
        buf = bytearray(P.REQUEST_BUFFER)
        view = memoryview(buf)
        while True:
            try:
                n = os.readv(self.dev, [buf])
            except OSError as exc:
                if exc.errno == errno.ENODEV:  # unmounted
                    readers.end()
                    return
                if exc.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):  # (ENOENT: an interrupted request)
                    continue
                raise
            if n < P.IN_HEADER.size:
                continue
            length, op, unique, nodeid = P.IN_HEADER.unpack_from(buf)[:4]
            readers.answering(time.monotonic())
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
            if readers.answered():
                return

    def _reply(self, unique: int, body: bytes | memoryview | list | None, error: int = 0) -> None:
        pieces = body if isinstance(body, list) else [body] if body else []
        size = P.OUT_HEADER.size + sum(len(p) for p in pieces)
        try:
            os.writev(self.dev, [P.OUT_HEADER.pack(size, -error, unique), *pieces])
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # (the request was interrupted meanwhile)
                raise


class _Readers:
    """The threads of :meth:`Session.serve`: :data:`READERS` of them, more while answers are slow."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._loop: Callable[[], None] = lambda: None
        self._cond = threading.Condition()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting for a request (or about to: started)
        self._since: dict[int, float] = {}  # thread -> when it started its answer
        self._ended = False  # unmounted
        self._count = 0

    def run(self, loop: Callable[[], None]) -> None:
        """Start the readers, each running ``loop``, and more while answers are slow; return
        once all have ended."""
        self._loop = loop
        with self._cond:
            for _ in range(min(READERS, self.most)):
                self._start()
        watch = threading.Thread(target=self._watch, name="fabric-fuse-watch", daemon=True)
        watch.start()
        while True:
            with self._cond:
                alive = [t for t in self._threads if t.is_alive()]
                if not alive:
                    self._ended = True
                    self._cond.notify_all()
                    break
            alive[0].join(0.5)  # (a timed wait: the main thread still takes signals)
        watch.join()

    def threads(self) -> int:
        """How many threads serve now."""
        with self._cond:
            return len(self._threads)

    # -- called by each thread -------------------------------------------------------------------
    def answering(self, since: float) -> None:
        """The thread read a request at ``since`` and answers it."""
        with self._cond:
            self._idle -= 1
            self._since[threading.get_ident()] = since
            if self._idle == 0:
                self._cond.notify_all()  # (the watch: nobody is reading now)

    def answered(self) -> bool:
        """The thread answered its request: whether it ends now (enough others wait); if not,
        it waits for the next one."""
        me = threading.current_thread()
        with self._cond:
            self._since.pop(me.ident or 0, None)
            if len(self._threads) > READERS and self._idle >= READERS:
                self._threads.discard(me)  # (not counted from now on)
                return True
            self._idle += 1
            return False

    def end(self) -> None:
        """The thread ends: the mount is gone."""
        with self._cond:
            self._idle -= 1
            self._ended = True
            self._cond.notify_all()

    # -- internals ---------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start one more reader, waiting for a request from now on (the condition's lock held)."""
        self._count += 1
        self._idle += 1
        t = threading.Thread(target=self._serve, name=f"fabric-fuse-{self._count}", daemon=True)
        self._threads.add(t)
        t.start()

    def _serve(self) -> None:
        try:
            self._loop()
        finally:  # (also where the loop failed: the thread is gone either way)
            me = threading.current_thread()
            with self._cond:
                if me in self._threads:
                    self._threads.discard(me)
                    self._since.pop(me.ident or 0, None)

    def _watch(self) -> None:
        """While nobody reads and an answer has taken :data:`SLOW` seconds, start a reader."""
        with self._cond:
            while not self._ended:
                if self._idle > 0 or len(self._threads) >= self.most or not self._since:
                    self._cond.wait()
                    continue
                late = min(self._since.values()) + SLOW - time.monotonic()
                if late > 0:
                    self._cond.wait(late)
                    continue
                self._start()
