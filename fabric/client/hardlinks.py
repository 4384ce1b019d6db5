"""Hard links in ``fabric import`` and ``fabric export`` (the stored form: :mod:`fabric.format.links`).

Import: the files of the directory that are one inode (the same ``st_dev`` and
``st_ino``) are stored as one group: the file is read once and its entry stored at
every name, with the group's id (kept from the branch when the group was stored
before) and the list of names. Only names inside the imported tree count: a file
with one name there is a plain file, however many names it has elsewhere.

Export: the first name of each group (in path order) is written as a file, the
others are made hard links to it (:meth:`~fabric.client.destdir.DestDir.link`).
Names of one group whose entries differ (a merge of two branches can do that) are
linked only to the names with the same content and attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fabric.format.links import linked, names, new_link_id
from fabric.format.model import FILE, SYMLINK, Entry


def local_groups(inodes: Iterable[tuple[str, tuple[int, int] | None]]) -> dict[str, tuple[str, ...]]:
    """``(path, (st_dev, st_ino) or None)`` of local files -> each path of a group of two or
    more names mapped to the group's names, sorted."""
    by_inode: dict[tuple[int, int], list[str]] = {}
    for path, inode in inodes:
        if inode is not None:
            by_inode.setdefault(inode, []).append(path)
    out: dict[str, tuple[str, ...]] = {}
    for paths in by_inode.values():
        if len(paths) > 1:
            group = tuple(sorted(paths))
            out.update(dict.fromkeys(group, group))
    return out


def stored_group(group: tuple[str, ...], entry: Entry, existing: Mapping[str, Entry]) -> dict[str, Entry]:
    """The changes that store ``entry`` at every name of ``group``, under the id one of them
    had on the branch (a new one if none)."""
    link = next((e.link for p in group if (e := existing.get(p)) is not None and names(p, e)), "") or new_link_id()
    e = linked(entry, link, group)
    return dict.fromkeys(group, e)


def second_names(items: Iterable[tuple[str, Entry]]) -> dict[str, str]:
    """Of ``(path, entry)`` in path order: each name of a group after the first -> the first
    name with the same entry (the one written as a file)."""
    first: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for path, e in items:
        if e.kind not in (FILE, SYMLINK) or not names(path, e):
            continue
        key = (e.link, e.kind, e.size, e.md5, e.target, e.mode, e.mtime_ns, e.uid, e.gid)
        if key in first:
            out[path] = first[key]
        else:
            first[key] = path
    return out
