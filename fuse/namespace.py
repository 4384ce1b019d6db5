"""The directory tree of a mount, built from listings of the repository's flat key space.

A repository maps paths to entries; directories exist either as explicit
markers (entries of kind ``dir``, written by ``mkdir`` or for empty
directories) or implicitly, as the common prefix of the paths below them.
:class:`Namespace` lists one directory at a time
(``list(prefix='a/b/', delimiter='/')``, whole entries with their chunk
lists) and caches the result: forever for an immutable commit or tag, for
``ttl`` seconds at a branch (and anew on every ``opendir``: close-to-open).

What a listing shows follows the namespace rule of every file-system view
(:func:`fabric.format.namespace.visible`): where keys ``a`` and ``a/b``
coexist, the directory ``a`` shadows the file or symlink ``a``; each name is
listed once. :attr:`Dir.shadowed` keeps the names whose entry is hidden, so
that changes through the mount never overwrite what nobody can see.

Thread safety: the cached listings are changed under a short internal lock
that is never held across a network call. A listing is loaded without it; the
changes this mount makes to that directory's entries while it loads
(:meth:`Namespace.update`) are applied to it before it is kept or returned
(the server may have answered before them). If the directory was forgotten
meanwhile (:meth:`Namespace.invalidate`: it changed elsewhere), it is listed
again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabric.format.model import DIR, FILE, Entry
from fabric.format.namespace import visible
from fabric.plane.retry import RetryingPlane, ServerGone
from fuse.outage import acquire

LIST_PAGE = 10_000
#: Listings of one directory in a row before a directory forgotten while it loads is
#: served anyway (not kept): it keeps changing elsewhere.
LOAD_TRIES = 3
#: Opens remembered per sibling order: a scan by two readers in parallel (interleaved) is still one.
RECENT_OPENS = 2


@dataclass
class SiblingOrder:
    """A directory's files in one order, and how far a reader going through them got."""

    names: list[str]
    index: dict[str, int] = field(init=False)
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_OPENS))  # positions opened last
    prefetched_to: int = -1  # the last position whose chunks were asked for
    score: float = 0.0  # how often opens continued this order lately (0 to 1)
    forward: int = 0  # opens in a row, each further on than the one before (gaps allowed)
    topped_to: int = -1  # the last position named in a top-up hint

    def __post_init__(self) -> None:
        self.index = {n: i for i, n in enumerate(self.names)}

    def opened(self, name: str) -> bool:
        """Note an open of ``name``; whether it continues this order: the file before it was
        among the last few opened (readers in parallel interleave), or it lies in the window
        already fetched ahead."""
        i = self.index.get(name)
        if i is None:
            return False
        continued = (i - 1) in self.recent or i <= self.prefetched_to
        self.forward = self.forward + 1 if not self.recent or i > self.recent[-1] else 0
        self.recent.append(i)
        self.score = 0.75 * self.score + (0.25 if continued else 0.0)
        return continued


@dataclass
class Dir:
    """One listed directory: child name -> entry (implicit directories share ``Namespace.implicit``)."""

    children: dict[str, Entry]
    loaded_at: float
    #: Names whose file or symlink a directory of the same name shadows (hidden from the view).
    shadowed: frozenset[str] = frozenset()
    #: Sibling readahead: the directory's files in each order a reader may go through them.
    _orders: dict[str, SiblingOrder] = field(default_factory=dict)

    def order(self, name: str, key: Callable[[str], Any] | None = None) -> SiblingOrder:
        """The files in the order ``name``, sorted by ``key`` of their names (by name if None);
        computed once until the directory changes."""
        order = self._orders.get(name)
        if order is None:
            files = [n for n, e in list(self.children.items()) if e.kind == FILE]
            order = self._orders[name] = SiblingOrder(sorted(files, key=key))
        return order

    _subdirs: int | None = None

    def changed(self) -> None:
        self._orders = {}
        self._subdirs = None

    def subdirs(self) -> int:
        if self._subdirs is None:
            self._subdirs = sum(1 for e in list(self.children.values()) if e.kind == DIR)
        return self._subdirs


def join(parent: str, name: str) -> str:
    """``('a/b', 'c')`` -> ``'a/b/c'``; ``('', 'c')`` -> ``'c'`` (the inverse of :func:`split`)."""
    return f"{parent}/{name}" if parent else name


def split(path: str) -> tuple[str, str]:
    """``'a/b/c'`` -> ``('a/b', 'c')``; ``'c'`` -> ``('', 'c')``."""
    head, _, tail = path.rpartition("/")
    return head, tail


