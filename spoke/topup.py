"""Topping up the files a spoke holds in part: what a sync tool reads of a tree it mostly has.

``rsync -a`` of a new version of a tree onto a copy of the old one opens only the files
whose size or time changed, one after the other. Through a mount of a spoke each of them
is a cold open: the spoke holds most of its chunks (the old version's) and lacks the few
that changed, and fetching those costs a round trip to the hub per file (190 changed
files at 50 ms: 9.5 s against rsync's own 1.5 s, bench/RESULTS.md). The mount cannot tell
which of the files ahead the reader will open, and fetching them all would pull the whole
tree across the WAN for a reader that skips most of it.

A spoke can tell: a file of which it holds some chunks and lacks others changed since a
version it served. So a hint with ``top_up`` (``DataPlane.hint``) names the files ahead of
such a reader, and the spoke fetches, at hint priority, only the chunks it lacks of the
files it holds in part, at most ``limit`` bytes. Files it holds none of are left to the
reader's own opens: on a cold spoke a top-up fetches nothing. Unlike a loader's hint it
keeps no order and no read position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fabric.format.model import Entry, stored_ids

from .hints import ChunkLists


def top_up_ids(entries: Sequence[Entry], chunk_lists: ChunkLists, held: Callable[[bytes], bool], limit: int) -> tuple[list[bytes], int]:
    """The chunks to fetch for a top-up of ``entries``, in their order, and their bytes: of
    each file some of whose chunks are ``held``, the ones that are not, while their bytes
    stay within ``limit``."""
    out: list[bytes] = []
    taken: set[bytes] = set()
    total = 0
    for chunks in chunk_lists(entries):
        sizes = dict(chunks)
        distinct = dict.fromkeys(stored_ids(chunks))
        lacking = [cid for cid in distinct if not held(cid)]
        if not lacking or len(lacking) == len(distinct):
            continue  # held whole, or not at all
        for cid in lacking:
            if cid in taken:
                continue
            if total + sizes[cid] > limit:
                return out, total
            taken.add(cid)
            out.append(cid)
            total += sizes[cid]
    return out, total
