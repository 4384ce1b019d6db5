"""Namespace changes of a ``--rw`` mount: mkdir, rmdir, unlink, symlink, mknod of special
files (FIFOs, sockets, devices) and rename.

Each change is staged at once, as one atomic
:meth:`~fabric.plane.dataplane.DataPlane.stage` call, holding the names it
changes (``MountState.names``: the changed paths exclusively, their ancestors
shared) across its network calls; the cached listings (:mod:`fuse.namespace`)
and the local tables (files being written, session times, kernel cache
signatures) follow it under the short table lock ``MountState.mu``. So a change
waits only for changes of the same names, never for a round trip elsewhere.

A directory that shadows a file or symlink of the same name
(:mod:`fabric.format.namespace`) is removed or moved without touching the hidden
entry, and no directory marker is written over it.
"""

from __future__ import annotations

import errno
import time

from fabric.format.filetypes import kind_of_mode
from fabric.format.model import BLOCKDEV, CHARDEV, DIR, FILE, SPECIAL_KINDS, SYMLINK, Entry
from fabric.format.paths import check_path
from fabric.plane.dataplane import DataPlane
from fuse import linkgroups
from fuse.errors import err
from fuse.namespace import split
from fuse.read_path import ReadPath
from fuse.state import MountState
from fuse.write_path import WritePath

RENAME_NOREPLACE = 1


