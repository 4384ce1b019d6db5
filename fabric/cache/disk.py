"""An on-disk cache of immutable blobs named by their content: a spoke's chunk
frames and metadata objects, a mount's chunks (``--cache-dir``).

- **Budget**: the bytes of cached files never exceed ``budget``; space is made
  before a file is written, under one lock.
- **Scan resistance**: new blobs enter a small *window* (10% of the budget).
  When the window overflows, its oldest blob moves to the *main* segment if
  main has room, or if main's least recently used blob has not been read
  during the last ``2 x budget`` bytes of reads (it is dead); otherwise the
  window's blob is dropped. A hit anywhere moves a blob to main's
  most-recently-used end. On a cyclic scan larger than the cache, main keeps
  a stable ~90% of the budget that hits every epoch, where plain LRU would
  hit nothing; a new working set still replaces a dead one.
- **Reuse distances** (:mod:`fabric.cache.ghosts`): the cache remembers when each evicted
  blob was last read. A blob stored again comes with its reuse distance, the bytes read
  since; main's least recently read blob then counts as dead once it has gone unread for
  longer than that, instead of ``2 x budget``. A cyclic scan more than twice the cache thus
  keeps what main holds (every blob comes back after a whole cycle, and main's blobs have
  not gone unread that long), and a small set read over and over displaces blobs read
  longer ago from its second pass on.
- **Plans** (:meth:`DiskCache.plan`): an owner (a job, a hint) may tell the cache
  which ids it will read soon, in order (:mod:`fabric.cache.plans`). A cached
  blob a plan lists is *held* apart from window and main: eviction takes window
  and main first (as above), then the held blob to be read last. Every
  :meth:`DiskCache.get`, hit or miss, consumes the id's place in the plans; a
  held blob no plan lists any more joins main (read: at its most recently used
  end; passed over or dropped: at its least recently used end). Without plans
  nothing is held and the policy above is exactly what runs.
- **Pins**: pinned blobs (unflushed writes) are never evicted; they count
  against the budget. A batch is pinned whole or not at all: its room is
  reserved under the lock before any file is written, so concurrent batches
  never pin more than the budget between them.
- **Verification**: ``verify(key, data)`` runs on every read (a frame's xxh3
  checksum, a chunk's id); a corrupt file is dropped (and counted) and the
  caller fetches the blob again.
- **Files reused**: a blob stored into a full cache is written over the file of a blob
  evicted to make room for it (renamed aside, written, cut to length, renamed into place)
  rather than into a new file beside an unlinked one. On ext4 without a journal, creating a
  file scans past every inode freed in the last minutes (``recently_deleted`` in the kernel's
  inode allocator): under eviction churn that cost 200-400 us of system time per 64 KiB
  chunk on this project's machines, against 13 us on a quiet file system (bench/RESULTS.md,
  "A cold spoke's chunk files"). Only a victim no larger than the new blob is reused, and
  the file is cut to the new length before it is written, so the budget still holds.
- **Failures**: a blob that cannot be written (disk full, I/O error) is just
  not cached; only pinned blobs, which must be kept, raise (StorageFull when the disk is full).
- **Restart**: blobs on disk are indexed again at start-up.
- **One user**: the directory is locked (``flock`` of the directory itself) for the
  life of the cache, until :meth:`DiskCache.close` or the process ends; another
  process opening it gets :class:`~fabric.util.dirlock.DirectoryInUse`.
- **Counters**: ``hits`` and ``misses`` count every :meth:`DiskCache.get`
  exactly (a corrupt or vanished file is a miss); they change under the lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fabric.errors import Corruption, StorageFull
from fabric.util.dirlock import DirLock
from fabric.util.fileio import write_all

from .ghosts import Ghosts, ghosts_for
from .plans import PLAN_MAX_IDS, Plans

log = logging.getLogger("fabric.cache")

WINDOW_FRACTION = 0.10
DEAD_AFTER_BUDGETS = 2


@dataclass
class _Item:
    size: int
    last: int  # read clock at the last access
    reuse: int = 0  # a window blob: read bytes between its last read before an eviction and its store (0: not known)


class CacheFull(StorageFull):
    """Pinned blobs fill the budget; nothing more can be pinned."""


class DiskCache:
    def __init__(
        self,
        root: str,
        budget: int,
        verify: Callable[[bytes, bytes], bool] | None = None,
        pinned: set[bytes] = frozenset(),
    ) -> None:
        self.root = root
        self.budget = budget
        self.window_cap = int(budget * WINDOW_FRACTION)
        self._verify = verify
        self._lock = threading.Lock()
        self._unpinned = threading.Condition(self._lock)  # pinned bytes went down
        self._window: OrderedDict[bytes, _Item] = OrderedDict()
        self._main: OrderedDict[bytes, _Item] = OrderedDict()
        self._pinned: dict[bytes, _Item] = {}
        self._held: dict[bytes, _Item] = {}  # cached blobs that plans list
        self._plans = Plans()
        self._window_bytes = self._main_bytes = self._pinned_bytes = self._held_bytes = 0
        # Blobs evicted while their writer was still writing them: their bytes stay
        # reserved until the writer has removed the file.
        self._doomed: dict[bytes, int] = {}
        self._doomed_bytes = 0
        self._clock = 0
        self._ghosts = Ghosts(ghosts_for(budget))
        # Keys being written, with how many writers each (a pin batch may rewrite a blob in flight).
        self._writing: dict[bytes, int] = {}
        self.hits = self.misses = self.evictions = self.corruptions = self.reused = 0
        # While a store makes room under the lock: the most bytes a blob it evicts may have for
        # its file to be reused (the new blob's size; None outside a store: evicted files are
        # unlinked), and the file of the first such victim, renamed aside for the store's write.
        self._salvage_max: int | None = None
        self._salvaged: str | None = None
        self._subdirs: set[str] = set()  # fan-out directories known to exist (no mkdir per write)
        self._dirlock = DirLock(root, "cache directory")
        try:
            self._reindex(pinned)
        except BaseException:
            self._dirlock.release()
            raise

    def close(self) -> None:
        """Release the directory's lock (the index stays usable in this process; idempotent)."""
        self._dirlock.release()

    # -- paths and start-up --------------------------------------------------
    def _path(self, key: bytes) -> str:
        h = key.hex()
        return os.path.join(self.root, h[:2], h)

    def file(self, key: bytes) -> str:
        """The file that holds ``key`` when cached (for a caller that reads it its own way,
        then reports the read with :meth:`touch` or the damage with :meth:`drop_corrupt`;
        it may be gone by the time it is opened)."""
        return self._path(key)

    def _reindex(self, pinned: set[bytes]) -> None:
        """Index the blobs already on disk; ``pinned`` ones stay pinned, the rest join main."""
        found = []
        for sub in os.listdir(self.root):
            d = os.path.join(self.root, sub)
            if len(sub) != 2 or not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                path = os.path.join(d, name)
                if name.startswith(".tmp"):
                    os.unlink(path)
                    continue
                st = os.stat(path)
                found.append((st.st_mtime, bytes.fromhex(name), st.st_size))
        for _, key, size in found:
            if key in pinned:
                self._pinned[key] = _Item(size, 0)
                self._pinned_bytes += size
        for _, key, size in sorted(found):
            if key in pinned:
                continue
            if self.used + size > self.budget:
                os.unlink(self._path(key))
                continue
            self._main[key] = _Item(size, 0)
            self._main_bytes += size

    # -- accounting ----------------------------------------------------------
    @property
    def used(self) -> int:
        return self._window_bytes + self._main_bytes + self._pinned_bytes + self._held_bytes + self._doomed_bytes

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "cache_bytes": self.used,
                "cache_budget_bytes": self.budget,
                "cache_pinned_bytes": self._pinned_bytes,
                "cache_entries": len(self._window) + len(self._main) + len(self._pinned) + len(self._held),
                "cache_planned_bytes": self._held_bytes,
                "cache_plan_ids": self._plans.places(),
                "cache_evictions": self.evictions,
                "cache_corruptions": self.corruptions,
                "cache_files_reused": self.reused,
            }

    def keys(self) -> list[bytes]:
        """Every cached key (pinned ones included)."""
        with self._lock:
            return [*self._window, *self._main, *self._pinned, *self._held]

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._window or key in self._main or key in self._pinned or key in self._held

    # -- reading -------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        """The blob, verified; ``None`` on a miss or when the cached copy was corrupt."""
        with self._lock:
            item = self._item(key)
            if self._plans:
                self._release(self._plans.consume(key), key)
            if item is None or key in self._writing:
                self.misses += 1
                return None
        try:
            data = _read_file(self._path(key), item.size + 1)  # one byte more tells a longer file
        except FileNotFoundError:
            self._forget(key, miss=True)
            return None
        if len(data) != item.size or (self._verify is not None and not self._verify(key, data)):
            self._forget(key, unlink=True, miss=True, corrupt=True)
            return None
        with self._lock:
            self._hit(key, item)
        return data

    def will_need(self, keys: Sequence[bytes]) -> None:
        """Have the kernel start reading the files of the cached ``keys`` from the disk, all at
        once (``POSIX_FADV_WILLNEED``), for a reader that will :meth:`get` them soon. Files
        already in the page cache cost an ``open`` and a ``close``; a key the cache lacks costs
        no system call (on a cold spoke that is most of a request's keys)."""
        with self._lock:
            keys = [key for key in keys if self._item(key) is not None and key not in self._writing]
        for key in keys:
            try:
                fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    def touch(self, key: bytes) -> int | None:
        """Count a read of ``key`` served from a copy held in front of this cache (a
        memory cache of verified blobs, a reader of the files beside it): like :meth:`get`
        it consumes the key's place in the plans, counts a hit and refreshes the blob's
        recency, but reads no file. A key this cache lacks only consumes its plans' places.
        The blob's size, or None when it is not cached."""
        with self._lock:
            if self._plans:
                self._release(self._plans.consume(key), key)
            item = self._item(key)
            if item is None:
                return None
            self._hit(key, item)
            return item.size

    def missed(self, key: bytes) -> None:
        """Count a read that found ``key`` missing and had it fetched and stored, for a reader
        that asked with ``in`` rather than :meth:`get`: like a missing :meth:`get`, it counts a
        miss and consumes the key's places in the plans. A blob stored into the window stays
        there (its first read proves nothing; a read again moves it to main); one a plan held
        joins main, as after any read of it."""
        with self._lock:
            self.misses += 1
            if self._plans:
                self._release(self._plans.consume(key), key)

    def _hit(self, key: bytes, item: _Item) -> None:
        """Under the lock: a read of ``item``; a blob in the window moves to main."""
        self.hits += 1
        self._clock += item.size
        item.last = self._clock
        if key in self._window:
            del self._window[key]
            self._window_bytes -= item.size
            self._main[key] = item
            self._main_bytes += item.size
        elif key in self._main:
            self._main.move_to_end(key)

    # -- plans ---------------------------------------------------------------
    def plan(self, ordered_ids: Sequence[bytes], name: str = "") -> int:
        """Tell the cache that ``ordered_ids`` will be read soon, in this order (the plan
        ``name``, replacing the one set before under that name; an empty list drops it).
        Until read, a cached blob listed is evicted only after every blob no plan lists,
        and the one to be read last first. Returns how many places were kept (bounded:
        :data:`fabric.cache.plans.PLAN_MAX_IDS` for all plans together)."""
        ids = list(ordered_ids[:PLAN_MAX_IDS])
        if not all(isinstance(k, bytes) and k for k in ids):
            raise ValueError("a plan lists blob ids: non-empty bytes")
        with self._lock:
            planned, released = self._plans.set(name, ids)
            self._release(released, None)
            for key in planned:
                self._hold(key)
            return len(ids)

    def drop_plan(self, name: str = "") -> None:
        """Forget the plan ``name`` (its blobs are evicted as any others again)."""
        with self._lock:
            self._release(self._plans.drop(name), None)

    # -- writing -------------------------------------------------------------
    def put(self, key: bytes, data: bytes, pin: bool = False) -> bool:
        """Cache a blob; returns False when it was not kept (too big for the window, or
        not writable). A pinned blob is on disk for good (fsynced) when this returns; pinning
        is all or nothing as in :meth:`put_pinned`."""
        if pin:
            self._pin_batch({key: data}, durable=True)
            return True
        return self._store(key, data)

    def put_pinned(
        self, blobs: Iterable[tuple[bytes, bytes]], wait: float = 0.0, written: Callable[[], None] | None = None
    ) -> int:
        """Pin a batch of blobs, on disk for good when this returns: one sync of the file
        system for the batch, not an fsync per blob. How many were not cached before.
        ``written`` is called once the batch's files are written and readable, before that
        sync (which waits for every writer's dirty pages on the file system).

        When the batch cannot fit beside what is pinned, wait up to ``wait`` seconds for
        blobs to be unpinned (back-pressure: the writer is slowed to the pace at which
        pinned blobs are released), then CacheFull. All or nothing: CacheFull, a full disk
        (StorageFull) and the OSError of a blob that cannot be written or synced leave none
        of the batch pinned (blobs cached before stay cached, unpinned)."""
        return self._pin_batch(dict(blobs), durable=False, wait=wait, written=written)

    def _pin_batch(
        self, batch: dict[bytes, bytes], durable: bool, wait: float = 0.0, written: Callable[[], None] | None = None
    ) -> int:
        """Reserve and pin the whole batch under the lock, then write its files; ``durable``
        fsyncs each file, else one sync of the file system covers the batch (``written`` is
        called before it)."""
        deadline = time.monotonic() + wait
        with self._lock:
            while True:
                extra = sum(len(data) for key, data in batch.items() if key not in self._pinned)
                left = deadline - time.monotonic()
                if self._pinned_bytes + extra <= self.budget:
                    break
                if extra > self.budget or left <= 0:
                    waited = f" after waiting {wait:g} s for pinned blobs to be released" if wait > 0 else ""
                    raise CacheFull(
                        f"{extra} more bytes pinned would exceed the cache budget of {self.budget} bytes "
                        f"({self._pinned_bytes} pinned by writes not yet at the hub){waited}"
                    )
                self._unpinned.wait(left)
            promoted = [key for key in batch if key not in self._pinned and self._pin_locked(key)]
            fresh = [key for key in batch if key not in self._pinned]
            # A blob another writer has in flight may not be on disk yet: this batch writes it too.
            to_write = list(dict.fromkeys([*(key for key in batch if key in self._writing), *fresh]))
            for key in fresh:
                self._clock += len(batch[key])
                self._pinned[key] = _Item(len(batch[key]), self._clock)
                self._pinned_bytes += len(batch[key])
            for key in to_write:
                self._writing[key] = self._writing.get(key, 0) + 1
            self._make_room(0)  # unpinned blobs make way; their files go before the new ones are written
        try:
            try:
                for key in to_write:
                    self._write(key, batch[key], durable)
            finally:
                self._written(to_write)  # readable from here on
            if written is not None:
                written()
            if not durable:
                sync_filesystem(self.root)
        except BaseException as exc:
            self._unpin_failed(fresh, promoted)
            with self._lock:  # the files of the blobs just forgotten go too
                for key in to_write:
                    self._unlink_unindexed(key)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageFull(f"the cache's disk is full: {len(batch)} blobs that must be kept were not written") from exc
            raise
        return len(fresh)

    def _unpin_failed(self, fresh: list[bytes], promoted: list[bytes]) -> None:
        """Undo the pins of a batch that failed: its new blobs are forgotten, cached ones unpinned."""
        with self._lock:
            for key in fresh:
                self._move(key, ("_pinned",), None)
            for key in promoted:
                self._unpin_locked(key)
            self._make_room(0)

    def _store(self, key: bytes, data: bytes) -> bool:
        size = len(data)
        with self._lock:
            if key in self._pinned or key in self._writing or key in self._window or key in self._main or key in self._held:
                return True
            if size > self.window_cap:
                return False
            self._clock += size
            self._salvage_max = size
            reuse_distance = self._ghosts.reuse_distance(key, self._clock)  # (and the eviction forgotten)
            try:
                if self._plans.planned(key):
                    self._held[key] = _Item(size, self._clock)
                    self._held_bytes += size
                    self._plans.noted(key)
                else:
                    self._window[key] = _Item(size, self._clock, reuse_distance)
                    self._window_bytes += size
                    self._spill_window()
                # Files of victims go before the new file is written: disk use stays within the
                # budget, but for the one this write reuses.
                self._make_room(0)
            finally:
                reuse, self._salvaged, self._salvage_max = self._salvaged, None, None
            if key not in self._window and key not in self._main and key not in self._held:
                if reuse is not None:
                    self._remove_file(reuse)
                return False
            self._writing[key] = 1
            self.reused += reuse is not None
        try:
            self._write(key, data, False, reuse)
        except OSError as exc:
            self._forget(key)
            log.warning("cache %s: cannot store %s (%s); not cached", self.root, key.hex(), exc)
            return False
        finally:
            self._written([key])
        return True

    def _written(self, keys: list[bytes]) -> None:
        """A writer is done with ``keys``: a blob evicted or dropped meanwhile leaves no file behind."""
        with self._lock:
            for key in keys:
                left = self._writing.pop(key) - 1
                if left:
                    self._writing[key] = left
                    continue  # the last writer cleans up
                # A blob evicted while it was written kept its bytes reserved until now; one evicted
                # or dropped meanwhile (and not cached again) leaves no file behind.
                self._doomed_bytes -= self._doomed.pop(key, 0)
                self._unlink_unindexed(key)

    def _unlink_unindexed(self, key: bytes) -> None:
        """Under the lock: remove ``key``'s file unless the cache holds the blob or a writer is writing it."""
        if not (key in self._window or key in self._main or key in self._pinned or key in self._held or key in self._writing):
            self._unlink(key)

    def pin(self, key: bytes) -> bool:
        """Pin a cached blob; False when it is not cached."""
        with self._lock:
            return self._pin_locked(key)

    def _pin_locked(self, key: bytes) -> bool:
        return self._move(key, ("_window", "_main", "_held"), "_pinned") is not None or key in self._pinned

    def unpin(self, key: bytes) -> None:
        with self._lock:
            if self._unpin_locked(key):
                self._make_room(0)

    def _unpin_locked(self, key: bytes) -> bool:
        """A pinned blob joins main (or the held blobs, if a plan lists it); False if not pinned."""
        if self._move(key, ("_pinned",), "_main") is None:
            return False
        self._hold(key)
        return True

    def drop(self, key: bytes) -> None:
        self._forget(key, unlink=True)

    def scrub(self, key: bytes) -> bytes | None:
        """The blob as :meth:`get` reads it, for a check of the whole cache (fsck), or ``None``
        when it is not cached (evicted or being written meanwhile: not damage). A corrupt copy
        is dropped, counted and raised as :class:`~fabric.errors.Corruption`. The read changes
        no recency, plan or hit counter."""
        with self._lock:
            item = self._item(key)
            if item is None or key in self._writing:
                return None
        try:
            with open(self._path(key), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) == item.size and (self._verify is None or self._verify(key, data)):
            return data
        with self._lock:
            if key in self._writing or self._item(key) is not item:
                return None  # replaced meanwhile: what was read is not what is cached now
            self._forget_locked(key, unlink=True, corrupt=True)
        raise Corruption(f"cached blob {key.hex()} failed its check and was dropped")

    def _item(self, key: bytes) -> _Item | None:
        """Under the lock: the blob's index entry, in whichever segment holds it."""
        return self._window.get(key) or self._main.get(key) or self._pinned.get(key) or self._held.get(key)

    def drop_corrupt(self, key: bytes) -> None:
        """Drop a blob its reader found damaged (a check beyond ``verify``), and count it."""
        self._forget(key, unlink=True, corrupt=True)

    # -- internals (called with the lock held) -------------------------------
    def _make_room(self, size: int) -> None:
        """Evict until ``size`` more bytes fit: unproven window blobs first, then main's LRU,
        then the planned blob to be read last."""
        while self.used + size > self.budget and (self._window or self._main):
            seg = self._window if self._window else self._main
            key, item = seg.popitem(last=False)
            if seg is self._window:
                self._window_bytes -= item.size
            else:
                self._main_bytes -= item.size
            self._evict_locked(key, item)
        while self.used + size > self.budget and self._held:
            victim = self._plans.victim(self._held.__contains__)
            if victim is None:  # cannot happen: every held blob is planned
                victim = next(iter(self._held))
            item = self._held.pop(victim)
            self._held_bytes -= item.size
            self._evict_locked(victim, item)

    def _hold(self, key: bytes) -> None:
        """A cached blob a plan lists leaves window or main for the held segment."""
        if self._plans.planned(key) and self._move(key, ("_window", "_main"), "_held") is not None:
            self._plans.noted(key)

    def _release(self, keys: list[bytes], read: bytes | None) -> None:
        """Held blobs no plan lists any more join main: ``read`` (just read) at the most
        recently used end, the others (passed over, or their plan dropped) at the least."""
        for key in keys:
            if self._move(key, ("_held",), "_main") is not None and key != read:
                self._main.move_to_end(key, last=False)

    def _move(self, key: bytes, sources: tuple[str, ...], to: str | None) -> _Item | None:
        """Move ``key`` from the first of the segments ``sources`` (``"_window"``, ``"_main"``,
        ``"_pinned"``, ``"_held"``) that has it to the segment ``to`` (``None``: out of the
        index), its bytes with it; the item, or ``None`` when no source had it."""
        for src in sources:
            item = getattr(self, src).pop(key, None)
            if item is None:
                continue
            setattr(self, f"{src}_bytes", getattr(self, f"{src}_bytes") - item.size)
            if src == "_pinned":
                self._unpinned.notify_all()
            if to is not None:
                getattr(self, to)[key] = item
                setattr(self, f"{to}_bytes", getattr(self, f"{to}_bytes") + item.size)
            return item
        return None

    def _spill_window(self) -> None:
        while self._window_bytes > self.window_cap:
            key, item = self._window.popitem(last=False)
            self._window_bytes -= item.size
            main_cap = self.budget - self.window_cap - self._pinned_bytes - self._held_bytes
            unread_for = item.reuse or DEAD_AFTER_BUDGETS * self.budget
            while self._main and self._main_bytes + item.size > main_cap and self._clock - next(iter(self._main.values())).last > unread_for:
                old_key, old = self._main.popitem(last=False)
                self._main_bytes -= old.size
                self._evict_locked(old_key, old)
            if self._main_bytes + item.size <= main_cap:
                self._main[key] = item
                self._main_bytes += item.size
            else:
                self._evict_locked(key, item)

    def _evict_locked(self, key: bytes, item: _Item) -> None:
        """The file of an evicted blob goes at once, under the lock, so its bytes are only
        reused once it is gone; a blob still being written is removed by its writer."""
        self.evictions += 1
        self._ghosts.evicted(key, item.last)
        if key in self._writing:
            self._doomed[key] = item.size
            self._doomed_bytes += item.size
        elif self._salvage_max is not None and self._salvaged is None and item.size <= self._salvage_max:  # a store's victim: its file is reused
            aside = self._spare_path(key)
            try:
                os.rename(self._path(key), aside)
                self._salvaged = aside
            except OSError:
                self._unlink(key)
        else:
            self._unlink(key)

    def _forget(self, key: bytes, unlink: bool = False, miss: bool = False, corrupt: bool = False) -> None:
        with self._lock:
            self._forget_locked(key, unlink, miss, corrupt)

    def _forget_locked(self, key: bytes, unlink: bool = False, miss: bool = False, corrupt: bool = False) -> None:
        self.misses += miss
        self.corruptions += corrupt
        for seg in ("_window", "_main", "_pinned", "_held"):
            self._move(key, (seg,), None)
        if unlink:
            self._unlink(key)  # under the lock: the bytes are free only once the file is gone

    def _unlink(self, key: bytes) -> None:
        self._remove_file(self._path(key))

    def _remove_file(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # no such file
            os.unlink(path)

    def _spare_path(self, key: bytes) -> str:
        """Where an evicted blob's file waits to be written over (a temporary name: removed
        at start-up if the process ends first)."""
        return f"{os.path.dirname(self._path(key))}/.tmp-{os.getpid()}-{threading.get_ident()}-reuse-{key.hex()[:16]}"

    def _open_for_write(self, tmp: str, parent: str, reused: bool) -> int:
        """A descriptor to write ``tmp``: the evicted file there (``reused``; a new one if it
        is gone), else a new file."""
        if reused:
            try:
                return os.open(tmp, _REWRITE_FLAGS)
            except FileNotFoundError:
                pass
        try:
            return os.open(tmp, _WRITE_FLAGS, 0o644)
        except FileNotFoundError:  # the directory was removed under the cache: make it again
            os.makedirs(parent, exist_ok=True)
            return os.open(tmp, _WRITE_FLAGS, 0o644)

    def _write(self, key: bytes, data: bytes, durable: bool, reuse: str | None = None) -> None:
        """Write the blob's file atomically (a temporary file renamed); ``durable`` fsyncs it.
        ``reuse``: an evicted blob's file, renamed aside, to write over instead of a new file
        (cut to the new blob's length first).

        Plain descriptor calls, not a Python file object (which adds an ``fstat``, an
        ``ioctl`` and ``lseek``s per file): a cold spoke writes one file per chunk, and at
        1 Gbit/s each system call, which lets go of the GIL, is a switch between threads."""
        path = self._path(key)
        parent = os.path.dirname(path)
        if parent not in self._subdirs:
            os.makedirs(parent, exist_ok=True)
            self._subdirs.add(parent)
        tmp = reuse or f"{parent}/.tmp-{os.getpid()}-{threading.get_ident()}-{key.hex()[:16]}"
        try:
            fd = self._open_for_write(tmp, parent, reuse is not None)
            try:
                if reuse is not None:
                    os.ftruncate(fd, len(data))
                write_all(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if durable:
            fd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_REWRITE_FLAGS = os.O_WRONLY | os.O_CLOEXEC


def _read_file(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes from the start of the file at ``path`` (one ``open``, ``read``
    and ``close`` for a small file)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        first = os.read(fd, limit)
        if not first or len(first) == limit:
            return first
        parts = [first]
        size = len(first)
        while size < limit:
            more = os.read(fd, limit - size)
            if not more:
                break
            parts.append(more)
            size += len(more)
        return b"".join(parts)
    finally:
        os.close(fd)


def sync_filesystem(path: str) -> None:
    """Make every write to the file system holding ``path`` durable: syncfs(2), where
    the C library has it (Linux), else sync(2)."""
    syncfs = getattr(_LIBC, "syncfs", None)
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


_LIBC = ctypes.CDLL(None, use_errno=True)
