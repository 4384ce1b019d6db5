"""How failures reach a program using the mount: the errno of each exception, and the
wrapper every filesystem operation runs in (latency statistics, failures as errnos)."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

import mfusepy

from fabric.errors import (
    BadRequest,
    ChunksMissing,
    FabricError,
    Forbidden,
    InvalidName,
    InvalidPath,
    NotFound,
    RangeNotSatisfiable,
    StorageFull,
    Unauthorized,
)
from fabric.plane.retry import ServerGone
from fuse.outage import ThreadsBusy

log = logging.getLogger("fabric.fuse")


def fs_errno(exc: BaseException) -> int:
    """The errno a filesystem caller should see for an exception."""
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return exc.errno
    if isinstance(exc, (ServerGone, ChunksMissing)):
        return errno.EIO  # (the data is gone from the server, not the caller's argument invalid)
    if isinstance(exc, NotFound):
        return errno.ENOENT
    if isinstance(exc, StorageFull):
        return errno.ENOSPC
    if isinstance(exc, InvalidPath):
        if "longer than" in exc.message:
            return errno.ENAMETOOLONG
        if "UTF-8" in exc.message:
            return errno.EILSEQ
        return errno.EINVAL
    if isinstance(exc, InvalidName):
        return errno.EINVAL
    if isinstance(exc, (Unauthorized, Forbidden)):
        return errno.EACCES
    if isinstance(exc, (BadRequest, RangeNotSatisfiable)):
        return errno.EINVAL
    return errno.EIO


def err(code: int) -> mfusepy.FuseOSError:
    """The exception that answers a filesystem call with ``code``."""
    return mfusepy.FuseOSError(code)


def op(fn: Callable) -> Callable:
    """Wrap an operation: latency stats (in ``self.stats``), and every failure turned into an errno."""
    name = fn.__name__

    @wraps(fn)
    def wrapper(self: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        failed = True
        try:
            out = fn(self, *args)
            failed = False
            return out
        except mfusepy.FuseOSError:
            raise
        except Exception as exc:
            code = fs_errno(exc)
            if code == errno.EIO and not isinstance(exc, ThreadsBusy):  # (logged once per outage)
                log.error("%s%r failed: %s", name, args[:1], exc, exc_info=not isinstance(exc, (FabricError, ServerGone)))
            else:
                log.debug("%s%r: %s", name, args[:1], exc)
            raise mfusepy.FuseOSError(code) from exc
        finally:
            self.stats.record(name, time.perf_counter() - t0, failed)

    return wrapper
