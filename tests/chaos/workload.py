"""The clients of a soak: each a thread with its own random stream, its own branch, and every
call bounded by a timeout. Each records what it attempted and what came of it in the ledger.

Errors are sorted into those the documentation promises for a failure (a server away:
connection refused or reset, 502/503/504; a full spoke: 507/ENOSPC; a mount whose server is
away: EIO, or ENOTCONN when the mount process itself was killed; detected corruption: 500
with code ``corruption``) and the rest, which the soak reports as undocumented. A call that
runs into its client-side timeout (``HANG_S``) is a hang.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import threading
import time
import uuid

import httpx

from tests.chaos.ledger import ABSENT, CommitRecord, Ledger, digest

HANG_S = 90.0  # no client call may take longer (see docs/chaos.md for the budget it is made of)
REPO = "chaos"
VICTIM = "chaos-victim"
DOCUMENTED_STATUS = {502, 503, 504, 507}
DOCUMENTED_ERRNO = {errno.EIO, errno.ENOTCONN, errno.ENOSPC, errno.ECONNABORTED}
#: How old a read-only branch mount's view of a name may be: the kernel keeps a name's answer,
#: absent too, for the mount's --attr-timeout (1 s, fuse/libfuse.py) after the lookup that got
#: it, and that lookup may itself have waited on the spoke; 1 s + 2 s of margin.
MOUNT_NAME_LAG = 3.0
#: How long after its creation at the hub a tag may still be unknown at a spoke: a spoke answers
#: "no such ref" without asking the hub while its watch stream is live (something heard within
#: spoke.coherence.STREAM_SILENCE_LIMIT, 12 s), so an event still in flight (a stalled or slow
#: link, a hub paused just after answering) is not seen for up to that long; plus margin.
TAG_VISIBLE_S = 30.0
HTTP_TIMEOUT = httpx.Timeout(connect=5.0, read=HANG_S, write=HANG_S, pool=5.0)


def payload(rng: random.Random, tag: str, small: int = 1024, large: int = 96 * 1024) -> bytes:
    size = rng.randint(small, large) if rng.random() < 0.9 else rng.randint(large, max(large, 512 * 1024))
    head = f"chaos|{tag}|".encode()
    return head + rng.randbytes(max(0, size - len(head)))


class Client(threading.Thread):
    kind = "client"

    def __init__(self, name: str, ledger: Ledger, seed: int, stop: threading.Event) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.client = name
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.stop_event = stop
        self.seq = 0
        self.busy_since: float | None = None
        self.busy_what = ""
        self.pace = (0.1, 0.4)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.step()
            except Exception as exc:  # a bug of the harness or an unexpected error type: report it, go on
                self.ledger.error(self.kind, f"harness:{type(exc).__name__}", False, repr(exc))
                time.sleep(0.5)
            self.stop_event.wait(self.rng.uniform(*self.pace))

    def step(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def timed(self, what: str):
        self.busy_since, self.busy_what = time.monotonic(), what
        try:
            yield
        finally:
            took = time.monotonic() - self.busy_since
            self.busy_since = None
            self.ledger.latency(f"{self.client} {what}", took)
            if took > HANG_S:
                self.ledger.hangs.append(f"{self.client} {what} took {took:.1f}s")

    def tag(self) -> str:
        self.seq += 1
        return f"{self.client}:{self.seq}:{uuid.uuid4().hex[:8]}"

    # -- errors --------------------------------------------------------------------------
    def http_error(self, exc: Exception | httpx.Response, corruption_ok: bool = False) -> None:
        if isinstance(exc, httpx.Response):
            body = exc.text[:300]
            if exc.status_code in DOCUMENTED_STATUS:
                self.ledger.error(self.kind, str(exc.status_code), True)
            elif exc.status_code == 500 and '"corruption"' in body:
                self.ledger.error(self.kind, "500-corruption", corruption_ok, body)
            else:
                self.ledger.error(self.kind, str(exc.status_code), False, body)
        elif isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
            self.ledger.error(self.kind, type(exc).__name__, False, "client timeout: a hang")
            self.ledger.hangs.append(f"{self.client}: {type(exc).__name__} after {HANG_S}s")
        elif isinstance(exc, httpx.TransportError):
            self.ledger.error(self.kind, type(exc).__name__, True)
        else:
            raise exc

    def os_error(self, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.ledger.error(self.kind, name, exc.errno in DOCUMENTED_ERRNO, str(exc))


class Rest:
    """Minimal REST calls (bounded by HTTP_TIMEOUT)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                                 timeout=HTTP_TIMEOUT)

    def get(self, repo: str, ref: str, path: str) -> httpx.Response:
        return self.http.get(f"/repos/{repo}/refs/{ref}/objects", params={"path": path})

    def put(self, repo: str, branch: str, path: str, data: bytes, durability: str) -> httpx.Response:
        return self.http.put(f"/repos/{repo}/branches/{branch}/objects", params={"path": path}, content=data,
                             headers={"X-Fabric-Durability": durability, "Content-Type": "application/octet-stream"})

    def delete(self, repo: str, branch: str, path: str, durability: str) -> httpx.Response:
        return self.http.delete(f"/repos/{repo}/branches/{branch}/objects", params={"path": path},
                                headers={"X-Fabric-Durability": durability})

    def close(self) -> None:
        self.http.close()


