"""Plain copies of files for ``--passthrough`` mounts (:mod:`fabric.cache.files`): what a
file version's copy is called, and the copies a writable mount leaves of the files it wrote
(``--seed-copies``, :mod:`fabric.cache.seeds`)."""

from __future__ import annotations

from fabric.cache import files
from fabric.cache.seeds import CopySeeder
from fabric.engine.metastore import CHUNKLIST, object_id
from fabric.format.model import FILE, INLINE_CHUNKS, Entry, chunk_list_object
from fuse.config import MountConfig
from fuse.writer import WFile


def copy_key(entry: Entry) -> str:
    """The name of the copy of a file version: its size and chunk ids, or the id of its chunk
    list where that list is long enough to be an object of its own, whether ``entry`` carries
    the list itself (a mount that wrote the file) or only its id (a listing)."""
    if entry.chunklist or len(entry.chunks) > INLINE_CHUNKS:
        list_id = entry.chunklist or object_id(CHUNKLIST, chunk_list_object(entry.chunks))
        return files.copy_key(entry.size, [list_id.encode()])
    return files.copy_key(entry.size, [cid for cid, _ in entry.chunks])


def seeder(cfg: MountConfig) -> CopySeeder | None:
    """The mount's seeder (``--seed-copies``), if it has one."""
    return CopySeeder(cfg.seed_copies, cfg.seed_copies_size) if cfg.seed_copies and cfg.writable else None


def seed(seeds: CopySeeder, wf: WFile) -> None:
    """Leave a copy of ``wf`` as staged (its local content is the version ``wf.base`` names:
    staged, not changed since) before its local state is dropped."""
    base = wf.base
    if wf.fd is None or wf.unlinked or base is None or base.kind != FILE or wf.dirty or wf.size != base.size:
        return
    seeds.seed(wf.fd, copy_key(base), base.size)
