"""Object store in a local directory: the default backend.

Each key is a file under the root (``packs/ab/cd`` -> ``ROOT/packs/ab/cd``).
A put writes a temporary file named ``.tmp-<random>`` next to the target,
fsyncs it, renames it into place and fsyncs the directory, so a reader or a
crash never sees a partial object. Reads are a single ``open`` + ``pread``
with no ``stat`` first, because chunk reads go through here.

A key cannot be both an object and the directory of other keys (``a`` and
``a/b``); such a put raises :class:`~fabric.errors.Conflict`. Keys the engine
writes never collide this way.
"""

from __future__ import annotations

import os
import secrets
import stat as stat_mod
from collections.abc import Callable, Iterator
from io import BufferedIOBase
from pathlib import Path

from fabric.errors import BadRequest, Conflict, ObjectNotFound
from fabric.store.base import (
    TEMP_PREFIX,
    ObjectInfo,
    ObjectStore,
    check_range,
    validate_key,
    validate_prefix,
)
from fabric.util.fileio import write_all
from fabric.util.jsonfile import fsync_dir

_COPY_BUFFER = 1 << 20
# Reads asking for more than this are clamped to the file size first, so an
# oversized length never allocates a buffer bigger than the object.
_CLAMP_ABOVE = 1 << 24


class LocalStore(ObjectStore):
    """Objects as files under ``root`` (created if missing). Thread-safe."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        try:
            os.makedirs(self.root, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise BadRequest(f"object store root {self.root} is not a directory") from None

    @property
    def url(self) -> str:
        return Path(self.root).as_uri()

    def describe(self) -> str:
        return f"local directory {self.root}"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, validate_key(key))

    # -- writing ---------------------------------------------------------

    def put(self, key: str, data: bytes | memoryview) -> None:
        with memoryview(data) as view:
            self._write_atomically(key, lambda fd: write_all(fd, view.cast("B")))

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as src:
            self._write_atomically(key, lambda fd: _copy_into(src, fd))

    def _write_atomically(self, key: str, write: Callable[[int], None]) -> None:
        target = self._path(key)
        directory = os.path.dirname(target)
        fd, tmp = self._create_temp(key, directory)
        try:
            try:
                write(fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except IsADirectoryError:
            _unlink_quietly(tmp)
            raise Conflict(
                f"cannot store object {key!r}: it is a directory of other objects"
            ) from None
        except BaseException:
            _unlink_quietly(tmp)
            raise
        fsync_dir(directory)

    def _create_temp(self, key: str, directory: str) -> tuple[int, str]:
        tmp = os.path.join(directory, TEMP_PREFIX + secrets.token_hex(8))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            return os.open(tmp, flags, 0o644), tmp
        except FileNotFoundError:
            self._make_dirs(key, directory)
        except NotADirectoryError:
            raise _ancestor_conflict(key) from None
        return os.open(tmp, flags, 0o644), tmp

    def _make_dirs(self, key: str, directory: str) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry."""
        missing = []
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for new in reversed(missing):
            try:
                os.mkdir(new, 0o755)
            except FileExistsError:
                if not os.path.isdir(new):
                    raise _ancestor_conflict(key) from None
                continue  # created concurrently
            except NotADirectoryError:
                raise _ancestor_conflict(key) from None
            fsync_dir(os.path.dirname(new))

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            pass  # absent, or a directory of other keys: no object there

    # -- reading ---------------------------------------------------------

    def _open(self, key: str) -> int:
        try:
            return os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"object {key!r} not found in {self.describe()}") from None

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_range(offset, length)
        fd = self._open(key)
        try:
            return _pread(key, fd, offset, length)
        finally:
            os.close(fd)

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        for offset, length in ranges:
            check_range(offset, length)
        fd = self._open(key)
        try:
            return [_pread(key, fd, offset, length) for offset, length in ranges]
        finally:
            os.close(fd)

    def stat(self, key: str) -> ObjectInfo:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is None or not stat_mod.S_ISREG(st.st_mode):
            raise ObjectNotFound(f"object {key!r} not found in {self.describe()}")
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def remove_stale_temporaries(self, older_than: float) -> int:
        removed = 0
        for directory, _, names in os.walk(self.root):
            for name in names:
                if not name.startswith(TEMP_PREFIX):
                    continue
                path = os.path.join(directory, name)
                try:
                    if os.stat(path).st_mtime < older_than:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    continue  # its writer finished (renamed it) meanwhile
        return removed

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        base = prefix.rpartition("/")[0]
        if base:
            return self._walk(os.path.join(self.root, base), base + "/", prefix)
        return self._walk(self.root, "", prefix)

    def _walk(self, directory: str, dir_key: str, prefix: str) -> Iterator[ObjectInfo]:
        """Yield objects under ``directory`` (whose keys start ``dir_key``) in key order.

        Sorting each directory's entries by name, with ``/`` appended to
        subdirectories, gives global key order: all keys below ``a/`` share
        that prefix, and ``a-b`` < ``a/…`` < ``a0`` as strings.
        """
        entries: list[tuple[str, os.DirEntry[str]]] = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    if entry.name.startswith(TEMP_PREFIX):
                        continue
                    key = dir_key + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        sub = key + "/"
                        if sub.startswith(prefix) or prefix.startswith(sub):
                            entries.append((sub, entry))
                    elif key.startswith(prefix) and entry.is_file(follow_symlinks=False):
                        entries.append((key, entry))
        except (FileNotFoundError, NotADirectoryError):
            return
        entries.sort(key=lambda item: item[0])
        for key, entry in entries:
            if key.endswith("/"):
                yield from self._walk(entry.path, key, prefix)
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while listing
            yield ObjectInfo(key, st.st_size, st.st_mtime)


def _pread(key: str, fd: int, offset: int, length: int | None) -> bytes:
    try:
        if length is None or length > _CLAMP_ABOVE:
            available = max(0, os.fstat(fd).st_size - offset)
            length = available if length is None else min(length, available)
        data = os.pread(fd, length, offset)
        if len(data) == length or not data:
            return data
        parts, got = [data], len(data)  # short read: continue until EOF or done
        while got < length and (more := os.pread(fd, length - got, offset + got)):
            parts.append(more)
            got += len(more)
        return b"".join(parts)
    except IsADirectoryError:
        raise ObjectNotFound(f"object {key!r} not found (it is a directory)") from None


def _copy_into(src: BufferedIOBase, fd: int) -> None:
    buffer = bytearray(_COPY_BUFFER)
    with memoryview(buffer) as view:
        while n := src.readinto(buffer):
            write_all(fd, view[:n])


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _ancestor_conflict(key: str) -> Conflict:
    return Conflict(f"cannot store object {key!r}: one of its parent directories is an object")
