"""Errors of the fabric engine.

Every error carries the HTTP status it maps to and a short machine-readable
code, so the REST API, the S3 gateway, FUSE and the CLI translate one error
hierarchy into their own protocol without knowing the engine's internals.
The message is written for a person: it says what was wrong and, where it
can, what to do about it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any


class FabricError(Exception):
    """Base class. ``status`` is the HTTP status, ``code`` a stable identifier."""

    status = 500
    code = "internal_error"
    exit_code = 1

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details}


class BadRequest(FabricError):
    status = 400
    code = "bad_request"
    exit_code = 2


class PayloadTooLarge(BadRequest):
    """A request body (or the number of items in it) is over a limit: split it, do not retry it."""

    status = 413
    code = "payload_too_large"


#: How many missing chunk ids a ChunksMissing names.
MISSING_LISTED = 16


class ChunksMissing(BadRequest):
    """Entries name chunks the server does not hold for the repository: upload them, then stage
    again. A writer that uploaded them before may see this when the server lost them meanwhile
    (a spoke restarted and evicted them before they reached the hub); ``missing`` lists the
    first :data:`MISSING_LISTED` of their ids (hex)."""

    code = "chunks_missing"

    def __init__(self, message: str, missing: Iterable[str] = ()) -> None:
        super().__init__(message, missing=list(itertools.islice(missing, MISSING_LISTED)))
        self.missing: list[str] = self.details["missing"]


class InvalidName(BadRequest):
    code = "invalid_name"


class InvalidPath(BadRequest):
    code = "invalid_path"


class Unauthorized(FabricError):
    status = 401
    code = "unauthorized"
    exit_code = 5


class Forbidden(FabricError):
    status = 403
    code = "forbidden"
    exit_code = 5


class NotFound(FabricError):
    status = 404
    code = "not_found"
    exit_code = 3


class ObjectNotFound(NotFound):
    """A key is absent from an object store."""

    code = "object_not_found"


class Conflict(FabricError):
    status = 409
    code = "conflict"
    exit_code = 4


class MergeConflict(Conflict):
    code = "merge_conflict"

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__(message, conflicts=conflicts)
        self.conflicts = conflicts


class PreconditionFailed(FabricError):
    status = 412
    code = "precondition_failed"
    exit_code = 4


class RangeNotSatisfiable(FabricError):
    status = 416
    code = "range_not_satisfiable"
    exit_code = 2


class Corruption(FabricError):
    """Stored bytes do not match their checksum or id; never served as data."""

    status = 500
    code = "corruption"
    exit_code = 6


class Unavailable(FabricError):
    """Not now: the server (or one it depends on) cannot serve the request at the moment.

    ``retry_after`` (seconds), when given, is sent as the ``Retry-After`` header."""

    status = 503
    code = "unavailable"
    exit_code = 7


class StorageFull(FabricError):
    """No room left to keep data that must be kept (a spoke's pinned, not yet pushed writes)."""

    status = 507
    code = "insufficient_storage"
    exit_code = 7
