"""Reading versioned data: commits, history, trees with staging overlaid, file bytes.

The read side shared by the hub's engine and by a spoke. It needs only a
:class:`~fabric.engine.metastore.MetaStore` (local, or one that fetches from a hub),
the :class:`~fabric.engine.tree.Trees` over it, and a function that returns the raw
bytes of chunks (the hub's pack store, or a spoke's cache and fetcher).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from fabric.engine.metastore import CHUNKLIST, COMMIT, MetaStore
from fabric.engine.tree import Trees
from fabric.errors import BadRequest, RangeNotSatisfiable
from fabric.format.listing import Listing
from fabric.format.model import FILE, HOLE_ID, Commit, Entry

#: Chunks requested from the chunk source at a time while streaming a file.
READ_BATCH = 64
#: How many batches ahead of the reader a ``readahead`` callback is told about.
READAHEAD_BATCHES = 2
#: A hole of a sparse file is streamed as zeros in pieces of at most this many bytes.
ZERO_PIECE = 1024 * 1024
_ZEROS = bytes(ZERO_PIECE)


class Staging(Protocol):
    """A branch's uncommitted changes: encoded entries, ``None`` for a staged delete."""

    def entry(self, path: str) -> tuple[bool, bytes | None]:
        """``(found, entry)``; found with ``None`` means the path is staged as deleted."""

    def between(self, start: str, end: str | None) -> Iterator[tuple[str, bytes | None]]:
        """Staged paths with ``start <= path < end`` in path order."""


@dataclass(frozen=True)
class View:
    """What a read at a ref sees: a commit, plus a branch's staging when the ref is a branch."""

    repo: str
    commit_id: str
    tree: str
    branch: str | None = None
    staging: Staging | None = None

    @property
    def fixed_tree(self) -> str | None:
        """The tree read, when no staged writes lie over it (a tree never changes); else None."""
        return self.tree if self.staging is None else None


