"""Server outages without a stuck mount: a bound on the FUSE threads that wait for the server.

libfuse serves a mount with :data:`~fuse.libfuse.MAX_THREADS` threads. A read that misses
the caches while the server is unreachable waits in the retries of
:class:`~fabric.plane.retry.RetryingPlane`, for up to ``--server-timeout``; as many such
reads as threads would hold them all, and every other request (a lookup, a getattr, an
opendir, the flush of a ``close()``, a read of cached data) would wait behind them. The
high-level libfuse API that mfusepy binds replies when a callback returns (only the
low-level API has ``fuse_reply_*`` from other threads), so a waiting request cannot give
its thread back. Instead, at most ``waiters`` (``MAX_THREADS - WAIT_RESERVE``) threads may
wait for an unreachable server at once; a request that would be one more fails at once
with ``EIO`` (:class:`ThreadsBusy`, a :class:`~fabric.plane.retry.ServerGone`: listings
fall back to their expired copy, as after a timeout). The reserve is left to requests
that need no server. Only reads, opens, lookups and listings are refused
(:data:`REFUSABLE`); changes and the syncs of written data wait as before (they count,
so that the refusable waiters never exceed the bound; their own number is not bounded).
Refusals are logged once per outage and counted (``server_waits_refused`` in the mount's
stats).

A thread inside a FUSE callback waits for the server, and takes a place, when:

- a plane call failed because the server is unreachable (connection refused or reset, a
  timeout, an open circuit, 502/504, a 503 that names no ``Retry-After``: a busy server's
  503 says when to come back and is not an outage) and is about to be retried;
- it starts a plane call while such an outage is open (a call to a server that hangs would
  wait for its own timeout first);
- it waits, for longer than :data:`POLL` while such an outage is open, for a chunk that
  another thread fetches (:meth:`MountHealth.result`) or a listing that another thread
  loads (:meth:`MountHealth.acquire`).

So a fetch, however slow, takes no place until it fails. The place is given back when the
callback returns (:func:`end_op`, from :meth:`fuse.libfuse.FabricFUSE._wrapper`). Threads
outside FUSE callbacks (readahead workers, commits) are not bounded: they hold no FUSE thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from fabric.errors import FabricError
from fabric.plane.retry import Health, RetryingPlane, ServerGone

log = logging.getLogger("fabric.fuse")

T = TypeVar("T")

#: How long a FUSE thread waits on another thread's fetch or load before it checks for an outage.
POLL = 0.1

_local = threading.local()


class ThreadsBusy(ServerGone):
    """The server is unreachable and as many FUSE threads as may wait for it do: failed at once."""


#: The callbacks that may be refused. The others (a write, a close or fsync that stages data,
#: a rename...) wait for the server whatever the count: failing them early would fail a
#: program's save during a restart of a few seconds. They take places all the same, so that
#: the reads and lookups that wait never number more than the bound allows.
REFUSABLE = frozenset({"read", "read_buf", "open", "getattr", "fgetattr", "readdir", "opendir", "readlink", "statfs", "access", "getxattr", "listxattr"})


def begin_op(name: str) -> None:
    """This thread runs the FUSE callback ``name`` (until :func:`end_op`)."""
    _local.in_op = True
    _local.refusable = name.removesuffix("_fuse_3").removesuffix("_fuse_2") in REFUSABLE


def end_op() -> None:
    """The FUSE callback returns: give back the place it held, if any."""
    _local.in_op = False
    held = getattr(_local, "held", None)
    if held is not None:
        _local.held = None
        held._release()


def unreachable(exc: BaseException) -> bool:
    """Does this (transient) failure say that the server cannot be reached, not that it is busy?"""
    if isinstance(exc, FabricError):
        return exc.status in (502, 503, 504) and "retry_after" not in exc.details
    return True


class MountHealth(Health):
    """A mount's :class:`~fabric.plane.retry.Health`, with the bound on the FUSE threads that
    wait for an unreachable server (see the module docstring)."""

    def __init__(self, timeout: float, waiters: int) -> None:
        super().__init__(timeout)
        self.waiters = max(waiters, 1)
        self.unreachable_since: float | None = None
        self.waiting = 0  # FUSE threads holding a place now
        self.refused = 0  # requests failed at once: no place left
        self._gate = threading.Lock()
        self._refusal_logged = False

    def ok(self) -> None:
        super().ok()
        if self.unreachable_since is not None:
            with self._gate:
                self.unreachable_since = None
                self._refusal_logged = False

    def failed(self, exc: BaseException) -> float:
        give_up_at = super().failed(exc)
        if unreachable(exc):
            if self.unreachable_since is None:
                with self._gate:
                    if self.unreachable_since is None:
                        self.unreachable_since = time.monotonic()
            self.hold()  # this thread is about to wait for the server (ThreadsBusy if it may not)
        return give_up_at

    def before_call(self) -> None:
        """A plane call starts: during an outage it waits for the server from the start."""
        if self.unreachable_since is not None:
            self.hold()

    def hold(self) -> None:
        """Let this thread wait for the server: take a place if it runs a FUSE callback and holds
        none yet; :class:`ThreadsBusy` when every place is taken."""
        if not getattr(_local, "in_op", False) or getattr(_local, "held", None) is not None:
            return
        with self._gate:
            if self.waiting < self.waiters or not _local.refusable:
                self.waiting += 1
                _local.held = self
                return
            self.refused += 1
            first = not self._refusal_logged
            self._refusal_logged = True
        if first:
            log.warning(
                "server unreachable and %d requests already wait for it: failing further requests "
                "that need it with EIO at once, to keep the mount answering the others",
                self.waiters,
            )
        raise ThreadsBusy(f"server unreachable; {self.waiters} requests already wait for it")

    def _release(self) -> None:
        with self._gate:
            self.waiting -= 1

    def result(self, fut: Future[T]) -> T:
        """``fut.result()`` of a fetch another thread runs, waiting as :meth:`hold` allows."""
        if not getattr(_local, "in_op", False):
            return fut.result()
        while True:
            try:
                return fut.result(timeout=POLL)
            except TimeoutError:
                if fut.done():
                    return fut.result()  # it failed with a TimeoutError of its own
                if self.unreachable_since is not None:
                    self.hold()

    def acquire(self, lock: threading.Lock) -> None:
        """``lock.acquire()``, where its holder may be waiting for the server; ThreadsBusy
        (without the lock) when this thread may not wait for the server too."""
        if not getattr(_local, "in_op", False):
            lock.acquire()
            return
        while not lock.acquire(timeout=POLL):
            if self.unreachable_since is not None:
                self.hold()


def result(health: Any, fut: Future[T]) -> T:
    """``fut.result()``, bounded by ``health`` where it is a :class:`MountHealth`."""
    return health.result(fut) if isinstance(health, MountHealth) else fut.result()


def acquire(health: Any, lock: threading.Lock) -> None:
    """``lock.acquire()``, bounded by ``health`` where it is a :class:`MountHealth`."""
    if isinstance(health, MountHealth):
        health.acquire(lock)
    else:
        lock.acquire()


class MountPlane(RetryingPlane):
    """A mount's :class:`~fabric.plane.retry.RetryingPlane`: a call started during an outage
    counts as waiting for the server from its start (:meth:`MountHealth.before_call`)."""

    health: MountHealth

    def around(self, name: str, call: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> Any:
        self.health.before_call()
        return super().around(name, call, args, kwargs)

    def retried(self, unit: Callable[[Any], T]) -> T:
        self.health.before_call()
        return super().retried(unit)
