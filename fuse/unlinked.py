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

libfuse decides to hide by its own count of open handles, which it lowers only after the
mount's ``release`` has returned; an unlink that comes in between (a program that closes a
file and unlinks it at once) is hidden although the mount has no handle left, and libfuse
may never unlink the hidden name (it marks the node hidden only after the rename returns).
So any rename onto an absent hidden name is taken as such an unlink, and the local state of
a hidden file is dropped as soon as it has no handle, whether or not libfuse unlinks it.

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
        self._hidden: dict[str, tuple[WFile, str]] = {}  # hidden name -> (file, the name it had)

    def hides(self, src: str, dst: str) -> bool:
        """Is a rename of ``src`` to ``dst`` libfuse hiding an open file (not a rename a program asked for)?"""
        return _HIDDEN.fullmatch(split(dst)[1]) is not None and self.state.entry(dst) is None

    def file(self, p: str | None) -> WFile | None:
        """The unlinked open file whose hidden name is ``p``, if it is one."""
        held = None if p is None else self._hidden.get(split(p)[1])
        return None if held is None else held[0]

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
        with st.mu:  # (as unlink does; not wf.lock, which a staging of it may hold while the server is away)
            wf.unlinked, wf.path = True, None
        with self._mu:
            self._hidden[split(hidden)[1]] = (wf, src)
        self.drop_closed()  # (its last handle may have been released meanwhile)

    def forget(self, hidden: str) -> None:
        """libfuse's unlink of the hidden name, at the last close."""
        with self._mu:
            held = self._hidden.pop(split(hidden)[1], None)
        if held is not None:
            self.writes.drop_soon(held[0])

    def drop_closed(self) -> None:
        """Forget the hidden files that no handle holds any more (after each ``release``)."""
        if not self._hidden:
            return
        handles = self.state.handles
        with self._mu:
            closed = [name for name, (wf, src) in self._hidden.items() if wf.opens == 0 and not handles.open_at(src)]
            dropped = [self._hidden.pop(name)[0] for name in closed]
        for wf in dropped:
            self.writes.drop_soon(wf)
