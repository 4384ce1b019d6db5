"""Several hub processes over one PostgreSQL catalog and one S3 pack store (moto).

Everything a request needs afterwards is in the catalog, so any hub answers it:
the watch stream (every event once, in commit order), multipart uploads, conditional
writes, tokens and bucket bindings. A hub killed mid-upload loses nothing once the
client retries on the other.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from botocore.exceptions import ClientError

from fabric.catalog import Catalog, Database
from fabric.catalog.uploads import UploadStore
from fabric.errors import BadRequest, Conflict
from tests.hubserver import unique_name
from tests.multihub import Backing, backing
from tests.s3_fixtures import error_code, error_status
from tests.s3_helpers import Creds, S3Hub

MiB = 1 << 20

# -- the watch stream's order, at the catalog ---------------------------------------------------


def test_events_commit_in_seq_order(db_url: str) -> None:
    """A transaction that wrote an event and has not committed holds back every later
    event: a reader going by ``seq > last`` never skips the slower one."""
    first, second = Catalog(Database(db_url)), Catalog(Database(db_url))
    first.create_repo("r", "main", "c0")
    start = first.last_event_seq()
    inserted, release = threading.Event(), threading.Event()

    def slow_writer() -> None:
        with first.db.tx() as cur:
            first._event(cur, "r", "branch", "slow", None, "c1")
            inserted.set()
            release.wait(10)

    def fast_writer() -> None:
        second.create_ref("r", "branch", "fast", "c2")

    slow = threading.Thread(target=slow_writer)
    slow.start()
    assert inserted.wait(10)
    fast = threading.Thread(target=fast_writer)
    fast.start()
    fast.join(0.5)  # it waits for `slow`: event seqs are taken under a lock held until commit
    seen, last = [], start
    for _ in range(2):
        for row in second.events_after(last):
            seen.append((row[0], row[3]))
            last = row[0]
        release.set()
        slow.join(10)
        fast.join(10)
    assert sorted(name for _, name in seen) == ["fast", "slow"], f"a reader following seq > last saw {seen}"
    assert [s for s, _ in seen] == [start + 1, start + 2]
    first.db.close()
    second.db.close()


def test_upload_store_in_the_catalog(db_url: str) -> None:
    """Multipart state in a catalog, on both backends: (key, id) order under a prefix, parts
    replaced by number, none recorded for an upload that is gone, completions remembered."""
    store = UploadStore(Catalog(Database(db_url)).db)
    ids = [store.create("b", k, "r", "main", k, {"m": "1"}, "me") for k in ("b/2", "a/1", "b/2", "c")]
    store.put_part(ids[0], 1, "e1", 7, [(b"\2" * 32, 7)])
    store.put_part(ids[0], 1, "e1b", 8, [(b"\3" * 32, 8)])
    assert [(p.number, p.etag, p.size) for p in store.parts(ids[0])] == [(1, "e1b", 8)]
    assert store.part_chunks(ids[0])[1][2] == [(b"\3" * 32, 8)]
    assert [u.key for u in store.list("b", prefix="b/")] == ["b/2", "b/2"]
    lo, hi = sorted((ids[0], ids[2]))
    assert [u.id for u in store.list("b", key_marker="b/2", id_marker=lo)] == [hi, ids[3]]
    assert [u.key for u in store.list("b", key_marker="a/1", limit=1)] == ["b/2", "b/2"]  # limit + 1: truncated
    assert store.delete(ids[1]) and not store.delete(ids[1])
    store.put_part(ids[1], 1, "late", 1, [])  # a part arriving after an abort records nothing
    assert store.parts(ids[1]) == []
    store.complete(store.get(ids[0]), "etag-1", 5)
    assert store.get(ids[0]) is None and store.parts(ids[0]) == [] and store.completed(ids[0]).etag == "etag-1"
    store.db.close()


# -- two hubs over one PostgreSQL catalog and one S3 pack store -----------------------------------


@dataclass
class Deployment(Backing):
    a: S3Hub
    b: S3Hub
    creds: Creds  # an admin key pair, valid at every hub

    def s3(self, hub: S3Hub):
        return hub.boto3(self.creds)

    def new_repo(self, stem: str) -> str:
        """A fresh repository (created through hub A)."""
        name = unique_name(stem)
        self.a.plane().create_repo(name)
        return name


@pytest.fixture(scope="module")
def two_hubs(pg_server: str, s3_endpoint: str, tmp_path_factory) -> Iterator[Deployment]:
    with backing(pg_server, s3_endpoint, tmp_path_factory, "multihub") as back:
        with back.start_hub("a") as a, back.start_hub("b") as b:
            yield Deployment(back.db, back.store, back.tmp, a, b, a.token(admin=True, name="multi-admin"))


def _watch(hub: S3Hub, repo: str, since: int, stop: threading.Event, out: list[dict]) -> None:
    """Record every event line of hub's watch stream for ``repo`` until ``stop``."""
    with hub.rest() as client, client.stream("GET", "/api/v1/watch", params={"since": since, "repo": repo}, timeout=None) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            msg = json.loads(line)
            assert msg.get("type") not in ("resync", "error"), msg
            if "type" not in msg:
                out.append(msg)
            if stop.is_set():
                return


