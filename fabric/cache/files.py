"""Whole files kept as plain files under a mount's ``--cache-dir``, for the kernel to read
them itself (FUSE passthrough: :mod:`fuse.kernel.immutable`).

A file read through a mount comes out of chunks (:mod:`fabric.cache.packs`), a copy and a
check per request in Python. A file whose plain bytes lie on the local disk can be handed
to the kernel instead, which then reads it at the disk's speed (bench/RESULTS.md, "FUSE
passthrough from Python"). This cache keeps those plain copies.

- **Layout**: ``files/XX/KEY`` where ``KEY`` (:func:`copy_key`) is the SHA-256 of the file's
  size and chunk ids, or of its chunk list's id (a version of a file, whatever its path),
  ``XX`` its first two digits.
  Copies being filled lie in ``files/partial/``, which start-up empties.
- **Filling**: the bytes a mount serves its readers are written to the copy too, at their
  offsets and in any order (:meth:`Filling.write`). They were checked on the way: against
  their ids on arrival, against their records' checksums when read from the packs. Once
  every byte has been written, the copy is flushed to disk (``fdatasync``) and renamed into
  place, in a background thread. A copy is only ever made of files of at least
  ``min_size`` bytes (below that an open costs more than the read), and at most
  :data:`MAX_FILLING` are being filled at once (the least recently written is dropped).
- **Budget**: complete copies stay within ``budget`` bytes, least recently opened evicted
  first; the order survives restarts (a copy's mtime is its last open). An evicted copy
  still open is read to its end (the kernel holds it).
- **At rest**: the kernel reads a copy as it reads any local file, unchecked: a copy is
  trusted as the disk is (the packs are checked chunk by chunk; this is the price of the
  disk's speed). A copy whose size is not its key's is removed when opened. The directory
  is the mount's own (locked with the packs).
- **Failures**: a copy that cannot be written (disk full, I/O error) is dropped and its
  file served as before; a crash leaves partial copies, removed at the next start.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("fabric.cache")

FILES = "files"
PARTIAL = "partial"
#: Files smaller than this are not copied.
MIN_SIZE = 1024 * 1024
#: Copies being filled at once, at most.
MAX_FILLING = 64


def copy_key(size: int, chunk_ids: Sequence[bytes]) -> str:
    """The name of a file version's copy: SHA-256 of its size and its chunk ids (or the id
    of its chunk list, where that is an object of its own), in hex."""
    h = hashlib.sha256(size.to_bytes(8, "little"))
    for cid in chunk_ids:
        h.update(cid)
    return h.hexdigest()


class Filling:
    """A copy being written: bytes arrive at any offsets; done once all ``size`` are in."""

    def __init__(self, owner: FileCopies, key: str, size: int, path: str, fd: int) -> None:
        self.owner, self.key, self.size, self.path, self.fd = owner, key, size, path, fd
        self.failed = False  # dropped: further writes do nothing
        self.complete = False
        self._starts: list[int] = []  # disjoint spans written, [start, end), sorted
        self._ends: list[int] = []
        self._written = 0
        #: Held while ``fd`` is used: it is closed only under it, so a write never reaches
        #: a descriptor number reused by another file.
        self.io = threading.Lock()

    def write(self, data: memoryview | bytes, offset: int) -> None:
        """Bytes ``data`` of the file at ``offset`` (a reader was served them)."""
        end = min(offset + len(data), self.size)
        with self.io:
            if self.failed or self.complete or end <= offset:
                return
            try:
                os.pwrite(self.fd, data[: end - offset], offset)
                error = None
            except OSError as exc:
                error = exc
        if error is not None:
            self.owner.drop(self, f"cannot write: {error}")
            return
        self.owner.wrote(self, self._cover(offset, end))

    def _cover(self, lo: int, hi: int) -> int:
        """Record ``[lo, hi)`` as written; the bytes of it not written before (under the owner's lock)."""
        with self.owner.lock:
            i = bisect.bisect_left(self._ends, lo)  # the first span ending at or after lo
            j = bisect.bisect_right(self._starts, hi)  # past the last span starting at or before hi
            overlap = sum(max(0, min(e, hi) - max(s, lo)) for s, e in zip(self._starts[i:j], self._ends[i:j], strict=True))
            if i < j:
                self._starts[i:j], self._ends[i:j] = [min(lo, self._starts[i])], [max(hi, self._ends[j - 1])]
            else:
                self._starts.insert(i, lo)
                self._ends.insert(i, hi)
            self._written += hi - lo - overlap
            return hi - lo - overlap

    @property
    def written(self) -> int:
        return self._written


class FileCopies:
    """The plain copies under ``root/files`` (see the module docstring)."""

    def __init__(self, root: str, budget: int, min_size: int = MIN_SIZE) -> None:
        self.dir = os.path.join(root, FILES)
        self.partial = os.path.join(self.dir, PARTIAL)
        self.budget, self.min_size = budget, min_size
        self.lock = threading.Lock()
        self._copies: OrderedDict[str, int] = OrderedDict()  # key -> size, least recently opened first
        self._bytes = 0
        self._filling: OrderedDict[str, Filling] = OrderedDict()  # least recently written first
        self._finisher = ThreadPoolExecutor(1, thread_name_prefix="fabric-copies")
        self.made = self.evicted = self.dropped = 0
        shutil.rmtree(self.partial, ignore_errors=True)
        os.makedirs(self.partial, mode=0o700, exist_ok=True)
        self._load()

    def _load(self) -> None:
        found: list[tuple[float, str, int]] = []
        for sub in os.scandir(self.dir):
            if sub.name == PARTIAL or not sub.is_dir(follow_symlinks=False):
                continue
            for f in os.scandir(sub.path):
                if f.is_file(follow_symlinks=False) and len(f.name) == 64:
                    st = f.stat(follow_symlinks=False)
                    found.append((st.st_mtime, f.name, st.st_size))
        for _, key, size in sorted(found):
            self._copies[key] = size
            self._bytes += size
        self._evict()

    def close(self) -> None:
        """Finish the copies complete already; drop those still being filled."""
        self._finisher.shutdown(wait=True)
        for f in list(self._filling.values()):
            self.drop(f, "")

    @property
    def bytes(self) -> int:
        return self._bytes

    def path_of(self, key: str) -> str:
        return os.path.join(self.dir, key[:2], key)

    def open(self, key: str, size: int) -> int | None:
        """A read-only descriptor of the complete copy ``key`` (``size`` bytes), or None."""
        with self.lock:
            if key not in self._copies:
                return None
            self._copies.move_to_end(key)
        path = self.path_of(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            self._forget(key)
            return None
        if os.fstat(fd).st_size != size:
            os.close(fd)
            log.warning("copy %s has the wrong size: removed", path)
            self._remove(key)
            return None
        try:
            os.utime(fd)  # its place in the eviction order, across restarts
        except OSError:
            pass
        return fd

    def filling(self, key: str, size: int) -> Filling | None:
        """The copy of ``key`` being filled (started now if need be); None where none is made."""
        if size < self.min_size or size > self.budget:
            return None
        with self.lock:
            f = self._filling.get(key)
            if f is not None or key in self._copies:
                return f
            path = os.path.join(self.partial, key)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                os.ftruncate(fd, size)
            except OSError as exc:
                log.info("cannot start a copy in %s: %s", self.partial, exc)
                return None
            f = self._filling[key] = Filling(self, key, size, path, fd)
            oldest = next(iter(self._filling.values())) if len(self._filling) > MAX_FILLING else None
        if oldest is not None:
            self.drop(oldest, "")
        return f

    def wrote(self, f: Filling, added: int) -> None:
        with self.lock:
            if f.key in self._filling:
                self._filling.move_to_end(f.key)
            done = f.written >= f.size and not f.complete and not f.failed
            if done:
                f.complete = True
        if done:
            try:
                self._finisher.submit(self._finish, f)
            except RuntimeError:  # closed
                f.complete = False
                self.drop(f, "")

    def drop(self, f: Filling, why: str) -> None:
        """Give up the copy being filled (``why``: logged, when given); not one complete."""
        with self.lock:
            if f.failed or f.complete:
                return
            f.failed = True
            self._filling.pop(f.key, None)
            self.dropped += 1
        if why:
            log.info("copy %s dropped: %s", f.key, why)
        with f.io:
            os.close(f.fd)
        try:
            os.unlink(f.path)
        except OSError:
            pass

    def _finish(self, f: Filling) -> None:
        dest = self.path_of(f.key)
        error = None
        with f.io:
            try:
                os.fdatasync(f.fd)  # (renamed in place before its bytes reach the disk, a copy could read as zeros after a power loss)
                os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
                os.rename(f.path, dest)
            except OSError as exc:
                error = exc
            os.close(f.fd)
        with self.lock:
            self._filling.pop(f.key, None)
            if error is None:
                self._copies[f.key] = f.size
                self._bytes += f.size
                self.made += 1
            else:
                f.failed = True
                self.dropped += 1
        if error is not None:
            log.info("copy %s dropped: cannot finish: %s", f.key, error)
            try:
                os.unlink(f.path)
            except OSError:
                pass
            return
        self._evict()

    def _evict(self) -> None:
        while True:
            with self.lock:
                if self._bytes <= self.budget or not self._copies:
                    return
                key, size = self._copies.popitem(last=False)
                self._bytes -= size
                self.evicted += 1
            try:
                os.unlink(self.path_of(key))
            except OSError:
                pass

    def _forget(self, key: str) -> None:
        with self.lock:
            size = self._copies.pop(key, None)
            if size is not None:
                self._bytes -= size

    def _remove(self, key: str) -> None:
        self._forget(key)
        try:
            os.unlink(self.path_of(key))
        except OSError:
            pass

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"copies": len(self._copies), "bytes": self._bytes, "filling": len(self._filling),
                    "made": self.made, "evicted": self.evicted, "dropped": self.dropped}
