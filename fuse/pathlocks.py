"""Locks on the names of a mount, so that changes wait only for changes they conflict with.

A change of the namespace (create, mkdir, unlink, rename, staging a file, ...)
holds each path it changes exclusively and every ancestor of those paths
shared. So two creates of one name, an unlink during a create, or a create
inside a directory being removed or renamed take turns, while changes in
other directories, or of other names in one directory, go on together. All
the locks of one :meth:`PathLocks.hold` are taken at once (all or none), so
two holders never deadlock on each other's paths. A holder may make network
calls; it must not call :meth:`hold` again before it lets go (not reentrant).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


def ancestors(path: str) -> list[str]:
    """``'a/b/c'`` -> ``['a', 'a/b']`` (the root '' is never locked)."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class PathLocks:
    """Exclusive locks on changed paths, shared locks on their ancestors (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._exclusive: set[str] = set()
        self._shared: dict[str, int] = {}

    def _free(self, exclusive: set[str], shared: set[str]) -> bool:
        return not any(p in self._exclusive or p in self._shared for p in exclusive) and not any(p in self._exclusive for p in shared)

    @contextmanager
    def hold(self, *paths: str) -> Iterator[None]:
        """Hold ``paths`` exclusively and their ancestors shared for the ``with`` block."""
        exclusive = set(paths)
        shared = {a for p in paths for a in ancestors(p)} - exclusive
        with self._cond:
            self._cond.wait_for(lambda: self._free(exclusive, shared))
            self._exclusive |= exclusive
            for p in shared:
                self._shared[p] = self._shared.get(p, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._exclusive -= exclusive
                for p in shared:
                    n = self._shared[p] - 1
                    if n:
                        self._shared[p] = n
                    else:
                        del self._shared[p]
                self._cond.notify_all()
