"""Object store on any fsspec filesystem (``memory://``, ``sftp://``, ``gcs://``…).

Atomic puts: on filesystems whose ``mv`` is a rename (local, SFTP, HDFS…) a
put writes a ``.tmp-<random>`` file next to the target and moves it into
place. Everywhere else a put writes the key directly, which is atomic on
object stores and in memory, and the best the filesystem allows otherwise.
"""

from __future__ import annotations

import datetime as dt
import posixpath
import secrets
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import fsspec

from fabric.errors import BadRequest, ObjectNotFound
from fabric.store.base import (
    TEMP_PREFIX,
    ObjectInfo,
    ObjectStore,
    check_range,
    redact_url,
    validate_key,
    validate_prefix,
)

#: Protocols whose ``mv`` within one filesystem is an atomic rename.
RENAME_PROTOCOLS = frozenset({"file", "local", "sftp", "ssh", "hdfs", "arrow_hdfs", "ftp"})

_COPY_BUFFER = 1 << 20

#: ``info()`` fields holding a modification time, by backend, most precise first.
_MTIME_FIELDS = ("mtime", "LastModified", "last_modified", "updated", "modified", "created")


class FsspecStore(ObjectStore):
    """Objects under the path of ``url`` on its fsspec filesystem.

    ``storage_options`` go to the filesystem (credentials, endpoints); they
    never appear in :attr:`url` or messages.
    """

    def __init__(self, url: str, **storage_options: Any) -> None:
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as exc:
            raise BadRequest(f"cannot open object store {redact_url(url)!r}: {exc}") from None
        self.root = root.rstrip("/")
        self._url = redact_url(url)
        protocols = self.fs.protocol
        protocols = {protocols} if isinstance(protocols, str) else set(protocols)
        self._rename_atomic = bool(protocols & RENAME_PROTOCOLS)

    @property
    def url(self) -> str:
        return self._url

    def _path(self, key: str) -> str:
        return f"{self.root}/{validate_key(key)}"

    def _not_found(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"object {key!r} not found in {self._url}")

    def put(self, key: str, data: bytes | memoryview) -> None:
        body = data if isinstance(data, bytes) else bytes(data)
        self._write(key, lambda path: self.fs.pipe_file(path, body))

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as src:

            def copy(target: str) -> None:
                src.seek(0)
                with self.fs.open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, _COPY_BUFFER)

            self._write(key, copy)

    def _write(self, key: str, write: Callable[[str], None]) -> None:
        target = self._path(key)
        if not self._rename_atomic:
            self._with_parent(target, write)
            return
        tmp = posixpath.join(posixpath.dirname(target), TEMP_PREFIX + secrets.token_hex(8))
        try:
            self._with_parent(tmp, write)
            self.fs.mv(tmp, target)
        except BaseException:
            try:
                self.fs.rm_file(tmp)
            except FileNotFoundError:
                pass
            raise

    def _with_parent(self, path: str, write: Callable[[str], None]) -> None:
        """Run ``write(path)``, creating the parent directory if it is missing."""
        try:
            write(path)
        except FileNotFoundError:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            write(path)

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_range(offset, length)
        end = None if length is None else offset + length
        try:
            data: bytes = self.fs.cat_file(self._path(key), start=offset, end=end)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._not_found(key) from None
        return data

    def stat(self, key: str) -> ObjectInfo:
        try:
            info = self.fs.info(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise self._not_found(key) from None
        if info.get("type") != "file":
            raise self._not_found(key)
        return ObjectInfo(key, int(info["size"]), _mtime(info))

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            pass  # absent, or a directory of other keys: no object there

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        base = prefix.rpartition("/")[0]
        start = f"{self.root}/{base}" if base else self.root or "/"
        skip = len(self.root) + 1
        found = []
        for path, info in self.fs.find(start, detail=True).items():
            key = path[skip:]
            if (
                info.get("type") == "file"
                and key.startswith(prefix)
                and not posixpath.basename(key).startswith(TEMP_PREFIX)
            ):
                found.append(ObjectInfo(key, int(info["size"]), _mtime(info)))
        found.sort(key=lambda item: item.key)
        yield from found


def _mtime(info: dict[str, Any]) -> float:
    """Modification time in unix seconds from an fsspec ``info()`` dict (0.0 if none)."""
    for field in _MTIME_FIELDS:
        value = info.get(field)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, dt.datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0
