"""How the write-back queue judges the hub's answers: permanent or transient, sent or not.

An error is *permanent* when retrying the same request cannot succeed: the hub
answered that the repository or branch is gone, that the spoke's token may not
write there, or that the request is malformed (4xx, except 408 Request
Timeout, 409 Conflict and 429 Too Many Requests). Anything else — the hub
unreachable, 5xx, timeouts — is *transient* and retried with backoff.

A stage whose answer never came (a timeout, a reset connection, a 5xx) may
have landed. Its replay is a conditional stage (``HttpPlane.stage_unless_newer``):
the hub leaves out every path written on the branch since the first try, so an
old write never overwrites a newer one.
"""

from __future__ import annotations

import httpx

from fabric.errors import FabricError

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
