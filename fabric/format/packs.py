"""Packs: frames appended into one object, with a trailing index.

Layout::

    frame frame ... frame   index   footer

index: for each frame ``chunk_id(32) offset:u64 length:u32 raw_len:u32``;
footer: ``count:u32 index_offset:u64 magic(4)``. The same bytes are the
storage format at the hub and the wire format between spoke and hub, so a
pack received from a spoke is stored as it is. The trailing index lets a
store's catalog be rebuilt from its packs alone.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from fabric.errors import BadRequest, Corruption
from fabric.format import frames
from fabric.format.chunking import ID_LEN

MAGIC = b"FPK1"
INDEX_ROW = struct.Struct(f"<{ID_LEN}sQII")
FOOTER = struct.Struct("<IQ4s")
TARGET_SIZE = 32 * 1024 * 1024
MAX_PACK_SIZE = 1024 * 1024 * 1024
PACK_PREFIX = "packs/"


@dataclass(frozen=True)
class PackedChunk:
    id: bytes
    offset: int
    length: int
    raw_len: int


def new_pack_id() -> str:
    """Pack ids sort by creation time, so gc can tell an old orphan from a pack being written."""
    return f"{time.time_ns():020d}-{os.urandom(8).hex()}"


def pack_key(pack_id: str) -> str:
    return f"{PACK_PREFIX}{pack_id[:8]}/{pack_id}"


def pack_created(pack_id: str) -> float:
    return int(pack_id.split("-", 1)[0]) / 1e9


class PackBuilder:
    """Accumulates frames in memory; :meth:`finish` returns the pack bytes."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.size = 0
        self.chunks: list[PackedChunk] = []
        self.ids: set[bytes] = set()

    def add(self, cid: bytes, frame: bytes) -> None:
        self.chunks.append(PackedChunk(cid, self.size, len(frame), frames.raw_length(frame)))
        self.ids.add(cid)
        self._parts.append(frame)
        self.size += len(frame)

    def __len__(self) -> int:
        return len(self.chunks)

    def finish(self) -> bytes:
        index = b"".join(INDEX_ROW.pack(c.id, c.offset, c.length, c.raw_len) for c in self.chunks)
        footer = FOOTER.pack(len(self.chunks), self.size, MAGIC)
        # One join: ``join(parts) + index + footer`` would copy the whole pack twice.
        return b"".join([*self._parts, index, footer])


def parse_index(pack: bytes | memoryview) -> list[PackedChunk]:
    """Read a pack's trailing index; raise BadRequest if the layout is malformed."""
    view = memoryview(pack)
    if len(view) < FOOTER.size:
        raise BadRequest("pack is too short to hold a footer")
    count, index_off, magic = FOOTER.unpack_from(view, len(view) - FOOTER.size)
    if magic != MAGIC or index_off + count * INDEX_ROW.size + FOOTER.size != len(view):
        raise BadRequest("pack footer is malformed (wrong magic or index size)")
    chunks = []
    end = 0
    for i in range(count):
        cid, off, length, raw_len = INDEX_ROW.unpack_from(view, index_off + i * INDEX_ROW.size)
        if off != end or off + length > index_off:
            raise BadRequest(f"pack index entry {i} points outside the frame area")
        end = off + length
        chunks.append(PackedChunk(cid, off, length, raw_len))
    if end != index_off:
        raise BadRequest("pack frames and index disagree about the frame area size")
    return chunks


def verify_pack(pack: bytes | memoryview) -> list[PackedChunk]:
    """Parse and fully verify a pack: every frame's checksum and chunk id.

    Raises :class:`Corruption` naming the first bad chunk; nothing about a pack
    that fails is trusted.
    """
    view = memoryview(pack)
    chunks = parse_index(view)
    for c in chunks:
        frame = view[c.offset : c.offset + c.length]
        raw = frames.decode(frame, c.id)
        if len(raw) != c.raw_len:
            raise Corruption(f"chunk {c.id.hex()} in pack: index says {c.raw_len} bytes, frame holds {len(raw)}")
    return chunks
