"""Attributes: what ``stat`` shows of entries, local files and the root, and the
attribute changes (chmod, chown, utimens), staged at once as one entry each.

Times: mtime and ctime are stored with each entry (a directory whose entries
are created, removed or renamed gets a marker with its new times,
:meth:`~fuse.state.MountState.touch_dir`); atime is kept by the mount for the
session (``MountState.times``), and so are the times of the root (it has no
entry) and of a directory that shadows a file of its name.
"""

from __future__ import annotations

import errno
import logging
import stat as S
import time
from collections.abc import Callable
from typing import Any

from fabric.errors import NotFound
from fabric.format.filetypes import type_bits
from fabric.format.links import nlink as link_count
from fabric.format.model import DIR, FILE, HOLE_ID, SYMLINK, Entry
from fabric.format.paths import MAX_NAME_BYTES
from fabric.plane.retry import ServerGone
from fuse import linkgroups
from fuse.errors import err
from fuse.handles import RHandle, WHandle, content_sig
from fuse.inodes import ROOT
from fuse.namespace import split
from fuse.state import MountState
from fuse.unlinked import Unlinked
from fuse.write_path import WritePath
from fuse.writer import WFile

BLKSIZE = 1024 * 1024
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2

log = logging.getLogger("fabric.fuse")


def stored_size(e: Entry, size: int) -> int:
    """The bytes entry ``e`` of ``size`` bytes occupies (``st_blocks``): a sparse file's holes
    occupy none (when its chunk list is at hand)."""
    if e.kind == FILE and e.chunks:
        return sum(n for cid, n in e.chunks if cid != HOLE_ID)
    return size


def too_long(p: str) -> bool:
    """Does a name of path ``p`` exceed NAME_MAX (255 bytes, as on ext4)?"""
    return any(len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for name in p.split("/"))


