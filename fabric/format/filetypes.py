"""Entry kinds and the file-type bits of ``st_mode`` (``S_IFREG``, ``S_IFIFO``, ...).

One table for every file-system view: the mount's ``stat`` and ``readdir``, the
kind ``mknod`` creates, and what ``fabric import`` stores and ``fabric export``
recreates.
"""

from __future__ import annotations

import stat as S

from fabric.format.model import BLOCKDEV, CHARDEV, DIR, FIFO, FILE, SOCKET, SYMLINK

_TYPE_BITS = {
    FILE: S.S_IFREG,
    DIR: S.S_IFDIR,
    SYMLINK: S.S_IFLNK,
    FIFO: S.S_IFIFO,
    SOCKET: S.S_IFSOCK,
    CHARDEV: S.S_IFCHR,
    BLOCKDEV: S.S_IFBLK,
}
_KINDS = {bits: kind for kind, bits in _TYPE_BITS.items()}


def type_bits(kind: str) -> int:
    """The ``S_IFMT`` bits of an entry kind."""
    return _TYPE_BITS[kind]


def kind_of_mode(mode: int) -> str | None:
    """The entry kind of a ``st_mode`` (its ``S_IFMT`` bits), None for an unknown type."""
    return _KINDS.get(S.S_IFMT(mode))
