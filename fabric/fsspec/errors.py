"""The exceptions fsspec users expect, from fabric's errors."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from fabric import errors


@contextlib.contextmanager
def fs_errors(path: str) -> Iterator[None]:
    """Raise fabric's errors inside the block as the built-in exceptions fsspec callers catch:
    NotFound → FileNotFoundError, Forbidden/Unauthorized → PermissionError, a bad name, path or
    request → ValueError, Unavailable → ConnectionError, Corruption → OSError(EIO). Other errors pass unchanged."""
    try:
        yield
    except errors.NotFound as exc:
        raise FileNotFoundError(errno.ENOENT, exc.message, path) from exc
    except (errors.Forbidden, errors.Unauthorized) as exc:
        raise PermissionError(errno.EACCES, exc.message, path) from exc
    except errors.BadRequest as exc:
        raise ValueError(f"{path}: {exc.message}") from exc
    except errors.Unavailable as exc:
        raise ConnectionError(errno.EAGAIN, exc.message, path) from exc
    except errors.Corruption as exc:
        raise OSError(errno.EIO, exc.message, path) from exc


def not_found(path: str, what: str = "no such file or directory") -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, what, path)


def is_a_directory(path: str) -> IsADirectoryError:
    return IsADirectoryError(errno.EISDIR, "is a directory", path)


def not_a_directory(path: str, file: str) -> NotADirectoryError:
    return NotADirectoryError(errno.ENOTDIR, f"{file} is a file, not a directory", path)
