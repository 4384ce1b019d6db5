"""Multipart uploads: their limits, ETags and part sizes, and where their state is kept.

Parts are chunked and stored as they arrive (through the data plane's chunk
sink), so only their chunk lists and MD5s are kept, in an
:class:`~fabric.catalog.uploads.UploadStore`: the hub's catalog (every hub
process serves every upload), or :class:`Uploads`, a SQLite file in a spoke
gateway's state directory. Completing an upload concatenates the parts'
chunk lists into one file entry; nothing is copied. A completed upload is
remembered for :data:`~fabric.catalog.uploads.COMPLETED_TTL` (S3 answers a repeated completion with the
same result), and the object keeps its part sizes (:func:`encode_part_sizes`) so
that GET/HEAD ``?partNumber=N`` can serve one part.
"""

from __future__ import annotations

import hashlib
import os

from fabric.catalog.db import Database
from fabric.catalog.uploads import UploadStore

MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_SIZE = 5 * 1024 * 1024 * 1024
MAX_PARTS = 10000


def encode_part_sizes(sizes: list[int]) -> str:
    """Part sizes as ``SIZE*COUNT`` runs joined by ',' (``5242880*3,17``): short for the usual
    uploads, whose parts are all one size but the last."""
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return ",".join(f"{size}*{count}" if count > 1 else str(size) for size, count in runs)


def decode_part_sizes(text: str) -> list[int] | None:
    """The sizes :func:`encode_part_sizes` wrote; ``None`` for anything malformed."""
    sizes: list[int] = []
    try:
        for run in text.split(","):
            size, _, count = run.partition("*")
            n = int(count) if count else 1
            if n < 1 or int(size) < 0 or len(sizes) + n > MAX_PARTS:
                return None
            sizes.extend([int(size)] * n)
    except ValueError:
        return None
    return sizes or None


def multipart_etag(part_md5s: list[str]) -> str:
    """S3's ETag of a multipart object: MD5 of the parts' binary MD5s, then ``-N``."""
    return hashlib.md5(b"".join(bytes.fromhex(m) for m in part_md5s)).hexdigest() + f"-{len(part_md5s)}"


class Uploads(UploadStore):
    """A gateway's own multipart state: SQLite in ``state_dir`` (a spoke's gateway; the
    hub's keeps it in the catalog, shared by every hub process)."""

    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, exist_ok=True)
        super().__init__(Database(os.path.join(state_dir, "multipart.db"), pool_size=4, sync="normal"), owned=True)
