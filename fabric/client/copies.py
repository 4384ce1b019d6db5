"""Plain copies of file versions on this machine's disk, which the processes reading and
writing a repository here share (:mod:`fabric.cache.files`): ``fabric mount --seed-copies``
and ``--passthrough``, and ``fabric://`` with ``copies=DIR`` (:mod:`fabric.fsspec`).

A copy is named by its file version (:func:`copy_key`), so whoever has the version's entry
finds it, whatever path or repository the entry came from."""

from __future__ import annotations

import logging
import os
import threading

from fabric.cache import files
from fabric.cache.seeds import CopySeeder
from fabric.engine.metastore import CHUNKLIST, object_id
from fabric.format.model import FILE, INLINE_CHUNKS, Entry, chunk_list_object
from fabric.util.fileio import write_all

log = logging.getLogger("fabric.cache")


def copy_key(entry: Entry) -> str:
    """The name of the copy of a file version: its size and chunk ids, or the id of its chunk
    list where that list is long enough to be an object of its own, whether ``entry`` carries
    the list itself (the writer of the file) or only its id (a listing)."""
    if entry.chunklist or len(entry.chunks) > INLINE_CHUNKS:
        list_id = entry.chunklist or object_id(CHUNKLIST, chunk_list_object(entry.chunks))
        return files.copy_key(entry.size, [list_id.encode()])
    return files.copy_key(entry.size, [cid for cid, _ in entry.chunks])


def open_copy(root: str, entry: Entry) -> int | None:
    """A read-only descriptor of the copy of ``entry``'s version under ``root`` (checked as
    :func:`fabric.cache.files.open_copy` says), or None: none there, or not a file large
    enough to be copied."""
    if entry.kind != FILE or entry.size < files.MIN_SIZE:
        return None
    return files.open_copy(os.path.join(root, files.FILES), copy_key(entry), entry.size)


_seeders: dict[tuple[int, str], CopySeeder] = {}
_seeders_lock = threading.Lock()


def seeder(root: str, budget: int) -> CopySeeder:
    """This process's seeder of the copies under ``root`` (one per directory and process: a
    seeder's start removes what its process left in ``incoming/``, and its thread does not
    survive a fork); ``budget`` is the first caller's."""
    key = (os.getpid(), os.path.realpath(root))
    with _seeders_lock:
        found = _seeders.get(key)
        if found is None:
            found = _seeders[key] = CopySeeder(key[1], budget)
        return found


class LocalCopy:
    """A file version's copy being written by whoever has its bytes in order (a ``fabric://``
    write, a spoke assembling a file written through it): a file without a name
    (``O_TMPFILE``) in ``seeds``' directory, which :meth:`seed` names once the version is
    known (a crash leaves nothing behind). Failures (a full disk) only lose the copy."""

    def __init__(self, seeds: CopySeeder) -> None:
        self.seeds = seeds
        try:
            self.fd: int | None = os.open(seeds.incoming, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.info("no local copy of a file written: %s", exc)
            self.fd = None
        self.size = 0

    def write(self, block: bytes) -> None:
        if self.fd is None:
            return
        try:
            write_all(self.fd, block)
            self.size += len(block)
        except OSError as exc:
            log.info("no local copy of a file written: %s", exc)
            self.drop()

    def seed(self, entry: Entry) -> bool:
        """The bytes written are version ``entry``: they become its copy; whether a seed was
        made (none where a write failed, or the sizes differ)."""
        seeded = self.fd is not None and self.size == entry.size and self.seeds.seed(self.fd, copy_key(entry), entry.size)
        self.drop()
        return seeded

    def drop(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
