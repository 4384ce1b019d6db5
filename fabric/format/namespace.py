"""The namespace rule of file-system views of a tree.

A tree keeps S3's semantics: keys ``a`` and ``a/b`` may coexist, and listings
(REST, S3) show both. A file system cannot hold a file and a directory of one
name, so every file-system view (``fabric export``, the mount) follows Mountpoint
for S3: **a directory shadows a file or symlink of the same name**. Where ``a`` is
a file or symlink and some path lies under ``a/``, the view shows the directory
``a/`` and hides the entry ``a``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from fabric.format.model import DIR, Entry


def visible(items: Iterable[tuple[str, Entry]], shadowed: list[str] | None = None) -> Iterator[tuple[str, Entry]]:
    """The ``(path, entry)`` pairs of ``items`` a file-system view shows, in their order.

    ``items`` must be sorted by path, as walks and listings return them (a
    ValueError says when they are not). A file or symlink with any path below it
    is dropped and its path appended to ``shadowed``, in the order found. A path
    ending in '/' (a listing's common prefix) counts as a path below its name.
    Entries are held back only while a later path could still shadow them: from
    ``a`` until the first path that sorts after ``a/``.
    """
    held: deque[list] = deque()  # [path, entry, state]: state "open" until decided, then "show" or "hide"
    undecided: list[list] = []  # the held files and symlinks whose fate is open
    previous: str | None = None
    for path, entry in items:
        if previous is not None and path < previous:
            raise ValueError(f"paths are not sorted: {path!r} after {previous!r}")
        previous = path
        still: list[list] = []
        for item in undecided:
            below = item[0] + "/"
            if path.startswith(below):
                item[2] = "hide"
                if shadowed is not None:
                    shadowed.append(item[0])
            elif path > below:  # every later path sorts after all of item's possible children
                item[2] = "show"
            else:
                still.append(item)
        undecided = still
        item = [path, entry, "show" if entry.kind == DIR else "open"]
        held.append(item)
        if entry.kind != DIR:
            undecided.append(item)
        while held and held[0][2] != "open":
            done = held.popleft()
            if done[2] == "show":
                yield done[0], done[1]
    for path, entry, state in held:
        if state != "hide":
            yield path, entry
