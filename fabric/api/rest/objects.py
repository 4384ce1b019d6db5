"""REST routes of objects: stat, entries, listings, download (with ranges), upload,
delete, copy, and staging explicit entries."""

import json
from typing import Annotated, Any, Literal

import anyio
import msgpack
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from fabric.api.body import BodyReader
from fabric.api.headers import InvalidRange, http_date, parse_range
from fabric.api.routing import Authenticator, Durability, PlaneGetter, caller, changes_body
from fabric.errors import BadRequest, FabricError, RangeNotSatisfiable, Unavailable
from fabric.format.model import Entry
from fabric.format.paths import is_full_commit_id
from fabric.plane.dataplane import DataPlane
from fabric.plane.wire import MSGPACK, STAGE_SINCE_HEADER, STAGING_SEQ_HEADER, entry_json
from fabric.util.pieces import READ_WHOLE_MAX, in_pieces

#: A conditional stage (a replay): ``SEQ HEAD``, the branch's staging seq and head when first tried.
STAGE_SINCE_DOC = "Conditional stage: 'SEQ HEAD' (staging seq and head commit when the write was first tried)."


class ObjectStat(BaseModel):
    path: str
    type: Literal["file", "dir", "symlink", "fifo", "socket", "chardev", "blockdev"]
    size: int
    mode: str
    mtime: float
    #: ``mtime`` exactly, in nanoseconds (a float of seconds loses the last digits).
    mtime_ns: int | None = None
    etag: str | None = None
    target: str | None = None
    uid: int | None = None
    gid: int | None = None
    metadata: dict[str, str] | None = None
    #: The device number of a character or block device.
    rdev: int | None = None
    #: The hard-link group of a file with several names (the same value at each name).
    link: str | None = None
    #: The last change of the entry's metadata (seconds since the epoch).
    ctime: float | None = None
    ctime_ns: int | None = None


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


def _requested_range(header: str, size: int) -> tuple[int, int]:
    """``Range`` as the REST API answers it: ``(offset, length)``; a header that is not one
    valid bytes range is refused (416) like a range outside the file."""
    try:
        return parse_range(header, size)
    except InvalidRange as exc:
        raise RangeNotSatisfiable(str(exc)) from None


#: How often a GET looks again when the branch moved while it looked the file up.
SNAPSHOT_ATTEMPTS = 20


def _entry_at_one_commit(p: DataPlane, repo: str, ref: str, path: str) -> tuple[str, Entry]:
    """The commit ``ref`` names and the entry of ``path`` as read at that very commit
    (on a branch, with its uncommitted changes overlaid): the ref is resolved again after
    the lookup and the lookup repeated until it did not move in between. The bytes are then
    read from the entry itself, so ``X-Fabric-Commit`` names the commit they belong to."""
    for _ in range(SNAPSHOT_ATTEMPTS):
        commit_id = p.resolve_commit(repo, ref)
        entry = p.stat(repo, ref, path)
        if p.resolve_commit(repo, ref) == commit_id:
            return commit_id, entry
    raise Unavailable(f"{repo}@{ref} moved during each of {SNAPSHOT_ATTEMPTS} lookups of {path!r}; try again")


def add_object_routes(router: APIRouter, plane: PlaneGetter, authenticate: Authenticator) -> None:
    """Add the object routes to ``router``; ``plane()`` is the data plane to serve."""
    Caller = caller(authenticate)

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
        commit_id, entry = _entry_at_one_commit(p, repo, ref, path)
        if entry.kind != "file":
            raise BadRequest(f"{path!r} is a {entry.kind}, not a file")
        headers = {
            "ETag": f'"{entry.md5}"',
            "Accept-Ranges": "bytes",
            "X-Fabric-Commit": commit_id,
            "X-Fabric-Stale": "true" if p.is_stale(repo, ref) else "false",
            "Last-Modified": http_date(entry.mtime_ns / 1e9),
        }
        offset, length, status = 0, entry.size, 200
        if range is not None:
            offset, length = _requested_range(range, entry.size)
            status = 206
            headers["Content-Range"] = f"bytes {offset}-{offset + length - 1}/{entry.size}"
        headers["Content-Length"] = str(length)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        if length <= READ_WHOLE_MAX:  # read whole in this worker thread
            data = b"".join(p.open_file(repo, ref, path, entry, offset, length)) if length else b""
            return Response(data, status_code=status, headers=headers, media_type="application/octet-stream")
        body = in_pieces(p.open_file(repo, ref, path, entry, offset, length))  # a thread hop per MiB, not per chunk
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
    async def stage_entries(
        repo: str,
        branch: str,
        request: Request,
        who: Caller,
        x_fabric_durability: Durability = None,
        x_fabric_stage_since: Annotated[str | None, Header(description=STAGE_SINCE_DOC)] = None,
    ) -> Response:
        """Stage entries (msgpack ``{changes: {path: entry|null}}``) whose chunks are stored.

        With ``X-Fabric-Stage-Since: SEQ HEAD`` (a replay of a write that may have landed):
        paths written on the branch since staging seq SEQ and head HEAD are left out, and
        the answer is JSON ``{"seq": ..., "skipped": [paths]}``."""
        who.require(repo, "write")
        since = _stage_since(x_fabric_stage_since)
        async with changes_body(request) as (changes, _):
            if since is not None:
                conditional = getattr(plane(), "stage_unless_newer", None)
                if conditional is None:
                    raise BadRequest(f"{STAGE_SINCE_HEADER} is not supported by this server (only by a hub)")
                seq, skipped = await anyio.to_thread.run_sync(lambda: conditional(repo, branch, changes, *since))
                return Response(json.dumps({"seq": seq, "skipped": skipped}), media_type="application/json")
            seq = await anyio.to_thread.run_sync(lambda: plane().stage(repo, branch, changes, x_fabric_durability))
        # The staging seq holding them (absent when a spoke queued them): lets a cache of the
        # branch's staging add its own write instead of fetching it back.
        return Response(status_code=204, headers={STAGING_SEQ_HEADER: str(seq)} if seq is not None else None)


def _stage_since(value: str | None) -> tuple[int, str] | None:
    """Parse ``X-Fabric-Stage-Since`` (``SEQ HEAD``); BadRequest when malformed."""
    if value is None:
        return None
    parts = value.split()
    if len(parts) != 2 or not parts[0].isdigit() or not is_full_commit_id(parts[1]):
        raise BadRequest(f"{STAGE_SINCE_HEADER} must be 'SEQ HEAD' (a staging seq and a full commit id), not {value!r}")
    return int(parts[0]), parts[1]
