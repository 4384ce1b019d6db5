"""Writing whole buffers to a file descriptor: ``os.write`` and ``os.pwritev`` may write
less than they were given (a signal, a full pipe, a file system's limit per call)."""

from __future__ import annotations

import os
from collections.abc import Sequence

#: The most buffers one ``pwritev`` takes.
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` at ``fd``'s position."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pwrite_all(fd: int, pieces: Sequence[bytes | bytearray | memoryview], offset: int) -> int:
    """Write ``pieces`` one after the other from ``offset`` (one system call for all where it
    can, no joining copy); the offset after them."""
    views = [memoryview(p).cast("B") for p in pieces if len(p)]
    while views:
        done = os.pwritev(fd, views[:IOV_MAX], offset)
        offset += done
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if views and done:
            views[0] = views[0][done:]
    return offset
