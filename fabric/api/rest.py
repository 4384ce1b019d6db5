"""REST API v1 over any data plane (served by the hub and by every spoke).

Routes translate HTTP to :class:`~fabric.plane.dataplane.DataPlane` calls and
:mod:`fabric.errors` to statuses; every route checks the caller's role on the
repository it touches before calling the plane.
"""


import itertools
import struct
from email.utils import formatdate
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import anyio
import msgpack
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from fabric.auth.principal import ROLES, Principal
from fabric.errors import BadRequest, Corruption, FabricError, Forbidden, NotFound, RangeNotSatisfiable
from fabric.format.listing import Change
from fabric.format.model import Commit
from fabric.plane.dataplane import DataPlane
from fabric.api.body import BodyReader
from fabric.plane.wire import MSGPACK, STAGING_SEQ_HEADER, entry_json, hex_ids, unpack_changes

MAX_PACK_BYTES = 256 * 1024 * 1024
MAX_CHANGES_BYTES = 512 * 1024 * 1024
FRAMES_PIECE = 1024 * 1024


# -- models -----------------------------------------------------------------
class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class RepoCreate(BaseModel):
    name: str = Field(description="3-63 of a-z, 0-9 and '-' (also the S3 bucket name)")
    default_branch: str = "main"


class Repo(BaseModel):
    name: str
    default_branch: str
    created: float


class RefInfo(BaseModel):
    name: str
    commit_id: str


#: ``X-Fabric-Durability`` on a write: how stored it must be before the reply (DESIGN §3).
Durability = Annotated[
    Literal["hub", "local"] | None,
    Header(description="hub: stored at the hub before the reply; local: a spoke may keep it on its own disk and push it later"),
]


class BranchCreate(BaseModel):
    name: str
    source: str = Field(description="branch, tag or commit to start from")


class TagCreate(BaseModel):
    name: str
    ref: str


class ResetRequest(BaseModel):
    ref: str


class CommitCreate(BaseModel):
    message: str
    metadata: dict[str, str] = {}
    author: str | None = None
    expected_head: str | None = Field(None, description="fail with 409 unless the branch head is this commit")
    allow_empty: bool = False


class CommitInfo(BaseModel):
    id: str
    tree: str
    parents: list[str]
    author: str
    message: str
    time: float
    meta: dict[str, str]


class CommitPage(BaseModel):
    commits: list[CommitInfo]
    next_after: str | None


class ChangeInfo(BaseModel):
    path: str
    type: Literal["added", "removed", "changed"]
    size: int | None = None


class ChangePage(BaseModel):
    changes: list[ChangeInfo]
    next_after: str | None


class MergeRequest(BaseModel):
    source: str
    strategy: Literal["ours", "theirs"] | None = None
    message: str | None = None
    author: str | None = None


class RevertRequest(BaseModel):
    commit: str
    parent: int = 1
    author: str | None = None


class ObjectStat(BaseModel):
    path: str
    type: Literal["file", "dir", "symlink"]
    size: int
    mode: str
    mtime: float
    etag: str | None = None
    target: str | None = None
    uid: int | None = None
    gid: int | None = None
    metadata: dict[str, str] | None = None


class ObjectPage(BaseModel):
    entries: list[ObjectStat]
    prefixes: list[str]
    next_after: str | None


class PathList(BaseModel):
    paths: list[str] = Field(max_length=10000)


class DeleteResult(BaseModel):
    deleted: list[str]
    errors: list[dict[str, str]]


class CopyRequest(BaseModel):
    src_ref: str
    src_path: str
    dest_path: str


class ChunkIds(BaseModel):
    ids: list[str]


class ObjectIds(BaseModel):
    ids: list[str] = Field(max_length=1024)


class MissingChunks(BaseModel):
    missing: list[str]


class PackResult(BaseModel):
    chunks: int
    new: int


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 416, 503)
}


# -- helpers ----------------------------------------------------------------
def _commit(c: Commit) -> CommitInfo:
    return CommitInfo(**c.describe())


