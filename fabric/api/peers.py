"""Requests one spoke of a group makes to another: ``X-Fabric-Peer: 1`` on ``/chunks/frames``.

A spoke asks the owner of a chunk (another spoke of its group) for it, with its own
hub token and this header. The owner serves it from its cache or fetches it from its
hub, never from a third spoke, so a request crosses at most one spoke-to-spoke hop
even while two members see the group differently. Only a token with the ``spoke``
right may ask as a peer (403 otherwise); the plane sees the flag through
:func:`peer_request` while the route calls it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from fabric.auth.principal import SPOKE, Principal
from fabric.errors import BadRequest, Forbidden

PEER_HEADER = "X-Fabric-Peer"

_peer: contextvars.ContextVar[bool] = contextvars.ContextVar("fabric_peer_request", default=False)


def peer_request() -> bool:
    """Whether the request being served is a peer spoke's."""
    return _peer.get()


@contextmanager
def peer_scope(who: Principal, header: str | None) -> Iterator[None]:
    """Serve the body of the ``with`` as a peer request when ``header`` is set (it must be
    ``1``, and ``who`` must hold the ``spoke`` right); as an ordinary request otherwise."""
    if header is None:
        yield
        return
    if header != "1":
        raise BadRequest(f"{PEER_HEADER} is 1 (a request from a spoke of the same group), not {header[:20]!r}")
    if not who.has(SPOKE):
        raise Forbidden(
            f"token {who.name!r} may not ask as a peer spoke: that needs the spoke right (`fabric token create --spoke`)"
        )
    token = _peer.set(True)
    try:
        yield
    finally:
        _peer.reset(token)
