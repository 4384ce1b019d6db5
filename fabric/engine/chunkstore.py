"""Chunks in packs: dedup on write, verified reads, the hub side of chunk exchange.

Writes go through a :class:`PackSession`: frames accumulate into a pack that
is stored as one object, and only then indexed in the catalog (objects before
references), so a crash leaves at worst an unindexed pack that gc removes.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Iterator, Sequence

from fabric.cache.lru import BytesLRU
from fabric.catalog import Catalog
from fabric.catalog.catalog import ChunkLocation
from fabric.errors import Corruption, NotFound, ObjectNotFound
from fabric.format import frames, packs
from fabric.format.ingest import PackSession
from fabric.store import ObjectStore

#: Reads of frames closer together than this in one pack are merged into one GET.
COALESCE_GAP = 256 * 1024
#: The most bytes one merged GET reads: what serving a frames request holds at a time,
#: however many chunks of one pack it asks for.
MAX_RUN = 8 * 1024 * 1024


class Claims:
    """The chunks that one sink of this process made chunks of ``repo``: each one seen
    indexed in the catalog (or indexed by the sink itself) and then recorded as the
    repository's. ``drops`` is the catalog's :meth:`~fabric.catalog.Catalog.chunk_drops`
    read before the first of them: while the catalog still says so, none of them was
    unindexed or disowned since (a gc, a deleted repository). ``since``: when that was."""

    __slots__ = ("repo", "drops", "since", "ids", "__weakref__")

    def __init__(self, repo: str, drops: int) -> None:
        self.repo = repo
        self.drops = drops
        self.since = time.time()
        self.ids: set[bytes] = set()


class ChunkStore:
    def __init__(self, store: ObjectStore, catalog: Catalog, grace: float, cache_bytes: int = 64 << 20) -> None:
        self.store = store
        self.catalog = catalog
        self.grace = grace
        self.cache = BytesLRU(cache_bytes, max_item=cache_bytes // 4)
        #: The claims of the sinks still alive (a sink holds its own; they go with it).
        self._claims: weakref.WeakSet[Claims] = weakref.WeakSet()

    # -- writing -------------------------------------------------------------
    def missing(self, ids: Sequence[bytes], owner: str | None = None) -> list[bytes]:
        """The ids (in the given order, without repeats) that this store lacks; with
        ``owner``, also those it holds but not as chunks of that repository."""
        unique = list(dict.fromkeys(ids))
        # Looked up in id order: each query of a batch then reads one run of the index's
        # pages, not pages all over it (several times faster for 100,000 ids).
        present = self.catalog.present_and_touch(sorted(unique), self.grace)
        if owner is not None:
            present &= self.catalog.owned_chunks(owner, sorted(present))
        return [cid for cid in unique if cid not in present]

    def session(self, target_size: int = packs.TARGET_SIZE, owner: str | None = None) -> PackSession:
        """A sink for new chunks; packs are stored and indexed as they fill.

        With ``owner`` every chunk offered becomes a chunk of that repository, the
        stored ones at once: the sink is fed in this process by code that hashed the
        bytes itself, so whoever feeds it holds them. What it made the repository's is
        remembered while the sink lives (see :meth:`unclaimed`)."""
        if owner is None:
            return PackSession(self.missing, self.store_pack, target_size)
        claims = Claims(owner, self.catalog.chunk_drops())  # read before the first claim
        self._claims.add(claims)

        def missing_claiming_present(ids: Sequence[bytes]) -> list[bytes]:
            lacking = self.missing(ids)
            absent = set(lacking)
            present = sorted(cid for cid in ids if cid not in absent)
            self.catalog.add_owned_chunks(owner, present)
            claims.ids.update(present)
            return lacking

        return PackSession(missing_claiming_present, lambda b: self.store_pack(b, owner, claims), target_size)

    def unclaimed(self, repo: str, ids: Sequence[bytes]) -> Sequence[bytes]:
        """``ids`` less those a live sink of this process made chunks of ``repo`` (see
        :meth:`session`), when no chunk was unindexed or disowned since that sink began:
        what is left needs asking the catalog (:meth:`missing`) whether it is the
        repository's.

        A sink's claims count for a quarter of the gc grace: :meth:`missing` refreshes
        a chunk's gc clock once it is half the grace old, so a claimed chunk still has
        at least a quarter of the grace before a gc may take it, as one just checked has
        half of it."""
        if not ids:
            return ids
        live = [c for c in self._claims if c.repo == repo and time.time() - c.since < self.grace / 4]
        if not live:
            return ids
        drops = self.catalog.chunk_drops()
        sets = [c.ids for c in live if c.drops == drops]
        if not sets:
            return ids
        if len(sets) == 1:
            (claimed,) = sets
            return [cid for cid in ids if cid not in claimed]
        return [cid for cid in ids if not any(cid in claimed for claimed in sets)]

    def store_pack(self, builder: packs.PackBuilder, owner: str | None = None, claims: Claims | None = None) -> None:
        data = builder.finish()
        pack_id = packs.new_pack_id()
        self.store.put(packs.pack_key(pack_id), data)
        size = len(data)
        del data
        rows = _index_rows(builder.chunks)
        self.catalog.index_pack(pack_id, size, builder.size, rows)
        if owner is not None:
            ids = [row[0] for row in rows]
            self.catalog.add_owned_chunks(owner, ids)
            if claims is not None:
                claims.ids.update(ids)

    def receive_pack(self, data: bytes, owner: str | None = None) -> tuple[int, int]:
        """Verify a pack sent by a client and store it: ``(chunks, new chunks)``.

        Every frame is checked against its checksum and id before anything is
        stored or indexed; a pack with one bad frame is refused whole. With
        ``owner`` every chunk of the pack becomes a chunk of that repository (the
        sender proved it holds the bytes), including chunks stored before.
        """
        chunks = packs.verify_pack(data)
        if not chunks:
            return 0, 0
        new = set(self.missing([c.id for c in chunks]))
        if new:
            pack_id = packs.new_pack_id()
            self.store.put(packs.pack_key(pack_id), data)
            data_size = chunks[-1].offset + chunks[-1].length
            self.catalog.index_pack(pack_id, len(data), data_size, _index_rows(c for c in chunks if c.id in new))
        if owner is not None:  # after the chunks are indexed: objects before references
            self.catalog.add_owned_chunks(owner, sorted(c.id for c in chunks))
        return len(chunks), len(new)

    # -- reading -------------------------------------------------------------
    def _locate(self, ids: Sequence[bytes]) -> dict[bytes, ChunkLocation]:
        found = self.catalog.locate_many(ids)
        lost = [cid for cid in ids if cid not in found]
        if lost:
            raise NotFound(f"chunk {lost[0].hex()} is not in the store ({len(lost)} missing); run `fabric fsck`")
        return found

    def frames(self, ids: Sequence[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """Yield ``(id, frame)`` for each id, checksum-verified, reading runs of a pack at once."""
        locations = self._locate(ids)
        by_pack: dict[str, list[tuple[bytes, ChunkLocation]]] = {}
        for cid in dict.fromkeys(ids):
            loc = locations[cid]
            by_pack.setdefault(loc.pack, []).append((cid, loc))
        for pack_id, items in by_pack.items():
            items.sort(key=lambda it: it[1].offset)
            for run in _runs(items):
                start = run[0][1].offset
                end = run[-1][1].offset + run[-1][1].length
                try:
                    blob = self.store.get(packs.pack_key(pack_id), start, end - start)
                except ObjectNotFound:
                    raise Corruption(f"pack {pack_id} is missing from the store; run `fabric fsck`") from None
                view = memoryview(blob)
                for cid, loc in run:
                    frame = view[loc.offset - start : loc.offset - start + loc.length]
                    if len(frame) != loc.length or not frames.verify_checksum(frame):
                        raise Corruption(f"corrupt chunk {cid.hex()} in pack {pack_id}: checksum mismatch")
                    yield cid, bytes(frame)

    def read_many(self, ids: Sequence[bytes]) -> list[bytes]:
        """Raw bytes of each chunk, verified against its id; order and repeats kept."""
        out: dict[bytes, bytes] = {}
        need = []
        for cid in ids:
            data = self.cache.get(cid)
            if data is None:
                need.append(cid)
            else:
                out[cid] = data
        if need:
            for cid, frame in self.frames(need):
                data = frames.decode(frame, cid)
                self.cache.put(cid, data)
                out[cid] = data
        return [out[cid] for cid in ids]

    def read(self, cid: bytes) -> bytes:
        return self.read_many([cid])[0]

    def verify(self, ids: Iterable[bytes]) -> Iterator[tuple[bytes, str | None]]:
        """For fsck: ``(id, problem or None)`` for each id, decoding every frame."""
        ids = list(ids)
        located = self.catalog.locate_many(ids)
        for cid in ids:
            if cid not in located:
                yield cid, "not indexed"
        present = [cid for cid in ids if cid in located]
        for i in range(0, len(present), 256):
            batch = present[i : i + 256]
            try:
                for cid, frame in self.frames(batch):
                    try:
                        frames.decode(frame, cid)
                        yield cid, None
                    except Corruption as exc:
                        yield cid, exc.message
            except Corruption:
                # Report each chunk of the failing batch on its own.
                for cid in batch:
                    try:
                        for _, frame in self.frames([cid]):
                            frames.decode(frame, cid)
                        yield cid, None
                    except Corruption as exc:
                        yield cid, exc.message


def _index_rows(chunks: Iterable[packs.PackedChunk]) -> list[tuple[bytes, int, int, int]]:
    """The catalog rows of a pack's chunks, in id order: inserted into the indexes in one
    pass over their pages rather than at pages all over them."""
    return sorted((c.id, c.offset, c.length, c.raw_len) for c in chunks)


def _runs(items: list[tuple[bytes, ChunkLocation]]) -> Iterator[list[tuple[bytes, ChunkLocation]]]:
    """Frames of one pack (sorted by offset) in runs read with one GET each: near each other,
    and spanning at most :data:`MAX_RUN` bytes (unless one frame alone is larger)."""
    run = [items[0]]
    for item in items[1:]:
        prev = run[-1][1]
        end = item[1].offset + item[1].length
        if item[1].offset - (prev.offset + prev.length) <= COALESCE_GAP and end - run[0][1].offset <= MAX_RUN:
            run.append(item)
        else:
            yield run
            run = [item]
    yield run
