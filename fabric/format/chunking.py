"""Content-defined chunking and chunk ids.

The chunking parameters are part of the storage format: two stores that chunk
the same bytes with the same parameters produce the same chunk ids, which is
what makes dedup work across files, versions, spokes and the hub. Changing
them means a new ``FORMAT_VERSION``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import blake3
from pyfastcdc import FastCDC

FORMAT_VERSION = 1
MIN_CHUNK = 16 * 1024
AVG_CHUNK = 64 * 1024
MAX_CHUNK = 256 * 1024
ID_LEN = 32

#: How much of a file the chunker reads at a time; bounds memory per file.
READ_WINDOW = 8 * 1024 * 1024

_CDC = FastCDC(avg_size=AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK)


def chunk_id(data: bytes | memoryview) -> bytes:
    """BLAKE3-256 of the raw chunk bytes. Releases the GIL for large inputs."""
    return blake3.blake3(data, max_threads=1).digest()


def cut(data: bytes | memoryview) -> Iterator[memoryview]:
    """Cut an in-memory buffer into chunks (views into ``data``, no copies)."""
    view = memoryview(data)
    for c in _CDC.cut_buf(view):
        yield view[c.offset : c.offset + c.length]


def cut_stream(stream: BinaryIO, window: int = READ_WINDOW) -> Iterator[memoryview]:
    """Cut a stream into chunks while holding at most ~``window`` + MAX_CHUNK bytes.

    The boundaries are identical to cutting the whole content at once: the
    unfinished tail of each window (which may not end at a content boundary)
    is carried into the next window and cut again.
    """
    carry = b""
    while True:
        block = stream.read(window)
        if not block:
            if carry:
                yield memoryview(carry)
            return
        buf = carry + block if carry else block
        view = memoryview(buf)
        pieces = list(_CDC.cut_buf(view))
        # The last piece ends at the buffer's end, not at a content boundary;
        # keep it (and any piece that could still grow) for the next window.
        for c in pieces[:-1]:
            yield view[c.offset : c.offset + c.length]
        last = pieces[-1]
        carry = bytes(view[last.offset :])


def file_chunks(path: str | os.PathLike[str]) -> Iterator[memoryview]:
    """Chunks of a file on disk, streamed with bounded memory."""
    with open(path, "rb", buffering=0) as f:
        yield from cut_stream(f)


@dataclass(frozen=True)
class ChunkParams:
    version: int = FORMAT_VERSION
    min_size: int = MIN_CHUNK
    avg_size: int = AVG_CHUNK
    max_size: int = MAX_CHUNK


PARAMS = ChunkParams()
