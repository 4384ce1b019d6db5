"""The frame records of a ``frames`` response, parsed as they arrive.

A response is a stream of records ``id(32) length(u32 LE) frame``. The pieces the
connection hands over rarely line up with records (a 64 KiB chunk's frame spans two
64 KiB reads), so :class:`Pieces` keeps the received pieces as views and copies each
frame out of them exactly once: sliced from the piece that holds it, or joined from the
pieces it spans. Nothing is joined that a later record would have to be cut out of again.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Iterator

from fabric import errors
from fabric.format import frames
from fabric.format.chunking import MAX_CHUNK

#: A record's id and length.
RECORD_HEAD = 36
#: No frame is longer: a chunk that does not compress is stored raw (:mod:`fabric.format.frames`).
MAX_FRAME = frames.HEADER_LEN + MAX_CHUNK


class Pieces:
    """Received bytes not yet parsed, as views of the pieces they came in."""

    def __init__(self) -> None:
        self._views: deque[memoryview] = deque()
        self.size = 0

    def add(self, piece: bytes) -> None:
        if piece:
            self._views.append(memoryview(piece))
            self.size += len(piece)

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes (at most :attr:`size`), copied once."""
        self.size -= n
        first = self._views[0]
        if len(first) >= n:
            out = bytes(first[:n])
            if len(first) == n:
                self._views.popleft()
            else:
                self._views[0] = first[n:]
            return out
        parts: list[memoryview] = []
        while n:
            first = self._views[0]
            if len(first) <= n:
                parts.append(self._views.popleft())
                n -= len(first)
            else:
                parts.append(first[:n])
                self._views[0] = first[n:]
                n = 0
        return b"".join(parts)


def parse_records(pieces: Iterable[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """``(id, frame)`` of each record in ``pieces``, as soon as it is whole.

    Raises :class:`~fabric.errors.Unavailable` when the stream ends inside a record, and
    :class:`~fabric.errors.Corruption` for a length no frame can have (before buffering it)."""
    pending = Pieces()
    cid: bytes | None = None
    length = 0
    for piece in pieces:
        pending.add(piece)
        while True:
            if cid is None:
                if pending.size < RECORD_HEAD:
                    break
                head = pending.take(RECORD_HEAD)
                cid, (length,) = head[:32], struct.unpack_from("<I", head, 32)
                if length > MAX_FRAME:
                    raise errors.Corruption(f"a frame record of {length} bytes for chunk {cid.hex()}: no frame is longer than {MAX_FRAME}")
            if pending.size < length:
                break
            yield cid, pending.take(length)
            cid = None
    if cid is not None or pending.size:
        raise errors.Unavailable("frame stream ended in the middle of a record")
