#!/usr/bin/env python3
"""A read-only FUSE mount of a directory whose file reads never reach user space: the kernel's
FUSE passthrough (Linux 6.9+, ``CONFIG_FUSE_PASSTHROUGH``), measured as a ceiling for issue 21.

libfuse 3.14 (Debian bookworm) cannot ask for passthrough: it came in libfuse 3.16, and the
flag lives in the second word of INIT flags, which 3.14 does not pass on. So this server
speaks the kernel's FUSE protocol (``linux/fuse.h``, 7.40 and later) on ``/dev/fuse`` itself,
in plain Python, and answers each ``OPEN`` of a regular file with a backing file: it opens
the source file, registers it with ``FUSE_DEV_IOC_BACKING_OPEN``, and replies
``FOPEN_PASSTHROUGH`` with the backing id. The kernel then serves every read (and readahead)
of that open file from the source file's own page cache and disk; the server sees only
lookups, attributes, opens, releases and directory listings. Without ``--no-passthrough``,
a kernel that does not offer passthrough makes the server exit with an error.

It is a probe for ``bench/bench_fuse.py`` (system ``kernel-passthrough``): what a mount can
reach for a file whose plain bytes lie on the local disk. The mounting, the request loop and
the wire format are fabric's own (:mod:`fuse.kernel`, which serves ``fabric mount
--passthrough``); the requests are answered from the source directory here.

    python bench/kernel_passthrough.py SRC_DIR MOUNTPOINT [--no-passthrough] [--threads N]

``--no-passthrough`` answers ``READ`` requests with ``pread`` instead (the kernel asks for
up to 1 MiB at a time): the same server without the kernel's shortcut. Runs in the
foreground as root until the mount point is unmounted. Names are single path components
from the kernel; a symbolic link or special file shows as absent, so nothing outside
``SRC_DIR`` is reached.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fuse.kernel import protocol as P  # noqa: E402
from fuse.kernel.session import Session  # noqa: E402

ROOT_ID = 1
#: Seconds the kernel may keep entries and attributes (the source is not expected to change).
TTL = 3600
DT_DIR, DT_REG = 4, 8


def _refuse(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class Server:
    """The requests of the mount of ``src`` (a :class:`~fuse.kernel.session.Session`)."""

    def __init__(self, src: str, session: Session, passthrough: bool) -> None:
        self.src, self.session, self.want_passthrough = os.path.realpath(src), session, passthrough
        self.passthrough = False
        self._lock = threading.Lock()
        self._paths = {ROOT_ID: ""}  # nodeid -> path relative to src
        self._ids: dict[str, int] = {"": ROOT_ID}
        self._files: dict[int, tuple[int, int | None]] = {}  # fh -> (fd, backing id)
        self._next_fh = 1
        self.reads = 0

    def handle(self, op: int, nodeid: int, arg: memoryview) -> bytes | None:
        if op in P.NO_REPLY or op in (P.RELEASEDIR, P.FLUSH, P.ACCESS, P.DESTROY):
            return None
        if op == P.INIT:
            return self._init(arg)
        if op == P.LOOKUP:
            name = bytes(arg).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if name in (".", "..") or "/" in name:
                raise _refuse(errno.ENOENT)
            path = os.path.join(self._path(nodeid), name)
            st = self._stat(path)
            with self._lock:
                child = self._ids.get(path)
                if child is None:
                    child = self._ids[path] = len(self._paths) + 1
                    self._paths[child] = path
            return P.ENTRY_OUT.pack(child, 0, TTL, TTL, 0, 0) + _attr(child, st)
        if op == P.GETATTR:
            return P.ATTR_OUT.pack(TTL, 0, 0) + _attr(nodeid, self._stat(self._path(nodeid)))
        if op == P.OPEN:
            flags = P.OPEN_IN.unpack_from(arg)[0]
            if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
                raise _refuse(errno.EROFS)
            return self._open(nodeid)
        if op == P.READ:
            fh, offset, size, _ = P.READ_IN.unpack_from(arg)
            self.reads += 1
            return os.pread(self._files[fh][0], size, offset)
        if op == P.RELEASE:
            self._release(P.RELEASE_IN.unpack_from(arg)[0])
            return None
        if op == P.OPENDIR:
            return P.OPEN_OUT.pack(0, 0, 0)
        if op == P.READDIR:
            return self._readdir(nodeid, arg)
        if op == P.STATFS:
            s = os.statvfs(self.src)
            return P.KSTATFS.pack(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize, 255, s.f_frsize, 0)
        raise _refuse(errno.ENOSYS)

    # -- operations -------------------------------------------------------------------
    def _init(self, arg: memoryview) -> bytes:
        major, minor, max_readahead, flags, flags2 = P.INIT_IN.unpack_from(arg)
        offered = flags | (flags2 << 32 if flags & P.INIT_EXT else 0)
        want = offered & (P.ASYNC_READ | P.MAX_PAGES | P.INIT_EXT)
        if self.want_passthrough:
            if not offered & P.PASSTHROUGH:
                print(f"kernel_passthrough: the kernel (FUSE {major}.{minor}) does not offer passthrough", file=sys.stderr)
                raise _refuse(errno.EPROTO)
            want |= P.PASSTHROUGH
            self.passthrough = True
        stack_depth = 1 if self.passthrough else 0
        return P.INIT_OUT.pack(P.MAJOR, min(minor, P.MINOR), max_readahead, want & 0xFFFFFFFF, 16, 12, 4096, 1, 256, 0, want >> 32, stack_depth)

    def _open(self, nodeid: int) -> bytes:
        fd = os.open(os.path.join(self.src, self._path(nodeid)), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        backing = None
        try:
            if self.passthrough:
                backing = self.session.backing_open(fd)
        except OSError:
            os.close(fd)
            raise
        with self._lock:
            fh, self._next_fh = self._next_fh, self._next_fh + 1
            self._files[fh] = (fd, backing)
        if backing is None:
            return P.OPEN_OUT.pack(fh, P.FOPEN_KEEP_CACHE, 0)
        return P.OPEN_OUT.pack(fh, P.FOPEN_PASSTHROUGH, backing)

    def _release(self, fh: int) -> None:
        with self._lock:
            fd, backing = self._files.pop(fh)
        if backing is not None:
            self.session.backing_close(backing)
        os.close(fd)

    def _readdir(self, nodeid: int, arg: memoryview) -> bytes:
        _, offset, size, _ = P.READ_IN.unpack_from(arg)
        with os.scandir(os.path.join(self.src, self._path(nodeid))) as it:
            entries = sorted((e.name, stat.S_IFDIR if e.is_dir(follow_symlinks=False) else stat.S_IFREG)
                             for e in it if e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False))
        out = bytearray()
        for i in range(offset, len(entries)):
            # (the kernel takes the inode number from a lookup)
            record = P.dirent(os.fsencode(entries[i][0]), 0xFFFFFFFF, i + 1, entries[i][1])
            if len(out) + len(record) > size:
                break
            out += record
        return bytes(out)

    def _path(self, nodeid: int) -> str:
        with self._lock:
            path = self._paths.get(nodeid)
        if path is None:
            raise _refuse(errno.ESTALE)
        return path

    def _stat(self, path: str) -> os.stat_result:
        st = os.lstat(os.path.join(self.src, path))
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise _refuse(errno.ENOENT)  # links and special files are not served
        return st


def _attr(nodeid: int, st: os.stat_result) -> bytes:
    if stat.S_ISDIR(st.st_mode):
        mode, nlink = stat.S_IFDIR | 0o555, 2
    else:
        mode, nlink = stat.S_IFREG | 0o444, 1
    sec = int(st.st_mtime)
    return P.ATTR.pack(nodeid, st.st_size, st.st_blocks, sec, sec, sec, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("mountpoint")
    ap.add_argument("--no-passthrough", dest="passthrough", action="store_false", help="answer READ requests with pread instead")
    ap.add_argument("--threads", type=int, default=4, help="threads answering requests (default 4)")
    args = ap.parse_args()
    session = Session(args.mountpoint, "kernel-passthrough", allow_other=True, read_only=True, fstype="fuse.kernel-passthrough")
    server = Server(args.src, session, args.passthrough)
    session.serve(server, args.threads)
    print(f"kernel_passthrough: unmounted; passthrough {server.passthrough}, {server.reads} READ requests answered", file=sys.stderr)


if __name__ == "__main__":
    main()
