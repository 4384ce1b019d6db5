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

It is a probe for ``bench/bench_fuse.py`` (system ``kernel-passthrough``), not part of fabric:
what a fabric mount could reach for a file whose plain bytes lie on the local disk.

    python bench/kernel_passthrough.py SRC_DIR MOUNTPOINT [--no-passthrough] [--threads N]

``--no-passthrough`` answers ``READ`` requests with ``pread`` instead (the kernel asks for
up to 1 MiB at a time): the same server without the kernel's shortcut. Runs in the
foreground as root until the mount point is unmounted. Names are single path components
from the kernel; a symbolic link or special file shows as absent, so nothing outside
``SRC_DIR`` is reached.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import gzip
import os
import stat
import struct
import sys
import threading

MS_NOSUID, MS_NODEV = 2, 4
ROOT_ID = 1
#: Seconds the kernel may keep entries and attributes (the source is not expected to change).
TTL = 3600
#: A request is at most 1 MiB of data (max_write, max_pages 256) plus its header.
READ_BUFFER = (1 << 20) + 4096

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr (88 bytes)
ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid, generation, entry_valid, attr_valid, and their nsec; then fuse_attr
ATTR_OUT = struct.Struct("<QII")  # attr_valid, attr_valid_nsec, dummy; then fuse_attr
INIT_IN = struct.Struct("<IIIII")  # major, minor, max_readahead, flags, flags2
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # ... flags2, max_stack_depth, unused (64 bytes)
OPEN_IN = struct.Struct("<II")  # flags, open_flags
OPEN_OUT = struct.Struct("<QIi")  # fh, open_flags, backing_id
READ_IN = struct.Struct("<QQII")  # fh, offset, size, read_flags
DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type; then the name, padded to 8 bytes
KSTATFS = struct.Struct("<QQQQQIIII24x")
BACKING_MAP = struct.Struct("<iIQ")  # fd, flags, padding

LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 17, 18, 25, 26
OPENDIR, READDIR, RELEASEDIR, ACCESS, INTERRUPT, DESTROY, BATCH_FORGET = 27, 28, 29, 34, 36, 38, 42
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}
DT_DIR, DT_REG = 4, 8

FUSE_ASYNC_READ, FUSE_BIG_WRITES, FUSE_MAX_PAGES, FUSE_INIT_EXT = 1 << 0, 1 << 5, 1 << 22, 1 << 30
FUSE_PASSTHROUGH = 1 << 37
FOPEN_KEEP_CACHE, FOPEN_PASSTHROUGH = 1 << 1, 1 << 7
# _IOW(229, 1, struct fuse_backing_map) and _IOW(229, 2, uint32_t)
BACKING_OPEN, BACKING_CLOSE = 0x4010E501, 0x4004E502


def kernel_has_passthrough() -> bool:
    """Whether this kernel was built with FUSE passthrough (as far as ``/proc/config.gz`` tells)."""
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            return "CONFIG_FUSE_PASSTHROUGH=y" in f.read()
    except OSError:
        return False


