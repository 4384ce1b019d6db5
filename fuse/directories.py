"""Directory handles: opendir (close-to-open on a branch), and listings served from the
cached directory tree merged with the files that exist only locally."""

from __future__ import annotations

import errno
import stat as S
from typing import Any

from fabric.format.filetypes import type_bits
from fabric.format.model import DIR
from fuse.attrs import Attributes
from fuse.errors import err
from fuse.state import MountState


class Directories:
    """Open directory handles (each pinned to a path) and what readdir lists through them."""

    def __init__(self, state: MountState, attrs: Attributes) -> None:
        self.state = state
        self.attrs = attrs
        self.paths: dict[int, str] = {}  # handle -> directory (readdir gets no path: nullpath_ok)
        self.snapshots: dict[int, list] = {}

    def opendir(self, p: str, fi: Any = None) -> int:
        st = self.state
        if not st.immutable:
            # Close-to-open: an opendir sees every change completed before it.
            st.ns.invalidate(p)
        e = st.ns.lookup(p) if p else st.implicit
        if e is None:
            raise err(errno.ENOENT)
        if e is not None and e.kind != DIR:
            raise err(errno.ENOTDIR)
        if fi is not None and st.immutable:
            fi.cache_readdir = 1
            fi.keep_cache = 1
        fh = st.handles.next_number()
        self.paths[fh] = p
        return fh

    def readdir(self, p: str, fh: int) -> list:
        """Names with their types (plain READDIR), of the directory open as ``fh`` (or ``p``)."""
        p = self.paths.get(fh, p)
        d = self.state.ns.dir(p)
        out: list = [(".", S.S_IFDIR, 0), ("..", S.S_IFDIR, 0)]
        names = d.children
        for name, e in list(names.items()):
            out.append((name, type_bits(e.kind), 0))
        files = self.state.files
        if files:
            prefix = p + "/" if p else ""
            for wp, wf in list(files.items()):
                if wp.startswith(prefix) and "/" not in wp[len(prefix) :] and wp[len(prefix) :] not in names and not wf.unlinked:
                    out.append((wp[len(prefix) :], S.S_IFREG, 0))
        return out

    def snapshot(self, fh: int, refresh: bool) -> list[tuple[str, dict[str, Any]]]:
        """Names with their attributes (READDIRPLUS: the kernel then needs no lookups),
        computed at the first call of a directory handle and served by offset after."""
        snap = self.snapshots.get(fh)
        if snap is None or refresh:
            snap = self.snapshots[fh] = [(".", {"st_mode": S.S_IFDIR}), ("..", {"st_mode": S.S_IFDIR})]
            snap += self._readdir_plus(fh)
        return snap

    def _readdir_plus(self, fh: int) -> list[tuple[str, dict[str, Any]]]:
        p = self.paths.get(fh, "")
        d = self.state.ns.dir(p)
        files = self.state.files
        prefix = p + "/" if p else ""
        out = []
        for name, e in list(d.children.items()):
            full = prefix + name
            wf = files.get(full)
            if wf is None:  # (a file staged and forgotten since the copy of the listing: its new entry)
                e = d.children.get(name, e)
            out.append((name, self.attrs.of_file(wf) if wf is not None else self.attrs.of_entry(full, e)))
        if files:
            for wp, wf in list(files.items()):
                name = wp[len(prefix) :]
                if wp.startswith(prefix) and "/" not in name and name not in d.children and not wf.unlinked:
                    out.append((name, self.attrs.of_file(wf)))
        return out

    def release(self, fh: int) -> None:
        self.paths.pop(fh, None)
        self.snapshots.pop(fh, None)
