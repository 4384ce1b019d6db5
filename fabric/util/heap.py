"""Keeping a batch process's heap from holding on to the big buffers it freed.

glibc's ``malloc`` serves a request above its mmap threshold with a mapping of its own,
which ``free`` gives back to the system at once; below it, from a heap, whose freed
space a process keeps. The threshold starts at 128 KiB but rises to the size of every
mapped buffer freed (up to 32 MiB), so a process that makes and frees many buffers of a
few MiB (packs, a batch's compressed frames) soon serves them from its heaps, one heap
per thread that made them, and keeps them all at their peak: 20 MiB of an import of
100,000 small files, 37 MiB once a second thread compresses (bench/RESULTS.md).
"""

from __future__ import annotations

import ctypes

#: ``mallopt``'s parameter number of the mmap threshold (glibc's ``malloc.h``).
_M_MMAP_THRESHOLD = -3
#: Buffers at least this large are mapped and unmapped on their own.
BIG_BUFFER = 256 * 1024


def map_big_buffers(threshold: int = BIG_BUFFER) -> bool:
    """Have buffers of ``threshold`` bytes or more mapped on their own, for the rest of the
    process (fixing glibc's otherwise rising threshold). False where the C library is not
    glibc: nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
