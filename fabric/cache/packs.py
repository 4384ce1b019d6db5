"""A mount's ``--cache-dir``: chunks appended to pack files and read back many at a time.

One file per 64 KiB chunk costs a system call and a small disk read per chunk: about 1.1
CPU-s per GiB read back on this project's machines, where the same bytes read 1 MiB at a
time from large files cost 0.1 (bench/RESULTS.md, "The disk under a cold cached read"). So
chunks are appended, in the order they arrive, to *packs*. The chunks of a file fetched in
order lie next to each other, and the whole chunks a kernel read request covers come back
with one ``O_DIRECT`` read.

- **Layout**: ``packs2/NNNNNNNN.pack``, numbered in the order they were started. A pack is a
  sequence of records: a 48-byte header (magic ``FCK2``, the chunk's length as u32
  little-endian, the chunk's 32-byte id, the xxh3-64 of its bytes as u64 little-endian),
  then the chunk. A pack is *sealed* at
  ``pack_bytes``: its index (``NNNNNNNN.idx``: id, offset, length of each record) is
  written beside it, and it is never written again.
- **Index**: in memory, chunk id -> (pack, offset, length). Start-up rebuilds it from the
  ``.idx`` files, and from the records' headers for a pack without a valid one (the pack
  being written when the process ended: a torn record at its end is cut off, and the pack
  is sealed). Nothing is fsynced: this is a cache, and every chunk read back is checked.
- **Verification**: a chunk is put only once its caller has checked it against its id
  (BLAKE3). Every chunk read back is checked against its record's header: magic, length,
  id, and the xxh3 of its bytes, as a frame's checksum guards the spoke's cache and the wire
  (DESIGN.md §2: corruption at rest is caught cheaply; on 64 KiB chunks xxh3 costs 0.09
  CPU-s per GiB here against BLAKE3's 0.29, and BLAKE3 was a fifth of a mount's samples in
  a cold cached read). A damaged one is dropped from the
  index (counted in ``cache_corruptions``) and the caller fetches it again; its bytes stay
  in their pack until the pack goes. Like a spoke's own cache, the directory is trusted not
  to be written by anyone else (it is locked, and created with the mount's umask); a
  directory that is not the mount's own (``--spoke-cache``) is checked against ids instead.
- **Budget and eviction, by pack**: the packs' sizes stay within ``budget``. The policy is
  the chunk cache's (:mod:`fabric.cache.disk`) at the grain of packs: a sealed pack enters a
  *window* (10% of the budget, at least two packs); when the window overflows, its oldest
  pack moves to *main* if main has room or main's least recently read pack is dead, and is
  deleted otherwise. Dead means not read during the last 2 x budget bytes of reads (hits,
  and misses appended), or, for a pack most of whose chunks the cache had evicted before,
  longer than their mean reuse distance (:mod:`fabric.cache.ghosts`). A read from a
  pack moves it to main's most recently read end. A cyclic scan larger than the cache keeps
  hitting what main holds, where plain LRU would hit nothing. Evicting a pack loses the
  hot chunks among its cold ones.
- **Failures**: a chunk that cannot be written (disk full, I/O error) is just not cached; a
  pack deleted or unreadable under a reader is a miss.
- **One user**: the directory is locked for the life of the cache, as
  :class:`~fabric.cache.disk.DiskCache` locks its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import xxhash

from fabric.cache.ghosts import Ghosts, ghosts_for
from fabric.util.direct_io import DirectReader
from fabric.util.dirlock import DirLock
from fabric.util.fileio import pwrite_all

log = logging.getLogger("fabric.cache")

MAGIC = b"FCK2"
HEADER = struct.Struct("<4sI32sQ")
#: Where the packs live under the cache directory; ``OLD_LAYOUTS`` are removed at start-up.
PACKS = "packs2"
OLD_LAYOUTS = ("packs",)  # records without a checksum (FCK1)
INDEX_RECORD = struct.Struct("<32sII")
#: A pack is sealed at this size (smaller for a small budget: the window holds several).
PACK_BYTES = 64 * 1024 * 1024
MIN_PACK_BYTES = 1024 * 1024
#: The most bytes one read of neighbouring chunks asks for (a kernel request is 1 MiB: its
#: chunks and their headers fit).
RUN_BYTES = 2 * 1024 * 1024
#: The largest chunk kept (a larger one is not cached).
MAX_CHUNK = 1024 * 1024
WINDOW_FRACTION = 0.10
DEAD_AFTER_BUDGETS = 2
#: A failing disk is logged at most this often (seconds).
WRITE_ERROR_LOG_INTERVAL = 60.0

Location = tuple[int, int, int]  # pack number, offset of the chunk's bytes, length


@dataclass
class _Pack:
    number: int
    size: int = 0
    ids: list[bytes] = field(default_factory=list)  # of its records, in order (where they are: the index)
    last: int = 0  # read clock at its last read (or its last append)
    reuse_total: int = 0  # of the reuse distances of its chunks that the cache remembered
    reuse_known: int = 0  # how many those were

    @property
    def reuse(self) -> int:
        """The mean reuse distance of its chunks, when at least half of them had one (else 0)."""
        return self.reuse_total // self.reuse_known if self.reuse_known * 2 >= len(self.ids) > 0 else 0


class PackCache:
    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget
        self.dir = os.path.join(root, PACKS)
        self.pack_bytes = max(MIN_PACK_BYTES, min(PACK_BYTES, budget // 20))
        self.window_cap = max(int(budget * WINDOW_FRACTION), 2 * self.pack_bytes)
        # Main leaves room for a full window and the pack being written: else each pack sealed
        # would push main's least recently read pack out, dead or not (plain FIFO).
        self.main_cap = max(budget - self.window_cap - self.pack_bytes, 0)
        self._lock = threading.Lock()  # the index, the packs, the segments, the counters
        self._writing = threading.Lock()  # appends, one at a time (taken before _lock)
        self._index: dict[bytes, Location] = {}
        self._packs: dict[int, _Pack] = {}
        self._window: OrderedDict[int, None] = OrderedDict()
        self._main: OrderedDict[int, None] = OrderedDict()
        self._window_bytes = self._main_bytes = 0
        self._open: _Pack | None = None
        self._fd = -1
        self._next = 0
        self._clock = 0  # bytes read: hits, and misses appended
        self._ghosts = Ghosts(ghosts_for(budget))
        self._closed = False
        self._error_logged = float("-inf")
        self._reader = DirectReader(RUN_BYTES + MAX_CHUNK + HEADER.size)
        self.hits = self.misses = self.evictions = self.corruptions = 0
        self._dirlock = DirLock(root, "cache directory")
        try:
            self._load()
        except BaseException:
            self._dirlock.release()
            raise

    def close(self) -> None:
        """Seal the pack being written (so a restart reads its index) and release the
        directory's lock; later writes are not cached (idempotent)."""
        with self._writing:
            if self._open is not None:
                self._seal()
            self._closed = True
        self._dirlock.release()

    # -- start-up --------------------------------------------------------------------------
    def _path(self, number: int, ext: str = "pack") -> str:
        return os.path.join(self.dir, f"{number:08d}.{ext}")

    def _load(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        self._remove_old_layouts()
        names = set(os.listdir(self.dir))
        numbers = []
        for name in names:
            stem, _, ext = name.partition(".")
            if ext == "pack" and stem.isdigit():
                numbers.append(int(stem))
            elif not (ext == "idx" and f"{stem}.pack" in names):
                os.unlink(os.path.join(self.dir, name))  # a temporary, or an index without its pack
        for number in sorted(numbers):
            size = os.path.getsize(self._path(number))
            records = self._read_index(number, size)
            if records is None:
                records = self._scan(number, size)
                if not records:
                    os.unlink(self._path(number))
                    continue
                self._write_index(number, records)
                size = records[-1][1] + records[-1][2]  # where the scan cut a torn tail off
            pack = _Pack(number, size, [cid for cid, _, _ in records])
            self._packs[number] = pack
            for cid, off, n in records:  # a later pack's copy of a chunk wins
                self._index[cid] = (number, off, n)
            self._main[number] = None  # oldest first, as if read in that order
            self._main_bytes += pack.size
        self._next = max(numbers, default=-1) + 1
        self._shrink()

    def _remove_old_layouts(self) -> None:
        """Chunk files of the layout before packs (``XX/<id>``) and packs without checksums: removed, not read."""
        old = [n for n in os.listdir(self.root) if (len(n) == 2 and all(c in "0123456789abcdef" for c in n)) or n in OLD_LAYOUTS]
        for name in old:
            shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        if old:
            log.info("cache directory %s: removed the chunks of an older layout (chunks now live in %s)", self.root, PACKS)

    def _read_index(self, number: int, size: int) -> list[tuple[bytes, int, int]] | None:
        """A pack's ``.idx``, or None when it is missing or does not fit the pack (of ``size`` bytes)."""
        try:
            with open(self._path(number, "idx"), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        if len(raw) % INDEX_RECORD.size:
            return None
        records = [(bytes(cid), off, n) for cid, off, n in INDEX_RECORD.iter_unpack(raw)]
        if any(off < HEADER.size or off + n > size for _, off, n in records):
            return None
        return records

    def _scan(self, number: int, size: int) -> list[tuple[bytes, int, int]]:
        """Walk the record headers of a pack of ``size`` bytes; cut off a torn record at its end."""
        records = []
        fd = os.open(self._path(number), os.O_RDWR)
        try:
            off = 0
            while off + HEADER.size <= size:
                magic, n, cid, _ = HEADER.unpack(os.pread(fd, HEADER.size, off))
                if magic != MAGIC or not 0 < n <= MAX_CHUNK or off + HEADER.size + n > size:
                    break
                records.append((cid, off + HEADER.size, n))
                off += HEADER.size + n
            if off < size:
                log.info("cache directory %s: cut a torn record off the end of pack %d (%d bytes)", self.root, number, size - off)
                os.ftruncate(fd, off)
        finally:
            os.close(fd)
        return records

    def _write_index(self, number: int, records: list[tuple[bytes, int, int]]) -> None:
        tmp = self._path(number, "idx.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(b"".join(INDEX_RECORD.pack(cid, off, n) for cid, off, n in records))
            os.replace(tmp, self._path(number, "idx"))
        except OSError as exc:  # the pack is still read; a restart scans it again
            self._write_failed(f"the index of pack {number}", exc)

    # -- accounting --------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Bytes of pack files (the one being written included)."""
        return self._window_bytes + self._main_bytes + (self._open.size if self._open is not None else 0)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "cache_bytes": self.used,
                "cache_budget_bytes": self.budget,
                "cache_entries": len(self._index),
                "cache_packs": len(self._packs),
                "cache_hits": self.hits,
                "cache_misses": self.misses,
                "cache_evictions": self.evictions,
                "cache_corruptions": self.corruptions,
            }

    def __contains__(self, cid: bytes) -> bool:
        with self._lock:
            return cid in self._index

    # -- writing -----------------------------------------------------------------------------
    def put(self, cid: bytes, data: bytes | memoryview) -> bool:
        """Append a chunk (unless it is cached already); False when it is not cached."""
        n = len(data)
        if not 0 < n <= MAX_CHUNK:
            return False
        with self._writing:
            with self._lock:
                if self._closed:
                    return False
                if cid in self._index:
                    return True
            try:
                pack = self._writable()
            except OSError as exc:
                self._write_failed(f"chunk {cid.hex()}", exc)
                return False
            off = pack.size
            try:
                pwrite_all(self._fd, [HEADER.pack(MAGIC, n, cid, xxhash.xxh3_64_intdigest(data)), data], off)
            except OSError as exc:
                self._write_failed(f"chunk {cid.hex()}", exc)
                self._cut(off)
                return False
            with self._lock:
                pack.size = off + HEADER.size + n
                pack.ids.append(cid)
                self._index[cid] = (pack.number, off + HEADER.size, n)
                self._clock += n  # a miss is a read too: without it, a main no one reads never ages
                pack.last = self._clock
                if distance := self._ghosts.reuse_distance(cid, self._clock):
                    pack.reuse_total += distance
                    pack.reuse_known += 1
            if pack.size >= self.pack_bytes:
                self._seal()
            else:
                with self._lock:
                    self._shrink()
        return True

    def _writable(self) -> _Pack:
        """The pack being written, started if there is none (with ``_writing`` held)."""
        if self._open is None:
            number = self._next
            self._fd = os.open(self._path(number), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._next += 1
            pack = _Pack(number)
            with self._lock:
                self._packs[number] = pack
                self._open = pack
        return self._open

    def _cut(self, size: int) -> None:
        """After a failed append: the pack being written ends where its last record did."""
        if self._fd >= 0:
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                pass  # the bytes past the last record are cut off at the next start-up

    def _write_failed(self, what: str, exc: OSError) -> None:
        now = time.monotonic()
        if now - self._error_logged >= WRITE_ERROR_LOG_INTERVAL:
            self._error_logged = now
            log.warning("cache directory %s: %s not cached (%s)", self.root, what, exc)

    def _seal(self) -> None:
        """Close the pack being written and write its index (with ``_writing`` held)."""
        pack = self._open
        assert pack is not None
        os.close(self._fd)
        self._fd = -1
        with self._lock:
            records = [(cid, *self._index[cid][1:]) for cid in pack.ids if self._in_pack(cid, pack.number)]
        self._write_index(pack.number, records)
        with self._lock:
            self._open = None
            self._window[pack.number] = None
            self._window_bytes += pack.size
            self._shrink()

    # -- eviction (with _lock held) ---------------------------------------------------------
    def _shrink(self) -> None:
        while self._window_bytes > self.window_cap:
            number, _ = self._window.popitem(last=False)
            pack = self._packs[number]
            self._window_bytes -= pack.size
            unread_for = pack.reuse or DEAD_AFTER_BUDGETS * self.budget
            while self._main_bytes + pack.size > self.main_cap and self._main and self._unread_for(next(iter(self._main))) > unread_for:
                self._evict(self._main, next(iter(self._main)))
            if self._main_bytes + pack.size <= self.main_cap:
                self._main[number] = None
                self._main_bytes += pack.size
            else:
                self._drop(pack)
        while self.used > self.budget and (self._main or self._window):
            self._evict(self._main if self._main else self._window, next(iter(self._main or self._window)))

    def _in_pack(self, cid: bytes, number: int) -> bool:
        """Whether the index places ``cid`` in pack ``number`` (a later copy elsewhere wins; with ``_lock`` held)."""
        loc = self._index.get(cid)
        return loc is not None and loc[0] == number

    def _unread_for(self, number: int) -> int:
        return self._clock - self._packs[number].last

    def _evict(self, segment: OrderedDict[int, None], number: int) -> None:
        del segment[number]
        pack = self._packs[number]
        if segment is self._main:
            self._main_bytes -= pack.size
        else:
            self._window_bytes -= pack.size
        self._drop(pack)

    def _drop(self, pack: _Pack) -> None:
        """Forget a pack that is in no segment any more, and delete its files."""
        del self._packs[pack.number]
        for cid in pack.ids:
            if self._in_pack(cid, pack.number):
                del self._index[cid]
                self._ghosts.evicted(cid, pack.last)
        for ext in ("pack", "idx"):
            try:
                os.unlink(self._path(pack.number, ext))
            except FileNotFoundError:
                pass
        self.evictions += 1

    # -- reading -----------------------------------------------------------------------------
    def read(self, cid: bytes) -> bytes | None:
        """Chunk ``cid``, verified; None when it is not cached (or was damaged: then dropped)."""
        out: list[bytes] = []
        self._serve([cid], lambda _, piece: out.append(bytes(piece)))
        return out[0] if out else None

    def read_into(self, pairs: Sequence[tuple[bytes, memoryview]]) -> set[bytes]:
        """Copy cached chunks into their buffers (each exactly a chunk long), neighbours in a
        pack with one read; the ids served. The others are not cached, or were damaged
        (dropped): the caller fetches them."""
        buffers: dict[bytes, list[memoryview]] = {}
        for cid, dst in pairs:
            buffers.setdefault(cid, []).append(dst)

        def copy(cid: bytes, piece: memoryview) -> None:
            for dst in buffers[cid]:
                dst[:] = piece

        return self._serve(buffers, copy)

    def _serve(self, ids: Iterable[bytes], use: Callable[[bytes, memoryview], None]) -> set[bytes]:
        """Read the cached ones of ``ids`` (unique) in runs, check each, and hand it to ``use``."""
        wanted = list(ids)
        served: set[bytes] = set()
        for number, run in self._runs(wanted):
            start, end = run[0][1] - HEADER.size, run[-1][1] + run[-1][2]  # the first record's header too
            try:
                view = self._reader.read(self._path(number), start, end - start)
            except FileNotFoundError:
                continue  # evicted meanwhile
            except OSError as exc:
                log.warning("cache directory %s: cannot read pack %d: %s", self.root, number, exc)
                continue
            read = 0
            for cid, off, n in run:
                piece = view[off - start : off - start + n]
                if len(piece) != n or not _intact(view, off - start, cid, piece):
                    self._drop_damaged(cid, number)
                    continue
                use(cid, piece)
                served.add(cid)
                read += n
            self._hit(number, read)
        with self._lock:
            self.misses += len(wanted) - len(served)
            self.hits += len(served)
        return served

    def _runs(self, ids: Iterable[bytes]) -> list[tuple[int, list[tuple[bytes, int, int]]]]:
        """The cached ones of ``ids`` as runs of neighbouring records of one pack, each at
        most :data:`RUN_BYTES` long (a single larger chunk is a run of its own)."""
        with self._lock:
            found = sorted((loc, cid) for cid in ids if (loc := self._index.get(cid)) is not None)
        runs: list[tuple[int, list[tuple[bytes, int, int]]]] = []
        for (number, off, n), cid in found:
            if runs:
                last_number, run = runs[-1]
                _, last_off, last_n = run[-1]
                if last_number == number and off == last_off + last_n + HEADER.size and off + n - run[0][1] <= RUN_BYTES:
                    run.append((cid, off, n))
                    continue
            runs.append((number, [(cid, off, n)]))
        return runs

    def _drop_damaged(self, cid: bytes, number: int) -> None:
        with self._lock:
            if not self._in_pack(cid, number):
                return
            del self._index[cid]
            self.corruptions += 1
        log.warning("cache directory %s: dropping damaged chunk %s (pack %d)", self.root, cid.hex(), number)

    def _hit(self, number: int, nbytes: int) -> None:
        with self._lock:
            self._clock += nbytes
            pack = self._packs.get(number)
            if pack is None:
                return
            pack.last = self._clock
            if number in self._window:
                del self._window[number]
                self._window_bytes -= pack.size
                self._main[number] = None
                self._main_bytes += pack.size
            elif number in self._main:
                self._main.move_to_end(number)


def _intact(view: memoryview, at: int, cid: bytes, piece: memoryview) -> bool:
    """Whether the record whose chunk bytes ``piece`` start at ``at`` in ``view`` is the one
    its header says: magic, length and id as the index has them, and the xxh3 of the bytes."""
    magic, n, stored, digest = HEADER.unpack_from(view, at - HEADER.size)
    return magic == MAGIC and n == len(piece) and stored == cid and xxhash.xxh3_64_intdigest(piece) == digest
