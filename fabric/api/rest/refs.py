"""REST routes of repositories and their refs: repositories, branches, commits
(log, diff, uncommitted changes) and tags."""

from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field

from fabric.api.routing import Authenticator, PlaneGetter, caller, changes_body
from fabric.errors import BadRequest, NotFound
from fabric.format.listing import Change
from fabric.format.model import Commit
from fabric.plane.wire import MSGPACK


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


def _commit(c: Commit) -> CommitInfo:
    return CommitInfo(**c.describe())


def _change(c: Change) -> ChangeInfo:
    return ChangeInfo(**c.describe())


def _page(items: Iterator[Any], limit: int, key: Callable[[Any], str]) -> tuple[list[Any], str | None]:
    """The first ``limit`` items and, if there are more, the key to resume after.

    ``items`` already starts after the previous page (the plane is given
    ``after``), so a page costs one page of work, not all the pages before it.
    """
    out: list[Any] = []
    for item in items:
        if len(out) == limit:
            return out, key(out[-1])
        out.append(item)
    return out, None


def add_ref_routes(router: APIRouter, plane: PlaneGetter, authenticate: Authenticator) -> None:
    """Add the repository, branch, commit and tag routes to ``router``; ``plane()`` is the data plane to serve."""
    Caller = caller(authenticate)

    # -- repositories ----------------------------------------------------------
    @router.get("/repos", response_model=list[Repo], tags=["repositories"])
    def list_repos(who: Caller) -> list[dict]:
        return [r for r in plane().list_repos() if who.can(r["name"], "read")]

    @router.post("/repos", response_model=Repo, status_code=201, tags=["repositories"])
    def create_repo(body: RepoCreate, who: Caller) -> dict:
        """Create a repository: global admins, and tokens with the ``create-repos`` right, which
        then own it (``admin`` role). ``owner`` tells the plane whose it is: the hub grants it,
        a spoke forwards it."""
        who.require_create_repos()
        if who.token_id is None:  # authentication is off
            return plane().create_repo(body.name, body.default_branch)
        return plane().create_repo(body.name, body.default_branch, owner=who.token_id)

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
        async with changes_body(request) as (changes, fields):
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
        page, nxt = _page(plane().diff(repo, left, right, prefix, after=after or ""), limit, lambda c: c.path)
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
        page, nxt = _page(plane().uncommitted(repo, branch, prefix, after=after or ""), limit, lambda c: c.path)
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
