"""Turning bytes into chunks, on whichever side of the wire the bytes are.

A :class:`ChunkSink` is where new chunks go: a :class:`~fabric.chunkstore.PackSession`
on the hub, or a remote session that asks the hub which chunks it lacks and
uploads packs of only those (see :mod:`fabric.client`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import BinaryIO, Protocol

from . import chunking
from .model import FILE, Entry


class ChunkSink(Protocol):
    new_chunks: int  # chunks taken
    new_bytes: int  # their raw bytes
    stored_bytes: int  # their bytes as frames (compressed)

    def filter_new(self, ids: Sequence[bytes]) -> set[bytes]:
        """Which of ``ids`` the destination lacks and this sink has not taken yet."""

    def add(self, cid: bytes, raw: bytes | memoryview) -> None:
        """Take a chunk that :meth:`filter_new` reported as new."""

    def close(self) -> None:
        """Flush; after it returns every chunk taken is stored at the destination."""


def ingest_stream(stream: BinaryIO, sink: ChunkSink) -> tuple[list[tuple[bytes, int]], str]:
    """Chunk a stream into ``sink`` with bounded memory; return its chunk list and MD5."""
    md5 = hashlib.md5()
    chunks: list[tuple[bytes, int]] = []
    window: list[tuple[bytes, memoryview]] = []
    pending = 0

    def flush() -> None:
        new = sink.filter_new([cid for cid, _ in window])
        for cid, data in window:
            if cid in new:
                new.discard(cid)
                sink.add(cid, data)
        window.clear()

    for piece in chunking.cut_stream(stream):
        md5.update(piece)
        cid = chunking.chunk_id(piece)
        chunks.append((cid, len(piece)))
        window.append((cid, piece))
        pending += len(piece)
        if pending >= chunking.READ_WINDOW:
            flush()
            pending = 0
    flush()
    return chunks, md5.hexdigest()


def file_entry(
    chunks: Sequence[tuple[bytes, int]],
    md5: str,
    mode: int = 0o644,
    mtime_ns: int = 0,
    meta: Mapping[str, str] | None = None,
) -> Entry:
    """A file entry with its chunk list inline (the hub moves long lists into their own object)."""
    return Entry(FILE, sum(n for _, n in chunks), mode, mtime_ns, md5=md5, chunks=tuple(chunks), meta=dict(meta or {}))
