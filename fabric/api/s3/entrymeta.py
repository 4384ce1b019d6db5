"""What the gateway keeps in an entry's metadata besides what users sent: keys ``fabric:NAME``.

User metadata (``x-amz-meta-NAME``) is stored under ``NAME`` and the standard headers S3
keeps under ``s3:NAME`` (:mod:`fabric.api.s3.objects`); a header name cannot hold ':', so
neither collides with these. Being metadata, they travel with the entry through commits,
copies, mounts and every plane's wire form; they are never sent back as headers.
"""

from __future__ import annotations

from fabric.api.s3.errors import S3Error
from fabric.api.s3.multipart import MAX_PARTS, decode_part_sizes
from fabric.format.model import DIR, FILE, Entry

INTERNAL_PREFIX = "fabric:"
#: The part sizes of an object made by a multipart upload (:func:`~fabric.api.s3.multipart.encode_part_sizes`).
PARTS = INTERNAL_PREFIX + "parts"
#: On a file at path ``P``: it holds the object whose key is ``P/`` (a key ending in '/' with a body).
SLASH_KEY = INTERNAL_PREFIX + "slash-key"


def internal(meta: dict[str, str]) -> dict[str, str]:
    """The gateway's own keys of ``meta``."""
    return {k: v for k, v in meta.items() if k.startswith(INTERNAL_PREFIX)}


def part_sizes(e: Entry) -> list[int] | None:
    """The sizes of the parts ``e`` was uploaded in; ``None`` when it was not uploaded in parts
    (or its content changed since: the sizes no longer add up to it, or its ETag is not
    a multipart one of that many parts)."""
    text = e.meta.get(PARTS)
    if e.kind != FILE or not text:
        return None
    sizes = decode_part_sizes(text)
    if not sizes or sum(sizes) != e.size or not e.md5.endswith(f"-{len(sizes)}"):
        return None
    return sizes


def slash_key(e: Entry) -> bool:
    """Whether the object at ``e``'s path has a key ending in '/': a directory marker, or a
    file flagged :data:`SLASH_KEY`."""
    return e.kind == DIR or (e.kind == FILE and e.meta.get(SLASH_KEY) == "1")


def part_range(e: Entry, number: str) -> tuple[int, int, int | None]:
    """``(offset, length, parts count)`` that ``?partNumber=NUMBER`` reads of object ``e``.

    The count is ``None`` for an object not uploaded in parts: its one part is all of it.
    A number outside 1..10000 is InvalidArgument (400); one past the object's parts,
    InvalidPartNumber (416)."""
    try:
        n = int(number)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARTS:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and {MAX_PARTS}, inclusive", 400)
    sizes = part_sizes(e)
    if sizes is None:
        sizes, count = [e.size if e.kind == FILE else 0], None
    else:
        count = len(sizes)
    if n > len(sizes):
        raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable", 416)
    return sum(sizes[: n - 1]), sizes[n - 1], count
