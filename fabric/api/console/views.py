"""The console's pages: server-rendered HTML over the process's data plane.

Every page acts as the signed-in token, with the same checks as the REST API: a
repository the token cannot read is answered exactly like one that does not exist
(404), and is never listed. Writes (create a branch, tag a commit) need the ``write``
role and the session's CSRF token. Errors on ``/ui`` pages are HTML pages; the REST
API keeps its JSON errors.
"""

from __future__ import annotations

import posixpath
import re
import secrets
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, PackageLoader, select_autoescape

from fabric.api.console.charts import line_chart
from fabric.api.console.preview import IMAGE_BYTES, image_type, preview
from fabric.api.console.series import Sampler
from fabric.api.console.sessions import COOKIE, PRE_COOKIE, Session, SessionStore, same
from fabric.auth.principal import ANONYMOUS_ADMIN, Principal
from fabric.errors import BadRequest, FabricError, Forbidden, NotFound, Unauthorized
from fabric.format.model import FILE
from fabric.plane.dataplane import DataPlane
from fabric.util.pieces import in_pieces

PREFIX = "/ui"
#: Rows of a directory listing or a diff per page.
PAGE_ROWS = 200
#: Commits per page of a log.
LOG_ROWS = 50
#: A commit's size change is summed over at most this many changed paths (else shown as a bound).
SIZE_CHANGE_PATHS = 20_000
#: Refs whose trees are summed for a repository's logical size (more: a lower bound).
SIZE_REFS = 32
FORM_BYTES = 16 * 1024

CSP = (
    "default-src 'self'; img-src 'self'; style-src 'self'; script-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATIC = {"console.css": "text/css; charset=utf-8"}


class SignIn(Exception):
    """The request has no valid session: go to the sign-in page (and back afterwards)."""

    def __init__(self, next_url: str, note: str | None = None) -> None:
        super().__init__(next_url)
        self.next_url = next_url
        self.note = note


# -- formatting ----------------------------------------------------------------------
def human_size(n: float | None) -> str:
    if n is None:
        return "–"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} PiB"


def size_change(n: int | None, bound: bool = False) -> str:
    if n is None:
        return "?"
    text = ("+" if n > 0 else "") + human_size(n) if n else "±0"
    return ("≥ " if bound else "") + text


def when(ts: float | None) -> str:
    if not ts:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def ago(ts: float | None) -> str:
    if not ts:
        return "never"
    d = time.time() - ts
    if d < 1:
        return "just now"
    for unit, secs in (("d", 86400), ("h", 3600), ("min", 60)):
        if d >= secs:
            return f"{d / secs:.0f} {unit} ago"
    return f"{d:.0f} s ago"


def percent(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f} %"


def url(base: str, /, **params: Any) -> str:
    """``base`` (its segments already quoted) with the non-empty ``params`` as a query."""
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return base + ("?" + query if query else "")


def repo_url(repo: str, page: str = "", /, **params: Any) -> str:
    base = f"{PREFIX}/repos/{urllib.parse.quote(repo, safe='')}"
    return url(base + (f"/{page}" if page else ""), **params)


def _safe_next(value: str | None) -> str:
    """Where to go after signing in: a console page of this server, nothing else."""
    if value and value.startswith(PREFIX + "/") and not value.startswith("//") and "\\" not in value:
        return value
    return PREFIX + "/repos"


def _download_name(path: str) -> str:
    name = posixpath.basename(path) or "download"
    ascii_name = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:120] or "download"
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


