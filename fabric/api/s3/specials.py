"""Special files (FIFOs, sockets, devices) as S3 shows them: zero-length objects with their
type in their metadata, ``x-amz-meta-fabric-type`` (``fifo``, ``socket``, ``chardev``,
``blockdev``), and a device's number in ``x-amz-meta-fabric-rdev``. Symlinks are not shown."""

from __future__ import annotations

from fabric.format.model import BLOCKDEV, CHARDEV, DIR, FILE, SPECIAL_KINDS, Entry

TYPE_META = "fabric-type"
RDEV_META = "fabric-rdev"


def shown(e: Entry) -> bool:
    """Is ``e`` an object S3 shows: a file, a directory marker or a special file?"""
    return e.kind in (FILE, DIR) or e.kind in SPECIAL_KINDS


def special_headers(e: Entry) -> dict[str, str]:
    """The metadata headers that say what special file ``e`` is (none for anything else)."""
    if e.kind not in SPECIAL_KINDS:
        return {}
    h = {"x-amz-meta-" + TYPE_META: e.kind}
    if e.kind in (CHARDEV, BLOCKDEV):
        h["x-amz-meta-" + RDEV_META] = str(e.rdev)
    return h
