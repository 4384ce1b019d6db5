"""A data plane over HTTP: the REST API v1 of a hub or a spoke, as a Python object.

``HttpPlane(url, token)`` implements :class:`~fabric.plane.dataplane.DataPlane`, so the
CLI, import/export and any library code run unchanged against a remote
server. Imports chunk locally and send only the chunks the server lacks
(a :class:`~fabric.client.upload.PipelinedSink`, which asks and uploads packs in background
threads, so a round trip never stalls the reading).

``url`` may be a comma-separated list of servers of one fabric, nearest first (the spokes
of a region, then the hub): requests go to the nearest healthy one and move to the next
when it fails (:mod:`fabric.client.servers`), without the caller seeing an error, for every
request that is safe to send twice: reads, listings, ``stat``, ``frames``, chunk uploads
(content-addressed), staging entries, and uploads whose body can be replayed (bytes, a
seekable file). A download or a ``frames`` stream that breaks off continues on the next
server from where it stopped. A server may be behind another (a spoke lags its hub by up
to its lease): what is read by chunk id (the open files of a mount and of ``fabric://``)
or by commit id is the same everywhere, and a download resumed elsewhere is pinned to the
commit its first answer named (``X-Fabric-Commit``); a branch asked about afresh gets what
the new server says, which may be older than what the previous one said.
"""

from __future__ import annotations

import itertools
import json
import os
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import httpx
import msgpack

from fabric import errors
from fabric.auth.principal import Principal
from fabric.client.bandwidth import Bandwidth, ThrottledTransport
from fabric.client.records import parse_records
from fabric.client.servers import ServerSet, Unreachable
from fabric.client.transport import HttpClientTransport
from fabric.format.listing import Change, Listing
from fabric.format.model import Commit, Entry
from fabric.plane.dataplane import DataPlane
from fabric.plane.jobs import JOB_ENV, JOB_HEADER, MAX_HINT_BYTES, MAX_HINT_PATHS, check_job
from fabric.plane.wire import (
    MSGPACK,
    STAGE_SINCE_HEADER,
    STAGING_SEQ_HEADER,
    commit_from_json,
    entry_from_json,
    pack_changes,
)
from fabric.util.progress import Progress

if TYPE_CHECKING:
    from fabric.client.upload import PipelinedSink

#: Packs sent over the network are smaller than stored ones, so a failed upload costs less.
UPLOAD_PACK_SIZE = 16 * 1024 * 1024
#: A sink's first pack; each next one is as large as all before it, up to UPLOAD_PACK_SIZE (a slow
#: start: the server, and a spoke's push to its hub, get the first chunks sooner).
UPLOAD_FIRST_PACK_SIZE = 2 * 1024 * 1024
#: Ids per ``/chunks/missing`` and ``/chunks/frames`` request (servers take at most 10,000).
MISSING_BATCH = 10_000
FRAMES_BATCH = 4096
OBJECT_BATCH = 256
#: Ids per report of a mount's reads from a spoke's cache files (spokes take at most 4,096).
LOCAL_READS_BATCH = 4096
API = "/api/v1"

_T = TypeVar("_T")

_BY_STATUS: dict[int, type[errors.FabricError]] = {
    400: errors.BadRequest,
    401: errors.Unauthorized,
    403: errors.Forbidden,
    404: errors.NotFound,
    409: errors.Conflict,
    412: errors.PreconditionFailed,
    413: errors.PayloadTooLarge,
    416: errors.RangeNotSatisfiable,
    503: errors.Unavailable,
    507: errors.StorageFull,
}


@dataclass(frozen=True)
class Timeouts:
    """Seconds an HTTP request may wait, by phase. ``read`` is the longest silence while an
    answer is awaited or streamed (between two pieces of a body); ``slow`` replaces it for
    calls whose answer may take long to start (commits, merges, uploads, gc, fsck)."""

    connect: float = 10.0
    read: float = 300.0
    write: float = 300.0
    pool: float = 300.0
    slow: float = 300.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise errors.BadRequest(f"timeout {f.name} must be a positive number of seconds, not {value!r}")

    @classmethod
    def parse(cls, text: str, base: Timeouts | None = None) -> Timeouts:
        """``"5"`` (read timeout) or ``"connect=2,read=5,write=30,pool=10,slow=300"`` over ``base``'s values."""
        values = {f.name: getattr(base or cls(), f.name) for f in fields(cls)}
        for part in text.split(","):
            name, eq, number = part.strip().rpartition("=")
            name = name.strip() if eq else "read"
            if name not in values:
                raise errors.BadRequest(f"unknown timeout {name!r}: use {', '.join(values)}")
            try:
                values[name] = float(number)
            except ValueError:
                raise errors.BadRequest(f"timeout {name} must be a number of seconds, not {number.strip()!r}") from None
        return cls(**values)

    def as_httpx(self, slow: bool = False) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.slow if slow else self.read, write=self.write, pool=self.pool)