class Console:
    """The console of one service process."""

    def __init__(
        self,
        role: str,
        get_plane: Callable[[], DataPlane],
        verify_token: Callable[[str], Principal] | None,
        sampler: Sampler,
        health: Callable[[], dict] | None = None,
        spokes: Callable[[], dict] | None = None,
        repo_usage: Callable[[str], dict] | None = None,
    ) -> None:
        self.role = role
        self.plane = get_plane
        self.verify_token = verify_token
        self.sampler = sampler
        self.health = health
        self.spokes = spokes
        self.repo_usage = repo_usage
        self.sessions = SessionStore()
        # Figures of immutable commits, kept (bounded): tree sizes and size changes.
        self._sizes: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._changes: OrderedDict[tuple[str, str], tuple[int | None, bool]] = OrderedDict()
        self.env = Environment(
            loader=PackageLoader("fabric.api.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(size=human_size, when=when, ago=ago, percent=percent, change=size_change)
        self.env.globals.update(url=url, repo_url=repo_url, ui_root=PREFIX, role=role)

    # -- sessions -------------------------------------------------------------------
    def who(self, request: Request) -> tuple[Session, Principal]:
        """The session and principal of a request; SignIn when there is none (or its token died)."""
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            raise SignIn(here)
        if self.verify_token is None or session.token is None:
            return session, ANONYMOUS_ADMIN
        try:
            return session, self.verify_token(session.token)
        except Unauthorized:
            self.sessions.drop(session.sid)
            raise SignIn(here, "Your token is no longer valid: sign in again.") from None

    def render(self, request: Request, template: str, status: int = 200, session: Session | None = None,
               who: Principal | None = None, **ctx: Any) -> HTMLResponse:  # fmt: skip
        html = self.env.get_template(template).render(
            who=who,
            csrf=session.csrf if session else "",
            may_see_service=who is not None and who.can("*", "read"),
            auth=self.verify_token is not None,
            **ctx,
        )
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    # -- data -----------------------------------------------------------------------
    def readable(self, who: Principal, repo: str) -> dict:
        """The repository dict, or NotFound as if it did not exist when ``who`` may not read it."""
        if not who.can(repo, "read"):
            raise NotFound(f"repository {repo!r} does not exist")
        return self.plane().get_repo(repo)

    def tree_size(self, repo: str, commit_id: str) -> int:
        key = (repo, commit_id)
        hit = self._sizes.get(key)
        if hit is not None:
            self._sizes.move_to_end(key)
            return hit
        total = sum(e.size for _, e in self.plane().walk(repo, commit_id) if e.kind == FILE)
        self._sizes[key] = total
        while len(self._sizes) > 4096:
            self._sizes.popitem(last=False)
        return total

    def summary(self, repo: dict) -> dict:
        """What the repository list and page show of a repository: refs, last commit, sizes."""
        p, name = self.plane(), repo["name"]
        branches, tags = p.list_branches(name), p.list_tags(name)
        head = next((b for b in branches if b["name"] == repo["default_branch"]), branches[0] if branches else None)
        last = p.get_commit(name, head["commit_id"]) if head else None
        commits = list(dict.fromkeys([b["commit_id"] for b in branches] + [t["commit_id"] for t in tags]))
        logical = sum(self.tree_size(name, c) for c in commits[:SIZE_REFS])
        usage = self.repo_usage(name) if self.repo_usage else None
        stored = usage["stored_bytes"] if usage else None
        return {
            **repo,
            "branches": branches,
            "tags": tags,
            "last": last,
            "head_bytes": self.tree_size(name, head["commit_id"]) if head else 0,
            "logical_bytes": logical,
            "logical_bound": len(commits) > SIZE_REFS,
            "stored_bytes": stored,
            "chunks": usage["chunks"] if usage else None,
            "dedup": (logical / stored) if stored else None,
        }

    def change_of(self, repo: str, c: Any) -> tuple[int | None, bool]:
        """The bytes a commit added (negative: removed) against its first parent; ``(None, _)``
        when the plane does not say (a remote plane's changes carry no entries)."""
        key = (repo, c.id)
        hit = self._changes.get(key)
        if hit is None:
            hit = self._changes[key] = self._change_of(repo, c)
            while len(self._changes) > 4096:
                self._changes.popitem(last=False)
        return hit

    def _change_of(self, repo: str, c: Any) -> tuple[int | None, bool]:
        if not c.parents:
            return self.tree_size(repo, c.id), False
        total = 0
        for i, ch in enumerate(self.plane().diff(repo, c.parents[0], c.id)):
            if i >= SIZE_CHANGE_PATHS:
                return total, True
            if ch.kind == "changed" and (ch.left is None or ch.right is None):
                return None, False
            total += (ch.right.size if ch.right is not None and ch.right.kind == FILE else 0) - (
                ch.left.size if ch.left is not None and ch.left.kind == FILE else 0
            )
        return total, False

    def charts(self) -> list:
        s = self.sampler
        if self.role == "spoke":
            latest = s.samples()[-1][1] if s.samples() else {}
            wan = sorted(k for k in latest if re.fullmatch(r"upstream_bytes_(received|sent)_[a-z_]+", k))
            return [
                line_chart("cache hit ratio (bytes, per interval)", [("hit ratio", s.ratio("cache_hit_bytes", "cache_miss_bytes"))],
                           percent, y_max=1.0),  # fmt: skip
                line_chart("cache use", [("used", s.level("cache_bytes")), ("budget", s.level("cache_budget_bytes")),
                                         ("pinned", s.level("cache_pinned_bytes"))], human_size, binary=True),  # fmt: skip
                line_chart("WAN bytes per second, by direction and purpose",
                           [(k.removeprefix("upstream_bytes_").replace("_", " "), s.delta(k, per_second=True)) for k in wan],
                           lambda v: human_size(v) + "/s", binary=True),  # fmt: skip
                line_chart("write-back backlog", [("pending", s.level("writeback_pending")), ("parked", s.level("writeback_parked"))]),
            ]
        return [
            line_chart("requests per second", [("all", s.delta("http_requests", True)), ("errors (5xx)", s.delta("http_errors", True))]),
            line_chart("HTTP bytes per second", [("in", s.delta("http_bytes_in", True)), ("out", s.delta("http_bytes_out", True))],
                       lambda v: human_size(v) + "/s", binary=True),  # fmt: skip
        ]


async def _form(request: Request) -> dict[str, str]:
    """A small url-encoded form (BadRequest when larger than :data:`FORM_BYTES`)."""
    data = b""
    async for part in request.stream():
        data += part
        if len(data) > FORM_BYTES:
            raise BadRequest("form too large")
    fields = urllib.parse.parse_qs(data.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=20)
    return {k: v[0] for k, v in fields.items()}


Form = Annotated[dict[str, str], Depends(_form)]


def _check_origin(request: Request) -> None:
    """A browser's cross-site POST says where it comes from: refuse one from elsewhere."""
    origin = request.headers.get("origin")
    if origin and origin != "null":
        host = urllib.parse.urlsplit(origin).netloc
        if host != request.headers.get("host"):
            raise Forbidden("cross-site request refused")


def add_console(app: FastAPI, console: Console) -> None:
    """Serve ``console`` at ``/ui`` of ``app``: pages, static files, and HTML errors for them."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    c = console

    def cookie_args(request: Request) -> dict:
        return {"httponly": True, "samesite": "strict", "secure": request.url.scheme == "https", "path": PREFIX}

    def post_session(request: Request, form: dict[str, str]) -> tuple[Session, Principal]:
        _check_origin(request)
        session, who = c.who(request)
        if not same(form.get("csrf"), session.csrf):
            raise Forbidden("the form's CSRF token does not match this session: reload the page and try again")
        return session, who

    @router.get("")
    @router.get("/")
    def root() -> Response:
        return RedirectResponse(PREFIX + "/repos", status_code=303)

    @router.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            raise NotFound(f"no static file {name!r}")
        data = resources.files("fabric.api.console").joinpath("static", name).read_bytes()
        return Response(data, media_type=STATIC[name], headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})

    # -- signing in and out -------------------------------------------------------
    @router.get("/signin")
    def signin_page(request: Request, next: str | None = None, note: str | None = None) -> Response:  # noqa: A002
        if c.verify_token is None:
            session = c.sessions.get(request.cookies.get(COOKIE)) or c.sessions.create(None)
            response = RedirectResponse(_safe_next(next), status_code=303)
            response.set_cookie(COOKIE, session.sid, **cookie_args(request))
            return response
        pre = request.cookies.get(PRE_COOKIE) or secrets.token_urlsafe(24)
        response = c.render(request, "signin.html", next=_safe_next(next), pre=pre, note=note)
        response.set_cookie(PRE_COOKIE, pre, max_age=3600, **cookie_args(request))
        return response

    @router.post("/signin")
    def signin(request: Request, form: Form) -> Response:
        _check_origin(request)
        next_url = _safe_next(form.get("next"))
        pre = request.cookies.get(PRE_COOKIE)
        if not same(form.get("csrf"), pre):
            return c.render(request, "signin.html", 403, next=next_url, pre=pre or "",
                            note="The sign-in form expired: try again.")  # fmt: skip
        token = form.get("token", "").strip()
        try:
            if not token:
                raise Unauthorized("no token")
            who = c.verify_token(token) if c.verify_token else ANONYMOUS_ADMIN
        except Unauthorized:
            return c.render(request, "signin.html", 401, next=next_url, pre=pre, note="That token was not accepted.")
        session = c.sessions.create(token)
        del who
        response = RedirectResponse(next_url, status_code=303)
        response.set_cookie(COOKIE, session.sid, **cookie_args(request))
        response.delete_cookie(PRE_COOKIE, **cookie_args(request))
        return response

    @router.post("/signout")
    def signout(request: Request, form: Form) -> Response:
        session = c.sessions.get(request.cookies.get(COOKIE))
        if session is not None:
            _check_origin(request)
            if not same(form.get("csrf"), session.csrf):
                raise Forbidden("the form's CSRF token does not match this session: reload the page and try again")
            c.sessions.drop(session.sid)
        response = RedirectResponse(PREFIX + "/signin?note=signed-out", status_code=303)
        response.delete_cookie(COOKIE, **cookie_args(request))
        return response

    # -- repositories ------------------------------------------------------------------
    @router.get("/repos")
    def repos(request: Request) -> Response:
        session, who = c.who(request)
        rows = [c.summary(r) for r in c.plane().list_repos() if who.can(r["name"], "read")]
        return c.render(request, "repos.html", session=session, who=who, repos=rows, with_stored=c.repo_usage is not None)

    @router.get("/repos/{repo}")
    def repo_page(request: Request, repo: str) -> Response:
        session, who = c.who(request)
        info = c.summary(c.readable(who, repo))
        return c.render(request, "repo.html", session=session, who=who, r=info, may_write=who.can(repo, "write"),
                        with_stored=c.repo_usage is not None)  # fmt: skip

    @router.post("/repos/{repo}/branches")
    def create_branch(request: Request, repo: str, form: Form) -> Response:
        _, who = post_session(request, form)
        c.readable(who, repo)
        who.require(repo, "write")
        c.plane().create_branch(repo, form.get("name", "").strip(), form.get("source", "").strip())
        return RedirectResponse(repo_url(repo), status_code=303)

    @router.post("/repos/{repo}/tags")
    def create_tag(request: Request, repo: str, form: Form) -> Response:
        _, who = post_session(request, form)
        c.readable(who, repo)
        who.require(repo, "write")
        c.plane().create_tag(repo, form.get("name", "").strip(), form.get("ref", "").strip())
        return RedirectResponse(repo_url(repo), status_code=303)

    # -- history -------------------------------------------------------------------------
    @router.get("/repos/{repo}/log")
    def log(request: Request, repo: str, ref: str | None = None, after: str | None = None) -> Response:
        session, who = c.who(request)
        info = c.readable(who, repo)
        ref = ref or info["default_branch"]
        commits = c.plane().log(repo, ref, limit=LOG_ROWS + 1, after=after)
        more = len(commits) > LOG_ROWS
        commits = commits[:LOG_ROWS]
        rows = [{"c": cm, "change": c.change_of(repo, cm)} for cm in commits]
        refs = [b["name"] for b in c.plane().list_branches(repo)]
        return c.render(request, "log.html", session=session, who=who, repo=info, ref=ref, rows=rows, refs=refs,
                        next_after=commits[-1].id if more and commits else None)  # fmt: skip

    def diff_rows(repo: str, left: str, right: str, prefix: str, after: str) -> tuple[list[dict], str | None, dict]:
        rows: list[dict] = []
        counts = {"added": 0, "changed": 0, "removed": 0}
        changes: Iterator = c.plane().diff(repo, left, right, prefix, after)
        for ch in changes:
            if len(rows) == PAGE_ROWS:
                return rows, rows[-1]["path"], counts
            old = ch.left.size if ch.left is not None else None
            new = ch.right.size if ch.right is not None else None
            rows.append({"path": ch.path, "kind": ch.kind, "old": old, "new": new, "size": ch.describe().get("size")})
            counts[ch.kind] += 1
        return rows, None, counts

    @router.get("/repos/{repo}/diff")
    def diff(request: Request, repo: str, left: str = "", right: str = "", prefix: str = "", after: str = "") -> Response:
        session, who = c.who(request)
        info = c.readable(who, repo)
        right = right or info["default_branch"]
        left = left or f"{right}~1"
        rows, next_after, counts = diff_rows(repo, left, right, prefix, after)
        refs = [b["name"] for b in c.plane().list_branches(repo)] + [t["name"] for t in c.plane().list_tags(repo)]
        return c.render(request, "diff.html", session=session, who=who, repo=info, left=left, right=right, under=prefix,
                        after=after, rows=rows, counts=counts, next_after=next_after, refs=refs)  # fmt: skip

    @router.get("/repos/{repo}/commits/{commit}")
    def commit_page(request: Request, repo: str, commit: str, after: str = "") -> Response:
        session, who = c.who(request)
        info = c.readable(who, repo)
        p = c.plane()
        cm = p.get_commit(repo, p.resolve_commit(repo, commit))
        rows, next_after, counts = diff_rows(repo, cm.parents[0], cm.id, "", after) if cm.parents else ([], None, {})
        return c.render(request, "commit.html", session=session, who=who, repo=info, c=cm, rows=rows, counts=counts,
                        next_after=next_after, after=after, may_write=who.can(repo, "write"))  # fmt: skip

    # -- trees and files ---------------------------------------------------------------------
    @router.get("/repos/{repo}/tree")
    def tree(request: Request, repo: str, ref: str = "", path: str = "", after: str = "") -> Response:
        session, who = c.who(request)
        info = c.readable(who, repo)
        ref = ref or info["default_branch"]
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        started = time.perf_counter()
        page = c.plane().list(repo, ref, prefix, "/", after, PAGE_ROWS)
        rows = [{"name": p[len(prefix):], "path": p.rstrip("/"), "dir": True} for p in page.prefixes]
        rows += [{"name": p[len(prefix):], "path": p, "dir": False, "e": e} for p, e in page.entries]
        rows.sort(key=lambda r: r["path"])
        parts = prefix.strip("/").split("/") if prefix else []
        crumbs = [(part, "/".join(parts[: i + 1])) for i, part in enumerate(parts)]
        return c.render(request, "tree.html", session=session, who=who, repo=info, ref=ref, path=prefix.rstrip("/"),
                        crumbs=crumbs, rows=rows, next_after=page.next_after, after=after,
                        took_ms=(time.perf_counter() - started) * 1000)  # fmt: skip

    @router.get("/repos/{repo}/file")
    def file_page(request: Request, repo: str, path: str, ref: str = "") -> Response:
        session, who = c.who(request)
        info = c.readable(who, repo)
        ref = ref or info["default_branch"]
        entry = c.plane().stat(repo, ref, path)
        shown = preview(c.plane(), repo, ref, path, entry)
        parts = path.strip("/").split("/")
        crumbs = [(part, "/".join(parts[: i + 1])) for i, part in enumerate(parts[:-1])]
        return c.render(request, "file.html", session=session, who=who, repo=info, ref=ref, path=path, e=entry,
                        preview=shown, crumbs=crumbs, name=parts[-1])  # fmt: skip

    @router.get("/repos/{repo}/raw")
    def raw(request: Request, repo: str, path: str, ref: str = "", inline: bool = False) -> Response:
        _, who = c.who(request)
        info = c.readable(who, repo)
        ref = ref or info["default_branch"]
        p = c.plane()
        commit_id = p.resolve_commit(repo, ref)
        entry = p.stat(repo, commit_id, path)
        if entry.kind != FILE:
            raise BadRequest(f"{path!r} is a {entry.kind}, not a file")
        kind = image_type(path) if inline and entry.size <= IMAGE_BYTES else None
        headers = {
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Cache-Control": "private, max-age=60",
            "Content-Length": str(entry.size),
        }
        if kind is None:
            headers["Content-Disposition"] = _download_name(path)
        else:
            headers["Content-Disposition"] = "inline"
        body = in_pieces(p.open_file(repo, commit_id, path, entry)) if entry.size else iter([b""])
        return StreamingResponse(body, media_type=kind or "application/octet-stream", headers=headers)

    # -- the service ---------------------------------------------------------------------------
    def service_viewer(request: Request) -> tuple[Session, Principal]:
        session, who = c.who(request)
        if not who.can("*", "read"):
            raise NotFound("this page needs read access to every repository")
        return session, who

    @router.get("/health")
    def health(request: Request) -> Response:
        if c.health is None:
            return RedirectResponse(PREFIX + "/spokes", status_code=303)
        session, who = service_viewer(request)
        stats = c.health()
        jobs = sorted(stats.get("jobs", {}).items(), key=lambda kv: -kv[1].get("last_active", 0))
        return c.render(request, "health.html", session=session, who=who, s=stats, jobs=jobs, charts=c.charts(),
                        interval=c.sampler.interval)  # fmt: skip

    @router.get("/spokes")
    def spokes(request: Request) -> Response:
        if c.spokes is None:
            return RedirectResponse(PREFIX + "/health", status_code=303)
        session, who = service_viewer(request)
        return c.render(request, "spokes.html", session=session, who=who, v=c.spokes(), charts=c.charts(),
                        interval=c.sampler.interval)  # fmt: skip

    app.include_router(router)

    # HTML errors (and the way to sign in) for console pages; JSON as before elsewhere.
    previous = app.exception_handlers.get(FabricError)

    async def fabric_error(request: Request, exc: Exception) -> Response:
        if not request.url.path.startswith(PREFIX):
            assert previous is not None
            return await previous(request, exc)
        assert isinstance(exc, FabricError)
        session = c.sessions.get(request.cookies.get(COOKIE))
        status = 404 if isinstance(exc, NotFound) else exc.status
        return c.render(request, "error.html", status, session=session, who=None, error=exc, code=status)

    async def sign_in(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SignIn)
        response = RedirectResponse(url(PREFIX + "/signin", next=exc.next_url, note=exc.note and "expired"), status_code=303)
        response.delete_cookie(COOKIE, **cookie_args(request))
        return response

    app.add_exception_handler(FabricError, fabric_error)
    app.add_exception_handler(SignIn, sign_in)
