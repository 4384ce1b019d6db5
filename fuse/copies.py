"""Plain copies of files for ``--passthrough`` mounts (:mod:`fabric.cache.files`): what a
file version's copy is called, and the copies a writable mount leaves of the files it wrote
(``--seed-copies``, :mod:`fabric.cache.seeds`)."""

from __future__ import annotations

from fabric.cache.seeds import CopySeeder
from fabric.client.copies import copy_key
from fabric.format.model import FILE
from fuse.config import MountConfig
from fuse.writer import WFile


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
