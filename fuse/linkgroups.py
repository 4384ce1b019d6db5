"""The names of one file (a hard-link group) in a ``--rw`` mount, kept one file.

A group of names is stored as in :mod:`fabric.format.links`: each name carries the
same entry, with the group's id and the list of its names. So the mount needs no
index of groups: the entry of any name (from the cached listing of its directory)
says how many names it has (``st_nlink``) and where the others are. Every change of
one name is staged at all of them in one :meth:`~fabric.plane.dataplane.DataPlane.stage`
call: new content or attributes (:func:`spread`), a new name (:mod:`fuse.links`), a
name removed or renamed (:func:`dropped`, :func:`renamed`). A listed name whose entry
no longer has the group's id (changed through S3 or REST) has left the group.

Visibility is close-to-open, as for any file: a write through one name reaches the
others when it is staged (close, fsync), and then the kernel's cached attributes and
pages of the other names are dropped. Two names of one group open for writing at
once are two copies until they are closed; the last one staged wins.
"""

from __future__ import annotations

from fabric.format.links import linked, names, unlinked
from fabric.format.model import Entry
from fuse.handles import content_sig
from fuse.libfuse import invalidate_path
from fuse.namespace import split
from fuse.state import MountState


def known(st: MountState, p: str) -> Entry | None:
    """The entry of ``p`` as the mount has it at hand (no network call), or None."""
    wf = st.files.get(p)
    if wf is not None:
        return wf.base
    parent, name = split(p)
    d = st.ns.cached(parent)
    return d.children.get(name) if d is not None else None


def others(st: MountState, p: str) -> tuple[str, ...]:
    """The other names of ``p``'s group as far as the mount knows them without asking:
    the names a change of ``p`` holds besides ``p``."""
    return tuple(n for n in names(p, known(st, p)) if n != p)


def one_file(st: MountState, a: str, b: str) -> bool:
    """Are ``a`` and ``b`` names of one file (by the entries at hand)?"""
    ea, eb = known(st, a), known(st, b)
    return ea is not None and eb is not None and eb.link == ea.link and b in names(a, ea)


def current(st: MountState, p: str, base: Entry | None) -> Entry | None:
    """The entry the view shows at ``p`` if ``p`` may be a name of a group (by ``base``, the
    version a local file started from, or the cached listing), else None without asking."""
    hint = known(st, p)
    if not (base is not None and base.link) and not (hint is not None and hint.link):
        return None
    return st.ns.lookup(p)


def members(st: MountState, p: str, e: Entry | None) -> list[str]:
    """The names of the group of ``p`` (entry ``e``) that still hold it, ``p`` first;
    ``[]`` if ``p`` has one name."""
    group = names(p, e)
    if not group or e is None:
        return []
    out = [p]
    for n in group:
        if n == p:
            continue
        other = known(st, n) if n in st.files else st.ns.lookup(n)
        if other is not None and other.link == e.link:
            out.append(n)
    return out if len(out) > 1 else []


def spread(st: MountState, p: str, entry: Entry, cur: Entry | None) -> dict[str, Entry | None]:
    """The changes that make ``entry`` the new version of the file at ``p`` (whose entry is
    now ``cur``): the same entry at every name of its group."""
    group = members(st, p, cur)
    if not group:
        return {p: unlinked(entry)}
    assert cur is not None
    e = linked(entry, cur.link, group)
    return dict.fromkeys(group, e)


def dropped(st: MountState, p: str, e: Entry | None, changes: dict[str, Entry | None]) -> None:
    """Name ``p`` (entry ``e``) goes away: add to ``changes`` the other names of its group,
    one name fewer (the last one becomes a plain file and keeps the group's inode number)."""
    rest = [n for n in members(st, p, e) if n != p and n not in changes]
    if not rest or e is None:
        return
    if len(rest) == 1:
        st.inodes.keep(rest[0], st.inodes.of(p, e))
    after = linked(e, e.link, rest)
    for n in rest:
        changes[n] = after


def renamed(st: MountState, moves: dict[str, str], entries: dict[str, Entry], changes: dict[str, Entry | None]) -> None:
    """Names moved by one rename (``moves``: old -> new, ``entries``: old -> entry): the entries
    in ``changes`` of every group they belong to list the new names."""
    done: set[str] = set()
    for old, e in entries.items():
        group = members(st, old, e)
        if not group or e.link in done:
            continue
        done.add(e.link)
        new_names = [moves.get(n, n) for n in group]
        after = linked(e, e.link, new_names)
        for n in new_names:
            changes[n] = after


def invalidate(st: MountState, staged: dict[str, Entry | None], but: str) -> None:
    """The kernel caches each name's attributes and pages on its own: after a change staged at
    several names of a group, drop them for all but ``but`` (whose change the kernel made)."""
    for n, e in staged.items():
        if n != but and e is not None and e.link:
            invalidate_path(n)


def refresh_local(st: MountState, staged: dict[str, Entry | None], but: str) -> None:
    """Files with local state at other names of a group start from the version just staged
    there, unless their content is their own (materialized with another version) or they
    are busy (being staged themselves: their own version follows)."""
    for n, e in staged.items():
        wf = st.files.get(n)
        if n == but or wf is None or e is None or wf.base is None:
            continue
        if not wf.lock.acquire(blocking=False):  # never wait here: its owner may wait for our names
            continue
        try:
            if wf.fd is None or content_sig(wf.base) == content_sig(e):
                wf.base = e
                if wf.fd is None:
                    wf.size = e.size
        finally:
            wf.lock.release()
