"""Open files whose name is gone: ``fstat``, I/O and attribute changes through their
descriptors until the last close.

The kernel sends the ``getattr`` of an ``fstat`` (and the ``chmod`` of an ``fchmod``) without
the file handle, and libfuse answers one for a node it has no path for with ESTALE. So the
mount lets libfuse keep the node of an open file that is unlinked (``hard_remove`` off):
libfuse renames it to a hidden name in its directory (``.fuse_hidden`` and 16 hex digits)
instead of unlinking it, and unlinks that name at the last close. :class:`Unlinked` turns
that rename into the unlink it stands for (staged at once, like any unlink) and keeps the
file's local state (:class:`~fuse.writer.WFile`, made for a file open only for reading)
under the hidden name: ``getattr`` shows it with ``st_nlink`` 0, attribute changes apply to
it, and nothing of it is staged again (:mod:`fuse.write_path` stages no unlinked file).
Hidden names are never staged or listed; they are kept by name alone (libfuse makes each
unique in the mount), so renaming a directory above one loses nothing.

A rename over a name that is open is, for libfuse, such an unlink of the target followed by
the rename: it is staged as two changes, not one.
"""

from __future__ import annotations

import errno
import re
import threading
from collections.abc import Callable

from fuse.errors import err
from fuse.namespace import split
from fuse.state import MountState
from fuse.write_path import WritePath
from fuse.writer import WFile

_HIDDEN = re.compile(r"\.fuse_hidden[0-9a-f]{16}")


class Unlinked:
    """The hidden names of unlinked open files, and the local state of each."""

    def __init__(self, state: MountState, writes: WritePath) -> None:
        self.state = state
        self.writes = writes
        self._mu = threading.Lock()
        self._hidden: dict[str, WFile] = {}

    def hides(self, src: str, dst: str) -> bool:
        """Is a rename of ``src`` to ``dst`` libfuse hiding an open file (not a rename a program asked for)?"""
        st = self.state
        return _HIDDEN.fullmatch(split(dst)[1]) is not None and st.handles.open_at(src) and st.entry(dst) is None

    def file(self, p: str | None) -> WFile | None:
        """The unlinked open file whose hidden name is ``p``, if it is one."""
        return None if p is None else self._hidden.get(split(p)[1])

    def hide(self, src: str, hidden: str, unlink: Callable[[str], None]) -> None:
        """``unlink(src)``, keeping the file's local state under the name ``hidden``."""
        st = self.state
        wf = st.files.get(src)
        if wf is None:  # open only for reading: its attributes, for the descriptors
            e = st.ns.lookup(src)
            if e is None:
                raise err(errno.ENOENT)
            uid = e.uid if e.uid is not None else st.cfg.uid
            gid = e.gid if e.gid is not None else st.cfg.gid
            wf = WFile(src, e, self.writes.write_dir or "", e.mode, uid, gid)  # (never written: no local copy)
        st.inodes.of_file(wf)  # (its st_ino, kept once it has no name)
        unlink(src)
        with wf.lock:
            wf.unlinked, wf.path = True, None
        with self._mu:
            self._hidden[split(hidden)[1]] = wf

    def forget(self, hidden: str) -> None:
        """libfuse's unlink of the hidden name, at the last close."""
        with self._mu:
            wf = self._hidden.pop(split(hidden)[1], None)
        if wf is not None:
            self.writes.maybe_drop(wf)
