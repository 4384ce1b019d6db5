"""Content-addressed metadata objects (ranges, metaranges, chunk lists, commits).

Stored as ``kind byte + zstd(msgpack body)`` under ``objects/ab/abcd…`` in the
object store; the id is BLAKE3 over ``kind byte + body``, so every read is
verified and any copy may be cached forever.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import blake3
import msgpack
import zstandard

from fabric.errors import Corruption, NotFound, ObjectNotFound
from fabric.store import ObjectStore

RANGE = b"R"
METARANGE = b"M"
CHUNKLIST = b"L"
COMMIT = b"C"
KINDS = {RANGE: "range", METARANGE: "metarange", CHUNKLIST: "chunk list", COMMIT: "commit"}
PREFIX = "objects/"


def object_key(oid: str) -> str:
    return f"{PREFIX}{oid[:2]}/{oid}"


def encode_object(kind: bytes, value: Any) -> tuple[str, bytes]:
    """Return ``(id, stored bytes)`` for a value of ``kind``."""
    body = msgpack.packb(value, use_bin_type=True)
    return _object_id(kind, body), kind + zstandard.ZstdCompressor(level=3).compress(body)


def object_id(kind: bytes, value: Any) -> str:
    """The id a value of ``kind`` has once stored (what :func:`encode_object` names it)."""
    return _object_id(kind, msgpack.packb(value, use_bin_type=True))


def _object_id(kind: bytes, body: bytes) -> str:
    return blake3.blake3(kind + body).hexdigest()


def decode_object(oid: str, stored: bytes, kind: bytes | None = None) -> tuple[bytes, Any]:
    """Verify stored bytes against ``oid`` and return ``(kind, value)``."""
    try:
        body = zstandard.ZstdDecompressor().decompress(stored[1:], max_output_size=1 << 30)
    except zstandard.ZstdError as exc:
        raise Corruption(f"metadata object {oid} is corrupt: {exc}") from exc
    got_kind = stored[:1]
    if blake3.blake3(got_kind + body).hexdigest() != oid:
        raise Corruption(f"metadata object {oid} does not match its id")
    if kind is not None and got_kind != kind:
        raise Corruption(f"object {oid} is a {KINDS.get(got_kind, got_kind)!r}, expected a {KINDS[kind]}")
    return got_kind, msgpack.unpackb(body, raw=False)


class MetaStore:
    """Reads and writes metadata objects with a bounded cache of decoded values."""

    def __init__(self, store: ObjectStore, cache_entries: int = 4096) -> None:
        self.store = store
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._limit = cache_entries
        self._lock = threading.Lock()

    def put(self, kind: bytes, value: Any) -> str:
        """Store ``value``; always written, so a concurrent gc cannot race a reuse."""
        oid, stored = encode_object(kind, value)
        self.put_encoded(oid, stored, value)
        return oid

    def put_encoded(self, oid: str, stored: bytes, value: Any) -> None:
        """Store what :func:`encode_object` made of ``value`` (as :meth:`put` does)."""
        self.store.put(object_key(oid), stored)
        self._remember(oid, value)

    def get(self, kind: bytes, oid: str) -> Any:
        with self._lock:
            if oid in self._cache:
                self._cache.move_to_end(oid)
                return self._cache[oid]
        try:
            stored = self.raw(oid)
        except ObjectNotFound:
            raise NotFound(f"{KINDS[kind]} {oid} not found in the store") from None
        _, value = decode_object(oid, stored, kind)
        self._remember(oid, value)
        return value

    def cached(self, oid: str) -> bool:
        with self._lock:
            return oid in self._cache

    def prefetch(self, kind: bytes, ids: list[str]) -> None:
        """Hint that these objects will be read soon (a remote-backed store fetches them in one batch)."""

    def raw(self, oid: str) -> bytes:
        """The stored bytes of an object (for replication to spokes)."""
        return self.store.get(object_key(oid))

    def _remember(self, oid: str, value: Any) -> None:
        with self._lock:
            self._cache[oid] = value
            self._cache.move_to_end(oid)
            while len(self._cache) > self._limit:
                self._cache.popitem(last=False)
