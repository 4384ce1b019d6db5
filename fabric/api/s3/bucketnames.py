"""S3 bucket names, and the repository a bucket created over S3 gets.

Bucket names follow S3's rules (3-63 of ``a-z 0-9 . -``, starting and ending with a
letter or digit, no ``..``, ``.-`` or ``-.``, not an IP address). Repository names
have no dots, so a bucket whose name has dots is a *binding* (``fabric bucket``) to
a repository named after it with the dots turned into hyphens (``data.v1`` ->
``data-v1``), with a short hash of the bucket name added when that repository
name is taken.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from fabric.api.s3.errors import S3Error

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4_RE = re.compile(r"\d{1,3}(\.\d{1,3}){3}")


def check_bucket_name(name: str) -> str:
    """``name`` if S3 accepts it as a bucket name; InvalidBucketName otherwise."""
    if (
        not _BUCKET_RE.fullmatch(name)
        or ".." in name
        or ".-" in name
        or "-." in name
        or "--" in name
        or _IPV4_RE.fullmatch(name)
    ):
        raise S3Error("InvalidBucketName", "The specified bucket is not valid.", 400, BucketName=name)
    return name


def repo_for_bucket(name: str, taken: Callable[[str], bool]) -> str:
    """The repository a new bucket ``name`` gets: the name itself, or for a dotted name the
    name with hyphens for dots (plus a hash of the bucket name when ``taken(that)``)."""
    if "." not in name:
        return name
    base = name.replace(".", "-")
    if not taken(base):
        return base
    return f"{base[:56]}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"