class NamespaceChanges:
    """Creating, removing and moving names on the branch."""

    def __init__(self, state: MountState, writes: WritePath, reads: ReadPath) -> None:
        self.state = state
        self.writes = writes
        self.reads = reads

    def _keep_parent(self, p: str, changes: dict[str, Entry | None]) -> None:
        """Removing ``p`` may empty an implicit parent directory: give it a marker so it stays
        (unless the parent shadows a file or symlink, which a marker would overwrite)."""
        st = self.state
        parent, _ = split(p)
        if parent and parent not in changes:
            pe = st.ns.lookup(parent)
            if st.ns.is_implicit(pe):
                if st.ns.shadows(parent):
                    st.ns.invalidate(split(parent)[0])  # the hidden entry may show again: list anew
                    return
                now = time.time_ns()
                changes[parent] = Entry(DIR, 0, st.implicit.mode, now, uid=st.implicit.uid, gid=st.implicit.gid)

    def _created(self, p: str, entry: Entry) -> None:
        """Stage a new entry at ``p`` (its name held), with its directory's new times, and record it."""
        st = self.state
        changes: dict[str, Entry | None] = {p: entry}
        st.touch_dir(split(p)[0], entry.mtime_ns, changes)
        st.stage(changes)
        with st.mu:
            st.times.pop(p, None)

    def _touch_parent(self, p: str) -> None:
        """Stage the new times of ``p``'s directory alone (``p`` held; nothing else to stage)."""
        st = self.state
        changes: dict[str, Entry | None] = {}
        st.touch_dir(split(p)[0], time.time_ns(), changes)
        if changes:
            st.stage(changes)

    def mkdir(self, p: str, mode: int) -> None:
        st = self.state
        st.need_rw()
        with st.names.hold(p):
            st.check_new(p)
            uid, gid, mode = st.new_owner(p, mode & 0o7777, True)
            self._created(p, Entry(DIR, 0, mode, time.time_ns(), uid=uid, gid=gid))
            st.ns.set_loaded(p, {})

    def symlink(self, p: str, target: str) -> None:
        st = self.state
        st.need_rw()
        try:
            size = len(target.encode("utf-8"))
        except UnicodeEncodeError:
            raise err(errno.EILSEQ) from None
        with st.names.hold(p):
            st.check_new(p)
            uid, gid, _ = st.new_owner(p, 0o777, False)
            self._created(p, Entry(SYMLINK, size, 0o777, time.time_ns(), uid=uid, gid=gid, target=target))

    def mknod(self, p: str, mode: int, dev: int) -> None:
        """A FIFO, socket (``bind``) or device node: an entry with no content. The kernel has
        checked the caller may make a device (CAP_MKNOD), as for ext4."""
        st = self.state
        st.need_rw()
        kind = kind_of_mode(mode)
        if kind not in SPECIAL_KINDS:
            raise err(errno.EINVAL)
        with st.names.hold(p):
            st.check_new(p)
            uid, gid, perms = st.new_owner(p, mode & 0o7777, False)
            rdev = dev if kind in (CHARDEV, BLOCKDEV) else 0
            self._created(p, Entry(kind, 0, perms, time.time_ns(), uid=uid, gid=gid, rdev=rdev))

    def rmdir(self, p: str) -> None:
        st = self.state
        st.need_rw()
        if p == "":
            raise err(errno.EBUSY)
        with st.names.hold(p):
            e = st.ns.lookup(p)
            if e is None:
                raise err(errno.ENOENT)
            if e.kind != DIR:
                raise err(errno.ENOTDIR)
            st.ns.invalidate(p)
            if st.ns.dir(p).children or any(w.startswith(p + "/") for w in list(st.files)):
                raise err(errno.ENOTEMPTY)
            changes: dict[str, Entry | None] = {}
            if st.ns.shadows(p):
                st.ns.invalidate(split(p)[0])  # nothing below it any more: the hidden entry shows
            else:
                changes[p] = None
                self._keep_parent(p, changes)
            st.touch_dir(split(p)[0], time.time_ns(), changes)
            if changes:
                st.stage(changes)
            with st.mu:
                st.times.pop(p, None)

    def unlink(self, p: str) -> None:
        st = self.state
        st.need_rw()
        with st.names.hold(p, *linkgroups.others(st, p)):  # (and the file's other names)
            wf = st.files.get(p)
            if wf is None:
                e = st.ns.lookup(p)
                if e is None:
                    raise err(errno.ENOENT)
                if e.kind == DIR:
                    raise err(errno.EISDIR)
            if wf is None or wf.on_server:
                changes: dict[str, Entry | None] = {p: None}
                linkgroups.dropped(st, p, e if wf is None else wf.base, changes)  # its other names stay
                self._keep_parent(p, changes)
                st.touch_dir(split(p)[0], time.time_ns(), changes)
                st.stage(changes)
                linkgroups.refresh_local(st, changes, p)
                linkgroups.invalidate(st, changes, p)
            with st.mu:
                if wf is not None:
                    if st.files.get(p) is wf:
                        del st.files[p]
                    wf.unlinked = True
                    wf.path = None
                st.times.pop(p, None)
                st.kernel_sig.pop(p, None)
                st.kernel_attrs.pop(p, None)
            if wf is not None:
                self.writes.discard(wf)  # (a --writeback mount killed now never brings it back)
            if wf is not None and not wf.on_server:
                self._touch_parent(p)  # (the new file's pending change of its directory with it)
        if wf is not None:
            self.writes.drop_soon(wf)

    def rename(self, src: str, dst: str, flags: int = 0) -> None:
        st = self.state
        st.need_rw()
        if flags & ~RENAME_NOREPLACE:
            raise err(errno.EINVAL)  # RENAME_EXCHANGE / RENAME_WHITEOUT
        check_path(dst)
        if src == dst or self._rename_parked(src, dst, flags):
            return
        # Stage what is still local first (before holding the names: uploads can be long).
        for wp, wf in list(st.files.items()):
            if wp == src or wp.startswith(src + "/"):
                self.writes.sync(wf)
        with st.names.hold(src, dst, *linkgroups.others(st, src), *linkgroups.others(st, dst)):
            se = st.entry(src)
            if se is None:
                raise err(errno.ENOENT)
            de = st.entry(dst)
            if de is not None and flags & RENAME_NOREPLACE:
                raise err(errno.EEXIST)
            if de is not None and linkgroups.one_file(st, src, dst):
                return  # two names of one file: rename does nothing (POSIX)
            changes: dict[str, Entry | None] = {}
            now = time.time_ns()
            moves: list[tuple[str, str, Entry | None]] = [(src, dst, linkgroups.known(st, src) or se)]
            if se.kind == DIR:
                if de is not None:
                    if de.kind != DIR:
                        raise err(errno.ENOTDIR)
                    st.ns.invalidate(dst)
                    if st.ns.dir(dst).children or any(w.startswith(dst + "/") for w in list(st.files)):
                        raise err(errno.ENOTEMPTY)
                moved = self._walk_fresh(src)
                for path, _ in moved:
                    changes[path] = None
                for path, e in moved:
                    changes[dst + path[len(src) :]] = e
                moves += [(path, dst + path[len(src) :], e) for path, e in moved]
                linkgroups.renamed(st, {old: new for old, new, _ in moves}, dict(moved), changes)
                if not st.ns.shadows(src):
                    changes[src] = None  # (a shadowed file or symlink stays where it is)
                # (an implicit directory gets a marker: it holds the moved directory's new ctime)
                changes[dst] = Entry(DIR, 0, se.mode, se.mtime_ns, uid=se.uid, gid=se.gid) if st.ns.is_implicit(se) else se
            else:
                if de is not None and de.kind == DIR:
                    raise err(errno.EISDIR)
                fe = self.reads.fresh_entry(src) if se.kind == FILE else se
                if fe is None:
                    raise err(errno.ENOENT)
                changes[src] = None
                changes[dst] = fe
                if de is not None:
                    linkgroups.dropped(st, dst, linkgroups.known(st, dst), changes)  # replaced: its other names stay
                linkgroups.renamed(st, {src: dst}, {src: fe}, changes)
            self._keep_parent(src, changes)
            moved_entry = changes.get(dst)
            if moved_entry is not None:
                changes[dst] = moved_entry.with_(ctime_ns=now)  # a rename changes the moved entry's ctime
            st.touch_dir(split(src)[0], now, changes)
            st.touch_dir(split(dst)[0], now, changes)
            st.plane.stage(st.repo, st.branch, changes)
            with st.mu:
                # Caches: listings below both names are stale; parents get the moved entries.
                st.ns.invalidate_tree(src)
                st.ns.invalidate_tree(dst)
                for path, e in changes.items():
                    st.ns.update(path, e)
                if src not in changes:
                    st.ns.invalidate(split(src)[0])  # the shadowed entry shows again
                self._move_local(src, dst, se.kind == DIR, now)
                st.inodes.renamed(moves)
                linkgroups.refresh_local(st, changes, "")
            linkgroups.invalidate(st, changes, dst)

    def _rename_parked(self, src: str, dst: str, flags: int) -> bool:
        """With ``--writeback``: rename a file that exists only on this mount (never staged) to a
        name of its directory without the server; its journal record takes the new name and it
        is staged there later (a checkpoint's ``.metadata.tmp`` -> ``.metadata``). The name may
        hold a file with one name, which the staging replaces on the branch (a save to
        ``latest.pt.tmp`` renamed over ``latest.pt``); a parked version of that file is
        superseded, its record kept until the moved file's record is written. False when the
        rename needs the general path."""
        st = self.state
        writeback = self.writes.writeback
        if writeback is None or split(src)[0] != split(dst)[0]:
            return False
        with st.names.hold(src, dst):
            wf = st.files.get(src)
            if wf is None or wf.on_server or wf.unlinked:
                return False
            replaced = st.entry(dst)
            if replaced is not None and (replaced.kind != FILE or replaced.link or flags & RENAME_NOREPLACE or st.ns.shadows(dst)):
                return False  # (a directory, a name of a hard-linked file, EEXIST: the general path)
            old = st.files.get(dst)
            now = time.time_ns()
            with st.mu:
                self._move_local(src, dst, False, now)  # (an old local file at dst: unlinked, still open where it is)
                st.inodes.renamed([(src, dst, wf.stat_entry())])
                st.bump_dir(split(dst)[0], now)
                wf.dir_touched = now  # (its directory's new times are staged with it)
            if old is not None:
                writeback.supersede(old, wf)
            writeback.moved(wf)
        return True

    def _walk_fresh(self, d: str) -> list[tuple[str, Entry]]:
        """Every entry below directory ``d`` as the branch has it now (the walk retried as a whole)."""
        st = self.state

        def walk(plane: DataPlane) -> list[tuple[str, Entry]]:
            return list(plane.walk(st.repo, st.branch, d + "/"))

        return st.plane.retried(walk)

    def _move_local(self, src: str, dst: str, is_dir: bool, now: int) -> None:
        """Carry local state (open files, session times, kernel cache signatures) to the new name."""
        st = self.state

        def moved(p: str) -> str | None:
            if p == src:
                return dst
            if is_dir and p.startswith(src + "/"):
                return dst + p[len(src) :]
            return None

        for table in (st.files, st.times, st.kernel_sig, st.kernel_attrs):
            for p in [p for p in table if p == dst or (is_dir and p.startswith(dst + "/"))]:
                if table is st.files:
                    w = st.files.pop(p)
                    w.unlinked, w.path = True, None
                else:
                    table.pop(p)
            for p in [p for p in table if moved(p) is not None]:
                q = moved(p)
                value = table.pop(p)
                table[q] = value  # type: ignore[index]
                if table is st.files:
                    value.path = q  # type: ignore[union-attr]
        w = st.files.get(dst)  # (the entry staged at dst has this ctime)
        if w is not None:
            w.ctime_ns = now
