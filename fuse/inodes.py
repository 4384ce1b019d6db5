"""Inode numbers: the ``st_ino`` the mount reports for each name (libfuse passes them on: ``use_ino``).

The number of a name is derived from what it is, so it needs no table for most
names and is the same in every mount of one tree: the names of a hard-link group
(:mod:`fabric.format.links`) share the number of the group's id; any other name
has the number of its path; the root is 1. The session keeps the exceptions, so
that a name keeps its number as ext4 keeps it: a renamed name (and what was below
a renamed directory) keeps the number it had, a group keeps the number its first
name had before the link was made, and the last name of a dissolved group keeps
the group's. The table of renamed names is bounded (:data:`KEPT`, oldest forgotten
first); a forgotten name goes back to the number of its path.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable

from fabric.format.links import names
from fabric.format.model import Entry
from fuse.writer import WFile

ROOT = 1
#: Names kept with a number other than their own (renamed ones), at most.
KEPT = 1 << 20
_MASK = (1 << 62) - 1


def _number(kind: str, key: str) -> int:
    n = int.from_bytes(hashlib.blake2b(f"{kind}:{key}".encode("utf-8", "surrogateescape"), digest_size=8).digest(), "big")
    return (n & _MASK) or 2


class Inodes:
    """The ``st_ino`` of each name of one mount (see the module docstring)."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._paths: OrderedDict[str, int] = OrderedDict()  # names that kept another number
        self._groups: dict[str, int] = {}  # link id -> the number its first name had
        self._files: weakref.WeakKeyDictionary[WFile, int] = weakref.WeakKeyDictionary()

    def of(self, path: str, entry: Entry | None) -> int:
        """The number of the name ``path`` whose entry is ``entry``."""
        if path == "":
            return ROOT
        if entry is not None and names(path, entry):
            n = self._groups.get(entry.link)
            return n if n is not None else _number("link", entry.link)
        n = self._paths.get(path)
        return n if n is not None else _number("path", path)

    def of_file(self, wf: WFile) -> int:
        """The number of a file with local state (kept after it is unlinked)."""
        path = wf.path
        if path is None:
            n = self._files.get(wf)
            return n if n is not None else _number("file", str(id(wf)))
        n = self.of(path, wf.base)
        self._files[wf] = n
        return n

    def grouped(self, link: str, number: int) -> None:
        """A new group ``link`` keeps the number its first name had."""
        with self._mu:
            self._groups.setdefault(link, number)

    def keep(self, path: str, number: int) -> None:
        """Name ``path`` keeps ``number`` (the last name of a dissolved group)."""
        with self._mu:
            self._remember(path, number)

    def renamed(self, moves: Iterable[tuple[str, str, Entry | None]]) -> None:
        """``(old, new, entry)`` for each name moved by one rename: the new names keep their numbers."""
        moves = list(moves)
        with self._mu:
            kept = [(new, self.of(old, entry)) for old, new, entry in moves if not names(old, entry)]
            for old, _, _ in moves:
                self._paths.pop(old, None)
            for new, n in kept:
                self._remember(new, n)

    def _remember(self, path: str, number: int) -> None:
        self._paths[path] = number
        self._paths.move_to_end(path)
        while len(self._paths) > KEPT:
            self._paths.popitem(last=False)