def _change(c: Change) -> ChangeInfo:
    return ChangeInfo(**c.describe())


def _page(items: Iterator[Any], after: str | None, limit: int, key: Callable[[Any], str]) -> tuple[list[Any], str | None]:
    out: list[Any] = []
    for item in items:
        if after and key(item) <= after:
            continue
        if len(out) == limit:
            return out, key(out[-1])
        out.append(item)
    return out, None


def parse_range(header: str, size: int) -> tuple[int, int]:
    """``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` -> ``(offset, length)``."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        raise RangeNotSatisfiable(f"unsupported Range {header!r}: use one bytes=START-END range")
    start_s, _, end_s = spec.strip().partition("-")
    try:
        if start_s == "":
            n = int(end_s)
            if n <= 0:
                raise ValueError
            start, end = max(0, size - n), size - 1
        else:
            start = int(start_s)
            end = int(end_s) if end_s else size - 1
    except ValueError:
        raise RangeNotSatisfiable(f"malformed Range {header!r}") from None
    end = min(end, size - 1)
    if start < 0 or start >= size or end < start:
        raise RangeNotSatisfiable(f"Range {header!r} is outside the object's {size} bytes", size=size)
    return start, end - start + 1


PlaneGetter = Callable[[], DataPlane]
Authenticator = Callable[[Request], Principal]


def build_router(get_plane: PlaneGetter, authenticate: Authenticator) -> APIRouter:
    """The ``/api/v1`` routes over the plane returned by ``get_plane``."""
    router = APIRouter(prefix="/api/v1", responses=ERRORS)
    Caller = Annotated[Principal, Depends(authenticate)]

    def plane() -> DataPlane:
        return get_plane()

    # -- repositories ----------------------------------------------------------
    @router.get("/repos", response_model=list[Repo], tags=["repositories"])
    def list_repos(who: Caller) -> list[dict]:
        return [r for r in plane().list_repos() if who.can(r["name"], "read")]

    @router.post("/repos", response_model=Repo, status_code=201, tags=["repositories"])
    def create_repo(body: RepoCreate, who: Caller) -> dict:
        who.require_admin()
        return plane().create_repo(body.name, body.default_branch)

    @router.get("/repos/{repo}", response_model=Repo, tags=["repositories"])
    def get_repo(repo: str, who: Caller) -> dict:
        who.require(repo, "read")
        return plane().get_repo(repo)

    @router.delete("/repos/{repo}", status_code=204, tags=["repositories"])
    def delete_repo(repo: str, who: Caller) -> Response:
        who.require(repo, "admin")
        plane().delete_repo(repo)
        return Response(status_code=204)

    # -- branches ----------------------------------------------------------------
    @router.get("/repos/{repo}/branches", response_model=list[RefInfo], tags=["branches"])
    def list_branches(repo: str, who: Caller) -> list[dict]:
        who.require(repo, "read")
        return plane().list_branches(repo)

    @router.post("/repos/{repo}/branches", response_model=RefInfo, status_code=201, tags=["branches"])
    def create_branch(repo: str, body: BranchCreate, who: Caller) -> dict:
        who.require(repo, "write")
        return plane().create_branch(repo, body.name, body.source)

    @router.get("/repos/{repo}/branches/{branch}", response_model=RefInfo, tags=["branches"])
    def get_branch(repo: str, branch: str, who: Caller) -> dict:
        who.require(repo, "read")
        for b in plane().list_branches(repo):
            if b["name"] == branch:
                return b
        raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")

    @router.delete("/repos/{repo}/branches/{branch}", status_code=204, tags=["branches"])
    def delete_branch(repo: str, branch: str, who: Caller) -> Response:
        who.require(repo, "write")
        plane().delete_branch(repo, branch)
        return Response(status_code=204)

    @router.post("/repos/{repo}/branches/{branch}/reset", response_model=RefInfo, tags=["branches"])
    def reset_branch(repo: str, branch: str, body: ResetRequest, who: Caller) -> dict:
        who.require(repo, "write")
        return plane().reset_branch(repo, branch, body.ref)

    @router.post("/repos/{repo}/branches/{branch}/revert", response_model=CommitInfo, status_code=201, tags=["branches"])
    def revert(repo: str, branch: str, body: RevertRequest, who: Caller) -> CommitInfo:
        who.require(repo, "write")
        return _commit(plane().revert(repo, branch, body.commit, body.parent, body.author or who.name))

    @router.post("/repos/{repo}/branches/{branch}/merge", response_model=CommitInfo, status_code=201, tags=["branches"])
    def merge(repo: str, branch: str, body: MergeRequest, who: Caller) -> CommitInfo:
        who.require(repo, "write")
        return _commit(plane().merge(repo, body.source, branch, body.strategy, body.message, body.author or who.name))

    # -- commits -----------------------------------------------------------------
    @router.post("/repos/{repo}/branches/{branch}/commits", response_model=CommitInfo, status_code=201, tags=["commits"])
    def commit(repo: str, branch: str, body: CommitCreate, who: Caller) -> CommitInfo:
        who.require(repo, "write")
        c = plane().commit(
            repo, branch, body.message, body.author or who.name, body.metadata, body.expected_head, body.allow_empty
        )
        return _commit(c)

    @router.post(
        "/repos/{repo}/branches/{branch}/commit-changes",
        response_model=CommitInfo,
        status_code=201,
        tags=["commits"],
        openapi_extra={"requestBody": {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}, "required": True}},
    )
    async def commit_changes(repo: str, branch: str, request: Request, who: Caller) -> CommitInfo:
        """Commit explicit entries (msgpack ``{changes, message, author, meta, expected_head}``)
        whose chunks are already stored; staging is left alone."""
        who.require(repo, "write")
        changes, fields = unpack_changes(await _body(request, MAX_CHANGES_BYTES))
        if not isinstance(fields.get("message"), str):
            raise BadRequest("commit-changes needs a message")

        def run() -> Commit:
            return plane().commit_changes(
                repo,
                branch,
                changes,
                fields["message"],
                fields.get("author") or who.name,
                fields.get("meta") or {},
                fields.get("expected_head"),
                bool(fields.get("allow_empty", False)),
            )

        return _commit(await anyio.to_thread.run_sync(run))

    @router.get("/repos/{repo}/commits/{commit_id}", response_model=CommitInfo, tags=["commits"])
    def get_commit(repo: str, commit_id: str, who: Caller) -> CommitInfo:
        who.require(repo, "read")
        p = plane()
        return _commit(p.get_commit(repo, p.resolve_commit(repo, commit_id)))

    @router.get("/repos/{repo}/refs/{ref}/log", response_model=CommitPage, tags=["commits"])
    def log(
        repo: str,
        ref: str,
        who: Caller,
        path: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        after: str | None = None,
    ) -> CommitPage:
        who.require(repo, "read")
        commits = plane().log(repo, ref, path, limit + 1, after)
        more = len(commits) > limit
        commits = commits[:limit]
        return CommitPage(commits=[_commit(c) for c in commits], next_after=commits[-1].id if more else None)

    @router.get("/repos/{repo}/refs/{left}/diff/{right}", response_model=ChangePage, tags=["commits"])
    def diff(
        repo: str,
        left: str,
        right: str,
        who: Caller,
        prefix: str = "",
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    ) -> ChangePage:
        who.require(repo, "read")
        page, nxt = _page(plane().diff(repo, left, right, prefix), after, limit, lambda c: c.path)
        return ChangePage(changes=[_change(c) for c in page], next_after=nxt)

    @router.get("/repos/{repo}/branches/{branch}/changes", response_model=ChangePage, tags=["branches"])
    def uncommitted(
        repo: str,
        branch: str,
        who: Caller,
        prefix: str = "",
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    ) -> ChangePage:
        who.require(repo, "read")
        page, nxt = _page(plane().uncommitted(repo, branch, prefix), after, limit, lambda c: c.path)
        return ChangePage(changes=[_change(c) for c in page], next_after=nxt)

    @router.delete("/repos/{repo}/branches/{branch}/changes", status_code=204, tags=["branches"])
    def discard(repo: str, branch: str, who: Caller) -> Response:
        who.require(repo, "write")
        plane().discard(repo, branch)
        return Response(status_code=204)

    # -- tags --------------------------------------------------------------------
    @router.get("/repos/{repo}/tags", response_model=list[RefInfo], tags=["tags"])
    def list_tags(repo: str, who: Caller) -> list[dict]:
        who.require(repo, "read")
        return plane().list_tags(repo)

    @router.post("/repos/{repo}/tags", response_model=RefInfo, status_code=201, tags=["tags"])
    def create_tag(repo: str, body: TagCreate, who: Caller) -> dict:
        who.require(repo, "write")
        return plane().create_tag(repo, body.name, body.ref)

    @router.delete("/repos/{repo}/tags/{tag}", status_code=204, tags=["tags"])
    def delete_tag(repo: str, tag: str, who: Caller) -> Response:
        who.require(repo, "write")
        plane().delete_tag(repo, tag)
        return Response(status_code=204)

    # -- objects -----------------------------------------------------------------
    @router.get("/repos/{repo}/refs/{ref}/stat", response_model=ObjectStat, tags=["objects"])
    def stat(repo: str, ref: str, path: str, who: Caller) -> dict:
        who.require(repo, "read")
        return entry_json(path, plane().stat(repo, ref, path))

    @router.get(
        "/repos/{repo}/refs/{ref}/entry",
        tags=["objects"],
        response_class=Response,
        responses={200: {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}}},
    )
    def entry(repo: str, ref: str, path: str, who: Caller) -> Response:
        """The entry at ``path`` with its whole chunk list (msgpack), for chunk-level readers."""
        who.require(repo, "read")
        wire = plane().stat_chunks(repo, ref, path).to_wire()
        return Response(msgpack.packb(wire, use_bin_type=True), media_type=MSGPACK)

    @router.get("/repos/{repo}/refs/{ref}/list", response_model=ObjectPage, tags=["objects"])
    def list_objects(
        repo: str,
        ref: str,
        who: Caller,
        request: Request,
        prefix: str = "",
        delimiter: str = "",
        after: str = "",
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    ) -> Any:
        """One page of a listing. ``Accept: application/msgpack`` returns ``{entries: [[path, entry]],
        prefixes, next_after}`` with whole entries (chunk lists, exact times) for chunk-level readers."""
        who.require(repo, "read")
        page = plane().list(repo, ref, prefix, delimiter, after, limit)
        if MSGPACK in request.headers.get("accept", ""):
            body = {"entries": [[p, e.to_wire()] for p, e in page.entries], "prefixes": page.prefixes, "next_after": page.next_after}
            return Response(msgpack.packb(body, use_bin_type=True), media_type=MSGPACK)
        return ObjectPage(
            entries=[ObjectStat(**entry_json(p, e)) for p, e in page.entries],
            prefixes=page.prefixes,
            next_after=page.next_after,
        )

    @router.api_route(
        "/repos/{repo}/refs/{ref}/objects",
        methods=["GET", "HEAD"],
        tags=["objects"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/octet-stream": {}}}, 206: {"content": {"application/octet-stream": {}}}},
    )
    def get_object(
        repo: str, ref: str, path: str, request: Request, who: Caller, range: Annotated[str | None, Header()] = None
    ) -> Response:
        """Download a file; honours a single ``Range: bytes=...``. ``X-Fabric-Commit`` names the commit."""
        who.require(repo, "read")
        p = plane()
        commit_id = p.resolve_commit(repo, ref)
        entry = p.stat(repo, ref, path)
        if entry.kind != "file":
            raise BadRequest(f"{path!r} is a {entry.kind}, not a file")
        headers = {
            "ETag": f'"{entry.md5}"',
            "Accept-Ranges": "bytes",
            "X-Fabric-Commit": commit_id,
            "X-Fabric-Stale": "true" if p.is_stale(repo, ref) else "false",
            "Last-Modified": _http_date(entry.mtime_ns),
        }
        offset, length, status = 0, entry.size, 200
        if range is not None:
            offset, length = parse_range(range, entry.size)
            status = 206
            headers["Content-Range"] = f"bytes {offset}-{offset + length - 1}/{entry.size}"
        headers["Content-Length"] = str(length)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        body = p.open_file(repo, ref, path, entry, offset, length) if length else iter(())
        return StreamingResponse(body, status_code=status, headers=headers, media_type="application/octet-stream")

    @router.put(
        "/repos/{repo}/branches/{branch}/objects",
        response_model=ObjectStat,
        status_code=201,
        tags=["objects"],
        openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
    )
    async def put_object(
        repo: str,
        branch: str,
        path: str,
        request: Request,
        who: Caller,
        x_fabric_mode: Annotated[str | None, Header(description="octal permission bits, e.g. 644")] = None,
        x_fabric_mtime_ns: Annotated[int | None, Header(ge=-(2**63), le=2**63 - 1)] = None,
        x_fabric_durability: Durability = None,
    ) -> dict:
        """Upload a file to a branch (streamed; uncommitted until a commit).
        ``X-Fabric-Meta-*`` headers become user metadata."""
        who.require(repo, "write")
        try:
            mode = int(x_fabric_mode, 8) if x_fabric_mode else 0o644
            if not 0 <= mode <= 0o7777:
                raise ValueError
        except ValueError:
            raise BadRequest(f"X-Fabric-Mode {x_fabric_mode!r} is not an octal mode (0 to 7777, e.g. 644)") from None
        meta = {k[len("x-fabric-meta-") :]: v for k, v in request.headers.items() if k.startswith("x-fabric-meta-")}
        reader = BodyReader(request)

        def run() -> Any:
            return plane().put_object(repo, branch, path, reader, mode, x_fabric_mtime_ns, meta, x_fabric_durability)

        entry = await anyio.to_thread.run_sync(run)
        return entry_json(path, entry)

    @router.delete("/repos/{repo}/branches/{branch}/objects", status_code=204, tags=["objects"])
    def delete_object(repo: str, branch: str, path: str, who: Caller, x_fabric_durability: Durability = None) -> Response:
        who.require(repo, "write")
        plane().delete_object(repo, branch, path, x_fabric_durability)
        return Response(status_code=204)

    @router.post("/repos/{repo}/branches/{branch}/objects/delete", response_model=DeleteResult, tags=["objects"])
    def delete_objects(repo: str, branch: str, body: PathList, who: Caller, x_fabric_durability: Durability = None) -> DeleteResult:
        who.require(repo, "write")
        deleted, errors = [], []
        for path in body.paths:
            try:
                plane().delete_object(repo, branch, path, x_fabric_durability)
                deleted.append(path)
            except FabricError as exc:
                errors.append({"path": path, "code": exc.code, "message": exc.message})
        return DeleteResult(deleted=deleted, errors=errors)

    @router.post("/repos/{repo}/branches/{branch}/objects/copy", response_model=ObjectStat, status_code=201, tags=["objects"])
    def copy_object(repo: str, branch: str, body: CopyRequest, who: Caller) -> dict:
        """Copy a file from any ref of the repository to a path on the branch (no data is copied)."""
        who.require(repo, "write")
        p = plane()
        entry = p.stat(repo, body.src_ref, body.src_path)
        p.stage(repo, branch, {body.dest_path: entry})
        return entry_json(body.dest_path, entry)

    @router.post(
        "/repos/{repo}/branches/{branch}/entries",
        status_code=204,
        tags=["objects"],
        openapi_extra={"requestBody": {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}, "required": True}},
    )
    async def stage_entries(repo: str, branch: str, request: Request, who: Caller, x_fabric_durability: Durability = None) -> Response:
        """Stage entries (msgpack ``{changes: {path: entry|null}}``) whose chunks are stored."""
        who.require(repo, "write")
        changes, _ = unpack_changes(await _body(request, MAX_CHANGES_BYTES))
        seq = await anyio.to_thread.run_sync(lambda: plane().stage(repo, branch, changes, x_fabric_durability))
        # The staging seq holding them (absent when a spoke queued them): lets a cache of the
        # branch's staging add its own write instead of fetching it back.
        return Response(status_code=204, headers={STAGING_SEQ_HEADER: str(seq)} if seq is not None else None)

    # -- chunk exchange ------------------------------------------------------------
    @router.post("/chunks/missing", response_model=MissingChunks, tags=["chunks"])
    def missing(body: ChunkIds, who: Caller, x_fabric_durability: Durability = None) -> MissingChunks:
        """Which of these chunk ids (hex) the server lacks (at the durability asked)."""
        _require_any(who, "write")
        return MissingChunks(missing=[c.hex() for c in plane().missing_chunks(hex_ids(body.ids), x_fabric_durability)])

    @router.post(
        "/chunks/packs",
        response_model=PackResult,
        tags=["chunks"],
        openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}, "required": True}},
    )
    async def upload_pack(request: Request, who: Caller, x_fabric_durability: Durability = None) -> PackResult:
        """Store a pack of frames; every frame is verified before anything is indexed."""
        _require_any(who, "write")
        data = await _body(request, MAX_PACK_BYTES)
        try:
            chunks, new = await anyio.to_thread.run_sync(lambda: plane().receive_pack(data, x_fabric_durability))
        except Corruption as exc:
            # The client sent bad bytes: its error (400), not the server's (500).
            raise BadRequest(f"pack refused, nothing from it was stored: {exc.message}") from exc
        return PackResult(chunks=chunks, new=new)

    @router.post(
        "/chunks/frames",
        tags=["chunks"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    def frames(body: ChunkIds, who: Caller) -> StreamingResponse:
        """Stream ``id(32) length(u32 LE) frame`` records for the given chunk ids.

        A chunk id is the BLAKE3 hash of its bytes: it is learnt only from metadata the
        caller may read (``/entry``) or from the bytes themselves, so it serves as the
        capability to fetch them; any read role is enough."""
        _require_any(who, "read")
        ids = hex_ids(body.ids)
        stream = iter(plane().frames(ids))
        # Planes may locate chunks lazily: pull the first record now, so an unknown id
        # is a 404 before the 200 is sent, not a connection dropped mid-stream.
        first = next(stream, None)

        def records() -> Iterator[bytes]:
            if first is None:
                return
            # Records go out in pieces of about 1 MiB: one thread hop and one write per
            # piece, not per 64 KiB chunk (that alone bounded a stream to ~100 MB/s).
            pending: list[bytes] = []
            size = 0
            for cid, frame in itertools.chain([first], stream):
                pending += (cid, struct.pack("<I", len(frame)), frame)
                size += 36 + len(frame)
                if size >= FRAMES_PIECE:
                    yield b"".join(pending)
                    pending, size = [], 0
            if pending:
                yield b"".join(pending)

        return StreamingResponse(records(), media_type="application/octet-stream")

    # -- metadata objects (for caches) ------------------------------------------------
    @router.post(
        "/objects/batch",
        tags=["chunks"],
        response_class=Response,
        responses={200: {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}}},
    )
    def objects_batch(body: ObjectIds, who: Caller) -> Response:
        """Stored bytes of metadata objects (msgpack map id -> bytes); unknown ids are left out.

        Objects are addressed by id across repositories, so this needs read access to
        every repository (a global admin, or a role on '*'): it is for spokes."""
        if not who.can("*", "read"):
            raise Forbidden(
                f"token {who.name!r} may not fetch metadata objects by id: that needs read access to all "
                "repositories (--repo '*'), as a spoke's token has"
            )
        return Response(msgpack.packb(plane().get_objects(body.ids), use_bin_type=True), media_type=MSGPACK)

    @router.get(
        "/repos/{repo}/branches/{branch}/staging",
        tags=["branches"],
        response_class=Response,
        responses={200: {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}}},
    )
    def staging(repo: str, branch: str, who: Caller, since: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0) -> Response:
        """A branch's head and staging area (msgpack ``{head, seq, entries}``), for spokes;
        ``since``: only rows written after that staging seq."""
        who.require(repo, "read")
        head, seq, entries = plane().staging_snapshot(repo, branch, since)
        body = {"head": head, "seq": seq, "entries": [[p, e] for p, e in entries]}
        return Response(msgpack.packb(body, use_bin_type=True), media_type=MSGPACK)

    # -- administration --------------------------------------------------------------
    @router.get("/stats", tags=["admin"])
    def stats(who: Caller) -> dict:
        _require_any(who, "read")
        return plane().stats()

    @router.post("/admin/fsck", tags=["admin"])
    def fsck(who: Caller, deep: bool = True) -> dict:
        who.require_admin()
        return plane().fsck(deep)

    @router.post("/admin/gc", tags=["admin"])
    def gc(who: Caller, grace: Annotated[float | None, Query(ge=0)] = None, dry_run: bool = False) -> dict:
        who.require_admin()
        return plane().gc(grace, dry_run)

    # -- S3 bucket bindings ------------------------------------------------------------
    @router.get("/buckets", response_model=list[BucketInfo], tags=["buckets"])
    def list_buckets(who: Caller) -> list[dict]:
        return [b for b in plane().list_buckets() if who.can(b["repo"], "read")]

    @router.get("/buckets/{name}", response_model=BucketInfo, tags=["buckets"])
    def get_bucket(name: str, who: Caller) -> dict:
        b = plane().get_bucket(name)
        who.require(b["repo"], "read")
        return b

    @router.post("/buckets", response_model=BucketInfo, status_code=201, tags=["buckets"])
    def create_bucket(body: BucketCreate, who: Caller) -> dict:
        """Bind an S3 bucket name to a branch or tag of a repository (plain keys over S3)."""
        who.require(body.repo, "admin")
        if body.created_by_s3:
            who.require_admin()
        return plane().create_bucket(body.name, body.repo, body.ref, body.created_by_s3)

    @router.delete("/buckets/{name}", status_code=204, tags=["buckets"])
    def delete_bucket(name: str, who: Caller) -> Response:
        """Remove a bucket binding; the repository stays."""
        who.require(plane().get_bucket(name)["repo"], "admin")
        plane().delete_bucket(name)
        return Response(status_code=204)

    return router


def _require_any(who: Principal, role: str) -> None:
    """Chunk exchange is not per repository: any repository role of this level will do."""
    if who.admin or any(ROLES[r] >= ROLES[role] for r in who.roles.values()):
        return
    raise Forbidden(f"token {who.name!r} has no {role} role on any repository")


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"request body of {declared} bytes is over the {limit}-byte limit")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise BadRequest(f"request body is over the {limit}-byte limit")
        parts.append(part)
    return b"".join(parts)


def _http_date(mtime_ns: int) -> str:
    return formatdate(mtime_ns / 1e9, usegmt=True)


# -- S3 bucket bindings (models used by build_router) ---------------------------------------
class BucketCreate(BaseModel):
    name: str = Field(description="bucket name: 3-63 of a-z, 0-9 and '-'")
    repo: str
    ref: str = Field(description="a branch or tag of the repository")
    created_by_s3: bool = False


class BucketInfo(BaseModel):
    name: str
    repo: str
    ref: str
    created: float
    created_by_s3: bool
