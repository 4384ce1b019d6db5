"""Local state of files being written through a ``--rw`` mount.

Writes go to a temporary file on the mount's local disk (``--write-dir``);
nothing crosses the network per ``write()``. A :class:`WFile` is created when
a file is created or opened for writing and lives until its content is
staged on the branch and its last handle is closed. While it lives, every
read and stat of its path inside the mount is served from it
(read-your-writes).

Syncing (on ``close``, ``fsync``, ``release``, and before a rename) chunks
the temporary file with :func:`fabric.format.ingest.ingest_runs` into the data
plane's :meth:`~fabric.plane.dataplane.DataPlane.chunk_sink`, which sends only the
chunks the server lacks, closes the sink (every chunk stored), and returns
the file entry that the filesystem stages with
:meth:`~fabric.plane.dataplane.DataPlane.stage`. The holes of the temporary file
(found with ``SEEK_DATA``/``SEEK_HOLE``) are neither read nor sent: they become
holes of the chunk list (:func:`fabric.format.ingest.ingest_runs`), and a sparse
version opened for writing again keeps them as holes of the local file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
import time
from typing import TYPE_CHECKING

from fabric.format.ingest import HOLE_MIN, Run, ingest_runs
from fabric.format.model import FILE, HOLE_ID, Entry
from fuse.reader import FileReader
from fuse.streaming import ContentStream

if TYPE_CHECKING:
    from fabric.plane.dataplane import DataPlane
    from fuse.journal import Record

#: The MD5 of no bytes: the ETag of an empty file.
EMPTY_MD5 = hashlib.md5(b"").hexdigest()
COPY_BLOCK = 4 * 1024 * 1024


class _FdStream:
    """A read-only stream over ``size`` bytes of a file descriptor from ``start`` (positioned reads, no shared offset)."""

    def __init__(self, fd: int, size: int, start: int = 0) -> None:
        self.fd = fd
        self.pos = start
        self.size = start + size

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        return data


def data_regions(fd: int, size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the regions of the first ``size`` bytes of ``fd`` that hold
    data; what lies between them are holes of at least :data:`HOLE_MIN` bytes (shorter
    holes are counted as data). All of it on a file system that does not report holes."""
    regions: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole is left
            return [(0, size)]  # no SEEK_DATA here: all data
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if regions and start - (regions[-1][0] + regions[-1][1]) < HOLE_MIN:
            regions[-1] = (regions[-1][0], end - regions[-1][0])  # a short hole: data
        else:
            regions.append((start, end - start))
        pos = end
    if not regions and size < HOLE_MIN:
        return [(0, size)]  # a short file of zeros: data
    if regions and regions[0][0] < HOLE_MIN:
        regions[0] = (0, regions[0][0] + regions[0][1])
    if regions and size - (regions[-1][0] + regions[-1][1]) < HOLE_MIN:
        regions[-1] = (regions[-1][0], size - regions[-1][0])
    return regions


def file_runs(fd: int, size: int) -> list[Run]:
    """The first ``size`` bytes of ``fd`` as data runs and holes (for :func:`ingest_runs`)."""
    runs: list[Run] = []
    pos = 0
    for start, n in data_regions(fd, size):
        if start > pos:
            runs.append((None, start - pos))
        runs.append((_FdStream(fd, n, start), n))  # type: ignore[arg-type]
        pos = start + n
    if pos < size:
        runs.append((None, size - pos))
    return runs


