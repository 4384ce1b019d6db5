"""Open handles of a mount: what each handle number the kernel holds stands for."""

from __future__ import annotations

import itertools

from fabric.format.model import Entry
from fuse.reader import FileReader
from fuse.writer import WFile


class RHandle:
    """A read handle pinned to one version of a file (snapshot isolation)."""

    __slots__ = ("entry", "path", "reader")

    def __init__(self, entry: Entry, reader: FileReader, path: str) -> None:
        self.entry = entry
        self.reader = reader
        self.path = path  # as opened (for attribute changes through the handle)


class WHandle:
    """A handle on a file with local state (opened for writing, or read while being written)."""

    __slots__ = ("reader", "reader_base", "wf", "writable")

    def __init__(self, wf: WFile, writable: bool) -> None:
        self.wf = wf
        self.writable = writable
        self.reader: FileReader | None = None  # reads of the unchanged base version
        self.reader_base: Entry | None = None


def content_sig(entry: Entry) -> tuple:
    """What identifies a version of a file, whether its chunk list is inline or an object."""
    if entry.md5:
        return (entry.size, entry.md5, entry.mtime_ns)
    return (entry.size, entry.mtime_ns, entry.chunklist, entry.chunks[:4])


class Handles:
    """Handle numbers (of files and directories) and the open file handles they stand for."""

    def __init__(self) -> None:
        self._open: dict[int, RHandle | WHandle] = {}
        self._numbers = itertools.count(1)

    def next_number(self) -> int:
        """A fresh handle number (directory handles take theirs here too)."""
        return next(self._numbers)

    def add(self, h: RHandle | WHandle) -> int:
        fh = self.next_number()
        self._open[fh] = h
        return fh

    def get(self, fh: int) -> RHandle | WHandle | None:
        return self._open.get(fh)

    def pop(self, fh: int) -> RHandle | WHandle | None:
        return self._open.pop(fh, None)

    def open_at(self, path: str) -> bool:
        """Is a file handle of the name ``path`` open?"""
        for h in list(self._open.values()):
            if (h.path if isinstance(h, RHandle) else h.wf.path) == path:
                return True
        return False

    def reading(self, path: str, sig: tuple) -> bool:
        """Is a read handle of the version ``sig`` of ``path`` open?"""
        return any(isinstance(h, RHandle) and h.path == path and content_sig(h.entry) == sig for h in list(self._open.values()))
