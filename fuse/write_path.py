"""The write path of a ``--rw`` mount: files with local state, and staging them.

Writes go to local temporary files (:class:`~fuse.writer.WFile`) and are staged
on the branch, each as one :meth:`~fabric.plane.dataplane.DataPlane.stage` call,
when the file is closed, fsynced or renamed (or, for a file nobody has open,
when it is changed). A file's local state lives in ``MountState.files`` until it
is staged and its last handle is closed. With ``--writeback``, fsync and close park the
file instead (:mod:`fuse.writeback`) and it is staged in the background.
"""

from __future__ import annotations

import errno
import logging
import stat as S
import threading
from typing import Any

from fabric.errors import ChunksMissing
from fabric.format.model import Entry
from fabric.plane.dataplane import DataPlane
from fuse import copies, linkgroups
from fuse.errors import err
from fuse.handles import RHandle, WHandle, content_sig
from fuse.libfuse import invalidate_path
from fuse.mirror import REPLICATED, JournalMirror
from fuse.namespace import split
from fuse.read_path import ReadPath
from fuse.state import MountState
from fuse.writeback import WriteBack
from fuse.writer import WFile

log = logging.getLogger("fabric.fuse")

#: How long a truncating open of a parked file waits for the RELEASE of its last close.
RELEASE_WAIT = 1.0
#: How many times a file's content is sent again when staging finds chunks of it missing.
RESENDS = 2


