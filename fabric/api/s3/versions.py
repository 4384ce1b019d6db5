"""Object versions: ListObjectVersions, reads and deletes of one version, the versioning configuration.

fabric is a versioned store, so versioning is always on. The versions of a key
are its states across the history of the ref its bucket names (the bound ref,
or the first key component of a repository bucket): one version per commit of
the ref's first-parent chain that changed the key (its state in that commit; a
deletion is a delete marker), newest first, and on a branch one more on top for
its uncommitted (staged) state, when that differs from the head.

Version ids:

- a committed state: the id of the commit that introduced it (64 hex digits);
- the staged state of a branch: ``staged-`` and 32 hex digits, a hash of the
  head it is staged over, the key and the entry (or its deletion). Staging is
  folded into the next commit, whose parent is that head, so the id stays
  readable after the commit (:data:`STAGED_SEARCH` commits back), while the
  listing then shows the commit's id.

A listing walks the ref newest to oldest: the staged changes, then each commit
diffed with its first parent (only the ranges that differ are read) under the
request's prefix, and stops as soon as ``max-keys`` entries are found (one more
is looked for to tell whether the listing is truncated). A page therefore costs
about the commits it covers, not the whole history; a prefix that matches little
walks every commit once. Versions are listed in that walk order (per key newest
first, but keys of several commits interleave, not in one key order), and
``NextKeyMarker`` / ``NextVersionIdMarker`` name the last entry: the next page
resumes right after it in the walk.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fabric.api.headers import http_date
from fabric.api.s3 import xml as X
from fabric.api.s3.auth import require
from fabric.api.s3.entrymeta import slash_key
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.listing import listing_options
from fabric.api.s3.namespace import Bucket, Namespace
from fabric.api.s3.request import Ctx, iso8601, owner_xml, xml_response
from fabric.api.s3.specials import shown
from fabric.api.s3.transport import Response
from fabric.auth.principal import Principal
from fabric.errors import FabricError, NotFound
from fabric.format.listing import Change
from fabric.format.model import Entry
from fabric.format.paths import check_prefix
from fabric.plane.dataplane import DataPlane

STAGED = "staged-"
#: How many commits back a staged version id is looked for once it has been committed.
STAGED_SEARCH = 64
_COMMIT_ID = re.compile(r"[0-9a-f]{64}")
_STAGED_ID = re.compile(r"staged-[0-9a-f]{32}")


@dataclass(frozen=True)
class Version:
    """One version of a key: ``entry`` is None for a delete marker; its bytes are read at ``ref``
    (a commit id, or the branch for a staged state)."""

    vid: str
    path: str
    entry: Entry | None
    time: float
    ref: str


@dataclass(frozen=True)
class VersionDelete:
    """What deleting one version does: ``delete_key`` deletes the key on the branch (it was the
    current version); otherwise nothing changes (``error`` says why when it is refused)."""

    vid: str
    delete_key: bool = False
    marker: bool = False
    older: bool = False
    error: S3Error | None = None


# -- version ids and states --------------------------------------------------------------
def check_version_id(vid: str) -> None:
    """400 InvalidArgument for a string that cannot be a version id (``null`` can, and names none)."""
    if vid != "null" and not _COMMIT_ID.fullmatch(vid) and not _STAGED_ID.fullmatch(vid):
        raise S3Error("InvalidArgument", "Invalid version id specified", 400, ArgumentName="versionId", ArgumentValue=vid)


def _ident(e: Entry | None) -> bytes:
    """What tells two states of a key apart (the chunk list aside: remote planes may leave it out)."""
    return b"-" if e is None else e.with_(chunks=(), chunklist=None).encode()


def _same(a: Entry | None, b: Entry | None) -> bool:
    return _ident(a) == _ident(b)


def staged_id(head: str, keypath: str, entry: Entry | None) -> str:
    """The version id of a staged state of ``keypath`` (the path, ``/`` after a directory marker) over ``head``."""
    h = hashlib.blake2b(digest_size=16)
    for part in (head.encode(), keypath.encode(), _ident(entry)):
        h.update(len(part).to_bytes(8, "big") + part)
    return STAGED + h.hexdigest()


def _keypath(path: str, e: Entry | None) -> str | None:
    """The key (within its ref) an entry is listed under; None for what S3 does not show."""
    if e is None or not shown(e):
        return None
    return path + "/" if slash_key(e) else path


def key_state(plane: DataPlane, repo: str, ref: str, path: str, is_dir: bool) -> Entry | None:
    """The entry a key names at ``ref``; None when the key does not exist there."""
    try:
        e = plane.stat(repo, ref, path)
    except NotFound:
        return None
    return e if shown(e) and slash_key(e) == is_dir else None


def find_version(plane: DataPlane, repo: str, ref: str, path: str, is_dir: bool, vid: str) -> Version | None:
    """The version ``vid`` of a key of ``ref``; None when it is not one.

    A commit id names the key's state in that commit if the commit changed it
    against its first parent (any commit of the repository: reachability from
    ``ref`` is not checked). A staged id is looked for in the branch's staging,
    then in the :data:`STAGED_SEARCH` newest commits (one that folded it in)."""
    keypath = path + "/" if is_dir else path
    if vid.startswith(STAGED):
        head = plane.resolve_commit(repo, ref)
        now = key_state(plane, repo, ref, path, is_dir)
        committed = key_state(plane, repo, head, path, is_dir)
        if not _same(now, committed) and staged_id(head, keypath, now) == vid:
            return Version(vid, path, now, now.mtime_ns / 1e9 if now else time.time(), ref)
        cid, state = head, committed
        for _ in range(STAGED_SEARCH):
            c = plane.get_commit(repo, cid)
            if not c.parents:
                return None
            before = key_state(plane, repo, c.parents[0], path, is_dir)
            if not _same(state, before) and staged_id(c.parents[0], keypath, state) == vid:
                return Version(vid, path, state, state.mtime_ns / 1e9 if state else c.time, cid)
            cid, state = c.parents[0], before
        return None
    if not _COMMIT_ID.fullmatch(vid) or plane.resolve_commit(repo, vid) != vid:
        return None
    c = plane.get_commit(repo, vid)
    at = key_state(plane, repo, vid, path, is_dir)
    before = key_state(plane, repo, c.parents[0], path, is_dir) if c.parents else None
    if _same(at, before):
        return None
    return Version(vid, path, at, at.mtime_ns / 1e9 if at else c.time, vid)


def _no_such_version(key: str, vid: str) -> S3Error:
    return S3Error("NoSuchVersion", "The specified version does not exist.", 404, Key=key, VersionId=vid)


def read_version(
    plane: DataPlane, namespace: Namespace, who: Principal, b: Bucket, key: str, vid: str
) -> tuple[str, str, Entry]:
    """``(ref, path, entry)`` of the object version GetObject/HeadObject ``versionId`` names (read
    it at that ref): 400 InvalidArgument for a malformed id, 404 NoSuchVersion for none of this
    key, 405 MethodNotAllowed for a delete marker."""
    check_version_id(vid)
    ref, path, is_dir = namespace.split(b, key, write=False)
    require(who, b.repo, "read")
    try:
        v = find_version(plane, b.repo, ref, path, is_dir, vid)
    except NotFound:
        v = None
    except FabricError as exc:
        raise from_fabric(exc) from None
    if v is None:
        raise _no_such_version(key, vid)
    if v.entry is None:
        err = S3Error(
            "MethodNotAllowed", "The specified method is not allowed against this resource.", 405,
            Method="GET", ResourceType="DeleteMarker",
        )
        err.headers.update(
            {"x-amz-delete-marker": "true", "x-amz-version-id": vid, "Last-Modified": http_date(v.time), "Allow": "DELETE"}
        )
        raise err
    return v.ref, v.path, v.entry


def plan_deletes(
    plane: DataPlane, namespace: Namespace, who: Principal, b: Bucket, items: Sequence[tuple[str, str]]
) -> list[VersionDelete]:
    """What deleting each ``(key, version id)`` does, decided on the state before any of them.

    The current version deletes the key on the branch. A delete marker, an id that
    is no version of the key (as AWS: success) and any version of a key that is
    gone (or deleted by this same request) change nothing and succeed: history is
    immutable, and the bucket's current view is what empties. An older version of
    a key that still exists is refused (NotImplemented); a malformed id is
    InvalidArgument, a key the caller may not write AccessDenied."""
    plans: list[VersionDelete] = []
    for key, vid in items:
        try:
            check_version_id(vid)
            ref, path, is_dir = namespace.locate_write(who, b, key)
            plans.append(_classify(plane, b.repo, ref, path, is_dir, vid))
        except S3Error as err:
            plans.append(VersionDelete(vid, error=err))
        except FabricError as exc:
            plans.append(VersionDelete(vid, error=from_fabric(exc)))
    deleted = {key for (key, _), p in zip(items, plans, strict=True) if p.delete_key}
    return [
        VersionDelete(p.vid, error=None if key in deleted else _older()) if p.older else p
        for (key, _), p in zip(items, plans, strict=True)
    ]


def version_headers(plan: VersionDelete) -> dict[str, str]:
    """DeleteObject's answer headers for a version delete."""
    h = {"x-amz-version-id": plan.vid}
    if plan.marker:
        h["x-amz-delete-marker"] = "true"
    return h


