"""Object storage: one small interface, several backends, wrappers around it.

:func:`open_store` turns a URL into a store:

- a plain path or ``file:///path`` -> :class:`LocalStore` (the default);
- ``s3://BUCKET/PREFIX[?endpoint_url=URL&region=NAME]`` -> :class:`S3Store`
  in a :class:`RetryingStore`; without ``endpoint_url`` the endpoint comes
  from ``FABRIC_S3_ENDPOINT``, then ``AWS_ENDPOINT_URL``, then AWS itself;
  credentials come from boto3's usual sources, never from the URL;
- any other ``SCHEME://…`` -> :class:`FsspecStore` in a :class:`RetryingStore`.

``S3Store`` and ``FsspecStore`` are imported on first use, so code that only
needs local storage does not pay for importing boto3 and fsspec.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from fabric.errors import BadRequest
from fabric.store.base import (
    ObjectInfo,
    ObjectStore,
    redact_url,
    validate_key,
    validate_prefix,
)
from fabric.store.local import LocalStore
from fabric.store.wrappers import (
    CountingStore,
    FaultInjectingStore,
    RetryingStore,
    StoreWrapper,
    is_transient,
)

if TYPE_CHECKING:
    from fabric.store.fsspec_store import FsspecStore
    from fabric.store.s3 import S3Store

__all__ = [
    "CountingStore",
    "FaultInjectingStore",
    "FsspecStore",
    "LocalStore",
    "ObjectInfo",
    "ObjectStore",
    "RetryingStore",
    "S3Store",
    "StoreWrapper",
    "is_transient",
    "open_store",
    "validate_key",
    "validate_prefix",
]

_LAZY = {"S3Store": "fabric.store.s3", "FsspecStore": "fabric.store.fsspec_store"}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_S3_QUERY_KEYS = ("endpoint_url", "region")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(url: str) -> ObjectStore:
    """Open the object store named by ``url``; ``BadRequest`` if it is malformed."""
    if not isinstance(url, str) or not url.strip():
        raise BadRequest("object store URL is empty")
    match = _SCHEME.match(url)
    if match is None:
        return LocalStore(url)
    scheme = match.group(1).lower()
    if scheme == "file":
        return LocalStore(_file_path(url))
    if scheme == "s3":
        return RetryingStore(_open_s3(url))
    from fabric.store.fsspec_store import FsspecStore

    return RetryingStore(FsspecStore(url))


def _file_path(url: str) -> str:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise BadRequest(f"file URL {url!r} names host {parts.netloc!r}; use file:///absolute/path")
    if parts.query or parts.fragment:
        raise BadRequest(f"file URL {url!r} may not have a query or fragment")
    path = unquote(parts.path)
    if not path:
        raise BadRequest(f"file URL {url!r} has no path; use file:///absolute/path")
    return path


def _open_s3(url: str) -> S3Store:
    from fabric.store.s3 import S3Store

    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise BadRequest(
            "credentials are not accepted in an s3:// URL; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY or use an AWS profile"
        )
    if not parts.netloc:
        raise BadRequest(f"s3 URL {url!r} has no bucket; use s3://BUCKET/PREFIX")
    if parts.fragment:
        raise BadRequest(f"s3 URL {url!r} has a fragment; percent-encode '#' as %23")
    query: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _S3_QUERY_KEYS:
            raise BadRequest(
                f"unknown s3 URL parameter {name!r}; known: {', '.join(_S3_QUERY_KEYS)}"
            )
        if name in query:
            raise BadRequest(f"s3 URL parameter {name!r} given twice")
        query[name] = value
    endpoint = (
        query.get("endpoint_url")
        or os.environ.get("FABRIC_S3_ENDPOINT")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
        raise BadRequest(f"S3 endpoint {redact_url(endpoint)!r} must be an http:// or https:// URL")
    return S3Store(
        parts.netloc,
        unquote(parts.path),
        endpoint_url=endpoint,
        region=query.get("region") or None,
    )
