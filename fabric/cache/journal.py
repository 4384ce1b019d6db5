"""The pin journal: how a :class:`~fabric.cache.disk.DiskCache` makes a pinned batch durable
without waiting for anybody else's writes.

A pinned batch's blobs are written to their own files as any cached blob is, without a sync,
and written once more, together, into one of a few *slot* files that are reused; only that
slot is ``fdatasync``ed. A slot file keeps its size and its blocks between uses, so the sync
flushes the batch's bytes and no file-system metadata: it does not wait for the journal
commit, nor for other processes' unwritten pages on the same disk, as ``syncfs`` does (see
``bench/bench_cache_sync.py``).

A slot stays in use while any blob it holds is still pinned and its file may not be on disk.
It is free again when every such blob is unpinned (at the hub: a lost file is then a cache
miss), or after a ``syncfs`` of the cache's file system that began once the slot was
written (the blobs' own files are on disk). That sync runs in the background when half the
slots are in use; a writer that finds none free runs it itself.

At start-up, :meth:`PinJournal.records` yields the blobs of every intact slot; the cache
rewrites the pinned ones whose files a crash lost or tore and syncs once, before any slot
is used again.

Slot layout: ``MAGIC`` (8 bytes), payload length (u64), record count (u32), xxh3-128 of the
payload (16 bytes), then the payload: per record, key length (u16), key, blob length (u32),
blob. A slot torn by a crash fails its checksum and is skipped: its batch was not yet
acknowledged, since a writer returns only after the sync.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import xxhash

log = logging.getLogger("fabric.cache")

MAGIC = b"FBPINJ01"
_HEADER = struct.Struct("<8sQI16s")
_KEY = struct.Struct("<H")
_BLOB = struct.Struct("<I")
#: Slots of a journal, at most: at most this many batches are durable through it at once.
SLOTS = 16
#: The journal's share of its cache's budget, and its size at most.
BUDGET_SHARE = 1 / 8
MAX_BYTES = 256 << 20
#: The smallest slot: two of the largest frames (a larger record grows its slot's file).
MIN_SLOT_BYTES = 512 << 10


def layout(budget: int) -> tuple[int, int]:
    """(slots, bytes per slot) of the journal of a cache of ``budget`` bytes: an eighth of
    the budget, at most 256 MiB, in 2 to 16 slots; no slots for a cache too small for two
    (under 8 MiB), which syncs its file system for each pinned batch instead."""
    total = min(MAX_BYTES, int(budget * BUDGET_SHARE))
    slot_bytes = max(MIN_SLOT_BYTES, total // SLOTS)
    slots = min(SLOTS, total // slot_bytes)
    return (slots if slots >= 2 else 0), slot_bytes


@dataclass
class _Slot:
    path: str
    size: int  # of its file (0: none yet)
    keys: set[bytes] = field(default_factory=set)
    busy: bool = False  # being written, or holding blobs that still need it
    written: bool = False  # its batch is in the slot and synced


class PinJournal:
    """Slot files under ``root`` that make pinned batches durable (see the module's doc).

    ``sync`` makes every write to the cache's file system durable (``syncfs``); ``reserve(n)``
    is told before the journal's files grow by ``n`` bytes (the cache makes room for them).
    A journal of no slots writes nothing (:attr:`usable` is false); it still reads what a
    journal laid out for a larger budget left."""

    def __init__(self, root: str, sync: Callable[[], None], reserve: Callable[[int], None], slots: int, slot_bytes: int) -> None:
        if slots == 1 or slots < 0 or slot_bytes < 1:
            raise ValueError("a pin journal has no slots, or at least 2 of at least 1 byte")
        self.root = root
        self.slot_bytes = slot_bytes
        self._sync = sync
        self._reserve = reserve
        self._slots = [_Slot(path, _size(path)) for path in (os.path.join(root, f"slot-{i:02d}") for i in range(slots))]
        #: What the slot files take when every one is in use (a record larger than a slot grows its file).
        self.max_bytes = slots * (_HEADER.size + slot_bytes)
        self._slot_of: dict[bytes, _Slot] = {}
        self.usable = slots > 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a slot was freed, or a sync ended
        self._syncing = False
        self.syncs = 0  # sync rounds run to free slots
        self.waits = 0  # writers that found no slot free (and ran or waited for a sync round)

    # -- writing -------------------------------------------------------------
    def write(self, blobs: Sequence[tuple[bytes, bytes]]) -> None:
        """Make ``blobs`` durable: they are in synced slots when this returns. Their own
        files must already be written (a sync that frees the slots makes those durable)."""
        for payload, keys in self._payloads(blobs):
            slot = self._take()
            try:
                self._fill(slot, payload, len(keys))
            except BaseException as exc:
                with self._lock:
                    self._free(slot)
                if not (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
                    raise
                # No room on the disk for the slot: a sync of the file system makes the
                # batch's files (all written) durable instead.
                self._sync()
                return
            with self._lock:
                for key in keys:
                    old = self._slot_of.get(key)
                    if old is not None:
                        self._drop_key(old, key)
                    self._slot_of[key] = slot
                slot.keys = set(keys)
                slot.written = True
                self._changed.notify_all()  # a writer waiting for a slot may sync it free now
                start = not self._syncing and sum(s.busy for s in self._slots) * 2 >= len(self._slots)
                if start:
                    self._syncing = True
            if start:
                threading.Thread(target=self._sync_round, name="pin-journal-sync", daemon=True).start()

    def _payloads(self, blobs: Sequence[tuple[bytes, bytes]]) -> Iterator[tuple[bytearray, list[bytes]]]:
        """The batch cut into slot payloads of at most ``slot_bytes`` (a blob larger than that
        gets a payload of its own)."""
        payload = bytearray()
        keys: list[bytes] = []
        for key, data in blobs:
            record = len(key) + len(data) + _KEY.size + _BLOB.size
            if keys and len(payload) + record > self.slot_bytes:
                yield payload, keys
                payload, keys = bytearray(), []
            payload += _KEY.pack(len(key))
            payload += key
            payload += _BLOB.pack(len(data))
            payload += data
            keys.append(key)
        if keys:
            yield payload, keys

    def _take(self) -> _Slot:
        """A free slot, marked busy; with none free, run (or wait for) a sync round, or wait
        for the writers that fill every slot now."""
        waited = False
        while True:
            with self._lock:
                for slot in self._slots:
                    if not slot.busy:
                        slot.busy = True
                        slot.written = False
                        return slot
                self.waits += not waited
                waited = True
                if self._syncing or not any(slot.written for slot in self._slots):
                    self._changed.wait()
                    continue
                self._syncing = True
            self._sync_round()

    def _fill(self, slot: _Slot, payload: bytearray, count: int) -> None:
        """Write the slot and sync its data. A slot file is made once, at its full size, so a
        later use changes no metadata (unless a larger payload grows it)."""
        header = _HEADER.pack(MAGIC, len(payload), count, xxhash.xxh3_128_digest(payload))
        size = _HEADER.size + len(payload)
        new = slot.size == 0
        grown = max(size, _HEADER.size + self.slot_bytes if new else 0)
        if grown > slot.size:
            self._reserve(grown - slot.size)
            slot.size = grown
        try:
            if new:
                os.makedirs(self.root, exist_ok=True)
            fd = os.open(slot.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if new and grown > size:
                    _write_all(fd, bytes(grown - size), size)  # blocks that exist: later syncs flush data only
                _write_all(fd, header, 0)
                _write_all(fd, payload, _HEADER.size)
                if new:
                    os.fsync(fd)
                else:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            if new:
                _fsync_dir(self.root)
        except BaseException:
            if new:
                with contextlib.suppress(OSError):
                    os.unlink(slot.path)
            actual = _size(slot.path)  # what a file that could not be made or grown takes
            self._reserve(actual - slot.size)
            slot.size = actual
            raise

    def _sync_round(self) -> None:
        """Sync the file system, then free every slot whose batch was written before the
        sync began (its blobs' own files are on disk now). Called with ``_syncing`` set."""
        with self._lock:
            done = [slot for slot in self._slots if slot.busy and slot.written]
        try:
            self._sync()
        except OSError as exc:
            log.warning("pin journal %s: sync failed (%s); its slots stay in use", self.root, exc)
            done = []
        finally:
            with self._lock:
                for slot in done:
                    for key in slot.keys:
                        if self._slot_of.get(key) is slot:
                            del self._slot_of[key]
                    self._free(slot)
                self.syncs += 1
                self._syncing = False
                self._changed.notify_all()

    # -- releasing -----------------------------------------------------------
    def release(self, key: bytes) -> None:
        """``key`` is no longer pinned: its slot need not keep it."""
        with self._lock:
            slot = self._slot_of.pop(key, None)
            if slot is not None:
                self._drop_key(slot, key)

    def _drop_key(self, slot: _Slot, key: bytes) -> None:
        slot.keys.discard(key)
        if not slot.keys and slot.written:
            self._free(slot)

    def _free(self, slot: _Slot) -> None:
        slot.keys = set()
        slot.busy = slot.written = False
        self._changed.notify_all()

    def in_use(self) -> int:
        """How many slots hold blobs that still need them (or are being written)."""
        with self._lock:
            return sum(slot.busy for slot in self._slots)

    def disk_bytes(self) -> int:
        """Bytes of the journal's slot files."""
        with self._lock:
            return sum(slot.size for slot in self._slots)

    # -- start-up ------------------------------------------------------------
    def records(self) -> Iterator[tuple[bytes, bytes]]:
        """Every blob of every intact slot file under ``root`` (those of a journal laid out
        for another budget too), as (key, blob); torn or foreign files are skipped."""
        for path in self._files():
            with open(path, "rb") as f:
                raw = f.read()
            yield from _parse(path, raw)

    def drop_strays(self) -> None:
        """Remove the slot files this journal does not use (laid out for another budget);
        call once what they held is durable."""
        ours = {slot.path for slot in self._slots}
        for path in self._files():
            if path not in ours:
                os.unlink(path)

    def _files(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        return [os.path.join(self.root, name) for name in names if name.startswith("slot-")]


def _parse(path: str, raw: bytes) -> Iterator[tuple[bytes, bytes]]:
    if len(raw) < _HEADER.size:
        return
    magic, length, count, digest = _HEADER.unpack_from(raw)
    payload = memoryview(raw)[_HEADER.size : _HEADER.size + length]
    if magic != MAGIC or len(payload) != length or xxhash.xxh3_128_digest(payload) != digest:
        log.info("pin journal slot %s: torn or empty, skipped", path)
        return
    pos = 0
    for _ in range(count):
        (klen,) = _KEY.unpack_from(payload, pos)
        key = bytes(payload[pos + _KEY.size : pos + _KEY.size + klen])
        pos += _KEY.size + klen
        (dlen,) = _BLOB.unpack_from(payload, pos)
        yield key, bytes(payload[pos + _BLOB.size : pos + _BLOB.size + dlen])
        pos += _BLOB.size + dlen


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _write_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
