"""Plain copies of the files written through a spoke (``fabric spoke --seed-copies DIR``), for
``--passthrough`` mounts on its machine (``fabric mount --passthrough --copies-dir DIR``).

A checkpoint written through a spoke is then restored beside that spoke at the local disk's
speed: the kernel reads the copies (:mod:`fuse.kernel`), instead of the mount assembling each
file out of the spoke's chunks. Each file of at least :data:`~fabric.cache.files.MIN_SIZE`
written here (staged, queued or sent on to the hub) whose chunks this spoke holds (a queued
write's are pinned) is assembled in the background, out of them, into an unnamed file in the
directory's ``incoming/``, which :class:`~fabric.cache.seeds.CopySeeder` names, sums, flushes
and keeps within its budget, as it does for a writing mount's seeds. The copies are named by
the version (:func:`fabric.client.copies.copy_key`), so a mount of any commit holding that
version finds them.

What it costs: the spoke's CPU to assemble each file once, and the disk to write it once more
(within the budget). At most :data:`BACKLOG` files wait; beyond that a file gets no copy (its
restore then reads chunks, as without seeds). A failure only loses the copy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

from fabric.cache.files import MIN_SIZE, find_copy
from fabric.cache.seeds import CopySeeder
from fabric.client.copies import LocalCopy, copy_key
from fabric.format.model import FILE, Entry

log = logging.getLogger("fabric.spoke.seeds")

#: Files waiting for their copy at most (beyond, a file written gets none).
BACKLOG = 64
#: The default bytes of copies kept (``--seed-copies-size``).
BUDGET = 5 * 1024**3


class SpokeSeeds:
    """Copies of the files written through this spoke, assembled in the background."""

    def __init__(self, root: str, budget: int, read: Callable[[Entry], Iterator[bytes]], held: Callable[[Entry], bool]) -> None:
        """``read``: the bytes of a file entry; ``held``: whether this spoke holds every chunk
        of one (a file it does not gets no copy: its chunks would cross the WAN for it)."""
        self.seeder = CopySeeder(root, budget)
        self._read = read
        self._held = held
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="spoke-seeds")
        self._lock = threading.Lock()
        self._waiting = 0
        self.assembled = self.skipped = self.failed = 0

    def written(self, changes: Mapping[str, Entry | None]) -> None:
        """Files were written here: queue a copy of each large enough and within the budget."""
        for entry in changes.values():
            if entry is None or entry.kind != FILE or not MIN_SIZE <= entry.size <= self.seeder.budget or not self._held(entry):
                continue
            with self._lock:
                if self._waiting >= BACKLOG:
                    self.skipped += 1
                    continue
                self._waiting += 1
            try:
                self._pool.submit(self._assemble, entry)
            except RuntimeError:  # (the spoke is stopping)
                with self._lock:
                    self._waiting -= 1
                return

    def _assemble(self, entry: Entry) -> None:
        try:
            key = copy_key(entry)
            if find_copy(self.seeder.dir, key) is not None:
                return
            copy = LocalCopy(self.seeder)
            try:
                for piece in self._read(entry):
                    copy.write(piece)
            except BaseException:
                copy.drop()
                raise
            if copy.seed(entry):
                with self._lock:
                    self.assembled += 1
        except Exception as exc:  # noqa: BLE001 - only the copy is lost; the write is not
            with self._lock:
                self.failed += 1
            log.warning("no plain copy of a file written here (its restore reads chunks): %s", exc)
        finally:
            with self._lock:
                self._waiting -= 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"seeds_assembled": self.assembled, "seeds_placed": self.seeder.seeded, "seeds_skipped": self.skipped,
                    "seeds_failed": self.failed + self.seeder.failed, "seeds_waiting": self._waiting}

    def close(self) -> None:
        """Let the copies queued be assembled and placed."""
        self._pool.shutdown(wait=True)
        self.seeder.close()
