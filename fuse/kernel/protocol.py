"""The kernel's FUSE protocol (``linux/fuse.h``, 7.40): the structures, opcodes and flags
this package uses, and the encoding of attributes and directory entries."""

from __future__ import annotations

import gzip
import stat
import struct
from typing import Any

#: Protocol version answered at INIT (7.40: passthrough).
MAJOR, MINOR = 7, 40

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr (88 bytes)
ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid, generation, entry_valid, attr_valid, and their nsec; then fuse_attr
ATTR_OUT = struct.Struct("<QII")  # attr_valid, attr_valid_nsec, dummy; then fuse_attr
INIT_IN = struct.Struct("<IIIII")  # major, minor, max_readahead, flags, flags2
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # ..., max_pages, map_alignment, flags2, max_stack_depth (64 bytes)
OPEN_IN = struct.Struct("<II")  # flags, open_flags
OPEN_OUT = struct.Struct("<QIi")  # fh, open_flags, backing_id
READ_IN = struct.Struct("<QQII")  # fh, offset, size, read_flags (READ, READDIR, READDIRPLUS)
RELEASE_IN = struct.Struct("<QII")  # fh, flags, release_flags
FORGET_IN = struct.Struct("<Q")  # nlookup
BATCH_FORGET_IN = struct.Struct("<II")  # count, dummy; then count FORGET_ONE
FORGET_ONE = struct.Struct("<QQ")  # nodeid, nlookup
DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type; then the name, padded to 8 bytes
KSTATFS = struct.Struct("<QQQQQIIII24x")  # blocks, bfree, bavail, files, ffree, bsize, namelen, frsize
BACKING_MAP = struct.Struct("<iIQ")  # fd, flags, padding

# Opcodes.
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE = 8, 9, 10, 11, 12, 13, 14, 15, 16
STATFS, RELEASE, FSYNC, SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR, FLUSH, INIT = 17, 18, 20, 21, 22, 23, 24, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS, CREATE, INTERRUPT, DESTROY = 27, 28, 29, 30, 34, 35, 36, 38
BATCH_FORGET, FALLOCATE, READDIRPLUS, RENAME2, COPY_FILE_RANGE, TMPFILE = 42, 43, 44, 45, 47, 51
#: Requests the kernel expects no answer to.
NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})
#: Requests that change the file system.
CHANGES = frozenset({SETATTR, SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, WRITE, SETXATTR,
                     REMOVEXATTR, CREATE, FALLOCATE, RENAME2, COPY_FILE_RANGE, TMPFILE})

# INIT flags (the second word shifted up by 32).
ASYNC_READ, DO_READDIRPLUS, PARALLEL_DIROPS = 1 << 0, 1 << 13, 1 << 18
MAX_PAGES, CACHE_SYMLINKS, INIT_EXT, PASSTHROUGH = 1 << 22, 1 << 23, 1 << 30, 1 << 37

# open_flags of an OPEN or OPENDIR answer.
FOPEN_KEEP_CACHE, FOPEN_CACHE_DIR, FOPEN_PASSTHROUGH = 1 << 1, 1 << 3, 1 << 7

# ioctls on /dev/fuse: _IOW(229, 1, struct fuse_backing_map) and _IOW(229, 2, uint32_t).
BACKING_OPEN, BACKING_CLOSE = 0x4010E501, 0x4004E502

#: A request is at most this long: a READ-only mount is sent no data (max_write is one page),
#: and the kernel wants a read buffer of 8 KiB at least.
REQUEST_BUFFER = 64 * 1024


def kernel_has_passthrough() -> bool:
    """Whether this kernel was built with FUSE passthrough (as far as ``/proc/config.gz`` tells)."""
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            return "CONFIG_FUSE_PASSTHROUGH=y" in f.read()
    except OSError:
        return False


def _split_ns(t: int | float) -> tuple[int, int]:
    t = int(t)
    return t // 1_000_000_000, t % 1_000_000_000


def attr(st: dict[str, Any]) -> bytes:
    """``fuse_attr`` of a stat dictionary as :class:`~fuse.fs.FabricFS` gives it (times in ns)."""
    (a, an), (m, mn), (c, cn) = (_split_ns(st.get(k, 0)) for k in ("st_atime", "st_mtime", "st_ctime"))
    return ATTR.pack(
        st.get("st_ino", 0), st.get("st_size", 0), st.get("st_blocks", 0), a, m, c, an, mn, cn,
        st["st_mode"], st.get("st_nlink", 1), st.get("st_uid", 0), st.get("st_gid", 0),
        st.get("st_rdev") or 0, st.get("st_blksize", 4096), 0,
    )


def entry_out(nodeid: int, st: dict[str, Any] | None, ttl: int) -> bytes:
    """``fuse_entry_out``: ``nodeid`` 0 (and no attributes) caches a name as absent for ``ttl`` s."""
    head = ENTRY_OUT.pack(nodeid, 0, ttl, ttl, 0, 0)
    return head + (attr(st) if st is not None else bytes(ATTR.size))


def dirent(name: bytes, ino: int, offset: int, mode: int) -> bytes:
    """One ``fuse_dirent``, padded to 8 bytes."""
    record = DIRENT.pack(ino, offset, len(name), stat.S_IFMT(mode) >> 12) + name
    return record + b"\0" * (-len(record) % 8)


def dirent_size(name: bytes) -> int:
    return (DIRENT.size + len(name) + 7) & ~7
