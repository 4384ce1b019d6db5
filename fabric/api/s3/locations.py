"""The LocationConstraint each bucket was created with.

:class:`Locations` is what the gateway needs; :class:`BucketLocations` keeps them in a
small JSON file in the gateway's state directory (in memory only without one), like a
spoke gateway's multipart state: each spoke keeps its own, so a bucket's location is
known to the spoke it was created through (the others answer their own region). A hub
keeps them in its catalog (:class:`fabric.catalog.locations.LocationStore`), so every
hub process answers alike. Entries are keyed by bucket name and creation time, so a
bucket deleted and re-created another way does not inherit a location.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Protocol

FILE_NAME = "bucket-locations.json"
#: What a LocationConstraint may be: a region name (``eu-west-1``, the legacy ``EU``).
_CONSTRAINT = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")


def valid_constraint(value: str) -> bool:
    """Whether ``value`` may be a bucket's LocationConstraint (a region name)."""
    return _CONSTRAINT.fullmatch(value) is not None


class Locations(Protocol):
    def get(self, bucket: str, created: float) -> str | None:
        """The constraint bucket ``bucket`` (created at ``created``) was created with, if any."""
        ...

    def put(self, bucket: str, created: float, constraint: str) -> None: ...

    def drop(self, bucket: str) -> None: ...


class BucketLocations:
    def __init__(self, state_dir: str | None) -> None:
        self._path = os.path.join(state_dir, FILE_NAME) if state_dir else None
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        if self._path and os.path.exists(self._path):
            with open(self._path, encoding="utf-8") as f:
                self._entries = json.load(f)

    def get(self, bucket: str, created: float) -> str | None:
        """The constraint bucket ``bucket`` (created at ``created``) was created with, if any."""
        entry = self._entries.get(bucket)
        if entry is None or entry["created"] != created:
            return None
        return entry["constraint"]

    def put(self, bucket: str, created: float, constraint: str) -> None:
        with self._lock:
            self._entries[bucket] = {"created": created, "constraint": constraint}
            self._save()

    def drop(self, bucket: str) -> None:
        with self._lock:
            if self._entries.pop(bucket, None) is not None:
                self._save()

    def _save(self) -> None:
        if not self._path:
            return
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        tmp = f"{self._path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self._entries, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