def _commit(plane, repo: str, branch: str, message: str) -> str | None:
    """Commit what is staged (retrying when another commit moved the head); None when
    another writer's commit already took the staged changes."""
    for _ in range(200):
        try:
            return plane.commit(repo, branch, message).id
        except Conflict:
            time.sleep(0.01)
        except BadRequest as exc:
            if "nothing to commit" in exc.message:
                return None
            raise
    raise AssertionError(f"{message}: no commit landed in 200 tries")


@pytest.mark.postgres
def test_watch_on_a_sees_commits_through_both_hubs_in_order(two_hubs: Deployment) -> None:
    d = two_hubs
    repo = d.new_repo("watch")
    since = Catalog(Database(d.db, pool_size=1)).last_event_seq()
    stop, events = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(d.a, repo, since, stop, events), daemon=True)
    watcher.start()
    branches = [f"w{i}" for i in range(8)]
    for name in branches:
        d.a.plane().create_branch(repo, name, "main")
    made: dict[str, list[str]] = {name: [] for name in branches}

    def writer(i: int) -> None:
        hub = d.a if i % 2 == 0 else d.b
        plane = hub.plane(d.creds.token)
        for k in range(6):
            plane.put_object(repo, branches[i], f"f{k}", io.BytesIO(f"{i}-{k}".encode()))
            made[branches[i]].append(plane.commit(repo, branches[i], f"w{i} c{k}").id)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(writer, range(8)))
    final = Catalog(Database(d.db, pool_size=1)).last_event_seq()
    deadline = time.monotonic() + 20
    while (not events or events[-1]["seq"] < final) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)), "events repeated or out of order"
    assert seqs == list(range(since + 1, final + 1)), "the watcher missed events"
    for name in branches:
        moves = [e for e in events if e["kind"] == "branch" and e["name"] == name]
        assert [e["new"] for e in moves[1:]] == made[name]  # the first is the branch's creation
        assert all(prev["new"] == nxt["old"] for prev, nxt in zip(moves, moves[1:], strict=False))


@pytest.mark.postgres
def test_multipart_upload_started_on_a_completes_on_b(two_hubs: Deployment) -> None:
    d = two_hubs
    repo = d.new_repo("mp")
    sa, sb = d.s3(d.a), d.s3(d.b)
    key = "main/big.bin"
    bodies = [os.urandom(5 * MiB), os.urandom(5 * MiB), b"tail"]
    up = sa.create_multipart_upload(Bucket=repo, Key=key)["UploadId"]
    etags = [sa.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=bodies[0])["ETag"]]
    assert [u["UploadId"] for u in sb.list_multipart_uploads(Bucket=repo)["Uploads"]] == [up]
    for n, body in enumerate(bodies[1:], 2):
        etags.append(sb.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=n, Body=body)["ETag"])
    assert [p["PartNumber"] for p in sa.list_parts(Bucket=repo, Key=key, UploadId=up)["Parts"]] == [1, 2, 3]
    parts = {"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]}
    done = sb.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload=parts)
    assert done["ETag"].endswith('-3"')
    assert sa.get_object(Bucket=repo, Key=key)["Body"].read() == b"".join(bodies)
    # The completion is remembered at every hub: a repeat through A answers the same ETag.
    again = sa.complete_multipart_upload(Bucket=repo, Key=key, UploadId=up, MultipartUpload=parts)
    assert again["ETag"] == done["ETag"]
    assert "Uploads" not in sa.list_multipart_uploads(Bucket=repo)
    # An upload aborted through B takes no more parts through A.
    up2 = sb.create_multipart_upload(Bucket=repo, Key="main/other")["UploadId"]
    sb.abort_multipart_upload(Bucket=repo, Key="main/other", UploadId=up2)
    with pytest.raises(ClientError) as exc:
        sa.upload_part(Bucket=repo, Key="main/other", UploadId=up2, PartNumber=1, Body=b"x")
    assert error_code(exc) == "NoSuchUpload"


@pytest.mark.postgres
def test_conditional_writes_atomic_across_hubs(two_hubs: Deployment) -> None:
    d = two_hubs
    repo = d.new_repo("cond")
    clients = [d.s3(d.a), d.s3(d.b)]
    barrier = threading.Barrier(2, timeout=30)

    def put_new(i: int, key: str) -> bool:
        barrier.wait()
        try:
            clients[i].put_object(Bucket=repo, Key=key, Body=f"writer {i}".encode(), IfNoneMatch="*")
            return True
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "PreconditionFailed"
            return False

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for r in range(15):
            key = f"main/once-{r}"
            won = list(pool.map(put_new, range(2), [key, key]))
            assert sum(won) == 1, f"round {r}: {won}"
            body = clients[1].get_object(Bucket=repo, Key=key)["Body"].read()
            assert body == f"writer {won.index(True)}".encode()
    # If-Match with an ETag that a write through A made stale: 412 through B, nothing written.
    sa, sb = clients
    old = sb.put_object(Bucket=repo, Key="main/m", Body=b"v1")["ETag"]
    new = sa.put_object(Bucket=repo, Key="main/m", Body=b"v2")["ETag"]
    with pytest.raises(ClientError) as exc:
        sb.put_object(Bucket=repo, Key="main/m", Body=b"v3", IfMatch=old)
    assert error_status(exc) == 412
    assert sb.get_object(Bucket=repo, Key="main/m")["Body"].read() == b"v2"
    sb.put_object(Bucket=repo, Key="main/m", Body=b"v3", IfMatch=new)
    # Across protocols: a REST write through A is what an S3 If-None-Match through B sees.
    d.a.plane().put_object(repo, "main", "rest.txt", io.BytesIO(b"rest"))
    with pytest.raises(ClientError) as exc:
        sb.put_object(Bucket=repo, Key="main/rest.txt", Body=b"s3", IfNoneMatch="*")
    assert error_code(exc) == "PreconditionFailed"