class WritePath:
    """Creating, opening, writing and staging files with local state."""

    def __init__(self, state: MountState, reads: ReadPath) -> None:
        self.state = state
        self.reads = reads
        self.write_dir = state.cfg.write_dir
        cfg = state.cfg
        #: Copies of the files staged, left for --passthrough mounts (``--seed-copies``).
        self.seeds = copies.seeder(cfg)
        #: fsync and close park files for background staging (``--writeback``; needs ``--write-dir``).
        self.writeback: WriteBack | None = None
        if state.writable and cfg.writeback and cfg.write_dir:
            # At replicated durability a peer spoke keeps each parked file too (fuse/mirror.py).
            mirror = JournalMirror.open(state.plane.inner.http, cfg.write_dir) if cfg.durability == REPLICATED else None
            self.writeback = WriteBack(self, cfg.write_dir, cfg.writeback_backlog, keep_names=self.seeds is not None, mirror=mirror)

    # -- local state -------------------------------------------------------------------
    def wfile(self, p: str) -> WFile:
        """The local state of an existing file ``p``, created on first need."""
        st = self.state
        wf = st.files.get(p)
        if wf is not None:
            return wf
        with st.names.hold(p):  # an unlink or rename of p waits (and so do we)
            wf = st.files.get(p)
            if wf is not None:
                return wf
            known = st.ns.lookup(p)
            e = self.reads.fresh_file(p)
            if known is not None and content_sig(known) != content_sig(e):
                invalidate_path(p)  # changed elsewhere since the kernel saw it: its size is stale
            if e.chunklist and not e.chunks:
                e = st.plane.stat_chunks(st.repo, st.branch, p)
            uid = e.uid if e.uid is not None else st.cfg.uid
            gid = e.gid if e.gid is not None else st.cfg.gid
            wf = WFile(p, e, self._write_dir(), e.mode, uid, gid)
            with st.mu:
                t = st.times.pop(p, None)
                if t:
                    wf.atime_ns = t.get("atime", wf.atime_ns)
                st.files[p] = wf
            return wf

    def _write_dir(self) -> str:
        if self.write_dir is None:
            import tempfile

            self.write_dir = tempfile.mkdtemp(prefix="fabric-mount-")
        return self.write_dir

    def _stream(self, wf: WFile) -> None:
        """Chunk ``wf`` while it is written, if it is empty and local (``wf.lock`` held)."""
        st = self.state
        if st.streams is not None and wf.stream is None and wf.fd is not None and wf.size == 0:
            wf.attach_stream(st.streams.open(wf.fd, lambda: st.plane.inner.chunk_sink(st.repo)))

    def _materialize(self, wf: WFile) -> None:
        if wf.fd is None:
            base = wf.base
            wf.materialize(self.reads.reader_for(base) if base is not None and base.size else None)

    # -- opening and creating ----------------------------------------------------------
    def open_for_writing(self, p: str, fi: Any, truncate: bool) -> None:
        self.state.need_rw()
        wf = self.wfile(p)
        if truncate and self.writeback is not None:
            wf = self._unless_parked(p, wf)
        with wf.lock:
            if truncate and (wf.size or wf.fd is None):
                wf.materialize(None)
                wf.truncate(0)
            self._stream(wf)
            wf.count_open(1)
        fi.fh = self.state.handles.add(WHandle(wf, True))
        fi.keep_cache = 0

    def _unless_parked(self, p: str, wf: WFile) -> WFile:
        """The local state a truncating open of ``p`` works on. A parked file no handle has
        open (its last fsynced version in the journal, perhaps being uploaded) is superseded by
        new empty local state: the open does not wait for that upload (a checkpoint saved again
        under the same name while the last save is on its way), and the parked version stays in
        the journal until the new one's own record is written, so a mount killed meanwhile
        brings back the last version fsync returned for. Any other file: ``wf`` itself."""
        if wf.hold_unless_staging():
            parked = wf.journal_id is not None
            wf.lock.release()
            if not parked:
                return wf
        st = self.state
        assert self.writeback is not None
        with st.names.hold(p):  # (an unlink or rename of p waits; so would a staging's last step)
            with wf.opens_mu:
                # The kernel sends a close's RELEASE after close() returns: a save opened again
                # at once may come first. Give it a moment before taking the file for open.
                wf.opens_changed.wait_for(lambda: wf.opens == 0, timeout=RELEASE_WAIT)
                parked_or_staging = wf.journal_id is not None or wf.syncing
                if st.files.get(p) is not wf or wf.opens > 0 or wf.dropped or not parked_or_staging or linkgroups.others(st, p):
                    return wf  # open elsewhere, or a name of several: as without write-back
                new = WFile(p, wf.base, self._write_dir(), wf.mode, wf.uid, wf.gid)
                new.meta = dict(wf.meta)
                new.dir_touched = 0
                with st.mu:
                    st.files[p] = new
                    wf.unlinked, wf.path = True, None  # its staging stops short of the branch, if it has not got there
            self.writeback.supersede(wf, new)
        log.info("%s opened for writing while its last version is parked: that version is superseded", p)
        return new

    def open_for_reading(self, wf: WFile, fi: Any) -> bool:
        """Open a file with local state for reading (read-your-writes), also while it is being
        staged; False if its local state was forgotten meanwhile (it is staged: open that)."""
        held = wf.hold_unless_staging()
        try:
            with wf.opens_mu:
                if wf.dropped:
                    return False
                wf.opens += 1
        finally:
            if held:
                wf.lock.release()
        fi.fh = self.state.handles.add(WHandle(wf, False))
        fi.keep_cache = 0
        return True

    def create(self, p: str, mode: int, fi: Any) -> None:
        st = self.state
        st.need_rw()
        with st.names.hold(p):  # a second create of p waits, then finds it (EEXIST)
            st.check_new(p)
            uid, gid, mode = st.new_owner(p, mode & 0o7777, False)
            wf = WFile(p, None, self._write_dir(), mode, uid, gid)
            self._stream(wf)
            wf.count_open(1)
            with st.mu:
                st.files[p] = wf
                st.times.pop(p, None)
                st.kernel_sig.pop(p, None)
                st.kernel_attrs.pop(p, None)
                st.bump_dir(split(p)[0], wf.mtime_ns)
        fi.fh = st.handles.add(WHandle(wf, True))
        fi.keep_cache = 0

    def mknod(self, p: str, mode: int) -> None:
        st = self.state
        st.need_rw()
        if not S.S_ISREG(mode):
            raise err(errno.EPERM)  # devices, FIFOs and sockets are not stored
        with st.names.hold(p):
            st.check_new(p)
            uid, gid, mode = st.new_owner(p, mode & 0o7777, False)
            wf = WFile(p, None, self._write_dir(), mode, uid, gid)
            with st.mu:
                st.files[p] = wf
        self.sync_and_forget(wf)

    # -- changing content --------------------------------------------------------------
    def _writable_handle(self, fh: int) -> WHandle:
        h = self.state.handles.get(fh)
        if not isinstance(h, WHandle) or not h.writable:
            raise err(errno.EBADF)
        return h

    def write(self, fh: int, data: bytes | memoryview, offset: int) -> int:
        wf = self._writable_handle(fh).wf
        with wf.lock:
            self._materialize(wf)
            return wf.write(data, offset)

    def truncate(self, p: str | None, length: int, fi: Any = None) -> None:
        self.state.need_rw()
        h = self.state.handles.get(fi.fh) if fi is not None else None
        if isinstance(h, WHandle):
            wf = h.wf
        else:
            p = p if p is not None else h.path if isinstance(h, RHandle) else None
            if p is None:
                raise err(errno.ENOENT)
            wf = self.wfile(p)
        with wf.lock:
            if length == 0:
                wf.materialize(None)
            else:
                self._materialize(wf)
            wf.truncate(length)
            self._stream(wf)
        if wf.opens == 0:
            self.sync_and_forget(wf)

    def fallocate(self, fh: int, mode: int, offset: int, size: int) -> None:
        if mode != 0:
            raise err(errno.EOPNOTSUPP)
        wf = self._writable_handle(fh).wf
        with wf.lock:
            self._materialize(wf)
            wf.allocate(offset, size)

    # -- staging -----------------------------------------------------------------------
    def flush(self, fh: int) -> None:
        if not self.state.writable:
            raise err(errno.ENOSYS)  # nothing to flush: the kernel stops asking
        h = self.state.handles.get(fh)
        if isinstance(h, WHandle) and h.writable:
            if self.writeback is not None:
                self.writeback.park(h.wf, durable=False)
                return
            # A close while another thread syncs this very version (an fsync, or a forked child
            # closing its copy of the descriptor) does not wait for it.
            self.sync(h.wf, wait_for_running=False)

    def fsync(self, fh: int) -> None:
        h = self.state.handles.get(fh)
        if isinstance(h, WHandle):
            if self.writeback is not None:
                self.writeback.park(h.wf, durable=True)
            else:
                self.sync(h.wf)

    def release(self, fh: int) -> None:
        h = self.state.handles.pop(fh)
        if isinstance(h, WHandle):
            wf = h.wf
            wf.count_open(-1)  # (not under wf.lock: a staging of it may hold that, waiting for the server)
            try:
                if h.writable and self.writeback is not None:
                    self.writeback.park(wf, durable=False)
                elif h.writable:
                    self.sync(wf)
            finally:
                self.drop_soon(wf)

    def sync(self, wf: WFile, wait_for_running: bool = True) -> None:
        """Stage ``wf``'s current content and attributes on the branch (if anything changed)."""
        st = self.state
        if not wait_for_running and wf.syncing >= wf.generation:
            return
        with wf.lock:
            if not wf.dirty or wf.unlinked:
                return
            gen = wf.syncing = wf.generation
            content_changed = wf.fd is not None and wf.synced_content < wf.content_generation

            def upload(plane: DataPlane, streamed_ok: bool = True) -> Entry:
                if not content_changed:
                    return wf.attrs_entry()
                streamed = wf.streamed_entry() if streamed_ok else None
                if streamed is not None:
                    return streamed
                return wf.upload(plane, st.repo)

            try:
                entry = st.plane.retried(upload)
                for attempt in range(RESENDS + 1):
                    try:
                        self._stage(wf, entry, gen, content_changed)
                        break
                    except ChunksMissing:
                        # The server lost chunks it took from us (a spoke restarted and evicted
                        # them before they reached the hub): send what it lacks again.
                        if not content_changed or attempt == RESENDS:
                            raise
                        log.warning("%s: the server no longer holds chunks of this file; sending them again", wf.path)
                        entry = st.plane.retried(lambda plane: upload(plane, streamed_ok=False))
            except Exception as exc:
                wf.last_error = exc
                raise
            finally:
                wf.syncing = 0

    def _stage(self, wf: WFile, entry: Entry, gen: int, content_changed: bool) -> None:
        """Stage ``entry`` at ``wf``'s current name (``wf.lock`` held), holding that name so that
        an unlink or rename of it waits; nothing if the file was unlinked meanwhile."""
        st = self.state
        while True:
            p = wf.path
            if wf.unlinked or p is None:
                return
            with st.names.hold(p, *linkgroups.others(st, p)):  # (and the file's other names)
                if wf.path != p or wf.unlinked:
                    continue  # renamed (or unlinked) while we waited: look again
                staged = linkgroups.spread(st, p, entry, linkgroups.current(st, p, wf.base))
                entry = staged[p] or entry
                if wf.dir_touched:  # a new file: its directory's new times go with its first version
                    st.touch_dir(split(p)[0], wf.dir_touched, staged)
                st.plane.stage(st.repo, st.branch, staged)
                with st.mu:
                    wf.dir_touched = 0
                    wf.base = entry
                    wf.synced_generation = gen
                    if content_changed:
                        wf.synced_content = gen
                    wf.last_error = None
                    if self.writeback is not None:
                        self.writeback.staged_version(wf, gen)
                    for n, e in staged.items():
                        st.ns.update(n, e)
                    st.kernel_sig[p] = content_sig(entry)
                    linkgroups.refresh_local(st, staged, p)
                linkgroups.invalidate(st, staged, p)
                return

    def sync_and_forget(self, wf: WFile) -> None:
        """Stage a file no handle has open, then let its local state go (even if staging failed)."""
        try:
            self.sync(wf)
        finally:
            self.maybe_drop(wf)

    def drop_soon(self, wf: WFile) -> None:
        """:meth:`maybe_drop`, without waiting for a staging of ``wf`` in progress (it may be
        waiting for an unreachable server): a thread of its own does it after that one."""
        if not wf.lock.acquire(blocking=False):
            threading.Thread(target=self.maybe_drop, args=(wf,), name="fabric-drop", daemon=True).start()
            return
        try:
            self.maybe_drop(wf)
        finally:
            wf.lock.release()

    def maybe_drop(self, wf: WFile) -> None:
        """Forget a file's local state once it is staged and no handle uses it."""
        st = self.state
        with wf.lock:
            with wf.opens_mu:
                if wf.opens > 0 or (wf.dirty and not wf.unlinked):
                    return
                wf.dropped = True
            if self.seeds is not None:
                copies.seed(self.seeds, wf)
            self.discard(wf)
            with st.mu:
                if wf.path is not None and st.files.get(wf.path) is wf:
                    del st.files[wf.path]
                    st.times.setdefault(wf.path, {})["atime"] = wf.atime_ns  # (its ctime is in its entry)
            wf.close()

    def discard(self, wf: WFile) -> None:
        """``wf`` is unlinked or its local state forgotten: none of it is parked any more."""
        if self.writeback is not None:
            self.writeback.forget(wf)