class Namespace:
    def __init__(self, plane: RetryingPlane, repo: str, ref: str, implicit: Entry, ttl: float | None) -> None:
        self.plane = plane
        self.repo = repo
        self.ref = ref  # a commit id (immutable mounts) or a branch name
        self.implicit = implicit  # attributes of directories that have no marker
        self.ttl = ttl  # None: listings never expire
        self._dirs: dict[str, Dir] = {}
        self._loading: dict[str, threading.Lock] = {}  # one load of a directory at a time
        self._guard = threading.Lock()  # the tables below and above; never held across a network call
        self._versions: dict[str, int] = {}  # directory -> count of times its listing was forgotten or set
        #: Directory being loaded -> the entries this mount changed in it since (name -> entry, None: gone).
        self._loads: dict[str, dict[str, Entry | None]] = {}
        self._epoch = 0  # bumped when whole subtrees are forgotten
        self.lists = 0

    def is_implicit(self, entry: Entry | None) -> bool:
        return entry is self.implicit

    # -- listings ------------------------------------------------------------------
    def _fresh(self, d: Dir | None) -> bool:
        return d is not None and (self.ttl is None or time.monotonic() - d.loaded_at < self.ttl)

    def _changed(self, path: str) -> None:
        """Record that ``path``'s listing was forgotten or set (``_guard`` held): a load in flight
        is not kept."""
        self._versions[path] = self._versions.get(path, 0) + 1

    def dir(self, path: str) -> Dir:
        """The listing of directory ``path`` ('' is the root), loaded when missing or expired."""
        d = self._dirs.get(path)
        if self._fresh(d):
            return d  # type: ignore[return-value]
        with self._guard:
            lock = self._loading.setdefault(path, threading.Lock())
        try:
            # Its holder may be waiting for the server: so may this thread then (fuse.outage).
            acquire(getattr(self.plane, "health", None), lock)
        except ServerGone:
            if d is None:
                raise
            return d  # the server is away: an expired listing beats an error
        try:
            d = self._dirs.get(path)
            if self._fresh(d):
                return d  # type: ignore[return-value]
            for _ in range(LOAD_TRIES):
                with self._guard:
                    seen = (self._versions.get(path, 0), self._epoch)
                    made_here = self._loads[path] = {}
                try:
                    new = self._load(path)
                except ServerGone:
                    if d is None:
                        raise
                    return d  # the server is away: an expired listing beats an error
                finally:
                    with self._guard:
                        del self._loads[path]
                with self._guard:
                    for name, entry in made_here.items():
                        _apply(new, name, entry)
                    if (self._versions.get(path, 0), self._epoch) == seen:
                        self._dirs[path] = new
                        return new
                    current = self._dirs.get(path)
                    if self._fresh(current):
                        return current  # type: ignore[return-value]  # (known without asking meanwhile)
            return new
        finally:
            lock.release()

    def cached(self, path: str) -> Dir | None:
        return self._dirs.get(path)

    def _load(self, path: str) -> Dir:
        prefix = path + "/" if path else ""
        items: list[tuple[str, Entry]] = []
        after = ""
        started = time.monotonic()
        while True:
            page = self.plane.list(self.repo, self.ref, prefix, "/", after, LIST_PAGE)
            self.lists += 1
            items.extend(page.entries)
            items.extend((p, self.implicit) for p in page.prefixes)  # 'a/': a directory with contents
            if page.next_after is None:
                break
            after = page.next_after
        items.sort(key=lambda item: item[0])
        hidden: list[str] = []
        children: dict[str, Entry] = {}
        for p, entry in visible(items, hidden):
            name = p[len(prefix) :].rstrip("/")
            # A directory marker comes before the common prefix of its contents: it is kept.
            children.setdefault(name, entry)
        return Dir(children, started, frozenset(p[len(prefix) :] for p in hidden))

    def invalidate(self, path: str) -> None:
        with self._guard:
            self._dirs.pop(path, None)
            self._changed(path)

    def invalidate_tree(self, path: str) -> None:
        """Forget the listings of ``path`` and everything below it."""
        below = path + "/"
        with self._guard:
            for p in list(self._dirs):
                if p == path or p.startswith(below) or (path == "" and p):
                    self._dirs.pop(p, None)
            self._epoch += 1

    def set_loaded(self, path: str, children: dict[str, Entry]) -> None:
        """Record a listing known without asking (a directory just created is empty)."""
        with self._guard:
            self._dirs[path] = Dir(children, time.monotonic())
            self._changed(path)

    # -- entries -------------------------------------------------------------------
    def lookup(self, path: str) -> Entry | None:
        """The entry at ``path`` ('' is the root) as the view shows it, or None."""
        if path == "":
            return self.implicit
        parent, name = split(path)
        return self.dir(parent).children.get(name)

    def shadows(self, path: str) -> bool:
        """Does the directory the view shows at ``path`` hide a file or symlink of that name
        (by the listing of its parent; False if that is not loaded)?"""
        parent, name = split(path)
        d = self._dirs.get(parent)
        return d is not None and name in d.shadowed

    def has_below(self, ref: str, path: str) -> bool:
        """Is anything stored under ``path/`` at ``ref`` now (one short listing)?"""
        page = self.plane.list(self.repo, ref, path + "/", "/", "", 1)
        return bool(page.entries or page.prefixes)

    def update(self, path: str, entry: Entry | None) -> None:
        """Reflect a change made through this mount in the cached parent listing (if loaded)
        and in a listing of the parent now loading."""
        parent, name = split(path)
        with self._guard:
            if entry is None or entry.kind != DIR:
                self._dirs.pop(path, None)
                self._changed(path)
            loading = self._loads.get(parent)
            if loading is not None:
                loading[name] = entry
            d = self._dirs.get(parent)
            if d is not None:
                _apply(d, name, entry)


def _apply(d: Dir, name: str, entry: Entry | None) -> None:
    """Put ``entry`` at ``name`` in listing ``d`` (None: remove it); the name shows then."""
    if entry is None:
        if d.children.pop(name, None) is not None:
            d.changed()
    elif d.children.get(name) is not entry:
        d.children[name] = entry
        d.changed()
    if name in d.shadowed:
        d.shadowed = d.shadowed - {name}