#: What a write may ask of a spoke with ``X-Fabric-Durability`` (DESIGN.md §3; a hub meets every level).
DURABILITY_LEVELS = ("local", "replicated", "hub")


def check_durability(durability: str) -> str:
    """``durability`` if it is one of :data:`DURABILITY_LEVELS`; ValueError otherwise."""
    if durability not in DURABILITY_LEVELS:
        raise ValueError(f"unknown durability {durability!r}: use one of {', '.join(DURABILITY_LEVELS)}")
    return durability


def durability_header(durability: str | None) -> dict[str, str]:
    """The request header that asks a spoke for a durability level (none: the server's default)."""
    return {"X-Fabric-Durability": durability} if durability is not None else {}


def _hint_batches(paths: Sequence[str]) -> Iterator[list[str]]:
    """``paths`` cut into hints a server takes: at most MAX_HINT_PATHS paths, and half the
    body limit of JSON (room for escapes), each; one empty batch for no paths."""
    batch: list[str] = []
    size = 0
    for path in paths:
        n = len(path.encode()) + 4
        if batch and (len(batch) == MAX_HINT_PATHS or size + n > MAX_HINT_BYTES // 2):
            yield batch
            batch, size = [], 0
        batch.append(path)
        size += n
    yield batch


class _Body:
    """A request body that can be let go of once sent. httpx's request, response and connection
    objects refer to each other in a cycle, which only the cycle collector frees, and ``fabric
    import`` turns that off while it runs (:mod:`fabric.cli.transfer_cmd`): a pack (16 MiB)
    given as ``bytes`` would stay in memory, with every other one, until the process ends."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __iter__(self) -> Iterator[bytes]:
        yield self.data


def raise_for_error(response: httpx.Response) -> None:
    """Turn an error response into the matching :mod:`fabric.errors` exception."""
    if response.status_code < 400:
        return
    try:
        body = response.json()["error"]
        message, code, details = body.pop("message"), body.pop("code", ""), body
    except Exception:  # noqa: BLE001 - not one of our error documents
        message, code, details = f"{response.status_code} {response.reason_phrase}: {response.text[:200]}", "", {}
    if code == "merge_conflict":
        raise errors.MergeConflict(message, details.get("conflicts", []))
    if code == "corruption":
        raise errors.Corruption(message)
    if code == "chunks_missing":
        raise errors.ChunksMissing(message, details.get("missing") or ())
    raise _BY_STATUS.get(response.status_code, errors.FabricError)(message, **details)


class HttpPlane(DataPlane):
    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float | Timeouts = 300.0,
        transport: httpx.BaseTransport | None = None,
        job: str | None = None,
        durability: str | None = None,
        bandwidth: Bandwidth | None = None,
    ) -> None:
        """``url``: a server's base URL, or several, comma-separated, nearest first (BadRequest
        naming a bad one); each gets the same token. ``timeout``: seconds for every phase but
        connecting (10 s), or :class:`Timeouts`. ``bandwidth``: caps on the bytes sent and
        received a second (:mod:`fabric.client.bandwidth`).
        ``job``: the job every request reads for (``X-Fabric-Job``; default: env ``FABRIC_JOB``,
        if set); BadRequest when it is not a valid job id.
        ``durability``: the level every write asks a spoke for (``X-Fabric-Durability``, one of
        :data:`DURABILITY_LEVELS`, ValueError otherwise; None: the server's default)."""
        verify: Any = os.environ.get("FABRIC_CA_BUNDLE") or True
        self.servers = ServerSet(url, verify=verify)
        self.timeouts = timeout if isinstance(timeout, Timeouts) else Timeouts(10.0, timeout, timeout, timeout, timeout)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.job = check_job(job) if job is not None else (check_job(os.environ[JOB_ENV]) if os.environ.get(JOB_ENV) else None)
        if self.job is not None:
            headers[JOB_HEADER] = self.job
        if durability is not None:
            headers.update(durability_header(check_durability(durability)))
        if not any(u.startswith("https://") for u in self.servers.urls):
            # No TLS to check: spare loading the CA bundle (~40 ms of every CLI command). A context
            # that requires certificates and trusts none, so a TLS connection would fail, never go unchecked.
            verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        transport = transport or HttpClientTransport(verify)
        self.http = httpx.Client(
            base_url=self.servers.urls[0] + API,
            headers=headers,
            timeout=self.timeouts.as_httpx(),
            verify=verify,
            transport=ThrottledTransport(transport, bandwidth) if bandwidth else transport,
        )
        self._slow = self.timeouts.as_httpx(slow=True)

    @property
    def url(self) -> str:
        """The server requests go to now: the one given, or the current one of a list."""
        return self.servers.current()

    def close(self) -> None:
        self.servers.close()
        self.http.close()

    # -- plumbing ----------------------------------------------------------------
    def _send(
        self, attempt: Callable[[str], httpx.Response], method: str, repeatable: bool | None
    ) -> tuple[str, httpx.Response]:
        """``attempt(server URL)`` through the server list; ``repeatable``: may the request go to
        another server after it may have reached one (default: GET and HEAD)."""
        try:
            return self.servers.send(attempt, method in ("GET", "HEAD") if repeatable is None else repeatable)
        except Unreachable as exc:
            raise errors.Unavailable(str(exc)) from exc
        except httpx.TransportError as exc:
            raise errors.Unavailable(f"cannot reach {self.url}: {exc}") from exc

    def _call(self, method: str, path: str, repeatable: bool | None = None, **kwargs: Any) -> httpx.Response:
        _, response = self._send(lambda base: self.http.request(method, base + API + path, **kwargs), method, repeatable)
        raise_for_error(response)
        return response

    def _open_stream(
        self, method: str, path: str, repeatable: bool | None = None, **kwargs: Any
    ) -> tuple[str, httpx.Response]:
        """Send a request whose response body is read as a stream (the caller closes it):
        the server that answered, and its answer."""

        def attempt(base: str) -> httpx.Response:
            return self.http.send(self.http.build_request(method, base + API + path, **kwargs), stream=True)

        server, response = self._send(attempt, method, repeatable)
        if response.status_code >= 400:
            response.read()
            response.close()
            raise_for_error(response)
        return server, response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._call(method, path, **kwargs).json()

    def _slow_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call whose answer may take long to start: waits ``Timeouts.slow`` for it."""
        return self._call(method, path, timeout=self._slow, **kwargs).json()

    # -- repositories --------------------------------------------------------------
    def create_repo(self, name: str, default_branch: str = "main", owner: str | None = None) -> dict:
        """``owner``: the token id the repository is created for (a spoke's caller); the server
        honours it only from a spoke's token, and that token must hold ``create-repos``."""
        return self._json(
            "POST", "/repos", json={"name": name, "default_branch": default_branch}, headers=_on_behalf(owner)
        )

    def get_repo(self, name: str) -> dict:
        return self._json("GET", f"/repos/{name}")

    def list_repos(self) -> list[dict]:
        return self._json("GET", "/repos")

    def delete_repo(self, name: str) -> None:
        self._call("DELETE", f"/repos/{name}", timeout=self._slow)

    # -- refs ----------------------------------------------------------------------
    def resolve_commit(self, repo: str, ref: str) -> str:
        return self._json("GET", f"/repos/{repo}/commits/{ref}")["id"]

    def list_branches(self, repo: str) -> list[dict]:
        return self._json("GET", f"/repos/{repo}/branches")

    def create_branch(self, repo: str, name: str, source: str) -> dict:
        return self._json("POST", f"/repos/{repo}/branches", json={"name": name, "source": source})

    def delete_branch(self, repo: str, name: str) -> None:
        self._call("DELETE", f"/repos/{repo}/branches/{name}")

    def reset_branch(self, repo: str, name: str, ref: str) -> dict:
        return self._json("POST", f"/repos/{repo}/branches/{name}/reset", json={"ref": ref})

    def list_tags(self, repo: str) -> list[dict]:
        return self._json("GET", f"/repos/{repo}/tags")

    def create_tag(self, repo: str, name: str, ref: str) -> dict:
        return self._json("POST", f"/repos/{repo}/tags", json={"name": name, "ref": ref})

    def delete_tag(self, repo: str, name: str) -> None:
        self._call("DELETE", f"/repos/{repo}/tags/{name}")

    # -- commits -------------------------------------------------------------------
    def get_commit(self, repo: str, commit_id: str) -> Commit:
        return commit_from_json(self._json("GET", f"/repos/{repo}/commits/{commit_id}"))

    def log(self, repo: str, ref: str, path: str | None = None, limit: int = 100, after: str | None = None) -> list[Commit]:
        out: list[Commit] = []
        while len(out) < limit:
            params: dict[str, Any] = {"limit": min(1000, limit - len(out))}
            if path:
                params["path"] = path
            if after:
                params["after"] = after
            page = self._json("GET", f"/repos/{repo}/refs/{ref}/log", params=params)
            out.extend(commit_from_json(c) for c in page["commits"])
            after = page["next_after"]
            if after is None:
                break
        return out

    def commit(
        self,
        repo: str,
        branch: str,
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        body = {"message": message, "metadata": dict(meta or {}), "author": author, "expected_head": expected_head, "allow_empty": allow_empty}
        return commit_from_json(self._slow_json("POST", f"/repos/{repo}/branches/{branch}/commits", json=body))

    def commit_changes(
        self,
        repo: str,
        branch: str,
        changes: Mapping[str, Entry | None],
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        body = pack_changes(
            dict(changes), message=message, author=author, meta=dict(meta or {}), expected_head=expected_head, allow_empty=allow_empty
        )
        response = self._slow_json(
            "POST", f"/repos/{repo}/branches/{branch}/commit-changes", content=body, headers={"Content-Type": MSGPACK}
        )
        return commit_from_json(response)

    def _changes(self, path: str, params: dict[str, Any], after: str) -> Iterator[Change]:
        """Changes page by page, each page asked for after the last path of the one before."""
        while True:
            page = self._json("GET", path, params={**params, **({"after": after} if after else {})})
            for c in page["changes"]:
                yield Change(c["path"], c["type"], None, None)
            after = page["next_after"]
            if after is None:
                return

    def diff(self, repo: str, left: str, right: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        return self._changes(f"/repos/{repo}/refs/{left}/diff/{right}", {"prefix": prefix}, after)

    def uncommitted(self, repo: str, branch: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        return self._changes(f"/repos/{repo}/branches/{branch}/changes", {"prefix": prefix}, after)

    def merge(
        self, repo: str, source: str, dest: str, strategy: str | None = None, message: str | None = None, author: str | None = None
    ) -> Commit:
        body = {"source": source, "strategy": strategy, "message": message, "author": author}
        return commit_from_json(self._slow_json("POST", f"/repos/{repo}/branches/{dest}/merge", json=body))

    def revert(self, repo: str, branch: str, commit_ref: str, parent: int = 1, author: str | None = None) -> Commit:
        body = {"commit": commit_ref, "parent": parent, "author": author}
        return commit_from_json(self._slow_json("POST", f"/repos/{repo}/branches/{branch}/revert", json=body))

    # -- objects -------------------------------------------------------------------
    def stat(self, repo: str, ref: str, path: str) -> Entry:
        return entry_from_json(self._json("GET", f"/repos/{repo}/refs/{ref}/stat", params={"path": path}))

    def stat_chunks(self, repo: str, ref: str, path: str) -> Entry:
        response = self._call("GET", f"/repos/{repo}/refs/{ref}/entry", params={"path": path})
        return Entry.from_wire(msgpack.unpackb(response.content, raw=False))

    def list(self, repo: str, ref: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> Listing:
        params = {"prefix": prefix, "delimiter": delimiter, "after": after, "limit": limit}
        response = self._call("GET", f"/repos/{repo}/refs/{ref}/list", params=params, headers={"Accept": MSGPACK})
        if response.headers.get("content-type", "").startswith(MSGPACK):
            page = msgpack.unpackb(response.content, raw=False)
            entries = [(p, Entry.from_wire(e)) for p, e in page["entries"]]
        else:  # a server without whole-entry listings
            page = response.json()
            entries = [(e["path"], entry_from_json(e)) for e in page["entries"]]
        return Listing(entries, page["prefixes"], page["next_after"])

    def hint(
        self, repo: str, ref: str, paths: Sequence[str], job: str | None = None, append: bool = False, top_up: bool = False
    ) -> dict:
        """``job`` defaults to this plane's own; a long order is sent in several calls (the later
        ones appending), each within the server's limits; the answer sums them. A call refused
        after the first leaves the calls before it in effect."""
        job = job if job is not None else self.job
        if job is None:
            raise errors.BadRequest(f"a hint needs a job id: HttpPlane(job=...) or ${JOB_ENV}")
        check_job(job)
        total = {"job": job, "paths": 0, "bytes": 0, "window_bytes": 0}
        for batch in _hint_batches(paths):
            body = {"ref": ref, "paths": batch, "job": job, "append": append, "top_up": top_up}
            reply = self._json("POST", f"/repos/{repo}/hints", json=body)
            append = True
            total["paths"] += reply["paths"]
            total["bytes"] += reply["bytes"]
            total["window_bytes"] = reply["window_bytes"]
        return total

    def report_local_reads(self, repo: str, ids: Sequence[bytes]) -> None:
        """Tell a spoke that a client beside it read these chunks of ``repo`` from its cache
        files (:mod:`fabric.client.local_reads`); NotFound from a server without the route (a hub)."""
        for at in range(0, len(ids), LOCAL_READS_BATCH):
            self._call("POST", f"/repos/{repo}/cache/local-reads", json={"ids": [c.hex() for c in ids[at : at + LOCAL_READS_BATCH]]})

    def read_stream(self, repo: str, ref: str, path: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        server, response = self._open_stream(
            "GET", f"/repos/{repo}/refs/{ref}/objects", params={"path": path}, headers=_byte_range(offset, length)
        )
        if not self.servers.multiple:
            return _stream(response)
        return self._resumed_stream(server, response, repo, path, offset, length)

    def _resumed_stream(
        self, server: str, response: httpx.Response, repo: str, path: str, offset: int, length: int | None
    ) -> Iterator[bytes]:
        """``response``'s body; where a server fails mid-way, the rest from the next server:
        from the byte it stopped at, of the commit the first answer named (none named: no resuming)."""
        commit = response.headers.get("X-Fabric-Commit")
        size = response.headers.get("Content-Length")
        want = int(size) if size is not None and size.isdigit() else length
        done = 0

        def read(response: httpx.Response) -> Iterator[bytes]:
            nonlocal done
            for piece in _stream(response):
                done += len(piece)
                yield piece

        def rest() -> tuple[str, httpx.Response] | None:
            if want is not None and done >= want:
                return None
            headers = _byte_range(offset + done, None if want is None else want - done)
            return self._open_stream("GET", f"/repos/{repo}/refs/{commit}/objects", params={"path": path}, headers=headers)

        return self._resumed(server, response, read, rest if commit is not None else None)

    def _resumed(
        self,
        server: str,
        response: httpx.Response,
        read: Callable[[httpx.Response], Iterator[_T]],
        rest: Callable[[], tuple[str, httpx.Response] | None] | None,
    ) -> Iterator[_T]:
        """``read(response)``; where a server fails mid-way (Unavailable), it is marked down and
        ``rest()`` asks the next one for what is left (None: nothing is). The failure is raised
        without ``rest``, or once every server of the list has failed in a row."""
        failures = 0
        while True:
            try:
                for item in read(response):
                    failures = 0
                    yield item
                return
            except errors.Unavailable as exc:
                self.servers.mark_down(server, exc.message)
                failures += 1
                if rest is None or failures >= len(self.servers.urls):
                    raise
            reopened = rest()
            if reopened is None:
                return
            server, response = reopened

    def put_object(
        self,
        repo: str,
        branch: str,
        path: str,
        stream: BinaryIO,
        mode: int = 0o644,
        mtime_ns: int | None = None,
        meta: Mapping[str, str] | None = None,
        durability: str | None = None,
    ) -> Entry:
        headers = {"X-Fabric-Mode": f"{mode:o}", "Content-Type": "application/octet-stream", **durability_header(durability)}
        if mtime_ns is not None:
            headers["X-Fabric-Mtime-Ns"] = str(mtime_ns)
        for key, value in (meta or {}).items():
            headers[f"X-Fabric-Meta-{key}"] = value

        def body() -> Iterator[bytes]:
            while piece := stream.read(1 << 20):
                yield piece

        start = _position(stream)

        def attempt(base: str) -> httpx.Response:
            if start is not None:
                stream.seek(start)
            url = f"{base}{API}/repos/{repo}/branches/{branch}/objects"
            return self.http.request("PUT", url, params={"path": path}, content=body(), headers=headers, timeout=self._slow)

        _, response = self._send(attempt, "PUT", repeatable=start is not None)
        raise_for_error(response)
        return entry_from_json(response.json())

    def stage(
        self, repo: str, branch: str, changes: Mapping[str, Entry | None], durability: str | None = None
    ) -> int | None:
        response = self._call(
            "POST",
            f"/repos/{repo}/branches/{branch}/entries",
            content=pack_changes(dict(changes)),
            headers={"Content-Type": MSGPACK, **durability_header(durability)},
            timeout=self._slow,
            repeatable=True,  # staging the same entries again changes nothing
        )
        seq = response.headers.get(STAGING_SEQ_HEADER)
        return int(seq) if seq is not None else None

    def stage_unless_newer(
        self, repo: str, branch: str, changes: Mapping[str, Entry | None], since_seq: int, since_head: str
    ) -> tuple[int, list[str]]:
        """Stage ``changes`` at a hub except the paths written on the branch since staging seq
        ``since_seq`` and head ``since_head`` (a replay never overwrites newer data, see
        :meth:`fabric.engine.engine.Engine.stage_unless_newer`): the staging seq and the paths left out."""
        response = self._call(
            "POST",
            f"/repos/{repo}/branches/{branch}/entries",
            content=pack_changes(dict(changes)),
            headers={"Content-Type": MSGPACK, STAGE_SINCE_HEADER: f"{since_seq} {since_head}"},
            timeout=self._slow,
        )
        body = response.json()
        return int(body["seq"]), list(body["skipped"])

    def delete_object(self, repo: str, branch: str, path: str, durability: str | None = None) -> None:
        self._call("DELETE", f"/repos/{repo}/branches/{branch}/objects", params={"path": path}, headers=durability_header(durability))

    def discard(self, repo: str, branch: str) -> None:
        self._call("DELETE", f"/repos/{repo}/branches/{branch}/changes", timeout=self._slow)

    # -- chunk exchange ------------------------------------------------------------
    def missing_chunks(
        self, ids: Sequence[bytes], durability: str | None = None, repo: str | None = None
    ) -> list[bytes]:
        out: list[bytes] = []
        unique = list(dict.fromkeys(ids))
        headers = durability_header(durability)
        for i in range(0, len(unique), MISSING_BATCH):
            batch = [c.hex() for c in unique[i : i + MISSING_BATCH]]
            reply = self._json(
                "POST", "/chunks/missing", json={"ids": batch}, headers=headers, params=_scope(repo), repeatable=True
            )
            out.extend(bytes.fromhex(c) for c in reply["missing"])
        return out

    def receive_pack(self, data: bytes, durability: str | None = None, repo: str | None = None) -> tuple[int, int]:
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(len(data)),
            **durability_header(durability),
        }
        body = _Body(data)
        try:
            # Chunks are content-addressed: a pack sent twice stores nothing twice.
            r = self._slow_json("POST", "/chunks/packs", content=body, headers=headers, params=_scope(repo), repeatable=True)
        finally:
            body.data = b""
        return r["chunks"], r["new"]

    def share_chunks(self, source_repo: str, repo: str, ids: Sequence[bytes]) -> None:
        for i in range(0, len(ids), MISSING_BATCH):
            batch = [c.hex() for c in ids[i : i + MISSING_BATCH]]
            body = {"source_repo": source_repo, "ids": batch}
            self._call("POST", f"/repos/{repo}/chunks/share", json=body, repeatable=True)

    def frames(self, ids: Sequence[bytes], repo: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Requests of at most :data:`FRAMES_BATCH` ids, one after another as the records are
        consumed; the first is sent now, so its errors (an unknown id) are raised here."""
        ids = list(ids)
        first = self._frames_batch(ids[:FRAMES_BATCH], repo)
        return itertools.chain(first, self._later_frames(ids[FRAMES_BATCH:], repo))

    def _later_frames(self, ids: list[bytes], repo: str | None) -> Iterator[tuple[bytes, bytes]]:
        for i in range(0, len(ids), FRAMES_BATCH):
            yield from self._frames_batch(ids[i : i + FRAMES_BATCH], repo)

    def _frames_batch(self, ids: list[bytes], repo: str | None) -> Iterator[tuple[bytes, bytes]]:
        server, response = self._frames_request(ids, repo)
        if not self.servers.multiple:
            return _records(response)
        return self._resumed_frames(server, response, ids, repo)

    def _frames_request(self, ids: list[bytes], repo: str | None) -> tuple[str, httpx.Response]:
        body = {"ids": [c.hex() for c in ids]}
        return self._open_stream("POST", "/chunks/frames", repeatable=True, json=body, params=_scope(repo))

    def _resumed_frames(
        self, server: str, response: httpx.Response, ids: list[bytes], repo: str | None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``response``'s records; where a server fails mid-way, the ids not yet received from the next."""
        got: set[bytes] = set()

        def read(response: httpx.Response) -> Iterator[tuple[bytes, bytes]]:
            for cid, frame in _records(response):
                got.add(cid)
                yield cid, frame

        def rest() -> tuple[str, httpx.Response] | None:
            left = [c for c in ids if c not in got]
            return self._frames_request(left, repo) if left else None

        return self._resumed(server, response, read, rest)

    def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for i in range(0, len(ids), OBJECT_BATCH):
            body = {"ids": list(ids[i : i + OBJECT_BATCH])}
            response = self._call("POST", "/objects/batch", json=body, repeatable=True)
            for oid, data in msgpack.unpackb(response.content, raw=False).items():
                out[oid] = data
        return out

    def staging_snapshot(
        self, repo: str, branch: str, since_seq: int = 0
    ) -> tuple[str, int, list[tuple[str, bytes | None]]]:
        response = self._call("GET", f"/repos/{repo}/branches/{branch}/staging", params={"since": since_seq})
        body = msgpack.unpackb(response.content, raw=False)
        return body["head"], body["seq"], [(p, e) for p, e in body["entries"]]

    def chunk_sink(self, repo: str | None = None) -> PipelinedSink:
        """New chunks go up as packs of only the frames the server lacks (for ``repo``), asked
        and uploaded in background threads (see :mod:`fabric.client.upload`)."""
        from fabric.client.upload import PipelinedSink  # chunker, hashes, zstd: only for writes (cheap CLI start-up)
        from fabric.format.ingest import PackSession

        return PipelinedSink(
            PackSession(
                lambda ids: self.missing_chunks(ids, repo=repo),
                lambda b: self.receive_pack(b.finish(), repo=repo),
                UPLOAD_PACK_SIZE,
                UPLOAD_FIRST_PACK_SIZE,
            )
        )

    # -- administration ------------------------------------------------------------
    def stats(self) -> dict:
        return self._json("GET", "/stats")

    def fsck(self, deep: bool = True, progress: Progress | None = None) -> dict:
        return self._slow_json("POST", "/admin/fsck", params={"deep": deep})

    def gc(self, grace: float | None = None, dry_run: bool = False, progress: Progress | None = None) -> dict:
        params: dict[str, Any] = {"dry_run": dry_run}
        if grace is not None:
            params["grace"] = grace
        return self._slow_json("POST", "/admin/gc", params=params)

    # -- ref watch stream (hub only) -----------------------------------------------
    def watch(self, since: int | None = None, read_timeout: float = 30.0) -> Iterator[dict]:
        """Ref change events as they happen (see hub/watch.py); ends when the connection does."""
        params = {} if since is None else {"since": since}
        timeout = httpx.Timeout(read_timeout, connect=self.timeouts.connect)
        _, response = self._open_stream("GET", "/watch", params=params, timeout=timeout)
        return _watch_events(_json_lines(response))

    # -- tokens (hub only) ---------------------------------------------------------
    def create_token(
        self, name: str, admin: bool = False, roles: Mapping[str, str] | None = None, rights: Sequence[str] = ()
    ) -> dict:
        body = {"name": name, "admin": admin, "roles": dict(roles or {}), "rights": list(rights)}
        return self._json("POST", "/tokens", json=body)

    def list_tokens(self) -> list[dict]:
        return self._json("GET", "/tokens")

    def revoke_token(self, token_id: str) -> None:
        self._call("DELETE", f"/tokens/{token_id}")

    def s3_signing_key(self, access_key_id: str, date: str, region: str, service: str) -> tuple[Principal, bytes]:
        """The SigV4 signing key of an S3 access key for one day, region and service, and its
        principal as this token may see it (a spoke's token: the ``spoke`` right)."""
        d = self._json(
            "GET", f"/auth/s3-signing-keys/{access_key_id}", params={"date": date, "region": region, "service": service}
        )
        return Principal.from_dict(d["principal"]), bytes.fromhex(d["key"])

    def s3_v2_check(self, access_key_id: str, strings_to_sign: Sequence[str], signature: str) -> Principal | None:
        """The principal of an S3 access key if ``signature`` signs one of ``strings_to_sign`` (SigV2), else None."""
        body = {"access_key_id": access_key_id, "strings_to_sign": list(strings_to_sign), "signature": signature}
        d = self._json("POST", "/auth/s3-v2-check", json=body, repeatable=True)
        return Principal.from_dict(d["principal"]) if d["match"] else None

    def whoami(self) -> dict:
        return self._json("GET", "/auth/whoami")

    # -- S3 bucket bindings --------------------------------------------------------
    def list_buckets(self) -> list[dict]:
        return self._json("GET", "/buckets")

    def get_bucket(self, name: str) -> dict:
        return self._json("GET", f"/buckets/{name}")

    def create_bucket(
        self, name: str, repo: str, ref: str, created_by_s3: bool = False, owner: str | None = None
    ) -> dict:
        """``owner``: as for :meth:`create_repo` (the caller whose role on ``repo`` is checked)."""
        body = {"name": name, "repo": repo, "ref": ref, "created_by_s3": created_by_s3}
        return self._json("POST", "/buckets", json=body, headers=_on_behalf(owner))

    def delete_bucket(self, name: str) -> None:
        self._call("DELETE", f"/buckets/{name}")


def _on_behalf(owner: str | None) -> dict[str, str]:
    return {} if owner is None else {"X-Fabric-On-Behalf-Of": owner}


def _byte_range(offset: int, length: int | None) -> dict[str, str]:
    """The ``Range`` header of ``length`` bytes (None: to the end) from ``offset``; none for all."""
    if not offset and length is None:
        return {}
    end = "" if length is None else str(offset + length - 1)
    return {"Range": f"bytes={offset}-{end}"}


def _position(stream: BinaryIO) -> int | None:
    """Where a seekable stream is (its body can be sent again from there); None if it is not."""
    try:
        return stream.tell() if stream.seekable() else None
    except (AttributeError, OSError, ValueError):
        return None


def _stream(response: httpx.Response) -> Iterator[bytes]:
    try:
        yield from response.iter_bytes(1 << 20)
    except httpx.TransportError as exc:
        raise errors.Unavailable(f"the download from {response.url.host} broke off: {exc}") from exc
    finally:
        response.close()


def _scope(repo: str | None) -> dict[str, str]:
    """The query parameters naming the repository a chunk exchange call is for."""
    return {} if repo is None else {"repo": repo}


def _watch_events(lines: Iterator[dict]) -> Iterator[dict]:
    """Watch stream events; an ``error`` line (the token was revoked) raises its error."""
    for event in lines:
        if event.get("type") == "error":
            error = errors.Unauthorized if event.get("code") == errors.Unauthorized.code else errors.Forbidden
            raise error(event.get("message", "the hub ended the watch stream"))
        yield event


def _json_lines(response: httpx.Response) -> Iterator[dict]:
    try:
        for line in response.iter_lines():
            if line.strip():
                yield json.loads(line)
    except httpx.TransportError as exc:
        raise errors.Unavailable(f"watch stream broke: {exc}") from exc
    finally:
        response.close()


def _records(response: httpx.Response) -> Iterator[tuple[bytes, bytes]]:
    """The ``(id, frame)`` records of a streamed ``frames`` response (:func:`~fabric.client.records.parse_records`)."""
    try:
        yield from parse_records(response.iter_bytes())
    except httpx.TransportError as exc:
        raise errors.Unavailable(f"the frame stream broke off: {exc}") from exc
    finally:
        response.close()
