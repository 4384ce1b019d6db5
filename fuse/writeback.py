"""``fabric mount --writeback``: fsync and close return once a file is on the mount's own disk.

Without it, fsync and close return once the file is staged on the branch at ``--durability``,
so they wait for the file's chunking and upload (:mod:`fuse.streaming` does most of that while
the file is written, but a writer faster than the chunker still waits at fsync for the rest).
With it, fsync *parks* the file: it ``fdatasync``s the local copy in ``--write-dir`` and
records it in the :class:`~fuse.journal.Journal` (on disk before fsync returns). A close
parks it the same way without forcing it to disk first, which is what POSIX promises of a
close. After its last close, a background worker stages it as fsync would have (the same
:meth:`WritePath.sync`, streamed chunks and all); not before, because staging holds the
file's lock, which the writer's close (and its reads) would then wait for. A file fsynced
and kept open is staged once it has not been written for :data:`OPEN_IDLE_SECONDS` (writes
coming meanwhile wait for that staging), at its close, or at unmount. Until staged, the file keeps its
local state, so reads, ``ls`` and ``stat`` in the mount see it (read-your-writes).

What it trades: the file is on this machine's disk, not yet the spoke's, when fsync returns.
A mount killed (or a machine rebooted) before staging takes the journal's files over when it
is started again with the same ``--write-dir`` (:meth:`WriteBack.adopt`): they are its own
parked files from the start, listed and readable, and staged in the background; losing the
disk loses them.

Files are not chunked while they are written (:mod:`fuse.streaming` is off): the chunker's
threads would compete with the writer for the CPU and lengthen the very writes fsync waits
for (measured: 256 MiB from 4 writers took 0.13-0.17 s to write without it, 0.28-0.37 s with
it, and the checkpoint reached the hub no sooner).

Ordering: a rename of a file that exists only on this mount to a name in its directory that
is free (a checkpoint's final ``.metadata.tmp`` -> ``.metadata``) or holds a file with one
name (``latest.pt.tmp`` -> ``latest.pt``) is made on the mount alone: the record takes the
new name (:meth:`NamespaceChanges._rename_parked`). Any other rename of a parked file stages
it first, inline, as without write-back. A chmod, chown or utimens of a parked file rewrites
its record and is staged in the background (:meth:`WriteBack.change_attributes`). An unlink drops the record (a
killed mount never brings the file back). A truncating open of a parked file, staged or
waiting for its staging (a checkpoint saved again under the same name while the last save is
on its way), gives the path new local state at once (:meth:`WritePath._unless_parked`); the
staging of the superseded version stops short of the branch unless it got there first, and
its record stays until the new version's own is written, so a mount killed between the two
brings back the last version fsync returned for.
``--commit-interval`` and ``--commit-on-unmount`` stage every parked file before committing.

Back-pressure: at most ``--writeback-backlog`` bytes are parked at once; a fsync or close
beyond that stages its file inline, so a writer faster than the link is slowed, never failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from fabric.format.model import FILE
from fuse.journal import Journal, Record
from fuse.mirror import JournalMirror, MirrorFailed
from fuse.writer import WFile

if TYPE_CHECKING:
    from fuse.write_path import WritePath

log = logging.getLogger("fabric.fuse")

#: Files staged at once in the background.
WORKERS = 4
#: A parked file still open is staged once it has not been written for this long (a log
#: fsynced now and then and kept open would otherwise reach the branch only at its close).
OPEN_IDLE_SECONDS = 5.0


class WriteBack:
    """The parked files of one mount and the workers that stage them."""

    def __init__(self, writes: WritePath, write_dir: str, backlog: int, keep_names: bool = False, mirror: JournalMirror | None = None) -> None:
        """``keep_names``: a staged file's data keeps its name in the journal until its local
        state is dropped (``--seed-copies`` then links it instead of copying it). ``mirror``:
        a peer spoke keeps a copy of each file parked by a fsync before the fsync returns
        (``--durability replicated``, :mod:`fuse.mirror`)."""
        self.writes = writes
        self.state = writes.state
        self.backlog = backlog
        self.keep_names = keep_names
        self.mirror = mirror
        self.journal = Journal(write_dir)
        self._mu = threading.Lock()
        self._parked: dict[int, WFile] = {}  # id(wf) -> file, while its record exists
        self._queued: set[int] = set()
        self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="fabric-writeback")
        self._stopped = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="fabric-writeback-open", daemon=True)
        self._sweeper.start()
        self.staged = 0  # files staged in the background
        self.inline = 0  # fsyncs and closes that staged inline (backlog full)

    # -- fsync and close ---------------------------------------------------------------
    def park(self, wf: WFile, durable: bool) -> None:
        """Record ``wf`` (on disk if ``durable``), to be staged once its last handle is closed;
        stages it inline instead when the backlog is full or it has no local content."""
        if not durable and wf.syncing >= wf.generation:
            return  # a close while this very version is being staged (a forked child's) does not wait
        with wf.lock:
            if not wf.dirty or wf.unlinked or wf.path is None:
                return
            inline = wf.fd is None or self._parked_bytes(wf) + wf.size > self.backlog
            if not inline:
                try:
                    self._record_and_copy(wf, durable)
                except OSError as exc:  # (the write-dir's disk full or failing): stage it now instead
                    log.warning("cannot park %s in the write-back journal (%s); staging it before fsync or close returns", wf.path, exc)
                    inline = True
                except MirrorFailed as exc:  # staged at replicated durability by the spoke instead
                    log.warning("%s; staging %s before fsync returns", exc, wf.path)
                    inline = True
            closed = wf.opens == 0
        if inline:
            with self._mu:
                self.inline += 1
            self.writes.sync(wf)
        elif closed:
            self._queue(wf)

    def change_attributes(self, wf: WFile, change: Callable[[WFile], None]) -> bool:
        """A chmod, chown or utimens of ``wf``, a file with local content: ``change`` applied to
        it, its record rewritten if it is parked (a kill after it brings the file back changed),
        and staged in the background after its last close, as a write would be (a ``cp -p`` or
        ``shutil.copy2`` sets the times and mode of the file it just closed: they must not
        stage it inline). While a staging of ``wf`` runs (it may wait for the server), the
        change is made beside it and staged after it. False for a file without local content
        (the caller stages the change itself: no upload)."""
        if wf.fd is None:
            return False
        held = wf.hold_unless_staging()
        try:
            with self._mu:  # (changes made beside a staging, one at a time)
                change(wf)
                try:
                    if self._rewrite_record(wf):
                        wf.journaled_generation = wf.generation
                except OSError as exc:  # still staged; only a kill before that loses the change
                    log.warning("cannot rewrite the write-back record of %s: %s", wf.path, exc)
            self._mirror_record(wf)
            closed = wf.opens == 0
        finally:
            if held:
                wf.lock.release()
        if closed and held:
            self._queue(wf)  # (else the worker staging it queues it again: :meth:`_stage`)
        return True

    def _record_and_copy(self, wf: WFile, durable: bool) -> None:
        """Park ``wf`` (``wf.lock`` held): its data on disk if ``durable``, its record written
        if this version has none; and with a mirror, for a fsync, the peer's copy, sent while
        the local disk syncs. OSError or MirrorFailed: not parked as asked."""
        assert wf.fd is not None
        rid = wf.journal_id or self.journal.new_id()
        generation = wf.generation
        copy = None
        if durable and self.mirror is not None and wf.mirrored_generation != generation:
            # The peer holds a copy of this record's file that the file only grew from: send what it grew by.
            grew = wf.mirrored_generation and wf.unchanged_since_mirror >= wf.mirrored_size
            offset, size = (wf.mirrored_size if grew else 0), wf.size
            wf.unchanged_since_mirror = size  # (changes from now on count against this copy)
            copy = self.mirror.start_keep(rid, self._record_of(wf, rid).to_json(), wf.fd, size, offset)
        try:
            if durable:
                os.fdatasync(wf.fd)
            if wf.journal_id is None or wf.journaled_generation != generation:
                self._record(wf, durable, rid)
        except OSError:
            if copy is not None and copy.exception() is None:
                self.mirror.drop(rid)  # (staged inline instead: the peer's copy would only be staged twice)
            raise
        if copy is not None:
            try:
                copy.result()
            except MirrorFailed:
                wf.unchanged_since_mirror = 0  # (what the peer holds is not known: the next copy is whole)
                raise
            wf.mirrored_generation, wf.mirrored_size = generation, size

    def _record(self, wf: WFile, durable: bool, rid: str) -> None:
        """Write ``wf``'s record, ``rid`` (``wf.lock`` held)."""
        assert wf.fd is not None
        if wf.journal_id is None:
            self.journal.link(rid, wf.fd)
        self.journal.write(self._record_of(wf, rid), durable)
        wf.journaled_generation = wf.generation
        with self._mu:
            wf.journal_id = rid
            self._parked[id(wf)] = wf
        self._drop_replaced(wf)

    def _mirror_record(self, wf: WFile) -> None:
        """Tell the peer ``wf``'s record changed (renamed, attributes), if it keeps a copy."""
        rid = wf.journal_id
        if self.mirror is not None and rid is not None and wf.mirrored_generation and wf.path is not None:
            self.mirror.rename(rid, self._record_of(wf, rid).to_json())

    def _record_of(self, wf: WFile, rid: str) -> Record:
        assert wf.path is not None and self.state.branch is not None
        return Record(rid, self.state.repo, self.state.branch, wf.path, wf.mode, wf.uid, wf.gid, wf.mtime_ns, wf.ctime_ns, dict(wf.meta))

    def supersede(self, old: WFile, new: WFile) -> None:
        """``new`` replaces ``old`` (parked, perhaps being staged) at its path. ``old``'s record stays in the
        journal until ``new``'s own is written (or ``new`` is staged or dropped), so a mount
        killed before that brings back ``old``, the last version fsync returned for."""
        with self._mu:
            rid, old.journal_id = old.journal_id, None
            self._parked.pop(id(old), None)
            new.replaced_records += old.replaced_records + ([rid] if rid is not None else [])
            old.replaced_records = []

    def _drop_replaced(self, wf: WFile) -> None:
        with self._mu:
            replaced, wf.replaced_records = wf.replaced_records, []
        for rid in replaced:
            self.journal.drop(rid)
            if self.mirror is not None:
                self.mirror.drop(rid)

    def moved(self, wf: WFile) -> None:
        """``wf`` was renamed (its names held by the caller: no staging of it stages
        meanwhile); its record, if parked, names the new path."""
        with self._mu:
            written = self._rewrite_record(wf)
        if written:
            self._mirror_record(wf)
            self._drop_replaced(wf)  # (the records of a file it replaced: :meth:`supersede`)

    def _rewrite_record(self, wf: WFile) -> bool:
        """Write ``wf``'s record again, with its name and attributes now, if it is parked
        (not durably: nothing was fsynced); whether it was. ``_mu`` held, which :meth:`forget`
        takes the record's id under: a record dropped meanwhile is not written again."""
        rid = wf.journal_id
        if rid is None or wf.path is None or wf.unlinked:
            return False
        self.journal.write(self._record_of(wf, rid), durable=False)
        return True

    def _parked_bytes(self, wf: WFile) -> int:
        with self._mu:
            return sum(f.size for k, f in self._parked.items() if k != id(wf))

    def _queue(self, wf: WFile, while_open: bool = False) -> None:
        with self._mu:
            if id(wf) in self._queued:
                return
            self._queued.add(id(wf))
        try:
            self._executor.submit(self._stage, wf, while_open)
        except RuntimeError:  # shutting down: unmount stages every file itself
            with self._mu:
                self._queued.discard(id(wf))

    def _sweep(self) -> None:
        """Queue the parked files that are still open but were not written for
        :data:`OPEN_IDLE_SECONDS` (their writes wait while one is staged, as at a fsync
        without write-back)."""
        while not self._stopped.wait(OPEN_IDLE_SECONDS / 5):
            quiet_since = time.time_ns() - int(OPEN_IDLE_SECONDS * 1e9)
            with self._mu:
                idle = [wf for wf in self._parked.values() if wf.opens > 0 and wf.dirty and wf.mtime_ns <= quiet_since]
            for wf in idle:
                self._queue(wf, while_open=True)

    def _stage(self, wf: WFile, while_open: bool = False) -> None:
        with self._mu:
            self._queued.discard(id(wf))
        if wf.opens > 0 and not while_open:
            return  # opened again: staged after its next last close
        try:
            self.writes.sync(wf)
            with self._mu:
                self.staged += 1
            if wf.dirty and wf.opens == 0 and not wf.unlinked:
                self._queue(wf)  # changed beside the staging (:meth:`change_attributes`)
                return
        except Exception as exc:  # noqa: BLE001 - the mount's flush loop tries again after the close
            log.warning("write-back of %s failed (it stays parked and is tried again): %s", wf.path, exc)
        self.writes.maybe_drop(wf)

    # -- the record's end --------------------------------------------------------------
    def staged_version(self, wf: WFile, generation: int) -> None:
        """``wf`` was staged at ``generation`` (``wf.lock`` held): drop its record if that
        covers what it recorded."""
        if wf.journal_id is None or generation >= wf.journaled_generation:
            self.forget(wf, keep_name=self.keep_names)  # (with no record of its own: the records it replaced)

    def forget(self, wf: WFile, keep_name: bool = False) -> None:
        """Drop ``wf``'s record (staged, or unlinked: nothing of it is to be staged); with
        ``keep_name`` (staged) its data keeps its name, else that name goes too."""
        with self._mu:  # (not wf.lock: a staging in progress holds that while it waits for the server)
            rid, wf.journal_id = wf.journal_id, None
            mirrored, wf.mirrored_generation = wf.mirrored_generation, 0
            self._parked.pop(id(wf), None)
            old_name = wf.kept_name
            if not keep_name:
                wf.kept_name = None
            elif rid is not None:
                wf.kept_name = self.journal.data_path(rid)
        if rid is not None:
            if keep_name:
                self.journal.retire(rid)
            else:
                self.journal.drop(rid)
            if self.mirror is not None and mirrored:
                self.mirror.drop(rid)
        if old_name is not None and old_name != wf.kept_name:
            with contextlib.suppress(OSError):
                os.unlink(old_name)
        self._drop_replaced(wf)

    # -- a mount's start and end -------------------------------------------------------
    def adopt(self) -> int:
        """Take over the files a mount of this repository and branch parked and never staged
        (it was killed); how many. From now on they are this mount's parked files: listed and
        read from the journal's data, staged in the background, and tried again by the
        mount's flush loop when that fails. So the mount serves at once, however long their
        upload takes and whether or not the server takes them now. Call before serving."""
        st = self.state
        taken: dict[str, WFile] = {}
        records, _ = self.journal.latest()
        for record in records:
            if (record.repo, record.branch) != (st.repo, st.branch):
                log.warning("write-back journal: %s is for %s@%s, not this mount's; left for a mount of it",
                            record.path, record.repo, record.branch)
                continue
            on_branch = st.ns.lookup(record.path)  # (one listing per directory, not a call per file)
            fd = os.open(self.journal.data_path(record.id), os.O_RDWR)
            taken[record.path] = WFile.recovered(record, fd, self.writes.write_dir or "", on_branch if on_branch is not None and on_branch.kind == FILE else None)
        with st.mu:
            st.files.update(taken)
        with self._mu:
            self._parked.update((id(wf), wf) for wf in taken.values())
        for wf in taken.values():
            self._queue(wf)
        return len(taken)

    def snapshot(self) -> dict[str, int]:
        with self._mu:
            return {"parked": len(self._parked), "parked_bytes": sum(f.size for f in self._parked.values()),
                    "staged": self.staged, "inline": self.inline,
                    **({"mirror": self.mirror.snapshot()} if self.mirror is not None else {})}

    def shutdown(self) -> None:
        """Let the queued stagings run out, then release the journal."""
        self._stopped.set()
        self._executor.shutdown(wait=True)
        if self.mirror is not None:
            with self._mu:
                nothing_parked = not self._parked
            self.mirror.close(nothing_parked)
        self.journal.close()
