"""S3 errors: a code, a message for a person, and the HTTP status S3 uses for it."""

from __future__ import annotations

from fabric.errors import (
    BadRequest,
    Conflict,
    Corruption,
    FabricError,
    Forbidden,
    InvalidName,
    InvalidPath,
    NotFound,
    PreconditionFailed,
    RangeNotSatisfiable,
    StorageFull,
    Unauthorized,
    Unavailable,
)


class S3Error(Exception):
    """An error answered as an S3 XML error document."""

    def __init__(self, code: str, message: str, status: int = 400, **extra: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.extra = extra  # more elements of the error document (BucketName, Key, ...)
        self.headers: dict[str, str] = {}


def from_fabric(exc: FabricError, missing: str = "NoSuchKey") -> S3Error:
    """Translate an engine error; ``missing`` is the code a NotFound becomes here."""
    if isinstance(exc, S3Error):  # pragma: no cover - defensive
        return exc
    if isinstance(exc, NotFound):
        status_code = {"NoSuchKey": 404, "NoSuchBucket": 404, "NoSuchUpload": 404}.get(missing, 404)
        return S3Error(missing, exc.message, status_code)
    if isinstance(exc, (Forbidden, Unauthorized)):
        return S3Error("AccessDenied", exc.message, 403)
    if isinstance(exc, (InvalidPath, InvalidName)):
        err = S3Error("InvalidArgument", exc.message, 400)
        if "longer than" in exc.message:
            err.code = "KeyTooLongError"
        return err
    if isinstance(exc, RangeNotSatisfiable):
        err = S3Error("InvalidRange", "The requested range is not satisfiable", 416)
        if "size" in exc.details:
            err.headers["Content-Range"] = f"bytes */{exc.details['size']}"
            err.extra["ActualObjectSize"] = str(exc.details["size"])
        return err
    if isinstance(exc, PreconditionFailed):
        return S3Error("PreconditionFailed", exc.message, 412)
    if isinstance(exc, Conflict):
        return S3Error("OperationAborted", exc.message, 409)
    if isinstance(exc, BadRequest):
        return S3Error("InvalidRequest", exc.message, 400)
    if isinstance(exc, Unavailable):
        return S3Error("ServiceUnavailable", exc.message, 503)
    if isinstance(exc, StorageFull):  # a spoke whose disk is full (no AWS code: MinIO answers 507 too)
        return S3Error("InsufficientStorage", exc.message, 507)
    if isinstance(exc, Corruption):
        return S3Error("InternalError", "stored data failed verification; it is not served", 500)
    return S3Error("InternalError", exc.message, max(exc.status, 500))
