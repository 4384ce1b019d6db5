"""The directory tree of a mount, built from listings of the repository's flat key space.

A repository maps paths to entries; directories exist either as explicit
markers (entries of kind ``dir``, written by ``mkdir`` or for empty
directories) or implicitly, as the common prefix of the paths below them.
:class:`Namespace` lists one directory at a time
(``list(prefix='a/b/', delimiter='/')``, whole entries with their chunk
lists) and caches the result: forever for an immutable commit or tag, for
``ttl`` seconds at a branch (and anew on every ``opendir``: close-to-open).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from fabric.format.model import DIR, FILE, Entry
from fabric.plane.retry import RetryingPlane, ServerGone

LIST_PAGE = 10_000


@dataclass
class Dir:
    """One listed directory: child name -> entry (implicit directories share ``Namespace.implicit``)."""

    children: dict[str, Entry]
    loaded_at: float
    # Sibling readahead for small files: sorted file names, index of each, opens seen.
    _files: list[str] | None = None
    _index: dict[str, int] | None = None
    recent: set[int] = field(default_factory=set)
    prefetched_to: int = -1

    def files(self) -> tuple[list[str], dict[str, int]]:
        if self._files is None:
            names = sorted(n for n, e in self.children.items() if e.kind == FILE)
            self._files = names
            self._index = {n: i for i, n in enumerate(names)}
        assert self._index is not None
        return self._files, self._index

    _subdirs: int | None = None

    def changed(self) -> None:
        self._files = self._index = self._subdirs = None

    def subdirs(self) -> int:
        if self._subdirs is None:
            self._subdirs = sum(1 for e in self.children.values() if e.kind == DIR)
        return self._subdirs


def split(path: str) -> tuple[str, str]:
    """``'a/b/c'`` -> ``('a/b', 'c')``; ``'c'`` -> ``('', 'c')``."""
    head, _, tail = path.rpartition("/")
    return head, tail


class Namespace:
    def __init__(
        self,
        plane: RetryingPlane,
        repo: str,
        ref: str,
        implicit: Entry,
        ttl: float | None,
        lock: threading.RLock | None = None,
    ) -> None:
        self.plane = plane
        self.repo = repo
        self.ref = ref  # a commit id (immutable mounts) or a branch name
        self.implicit = implicit  # attributes of directories that have no marker
        self.ttl = ttl  # None: listings never expire
        self._dirs: dict[str, Dir] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        # A writable mount passes its namespace lock: listings are then loaded under the
        # same lock as its own changes, so a listing never undoes a change made meanwhile.
        self._shared = lock
        self.lists = 0

    def is_implicit(self, entry: Entry | None) -> bool:
        return entry is self.implicit

    # -- listings ------------------------------------------------------------------
    def _fresh(self, d: Dir | None) -> bool:
        return d is not None and (self.ttl is None or time.monotonic() - d.loaded_at < self.ttl)

    def dir(self, path: str) -> Dir:
        """The listing of directory ``path`` ('' is the root), loaded when missing or expired."""
        d = self._dirs.get(path)
        if self._fresh(d):
            return d  # type: ignore[return-value]
        if self._shared is not None:
            lock = self._shared
        else:
            with self._guard:
                lock = self._locks.setdefault(path, threading.Lock())
        with lock:
            d = self._dirs.get(path)
            if self._fresh(d):
                return d  # type: ignore[return-value]
            try:
                new = self._load(path)
            except ServerGone:
                if d is None:
                    raise
                return d  # the server is away: an expired listing beats an error
            self._dirs[path] = new
            return new

    def cached(self, path: str) -> Dir | None:
        return self._dirs.get(path)

    def _load(self, path: str) -> Dir:
        prefix = path + "/" if path else ""
        children: dict[str, Entry] = {}
        implicit: list[str] = []
        after = ""
        started = time.monotonic()
        while True:
            page = self.plane.list(self.repo, self.ref, prefix, "/", after, LIST_PAGE)
            self.lists += 1
            for p, entry in page.entries:
                children[p[len(prefix) :]] = entry
            implicit.extend(p[len(prefix) : -1] for p in page.prefixes)
            if page.next_after is None:
                break
            after = page.next_after
        for name in implicit:
            existing = children.get(name)
            if existing is None or existing.kind != DIR:
                # A directory with contents wins over a file of the same name (possible in S3 key spaces).
                children[name] = self.implicit
        return Dir(children, started)

    def invalidate(self, path: str) -> None:
        self._dirs.pop(path, None)

    def invalidate_tree(self, path: str) -> None:
        """Forget the listings of ``path`` and everything below it."""
        below = path + "/"
        for p in list(self._dirs):
            if p == path or p.startswith(below) or (path == "" and p):
                self._dirs.pop(p, None)

    def set_loaded(self, path: str, children: dict[str, Entry]) -> None:
        """Record a listing known without asking (a directory just created is empty)."""
        self._dirs[path] = Dir(children, time.monotonic())

    # -- entries -------------------------------------------------------------------
    def lookup(self, path: str) -> Entry | None:
        """The entry at ``path`` ('' is the root), or None."""
        if path == "":
            return self.implicit
        parent, name = split(path)
        return self.dir(parent).children.get(name)

    def update(self, path: str, entry: Entry | None) -> None:
        """Reflect a change made through this mount in the cached parent listing (if loaded)."""
        parent, name = split(path)
        d = self._dirs.get(parent)
        if d is None:
            return
        if entry is None:
            if d.children.pop(name, None) is not None:
                d.changed()
        else:
            if d.children.get(name) is not entry:
                d.children[name] = entry
                d.changed()
        if entry is None or entry.kind != DIR:
            self._dirs.pop(path, None)
