"""The object-store interface every storage backend implements.

Modelled on restic's ``internal/backend/backend.go``: one small interface,
each method's contract (idempotency, errors) written where it is declared.
Retries, metrics and fault injection are wrappers around the interface
(:mod:`fabric.store.wrappers`), not code inside each backend.

Keys are ``/``-separated relative paths such as ``packs/ab/abcdef…``. Every
backend validates them with :func:`validate_key` before touching storage, so
a bad key is refused with :class:`~fabric.errors.BadRequest` and nothing is
written.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from fabric.errors import BadRequest, ObjectNotFound

#: Name prefix of in-flight temporary objects. Backends write a new object
#: under such a name and rename it into place; listings skip them, and keys
#: may not use the prefix.
TEMP_PREFIX = ".tmp-"

#: Longest key accepted, in UTF-8 bytes (S3's limit).
MAX_KEY_BYTES = 1024


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or :meth:`ObjectStore.stat` says about one object."""

    key: str
    size: int
    mtime: float  # unix seconds


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``BadRequest``.

    A key is a non-empty ``/``-separated relative path of at most
    :data:`MAX_KEY_BYTES` UTF-8 bytes: no leading ``/``, no empty, ``.`` or
    ``..`` segment (so no trailing ``/`` or ``//``), no NUL, and no segment
    starting with :data:`TEMP_PREFIX`.
    """
    if not isinstance(key, str) or not key:
        raise BadRequest(f"invalid object key {key!r}: must be a non-empty string")
    _check_text(key, "key")
    if key.startswith("/"):
        raise BadRequest(f"invalid object key {key!r}: must be relative (no leading '/')")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise BadRequest(
                f"invalid object key {key!r}: empty, '.' and '..' path segments are not allowed"
            )
        if segment.startswith(TEMP_PREFIX):
            raise BadRequest(
                f"invalid object key {key!r}: segments starting with {TEMP_PREFIX!r} are reserved"
            )
    return key


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a valid key, else raise ``BadRequest``.

    The empty prefix is valid, and a prefix may end in ``/`` or in the middle
    of a segment (``packs/a`` matches ``packs/ab/…``).
    """
    if not isinstance(prefix, str):
        raise BadRequest(f"invalid key prefix {prefix!r}: must be a string")
    if not prefix:
        return prefix
    _check_text(prefix, "key prefix")
    if prefix.startswith("/"):
        raise BadRequest(f"invalid key prefix {prefix!r}: must be relative (no leading '/')")
    # Every segment but the last is complete and must be valid.
    for segment in prefix.split("/")[:-1]:
        if segment in ("", ".", ".."):
            raise BadRequest(
                f"invalid key prefix {prefix!r}: empty, '.' and '..' path segments are not allowed"
            )
    return prefix


def _check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise BadRequest(f"invalid {what} {text!r}: contains NUL")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest(f"invalid {what} {text!r}: not valid UTF-8 text") from None
    if size > MAX_KEY_BYTES:
        raise BadRequest(f"invalid {what}: {size} bytes long, the limit is {MAX_KEY_BYTES}")


def check_range(offset: int, length: int | None) -> None:
    """Raise ``BadRequest`` unless ``offset >= 0`` and ``length`` is None or ``>= 0``."""
    if offset < 0 or (length is not None and length < 0):
        raise BadRequest(f"invalid range: offset={offset}, length={length}")


def redact_url(url: str) -> str:
    """Return ``url`` without user name and password, for logs and messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


class ObjectStore(abc.ABC):
    """A flat namespace of immutable-once-written byte objects.

    Implementations are safe to call from several threads at once. Methods
    that take a key raise :class:`~fabric.errors.BadRequest` for an invalid
    key (see :func:`validate_key`) before any I/O. Other failures (network,
    disk) surface as the backend's own exception (``OSError``, botocore
    errors); :class:`~fabric.store.wrappers.RetryingStore` decides which
    of those are worth retrying.
    """

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key``, replacing any existing object.

        Atomic: a concurrent or later reader sees the whole old object or the
        whole new one, never a partial one, even if the writer crashes.
        Idempotent: repeating a put (for instance after an error whose outcome
        is unknown) leaves the same result.
        """

    def put_file(self, key: str, path: str) -> None:
        """Store the contents of the local file ``path`` under ``key``.

        Same contract as :meth:`put`. Backends override this to stream the
        file in bounded memory; this default reads it whole.
        """
        with open(path, "rb") as f:
            data = f.read()
        self.put(key, data)

    @abc.abstractmethod
    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Return ``length`` bytes of ``key`` from ``offset`` (to the end if None).

        Reading past the end returns the bytes that exist, possibly none.
        Raises :class:`~fabric.errors.ObjectNotFound` if ``key`` is absent and
        ``BadRequest`` for a negative offset or length.
        """

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Return the bytes of each ``(offset, length)`` range of ``key``.

        Each range behaves as :meth:`get`. Raises ``ObjectNotFound`` if
        ``key`` is absent. Backends override this to read all ranges from one
        open handle.
        """
        return [self.get(key, offset, length) for offset, length in ranges]

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Return size and modification time of ``key``; ``ObjectNotFound`` if absent."""

    def exists(self, key: str) -> bool:
        """Return whether ``key`` is present."""
        try:
            self.stat(key)
        except ObjectNotFound:
            return False
        return True

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``. Idempotent: deleting an absent key succeeds."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield every object whose key starts with ``prefix``, sorted by key.

        ``prefix`` is a plain string prefix, not a directory: ``"packs/a"``
        matches ``"packs/ab/x"``. Objects written or deleted during the
        listing may or may not appear. Raises ``BadRequest`` for an invalid
        prefix (see :func:`validate_prefix`).
        """

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """A URL naming this store for :func:`fabric.store.open_store`; never holds secrets."""

    def remove_stale_temporaries(self, older_than: float) -> int:
        """Delete temporaries of writes that never finished (a writer killed mid-put),
        last modified before unix time ``older_than``; returns how many. Backends whose
        puts are atomic without temporaries have none: the default removes nothing."""
        return 0

    def describe(self) -> str:
        """A short human description for logs and errors; never holds secrets."""
        return f"{type(self).__name__}({self.url})"

    def __repr__(self) -> str:
        return f"<{self.describe()}>"
