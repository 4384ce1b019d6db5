"""Frames: a chunk as stored and as sent over the wire.

Layout (little-endian)::

    kind:u8  raw_len:u32  xxh3_64(payload):u64  payload

``kind`` is ``RAW`` or ``ZSTD``. A chunk is compressed only when that saves
at least ``MIN_SAVING`` of its size; images, media and random bytes stay raw.
The xxh3 checksum covers the stored payload so cache and wire corruption is
caught without decompressing; the chunk id (BLAKE3 of the raw bytes) is
checked as well by :func:`decode` when the caller knows the id.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence

import xxhash
import zstandard

from fabric.errors import Corruption
from fabric.format.chunking import MAX_CHUNK, chunk_id

RAW = 0
ZSTD = 1
HEADER = struct.Struct("<BIQ")
HEADER_LEN = HEADER.size
ZSTD_LEVEL = 3
MIN_SAVING = 1 / 32
#: Fewer chunks than this are compressed one by one: each call of zstd's batch API
#: starts its threads and compression contexts anew, which only a large batch repays.
BATCH_MIN = 1024
#: The threads of one batch compression.
BATCH_THREADS = min(4, os.cpu_count() or 1)

_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d


def encode(raw: bytes | memoryview) -> bytes:
    """Frame ``raw``, compressing it when that pays."""
    return _frame(raw, _compressor().compress(raw))


def encode_many(raws: Sequence[bytes | memoryview]) -> list[bytes]:
    """:func:`encode` of each of ``raws``, the same frames.

    A batch of at least :data:`BATCH_MIN` chunks is compressed in one call of zstd's
    batch API (:func:`compress_batch`), which holds no GIL while it runs and spreads
    the chunks over :data:`BATCH_THREADS` threads: many small chunks use a second core."""
    if len(raws) < BATCH_MIN or BATCH_THREADS < 2:
        return [encode(raw) for raw in raws]
    return frame_batch(raws, compress_batch(raws, BATCH_THREADS))


def compress_batch(raws: Sequence[bytes | memoryview], threads: int) -> zstandard.BufferWithSegmentsCollection:
    """The zstd compression of each of ``raws``, in one call that holds no GIL (``threads``
    threads of zstd's own); :func:`frame_batch` makes the frames of it."""
    return _compressor().multi_compress_to_buffer(list(raws), threads=threads)


def frame_batch(raws: Sequence[bytes | memoryview], packed: zstandard.BufferWithSegmentsCollection) -> list[bytes]:
    """The frames of ``raws``, given :func:`compress_batch` of them."""
    return [_frame(raw, packed[i].tobytes()) for i, raw in enumerate(raws)]


def _frame(raw: bytes | memoryview, packed: bytes) -> bytes:
    """The frame of ``raw``, given its zstd compression ``packed``: that, if it pays."""
    raw_len = len(raw)
    if len(packed) <= raw_len - max(1, int(raw_len * MIN_SAVING)):
        return HEADER.pack(ZSTD, raw_len, xxhash.xxh3_64_intdigest(packed)) + packed
    return HEADER.pack(RAW, raw_len, xxhash.xxh3_64_intdigest(raw)) + bytes(raw)


def raw_length(frame: bytes | memoryview) -> int:
    return HEADER.unpack_from(frame)[1]


def verify_checksum(frame: bytes | memoryview) -> bool:
    """True when the frame is well formed and its payload matches its checksum."""
    if len(frame) < HEADER_LEN:
        return False
    kind, _, digest = HEADER.unpack_from(frame)
    return kind in (RAW, ZSTD) and xxhash.xxh3_64_intdigest(memoryview(frame)[HEADER_LEN:]) == digest


def decode(frame: bytes | memoryview, expected_id: bytes | None = None) -> bytes:
    """Return the raw chunk bytes; raise :class:`Corruption` on any mismatch."""
    if not verify_checksum(frame):
        raise Corruption(_describe("checksum mismatch", expected_id))
    kind, raw_len, _ = HEADER.unpack_from(frame)
    payload = memoryview(frame)[HEADER_LEN:]
    if raw_len > MAX_CHUNK:
        # No chunk is larger; refusing here keeps a crafted frame from inflating to gigabytes.
        raise Corruption(_describe(f"frame claims {raw_len} bytes, more than a chunk can hold", expected_id))
    if kind == ZSTD:
        try:
            if zstandard.frame_content_size(payload) not in (-1, raw_len):
                raise Corruption(_describe("length mismatch", expected_id))
            raw = _decompressor().decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError as exc:
            raise Corruption(_describe(f"undecodable payload ({exc})", expected_id)) from exc
    else:
        raw = bytes(payload)
    if len(raw) != raw_len:
        raise Corruption(_describe("length mismatch", expected_id))
    if expected_id is not None and chunk_id(raw) != expected_id:
        raise Corruption(_describe("content does not match its id", expected_id))
    return raw


def _describe(problem: str, cid: bytes | None) -> str:
    return f"corrupt chunk {cid.hex() if cid else '(unknown id)'}: {problem}"
