"""The immutable data model: file entries, commits, and their encodings.

Entries, ranges, metaranges, chunk lists and commits are stored as
content-addressed objects: ``id = BLAKE3(kind byte + msgpack body)``. Their
encodings are part of the storage format (``FORMAT_VERSION`` in
:mod:`fabric.format.chunking`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

FILE = "file"
DIR = "dir"
SYMLINK = "symlink"
#: Special files: no content, only a type, mode, owner (and a device number for devices).
FIFO = "fifo"
SOCKET = "socket"
CHARDEV = "chardev"
BLOCKDEV = "blockdev"
SPECIAL_KINDS = frozenset({FIFO, SOCKET, CHARDEV, BLOCKDEV})
#: The mode of a directory that has no entry of its own (it exists because paths run through it).
DEFAULT_DIR_MODE = 0o755
_KIND_CODES = {FILE: 0, DIR: 1, SYMLINK: 2, FIFO: 3, SOCKET: 4, CHARDEV: 5, BLOCKDEV: 6}
_KIND_NAMES = {v: k for k, v in _KIND_CODES.items()}

#: Chunk lists longer than this are stored as their own object, not inline.
INLINE_CHUNKS = 64
#: In a chunk list, this id stands for ``n`` zero bytes (a hole of a sparse file): stored
#: nowhere, fetched never, read as zeros.
HOLE_ID = bytes(32)


def chunk_list_object(chunks: Iterable[tuple[bytes, int]]) -> list[list]:
    """A long chunk list as its own object holds it (what ``Entry.chunklist`` names)."""
    return [[cid, n] for cid, n in chunks]


def stored_ids(chunks: Iterable[tuple[bytes, int]]) -> list[bytes]:
    """The ids of a chunk list that name stored chunks, in order (holes are stored nowhere)."""
    return [cid for cid, _ in chunks if cid != HOLE_ID]


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of a tree: a file, a directory marker, a symlink or a special file.

    ``rdev``: the device number of a character or block device. ``link``: the id of
    the hard-link group this file belongs to (paths with the same ``link`` are names
    of one file; empty for a file with one name). ``ctime_ns``: the last change of
    the entry's metadata (``None``: use ``mtime_ns``)."""

    kind: str = FILE
    size: int = 0
    mode: int = 0o644
    mtime_ns: int = 0
    uid: int | None = None
    gid: int | None = None
    md5: str = ""
    chunks: tuple[tuple[bytes, int], ...] = ()
    chunklist: str | None = None
    target: str = ""
    meta: dict[str, str] = field(default_factory=dict)
    rdev: int = 0
    link: str = ""
    ctime_ns: int | None = None

    @property
    def etag(self) -> str:
        return self.md5

    def same_content(self, other: Entry | None) -> bool:
        return other is not None and self.encode() == other.encode()

    def with_(self, **changes: Any) -> Entry:
        return replace(self, **changes)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"k": _KIND_CODES[self.kind], "s": self.size, "m": self.mode, "t": self.mtime_ns}
        if self.uid is not None:
            d["u"] = self.uid
        if self.gid is not None:
            d["g"] = self.gid
        if self.md5:
            d["h"] = self.md5
        if self.chunklist:
            d["L"] = self.chunklist
        elif self.chunks:
            d["c"] = [[cid, n] for cid, n in self.chunks]
        if self.target:
            d["l"] = self.target
        if self.meta:
            d["x"] = dict(sorted(self.meta.items()))
        if self.rdev:
            d["r"] = self.rdev
        if self.link:
            d["i"] = self.link
        if self.ctime_ns is not None:
            d["C"] = self.ctime_ns
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Entry:
        return cls(
            kind=_KIND_NAMES[d["k"]],
            size=d["s"],
            mode=d["m"],
            mtime_ns=d["t"],
            uid=d.get("u"),
            gid=d.get("g"),
            md5=d.get("h", ""),
            chunks=tuple((bytes(c), n) for c, n in d.get("c", ())),
            chunklist=d.get("L"),
            target=d.get("l", ""),
            meta=d.get("x", {}),
            rdev=d.get("r", 0),
            link=d.get("i", ""),
            ctime_ns=d.get("C"),
        )

    def encode(self) -> bytes:
        return msgpack.packb(self.to_wire(), use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Entry:
        return cls.from_wire(msgpack.unpackb(data, raw=False))

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly view for the CLI and APIs."""
        d: dict[str, Any] = {
            "type": self.kind,
            "size": self.size,
            "mode": f"{self.mode:o}",
            "mtime": self.mtime_ns / 1e9,
            "mtime_ns": self.mtime_ns,  # (exact: a float of seconds is exact only to about 0.24 µs now)
        }
        if self.md5:
            d["etag"] = self.md5
        if self.kind == SYMLINK:
            d["target"] = self.target
        if self.uid is not None:
            d["uid"], d["gid"] = self.uid, self.gid
        if self.meta:
            d["metadata"] = self.meta
        if self.kind in (CHARDEV, BLOCKDEV):
            d["rdev"] = self.rdev
        if self.link:
            d["link"] = self.link
        if self.ctime_ns is not None:
            d["ctime"] = self.ctime_ns / 1e9
            d["ctime_ns"] = self.ctime_ns
        return d


@dataclass(frozen=True)
class Commit:
    tree: str
    parents: tuple[str, ...]
    author: str
    message: str
    time: float
    meta: dict[str, str] = field(default_factory=dict)
    id: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {
            "tree": self.tree,
            "parents": list(self.parents),
            "author": self.author,
            "message": self.message,
            "time": self.time,
            "meta": dict(sorted(self.meta.items())),
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any], cid: str) -> Commit:
        return cls(d["tree"], tuple(d["parents"]), d["author"], d["message"], d["time"], d.get("meta", {}), cid)

    @classmethod
    def new(cls, tree: str, parents: list[str], author: str, message: str, meta: dict[str, str] | None = None) -> Commit:
        return cls(tree, tuple(parents), author, message, time.time(), dict(meta or {}))

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, **self.to_wire()}