class WFile:
    """One file being written: its local content, attributes, and whether the server has them."""

    def __init__(
        self,
        path: str,
        base: Entry | None,
        write_dir: str,
        mode: int,
        uid: int,
        gid: int,
        now_ns: int | None = None,
        fd: int | None = None,
    ) -> None:
        """``fd``: the local content, already written (a file recovered from a journal)."""
        now = now_ns or time.time_ns()
        self.path: str | None = path
        self.base = base  # the staged/committed version the content starts from (None: a new file)
        self.write_dir = write_dir
        self.fd: int | None = None  # local copy of the content, once materialized
        self.size = base.size if base else 0
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.mtime_ns = base.mtime_ns if base else now
        self.ctime_ns = (base.mtime_ns if base.ctime_ns is None else base.ctime_ns) if base else now
        #: When this new file was created in its directory, until the directory's new times
        #: are staged with the file's first version (0: nothing pending).
        self.dir_touched = 0 if base else now
        self.atime_ns = now
        self.meta = dict(base.meta) if base else {}
        self.opens = 0  # handles open on it; changed under opens_mu (and lock, but for open_for_reading)
        self.opens_mu = threading.Lock()
        self.opens_changed = threading.Condition(self.opens_mu)
        self.dropped = False  # its local state is forgotten (set with opens 0, under opens_mu)
        self.generation = 1  # bumped by every change
        self.synced_generation = 0 if base is None else 1  # a new file is not on the server yet
        self.content_generation = 1  # generation of the last content change
        self.synced_content = 0 if base is None else 1
        self.unlinked = False
        self.syncing = 0  # the generation being staged right now (0: none)
        self.lock = threading.RLock()
        self.last_error: BaseException | None = None
        #: The content chunked while it is written (fuse/streaming.py), while the file is
        #: written in order from empty; None otherwise.
        self.stream: ContentStream | None = None
        #: Its record in a --writeback mount's journal (fuse/writeback.py), while parked, and
        #: the generation that record describes.
        self.journal_id: str | None = None
        self.journaled_generation = 0
        #: The generation a peer spoke keeps a copy of (``--durability replicated``, fuse/mirror.py; 0: none),
        #: that copy's length, and the bytes at the start of the file no change has touched since it
        #: was sent (a copy of a file that only grew since is sent as the bytes it grew by).
        self.mirrored_generation = 0
        self.mirrored_size = 0
        self.unchanged_since_mirror = 0
        #: Records of earlier versions of its path, superseded while they were staged (see
        #: :meth:`WriteBack.supersede`): dropped once this version's own record is written.
        self.replaced_records: list[str] = []
        #: Its data's name in the journal after its record was dropped (``--seed-copies``: its
        #: seed can be a link of it); removed when its local state is.
        self.kept_name: str | None = None
        if fd is not None:
            self.fd, self.size = fd, os.fstat(fd).st_size
        elif base is None:
            self._new_fd()

    @classmethod
    def recovered(cls, record: Record, fd: int, write_dir: str, on_branch: Entry | None) -> WFile:
        """A file a killed ``--writeback`` mount parked: its journal record and its data open
        on ``fd``, a change to stage over ``on_branch`` (the branch's file at its path now, if
        any: an unlink then stages a delete)."""
        wf = cls(record.path, on_branch, write_dir, record.mode, record.uid, record.gid, now_ns=record.mtime_ns, fd=fd)
        wf.mtime_ns, wf.ctime_ns = record.mtime_ns, record.ctime_ns
        wf.meta = dict(record.meta)
        wf.dir_touched = 0
        if on_branch is not None:  # its content is a change over the branch's (a new file's is already)
            wf.generation = wf.content_generation = 2
        wf.journal_id = record.id
        wf.journaled_generation = wf.mirrored_generation = wf.generation  # (a copy of it may be at a peer)
        return wf

    # -- state -------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return self.synced_generation != self.generation

    @property
    def on_server(self) -> bool:
        """Has some version of this path been staged (so an unlink must stage a delete)?"""
        return self.base is not None

    def count_open(self, delta: int) -> None:
        with self.opens_mu:
            self.opens += delta
            self.opens_changed.notify_all()

    def hold_unless_staging(self) -> bool:
        """Take ``lock``, unless a staging of this file holds it (it may be waiting for an
        unreachable server): False then, and nothing may change the content or close the local
        file until it ends. Readers need only that."""
        while not self.lock.acquire(timeout=0.05):
            if self.syncing:
                return False
        return True

    def touch(self, content: bool = True) -> None:
        now = time.time_ns()
        self.generation += 1
        if content:
            self.mtime_ns = now
            self.content_generation = self.generation
        self.ctime_ns = now

    # -- content -----------------------------------------------------------------
    def _new_fd(self) -> None:
        fd = os.open(self.write_dir, os.O_RDWR | os.O_TMPFILE, 0o600) if hasattr(os, "O_TMPFILE") else -1
        if fd < 0:  # pragma: no cover - filesystems without O_TMPFILE
            import tempfile

            fd, name = tempfile.mkstemp(dir=self.write_dir)
            os.unlink(name)
        self.fd = fd

    def materialize(self, fetch_reader: FileReader | None) -> None:
        """Copy the base content into the local file (before the first change to it)."""
        if self.fd is not None:
            return
        self._new_fd()
        if self.base is None or self.base.size == 0 or fetch_reader is None:
            return
        spans = _data_spans(self.base.chunks) if self.base.chunks else [(0, self.base.size)]
        for start, end in spans:  # holes stay holes
            pos = start
            while pos < end:
                data = fetch_reader.read(pos, min(COPY_BLOCK, end - pos))
                if not data:
                    break
                os.pwrite(self.fd, data, pos)
                pos += len(data)
        os.ftruncate(self.fd, self.base.size)

    def read(self, offset: int, size: int) -> bytes:
        assert self.fd is not None
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        return os.pread(self.fd, end - offset, offset)

    def write(self, data: bytes | memoryview, offset: int) -> int:
        assert self.fd is not None
        if self.stream is not None:
            n = self.stream.write(data, offset)
            self._forget_broken_stream()
        else:
            n = os.pwrite(self.fd, data, offset)
        self.size = max(self.size, offset + n)
        self.unchanged_since_mirror = min(self.unchanged_since_mirror, offset)
        self.touch()
        return n

    def truncate(self, length: int) -> None:
        assert self.fd is not None
        if self.stream is not None:
            self.stream.truncate(length)
            self._forget_broken_stream()
        else:
            os.ftruncate(self.fd, length)
        self.size = length
        self.unchanged_since_mirror = min(self.unchanged_since_mirror, length)
        self.touch()

    def allocate(self, offset: int, length: int) -> None:
        assert self.fd is not None
        if self.stream is not None:
            self.stream.give_up()
            self.stream = None
        os.posix_fallocate(self.fd, offset, length)
        if offset + length > self.size:
            self.size = offset + length
            self.touch()

    def attach_stream(self, stream: ContentStream | None) -> None:
        """Chunk this file while it is written (it must be empty, with no stream yet)."""
        assert self.fd is not None and self.size == 0 and self.stream is None
        self.stream = stream

    def _forget_broken_stream(self) -> None:
        if self.stream is not None and self.stream.broken:
            self.stream = None

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # -- turning it into an entry ------------------------------------------------
    def attrs_entry(self) -> Entry:
        """The base entry with this file's current attributes (content unchanged)."""
        assert self.base is not None
        return self.base.with_(mode=self.mode, uid=self.uid, gid=self.gid, mtime_ns=self.mtime_ns, ctime_ns=self.ctime_ns, meta=dict(self.meta))

    def streamed_entry(self) -> Entry | None:
        """The file entry from the chunks sent while it was written (all stored at the server),
        or None when it must be chunked whole (:meth:`build_entry`)."""
        if self.stream is None or self.fd is None:
            return None
        streamed = self.stream.finish()
        self._forget_broken_stream()
        return None if streamed is None else self._entry(*streamed)

    def upload(self, plane: DataPlane, repo: str) -> Entry:
        """Chunk the local content into a chunk sink of ``plane`` for ``repo`` (closed after,
        also when chunking fails) and return the file entry, its chunks stored at the server."""
        if self.fd is None:
            return self.attrs_entry()
        if self.size == 0:
            return self._entry([], EMPTY_MD5)
        sink = plane.chunk_sink(repo)
        try:
            chunks, md5 = ingest_runs(file_runs(self.fd, self.size), sink)
        except BaseException:
            with contextlib.suppress(Exception):
                sink.close()
            raise
        sink.close()
        return self._entry(chunks, md5)

    def _entry(self, chunks: list[tuple[bytes, int]], md5: str) -> Entry:
        return Entry(
            FILE,
            self.size,
            self.mode,
            self.mtime_ns,
            uid=self.uid,
            gid=self.gid,
            md5=md5,
            chunks=tuple(chunks),
            meta=dict(self.meta),
            ctime_ns=self.ctime_ns,
        )

    def stat_entry(self) -> Entry:
        """An entry describing the current state, for getattr (no chunk list)."""
        return Entry(FILE, self.size, self.mode, self.mtime_ns, uid=self.uid, gid=self.gid, meta=self.meta, ctime_ns=self.ctime_ns)


def _data_spans(chunks: tuple[tuple[bytes, int], ...]) -> list[tuple[int, int]]:
    """``(start, end)`` of the runs of data chunks of a chunk list (what lies between are holes)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for cid, n in chunks:
        if cid != HOLE_ID:
            if spans and spans[-1][1] == pos:
                spans[-1] = (spans[-1][0], pos + n)
            else:
                spans.append((pos, pos + n))
        pos += n
    return spans
