"""Trees: the sorted key space ``path -> entry`` of a commit, cut into ranges.

A tree is a *metarange*: a list of ``[first_path, last_path, range_id, count]``
pointing at *ranges*, each a sorted list of ``[path, entry]``. A range ends
after a path whose hash hits the boundary mask, so boundaries depend only on
the paths around them: changing k files of n rewrites about k ranges and the
metarange, and two trees share every range their changes did not touch.
Diff compares range ids first and opens only the ranges that differ.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import xxhash

from fabric.engine.metastore import METARANGE, RANGE, MetaStore, encode_object
from fabric.format.model import Entry

#: Average entries per range (a power of two); part of the storage format.
RANGE_TARGET = 512
#: Hard cap on entries per range.
RANGE_MAX = 8 * RANGE_TARGET
_MASK = RANGE_TARGET - 1
#: Ranges announced to the metadata store at a time while iterating a tree.
PREFETCH_RANGES = 64
#: Threads of a :class:`Trees` that write ranges (each mostly waits on its fsync).
RANGE_WRITERS = 8
#: Trees whose list of ranges a :class:`Trees` keeps parsed (a looked-up path costs a bisect,
#: not a list of ~200 ranges built again: 100,000 files; about 25 KB each, measured).
METARANGES_KEPT = 64


def is_boundary(path: str) -> bool:
    return xxhash.xxh3_64_intdigest(path.encode("utf-8", "surrogatepass")) & _MASK == 0


@dataclass(frozen=True)
class RangeRef:
    first: str
    last: str
    id: str
    count: int


class Trees:
    """Builds, reads, updates and diffs trees stored in a :class:`MetaStore`."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.empty = encode_object(METARANGE, [])[0]
        self._parsed: OrderedDict[str, tuple[list[RangeRef], list[str]]] = OrderedDict()
        self._parsed_lock = threading.Lock()

    # -- storage -------------------------------------------------------------
    def ranges(self, tree_id: str) -> list[RangeRef]:
        """The tree's ranges in path order (shared, do not modify)."""
        return self._parse(tree_id)[0]

    def _parse(self, tree_id: str) -> tuple[list[RangeRef], list[str]]:
        """The tree's ranges and their first paths, parsed once and kept (a tree never changes)."""
        if tree_id == self.empty:
            return [], []
        with self._parsed_lock:
            parsed = self._parsed.get(tree_id)
            if parsed is not None:
                self._parsed.move_to_end(tree_id)
                return parsed
        refs = [RangeRef(*r) for r in self.meta.get(METARANGE, tree_id)]
        parsed = (refs, [r.first for r in refs])
        with self._parsed_lock:
            self._parsed[tree_id] = parsed
            while len(self._parsed) > METARANGES_KEPT:
                self._parsed.popitem(last=False)
        return parsed

    def _write_metarange(self, refs: list[RangeRef]) -> str:
        return self.meta.put(METARANGE, [[r.first, r.last, r.id, r.count] for r in refs])

    def _write_range(self, items: list, pending: list[Future[None]]) -> RangeRef:
        """Write a range in the background (its id is known at once); ``pending`` gets
        the write, which must be waited for before anything refers to the range."""
        value = [[p, e] for p, e in items]
        rid, stored = encode_object(RANGE, value)
        pending.append(_writers().submit(self.meta.put_encoded, rid, stored, value))
        return RangeRef(items[0][0], items[-1][0], rid, len(items))

    def range_items(self, range_id: str) -> list[list]:
        """The ``[path, encoded entry]`` pairs of a range (shared, do not modify)."""
        return self.meta.get(RANGE, range_id)

    # -- building ------------------------------------------------------------
    def build(self, items: Iterator[tuple[str, Entry]]) -> str:
        """A tree from entries in strictly increasing path order."""
        cutter = _Cutter(self)
        for path, entry in items:
            cutter.add(path, entry.encode())
        return self._write_metarange(cutter.finish())

    def apply(self, tree_id: str, changes: Mapping[str, Entry | None]) -> str:
        """A new tree: ``tree_id`` with ``changes`` applied (``None`` deletes).

        Only ranges that hold a changed path are opened and re-cut; ranges
        before, between and after them are reused by id. Cost is
        O(changed ranges + metarange), not O(tree).
        """
        if not changes:
            return tree_id
        refs, firsts = self._parse(tree_id)
        per_range: dict[int, list[str]] = {}
        for path in sorted(changes):
            i = max(0, bisect.bisect_right(firsts, path) - 1)
            per_range.setdefault(i, []).append(path)
        if not refs:
            items = [(p, changes[p].encode()) for p in sorted(changes) if changes[p] is not None]  # type: ignore[union-attr]
            cutter = _Cutter(self)
            for p, e in items:
                cutter.add(p, e)
            return self._write_metarange(cutter.finish())

        out: list[RangeRef] = []
        cutter = _Cutter(self)
        for i, ref in enumerate(refs):
            dirty = i in per_range
            if not dirty and cutter.empty:
                out.append(ref)
                continue
            old = self.range_items(ref.id)
            items = _merge(old, [(p, changes[p]) for p in per_range.get(i, [])]) if dirty else old
            for p, e in items:
                cutter.add(p, e)
            # If the re-cut ended exactly where the old range ended, the ranges
            # that follow are unaffected and cutter.empty lets them be reused.
            out.extend(cutter.take())
        out.extend(cutter.finish())
        return self._write_metarange(out)

    # -- reading -------------------------------------------------------------
    def get(self, tree_id: str, path: str) -> Entry | None:
        refs, firsts = self._parse(tree_id)
        i = bisect.bisect_right(firsts, path) - 1
        if i < 0 or path > refs[i].last:
            return None
        items = self.range_items(refs[i].id)
        j = bisect.bisect_left(items, path, key=_path_of)
        if j < len(items) and items[j][0] == path:
            return Entry.decode(items[j][1])
        return None

    def iter_raw(self, tree_id: str, start: str = "", prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """``(path, encoded entry)`` with ``path >= start`` and starting with ``prefix``."""
        lo = max(start, prefix)
        refs, firsts = self._parse(tree_id)
        i = max(0, bisect.bisect_right(firsts, lo) - 1)
        for j in range(i, len(refs)):
            ref = refs[j]
            if j == i or j % PREFETCH_RANGES == 0:
                # Aligned blocks: pages of a listing that start inside one block ask for nothing new.
                block = j - j % PREFETCH_RANGES
                self.meta.prefetch(RANGE, [r.id for r in refs[block : block + PREFETCH_RANGES]])
            if ref.last < lo:
                continue
            if prefix and ref.first > prefix and not ref.first.startswith(prefix):
                return
            items = self.range_items(ref.id)
            j = bisect.bisect_left(items, lo, key=_path_of)
            for path, enc in items[j:]:
                if prefix and not path.startswith(prefix):
                    if path > prefix:
                        return
                    continue
                yield path, enc

    def iter(self, tree_id: str, start: str = "", prefix: str = "") -> Iterator[tuple[str, Entry]]:
        for path, enc in self.iter_raw(tree_id, start, prefix):
            yield path, Entry.decode(enc)

    # -- diff ----------------------------------------------------------------
    def diff(
        self, left: str, right: str, prefix: str = "", after: str = ""
    ) -> Iterator[tuple[str, Entry | None, Entry | None]]:
        """Paths whose entries differ, in path order: ``(path, left entry, right entry)``,
        under ``prefix`` and, if ``after`` is given, only paths after it.

        Ranges present in both trees hold identical entries (boundaries are
        content-defined, so a path lives in exactly one range of each tree)
        and are skipped without being read. The others are read lazily, in
        order, from the one holding ``after``: a caller that pages through a
        large diff (stopping after each page, resuming at its last path) reads
        each range about once in all.
        """
        if left == right:
            return
        lrefs, rrefs = self.ranges(left), self.ranges(right)
        shared = {r.id for r in lrefs} & {r.id for r in rrefs}
        lo = max(prefix, after + "\0") if after else prefix  # the least path after ``after``
        litems = self._items_from([r for r in lrefs if r.id not in shared], lo, prefix)
        ritems = self._items_from([r for r in rrefs if r.id not in shared], lo, prefix)
        a, b = next(litems, None), next(ritems, None)
        while a is not None or b is not None:
            if b is None or (a is not None and a[0] < b[0]):
                yield a[0], Entry.decode(a[1]), None  # type: ignore[index]
                a = next(litems, None)
            elif a is None or b[0] < a[0]:
                yield b[0], None, Entry.decode(b[1])
                b = next(ritems, None)
            else:
                if a[1] != b[1]:
                    yield a[0], Entry.decode(a[1]), Entry.decode(b[1])
                a, b = next(litems, None), next(ritems, None)

    def _items_from(self, refs: list[RangeRef], lo: str, prefix: str) -> Iterator[tuple[str, bytes]]:
        """``(path, encoded entry)`` of sorted, disjoint ranges ``refs`` with ``path >= lo``
        under ``prefix``, opening each range only when the iteration reaches it."""
        start = bisect.bisect_left([r.last for r in refs], lo)
        for k in range(start, len(refs)):
            ref = refs[k]
            if prefix and ref.first > prefix and not ref.first.startswith(prefix):
                return  # this range and all later ones sort after every path under prefix
            if (k - start) % PREFETCH_RANGES == 0:
                self.meta.prefetch(RANGE, [r.id for r in refs[k : k + PREFETCH_RANGES]])
            items = self.range_items(ref.id)
            for path, enc in items[bisect.bisect_left(items, lo, key=_path_of) :]:
                if prefix and not path.startswith(prefix):
                    if path > prefix:
                        return
                    continue
                yield path, enc

    def walk_ids(self, tree_id: str) -> Iterator[tuple[str, str]]:
        """Every metadata object of a tree: ``("metarange"|"range", id)``."""
        yield "metarange", tree_id
        for ref in self.ranges(tree_id):
            yield "range", ref.id


class _Cutter:
    """Cuts a stream of sorted entries into ranges at content-defined boundaries.

    Ranges are written by a few threads meanwhile: each write waits on its ``fsync``
    (two hundred ranges for 100,000 new files), and those waits overlap. :meth:`finish`
    returns once all are stored, so a metarange written after it refers to stored
    ranges only (objects before references)."""

    def __init__(self, trees: Trees) -> None:
        self.trees = trees
        self.buf: list = []
        self.done: list[RangeRef] = []
        self.pending: list[Future[None]] = []

    @property
    def empty(self) -> bool:
        return not self.buf

    def add(self, path: str, enc: bytes) -> None:
        self.buf.append((path, enc))
        if is_boundary(path) or len(self.buf) >= RANGE_MAX:
            self.done.append(self.trees._write_range(self.buf, self.pending))
            self.buf = []

    def take(self) -> list[RangeRef]:
        done, self.done = self.done, []
        return done

    def finish(self) -> list[RangeRef]:
        """The ranges not taken yet, once every range this cutter wrote is stored."""
        if self.buf:
            self.done.append(self.trees._write_range(self.buf, self.pending))
            self.buf = []
        pending, self.pending = self.pending, []
        wait(pending)
        for future in pending:
            future.result()  # the first failure, once none is still writing
        return self.take()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _writers() -> ThreadPoolExecutor:
    """The process's range writers (shared: each cutter waits for its own writes only)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(RANGE_WRITERS, thread_name_prefix="fabric-ranges")
        return _pool


def _forget_writers() -> None:
    """In a forked child: the parent's threads are not there."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_writers)


def _path_of(item: list) -> str:
    return item[0]


def _merge(old: list[list], changes: list[tuple[str, Entry | None]]) -> list:
    """Apply sorted changes to sorted items."""
    out: list = []
    i = 0
    for path, entry in changes:
        while i < len(old) and old[i][0] < path:
            out.append(old[i])
            i += 1
        if i < len(old) and old[i][0] == path:
            i += 1
        if entry is not None:
            out.append((path, entry.encode()))
    out.extend(old[i:])
    return out
