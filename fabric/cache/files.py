"""Whole files kept as plain files under a mount's ``--cache-dir``, for the kernel to read
them itself (FUSE passthrough: :mod:`fuse.kernel.immutable`).

A file read through a mount comes out of chunks (:mod:`fabric.cache.packs`), a copy and a
check per request in Python. A file whose plain bytes lie on the local disk can be handed
to the kernel instead, which then reads it at the disk's speed (bench/RESULTS.md, "FUSE
passthrough from Python"). This cache keeps those plain copies.

- **Layout**: ``files/XX/KEY-SUM`` where ``KEY`` (:func:`copy_key`) is the SHA-256 of the
  file's size and chunk ids, or of its chunk list's id (a version of a file, whatever its
  path), ``XX`` its first two digits, and ``SUM`` the xxh3-128 of the copy's bytes. Copies
  being filled lie in ``files/partial/PID-KEY``; start-up removes those of processes that are
  gone (and anything there not named so), so several processes may share the directory (a
  node's copies: ``fabric mount --copies-dir``). ``files/incoming/`` is another process's (:mod:`fabric.cache.seeds`): copies
  of files it wrote, placed under their names when complete; an :meth:`FileCopies.open` of a
  key this cache does not know looks for such a copy on disk.
- **Filling**: the bytes a mount serves its readers are written to the copy too, at their
  offsets and in any order (:meth:`Filling.write`). They were checked on the way: against
  their ids on arrival, against their records' checksums when read from the packs. Once
  every byte has been written, the copy is read back for its checksum, flushed to disk
  (``fdatasync``) and renamed into place, in a background thread. A copy is only ever made of files of at least
  ``min_size`` bytes (below that an open costs more than the read), and at most
  :data:`MAX_FILLING` are being filled at once (the least recently written is dropped).
- **Budget**: complete copies and the full sizes of those being filled stay within
  ``budget`` bytes: a copy started evicts the least recently opened copies (then, if need be,
  the least recently written of those being filled). The order survives restarts (a copy's
  mtime is its last open). An evicted copy still open is read to its end (the kernel holds it).
- **At rest**: the kernel reads a copy as it reads any local file, unchecked. So no copy is
  served whose bytes were last checked (read whole, size and checksum) more than
  ``recheck_after`` ago (:data:`RECHECK_AFTER`, a day): DESIGN.md §8, corruption is never
  served, to the bound a scrub gives. A copy is checked when it is made (its bytes summed as
  they are named), by the scrub (:mod:`fabric.cache.scrub`, :meth:`FileCopies.check_copy`),
  or, where neither is recent enough, by its first :meth:`FileCopies.open`, which then leaves
  it in the page cache for the kernel's read. The time of its last check is kept with the copy
  (the extended attribute :data:`CHECKED_XATTR`, with the checksum it found), so a mount
  started again serves copies checked within the bound at once, as a mount that had stayed up
  would; a copy without that record (a file system without extended attributes) is checked
  after each start. A copy that fails is removed (counted in ``corruptions``) and its file
  served from chunks, which fills a new copy. With ``check`` off (``--no-passthrough-check``,
  for a file system that checks its data itself) nothing is checked. The directory is the
  mount's own (locked with the packs).
- **Failures**: a copy that cannot be written (disk full, I/O error) is dropped and its
  file served as before; a crash leaves partial copies, removed at the next start.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import xxhash

log = logging.getLogger("fabric.cache")

FILES = "files"
PARTIAL = "partial"
INCOMING = "incoming"
#: Files smaller than this are not copied.
MIN_SIZE = 1024 * 1024
#: Copies being filled at once, at most.
MAX_FILLING = 64
#: Bytes per read when a copy is read back for its checksum.
CHECK_READ = 8 * 1024 * 1024
#: Seconds a copy's last check stays good: older, it is checked again before it is served.
RECHECK_AFTER = 24 * 3600.0
#: The extended attribute that keeps the time of a copy's last check: ``"SECONDS CHECKSUM"``.
CHECKED_XATTR = "user.fabric.checked"
#: A check recorded this far in the future (a clock set back) is not taken.
CLOCK_SLACK = 300.0


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
        self._cover(offset, end)
        self.owner.wrote(self)

    def _cover(self, lo: int, hi: int) -> None:
        """Record ``[lo, hi)`` as written (under the owner's lock)."""
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

    @property
    def written(self) -> int:
        return self._written


class FileCopies:
    """The plain copies under ``root/files`` (see the module docstring)."""

    def __init__(self, root: str, budget: int, min_size: int = MIN_SIZE, check: bool = True,
                 recheck_after: float = RECHECK_AFTER) -> None:
        """``check``: serve no copy last checked more than ``recheck_after`` seconds ago (off:
        trusted as the disk is; for a file system that checks its data itself)."""
        self.dir = os.path.join(root, FILES)
        self.partial = os.path.join(self.dir, PARTIAL)
        self.budget, self.min_size, self.check, self.recheck_after = budget, min_size, check, recheck_after
        self.lock = threading.Lock()
        #: key -> (size, checksum) of the complete copies, least recently opened first.
        self._copies: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._checked: dict[str, float] = {}  # key -> when it was last read back whole, and right
        self._checking: dict[str, tuple[threading.Event, bool]] = {}  # being read back (set once done), by the scrub
        self._bytes = 0
        self._filling: OrderedDict[str, Filling] = OrderedDict()  # least recently written first
        self._filling_bytes = 0  # the sizes of the copies being filled: reserved in the budget
        self._finisher = ThreadPoolExecutor(1, thread_name_prefix="fabric-copies")
        self.made = self.evicted = self.dropped = self.corruptions = self.scrubbed = 0
        os.makedirs(self.partial, mode=0o700, exist_ok=True)
        remove_orphans(self.partial)
        self._load()

    def _load(self) -> None:
        found: list[tuple[float, str, int, str]] = []
        for f, named in copy_files(self.dir):
            if named is None:
                unlink_quietly(f.path)
            else:
                found.append((f.stat(follow_symlinks=False).st_mtime, *named))
        for _, key, size, checksum in sorted(found):
            self._copies[key] = (size, checksum)
            self._bytes += size
            self._take_check(key, checksum)
        self._evict()

    def _take_check(self, key: str, checksum: str) -> None:
        """Take the time of the last check recorded with copy ``key`` (under the lock, or before
        the cache is shared)."""
        when = checked_at(self._path(key, checksum), checksum)
        if when is not None:
            self._checked[key] = when

    def _fresh(self, key: str, now: float) -> bool:
        """Whether copy ``key`` was checked within ``recheck_after`` of ``now`` (under the lock)."""
        return fresh(self._checked.get(key), now, self.recheck_after)

    def close(self) -> None:
        """Finish the copies complete already; drop those still being filled."""
        self._finisher.shutdown(wait=True)
        for f in list(self._filling.values()):
            self.drop(f, "")

    def _path(self, key: str, checksum: str) -> str:
        return copy_path(self.dir, key, checksum)

    def open(self, key: str, size: int) -> int | None:
        """A read-only descriptor of the complete copy ``key`` of a ``size``-byte file, or None
        (no such copy, or one that failed its check and was removed). The first open after
        start-up reads the copy whole to check it: call it outside locks other opens need."""
        with self.lock:
            held = self._copies.get(key)
        if held is None and (held := self._adopt(key)) is None:
            return None
        with self.lock:
            if key in self._copies:
                self._copies.move_to_end(key)
            checked = not self.check or self._fresh(key, time.time())
        fd = self._open_copy(key, held)
        if fd is None:
            return None
        if held[0] != size or (not checked and not self._verify(key, fd, held)):
            os.close(fd)
            self._damaged(key, "the file is read from chunks")
            return None
        try:
            os.utime(fd)  # its place in the eviction order, across restarts
        except OSError:
            pass
        return fd

    def _open_copy(self, key: str, held: tuple[int, str]) -> int | None:
        """A read-only descriptor of copy ``key`` (``held``: its size and checksum); None (and
        forgotten) where it is gone."""
        try:
            return os.open(self._path(key, held[1]), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            self._forget(key)
            return None

    def _adopt(self, key: str) -> tuple[int, str] | None:
        """A copy of ``key`` placed since start-up by another process (:mod:`fabric.cache.seeds`),
        now one of this cache's (unchecked yet); None where there is none."""
        named = find_copy(self.dir, key)
        if named is None:
            return None
        _, size, checksum = named
        with self.lock:
            if key not in self._copies:
                self._copies[key] = (size, checksum)
                self._bytes += size
                self._take_check(key, checksum)
        self._evict()
        return size, checksum

    def _verify(self, key: str, fd: int, held: tuple[int, str], scrub: bool = False) -> bool:
        """Whether copy ``key``, open as ``fd``, is ``held``'s size and checksum. An open waits
        for another open's check of it rather than read it too; it does not wait for the
        scrub's (``scrub``), which reads at the idle I/O priority behind every other reader."""
        done = None
        while True:
            with self.lock:
                if self._fresh(key, time.time()):
                    return True
                if key not in self._copies:
                    return False  # (found damaged by the check waited for, and removed)
                running = self._checking.get(key)
                if running is None:
                    done = threading.Event()
                    self._checking[key] = (done, scrub)
                    break
                if running[1] and not scrub:
                    break  # (read it too: its pages the scrub has read already come from memory)
            running[0].wait()
        try:
            when = check_whole(fd, *held)
            if when is not None:
                with self.lock:
                    self._checked[key] = when
            return when is not None
        finally:
            if done is not None:
                with self.lock:
                    del self._checking[key]
                done.set()

    def _damaged(self, key: str, then: str) -> None:
        held = self._forget(key)
        if held is None:
            return  # (removed already: by the check that found it, or evicted)
        log.warning("copy %s is damaged (not its file's size or checksum): removed; %s", key, then)
        with self.lock:
            self.corruptions += 1
        unlink_quietly(self._path(key, held[1]))

    # -- the scrub (:mod:`fabric.cache.scrub`) ---------------------------------------------
    def unchecked(self) -> list[str]:
        """The copies whose last check is not recent enough to serve them (none, or older than
        ``recheck_after``), most recently opened first."""
        now = time.time()
        with self.lock:
            return [k for k in reversed(self._copies) if not self._fresh(k, now)]

    def next_check_due(self) -> float:
        """Seconds until the oldest check of a copy goes stale (``recheck_after`` without copies)."""
        now = time.time()
        with self.lock:
            oldest = min((self._checked[k] for k in self._copies if self._fresh(k, now)), default=now)
        return max(0.0, oldest + self.recheck_after - now)

    def check_copy(self, key: str) -> bool | None:
        """Read copy ``key`` whole and check it now, unless its last check is recent enough:
        whether it is intact (a damaged one is removed); None where there is no such copy any more."""
        with self.lock:
            held = self._copies.get(key)
        if held is None or (fd := self._open_copy(key, held)) is None:
            return None
        try:
            intact = self._verify(key, fd, held, scrub=True)
        finally:
            os.close(fd)
        if not intact:
            self._damaged(key, "found by the scrub")
            return False
        with self.lock:
            self.scrubbed += 1
        return True

    def filling(self, key: str, size: int) -> Filling | None:
        """The copy of ``key`` being filled (started now if need be); None where none is made."""
        if size < self.min_size or size > self.budget:
            return None
        with self.lock:
            f = self._filling.get(key)
            if f is not None or key in self._copies:
                return f
            path = os.path.join(self.partial, f"{os.getpid()}-{key}")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                os.ftruncate(fd, size)
            except OSError as exc:
                log.info("cannot start a copy in %s: %s", self.partial, exc)
                return None
            f = self._filling[key] = Filling(self, key, size, path, fd)
            self._filling_bytes += size
            victims, count, reserved = [], len(self._filling), self._filling_bytes
            for old in self._filling.values():  # least recently written first
                if old is f or (count <= MAX_FILLING and reserved <= self.budget):
                    break
                victims.append(old)
                count, reserved = count - 1, reserved - old.size
        for old in victims:
            self.drop(old, "")
        self._evict()  # room for it among the copies
        return f

    def wrote(self, f: Filling) -> None:
        """``f`` was written to: finish it (in the background) once complete."""
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
            self._unreserve(f)
            self.dropped += 1
        if why:
            log.info("copy %s dropped: %s", f.key, why)
        with f.io:
            os.close(f.fd)
        unlink_quietly(f.path)

    def _finish(self, f: Filling) -> None:
        error = checksum = None
        with f.io:
            try:
                checksum = place_copy(self.dir, f.key, f.fd, f.path)
            except OSError as exc:
                error = exc
            os.close(f.fd)
        with self.lock:
            self._unreserve(f)
            if error is None and checksum is not None:
                self._copies[f.key] = (f.size, checksum)
                self._checked[f.key] = time.time()  # (summed as it was named: place_copy)
                self._bytes += f.size
                self.made += 1
            else:
                f.failed = True
                self.dropped += 1
        if error is not None:
            log.info("copy %s dropped: cannot finish: %s", f.key, error)
            unlink_quietly(f.path)
            return
        self._evict()

    def _unreserve(self, f: Filling) -> None:
        """``f`` is no longer being filled (under the lock)."""
        if self._filling.pop(f.key, None) is not None:
            self._filling_bytes -= f.size

    def _evict(self) -> None:
        """Remove the least recently opened copies until they and the copies being filled fit."""
        while True:
            with self.lock:
                if self._bytes + self._filling_bytes <= self.budget or not self._copies:
                    return
                key, (size, checksum) = self._copies.popitem(last=False)
                self._bytes -= size
                self.evicted += 1
            unlink_quietly(self._path(key, checksum))

    def _forget(self, key: str) -> tuple[int, str] | None:
        with self.lock:
            held = self._copies.pop(key, None)
            self._checked.pop(key, None)
            if held is not None:
                self._bytes -= held[0]
            return held

    def snapshot(self) -> dict[str, int]:
        now = time.time()
        with self.lock:
            return {"copies": len(self._copies), "bytes": self._bytes, "filling": len(self._filling), "filling_bytes": self._filling_bytes,
                    "made": self.made, "evicted": self.evicted, "dropped": self.dropped, "corruptions": self.corruptions,
                    "scrubbed": self.scrubbed, "unchecked": sum(1 for k in self._copies if not self._fresh(k, now))}


def copy_path(files_dir: str, key: str, checksum: str) -> str:
    """Where the copy of ``key`` whose bytes sum to ``checksum`` lies."""
    return os.path.join(files_dir, key[:2], f"{key}-{checksum}")


def copy_files(files_dir: str) -> Iterator[tuple[os.DirEntry, tuple[str, int, str] | None]]:
    """Every file of the copies' subdirectories of ``files_dir`` (not ``partial/`` or
    ``incoming/``), each with what :func:`copy_name` makes of it."""
    for sub in os.scandir(files_dir):
        if sub.name in (PARTIAL, INCOMING) or not sub.is_dir(follow_symlinks=False):
            continue
        for f in os.scandir(sub.path):
            yield f, copy_name(f, sub.name)


def find_copy(files_dir: str, key: str) -> tuple[str, int, str] | None:
    """``(key, size, checksum)`` of the copy of ``key`` in ``files_dir``, if there is one."""
    try:
        with os.scandir(os.path.join(files_dir, key[:2])) as found:
            return next((n for f in found if f.name.startswith(key) and (n := copy_name(f, key[:2]))), None)
    except OSError:
        return None


def place_copy(files_dir: str, key: str, fd: int, path: str) -> str:
    """Name the complete copy of ``key`` at ``path`` (open as ``fd``) as a copy: summed (which
    counts as its check: :func:`mark_checked`), flushed (renamed in place before its bytes
    reach the disk, a copy could read as zeros after a power loss) and renamed to
    ``files_dir/XX/KEY-SUM``; its checksum."""
    checksum = file_checksum(fd)
    mark_checked(fd, checksum)
    os.fdatasync(fd)
    dest = copy_path(files_dir, key, checksum)
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    os.rename(path, dest)
    return checksum


def copy_name(f: os.DirEntry, sub: str) -> tuple[str, int, str] | None:
    """``(key, size, checksum)`` of a copy's file in ``files/SUB/``; None for anything else."""
    key, _, checksum = f.name.partition("-")
    if len(key) != 64 or len(checksum) != 32 or key[:2] != sub or not f.is_file(follow_symlinks=False):
        return None
    return key, f.stat(follow_symlinks=False).st_size, checksum


def file_checksum(fd: int) -> str:
    """The xxh3-128 of the whole file open as ``fd``, in hex."""
    h = xxhash.xxh3_128()
    buf = bytearray(CHECK_READ)
    view = memoryview(buf)
    offset = 0
    while n := os.preadv(fd, [buf], offset):
        h.update(view[:n])
        offset += n
    return h.hexdigest()


def fresh(when: float | None, now: float, recheck_after: float) -> bool:
    """Whether a check made at ``when`` (None: none) still stands at ``now``."""
    return when is not None and now - recheck_after < when <= now + CLOCK_SLACK


def open_copy(files_dir: str, key: str, size: int, recheck_after: float = RECHECK_AFTER) -> int | None:
    """A read-only descriptor of the copy of ``key`` (a ``size``-byte file version) in
    ``files_dir``, for a process that reads the copies without keeping them (``fabric://``
    with ``copies=``): None where there is none. The copy is read whole and checked first
    unless its last check stands (as :class:`FileCopies` serves its own); one that fails is
    removed. Its mtime becomes its last open (the eviction order)."""
    named = find_copy(files_dir, key)
    if named is None:
        return None
    path = copy_path(files_dir, key, named[2])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # (evicted meanwhile)
    try:
        stale = not fresh(checked_at(path, named[2]), time.time(), recheck_after)
        if os.fstat(fd).st_size != size or (stale and check_whole(fd, size, named[2]) is None):
            log.warning("copy %s is damaged (not its file's size or checksum): removed", key)
            unlink_quietly(path)
            os.close(fd)
            return None
        os.utime(fd)
    except OSError:
        os.close(fd)
        return None
    return fd


def check_whole(fd: int, size: int, checksum: str) -> float | None:
    """Read the copy open as ``fd`` whole: where it is ``size`` bytes summing to ``checksum``,
    record the check (:func:`mark_checked`) and return its time; None where it is damaged."""
    if os.fstat(fd).st_size != size or file_checksum(fd) != checksum:
        return None
    return mark_checked(fd, checksum)


def mark_checked(fd: int, checksum: str) -> float:
    """Record with the copy open as ``fd`` that its bytes were found to sum to ``checksum``
    now (best effort: a file system without extended attributes keeps no record, and the copy
    is checked again after the next start); the time recorded."""
    now = time.time()
    try:
        os.setxattr(fd, CHECKED_XATTR, f"{now:.3f} {checksum}".encode())
    except OSError as exc:
        log.debug("cannot record the check of a copy: %s", exc)
    return now


def checked_at(path: str, checksum: str) -> float | None:
    """When the copy at ``path``, named for ``checksum``, was last found to sum to it (None:
    no such record, or one for other bytes)."""
    try:
        when, _, summed = os.getxattr(path, CHECKED_XATTR, follow_symlinks=False).decode().partition(" ")
        return float(when) if summed == checksum else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def remove_orphans(directory: str) -> None:
    """Remove the entries of ``directory`` (named ``PID-...``) that processes gone left, and
    this process's own (from a life before: a pid reused), and any not named so."""
    for f in os.scandir(directory):
        pid = f.name.partition("-")[0]
        if not (pid.isdigit() and os.path.exists(f"/proc/{pid}")) or int(pid) == os.getpid():
            unlink_quietly(f.path)


def unlink_quietly(path: str) -> None:
    """Remove ``path`` where it can be (one already gone is no error)."""
    try:
        os.unlink(path)
    except OSError:
        pass
