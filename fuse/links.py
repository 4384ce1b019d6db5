"""Hard links of a ``--rw`` mount: the ``link`` callback (how the names of a group are
stored and kept one file: :mod:`fuse.linkgroups`)."""

from __future__ import annotations

import errno
import time

from fabric.format.links import linked, new_link_id
from fabric.format.model import DIR, FILE, Entry
from fabric.format.paths import check_path
from fuse.errors import err
from fuse.linkgroups import invalidate, members, others, refresh_local
from fuse.namespace import split
from fuse.read_path import ReadPath
from fuse.state import MountState
from fuse.write_path import WritePath


class Links:
    """The ``link`` callback."""

    def __init__(self, state: MountState, writes: WritePath, reads: ReadPath) -> None:
        self.state = state
        self.writes = writes
        self.reads = reads

    def link(self, src: str, dst: str) -> None:
        """Make ``dst`` a new name of the file (or symlink) at ``src``."""
        st = self.state
        st.need_rw()
        check_path(dst)
        wf = st.files.get(src)
        if wf is not None:
            self.writes.sync(wf)  # its content goes to every name: stage it first
        with st.names.hold(src, dst, *others(st, src)):
            se = st.entry(src)
            if se is None:
                raise err(errno.ENOENT)
            if st.entry(dst) is not None:
                raise err(errno.EEXIST)
            if se.kind == DIR:
                raise err(errno.EPERM)
            parent = split(dst)[0]
            pe = st.entry(parent) if parent else st.implicit
            if pe is None:
                raise err(errno.ENOENT)
            if pe.kind != DIR:
                raise err(errno.ENOTDIR)
            e = self.reads.fresh_entry(src) if se.kind == FILE else se
            if e is None:
                raise err(errno.ENOENT)
            group = members(st, src, e) or [src]
            link = e.link if len(group) > 1 else new_link_id()
            if len(group) == 1:
                st.inodes.grouped(link, st.inodes.of(src, e))
            now = time.time_ns()
            after = linked(e, link, [*group, dst]).with_(ctime_ns=now)  # (a new name changes the inode)
            changes: dict[str, Entry | None] = dict.fromkeys([*group, dst], after)
            st.touch_dir(parent, now, changes)
            st.stage(changes)
            with st.mu:
                refresh_local(st, changes, dst)
                for n in changes:
                    t = st.times.get(n)
                    if t:
                        t.pop("ctime", None)  # the staged one holds
            invalidate(st, changes, dst)
