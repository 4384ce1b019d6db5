"""How the write-back queue judges the hub's answers, and its conditional stage.

An error is *permanent* when retrying the same request cannot succeed: the hub
answered that the repository or branch is gone, that the spoke's token may not
write there, or that the request is malformed (4xx, except 408 Request
Timeout, 409 Conflict and 429 Too Many Requests). Anything else — the hub
unreachable, 5xx, timeouts — is *transient* and retried with backoff.

A stage whose answer never came (a timeout, a reset connection, a 5xx) may
have landed. Its replay is a conditional stage (``X-Fabric-Stage-Since``): the
hub leaves out every path written on the branch since the first try, so an old
write never overwrites a newer one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx

from fabric.api.rest.objects import STAGE_SINCE_HEADER
from fabric.client.http import HttpPlane, raise_for_error
from fabric.errors import FabricError, Unavailable
from fabric.format.model import Entry
from fabric.plane.wire import MSGPACK, pack_changes

#: 4xx statuses that a retry may get past.
_RETRYABLE_4XX = frozenset({408, 409, 429})


def is_permanent(exc: BaseException) -> bool:
    """Whether the hub refused for good (retrying the same request cannot succeed)."""
    return isinstance(exc, FabricError) and 400 <= exc.status < 500 and exc.status not in _RETRYABLE_4XX


def never_sent(exc: BaseException) -> bool:
    """Whether the request certainly did not reach the hub (no connection was made), or the
    hub refused it: either way nothing was applied."""
    if is_permanent(exc):
        return True
    return isinstance(exc.__cause__, (httpx.ConnectError, httpx.ConnectTimeout))


def _http_plane(upstream: object) -> HttpPlane:
    """The HttpPlane under the wrappers of a spoke's upstream plane."""
    plane = upstream
    while not isinstance(plane, HttpPlane):
        plane = plane.inner  # type: ignore[attr-defined]
    return plane


def stage_unless_newer(
    upstream: object, repo: str, branch: str, changes: Mapping[str, Entry | None], since: str
) -> tuple[int, list[str]]:
    """Stage ``changes`` at the hub except the paths written there since ``since``
    (``"SEQ HEAD"``, the branch's staging seq and head when the write was first tried).
    Returns the staging seq and the paths left out."""
    hub = _http_plane(upstream)
    try:
        response = hub.http.post(
            f"/repos/{repo}/branches/{branch}/entries",
            content=pack_changes(dict(changes)),
            headers={"Content-Type": MSGPACK, STAGE_SINCE_HEADER: since},
        )
    except httpx.TransportError as exc:
        raise Unavailable(f"cannot reach {hub.url}: {exc}") from exc
    raise_for_error(response)
    body = json.loads(response.content)
    return int(body["seq"]), list(body["skipped"])
