"""A local directory written into by relative path, never outside it.

The directory is opened once; every directory, file, symlink and special file below
it is reached and created with ``*at`` calls relative to directory descriptors, each
component opened with ``O_NOFOLLOW``. So no symlink is ever followed: not one
the caller writes (its target is data), not one already in the directory.

What is in the way is handled as export promises: a file or symlink where a
directory is wanted is replaced by a directory (the link is removed, never
followed); a file or symlink is replaced atomically by its new version; a
directory where a file or symlink is wanted is a :class:`Conflict` (nothing
below it is touched).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from fabric.errors import BadRequest, Conflict
from fabric.format.filetypes import type_bits
from fabric.format.paths import check_path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: What opening a directory with O_NOFOLLOW | O_DIRECTORY fails with on a symlink or a file.
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR)


class DestDir:
    """The directory ``root`` (created if missing; ``root`` itself may be a link to one).
    BadRequest, changing nothing, when ``root`` is something else."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        if os.path.lexists(self.root) and not os.path.isdir(self.root):
            raise BadRequest(f"{self.root} is not a directory")
        os.makedirs(self.root, exist_ok=True)
        self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> DestDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def make_dir(self, rel: str) -> None:
        """Create directory ``rel`` and its parents; a file or symlink in the way becomes a directory."""
        with self.directory(rel, create=True):
            pass

    @contextlib.contextmanager
    def directory(self, rel: str, create: bool = False) -> Iterator[int]:
        """A descriptor of directory ``rel`` ('' for the root), valid inside the ``with``.

        Raises Conflict if a component is not a directory (with ``create`` such a
        component is replaced by one) and FileNotFoundError if one is missing
        (with ``create`` it is made)."""
        parts = check_path(rel).split("/") if rel else []
        fd = os.dup(self._fd)
        try:
            for i, name in enumerate(parts):
                child = self._open_dir(fd, name, "/".join(parts[: i + 1]), create)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _open_dir(self, parent: int, name: str, rel: str, create: bool) -> int:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=parent)
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in _NOT_A_DIR:
                raise
            if not create:
                raise Conflict(f"{self._show(rel)} is no longer a directory (changed during the export)") from None
        os.unlink(name, dir_fd=parent)  # a file or a symlink: removed, never followed
        os.mkdir(name, 0o755, dir_fd=parent)
        return os.open(name, _DIR_FLAGS, dir_fd=parent)

    def unchanged(self, dir_fd: int, rel: str, size: int, mode: int, mtime_ns: int) -> bool:
        """Whether ``rel``, whose directory is ``dir_fd``, is a regular file of ``size`` bytes
        with permission bits ``mode`` modified at ``mtime_ns`` (rsync's quick check: the
        content is not read). A symlink is never followed: a link, a directory or any other
        kind of file there is not unchanged, whatever its size and time."""
        try:
            st = os.stat(_base_name(rel), dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (
            stat.S_ISREG(st.st_mode)
            and st.st_size == size
            and st.st_mtime_ns == mtime_ns
            and stat.S_IMODE(st.st_mode) == mode
        )

    def read_small(self, dir_fd: int, rel: str, limit: int) -> bytes | None:
        """The content of ``rel``, whose directory is ``dir_fd``, if it is a regular file of at
        most ``limit`` bytes (a link is not followed, nor any other kind of file opened); else None."""
        with self.open_regular(dir_fd, rel, limit) as f:
            if f is None:
                return None
            data = f.read(limit + 1)
            return data if len(data) <= limit else None

    @contextlib.contextmanager
    def open_regular(self, dir_fd: int, rel: str, limit: int | None = None) -> Iterator[BinaryIO | None]:
        """``rel``, whose directory is ``dir_fd``, open for reading if it is a regular file (of
        at most ``limit`` bytes); else None. A link is not followed, nor any other kind of file
        opened."""
        name = _base_name(rel)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or (limit is not None and st.st_size > limit):
                yield None
                return
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            yield None  # missing, unreadable
            return
        with open(fd, "rb") as f:
            again = os.fstat(fd)
            # Replaced since the stat: a device opened by mistake is closed unread.
            yield f if stat.S_ISREG(again.st_mode) and (again.st_dev, again.st_ino) == (st.st_dev, st.st_ino) else None

    def write_file(self, dir_fd: int, rel: str, pieces: Iterable[bytes | int], mode: int, mtime_ns: int) -> None:
        """Write ``pieces`` to a temporary file and rename it over ``rel``, whose directory is ``dir_fd``.

        A piece that is an int is a hole of that many zero bytes, left unwritten (the file
        is sparse there). A failure (of the write or of ``pieces``) leaves no temporary file behind."""
        name = _base_name(rel)
        tmp = _tmp_name()
        fd = os.open(tmp, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            try:
                with open(fd, "wb", closefd=False) as f:
                    for piece in pieces:
                        if isinstance(piece, int):
                            f.seek(piece, os.SEEK_CUR)
                        else:
                            f.write(piece)
                    f.truncate()  # a hole at the end still counts in the size
                os.chmod(fd, mode)
                os.utime(fd, ns=(mtime_ns, mtime_ns))  # after the last write, so it stays
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        self._replace(dir_fd, tmp, name, rel)

    def write_symlink(self, dir_fd: int, rel: str, target: str, mtime_ns: int) -> None:
        """Make ``rel``, whose directory is ``dir_fd``, a symlink to ``target`` (text only: never resolved)."""
        tmp = _tmp_name()
        os.symlink(target, tmp, dir_fd=dir_fd)
        self._settle(
            dir_fd, tmp, rel, lambda: os.utime(tmp, ns=(mtime_ns, mtime_ns), dir_fd=dir_fd, follow_symlinks=False)
        )

    def _settle(self, dir_fd: int, tmp: str, rel: str, set_attrs: Callable[[], None]) -> None:
        """Set the attributes of the new ``tmp`` (``set_attrs``), then rename it over ``rel``;
        a failure removes ``tmp``."""
        try:
            set_attrs()
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        self._replace(dir_fd, tmp, _base_name(rel), rel)

    def link(self, first: str, rel: str) -> None:
        """Make ``rel`` a hard link of ``first`` (a file or symlink written before), replacing
        what is at ``rel`` as :meth:`write_file` does. A symlink ``first`` is linked itself,
        never followed."""
        with self.directory(first.rpartition("/")[0]) as src_fd, self.directory(rel.rpartition("/")[0]) as dir_fd:
            tmp = _tmp_name()
            os.link(_base_name(first), tmp, src_dir_fd=src_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            self._replace(dir_fd, tmp, _base_name(rel), rel)

    def write_special(self, dir_fd: int, rel: str, kind: str, mode: int, rdev: int, mtime_ns: int) -> bool:
        """Make ``rel``, whose directory is ``dir_fd``, a FIFO, socket or device node (``kind``,
        as :mod:`fabric.format.filetypes` names them). False, with nothing changed, when the
        caller may not make a device (EPERM: no CAP_MKNOD)."""
        tmp = _tmp_name()
        try:
            os.mknod(tmp, type_bits(kind) | 0o600, rdev, dir_fd=dir_fd)
        except PermissionError:
            return False

        def set_attrs() -> None:
            os.chmod(tmp, mode, dir_fd=dir_fd, follow_symlinks=False)  # (mknod's mode is cut by the umask)
            os.utime(tmp, ns=(mtime_ns, mtime_ns), dir_fd=dir_fd, follow_symlinks=False)

        self._settle(dir_fd, tmp, rel, set_attrs)
        return True

    def set_dir_attrs(self, rel: str, mode: int, mtime_ns: int) -> None:
        """Set the mode and modification time of directory ``rel``."""
        with self.directory(rel) as fd:
            os.chmod(fd, mode)
            os.utime(fd, ns=(mtime_ns, mtime_ns))

    def _replace(self, dir_fd: int, tmp: str, name: str, rel: str) -> None:
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise Conflict(
                    f"{self._show(rel)} is a directory; the export has a file or symlink there "
                    "(move the directory away, or export with --delete)"
                ) from None
            raise

    def prune(self, keep: Callable[[str, bool], bool], dry_run: bool = False) -> list[str]:
        """Remove every path below the root that ``keep(rel, is_dir)`` rejects, a directory with
        everything in it; the paths removed (with ``dry_run``: that would be), in walk order.
        A kept directory is entered, through its descriptor; a symlink is removed, never
        followed, so nothing outside the root is touched."""
        removed: list[str] = []
        self._prune(self._fd, "", keep, dry_run, removed)
        return removed

    def _prune(self, dir_fd: int, rel: str, keep: Callable[[str, bool], bool], dry_run: bool, removed: list[str]) -> None:
        with os.scandir(dir_fd) as entries:
            listed = sorted((de.name, de.is_dir(follow_symlinks=False)) for de in entries)
        for name, is_dir in listed:
            path = rel + name
            if keep(path, is_dir):
                if is_dir:
                    child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                    try:
                        self._prune(child, path + "/", keep, dry_run, removed)
                    finally:
                        os.close(child)
                continue
            removed.append(path)
            if dry_run:
                continue
            with contextlib.suppress(FileNotFoundError):  # (gone meanwhile)
                if is_dir:  # through descriptors, never following a link (shutil.rmtree.avoids_symlink_attacks)
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)

    def _show(self, rel: str) -> str:
        return os.path.join(self.root, rel)


def _base_name(rel: str) -> str:
    return check_path(rel).rsplit("/", 1)[-1]


def _tmp_name() -> str:
    # Not name + suffix: that exceeds NAME_MAX (255 bytes) for long names.
    return f".fabric-tmp-{os.urandom(6).hex()}"