def place(where: str) -> str:
    """The place a read was made at, as a write's durability names it: every hub process of one
    catalog is "hub" (hub, hub-1)."""
    return "hub" if where.startswith("hub") else where


def unknown_ref(r: httpx.Response | None) -> bool:
    """Whether a 404 says the ref (branch, tag or commit) is unknown, not the path absent."""
    if r is None or r.status_code != 404:
        return False
    try:
        return r.json()["error"]["message"].startswith("no branch, tag or commit")
    except (ValueError, KeyError, TypeError):
        return False


def read_value(r: httpx.Response) -> str | None:
    """The digest a GET answered (ABSENT for 404), or None when it is an error."""
    if r.status_code == 200:
        return digest(r.content)
    if r.status_code == 404:
        return ABSENT
    return None


# -- a --rw mount writing, renaming, fsyncing at local durability ------------------------------
class MountWriter(Client):
    kind = "mount"

    def __init__(self, name, ledger, seed, stop, mount, branch: str, home: str) -> None:
        super().__init__(name, ledger, seed, stop)
        self.mount, self.branch, self.home = mount, branch, home
        self.root: tuple[int, int] | None = None
        self.files = 30

    def key(self, name: str):
        return (REPO, self.branch, name)

    def fd(self) -> int | None:
        if self.root is not None and self.root[0] != self.mount.generation:
            with contextlib.suppress(OSError):
                os.close(self.root[1])
            self.root = None
        if self.root is None:
            try:
                self.root = self.mount.open_root()
            except OSError:
                self.root = None
        return self.root[1] if self.root else None

    def dead_session(self, exc: OSError) -> None:
        self.os_error(exc)
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED) and self.root is not None:
            with contextlib.suppress(OSError):
                os.close(self.root[1])
            self.root = None
            time.sleep(0.5)

    def write_file(self, root: int, name: str, data: bytes, kind: str) -> bool:
        op = self.ledger.begin(self.client, kind, self.key(name), digest(data), "local", self.home)
        ok = False
        with self.timed(f"write+fsync {name}"):
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=root)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view[: 1 << 20]):]
                    os.fsync(fd)
                    self.ledger.end(op, "ok")
                    ok = True
                finally:
                    os.close(fd)
            except OSError as exc:
                if not ok:
                    self.ledger.end(op, "unknown")
                self.dead_session(exc)
                return False
        self.ledger.ops_done["mount-write"] += 1
        return ok

    def step(self) -> None:
        root = self.fd()
        if root is None:
            time.sleep(0.3)
            return
        r = self.rng.random()
        name = f"f{self.rng.randrange(self.files)}"
        if r < 0.45:
            self.write_file(root, name, payload(self.rng, self.tag()), "put")
        elif r < 0.7:  # write a temporary name, fsync, rename over the target (the atomic-replace idiom)
            tmp = f"tmp-{self.seq}"
            data = payload(self.rng, self.tag())
            if not self.write_file(root, tmp, data, "put"):
                return
            out = self.ledger.begin(self.client, "rename-out", self.key(tmp), ABSENT, "local", self.home)
            into = self.ledger.begin(self.client, "rename-in", self.key(name), digest(data), "local", self.home)
            with self.timed(f"rename {tmp} {name}"):
                try:
                    os.rename(tmp, name, src_dir_fd=root, dst_dir_fd=root)
                    status = "ok"
                except OSError as exc:
                    status = "unknown"
                    self.dead_session(exc)
            self.ledger.end(out, status)
            self.ledger.end(into, status)
            self.ledger.ops_done["mount-rename"] += 1
        elif r < 0.8:
            op = self.ledger.begin(self.client, "delete", self.key(name), ABSENT, "local", self.home)
            with self.timed(f"unlink {name}"):
                try:
                    os.unlink(name, dir_fd=root)
                    self.ledger.end(op, "ok")
                except FileNotFoundError:
                    self.ledger.end(op, "ok")  # absent before and after
                except OSError as exc:
                    self.ledger.end(op, "unknown")
                    self.dead_session(exc)
            self.ledger.ops_done["mount-unlink"] += 1
        else:
            t0 = time.monotonic()
            with self.timed(f"read {name}"):
                try:
                    fd = os.open(name, os.O_RDONLY, dir_fd=root)
                    try:
                        chunks = []
                        while piece := os.read(fd, 1 << 20):
                            chunks.append(piece)
                        got = digest(b"".join(chunks))
                    finally:
                        os.close(fd)
                except FileNotFoundError:
                    got = ABSENT
                except OSError as exc:
                    self.dead_session(exc)
                    return
            self.ledger.check_read(f"mount-read {self.client}", self.key(name), t0, time.monotonic(), got, True)
            self.ledger.ops_done["mount-read"] += 1