@pytest.mark.postgres
def test_tokens_and_buckets_are_read_from_the_catalog(two_hubs: Deployment) -> None:
    d = two_hubs
    repo = d.new_repo("tok")
    user = d.a.token(roles={repo: "write"}, name="short-lived")
    sb = d.b.boto3(user)
    sb.put_object(Bucket=repo, Key="main/k", Body=b"x")
    with d.b.rest(user.token) as c:
        assert c.get(f"/api/v1/repos/{repo}").status_code == 200
        with d.a.rest() as admin:
            assert admin.delete(f"/api/v1/tokens/{user.token_id}").status_code == 204
        revoked = time.monotonic()
        while c.get(f"/api/v1/repos/{repo}").status_code == 200:
            assert time.monotonic() - revoked < 3.0, "hub B still accepts a token revoked through hub A"
            time.sleep(0.05)
        assert c.get(f"/api/v1/repos/{repo}").status_code == 401
    with pytest.raises(ClientError) as exc:
        sb.put_object(Bucket=repo, Key="main/k2", Body=b"y")
    assert error_status(exc) == 403
    # A bucket bound through A is served by B.
    bucket = unique_name("bkt")
    d.a.plane().create_bucket(bucket, repo, "main")
    admin_b = d.s3(d.b)
    admin_b.put_object(Bucket=bucket, Key="via-b", Body=b"bound")
    assert d.s3(d.a).get_object(Bucket=bucket, Key="via-b")["Body"].read() == b"bound"


@pytest.mark.postgres
def test_eight_writers_through_both_hubs_lose_no_update(two_hubs: Deployment) -> None:
    d = two_hubs
    repo = d.new_repo("w8")
    commits: list[str] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        plane = (d.a if i < 4 else d.b).plane(d.creds.token)
        for k in range(3):
            plane.put_object(repo, "main", f"w{i}/f{k}", io.BytesIO(f"{i}/{k}".encode()))
            cid = _commit(plane, repo, "main", f"w{i} f{k}")
            if cid is not None:
                with lock:
                    commits.append(cid)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(writer, range(8)))
    plane = d.b.plane()
    for i in range(8):
        for k in range(3):
            assert b"".join(plane.read_stream(repo, "main", f"w{i}/f{k}")) == f"{i}/{k}".encode()
    log = [c.id for c in plane.log(repo, "main", limit=1000)]
    assert set(commits) <= set(log) and len(log) == len(commits) + 1  # + the repository's first commit
    assert list(plane.uncommitted(repo, "main")) == []


@pytest.mark.postgres
def test_hub_killed_mid_upload_then_retried_on_another(two_hubs: Deployment) -> None:
    d = two_hubs
    repo = d.new_repo("kill")
    first, retried = os.urandom(24 * MiB), os.urandom(24 * MiB)
    with d.start_hub("doomed") as doomed:
        sent = threading.Event()

        def body() -> Iterator[bytes]:
            for i in range(0, len(first), MiB):
                if i == 8 * MiB:
                    sent.set()
                    time.sleep(2)  # killed meanwhile
                yield first[i : i + MiB]

        def upload() -> BaseException | int:
            try:
                with doomed.rest() as c:
                    return c.put(f"/api/v1/repos/{repo}/branches/main/objects", params={"path": "ckpt.bin"}, content=body()).status_code
            except httpx.HTTPError as exc:
                return exc

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            outcome = pool.submit(upload)
            assert sent.wait(30)
            os.kill(doomed.hub.proc.pid, signal.SIGKILL)
            assert isinstance(outcome.result(60), httpx.HTTPError)
    plane = d.b.plane()
    plane.put_object(repo, "main", "ckpt.bin", io.BytesIO(retried))
    assert b"".join(plane.read_stream(repo, "main", "ckpt.bin")) == retried
    assert [c.path for c in plane.uncommitted(repo, "main")] == ["ckpt.bin"]
    plane.commit(repo, "main", "checkpoint")
    assert [path for path, _ in plane.list(repo, "main").entries] == ["ckpt.bin"]
    assert d.fsck()["ok"] is True  # (fsck exits 0, or the call fails)