def _refuse(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class Server:
    """The mount of ``src`` at ``mnt``; :meth:`serve` answers requests until it is unmounted."""

    def __init__(self, src: str, mnt: str, passthrough: bool) -> None:
        self.src, self.want_passthrough = os.path.realpath(src), passthrough
        self.passthrough = False
        self.dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._paths = {ROOT_ID: ""}  # nodeid -> path relative to src
        self._ids: dict[str, int] = {"": ROOT_ID}
        self._files: dict[int, tuple[int, int | None]] = {}  # fh -> (fd, backing id)
        self._next_fh = 1
        self.reads = 0
        libc = ctypes.CDLL(None, use_errno=True)
        opts = f"fd={self.dev},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions".encode()
        if libc.mount(b"kernel-passthrough", os.fsencode(mnt), b"fuse.kernel-passthrough", MS_NOSUID | MS_NODEV, opts) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {mnt}: {os.strerror(err)}")

    # -- the loop -------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            try:
                request = os.read(self.dev, READ_BUFFER)
            except OSError as exc:
                if exc.errno == errno.ENODEV:  # unmounted
                    return
                if exc.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):  # (ENOENT: an interrupted request)
                    continue
                raise
            length, op, unique, nodeid = IN_HEADER.unpack_from(request)[:4]
            if op in NO_REPLY:
                continue
            arg = memoryview(request)[IN_HEADER.size : length]
            try:
                self._reply(unique, self.handle(op, nodeid, arg) or b"")
            except OSError as exc:
                self._reply(unique, b"", exc.errno or errno.EIO)
            if op == DESTROY:
                return

    def _reply(self, unique: int, body: bytes, error: int = 0) -> None:
        try:
            os.write(self.dev, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # the request was interrupted meanwhile
                raise

    def handle(self, op: int, nodeid: int, arg: memoryview) -> bytes | None:
        if op == INIT:
            return self._init(arg)
        if op == LOOKUP:
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
            return ENTRY_OUT.pack(child, 0, TTL, TTL, 0, 0) + _attr(child, st)
        if op == GETATTR:
            return ATTR_OUT.pack(TTL, 0, 0) + _attr(nodeid, self._stat(self._path(nodeid)))
        if op == OPEN:
            flags = OPEN_IN.unpack_from(arg)[0]
            if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
                raise _refuse(errno.EROFS)
            return self._open(nodeid)
        if op == READ:
            fh, offset, size, _ = READ_IN.unpack_from(arg)
            self.reads += 1
            return os.pread(self._files[fh][0], size, offset)
        if op == RELEASE:
            self._release(struct.unpack_from("<Q", arg)[0])
            return None
        if op == OPENDIR:
            return OPEN_OUT.pack(0, 0, 0)
        if op == READDIR:
            return self._readdir(nodeid, arg)
        if op in (RELEASEDIR, FLUSH, ACCESS, DESTROY):
            return None
        if op == STATFS:
            s = os.statvfs(self.src)
            return KSTATFS.pack(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize, 255, s.f_frsize, 0)
        raise _refuse(errno.ENOSYS)

    # -- operations -------------------------------------------------------------------
    def _init(self, arg: memoryview) -> bytes:
        major, minor, max_readahead, flags, flags2 = INIT_IN.unpack_from(arg)
        offered = flags | (flags2 << 32 if flags & FUSE_INIT_EXT else 0)
        want = offered & (FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_INIT_EXT)
        if self.want_passthrough:
            if not offered & FUSE_PASSTHROUGH:
                print(f"kernel_passthrough: the kernel (FUSE {major}.{minor}) does not offer passthrough", file=sys.stderr)
                raise _refuse(errno.EPROTO)
            want |= FUSE_PASSTHROUGH
            self.passthrough = True
        stack_depth = 1 if self.passthrough else 0
        return INIT_OUT.pack(7, min(minor, 40), max_readahead, want & 0xFFFFFFFF, 16, 12, 1 << 20, 1, 256, 0, want >> 32, stack_depth)

    def _open(self, nodeid: int) -> bytes:
        fd = os.open(os.path.join(self.src, self._path(nodeid)), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        backing = None
        try:
            if self.passthrough:
                backing = fcntl.ioctl(self.dev, BACKING_OPEN, bytearray(BACKING_MAP.pack(fd, 0, 0)), True)
        except OSError:
            os.close(fd)
            raise
        with self._lock:
            fh, self._next_fh = self._next_fh, self._next_fh + 1
            self._files[fh] = (fd, backing)
        if backing is None:
            return OPEN_OUT.pack(fh, FOPEN_KEEP_CACHE, 0)
        return OPEN_OUT.pack(fh, FOPEN_PASSTHROUGH, backing)

    def _release(self, fh: int) -> None:
        with self._lock:
            fd, backing = self._files.pop(fh)
        if backing is not None:
            fcntl.ioctl(self.dev, BACKING_CLOSE, bytearray(struct.pack("<I", backing)), True)
        os.close(fd)

    def _readdir(self, nodeid: int, arg: memoryview) -> bytes:
        _, offset, size, _ = READ_IN.unpack_from(arg)
        with os.scandir(os.path.join(self.src, self._path(nodeid))) as it:
            entries = sorted((e.name, DT_DIR if e.is_dir(follow_symlinks=False) else DT_REG)
                             for e in it if e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False))
        out = bytearray()
        for i in range(offset, len(entries)):
            name, kind = os.fsencode(entries[i][0]), entries[i][1]
            record = DIRENT.pack(0xFFFFFFFF, i + 1, len(name), kind) + name  # (the kernel takes ino from a lookup)
            record += b"\0" * (-len(record) % 8)
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
    return ATTR.pack(nodeid, st.st_size, st.st_blocks, sec, sec, sec, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("mountpoint")
    ap.add_argument("--no-passthrough", dest="passthrough", action="store_false", help="answer READ requests with pread instead")
    ap.add_argument("--threads", type=int, default=4, help="threads answering requests (default 4)")
    args = ap.parse_args()
    server = Server(args.src, args.mountpoint, args.passthrough)
    threads = [threading.Thread(target=server.serve, daemon=True) for _ in range(max(1, args.threads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"kernel_passthrough: unmounted; passthrough {server.passthrough}, {server.reads} READ requests answered", file=sys.stderr)


if __name__ == "__main__":
    main()