def prefix_end(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix``."""
    return prefix + "\U0010ffff" if prefix else None


class Reader:
    def __init__(self, meta: MetaStore, trees: Trees, read_chunks: Callable[[Sequence[bytes]], list[bytes]]) -> None:
        self.meta = meta
        self.trees = trees
        self.read_chunks = read_chunks

    # -- commits -------------------------------------------------------------
    def get_commit(self, commit_id: str) -> Commit:
        return Commit.from_wire(self.meta.get(COMMIT, commit_id), commit_id)

    def log(self, start: str, path: str | None = None, limit: int = 100, after: str | None = None) -> list[Commit]:
        """Commits reachable from ``start``, newest first (``after``: continue a page)."""
        seen = {start}
        first = self.get_commit(start)
        heap = [(-first.time, start, first)]
        out: list[Commit] = []
        skipping = after is not None
        while heap and len(out) < limit:
            _, cid, commit = heapq.heappop(heap)
            for p in commit.parents:
                if p not in seen:
                    seen.add(p)
                    pc = self.get_commit(p)
                    heapq.heappush(heap, (-pc.time, p, pc))
            if skipping:
                skipping = cid != after
                continue
            if path and not self.touches(commit, path):
                continue
            out.append(commit)
        return out

    def touches(self, commit: Commit, path: str) -> bool:
        """Did ``commit`` change ``path`` (a file, or anything under a directory) against its first parent?"""
        base = self.get_commit(commit.parents[0]).tree if commit.parents else self.trees.empty
        want = path.rstrip("/")
        for p, _, _ in self.trees.diff(base, commit.tree, prefix=want):
            if p == want or p.startswith(want + "/"):
                return True
        return False

    def ancestors(self, start: str) -> set[str]:
        seen, stack = {start}, [start]
        while stack:
            for p in self.get_commit(stack.pop()).parents:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return seen

    def merge_base(self, a: str, b: str) -> str | None:
        """The newest common ancestor of two commits."""
        ancestors_a = self.ancestors(a)
        best: tuple[float, str] | None = None
        for cid in self.ancestors(b):
            if cid in ancestors_a:
                t = self.get_commit(cid).time
                if best is None or t > best[0]:
                    best = (t, cid)
        return best[1] if best else None

    # -- paths ---------------------------------------------------------------
    def stat(self, view: View, path: str) -> Entry | None:
        if view.staging is not None:
            found, enc = view.staging.entry(path)
            if found:
                return Entry.decode(enc) if enc is not None else None
        return self.trees.get(view.tree, path)

    def iter_entries(self, view: View, prefix: str = "", start: str = "") -> Iterator[tuple[str, bytes]]:
        """``(path, encoded entry)`` at a view, staging overlaid, in path order."""
        tree_items = self.trees.iter_raw(view.tree, start=start, prefix=prefix)
        if view.staging is None:
            yield from tree_items
            return
        yield from _overlay(tree_items, view.staging.between(max(start, prefix), prefix_end(prefix)))

    def list_view(self, view: View, prefix: str, delimiter: str, after: str, limit: int) -> Listing:
        out = Listing()
        last = after
        start = after  # ``after`` itself is skipped below (no NUL: PostgreSQL text cannot hold one)
        rest_after = after[len(prefix) :] if delimiter and after.startswith(prefix) else ""
        if rest_after and rest_after.find(delimiter) == len(rest_after) - 1:
            # ``after`` is a common prefix from an earlier page: skip everything under it.
            start = after[:-1] + chr(ord(delimiter) + 1)
        while True:
            grouped = False
            for path, enc in self.iter_entries(view, prefix, start):
                if path <= last:
                    continue
                if len(out.entries) + len(out.prefixes) >= limit:
                    out.next_after = last
                    return out
                rest = path[len(prefix) :]
                cut = rest.find(delimiter) if delimiter else -1
                if cut >= 0:
                    # Everything under this common prefix sorts before prefix-with-'/'+1.
                    last = prefix + rest[: cut + 1]
                    out.prefixes.append(last)
                    start = last[:-1] + chr(ord(delimiter) + 1)
                    grouped = True
                    break
                out.entries.append((path, Entry.decode(enc)))
                last = path
            if not grouped:
                return out

    # -- file bytes ----------------------------------------------------------
    def chunk_list(self, entry: Entry) -> tuple[tuple[bytes, int], ...]:
        if entry.chunklist:
            return tuple((bytes(c), n) for c, n in self.meta.get(CHUNKLIST, entry.chunklist))
        return entry.chunks

    def chunk_lists(self, entries: Sequence[Entry]) -> list[tuple[tuple[bytes, int], ...]]:
        """The chunk lists of ``entries``; those stored apart are fetched in one batch."""
        self.meta.prefetch(CHUNKLIST, [e.chunklist for e in entries if e.chunklist])
        return [self.chunk_list(e) for e in entries]

    def read_entry(
        self,
        entry: Entry,
        offset: int = 0,
        length: int | None = None,
        readahead: Callable[[list[bytes]], None] | None = None,
    ) -> Iterator[bytes]:
        """Stream the bytes of a file entry (whole, or ``length`` bytes from ``offset``).

        ``readahead`` is told the chunk ids of each batch after the first once, before the
        :data:`READAHEAD_BATCHES` batches before it are read. Holes
        (:data:`~fabric.format.model.HOLE_ID`) are never read: they stream as zeros.
        """
        if entry.kind != FILE:
            raise BadRequest("not a regular file")
        if offset < 0 or (offset > 0 and offset >= entry.size) or (length is not None and length < 0):
            raise RangeNotSatisfiable(f"range starting at {offset} is outside the file's {entry.size} bytes", size=entry.size)
        end = entry.size if length is None else min(entry.size, offset + length)
        wanted: list[tuple[bytes, int, int]] = []  # (chunk id, start within chunk, end within chunk)
        pos = 0
        for cid, size in self.chunk_list(entry):
            lo, hi = max(offset, pos), min(end, pos + size)
            if lo < hi:
                wanted.append((cid, lo - pos, hi - pos))
            pos += size
            if pos >= end:
                break
        for i in range(0, len(wanted), READ_BATCH):
            batch = wanted[i : i + READ_BATCH]
            if readahead is not None:
                # The first time, the batches after this one; then the one that comes into reach.
                told = i + (1 if i == 0 else READAHEAD_BATCHES) * READ_BATCH
                ahead = [w[0] for w in wanted[told : i + (1 + READAHEAD_BATCHES) * READ_BATCH] if w[0] != HOLE_ID]
                if ahead:
                    readahead(ahead)
            ids = [cid for cid, _, _ in batch if cid != HOLE_ID]
            got = iter(self.read_chunks(ids) if ids else ())
            for cid, a, b in batch:
                if cid == HOLE_ID:
                    yield from _zeros(b - a)
                    continue
                data = next(got)
                yield data[a:b] if (a, b) != (0, len(data)) else data


def _zeros(n: int) -> Iterator[bytes]:
    """``n`` zero bytes, in pieces of at most :data:`ZERO_PIECE` (the full ones shared)."""
    while n > 0:
        k = min(n, ZERO_PIECE)
        yield _ZEROS if k == ZERO_PIECE else bytes(k)
        n -= k


def _overlay(tree_items: Iterator[tuple[str, bytes]], staged: Iterator[tuple[str, bytes | None]]) -> Iterator[tuple[str, bytes]]:
    """Merge two sorted streams; staged entries win, staged ``None`` hides a path."""
    s = next(staged, None)
    for path, enc in tree_items:
        while s is not None and s[0] < path:
            if s[1] is not None:
                yield s  # type: ignore[misc]
            s = next(staged, None)
        if s is not None and s[0] == path:
            if s[1] is not None:
                yield s  # type: ignore[misc]
            s = next(staged, None)
            continue
        yield path, enc
    while s is not None:
        if s[1] is not None:
            yield s  # type: ignore[misc]
        s = next(staged, None)