# -- S3: PUT, multipart, DELETE, conditional PUT, GET -----------------------------------------------
class S3Client(Client):
    kind = "s3"

    def __init__(self, name, ledger, seed, stop, s3_url: str, creds: dict, branch: str, home: str) -> None:
        super().__init__(name, ledger, seed, stop)
        import boto3
        from botocore.config import Config

        self.s3 = boto3.client(
            "s3", endpoint_url=s3_url, aws_access_key_id=creds["s3_access_key_id"],
            aws_secret_access_key=creds["s3_secret_access_key"], region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
                          connect_timeout=5, read_timeout=HANG_S),
        )
        self.branch, self.home = branch, home
        self.conditional = 0

    def key(self, path: str):
        return (REPO, self.branch, path)

    def s3_error(self, exc: Exception) -> str:
        """Record an error; the outcome: 'unknown', or 'failed' for a 412."""
        from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

        if isinstance(exc, ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = exc.response.get("Error", {}).get("Code", "")
            if status == 412:
                return "failed"
            self.ledger.error(self.kind, f"{status}:{code}", status in DOCUMENTED_STATUS, str(exc)[:300])
        elif isinstance(exc, ReadTimeoutError) and not isinstance(exc, ConnectTimeoutError):
            self.ledger.error(self.kind, "ReadTimeout", False, "client timeout: a hang")
            self.ledger.hangs.append(f"{self.client}: S3 read timeout after {HANG_S}s")
        else:
            self.ledger.error(self.kind, type(exc).__name__, True)
        return "unknown"

    def put(self, path: str, data: bytes, kind: str = "put", **extra) -> str:
        op = self.ledger.begin(self.client, kind, self.key(path), digest(data), "local", self.home)
        with self.timed(f"{kind} {path}"):
            try:
                self.s3.put_object(Bucket=REPO, Key=f"{self.branch}/{path}", Body=data, **extra)
                status = "ok"
            except Exception as exc:
                status = self.s3_error(exc)
        self.ledger.end(op, status)
        self.ledger.ops_done[f"s3-{kind}"] += 1
        return status

    def step(self) -> None:
        r = self.rng.random()
        path = f"o{self.rng.randrange(30)}"
        if r < 0.4:
            self.put(path, payload(self.rng, self.tag()))
        elif r < 0.48:
            self.multipart(path)
        elif r < 0.58:
            op = self.ledger.begin(self.client, "delete", self.key(path), ABSENT, "local", self.home)
            with self.timed(f"delete {path}"):
                try:
                    self.s3.delete_object(Bucket=REPO, Key=f"{self.branch}/{path}")
                    status = "ok"
                except Exception as exc:
                    status = self.s3_error(exc)
            self.ledger.end(op, status)
            self.ledger.ops_done["s3-delete"] += 1
        elif r < 0.7:
            self.conditional += 1
            fresh = f"c{self.conditional}"
            status = self.put(fresh, payload(self.rng, self.tag()), "cond-put", IfNoneMatch="*")
            if status == "failed":
                self.ledger.violation("conditional", f"If-None-Match: * on the new key {fresh} answered 412")
        elif r < 0.76 and self.conditional:
            # the same condition on a key it created: must be refused unless that creation is unknown
            old = f"c{self.rng.randint(1, self.conditional)}"
            hist = self.ledger.history(self.key(old))
            status = self.put(old, payload(self.rng, self.tag()), "cond-put", IfNoneMatch="*")
            if status == "ok" and hist and all(op.status == "ok" for op in hist):
                self.ledger.violation("conditional", f"If-None-Match: * overwrote the existing key {old}")
        else:
            t0 = time.monotonic()
            with self.timed(f"get {path}"):
                try:
                    body = self.s3.get_object(Bucket=REPO, Key=f"{self.branch}/{path}")["Body"].read()
                    got = digest(body)
                except Exception as exc:
                    from botocore.exceptions import ClientError

                    if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "NoSuchKey":
                        got = ABSENT
                    else:
                        self.s3_error(exc)
                        return
            self.ledger.check_read(f"s3-get {self.client}", self.key(path), t0, time.monotonic(), got, True)
            self.ledger.ops_done["s3-get"] += 1

    def multipart(self, path: str) -> None:
        first = payload(self.rng, self.tag(), 5 << 20, 5 << 20)[: 5 << 20]
        first += b"\0" * ((5 << 20) - len(first))
        second = payload(self.rng, self.tag())
        op = self.ledger.begin(self.client, "multipart", self.key(path), digest(first + second), "local", self.home)
        key = f"{self.branch}/{path}"
        with self.timed(f"multipart {path}"):
            try:
                up = self.s3.create_multipart_upload(Bucket=REPO, Key=key)["UploadId"]
                parts = []
                for n, body in ((1, first), (2, second)):
                    etag = self.s3.upload_part(Bucket=REPO, Key=key, UploadId=up, PartNumber=n, Body=body)["ETag"]
                    parts.append({"PartNumber": n, "ETag": etag})
                self.s3.complete_multipart_upload(Bucket=REPO, Key=key, UploadId=up, MultipartUpload={"Parts": parts})
                status = "ok"
            except Exception as exc:
                status = self.s3_error(exc)
        self.ledger.end(op, status)
        self.ledger.ops_done["s3-multipart"] += 1


# -- REST: objects and commits on a branch, tags ------------------------------------------------
class RestCommitter(Client):
    kind = "rest"

    def __init__(self, name, ledger, seed, stop, url: str | list[str], token: str, branch: str, durability: str,
                 home: str) -> None:
        """``url``: a list for several hub processes of one catalog; each step goes to one of them."""
        super().__init__(name, ledger, seed, stop)
        self.rests = [Rest(u, token) for u in ([url] if isinstance(url, str) else url)]
        self.rest = self.rests[0]
        self.branch, self.durability, self.home = branch, durability, home
        self.pace = (0.3, 0.8)
        self.pending: list[CommitRecord] = []

    def key(self, path: str):
        return (REPO, self.branch, path)

    def call(self, what: str, fn):
        with self.timed(what):
            try:
                r = fn()
            except httpx.HTTPError as exc:
                self.http_error(exc)
                return None
        return r

    def step(self) -> None:
        if len(self.rests) > 1:
            self.rest = self.rests[self.rng.randrange(len(self.rests))]
        for _ in range(self.rng.randint(1, 2)):
            path = f"p{self.rng.randrange(20)}"
            if self.rng.random() < 0.15:
                data, fn = None, (lambda p=path: self.rest.delete(REPO, self.branch, p, self.durability))
            else:
                data = payload(self.rng, self.tag())
                fn = (lambda p=path, d=data: self.rest.put(REPO, self.branch, p, d, self.durability))
            op = self.ledger.begin(self.client, "put" if data else "delete", self.key(path), digest(data),
                                   self.durability, self.home)
            r = self.call(f"put {path}", fn)
            if r is not None and r.status_code in (200, 201, 204) or (r is not None and data is None and r.status_code == 404):
                self.ledger.end(op, "ok")
            else:
                self.ledger.end(op, "unknown")
                if r is not None:
                    self.http_error(r)
            self.ledger.ops_done["rest-put" if data else "rest-delete"] += 1
        self.commit()

    def commit(self) -> None:
        token = uuid.uuid4().hex
        rec = CommitRecord((REPO, self.branch), None, token, time.monotonic(), None, "pending")
        r = self.call("commit", lambda: self.rest.http.post(
            f"/repos/{REPO}/branches/{self.branch}/commits",
            json={"message": "chaos", "metadata": {"chaos-op": token}, "allow_empty": True}))
        rec.t_done = time.monotonic()
        if r is not None and r.status_code == 201:
            rec.id, rec.status = r.json()["id"], "ok"
        else:
            rec.status = "unknown"
            if r is not None:
                self.http_error(r)
        rec.snapshot = self.ledger.snapshot(rec.branch, rec.t_invoke, rec.t_done)
        with self.ledger.lock:
            self.ledger.commits.append(rec)
        self.ledger.ops_done["rest-commit"] += 1
        if rec.status == "ok" and self.rng.random() < 0.35:
            name = f"t-{self.branch}-{len(self.ledger.commits)}"
            r = self.call("tag", lambda: self.rest.http.post(f"/repos/{REPO}/tags", json={"name": name, "ref": rec.id}))
            rec.tag_t_done = time.monotonic()
            if r is not None and r.status_code == 201:
                rec.tag, rec.tag_status = name, "ok"
            else:
                rec.tag, rec.tag_status = name, "unknown"
                if r is not None:
                    self.http_error(r)
            self.ledger.ops_done["rest-tag"] += 1


# -- readers: commits, tags, branches through REST, S3 and a read-only mount ---------------------------
class Reader(Client):
    kind = "reader"

    def __init__(self, name, ledger, seed, stop, places: dict[str, str], token: str, s3: S3Client | None,
                 ro_mount=None, ro_branch: str = "", victim: dict[str, bytes] | None = None,
                 corrupt: threading.Event | None = None) -> None:
        super().__init__(name, ledger, seed, stop)
        self.places = {k: Rest(u, token) for k, u in places.items()}  # hub, spoke-a, spoke-b
        self.s3 = s3
        self.ro_mount, self.ro_branch = ro_mount, ro_branch
        self.victim = victim or {}
        self.corrupt = corrupt or threading.Event()
        self.pace = (0.05, 0.2)
        self.last: httpx.Response | None = None  # the last REST answer (for explanations)
        self.last_s3 = ""

    def rest_read(self, where: str, repo: str, ref: str, path: str) -> tuple[str | None, float, float]:
        t0 = time.monotonic()
        with self.timed(f"get {where} {ref}/{path}"):
            try:
                r = self.places[where].get(repo, ref, path)
            except httpx.HTTPError as exc:
                self.http_error(exc)
                return None, t0, time.monotonic()
        self.last = r
        got = read_value(r)
        if got is None:
            self.http_error(r, corruption_ok=repo == VICTIM)
        return got, t0, time.monotonic()

    def step(self) -> None:
        r = self.rng.random()
        where = self.rng.choice(sorted(self.places))
        if r < 0.3:  # a branch path, strict where it was written, weak elsewhere
            keys = self.ledger.keys()
            if not keys:
                return
            key = self.rng.choice(keys)
            home = self.ledger.history(key)[0].home
            got, t0, t1 = self.rest_read(where, key[0], key[1], key[2])
            if got is not None:
                self.ledger.check_read(f"rest-branch {where}", key, t0, t1, got, strict=place(where) == home)
            self.ledger.ops_done["read-branch"] += 1
        elif r < 0.6:  # a path of an acknowledged commit, by id or by tag, through REST or S3
            with self.ledger.lock:
                done = [c for c in self.ledger.commits if c.status == "ok" and c.snapshot]
            if not done:
                return
            rec = self.rng.choice(done)
            path = self.rng.choice(sorted(rec.snapshot))
            ref = rec.tag if rec.tag and rec.tag_status == "ok" and self.rng.random() < 0.5 else rec.id
            self.last, self.last_s3 = None, ""
            t0 = time.monotonic()
            tag_age = t0 - rec.tag_t_done if ref == rec.tag and rec.tag_t_done is not None else None
            if self.s3 is not None and self.rng.random() < 0.3:
                # S3 answers NoSuchKey for a ref the spoke does not know yet as for an absent path:
                # only tags old enough to be known everywhere are read through it.
                if tag_age is not None and tag_age < TAG_VISIBLE_S:
                    ref, tag_age = rec.id, None
                got = self.s3_read(f"{ref}/{path}")
                where = "s3"
            else:
                got, _, _ = self.rest_read(where, REPO, ref, path)
            if got == ABSENT and where != "s3" and unknown_ref(self.last):
                # Not the path's absence: the ref is not known there (yet).
                if tag_age is not None and place(where) != "hub" and tag_age < TAG_VISIBLE_S:
                    with self.ledger.lock:
                        self.ledger.counts["tags_not_yet_seen"] += 1
                        self.ledger.tag_unseen_max = max(self.ledger.tag_unseen_max, tag_age)
                else:
                    self.ledger.violation("stale_reads", f"commit {rec.id}: ref {ref} unknown at {where}; "
                                          + self.explain(rec, ref, path, where, t0))
            elif got is not None and got not in rec.snapshot[path]:
                self.ledger.violation("wrong_reads", f"commit {rec.id} ({ref}) {path} at {where}: {got[:12]}; "
                                      + self.explain(rec, ref, path, where, t0))
            with self.ledger.lock:
                self.ledger.reads["commit"] += 1
            self.ledger.ops_done["read-commit"] += 1
        elif r < 0.75 and self.ro_mount is not None:
            self.mount_read()
        elif r < 0.85 and self.victim:
            path = self.rng.choice(sorted(self.victim))
            got, _, _ = self.rest_read(where, VICTIM, "main", path)
            if got is not None and got != digest(self.victim[path]):
                self.ledger.violation("wrong_reads", f"victim {path} at {where}: wrong bytes")
            self.ledger.ops_done["read-victim"] += 1
        else:  # a listing of a branch: every name listed must be one some client wrote
            keys = self.ledger.keys()
            if not keys:
                return
            branch = self.rng.choice(keys)[1]
            with self.timed(f"list {where} {branch}"):
                try:
                    resp = self.places[where].http.get(f"/repos/{REPO}/refs/{branch}/list", params={"limit": 1000})
                except httpx.HTTPError as exc:
                    self.http_error(exc)
                    return
            if resp.status_code != 200:
                if resp.status_code != 404:
                    self.http_error(resp)
                return
            # Names invoked while the listing ran are in it too: the ledger as of its end.
            known = {k[2] for k in self.ledger.keys() if k[1] == branch}
            for e in resp.json()["entries"]:
                if e["path"] not in known:
                    self.ledger.violation("wrong_reads", f"listing of {branch} at {where} shows {e['path']!r}")
            self.ledger.ops_done["list"] += 1

    def explain(self, rec: CommitRecord, ref: str, path: str, where: str, t0: float) -> str:
        """What the ledger knows of a commit read that failed its check, and what the places answer now."""
        led, base = self.ledger, rec.t_invoke
        r = self.last
        parts = [f"soak time {t0 - led.t_start:.1f}s: read at +{t0 - base:.2f}s after the commit's invocation (commit done +{(rec.t_done or 0) - base:.2f}s,"
                 f" tag {rec.tag} {rec.tag_status} done +{(rec.tag_t_done or base) - base:.2f}s)"]
        if where == "s3":
            parts.append(f"s3 answer {self.last_s3}")
        elif r is not None:
            parts.append(f"answer {r.status_code} commit={r.headers.get('X-Fabric-Commit')} "
                         f"stale={r.headers.get('X-Fabric-Stale')} body={r.text[:160]!r}")
        parts.append(f"allowed {sorted(v[:12] for v in rec.snapshot[path])}")
        hist = led.history((REPO, rec.branch[1], path))
        parts.append("history " + "; ".join(
            f"#{op.id} {op.kind} {op.value[:12]} {op.status} +{op.t_invoke - base:.2f}..+{(op.t_done or 0) - base:.2f}"
            for op in hist if op.t_invoke < (rec.t_done or base) + 5)[-900:])
        for again, rest in (("hub", self.places["hub"]), (where, self.places.get(where))):
            if rest is None:
                continue
            for name in dict.fromkeys((rec.id, ref)):
                with contextlib.suppress(httpx.HTTPError):
                    a = rest.get(REPO, name, path)
                    parts.append(f"now {again}@{name[:16]}: {a.status_code} {(read_value(a) or '?')[:12]}")
        return " | ".join(parts)

    def s3_read(self, key: str) -> str | None:
        from botocore.exceptions import ClientError

        with self.timed(f"s3 get {key}"):
            try:
                return digest(self.s3.s3.get_object(Bucket=REPO, Key=key)["Body"].read())
            except ClientError as exc:
                self.last_s3 = str(exc.response.get("Error"))[:200]
                if exc.response.get("Error", {}).get("Code") == "NoSuchKey":
                    return ABSENT
                self.s3.s3_error(exc)
            except Exception as exc:
                self.s3.s3_error(exc)
        return None

    def mount_read(self) -> None:
        m = self.ro_mount
        keys = [k for k in self.ledger.keys() if k[1] == self.ro_branch]
        if not keys or not m.up:
            return
        key = self.rng.choice(keys)
        home = self.ledger.history(key)[0].home
        t0 = time.monotonic()
        with self.timed(f"ro-mount read {key[2]}"):
            try:
                with open(os.path.join(m.mountpoint, key[2]), "rb") as f:
                    got = digest(f.read())
            except FileNotFoundError:
                got = ABSENT
            except OSError as exc:
                self.os_error(exc)
                return
        if not m.up:  # killed meanwhile: what was read may be the bare directory's (nothing)
            return
        self.ledger.check_read("mount-ro", key, t0, time.monotonic(), got, strict=home == "spoke-b", lag=MOUNT_NAME_LAG)
        self.ledger.ops_done["read-mount"] += 1
