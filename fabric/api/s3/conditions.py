"""Conditional requests: ``If-Match``, ``If-None-Match``, ``If-(Un)Modified-Since``
on reads and copy sources, and conditional writes (``If-None-Match``, ``If-Match``).

A conditional write is checked and staged in one step by the data plane
(:meth:`~fabric.plane.writes.Writes.stage_if`: at the hub, one catalog transaction
holding the branch's row, so hub processes sharing a catalog agree), and under a lock
per key in this process (:class:`KeyLocks`) for planes that check, then stage: two
writers cannot both see the key absent and both write it.
"""

from __future__ import annotations

import threading

from fabric.api.headers import http_date, parse_http_date
from fabric.api.s3.entrymeta import slash_key
from fabric.api.s3.errors import S3Error
from fabric.api.s3.request import Ctx
from fabric.errors import NotFound
from fabric.format.model import DIR, FILE, Entry
from fabric.plane.dataplane import DataPlane


def etag_matches(header: str, md5: str) -> bool:
    """Whether an ``If-Match``/``If-None-Match`` list (``*``, quoted, weak or bare tags) names ``md5``."""
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*":
            return True
        tag = tag.removeprefix("W/")
        if tag.strip('"') == md5:
            return True
    return False


def check_read_conditions(ctx: Ctx, e: Entry, prefix: str) -> None:
    """GET/HEAD conditional headers (``prefix`` 'x-amz-copy-source-' for copies: failures are 412)."""
    h = ctx.req.headers
    lm = int(e.mtime_ns // 1_000_000_000)
    if_match = h.get(prefix + "if-match")
    if_none = h.get(prefix + "if-none-match")
    if_unmod = h.get(prefix + "if-unmodified-since")
    if_mod = h.get(prefix + "if-modified-since")
    if if_match is not None:
        if not etag_matches(if_match, e.md5):
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-Match")
    elif if_unmod is not None:
        t = parse_http_date(if_unmod)
        if t is not None and lm > t:
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-Unmodified-Since")
    not_modified = False
    if if_none is not None:
        not_modified = etag_matches(if_none, e.md5)
    elif if_mod is not None:
        t = parse_http_date(if_mod)
        not_modified = t is not None and lm <= t
    if not_modified:
        if prefix:
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412)
        err = S3Error("NotModified", "Not Modified", 304)
        err.headers.update({"ETag": f'"{e.md5}"', "Last-Modified": http_date(e.mtime_ns / 1e9)})
        raise err


def is_conditional_write(ctx: Ctx) -> bool:
    return ctx.header("if-none-match") is not None or ctx.header("if-match") is not None


def check_write_conditions(plane: DataPlane, ctx: Ctx, repo: str, branch: str, path: str, key: str) -> None:
    """Conditional writes (PutObject, CopyObject, CompleteMultipartUpload).

    ``If-None-Match``: ``*`` writes only where nothing is stored at the key's path (keys
    ``a`` and ``a/`` share one, :mod:`fabric.api.s3.namespace`); an ETag list writes unless
    the object at the key has one of them. ``If-Match``: writes only over the object at the
    key with one of those ETags (NoSuchKey when there is none). A failed condition is 412.
    """
    if_none = ctx.header("if-none-match")
    if_match = ctx.header("if-match")
    if if_none is None and if_match is None:
        return
    try:
        stored: Entry | None = plane.stat(repo, branch, path)
    except NotFound:
        stored = None
    current = stored if stored is not None and stored.kind in (FILE, DIR) and slash_key(stored) == key.endswith("/") else None
    if if_none is not None:
        taken = stored is not None if if_none.strip() == "*" else current is not None and etag_matches(if_none, current.md5)
        if taken:
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-None-Match")
    if if_match is not None:
        if current is None:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
        if not etag_matches(if_match, current.md5):
            raise S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412, Condition="If-Match")


class KeyLocks:
    """One lock per ``(repo, branch, path)`` written conditionally; unheld ones are forgotten past 10,000."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, repo: str, branch: str, path: str) -> threading.Lock:
        k = (repo, branch, path)
        with self._guard:
            lock = self._locks.get(k)
            if lock is None:
                if len(self._locks) > 10000:
                    self._locks = {kk: v for kk, v in self._locks.items() if v.locked()}
                lock = self._locks[k] = threading.Lock()
            return lock
