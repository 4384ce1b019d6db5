"""The reads role of the data plane: entries, listings and file bytes at a ref.

Refs are expressions (``main``, ``v1``, a commit id or prefix, ``main~2``).
Reads at a branch see its uncommitted changes; reads at a tag or commit see
committed data only. Every read is side-effect free and safe to retry. Reads
raise NotFound if the repository or ref does not exist, and Corruption when
stored bytes fail their checksum (they are never returned as data).
"""

from __future__ import annotations

import abc
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from fabric.errors import NotFound
from fabric.format.listing import Listing
from fabric.format.model import FILE, Entry
from fabric.format.paths import check_path
from fabric.plane.jobs import check_hint_size, check_job


class Reads(abc.ABC):
    @abc.abstractmethod
    def stat(self, repo: str, ref: str, path: str) -> Entry:
        """The entry at ``path``; its chunk list may be absent (remote planes).

        Raises NotFound if nothing is at ``path`` (a staged delete hides a committed
        file), InvalidPath for a bad path."""

    @abc.abstractmethod
    def stat_chunks(self, repo: str, ref: str, path: str) -> Entry:
        """The entry at ``path`` with its whole chunk list inline, for readers that fetch
        chunks themselves (FUSE, spokes) through
        :meth:`~fabric.plane.exchange.ChunkExchange.frames`.

        Raises as :meth:`stat` does."""

    @abc.abstractmethod
    def list(self, repo: str, ref: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> Listing:
        """One page of paths under ``prefix`` (S3-style grouping with ``delimiter='/'``).

        At most ``limit`` entries and common prefixes together, in path order,
        starting after the path or common prefix ``after``; ``next_after`` is None on
        the last page, else the ``after`` of the next one. Raises BadRequest for a
        delimiter other than ``''`` or ``'/'`` or a ``limit`` below 1, InvalidPath
        for a bad prefix."""

    def walk(self, repo: str, ref: str, prefix: str = "") -> Iterator[tuple[str, Entry]]:
        """Every path under ``prefix``, all pages.

        Pages are read one at a time as the iterator advances, so a branch that
        changes meanwhile may be seen partly before and partly after the change."""
        after = ""
        while True:
            page = self.list(repo, ref, prefix, "", after, 1000)
            yield from page.entries
            if page.next_after is None:
                return
            after = page.next_after

    @abc.abstractmethod
    def read_stream(self, repo: str, ref: str, path: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The bytes of a file, streamed; RangeNotSatisfiable outside the file.

        ``length`` bytes from ``offset`` (to the end when None, or when the file is
        shorter). Raises NotFound if nothing is at ``path``, BadRequest if it is not
        a file, RangeNotSatisfiable for a negative ``offset`` or ``length`` or an
        ``offset`` at or past the end of the file (0 is always allowed). Local planes
        may raise RangeNotSatisfiable and Corruption only as the iterator advances,
        and a remote one raises Unavailable if the connection breaks mid-stream.
        Consume the iterator or close it: a remote plane holds a connection until then."""

    def open_file(
        self, repo: str, ref: str, path: str, entry: Entry | None = None, offset: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        """Like :meth:`read_stream`; ``entry`` (from :meth:`stat`/:meth:`walk` at the same
        ref) pins the version read and may spare a lookup."""
        return self.read_stream(repo, ref, path, offset, length)

    def is_stale(self, repo: str, ref: str) -> bool:
        """Whether reads of ``ref`` may be behind the hub (a spoke cut off from it)."""
        return False

    @abc.abstractmethod
    def hint(self, repo: str, ref: str, paths: Sequence[str], job: str, append: bool = False, top_up: bool = False) -> dict:
        """Tell the plane the order in which ``job`` will read files of ``repo@ref``
        (duplicates: read again). ``append`` adds to the job's order for ``repo``, else
        it replaces it (a new epoch). A spoke fetches ahead of the job's reads, within
        its lookahead window; a hub only checks the hint.

        ``top_up``: ``paths`` are files a reader may open next, not an order: a spoke
        fetches only the chunks it lacks of those it holds in part (files that changed
        since a version it served, what a sync tool reads of a tree it mostly has), at
        most a window of them, and keeps no order (``append`` does not apply).

        Answers ``{"job", "paths", "bytes" (total size of the files named),
        "window_bytes" (the lookahead bound, 0 where nothing is fetched ahead)}``.
        Raises BadRequest for an invalid job id, over
        :data:`~fabric.plane.jobs.MAX_HINT_PATHS` paths or an invalid path, NotFound
        (naming the path) for a path that is not a file at ``ref``; a refused hint
        changes nothing."""

    def read(self, repo: str, ref: str, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes :meth:`read_stream` streams, in memory; raises as it does."""
        return b"".join(self.read_stream(repo, ref, path, offset, length))


def check_hint(repo: str, ref: str, paths: Sequence[str], job: str, lookup: Callable[[str], Entry | None]) -> dict[str, Entry]:
    """Check a hint whole, as :meth:`Reads.hint` states, before anything is done with it:
    the entry of each distinct path, looked up once by ``lookup`` (None: nothing there)."""
    check_job(job)
    check_hint_size(len(paths))
    for path in paths:
        check_path(path)
    out: dict[str, Entry] = {}
    for path in paths:
        if path in out:
            continue
        entry = lookup(path)
        if entry is None:
            raise NotFound(f"{path!r} not found in {repo}@{ref}")
        if entry.kind != FILE:
            raise NotFound(f"{path!r} is a {entry.kind}, not a file: a hint names files")
        out[path] = entry
    return out


#: Paths whose entries :class:`HintedEntries` keeps, in all trees together: about 600 bytes each
#: with a two-chunk entry it alone holds (tracemalloc), so up to about 120 MB.
HINTED_PATHS = 200_000


class HintedEntries:
    """The entries that hints named, by tree and path. A job hints every epoch, the same
    files in another order, and a commit's tree never changes: the next hint on that tree is
    checked from here, without looking each path up again (the lookups took most of a hint's
    time, and an epoch's first reads wait on that time). All trees together keep at most
    ``max_paths`` paths; the tree hinted least recently goes first."""

    def __init__(self, max_paths: int = HINTED_PATHS) -> None:
        self.max_paths = max_paths
        self._trees: OrderedDict[tuple[str, str], dict[str, Entry]] = OrderedDict()
        self._paths = 0
        self._lock = threading.Lock()

    def check(
        self, repo: str, ref: str, paths: Sequence[str], job: str, lookup: Callable[[str], Entry | None], tree: str | None
    ) -> dict[str, Entry]:
        """:func:`check_hint`, asking ``lookup`` only for the paths not kept for ``tree`` of
        ``repo``; ``tree`` None (a view that can change, such as a branch's staged writes)
        keeps nothing."""
        if tree is None:
            return check_hint(repo, ref, paths, job, lookup)
        key = (repo, tree)
        with self._lock:
            known = self._trees.get(key, {})  # read below without the lock: entries are only added
            if known:
                self._trees.move_to_end(key)
        entries = check_hint(repo, ref, paths, job, lambda path: known.get(path) or lookup(path))
        self._keep(key, entries)
        return entries

    def _keep(self, key: tuple[str, str], entries: dict[str, Entry]) -> None:
        with self._lock:
            kept = self._trees.pop(key, {})
            new = [(path, entry) for path, entry in entries.items() if path not in kept]
            del new[max(0, self.max_paths - len(kept)) :]  # one tree keeps at most max_paths
            while self._trees and self._paths + len(new) > self.max_paths:
                self._paths -= len(self._trees.popitem(last=False)[1])
            kept.update(new)
            self._paths += len(new)
            self._trees[key] = kept
