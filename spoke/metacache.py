"""Metadata objects at a spoke: read through a local cache from the hub.

A :class:`~fabric.engine.metastore.MetaStore` over :class:`CachedMetaSource` gives
the spoke the same trees, ranges, chunk lists and commits as the hub, fetched
once (in batches when the reader announces what it will need) and then kept:
they are immutable and verified against their ids on every read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fabric.cache.disk import DiskCache
from fabric.engine.metastore import MetaStore, decode_object
from fabric.errors import BadRequest, Corruption, ObjectNotFound

from .traffic import METADATA, Traffic

GetObjects = Callable[[Sequence[str]], dict[str, bytes]]


class SpokeMetaStore(MetaStore):
    """A MetaStore whose misses are fetched from the hub and kept in a :class:`DiskCache`."""

    def __init__(self, cache: DiskCache, get_objects: GetObjects, traffic: Traffic) -> None:
        super().__init__(store=None)  # type: ignore[arg-type] - every read goes through raw()
        self.disk = cache
        self._get_objects = get_objects
        self.traffic = traffic

    def put(self, kind: bytes, value: object) -> str:
        raise BadRequest("a spoke does not write metadata objects; writes go to the hub")

    def raw(self, oid: str) -> bytes:
        key = bytes.fromhex(oid)
        data = self.disk.get(key)
        if data is not None:
            try:
                decode_object(oid, data)  # the cached copy too: a damaged one is dropped and fetched again
            except Corruption:
                self.disk.drop_corrupt(key)
                data = None
        if data is None:
            data = self._fetch([oid]).get(oid)
        if data is None:
            raise ObjectNotFound(f"metadata object {oid} not found at the hub")
        return data

    def prefetch(self, kind: bytes, ids: list[str]) -> None:
        missing = [oid for oid in ids if not self.cached(oid) and bytes.fromhex(oid) not in self.disk]
        if missing:
            self._fetch(missing)

    def _fetch(self, ids: list[str]) -> dict[str, bytes]:
        with self.traffic.purpose(METADATA):
            got = self._get_objects(ids)
        for oid, data in got.items():
            decode_object(oid, data)  # verify before caching
            self.disk.put(bytes.fromhex(oid), data)
        return got
