"""The HTTP header helpers the REST API and the S3 gateway share: one Range parser, HTTP dates."""

from __future__ import annotations

import pytest

from fabric.api.headers import InvalidRange, http_date, parse_http_date, parse_range
from fabric.errors import RangeNotSatisfiable


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-9", (0, 10)),  # first-last
        ("bytes=90-", (90, 10)),  # first- : to the end
        ("bytes=-10", (90, 10)),  # -suffix : the last bytes
        ("bytes=-1000", (0, 100)),  # a suffix longer than the object is all of it
        ("bytes=50-1000", (50, 50)),  # a last past the end is the end
        ("bytes=99-99", (99, 1)),
        ("Bytes = 1-2", (1, 2)),  # the unit is case-insensitive
    ],
)
def test_satisfiable_ranges(header: str, expected: tuple[int, int]):
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize(
    "header",
    ["items=0-1", "bytes", "bytes=0-1,5-6", "bytes=abc", "bytes=x-y", "bytes=-", "bytes=5", "bytes=9-2"],
)
def test_invalid_ranges(header: str):
    """Not one well-formed bytes range: another unit, several ranges, no numbers, last before first."""
    with pytest.raises(InvalidRange) as e:
        parse_range(header, 100)
    assert header in str(e.value)


@pytest.mark.parametrize(("header", "size"), [("bytes=100-", 100), ("bytes=200-100", 100), ("bytes=-0", 100), ("bytes=0-", 0), ("bytes=-5", 0)])
def test_unsatisfiable_ranges(header: str, size: int):
    """Well formed but selecting no byte; the size comes along for ``Content-Range: bytes */SIZE``."""
    with pytest.raises(RangeNotSatisfiable) as e:
        parse_range(header, size)
    assert e.value.details["size"] == size


def test_http_dates():
    assert http_date(784111777) == "Sun, 06 Nov 1994 08:49:37 GMT"
    for text in ("Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT"):
        assert parse_http_date(text) == 784111777, text
    assert parse_http_date(http_date(1700000000.75)) == 1700000000
    assert parse_http_date("yesterday") is None and parse_http_date("") is None