def deleted_xml(plan: VersionDelete) -> str:
    """What a ``Deleted`` element of DeleteObjects says about a version delete."""
    out = X.el("VersionId", plan.vid)
    if plan.marker:
        out += "<DeleteMarker>true</DeleteMarker>" + X.el("DeleteMarkerVersionId", plan.vid)
    return out


def _older() -> S3Error:
    return S3Error(
        "NotImplemented",
        "fabric keeps a branch's history: only the current version of a key can be deleted (it deletes the key on "
        "the branch); once the key is deleted, deleting its older versions is accepted and changes nothing",
        501,
    )


def _classify(plane: DataPlane, repo: str, ref: str, path: str, is_dir: bool, vid: str) -> VersionDelete:
    now = key_state(plane, repo, ref, path, is_dir)
    try:
        v = find_version(plane, repo, ref, path, is_dir, vid)
    except NotFound:
        v = None
    if v is None:
        return VersionDelete(vid)
    if v.entry is None:
        return VersionDelete(vid, marker=True)
    if now is None:
        return VersionDelete(vid)
    if _same(now, v.entry):
        return VersionDelete(vid, delete_key=True)
    return VersionDelete(vid, older=True)


# -- the listing -------------------------------------------------------------------------
@dataclass(frozen=True)
class _Item:
    """One entry of a listing: a version (``entry`` None: a delete marker), or a common prefix."""

    key: str
    vid: str | None
    entry: Entry | None = None
    time: float = 0.0
    latest: bool = False
    is_prefix: bool = False


