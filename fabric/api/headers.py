"""HTTP header values that the REST API and the S3 gateway both read or write:
byte ranges (``Range``) and dates (``Last-Modified``, ``If-Modified-Since``...).

Each protocol answers a range it cannot serve in its own way (S3 ignores a header
it does not understand, the REST API refuses it); both parse it here.
"""

from __future__ import annotations

from email.utils import formatdate, parsedate_to_datetime

from fabric.errors import RangeNotSatisfiable


class InvalidRange(ValueError):
    """A ``Range`` header that is not one well-formed range of bytes; the message says why."""


def parse_range(header: str, size: int) -> tuple[int, int]:
    """The ``(offset, length)`` that a ``Range`` header selects of ``size`` bytes.

    One range of the ``bytes`` unit is served (RFC 9110 §14.1.2; the unit name is
    case-insensitive):

    - ``bytes=first-last``: bytes ``first`` to ``last`` inclusive; a ``last`` past
      the end is the last byte;
    - ``bytes=first-``: from ``first`` to the end;
    - ``bytes=-suffix``: the last ``suffix`` bytes; all of them when there are fewer.

    Raises :class:`InvalidRange` when the header is not one such range: another unit,
    several ranges (``bytes=0-1,5-6``: multipart/byteranges answers are not served),
    positions that are not numbers, or a ``last`` before ``first`` (an invalid range
    in RFC 9110). A server may ignore such a header (S3 does) or refuse it (the REST
    API answers 416 with the message).

    Raises :class:`~fabric.errors.RangeNotSatisfiable`, with ``size`` in its details
    (for ``Content-Range: bytes */SIZE``), when the range is well formed but selects
    no byte: a ``first`` at or past the end (checked before ``last`` is compared with
    it), a zero suffix (``bytes=-0``), or any range of zero bytes.
    """
    unit, eq, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        raise InvalidRange(f"unsupported Range {header!r}: use one bytes=START-END range")
    first, dash, last = spec.strip().partition("-")
    if not eq or not dash:
        raise InvalidRange(f"malformed Range {header!r}")
    try:
        if first == "":
            suffix = int(last)
            start = max(0, size - suffix) if suffix > 0 else size  # a zero suffix selects nothing
            end = size - 1
        else:
            start = int(first)
            end = int(last) if last else size - 1
    except ValueError:
        raise InvalidRange(f"malformed Range {header!r}") from None
    if start >= size:
        raise RangeNotSatisfiable(f"Range {header!r} is outside the object's {size} bytes", size=size)
    if end < start:
        raise InvalidRange(f"malformed Range {header!r}: its last byte is before its first")
    end = min(end, size - 1)
    return start, end - start + 1


def http_date(seconds: float) -> str:
    """An HTTP date (RFC 9110 IMF-fixdate, ``Sun, 06 Nov 1994 08:49:37 GMT``) of a POSIX time."""
    return formatdate(seconds, usegmt=True)


def parse_http_date(text: str) -> int | None:
    """The POSIX time, in whole seconds, of an HTTP date in any of RFC 9110's three
    formats; ``None`` when ``text`` is not a date (a conditional header to ignore)."""
    try:
        return int(parsedate_to_datetime(text).timestamp())
    except (TypeError, ValueError, IndexError):
        return None
