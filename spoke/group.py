"""Which spoke of a group owns a chunk: rendezvous (highest random weight) hashing.

Every member scores every chunk id with a hash of (member, id); the member with
the highest score owns the id, the next ones are its fallbacks in order. All
members compute the same order from the same member list, with no table to
agree on. When a member joins it takes from each of the others only the ids it
now scores highest on (about 1/N of them); when one leaves, only its ids move,
each to its next member. Members are named by their canonical URL
(:func:`fabric.util.groups.member_url`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def _score(member: str, cid: bytes) -> tuple[bytes, str]:
    return hashlib.blake2b(member.encode() + b"\0" + cid, digest_size=8, person=b"fabric-hrw").digest(), member


def rank(cid: bytes, members: Iterable[str]) -> list[str]:
    """The members in the order they own ``cid``: the owner first, then its fallbacks."""
    return sorted(set(members), key=lambda m: _score(m, cid), reverse=True)


def owner(cid: bytes, members: Iterable[str]) -> str:
    """The member that owns ``cid`` (ValueError when there are no members)."""
    return max(members, key=lambda m: _score(m, cid))