@dataclass(frozen=True)
class _Query:
    prefix: str
    delimiter: str
    key_marker: str
    vid_marker: str
    max_keys: int
    url: bool


def _query(ctx: Ctx) -> _Query:
    q = ctx.q
    url, max_keys = listing_options(q)
    key_marker, vid_marker = q.get("key-marker", ""), q.get("version-id-marker", "")
    if vid_marker:
        if not key_marker:
            raise S3Error("InvalidArgument", "A version-id marker cannot be specified without a key marker.", 400)
        check_version_id(vid_marker)
        if vid_marker == "null":
            raise S3Error("InvalidArgument", "Invalid version id specified", 400)
    return _Query(q.get("prefix", ""), q.get("delimiter", ""), key_marker, vid_marker, min(max_keys, 1000), url)


def _plane_prefix(sub: str) -> str:
    """A path prefix the plane accepts that covers every key starting with ``sub`` (keys are filtered after)."""
    p = sub[:-1] if sub.endswith("/") else sub  # key "d/" is the directory marker at path "d"
    while p:
        try:
            return check_prefix(p)
        except FabricError:
            cut = p.rstrip("/").rfind("/")
            p = p[: cut + 1] if cut >= 0 else ""
    return ""


class VersionHandlers:
    """ListObjectVersions and the bucket versioning configuration."""

    def __init__(self, plane: DataPlane, namespace: Namespace) -> None:
        self.plane = plane
        self.namespace = namespace

    # -- configuration --------------------------------------------------------------------
    def get_versioning(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "read")
        return xml_response(X.doc("VersioningConfiguration", X.el("Status", "Enabled")))

    def put_versioning(self, ctx: Ctx, b: Bucket) -> Response:
        """``Enabled`` (or no Status) is accepted and changes nothing; suspending is refused as
        AWS refuses it on an Object Lock bucket (409 InvalidBucketState)."""
        require(ctx.who, b.repo, "admin")
        status, mfa = X.parse_versioning(ctx.read_small(1 << 20))
        if mfa == "Enabled":
            raise S3Error("NotImplemented", "MFA delete is not supported: history is never deleted", 501)
        if status == "Suspended":
            raise S3Error(
                "InvalidBucketState",
                "fabric keeps every committed state of a branch: versioning is always Enabled and cannot be suspended",
                409,
            )
        return Response(200)

    # -- ListObjectVersions ---------------------------------------------------------------
    def list_versions(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "read")
        query = _query(ctx)
        try:
            items, next_pos = self._page(b, query)
        except FabricError as exc:
            raise from_fabric(exc) from None
        return xml_response(_listing_doc(ctx, b, query, items, next_pos))

    def _page(self, b: Bucket, query: _Query) -> tuple[list[_Item], tuple[str, str | None] | None]:
        """Up to ``max_keys`` items after the markers, and the position after the last one
        (key, version id) when more follow."""
        out: list[_Item] = []
        if query.max_keys == 0:
            return out, None
        emitted: set[str] = set()
        pos: tuple[str, str | None] = ("", None)
        for group in self._groups(b, query):
            fresh = []
            for item in group:
                cp = self._common_prefix(item.key, query)
                if cp is None:
                    fresh.append(item)
                elif cp not in emitted and not (query.key_marker and not query.vid_marker and cp <= query.key_marker):
                    emitted.add(cp)
                    fresh.append(_Item(cp, item.vid, is_prefix=True))
            # one change's items (a file replaced by a directory marker: two keys) are never split across pages
            if fresh and out and len(out) + len(fresh) > query.max_keys:
                return out, pos
            out += fresh
            pos = (group[-1].key, group[-1].vid)  # versions folded into a listed prefix are passed too
        return out, None

    @staticmethod
    def _common_prefix(key: str, query: _Query) -> str | None:
        if not query.delimiter:
            return None
        rest = key[len(query.prefix) :]
        cut = rest.find(query.delimiter)
        return None if cut < 0 else query.prefix + rest[: cut + len(query.delimiter)]

    def _groups(self, b: Bucket, query: _Query) -> Iterator[list[_Item]]:
        """Listing items in walk order, grouped by the change that made them; those after the markers."""
        branches = {br["name"] for br in self.plane.list_branches(b.repo)}
        if b.ref is not None:
            yield from self._ref_groups(b.repo, b.ref, "", b.ref in branches, query)
            return
        prefix = query.prefix
        if "/" in prefix:
            ref = prefix.partition("/")[0]
            yield from self._ref_groups(b.repo, ref, ref + "/", ref in branches, query)
            return
        refs = sorted(branches | {t["name"] for t in self.plane.list_tags(b.repo)}, key=lambda n: n + "/")
        marker = query.key_marker
        for ref in refs:
            head = ref + "/"
            if not head.startswith(prefix) or (marker and head <= marker and not marker.startswith(head)):
                continue
            if query.delimiter and query.delimiter in head[len(prefix) :]:
                cut = head[len(prefix) :].find(query.delimiter)
                cp = prefix + head[len(prefix) : len(prefix) + cut + len(query.delimiter)]
                if not (marker and cp <= marker):
                    yield [_Item(cp, None, is_prefix=True)]
                continue
            yield from self._ref_groups(b.repo, ref, head, ref in branches, query)

    def _ref_groups(self, repo: str, ref: str, head: str, is_branch: bool, query: _Query) -> Iterator[list[_Item]]:
        """The versions of one ref's keys (``head`` + path), grouped by change, after the markers."""
        start: tuple[str, str] | None = None
        by_position = bool(query.vid_marker) and query.key_marker.startswith(head)
        if by_position:
            path = query.key_marker[len(head) :]
            start = (query.vid_marker, path[:-1] if path.endswith("/") else path)
            if not start[0].startswith(STAGED):
                try:
                    known = self.plane.resolve_commit(repo, start[0]) == start[0]
                except NotFound:
                    known = False
                if not known:
                    raise S3Error("InvalidArgument", "Invalid version id specified", 400)
        elif query.vid_marker and query.key_marker > head:
            return  # positions are past this ref
        sub = query.prefix[len(head) :] if query.prefix.startswith(head) else ""
        seen: set[str] = set()
        try:
            for changes in self._walk(repo, ref, is_branch, _plane_prefix(sub), start):
                group = []
                for keypath, entry, vid, when in changes:
                    key = head + keypath
                    if not key.startswith(query.prefix):
                        continue
                    if query.key_marker and not by_position and key <= query.key_marker:
                        continue
                    if key in seen:
                        latest = False
                    else:
                        seen.add(key)
                        latest = start is None or self._is_current(repo, ref, keypath, entry)
                    group.append(_Item(key, vid, entry, when, latest))
                if group:
                    yield group
        except NotFound:
            if not head:
                raise
            return  # a REF/ prefix naming no ref lists nothing

    def _is_current(self, repo: str, ref: str, keypath: str, entry: Entry | None) -> bool:
        """On a resumed page, whether a key's newest version on this page is its current state
        (compared with the key now: a state restored exactly by a revert may count twice)."""
        is_dir = keypath.endswith("/")
        return _same(key_state(self.plane, repo, ref, keypath[:-1] if is_dir else keypath, is_dir), entry)

    def _walk(
        self, repo: str, ref: str, is_branch: bool, prefix: str, start: tuple[str, str] | None
    ) -> Iterator[list[tuple[str, Entry | None, str, float]]]:
        """Per changed path, newest first, ``[(keypath, entry or None, version id, time)]``: the
        staged changes, then each commit of the first-parent chain against its first parent.
        ``start`` = (version id, path) resumes after that path of that step."""
        head = self.plane.resolve_commit(repo, ref)
        if start is None or start[0].startswith(STAGED):
            if is_branch:
                for ch in self.plane.uncommitted(repo, ref, prefix, start[1] if start else ""):
                    now = time.time()
                    yield [
                        (k, e, staged_id(head, k, e), e.mtime_ns / 1e9 if e else now)
                        for k, e in _key_changes(ch.path, *self._sides(repo, head, ref, ch))
                    ]
            cid, after = head, ""
        else:
            cid, after = start
        while cid:
            c = self.plane.get_commit(repo, cid)
            parent = c.parents[0] if c.parents else None
            changes = self.plane.diff(repo, parent, cid, prefix, after) if parent else self._root(repo, cid, prefix, after)
            for ch in changes:
                yield [
                    (k, e, cid, e.mtime_ns / 1e9 if e else c.time)
                    for k, e in _key_changes(ch.path, *self._sides(repo, parent, cid, ch))
                ]
            cid, after = parent, ""

    def _sides(self, repo: str, left: str | None, right: str, ch: Change) -> tuple[Entry | None, Entry | None]:
        """A change's two entries; remote planes leave them out, so they are read where missing."""
        old, new = ch.left, ch.right
        if old is None and ch.kind != "added" and left is not None:
            old = _stat(self.plane, repo, left, ch.path)
        if new is None and ch.kind != "removed":
            new = _stat(self.plane, repo, right, ch.path)
        return old, new

    def _root(self, repo: str, cid: str, prefix: str, after: str) -> Iterator[Change]:
        """A first commit's paths as additions (a repository's first commit is usually empty)."""
        while True:
            page = self.plane.list(repo, cid, prefix, "", after, 1000)
            for path, e in page.entries:
                yield Change(path, "added", None, e)
            if page.next_after is None:
                return
            after = page.next_after


