"""Validation of user-supplied names and paths. Bad input never reaches storage."""

from __future__ import annotations

import re

from fabric.errors import InvalidName, InvalidPath

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096

_REPO_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_REF_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
COMMIT_ID_RE = re.compile(r"^[0-9a-f]{8,64}$")


def is_full_commit_id(text: str) -> bool:
    """Whether ``text`` is a whole commit id (64 hex digits), which no branch or tag name can be."""
    return len(text) == 64 and COMMIT_ID_RE.fullmatch(text) is not None


def check_repo_name(name: str) -> str:
    """Repository names double as S3 bucket names: 3-63 of ``a-z 0-9 -``."""
    if not isinstance(name, str) or not _REPO_RE.match(name) or "--" in name:
        raise InvalidName(
            f"invalid repository name {name!r}: use 3-63 lowercase letters, digits and single hyphens, "
            "starting and ending with a letter or digit"
        )
    return name


_IPV4_RE = re.compile(r"\d{1,3}(\.\d{1,3}){3}")


def check_bucket_name(name: str) -> str:
    """S3 bucket binding names: repository names, or such labels joined by dots (S3's dotted
    bucket names, e.g. ``data.v1``), 3-63 characters, not an IP address."""
    if not isinstance(name, str) or "." not in name:
        return check_repo_name(name)
    labels = name.split(".")
    if (
        len(name) > 63
        or _IPV4_RE.fullmatch(name)
        or any(not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", label) or "--" in label for label in labels)
    ):
        raise InvalidName(
            f"invalid bucket name {name!r}: use 3-63 lowercase letters, digits, single hyphens and dots, "
            "each dot between letters or digits, and not an IP address"
        )
    return name


def check_ref_name(name: str, what: str = "branch") -> str:
    """Branch and tag names: letters, digits, ``. _ -``; no slashes (S3 keys are REF/PATH)."""
    if (
        not isinstance(name, str)
        or not _REF_RE.match(name)
        or ".." in name
        or name.endswith((".", ".lock"))
        or is_full_commit_id(name)
    ):
        raise InvalidName(
            f"invalid {what} name {name!r}: use up to 255 letters, digits, '.', '_' or '-', "
            "not starting with '.' or '-', without '..' or '/'"
        )
    return name


def check_path(path: str, allow_empty: bool = False) -> str:
    """A repository path: relative, '/'-separated, no '.', '..' or empty segments, no NUL."""
    if not isinstance(path, str):
        raise InvalidPath(f"invalid path {path!r}: not a string")
    if path == "" and allow_empty:
        return path
    problem = _path_problem(path)
    if problem:
        raise InvalidPath(f"invalid path {path!r}: {problem}")
    return path


def _path_problem(path: str) -> str | None:
    if path == "":
        return "empty"
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith("/"):
        return "absolute paths are not allowed; give a path relative to the repository root"
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if len(encoded) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes"
    for seg in path.split("/"):
        if seg in ("", ".", ".."):
            return "'.', '..' and empty segments are not allowed"
        if len(seg.encode("utf-8")) > MAX_NAME_BYTES:
            return f"a name is longer than {MAX_NAME_BYTES} bytes"
    return None


def check_prefix(prefix: str) -> str:
    """A listing prefix: like a path, but may be empty or end with '/'."""
    if prefix == "":
        return prefix
    check_path(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix
