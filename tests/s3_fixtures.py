"""Fixtures shared by the S3 test modules (a pytest plugin loaded by ``conftest.py``).

Each module that uses them gets its own hub with an S3 listener (module scope);
a module that defines a fixture of the same name uses its own.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest
from botocore.exceptions import ClientError

from tests.s3_helpers import Creds, S3Hub, start_s3_hub, unique


@pytest.fixture(scope="module")
def s3hub(tmp_path_factory) -> Iterator[S3Hub]:
    with start_s3_hub(tmp_path_factory.mktemp("s3hub") / "data") as h:
        yield h


@pytest.fixture(scope="module")
def admin(s3hub: S3Hub) -> Creds:
    return s3hub.token(admin=True, name="s3-admin")


@pytest.fixture(scope="module")
def s3(s3hub: S3Hub, admin: Creds):
    return s3hub.boto3(admin)


@pytest.fixture
def repo(s3hub: S3Hub) -> str:
    """A new repository (and so a bucket of the same name)."""
    name = unique("r")
    s3hub.plane().create_repo(name)
    return name


def racing_conditional_puts(s3, bucket: str, key: str, writers: int = 8, **condition: str) -> int:
    """Have ``writers`` threads PUT ``key`` at once with the same condition header
    (``IfMatch=...`` or ``IfNoneMatch=...``); how many succeeded (the others must get 412)."""

    def attempt(i: int) -> bool:
        try:
            s3.put_object(Bucket=bucket, Key=key, Body=f"w{i}".encode(), **condition)
            return True
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "PreconditionFailed"
            return False

    with concurrent.futures.ThreadPoolExecutor(writers) as pool:
        return sum(pool.map(attempt, range(writers)))


def error_code(exc: pytest.ExceptionInfo) -> str:
    """The S3 error code of a botocore ClientError."""
    return exc.value.response["Error"]["Code"]


def error_status(exc: pytest.ExceptionInfo) -> int:
    """The HTTP status of a botocore ClientError."""
    return exc.value.response["ResponseMetadata"]["HTTPStatusCode"]
