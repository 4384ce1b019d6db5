"""How a process's heap treats the big buffers it frees: given back, or kept for reuse.

glibc's ``malloc`` serves a request above its mmap threshold with a mapping of its own,
which ``free`` gives back to the system at once; below it, from a heap, whose freed
space a process keeps. The threshold starts at 128 KiB but rises to the size of every
mapped buffer freed (up to 32 MiB), so a process that makes and frees many buffers of a
few MiB (packs, a batch's compressed frames) soon serves them from its heaps, one heap
per thread that made them, and keeps them all at their peak: 20 MiB of an import of
100,000 small files, 37 MiB once a second thread compresses (bench/RESULTS.md).
:func:`map_big_buffers` has such a process give them back.

A process that streams data through, a reader most of all, wants the opposite. Each chunk,
frame, block and read result is a fresh buffer; where glibc serves one from pages it has
just given back (a mapping, or heap space above the trim threshold, 128 KiB by default),
every 4 KiB of it costs a page fault when first written, and faults cost more than the copy
under a virtual machine. :func:`reuse_freed_buffers` keeps freed space for the next buffer:
a reader of a warm spoke took 30 to 40% less CPU (bench/RESULTS.md).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

#: ``mallopt``'s parameter numbers (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Buffers at least this large are mapped and unmapped on their own.
BIG_BUFFER = 256 * 1024
#: A streaming process serves buffers below this size from its heaps, and keeps up to this
#: much freed space at the top of each heap.
REUSED_BUFFERS = 64 * 1024 * 1024
#: Environment variables through which a user sets glibc's malloc themselves (theirs wins).
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
#: ``FABRIC_MALLOC=glibc`` leaves glibc's own settings to a process that would reuse its buffers.
CHOICE = "FABRIC_MALLOC"


def map_big_buffers(threshold: int = BIG_BUFFER) -> bool:
    """Have buffers of ``threshold`` bytes or more mapped on their own, for the rest of the
    process (fixing glibc's otherwise rising threshold). False where the C library is not
    glibc: nothing changes."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, threshold))


def reuse_freed_buffers(limit: int = REUSED_BUFFERS) -> bool:
    """Serve buffers below ``limit`` bytes from the heap and keep up to ``limit`` bytes of freed
    space at its top, for the rest of the process: for readers that stream data.
    Leaves the allocator as it is (False) where the C library is not glibc, where the
    environment sets malloc's parameters (:data:`USER_SETTINGS`), or with ``FABRIC_MALLOC=glibc``."""
    if os.environ.get(CHOICE) == "glibc" or any(name in os.environ for name in USER_SETTINGS):
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, limit)) and bool(mallopt(_M_TRIM_THRESHOLD, limit))


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library the interpreter runs on has none."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt
