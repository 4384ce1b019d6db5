"""How S3 names map onto repositories: buckets, keys, and the ref and path a key names.

A bucket is either a repository, whose keys are ``REF/PATH`` (a branch, tag or
commit id, then the path), or a *bound* bucket whose keys are plain paths on one
branch or tag. Writes go only to branches.

A key ending in '/' names the path without its slash (:func:`stored_entry`): keys
``a`` and ``a/`` share the path ``a``, so writing one replaces the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from fabric.api.s3.auth import require
from fabric.api.s3.cache import TTLCache
from fabric.api.s3.entrymeta import PARTS, SLASH_KEY, slash_key
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.specials import shown
from fabric.auth.principal import Principal
from fabric.errors import BadRequest, FabricError, NotFound
from fabric.format.model import DEFAULT_DIR_MODE, DIR, FILE, Entry
from fabric.format.paths import check_path, check_repo_name
from fabric.plane.dataplane import DataPlane

#: ``buckets(name) -> dict | None``: the binding of a bucket name, ``None`` when unbound.
BindingLookup = Callable[[str], "dict | None"]
EMPTY_MD5 = hashlib.md5(b"").hexdigest()


def check_key_encoding(raw_path: str) -> None:
    """InvalidURI (400) for a request path whose percent-decoded bytes are not UTF-8
    (``raw_path``: as sent, one character per byte)."""
    try:
        unquote_to_bytes(raw_path.encode("latin-1")).decode("utf-8")
    except UnicodeError:
        raise S3Error("InvalidURI", "Couldn't parse the specified URI.", 400) from None


def stored_entry(entry: Entry, is_dir: bool) -> Entry:
    """The entry to store for an object (a file or a directory marker) written at a key;
    ``is_dir``: the key ends in '/'.

    Such a key names the path without its slash. An empty object there is a directory
    marker (a directory entry, as file systems expect); one with a body is a file flagged
    :data:`~fabric.api.s3.entrymeta.SLASH_KEY`, which file-system views show as the file of
    that path (shadowed, like any file, by a directory of the same name). At any other key
    the object is a plain file.
    """
    meta = {k: v for k, v in entry.meta.items() if k != SLASH_KEY}
    if is_dir and entry.size == 0:
        meta.pop(PARTS, None)
        return Entry(DIR, 0, DEFAULT_DIR_MODE, entry.mtime_ns, md5=entry.md5 or EMPTY_MD5, meta=meta)
    if entry.kind == DIR:  # an empty directory marker, copied to a key without the slash
        entry = Entry(FILE, 0, 0o644, entry.mtime_ns, md5=entry.md5 or EMPTY_MD5)
    if is_dir:
        meta[SLASH_KEY] = "1"
    return entry.with_(meta=meta)


@dataclass(frozen=True)
class Bucket:
    name: str
    repo: str
    ref: str | None  # None: keys are REF/PATH
    created: float = 0.0
    created_by_s3: bool = False


def plane_bindings(plane: DataPlane) -> BindingLookup:
    """The default binding lookup: ``plane.get_bucket``, ``None`` when the name is unbound."""

    def lookup(name: str) -> dict | None:
        try:
            return plane.get_bucket(name)
        except NotFound:
            return None

    return lookup


class Namespace:
    """Buckets and keys over one plane; bucket answers and branch lists are cached for ``cache_seconds``."""

    def __init__(self, plane: DataPlane, bindings: BindingLookup, cache_seconds: float) -> None:
        self.plane = plane
        self.bindings = bindings
        self._buckets = TTLCache(cache_seconds)
        self._branches = TTLCache(cache_seconds)

    # -- buckets -----------------------------------------------------------------------
    def bucket(self, name: str, fresh: bool = False) -> Bucket:
        """The bucket of this name (NoSuchBucket when there is none); ``fresh``: as it is now,
        not as recently cached (deletes answer NoSuchBucket for a bucket deleted elsewhere)."""
        if fresh:
            self._buckets.drop(name)
        b = self._buckets.get(name, lambda: self.resolve_bucket(name))
        if b is None:
            raise S3Error("NoSuchBucket", "The specified bucket does not exist", 404, BucketName=name)
        return b

    def resolve_bucket(self, name: str) -> Bucket | None:
        """The bucket of this name as it is now (uncached); ``None`` when there is none."""
        binding = self.bindings(name)
        if binding is not None:
            return Bucket(name, binding["repo"], binding["ref"], binding.get("created", 0.0), bool(binding.get("created_by_s3")))
        try:
            check_repo_name(name)
            info = self.plane.get_repo(name)
        except (NotFound, BadRequest):
            return None
        return Bucket(name, name, None, info.get("created", 0.0))

    def forget(self, name: str) -> None:
        """Drop a cached bucket answer (after creating or deleting the bucket)."""
        self._buckets.drop(name)

    # -- keys ---------------------------------------------------------------------------
    def split(self, b: Bucket, key: str, write: bool = True) -> tuple[str, str, bool]:
        """``(ref, path, is_dir_marker)`` of a key. A key no path can have is refused for
        writes (InvalidArgument) and simply absent for reads (NoSuchKey)."""
        if b.ref is not None:
            ref, rest = b.ref, key
        else:
            ref, sep, rest = key.partition("/")
            if not sep or not ref or not rest:
                if not write:
                    raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
                raise S3Error(
                    "InvalidArgument",
                    f"keys of bucket {b.name!r} are REF/PATH (a branch, tag or commit, then the path)",
                    400,
                    Key=key,
                )
        is_dir = rest.endswith("/")
        path = rest[:-1] if is_dir else rest
        try:
            check_path(path)
        except FabricError as exc:
            if not write:
                raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key) from None
            raise from_fabric(exc) from None
        return ref, path, is_dir

    def _is_branch(self, repo: str, ref: str) -> bool:
        names = self._branches.get(repo, lambda: {br["name"] for br in self.plane.list_branches(repo)})
        if ref in names:
            return True
        names = {br["name"] for br in self.plane.list_branches(repo)}
        self._branches.drop(repo)
        return ref in names

    def locate_write(self, who: Principal, b: Bucket, key: str) -> tuple[str, str, bool]:
        """``(branch, path, is_dir_marker)`` of a key ``who`` may write to."""
        ref, path, is_dir = self.split(b, key)
        require(who, b.repo, "write")
        if not self._is_branch(b.repo, ref):
            what = "a tag or commit" if self._resolves(b.repo, ref) else "not a branch"
            raise S3Error(
                "AccessDenied",
                f"{ref!r} in repository {b.repo!r} is {what}: S3 writes go only to branches "
                f"(create one with `fabric branch create {b.repo} NAME --from {ref}`)",
                403,
            )
        return ref, path, is_dir

    def _resolves(self, repo: str, ref: str) -> bool:
        try:
            self.plane.resolve_commit(repo, ref)
            return True
        except FabricError:
            return False

    def locate_read(self, who: Principal, b: Bucket, key: str) -> tuple[str, str, bool, Entry]:
        """``(ref, path, is_dir_marker, entry)`` of an existing key ``who`` may read."""
        ref, path, is_dir = self.split(b, key, write=False)
        require(who, b.repo, "read")
        entry = self._stat(b, ref, path, key)
        if not shown(entry) or slash_key(entry) != is_dir:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key)
        return ref, path, is_dir, entry

    def _stat(self, b: Bucket, ref: str, path: str, key: str) -> Entry:
        try:
            return self.plane.stat(b.repo, ref, path)
        except NotFound:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404, Key=key) from None
        except FabricError as exc:
            raise from_fabric(exc) from None
