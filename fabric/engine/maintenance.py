"""fsck (verify everything reachable) and gc (remove what nothing reaches).

Both start from the same walk: every ref of every repository, all their
ancestors, their trees, ranges and chunk lists, plus every staged entry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fabric.engine.metastore import CHUNKLIST, COMMIT, METARANGE, PREFIX, RANGE, decode_object, object_key
from fabric.errors import Corruption, FabricError, NotFound, ObjectNotFound
from fabric.format import packs
from fabric.format.model import FILE, HOLE_ID, Entry, stored_ids
from fabric.util.progress import Progress

if TYPE_CHECKING:
    from fabric.engine.engine import Engine

#: Repack a pack when less than this fraction of its bytes is still live.
REPACK_BELOW = 0.5


@dataclass
class Reachable:
    commits: set[str] = field(default_factory=set)
    objects: set[str] = field(default_factory=set)
    chunks: set[bytes] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


class Walker:
    """Collects everything reachable; with ``verify`` each object is re-read and checked."""

    def __init__(self, engine: Engine, verify: bool) -> None:
        self.engine = engine
        self.verify = verify
        self.found = Reachable()

    def _get(self, kind: bytes, oid: str):
        if not self.verify:
            return self.engine.meta.get(kind, oid)
        try:
            return decode_object(oid, self.engine.store.get(object_key(oid)), kind)[1]
        except ObjectNotFound:
            raise NotFound(f"object {oid} is missing from the store") from None

    def _object(self, kind: bytes, oid: str, where: str):
        try:
            value = self._get(kind, oid)
        except FabricError as exc:
            self.found.problems.append(f"{where}: {exc.message}")
            return None
        self.found.objects.add(oid)
        return value

    def walk_all(self) -> Reachable:
        for repo, commit_id in self.engine.catalog.all_ref_commits():
            self.walk_commits(repo, commit_id)
        for enc in self.engine.catalog.all_staged_entries():
            self.entry(Entry.decode(enc), "staging")
        return self.found

    def walk_commits(self, repo: str, start: str) -> None:
        stack = [start]
        while stack:
            cid = stack.pop()
            if cid in self.found.commits:
                continue
            self.found.commits.add(cid)
            wire = self._object(COMMIT, cid, f"{repo}: commit {cid[:12]}")
            if wire is None:
                continue
            self.tree(wire["tree"], f"{repo}: commit {cid[:12]}")
            stack.extend(wire["parents"])

    def tree(self, tree_id: str, where: str) -> None:
        if tree_id in self.found.objects:
            return
        refs = self._object(METARANGE, tree_id, f"{where}: tree {tree_id[:12]}")
        for first, _last, range_id, _count in refs or ():
            if range_id in self.found.objects:
                continue
            items = self._object(RANGE, range_id, f"{where}: range {range_id[:12]} (from {first!r})")
            for path, enc in items or ():
                self.entry(Entry.decode(enc), f"{where}: {path}")

    def entry(self, entry: Entry, where: str) -> None:
        if entry.kind != FILE:
            return
        if entry.chunklist:
            if entry.chunklist in self.found.objects:
                return
            chunks = self._object(CHUNKLIST, entry.chunklist, f"{where}: chunk list")
            self.found.chunks.update(bytes(c) for c, _ in chunks or () if bytes(c) != HOLE_ID)
        else:
            self.found.chunks.update(stored_ids(entry.chunks))


def record_ownership(engine: Engine) -> None:
    """Record, for each repository, the chunks its refs (with their history) and its
    staging areas use: what a catalog from before chunks belonged to repositories needs."""
    by_repo: dict[str, list[str]] = {}
    for repo, commit_id in engine.catalog.all_ref_commits():
        by_repo.setdefault(repo, []).append(commit_id)
    for repo, commit_ids in by_repo.items():
        walker = Walker(engine, verify=False)
        for commit_id in commit_ids:
            walker.walk_commits(repo, commit_id)
        for enc in engine.catalog.all_staged_entries(repo):
            walker.entry(Entry.decode(enc), "staging")
        engine.catalog.add_owned_chunks(repo, walker.found.chunks)


@dataclass
class FsckReport:
    commits: int = 0
    objects: int = 0
    chunks: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> dict:
        return {"ok": self.ok, "commits": self.commits, "objects": self.objects, "chunks": self.chunks, "problems": self.problems}


def fsck(engine: Engine, deep: bool = True, progress: Progress | None = None) -> FsckReport:
    """Verify every reachable object and chunk (``deep``: decode and hash every chunk)."""
    progress = progress or Progress()
    found = Walker(engine, verify=True).walk_all()
    report = FsckReport(len(found.commits), len(found.objects), len(found.chunks), list(found.problems))
    ids = sorted(found.chunks)
    progress.start(len(ids), "chunks", "fsck")
    if deep:
        for cid, problem in engine.chunks.verify(ids):
            progress.advance()
            if problem:
                report.problems.append(f"chunk {cid.hex()}: {problem}")
    else:
        located = engine.catalog.locate_many(ids)
        report.problems.extend(f"chunk {cid.hex()}: not indexed" for cid in ids if cid not in located)
        progress.advance(len(ids))
    progress.close()
    return report


@dataclass
class GcReport:
    chunks_deleted: int = 0
    packs_deleted: int = 0
    packs_rewritten: int = 0
    objects_deleted: int = 0
    temporaries_deleted: int = 0
    bytes_freed: int = 0
    dry_run: bool = False

    def describe(self) -> dict:
        return dict(self.__dict__)


def gc(engine: Engine, grace: float | None = None, dry_run: bool = False, progress: Progress | None = None) -> GcReport:
    """Remove chunks, packs and metadata objects that no ref or staged entry reaches.

    Nothing younger than ``grace`` seconds (default: the engine's) is removed,
    and a chunk whose gc clock a writer refreshed after the walk is kept, so a
    writer that found a chunk present may still commit a reference to it.
    """
    progress = progress or Progress()
    grace = engine.gc_grace if grace is None else grace
    cutoff = time.time() - grace
    found = Walker(engine, verify=False).walk_all()
    if found.problems:
        raise Corruption("gc refuses to run on a store with missing or corrupt objects; run `fabric fsck` first: " + found.problems[0])
    report = GcReport(dry_run=dry_run)

    dead = [cid for cid, _pack, _len, touched in engine.catalog.iter_chunk_ids() if cid not in found.chunks and touched < cutoff]
    report.chunks_deleted = len(dead)
    dead_set = set(dead)
    if not dry_run and dead:
        engine.catalog.delete_chunks(dead, older_than=cutoff)

    pack_rows = engine.catalog.packs()
    progress.start(len(pack_rows), "packs", "gc")
    indexed_packs = set()
    for pack_id, size, data_size, created in pack_rows:
        progress.advance()
        indexed_packs.add(pack_id)
        if created >= cutoff:
            continue
        live = engine.catalog.chunks_of_pack(pack_id)
        if dry_run:  # the dead chunks are still indexed: count them out as a real run would
            live = [c for c in live if c[0] not in dead_set]
        live_bytes = sum(length for _, _, length, _, _ in live)
        if not live:
            report.packs_deleted += 1
            report.bytes_freed += size
            if not dry_run:
                engine.catalog.delete_pack_row(pack_id)
                engine.store.delete(packs.pack_key(pack_id))
        elif live_bytes < data_size * REPACK_BELOW:
            report.packs_rewritten += 1
            report.bytes_freed += size - live_bytes
            if not dry_run:
                _repack(engine, pack_id, live)
    progress.close()

    for info in engine.store.list(packs.PACK_PREFIX):
        pack_id = info.key.rsplit("/", 1)[-1]
        if pack_id not in indexed_packs and _pack_age_ok(pack_id, cutoff):
            report.packs_deleted += 1
            report.bytes_freed += info.size
            if not dry_run:
                engine.store.delete(info.key)

    for info in engine.store.list(PREFIX):
        oid = info.key.rsplit("/", 1)[-1]
        if oid not in found.objects and info.mtime < cutoff:
            report.objects_deleted += 1
            report.bytes_freed += info.size
            if not dry_run:
                engine.store.delete(info.key)
    if not dry_run:
        report.temporaries_deleted = engine.store.remove_stale_temporaries(cutoff)
    return report


def _pack_age_ok(pack_id: str, cutoff: float) -> bool:
    try:
        return packs.pack_created(pack_id) < cutoff
    except ValueError:
        return False


def _repack(engine: Engine, pack_id: str, live: list[tuple[bytes, int, int, int, float]]) -> None:
    """Copy a pack's live frames into a new pack, repoint the index, delete the old pack."""
    builder = packs.PackBuilder()
    for cid, frame in engine.chunks.frames([cid for cid, *_ in live]):
        builder.add(cid, frame)
    data = builder.finish()
    new_id = packs.new_pack_id()
    engine.store.put(packs.pack_key(new_id), data)
    engine.catalog.relocate_chunks(
        new_id, len(data), builder.size, [(c.id, c.offset, c.length, c.raw_len) for c in builder.chunks]
    )
    engine.catalog.delete_pack_row(pack_id)
    engine.store.delete(packs.pack_key(pack_id))
