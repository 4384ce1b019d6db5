"""The data plane: the one interface between storage and every protocol.

REST, S3, FUSE, fsspec and the CLI are written against :class:`DataPlane`.
The hub implements it with the versioning engine (:class:`fabric.engine.engine.Engine`),
a client implements it over HTTP (:class:`fabric.client.http.HttpPlane`), and a
spoke implements it as a cache in front of a hub. Errors are the
:mod:`fabric.errors` hierarchy on every implementation.

Refs are expressions (``main``, ``v1``, a commit id or prefix, ``main~2``).
Reads at a branch see its uncommitted changes; reads at a tag or commit see
committed data only.

:class:`DataPlane` is the sum of small roles, one module each, whose methods
state their contracts: :class:`~fabric.plane.repos.Repositories`,
:class:`~fabric.plane.refs.Refs`, :class:`~fabric.plane.history.History`,
:class:`~fabric.plane.reads.Reads`, :class:`~fabric.plane.writes.Writes`,
:class:`~fabric.plane.exchange.ChunkExchange`, :class:`~fabric.plane.admin.Admin`
and :class:`~fabric.plane.buckets.Buckets`. Code that needs only one role may
ask for just that one.

What every method of every role may also raise, not repeated on each:

* Unavailable: a remote plane cannot reach its server (or a spoke its hub,
  for a call it must forward); the call may or may not have taken effect.
* Unauthorized, Forbidden: over HTTP, the token is unknown or lacks the role.
* InvalidName (a BadRequest): a repository name that is not valid.

"Safe to retry" means that repeating a call whose answer was lost leaves the
same state as one call; a call that is "not idempotent" may answer a repeat
with Conflict or NotFound although the first attempt took effect.
"""

from __future__ import annotations

from fabric.plane.admin import Admin
from fabric.plane.buckets import Buckets
from fabric.plane.exchange import ChunkExchange
from fabric.plane.history import History
from fabric.plane.reads import Reads
from fabric.plane.refs import Refs
from fabric.plane.repos import Repositories
from fabric.plane.writes import Writes


class DataPlane(Repositories, Refs, History, Reads, Writes, ChunkExchange, Admin, Buckets):
    """Every role at once: what the hub's engine, the HTTP client and a spoke implement."""
