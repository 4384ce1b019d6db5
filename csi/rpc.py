"""What the three services share: errors as gRPC status codes, one operation per volume at a time."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import httpx

from csi.mounts import MountFailed, SourceMissing
from fabric.errors import BadRequest, Conflict, FabricError, Forbidden, NotFound, Unauthorized, Unavailable

log = logging.getLogger("fabric.csi")


class RpcError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.INVALID_ARGUMENT, message)


def require(value: object, what: str) -> None:
    """INVALID_ARGUMENT if a required field is empty."""
    if not value:
        raise invalid(f"{what} is required")


_FABRIC_CODES: list[tuple[type[FabricError], grpc.StatusCode]] = [
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Unauthorized, grpc.StatusCode.UNAUTHENTICATED),
    (Forbidden, grpc.StatusCode.PERMISSION_DENIED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (Conflict, grpc.StatusCode.ABORTED),
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
]


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The gRPC status an exception of ours stands for (None: a bug, INTERNAL)."""
    if isinstance(exc, RpcError):
        return exc.code, exc.message
    if isinstance(exc, SourceMissing):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, MountFailed):
        return grpc.StatusCode.INTERNAL, f"mount failed: {exc}"
    if isinstance(exc, httpx.TransportError):
        return grpc.StatusCode.UNAVAILABLE, f"fabric server unreachable: {exc}"
    for kind, code in _FABRIC_CODES:
        if isinstance(exc, kind):
            return code, str(exc)
    if isinstance(exc, FabricError):
        return grpc.StatusCode.INTERNAL, str(exc)
    return None


def rpc(method: Callable) -> Callable:
    """A servicer method whose errors become the status codes the CSI spec names."""

    @functools.wraps(method)
    def run(self, request, context):
        try:
            return method(self, request, context)
        except Exception as exc:
            status = status_of(exc)
            if status is None:
                log.exception("%s failed", method.__name__)
                status = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
            context.abort(*status)

    return run


class VolumeLocks:
    """At most one operation per volume (or target path) at a time: the spec's ABORTED otherwise."""

    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, *keys: str) -> Iterator[None]:
        with self._lock:
            if any(k in self._busy for k in keys):
                raise RpcError(grpc.StatusCode.ABORTED, f"an operation on {keys[0]!r} is in progress; try again")
            self._busy.update(keys)
        try:
            yield
        finally:
            with self._lock:
                self._busy.difference_update(keys)
