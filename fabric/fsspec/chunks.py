"""Chunk-level reads of one file version: which chunks cover a byte range, fetched many at
a time in one ``frames`` call, each frame verified against its id."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence

from fabric.cache.lru import BytesLRU
from fabric.client.spoke_files import SpokeFiles
from fabric.errors import Corruption
from fabric.format import frames
from fabric.format.model import HOLE_ID, Entry
from fabric.plane.exchange import ChunkExchange


class ChunkMap:
    """Where each chunk of one file version lies (from the entry's chunk list)."""

    def __init__(self, entry: Entry) -> None:
        self.ids = [cid for cid, _ in entry.chunks]
        self.lengths = [n for _, n in entry.chunks]
        self.starts = [0, *itertools.accumulate(self.lengths)][:-1]
        self.size = entry.size

    def covering(self, start: int, end: int) -> range:
        """Indices of the chunks that hold bytes ``[start, end)`` (``end`` at most the size)."""
        if start >= end:
            return range(0)
        return range(bisect.bisect_right(self.starts, start) - 1, bisect.bisect_left(self.starts, end))

    def ids_for(self, start: int, end: int) -> list[bytes]:
        return [self.ids[i] for i in self.covering(start, end)]

    def assemble(self, start: int, end: int, chunks: dict[bytes, bytes]) -> bytes:
        """Bytes ``[start, end)`` from ``chunks`` (raw bytes by id; holes need none)."""
        parts: list[bytes | memoryview] = []
        for i in self.covering(start, end):
            base, cid = self.starts[i], self.ids[i]
            lo, hi = max(start, base) - base, min(end, base + self.lengths[i]) - base
            parts.append(bytes(hi - lo) if cid == HOLE_ID else memoryview(chunks[cid])[lo:hi])
        return b"".join(parts)


def fetch(
    plane: ChunkExchange, repo: str, ids: Iterable[bytes], cache: BytesLRU | None = None, beside: SpokeFiles | None = None
) -> dict[bytes, bytes]:
    """The raw bytes of chunks ``ids`` of ``repo``: from ``cache``, then from the files of the
    spoke ``beside`` this process, the rest in one ``frames`` call (a remote plane sends one
    request per batch of ids). Raises Corruption for a frame that does not match its id or a
    chunk the server left out."""
    out: dict[bytes, bytes] = {}
    need: list[bytes] = []
    for cid in dict.fromkeys(ids):
        if cid == HOLE_ID:
            continue
        data = cache.get(cid) if cache is not None else None
        if data is None:
            need.append(cid)
        else:
            out[cid] = data
    if need and beside is not None:
        local = beside.read_many(need)
        if cache is not None:
            for cid, data in local.items():
                cache.put(cid, data)
        out.update(local)
        need = [cid for cid in need if cid not in local]
    if need:
        wanted = set(need)
        for cid, frame in plane.frames(need, repo=repo):
            if cid in wanted and cid not in out:
                out[cid] = data = frames.decode(frame, cid)
                if cache is not None:
                    cache.put(cid, data)
        _require_all(need, out)
    return out


def _require_all(ids: Sequence[bytes], got: dict[bytes, bytes]) -> None:
    lost = [cid for cid in ids if cid not in got]
    if lost:
        raise Corruption(f"the server sent {len(ids) - len(lost)} of {len(ids)} chunks asked for (first missing: {lost[0].hex()})")