class Attributes:
    """getattr, readlink, statfs and the attribute changes of a mount."""

    def __init__(self, state: MountState, writes: WritePath, unlinked: Unlinked) -> None:
        self.state = state
        self.writes = writes
        self.unlinked = unlinked  # open files whose name is gone, under libfuse's hidden names

    # -- what stat shows ---------------------------------------------------------------
    def of_entry(self, path: str, e: Entry) -> dict[str, Any]:
        """The attributes of entry ``e`` at ``path``, with the session's times."""
        kind = e.kind
        t = self.state.times.get(path)
        mtime = e.mtime_ns
        if kind == DIR:
            mode = S.S_IFDIR | (e.mode & 0o7777)
            # Exact when the listing is at hand; else 1, which tools read as "not counted"
            # (never an undercount, which would make find skip subdirectories).
            d = self.state.ns.cached(path)
            nlink = 2 + d.subdirs() if d is not None else 1
            size = 4096
        elif kind == SYMLINK:
            mode = S.S_IFLNK | 0o777
            nlink = link_count(path, e)
            size = len(e.target.encode("utf-8", "surrogateescape"))
        else:
            mode = type_bits(kind) | (e.mode & 0o7777)  # a file, FIFO, socket or device
            nlink = link_count(path, e)
            size = e.size
            if kind == FILE and not self.state.immutable:
                self.state.kernel_attrs[path] = content_sig(e)  # (the size the kernel is told: ReadPath.open)
        ctime = e.mtime_ns if e.ctime_ns is None else e.ctime_ns
        if t:
            mtime = t.get("mtime", mtime)
            ctime = t.get("ctime", ctime)
        return {
            "st_rdev": e.rdev,
            "st_ino": self.state.inodes.of(path, e),
            "st_mode": mode,
            "st_nlink": nlink,
            "st_size": size,
            "st_uid": e.uid if e.uid is not None else self.state.cfg.uid,
            "st_gid": e.gid if e.gid is not None else self.state.cfg.gid,
            "st_mtime": mtime,
            "st_atime": t.get("atime", mtime) if t else mtime,
            "st_ctime": ctime,
            "st_blocks": (stored_size(e, size) + 511) // 512,
            "st_blksize": BLKSIZE,
        }

    def of_file(self, wf: WFile) -> dict[str, Any]:
        """The attributes of a file with local state."""
        return {
            "st_ino": self.state.inodes.of_file(wf),
            "st_mode": S.S_IFREG | (wf.mode & 0o7777),
            "st_nlink": 0 if wf.unlinked else link_count(wf.path or "", wf.base),
            "st_size": wf.size,
            "st_uid": wf.uid,
            "st_gid": wf.gid,
            "st_mtime": wf.mtime_ns,
            "st_atime": wf.atime_ns,
            "st_ctime": wf.ctime_ns,
            "st_blocks": (wf.size + 511) // 512,
            "st_blksize": BLKSIZE,
        }

    def of_root(self) -> dict[str, Any]:
        r = self.state.root
        return {
            "st_ino": ROOT,
            "st_mode": S.S_IFDIR | r["mode"],
            "st_nlink": 2 + d.subdirs() if (d := self.state.ns.cached("")) is not None else 1,
            "st_size": 4096,
            "st_uid": r["uid"],
            "st_gid": r["gid"],
            "st_mtime": r["mtime"],
            "st_atime": r["atime"],
            "st_ctime": r["ctime"],
            "st_blocks": 8,
            "st_blksize": BLKSIZE,
        }

    def getattr(self, p: str | None, fi: Any = None) -> dict[str, Any]:
        st = self.state
        if fi is not None:
            h = st.handles.get(fi.fh)
            if isinstance(h, WHandle):
                return self.of_file(h.wf)
            if isinstance(h, RHandle) and p is None:
                return self.of_entry(h.path, h.entry)
        if p is None:
            raise err(errno.ENOENT)
        if too_long(p):
            raise err(errno.ENAMETOOLONG)  # every call looks its names up first: before ENOENT, EEXIST, EPERM
        if p == "":
            if st.ns.cached("") is None:
                self._count_subdirs("")
            return self.of_root()
        wf = st.files.get(p) or self.unlinked.file(p)
        if wf is not None:
            return self.of_file(wf)
        e = st.ns.lookup(p)
        if e is None and st.branch is not None and not st.writable:
            # Close-to-open for names too: a name the cached listing lacks may have been
            # created since; ask (the kernel caches the answer for --attr-timeout).
            try:
                e = st.plane.stat(st.repo, st.branch, p)
            except NotFound:
                e = None
            if e is not None:
                st.ns.invalidate(split(p)[0])
                if e.kind != DIR and st.ns.has_below(st.branch, p):
                    e = st.implicit  # a directory of the same name shadows it
        if e is None:
            raise err(errno.ENOENT)
        if e.kind == DIR and st.ns.cached(p) is None:
            self._count_subdirs(p)
        return self.of_entry(p, e)

    def _count_subdirs(self, p: str) -> None:
        """List directory ``p`` so that its ``st_nlink`` (2 + subdirectories, as ext4) is exact;
        one listing per directory, kept for its ``opendir`` (listings of a READDIRPLUS are not
        loaded: there an unlisted subdirectory counts 1, "not counted")."""
        try:
            self.state.ns.dir(p)
        except ServerGone:
            pass  # 1 it is: never an error for a stat

    def readlink(self, p: str) -> str:
        e = self.state.entry(p)
        if e is None:
            raise err(errno.ENOENT)
        if e.kind != SYMLINK:
            raise err(errno.EINVAL)
        return e.target

    def statfs(self) -> dict[str, int]:
        return {
            "f_bsize": BLKSIZE,
            "f_frsize": 4096,
            "f_blocks": 1 << 40,
            "f_bfree": 1 << 39,
            "f_bavail": 1 << 39,
            "f_files": 1 << 32,
            "f_ffree": 1 << 31,
            "f_favail": 1 << 31,
            "f_namemax": 255,
        }

    # -- attribute changes -------------------------------------------------------------------
    def _target(self, p: str | None, fi: Any) -> tuple[str | None, WFile | None]:
        """What a setattr applies to: a path, and the local file state if there is one."""
        if p is not None:
            return p, self.state.files.get(p) or self.unlinked.file(p)
        h = self.state.handles.get(fi.fh) if fi is not None else None
        if isinstance(h, WHandle):
            return h.wf.path, h.wf
        if isinstance(h, RHandle):
            return h.path, self.state.files.get(h.path)
        raise err(errno.ENOENT)

    def _setattr(
        self,
        path: str | None,
        fi: Any,
        change: Callable[[Entry], Entry],
        wf_change: Callable[[WFile], None],
        root_change: Callable[[dict], None],
    ) -> None:
        st = self.state
        st.need_rw()
        p, wf = self._target(path, fi)
        now = time.time_ns()
        if p == "":
            root_change(st.root)
            st.root["ctime"] = now
            return
        if wf is None:
            assert p is not None
            with st.names.hold(p, *linkgroups.others(st, p)):  # (names of one file change together)
                wf = st.files.get(p)  # opened for writing meanwhile: change its local state
                if wf is None:
                    e = st.ns.lookup(p)
                    if e is None:
                        raise err(errno.ENOENT)
                    if st.ns.is_implicit(e):
                        if st.ns.shadows(p):
                            # A marker would overwrite the file or symlink this directory hides.
                            log.warning("cannot change %s: a directory marker would replace the file of the same name it shadows", p)
                            raise err(errno.EPERM)
                        t = st.times.get(p, {})
                        e = Entry(DIR, 0, e.mode, t.get("mtime", e.mtime_ns), uid=e.uid, gid=e.gid)
                    staged = linkgroups.spread(st, p, change(e).with_(ctime_ns=now), e)  # every name of the file
                    st.stage(staged)
                    with st.mu:
                        for n in staged:
                            t = st.times.get(n)
                            if t:  # the stored times are the ones set now
                                t.pop("mtime", None)
                                t.pop("ctime", None)
                        linkgroups.refresh_local(st, staged, p)
                    linkgroups.invalidate(st, staged, p)
                    return

        def change(wf: WFile) -> None:
            wf_change(wf)
            wf.ctime_ns = now
            wf.generation += 1

        if self.writes.writeback is not None and self.writes.writeback.change_attributes(wf, change):
            return
        with wf.lock:
            change(wf)
        if wf.opens == 0:
            self.writes.sync_and_forget(wf)

    def chmod(self, p: str | None, mode: int, fi: Any = None) -> None:
        m = mode & 0o7777

        def root(r: dict) -> None:
            r["mode"] = m

        def wfc(wf: WFile) -> None:
            wf.mode = m

        self._setattr(p, fi, lambda e: e.with_(mode=m), wfc, root)

    def chown(self, p: str | None, uid: int, gid: int, fi: Any = None) -> None:
        cfg = self.state.cfg

        def pick(old: int | None, new: int, default: int) -> int:
            return (old if old is not None else default) if new < 0 else new

        def root(r: dict) -> None:
            r["uid"] = pick(r["uid"], uid, cfg.uid)
            r["gid"] = pick(r["gid"], gid, cfg.gid)

        def wfc(wf: WFile) -> None:
            wf.uid = pick(wf.uid, uid, cfg.uid)
            wf.gid = pick(wf.gid, gid, cfg.gid)

        def ent(e: Entry) -> Entry:
            return e.with_(uid=pick(e.uid, uid, cfg.uid), gid=pick(e.gid, gid, cfg.gid))

        self._setattr(p, fi, ent, wfc, root)

    def utimens(self, path: str | None, times: tuple[int, int] | None = None, fi: Any = None) -> None:
        st = self.state
        now = time.time_ns()
        atime, mtime = times if times is not None else (UTIME_NOW, UTIME_NOW)
        atime = now if atime == UTIME_NOW else None if atime == UTIME_OMIT else int(atime)
        mtime = now if mtime == UTIME_NOW else None if mtime == UTIME_OMIT else int(mtime)
        if atime is None and mtime is None:
            return  # nothing changes, not even ctime (as ext4)

        def root(r: dict) -> None:
            if mtime is not None:
                r["mtime"] = mtime
            if atime is not None:
                r["atime"] = atime

        def wfc(wf: WFile) -> None:
            if mtime is not None:
                wf.mtime_ns = mtime
            if atime is not None:
                wf.atime_ns = atime

        # The new ctime (and mtime) are stored; atime is kept by the mount for the session.
        self._setattr(path, fi, lambda e: e if mtime is None else e.with_(mtime_ns=mtime), wfc, root)
        p, wf = self._target(path, fi)
        if p and wf is None and atime is not None:
            st.times.setdefault(p, {})["atime"] = atime
