"""Hard links in a tree: several paths that are names of one file.

Every name of a group carries the same entry: the same content and attributes,
the group's id in :attr:`~fabric.format.model.Entry.link`, and the sorted list of
the group's names in its metadata under :data:`NAMES` (a JSON list). So any one
name tells its link count and where its other names are, without a walk of the
tree. A path is a member of a group only if its entry has a link id *and* its
own path is in the list: an entry copied elsewhere (an S3 copy keeps metadata)
is a file of its own. A group is identified by its id within one tree; a branch
keeps its groups across commits because both are stored with each name.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable

from fabric.format.model import DIR, Entry

#: Metadata key of a linked entry: the JSON list of the group's paths, sorted.
NAMES = "fabric:links"


def new_link_id() -> str:
    """A fresh group id (16 hex digits)."""
    return secrets.token_hex(8)


def names(path: str, entry: Entry | None) -> tuple[str, ...]:
    """The names of the group ``path`` belongs to (``path`` among them), or ``()`` if it has one name."""
    if entry is None or not entry.link or entry.kind == DIR:
        return ()
    try:
        listed = json.loads(entry.meta.get(NAMES, "[]"))
    except ValueError:
        return ()
    if not isinstance(listed, list) or path not in listed or len(listed) < 2:
        return ()
    return tuple(str(p) for p in listed)


def nlink(path: str, entry: Entry | None) -> int:
    """The link count of the file at ``path``."""
    return len(names(path, entry)) or 1


def linked(entry: Entry, link: str, group: Iterable[str]) -> Entry:
    """``entry`` as each name of the group ``link`` with names ``group`` stores it
    (a group of one name is a plain file: :func:`unlinked`)."""
    members = sorted(set(group))
    if len(members) < 2:
        return unlinked(entry)
    return entry.with_(link=link, meta={**entry.meta, NAMES: json.dumps(members, ensure_ascii=False)})


def unlinked(entry: Entry) -> Entry:
    """``entry`` as a file with one name."""
    if not entry.link and NAMES not in entry.meta:
        return entry
    return entry.with_(link="", meta={k: v for k, v in entry.meta.items() if k != NAMES})
