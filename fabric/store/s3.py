"""Object store in an S3 bucket (AWS S3, MinIO, Ceph RGW, …) via boto3.

A single S3 PUT, and a completed multipart upload, replace an object
atomically, so puts need no temporary key. Credentials come from boto3's
usual sources (environment, config files, instance roles) and never appear
in :attr:`S3Store.url` or error messages.

Errors other than a missing key surface as botocore exceptions;
:class:`~fabric.store.wrappers.RetryingStore` knows which are transient.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import ClientError

from fabric.errors import BadRequest, ObjectNotFound
from fabric.store.base import (
    ObjectInfo,
    ObjectStore,
    check_range,
    redact_url,
    validate_key,
    validate_prefix,
)

_BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_INVALID_RANGE_CODES = frozenset({"InvalidRange", "416"})


class S3Store(ObjectStore):
    """Objects under ``prefix`` in ``bucket``. Thread-safe (boto3 clients are).

    ``client`` replaces the boto3 client built from ``endpoint_url`` and
    ``region``, for callers that configure their own.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
    ) -> None:
        if not _BUCKET_NAME.fullmatch(bucket):
            raise BadRequest(f"invalid S3 bucket name {bucket!r}")
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = validate_key(prefix) + "/" if prefix else ""
        self.endpoint_url = endpoint_url
        self.region = region
        self.client = client or boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            config=Config(max_pool_connections=64),
        )

    @property
    def url(self) -> str:
        query = {}
        if self.endpoint_url:
            query["endpoint_url"] = redact_url(self.endpoint_url)
        if self.region:
            query["region"] = self.region
        base = f"s3://{self.bucket}/{self.prefix.rstrip('/')}"
        return f"{base}?{urlencode(query, safe=':/')}" if query else base

    def describe(self) -> str:
        where = f" at {redact_url(self.endpoint_url)}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"

    def _key(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _not_found(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"object {key!r} not found in {self.describe()}")

    def put(self, key: str, data: bytes | memoryview) -> None:
        body = data if isinstance(data, bytes) else bytes(data)
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body)

    def put_file(self, key: str, path: str) -> None:
        """Upload ``path`` streamed, in parallel parts above boto3's multipart threshold."""
        full_key = self._key(key)
        try:
            self.client.upload_file(path, self.bucket, full_key)
        except S3UploadFailedError as exc:
            # boto3 hides the ClientError it caught; re-raise it so callers and
            # RetryingStore see the S3 error code.
            if isinstance(exc.__context__, ClientError):
                raise exc.__context__ from exc
            raise

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_range(offset, length)
        full_key = self._key(key)
        if length == 0:
            self.stat(key)  # still report a missing key
            return b""
        request: dict[str, Any] = {"Bucket": self.bucket, "Key": full_key}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            request["Range"] = f"bytes={offset}-{end}"
        try:
            response = self.client.get_object(**request)
        except ClientError as exc:
            code = _error_code(exc)
            if code in _NOT_FOUND_CODES:
                raise self._not_found(key) from None
            if code in _INVALID_RANGE_CODES:
                return b""  # range starts at or past the end
            raise
        with response["Body"] as body:
            data: bytes = body.read()
        return data

    def stat(self, key: str) -> ObjectInfo:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                raise self._not_found(key) from None
            raise
        return ObjectInfo(key, head["ContentLength"], head["LastModified"].timestamp())

    def delete(self, key: str) -> None:
        # S3 DELETE succeeds for an absent key.
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # S3 lists keys in UTF-8 byte order, which is Python's str order.
        skip = len(self.prefix)
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            for item in page.get("Contents", ()):
                yield ObjectInfo(item["Key"][skip:], item["Size"], item["LastModified"].timestamp())


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