def _stat(plane: DataPlane, repo: str, ref: str, path: str) -> Entry | None:
    try:
        return plane.stat(repo, ref, path)
    except NotFound:
        return None


def _key_changes(path: str, old: Entry | None, new: Entry | None) -> list[tuple[str, Entry | None]]:
    """The keys one path's change makes versions of, in key order: the new state's key, and a
    delete marker for the old state's key when it differs (a file replaced by a directory marker)."""
    was, now = _keypath(path, old), _keypath(path, new)
    out: list[tuple[str, Entry | None]] = []
    if now is not None and (was != now or not _same(old, new)):
        out.append((now, new))
    if was is not None and was != now:
        out.append((was, None))
    return sorted(out, key=lambda kv: kv[0])


def _listing_doc(ctx: Ctx, b: Bucket, query: _Query, items: list[_Item], next_pos: tuple[str, str | None] | None) -> bytes:
    def kt(key: str) -> str:
        return X.key_text(key, query.url)

    out = [
        X.el("Name", b.name),
        f"<Prefix>{kt(query.prefix)}</Prefix>",
        f"<KeyMarker>{kt(query.key_marker)}</KeyMarker>",
        X.el("VersionIdMarker", query.vid_marker),
    ]
    if next_pos is not None:
        out.append(f"<NextKeyMarker>{kt(next_pos[0])}</NextKeyMarker>")
        if next_pos[1] is not None:
            out.append(X.el("NextVersionIdMarker", next_pos[1]))
    out.append(X.el("MaxKeys", query.max_keys))
    if query.delimiter:
        out.append(f"<Delimiter>{kt(query.delimiter)}</Delimiter>")
    if query.url:
        out.append("<EncodingType>url</EncodingType>")
    out.append(X.el("IsTruncated", "false" if next_pos is None else "true"))
    owner = owner_xml(ctx)
    for it in items:
        if it.is_prefix:
            out.append(f"<CommonPrefixes><Prefix>{kt(it.key)}</Prefix></CommonPrefixes>")
            continue
        head = (
            f"<Key>{kt(it.key)}</Key>{X.el('VersionId', it.vid)}{X.el('IsLatest', 'true' if it.latest else 'false')}"
            f"<LastModified>{iso8601(it.time)}</LastModified>"
        )
        if it.entry is None:
            out.append(f"<DeleteMarker>{head}{owner}</DeleteMarker>")
        else:
            out.append(
                f"<Version>{head}{X.el('ETag', chr(34) + it.entry.md5 + chr(34))}{X.el('Size', it.entry.size)}"
                f"{owner}<StorageClass>STANDARD</StorageClass></Version>"
            )
    return X.doc("ListVersionsResult", "".join(out))
