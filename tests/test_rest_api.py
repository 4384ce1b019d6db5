"""REST API v1 against a real hub over loopback HTTP: every route, its success and its errors.

Errors are ``{"error": {"code", "message"}}`` with the status that says what
went wrong; the message names the thing (repository, branch, path, range) so a
person can act on it.
"""

from __future__ import annotations

import hashlib
import json
import os

import httpx
import msgpack
import pytest

from tests.hubserver import Hub, metric_value, unique_name

API = "/api/v1"


# -- helpers --------------------------------------------------------------------
def expect_error(r: httpx.Response, status: int, *names: str, code: str | None = None) -> dict:
    """Assert an error response: status, the JSON error document, and that the message names ``names``."""
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:500]}"
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err.get("code"), str) and err["code"], err
    assert isinstance(err.get("message"), str) and len(err["message"]) > 10, err
    for name in names:
        assert name in err["message"], f"{name!r} not named in {err['message']!r}"
    if code is not None:
        assert err["code"] == code, err
    return err


@pytest.fixture(scope="module")
def c(hub: Hub):
    with hub.client() as client:
        yield client


@pytest.fixture
def repo(c: httpx.Client) -> str:
    name = unique_name("rest")
    r = c.post(f"{API}/repos", json={"name": name})
    assert r.status_code == 201, r.text
    return name


def put(c: httpx.Client, repo: str, path: str, data: bytes, branch: str = "main", **headers: str) -> dict:
    r = c.put(f"{API}/repos/{repo}/branches/{branch}/objects", params={"path": path}, content=data, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def commit(c: httpx.Client, repo: str, message: str = "change", branch: str = "main", **body) -> dict:
    r = c.post(f"{API}/repos/{repo}/branches/{branch}/commits", json={"message": message, **body})
    assert r.status_code == 201, r.text
    return r.json()


def head(c: httpx.Client, repo: str, branch: str = "main") -> str:
    r = c.get(f"{API}/repos/{repo}/branches/{branch}")
    assert r.status_code == 200, r.text
    return r.json()["commit_id"]


def get(c: httpx.Client, repo: str, ref: str, path: str, **headers: str) -> httpx.Response:
    return c.get(f"{API}/repos/{repo}/refs/{ref}/objects", params={"path": path}, headers=headers)


# -- service endpoints ----------------------------------------------------------------
def test_healthz(hub: Hub):
    r = httpx.get(hub.url + "/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["role"] == "hub"


def test_openapi_lists_the_routes(hub: Hub):
    r = httpx.get(hub.url + "/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for p in (
        "/api/v1/repos",
        "/api/v1/repos/{repo}",
        "/api/v1/repos/{repo}/branches/{branch}/commits",
        "/api/v1/repos/{repo}/refs/{ref}/objects",
        "/api/v1/repos/{repo}/refs/{left}/diff/{right}",
        "/api/v1/chunks/missing",
        "/api/v1/tokens",
        "/healthz",
    ):
        assert p in paths, p
    # Error responses are documented with the error document's schema.
    assert "404" in paths["/api/v1/repos/{repo}"]["get"]["responses"]


def test_metrics_count_requests_and_bytes(hub: Hub, c: httpx.Client, repo: str):
    before = hub.metrics()
    put(c, repo, "m.bin", b"x" * 5000)
    get(c, repo, "main", "m.bin").raise_for_status()
    expect_error(c.get(f"{API}/repos/{unique_name('nope')}"), 404)
    after = hub.metrics()
    assert "fabric_http_requests_total" in after and "fabric_http_request_seconds" in after
    route = "/api/v1/repos/{repo}/branches/{branch}/objects"
    assert metric_value(after, "fabric_http_requests_total", method="PUT", route=route, status="201") >= 1 + metric_value(
        before, "fabric_http_requests_total", method="PUT", route=route, status="201"
    )
    assert metric_value(after, "fabric_http_requests_total", route="/api/v1/repos/{repo}", status="404") >= 1
    assert metric_value(after, "fabric_http_bytes_total", direction="in") - metric_value(
        before, "fabric_http_bytes_total", direction="in"
    ) >= 5000
    assert metric_value(after, "fabric_http_bytes_total", direction="out") - metric_value(
        before, "fabric_http_bytes_total", direction="out"
    ) >= 5000
    assert metric_value(after, "fabric_catalog") > 0  # catalog gauges are exported too


# -- repositories -------------------------------------------------------------------
def test_repo_create_list_get_delete(c: httpx.Client):
    name = unique_name("repo")
    r = c.post(f"{API}/repos", json={"name": name, "default_branch": "trunk"})
    assert r.status_code == 201
    body = r.json()
    assert body["name"] == name and body["default_branch"] == "trunk" and body["created"] > 0
    assert name in [x["name"] for x in c.get(f"{API}/repos").json()]
    assert c.get(f"{API}/repos/{name}").json() == body
    assert [b["name"] for b in c.get(f"{API}/repos/{name}/branches").json()] == ["trunk"]
    r = c.delete(f"{API}/repos/{name}")
    assert r.status_code == 204 and r.content == b""
    expect_error(c.get(f"{API}/repos/{name}"), 404, name, code="not_found")
    assert name not in [x["name"] for x in c.get(f"{API}/repos").json()]


def test_repo_errors(c: httpx.Client, repo: str):
    expect_error(c.post(f"{API}/repos", json={"name": repo}), 409, repo, "already exists", code="conflict")
    expect_error(c.post(f"{API}/repos", json={"name": "Bad_Name"}), 400, "Bad_Name", code="invalid_name")
    expect_error(c.post(f"{API}/repos", json={"name": "ok-name", "default_branch": "a/b"}), 400, "a/b")
    expect_error(c.post(f"{API}/repos", json={}), 400, "name")
    r = c.post(f"{API}/repos", content=b"{not json", headers={"Content-Type": "application/json"})
    expect_error(r, 400)
    missing = unique_name("gone")
    expect_error(c.get(f"{API}/repos/{missing}"), 404, missing)
    expect_error(c.delete(f"{API}/repos/{missing}"), 404, missing)
    expect_error(c.get(f"{API}/repos/NotValid"), 400, "NotValid")


# -- branches ---------------------------------------------------------------------------
def test_branch_create_list_get_delete(c: httpx.Client, repo: str):
    main = head(c, repo)
    r = c.post(f"{API}/repos/{repo}/branches", json={"name": "dev", "source": "main"})
    assert r.status_code == 201 and r.json() == {"name": "dev", "commit_id": main}
    names = {b["name"]: b["commit_id"] for b in c.get(f"{API}/repos/{repo}/branches").json()}
    assert names == {"main": main, "dev": main}
    assert c.get(f"{API}/repos/{repo}/branches/dev").json() == {"name": "dev", "commit_id": main}
    assert c.delete(f"{API}/repos/{repo}/branches/dev").status_code == 204
    expect_error(c.get(f"{API}/repos/{repo}/branches/dev"), 404, "dev", repo)


def test_branch_errors(c: httpx.Client, repo: str):
    c.post(f"{API}/repos/{repo}/branches", json={"name": "dev", "source": "main"}).raise_for_status()
    expect_error(c.post(f"{API}/repos/{repo}/branches", json={"name": "dev", "source": "main"}), 409, "dev", "already exists")
    expect_error(c.post(f"{API}/repos/{repo}/branches", json={"name": "x", "source": "nosuch"}), 404, "nosuch", repo)
    expect_error(c.post(f"{API}/repos/{repo}/branches", json={"name": "bad/name", "source": "main"}), 400, "bad/name")
    expect_error(c.post(f"{API}/repos/{repo}/branches", json={"name": "x"}), 400, "source")
    expect_error(c.delete(f"{API}/repos/{repo}/branches/main"), 400, "main", "default branch")
    expect_error(c.delete(f"{API}/repos/{repo}/branches/nosuch"), 404, "nosuch")
    expect_error(c.get(f"{API}/repos/{repo}/branches/nosuch"), 404, "nosuch")
    missing = unique_name("gone")
    expect_error(c.get(f"{API}/repos/{missing}/branches"), 404, missing)
    expect_error(c.post(f"{API}/repos/{missing}/branches", json={"name": "x", "source": "main"}), 404, missing)
    # A branch may not take a tag's name (and vice versa).
    c.post(f"{API}/repos/{repo}/tags", json={"name": "v1", "ref": "main"}).raise_for_status()
    expect_error(c.post(f"{API}/repos/{repo}/branches", json={"name": "v1", "source": "main"}), 409, "v1", "tag")


def test_branch_reset(c: httpx.Client, repo: str):
    base = head(c, repo)
    put(c, repo, "a.txt", b"one")
    first = commit(c, repo, "add a")["id"]
    put(c, repo, "b.txt", b"staged")
    r = c.post(f"{API}/repos/{repo}/branches/main/reset", json={"ref": base})
    assert r.status_code == 200 and r.json() == {"name": "main", "commit_id": base}
    assert head(c, repo) == base
    # Staged changes are gone, and so is a.txt.
    assert c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"] == []
    expect_error(get(c, repo, "main", "a.txt"), 404, "a.txt")
    # Back to the first commit by id prefix.
    assert c.post(f"{API}/repos/{repo}/branches/main/reset", json={"ref": first[:12]}).json()["commit_id"] == first
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/reset", json={"ref": "nosuch"}), 404, "nosuch")
    expect_error(c.post(f"{API}/repos/{repo}/branches/nob/reset", json={"ref": "main"}), 404, "nob")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/reset", json={}), 400, "ref")


def test_revert(c: httpx.Client, repo: str):
    put(c, repo, "a.txt", b"one")
    c1 = commit(c, repo, "add a")["id"]
    put(c, repo, "a.txt", b"two")
    put(c, repo, "b.txt", b"bee")
    c2 = commit(c, repo, "change a, add b")["id"]
    r = c.post(f"{API}/repos/{repo}/branches/main/revert", json={"commit": c2})
    assert r.status_code == 201, r.text
    rev = r.json()
    assert rev["parents"] == [c2] and c2[:12] in rev["message"]
    assert get(c, repo, "main", "a.txt").content == b"one"
    expect_error(get(c, repo, "main", "b.txt"), 404, "b.txt")
    # Reverting c2 again conflicts: its paths changed since.
    err = expect_error(c.post(f"{API}/repos/{repo}/branches/main/revert", json={"commit": c2}), 409, c2[:12])
    assert err["code"] == "merge_conflict" and sorted(err["conflicts"]) == ["a.txt", "b.txt"]
    first = c.get(f"{API}/repos/{repo}/refs/{c1}/log").json()["commits"][-1]["id"]
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/revert", json={"commit": first}), 400, "first commit")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/revert", json={"commit": c1, "parent": 2}), 400, "parent")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/revert", json={"commit": "deadbeef00"}), 404, "deadbeef00")
    expect_error(c.post(f"{API}/repos/{repo}/branches/nob/revert", json={"commit": c1}), 404, "nob")


def test_merge_and_conflict(c: httpx.Client, repo: str):
    put(c, repo, "shared.txt", b"base")
    put(c, repo, "keep.txt", b"keep")
    commit(c, repo, "base")
    c.post(f"{API}/repos/{repo}/branches", json={"name": "feature", "source": "main"}).raise_for_status()
    put(c, repo, "new.txt", b"from feature", branch="feature")
    commit(c, repo, "feature work", branch="feature")
    # Clean merge.
    r = c.post(f"{API}/repos/{repo}/branches/main/merge", json={"source": "feature"})
    assert r.status_code == 201, r.text
    merged = r.json()
    assert len(merged["parents"]) == 2 and merged["parents"][1] == head(c, repo, "feature")
    assert get(c, repo, "main", "new.txt").content == b"from feature"
    # Already merged.
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/merge", json={"source": "feature"}), 400, "feature", "already merged")
    # Both sides change the same paths: 409 listing the paths.
    put(c, repo, "shared.txt", b"main side")
    put(c, repo, "new.txt", b"main side")
    commit(c, repo, "main side")
    put(c, repo, "shared.txt", b"feature side", branch="feature")
    put(c, repo, "new.txt", b"feature side", branch="feature")
    commit(c, repo, "feature side", branch="feature")
    before = head(c, repo)
    err = expect_error(c.post(f"{API}/repos/{repo}/branches/main/merge", json={"source": "feature"}), 409, "feature", "main")
    assert err["code"] == "merge_conflict"
    assert sorted(err["conflicts"]) == ["new.txt", "shared.txt"]
    assert head(c, repo) == before  # nothing changed
    # A strategy resolves it.
    r = c.post(f"{API}/repos/{repo}/branches/main/merge", json={"source": "feature", "strategy": "theirs", "message": "take theirs"})
    assert r.status_code == 201 and r.json()["message"] == "take theirs"
    assert get(c, repo, "main", "shared.txt").content == b"feature side"
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/merge", json={"source": "feature", "strategy": "mine"}), 400, "strategy")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/merge", json={"source": "nosuch"}), 404, "nosuch")
    expect_error(c.post(f"{API}/repos/{repo}/branches/nob/merge", json={"source": "feature"}), 404, "nob")


# -- commits ----------------------------------------------------------------------------
def test_commit_get_and_expected_head(c: httpx.Client, repo: str):
    start = head(c, repo)
    put(c, repo, "data/x.bin", b"x" * 100)
    r = c.post(
        f"{API}/repos/{repo}/branches/main/commits",
        json={"message": "first", "metadata": {"k": "v"}, "author": "alice", "expected_head": start},
    )
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["parents"] == [start] and info["author"] == "alice" and info["meta"] == {"k": "v"}
    assert c.get(f"{API}/repos/{repo}/commits/{info['id']}").json() == info
    assert c.get(f"{API}/repos/{repo}/commits/{info['id'][:10]}").json() == info
    assert c.get(f"{API}/repos/{repo}/commits/main").json() == info
    assert c.get(f"{API}/repos/{repo}/commits/main~1").json()["id"] == start
    # Stale expected head: 409 naming both commits, the head is returned; nothing is committed.
    put(c, repo, "data/y.bin", b"y")
    err = expect_error(
        c.post(f"{API}/repos/{repo}/branches/main/commits", json={"message": "stale", "expected_head": start}),
        409,
        "main",
        start[:12],
        info["id"][:12],
        code="conflict",
    )
    assert err["head"] == info["id"]
    assert head(c, repo) == info["id"]
    assert [ch["path"] for ch in c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"]] == ["data/y.bin"]


def test_commit_errors(c: httpx.Client, repo: str):
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/commits", json={"message": "nothing"}), 400, "nothing to commit")
    assert c.post(f"{API}/repos/{repo}/branches/main/commits", json={"message": "empty", "allow_empty": True}).status_code == 201
    put(c, repo, "a", b"a")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/commits", json={"message": "  "}), 400, "message")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/commits", json={}), 400, "message")
    expect_error(c.post(f"{API}/repos/{repo}/branches/nob/commits", json={"message": "m"}), 404, "nob", repo)
    missing = unique_name("gone")
    expect_error(c.post(f"{API}/repos/{missing}/branches/main/commits", json={"message": "m"}), 404, missing)
    expect_error(c.get(f"{API}/repos/{repo}/commits/{'ab' * 32}"), 404, "ab" * 32)
    expect_error(c.get(f"{API}/repos/{repo}/commits/nosuchref"), 404, "nosuchref")
    expect_error(c.get(f"{API}/repos/{repo}/commits/main~9"), 404, "main~9")


def test_commit_changes_msgpack(c: httpx.Client, repo: str):
    """Commit explicit entries (msgpack), bypassing staging; compare-and-swap on expected_head."""
    put(c, repo, "src.bin", b"payload" * 1000)
    first = head(c, repo)
    second = commit(c, repo, "src")["id"]
    put(c, repo, "staged-only", b"s")

    def post(changes: dict, **fields) -> httpx.Response:
        body = msgpack.packb({"changes": changes, **fields}, use_bin_type=True)
        return c.post(f"{API}/repos/{repo}/branches/main/commit-changes", content=body, headers={"Content-Type": "application/msgpack"})

    expect_error(post({"nope.bin": None}, message="rm nothing"), 400, "nothing to commit")
    # A stale or unknown expected head is a conflict naming both commits, whatever the changes are.
    err = expect_error(post({"src.bin": None}, message="stale", expected_head=first), 409, "main", first[:12], second[:12])
    assert err["head"] == second
    expect_error(post({"nope.bin": None}, message="stale", expected_head=first), 409, first[:12])
    expect_error(post({"src.bin": None}, message="unknown", expected_head="0" * 64), 409, "000000000000")
    r = post({"src.bin": None}, message="rm src", expected_head=second, author="carol", meta={"k": "v"})
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["parents"] == [second] and info["author"] == "carol" and info["meta"] == {"k": "v"}
    expect_error(get(c, repo, info["id"], "src.bin"), 404, "src.bin")
    # Staging was left alone.
    assert [x["path"] for x in c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"]] == ["staged-only"]
    expect_error(
        c.post(f"{API}/repos/{repo}/branches/main/commit-changes", content=b"\xc1garbage", headers={"Content-Type": "application/msgpack"}),
        400,
        "msgpack",
    )
    expect_error(post({}), 400, "message")
    expect_error(post({"../x": None}, message="m"), 400, "../x")
    body = msgpack.packb({"changes": {"a": None}, "message": "m"}, use_bin_type=True)
    expect_error(c.post(f"{API}/repos/{repo}/branches/nob/commit-changes", content=body), 404, "nob")


def test_log_paginated_and_filtered_by_path(c: httpx.Client, repo: str):
    ids = []
    for i in range(7):
        put(c, repo, f"f{i % 2}.txt", f"v{i}".encode())
        ids.append(commit(c, repo, f"commit {i}")["id"])
    first = c.get(f"{API}/repos/{repo}/commits/main~7").json()["id"]
    everything = list(reversed(ids)) + [first]
    seen, after, pages = [], None, 0
    while True:
        params = {"limit": 3, **({"after": after} if after else {})}
        r = c.get(f"{API}/repos/{repo}/refs/main/log", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["commits"]) <= 3
        seen += [x["id"] for x in page["commits"]]
        pages += 1
        after = page["next_after"]
        if after is None:
            break
        assert after == page["commits"][-1]["id"]
    assert seen == everything and pages == 3
    # Only commits that changed f1.txt (commits 1, 3, 5).
    page = c.get(f"{API}/repos/{repo}/refs/main/log", params={"path": "f1.txt"}).json()
    assert [x["message"] for x in page["commits"]] == ["commit 5", "commit 3", "commit 1"]
    page = c.get(f"{API}/repos/{repo}/refs/main/log", params={"path": "f1.txt", "limit": 2}).json()
    assert [x["message"] for x in page["commits"]] == ["commit 5", "commit 3"] and page["next_after"]
    page = c.get(f"{API}/repos/{repo}/refs/main/log", params={"path": "f1.txt", "after": page["next_after"]}).json()
    assert [x["message"] for x in page["commits"]] == ["commit 1"] and page["next_after"] is None
    # Log of a tag and of a commit id.
    assert c.get(f"{API}/repos/{repo}/refs/{ids[2]}/log").json()["commits"][0]["id"] == ids[2]
    expect_error(c.get(f"{API}/repos/{repo}/refs/nosuch/log"), 404, "nosuch")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/log", params={"limit": 0}), 400, "limit")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/log", params={"limit": "many"}), 400, "limit")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/log", params={"path": "../x"}), 400, "../x")


# -- tags -------------------------------------------------------------------------------
def test_tags(c: httpx.Client, repo: str):
    put(c, repo, "a", b"a")
    cid = commit(c, repo)["id"]
    r = c.post(f"{API}/repos/{repo}/tags", json={"name": "v1.0", "ref": "main"})
    assert r.status_code == 201 and r.json() == {"name": "v1.0", "commit_id": cid}
    assert c.get(f"{API}/repos/{repo}/tags").json() == [{"name": "v1.0", "commit_id": cid}]
    # A tag reads committed data only.
    put(c, repo, "b", b"b")
    expect_error(get(c, repo, "v1.0", "b"), 404, "b", "v1.0")
    assert get(c, repo, "v1.0", "a").content == b"a"
    expect_error(c.post(f"{API}/repos/{repo}/tags", json={"name": "v1.0", "ref": "main"}), 409, "v1.0", "already exists")
    expect_error(c.post(f"{API}/repos/{repo}/tags", json={"name": "main", "ref": "main"}), 409, "main", "branch")
    expect_error(c.post(f"{API}/repos/{repo}/tags", json={"name": "v2", "ref": "nosuch"}), 404, "nosuch")
    expect_error(c.post(f"{API}/repos/{repo}/tags", json={"name": "..bad", "ref": "main"}), 400, "..bad")
    assert c.delete(f"{API}/repos/{repo}/tags/v1.0").status_code == 204
    expect_error(c.delete(f"{API}/repos/{repo}/tags/v1.0"), 404, "v1.0")
    assert c.get(f"{API}/repos/{repo}/tags").json() == []
    missing = unique_name("gone")
    expect_error(c.get(f"{API}/repos/{missing}/tags"), 404, missing)


# -- diff -------------------------------------------------------------------------------
def test_diff_paginated(c: httpx.Client, repo: str):
    for i in range(5):
        put(c, repo, f"keep/{i}.txt", b"same")
    put(c, repo, "gone.txt", b"old")
    put(c, repo, "edit.txt", b"old")
    base = commit(c, repo, "base")["id"]
    for i in range(25):
        put(c, repo, f"new/{i:02d}.txt", f"n{i}".encode())
    put(c, repo, "edit.txt", b"new content")
    c.delete(f"{API}/repos/{repo}/branches/main/objects", params={"path": "gone.txt"}).raise_for_status()
    tip = commit(c, repo, "tip")["id"]
    changes, after = [], None
    while True:
        params = {"limit": 10, **({"after": after} if after else {})}
        page = c.get(f"{API}/repos/{repo}/refs/{base}/diff/{tip}", params=params).json()
        assert len(page["changes"]) <= 10
        changes += page["changes"]
        after = page["next_after"]
        if after is None:
            break
    by_path = {x["path"]: x for x in changes}
    assert len(changes) == 27 == len(by_path)
    assert by_path["edit.txt"] == {"path": "edit.txt", "type": "changed", "size": 11}
    assert by_path["gone.txt"]["type"] == "removed"
    assert all(by_path[f"new/{i:02d}.txt"]["type"] == "added" for i in range(25))
    assert [x["path"] for x in changes] == sorted(by_path)
    page = c.get(f"{API}/repos/{repo}/refs/{base}/diff/{tip}", params={"prefix": "new/", "limit": 1000}).json()
    assert len(page["changes"]) == 25 and page["next_after"] is None
    assert c.get(f"{API}/repos/{repo}/refs/main/diff/{tip}").json() == {"changes": [], "next_after": None}
    expect_error(c.get(f"{API}/repos/{repo}/refs/nosuch/diff/main"), 404, "nosuch")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/diff/nosuch"), 404, "nosuch")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/diff/main", params={"limit": 0}), 400, "limit")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/diff/main", params={"prefix": "/abs"}), 400, "/abs")


# -- objects ------------------------------------------------------------------------------
def test_put_streamed_get_head_stat(c: httpx.Client, repo: str):
    data = os.urandom(3 * 1024 * 1024 + 17)

    def body():
        for i in range(0, len(data), 100_000):
            yield data[i : i + 100_000]

    r = c.put(
        f"{API}/repos/{repo}/branches/main/objects",
        params={"path": "dir/big.bin"},
        content=body(),  # chunked transfer encoding, no Content-Length
        headers={"X-Fabric-Mode": "600", "X-Fabric-Mtime-Ns": "1700000000123456789", "X-Fabric-Meta-Owner": "team-a"},
    )
    assert r.status_code == 201, r.text
    info = r.json()
    md5 = hashlib.md5(data).hexdigest()
    assert info["path"] == "dir/big.bin" and info["type"] == "file" and info["size"] == len(data)
    assert info["etag"] == md5 and info["mode"] == "600" and info["metadata"] == {"owner": "team-a"}
    assert info["mtime"] == pytest.approx(1700000000.123456789)
    assert info["mtime_ns"] == 1700000000123456789  # exact (the float of seconds is not)
    assert c.get(f"{API}/repos/{repo}/refs/main/stat", params={"path": "dir/big.bin"}).json()["mtime_ns"] == 1700000000123456789
    r = get(c, repo, "main", "dir/big.bin")
    assert r.status_code == 200 and r.content == data
    assert r.headers["etag"] == f'"{md5}"' and r.headers["accept-ranges"] == "bytes"
    assert r.headers["content-length"] == str(len(data))
    assert r.headers["x-fabric-commit"] == head(c, repo)
    assert "2023" in r.headers["last-modified"]
    h = c.head(f"{API}/repos/{repo}/refs/main/objects", params={"path": "dir/big.bin"})
    assert h.status_code == 200 and h.content == b""
    assert h.headers["content-length"] == str(len(data)) and h.headers["etag"] == f'"{md5}"'
    st = c.get(f"{API}/repos/{repo}/refs/main/stat", params={"path": "dir/big.bin"}).json()
    assert st == info
    # The upload is uncommitted: visible on the branch only until committed.
    cid = commit(c, repo, "big")["id"]
    assert get(c, repo, cid[:10], "dir/big.bin").content == data
    # Overwrite with an empty file.
    put(c, repo, "dir/big.bin", b"")
    r = get(c, repo, "main", "dir/big.bin")
    assert r.status_code == 200 and r.content == b"" and r.headers["etag"] == f'"{hashlib.md5(b"").hexdigest()}"'


def test_object_errors(c: httpx.Client, repo: str):
    put(c, repo, "a.txt", b"hello")
    commit(c, repo)
    expect_error(get(c, repo, "main", "nope.txt"), 404, "nope.txt", repo)
    expect_error(get(c, repo, "nosuchref", "a.txt"), 404, "nosuchref")
    missing = unique_name("gone")
    expect_error(get(c, missing, "main", "a.txt"), 404, missing)
    r = c.head(f"{API}/repos/{repo}/refs/main/objects", params={"path": "nope.txt"})
    assert r.status_code == 404 and r.content == b""
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/objects"), 400, "path")
    expect_error(get(c, repo, "main", "../etc/passwd"), 400, "../etc/passwd", code="invalid_path")
    expect_error(get(c, repo, "main", "/abs"), 400, "/abs")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/stat", params={"path": "nope.txt"}), 404, "nope.txt")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/stat", params={"path": "a//b"}), 400, "a//b")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/stat"), 400, "path")
    r = c.put(f"{API}/repos/{repo}/branches/nob/objects", params={"path": "x"}, content=b"x")
    expect_error(r, 404, "nob", repo)
    r = c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "a/../b"}, content=b"x")
    expect_error(r, 400, "a/../b")
    r = c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "x"}, content=b"x", headers={"X-Fabric-Mode": "rw-"})
    expect_error(r, 400, "rw-", "X-Fabric-Mode")
    r = c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "x"}, content=b"x", headers={"X-Fabric-Mtime-Ns": "soon"})
    expect_error(r, 400)
    # A tag is not a branch: no uploads.
    c.post(f"{API}/repos/{repo}/tags", json={"name": "v1", "ref": "main"}).raise_for_status()
    expect_error(c.put(f"{API}/repos/{repo}/branches/v1/objects", params={"path": "x"}, content=b"x"), 404, "v1")
    # Nothing of the failed uploads was staged.
    assert c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"] == []


def test_get_ranges(c: httpx.Client, repo: str):
    data = bytes(range(256)) * 4096  # 1 MiB, several chunks
    put(c, repo, "r.bin", data)
    size = len(data)
    for spec, lo, hi in [
        ("bytes=0-0", 0, 0),
        ("bytes=10-19", 10, 19),
        ("bytes=100000-", 100000, size - 1),
        ("bytes=-500", size - 500, size - 1),
        ("bytes=-99999999", 0, size - 1),  # a suffix longer than the file is the whole file
        (f"bytes={size - 1}-{size + 1000}", size - 1, size - 1),  # the end is clamped
        ("bytes=65530-200000", 65530, 200000),  # crosses chunk boundaries
    ]:
        r = get(c, repo, "main", "r.bin", Range=spec)
        assert r.status_code == 206, (spec, r.text)
        assert r.content == data[lo : hi + 1], spec
        assert r.headers["content-range"] == f"bytes {lo}-{hi}/{size}", spec
        assert r.headers["content-length"] == str(hi - lo + 1)
    h = c.head(f"{API}/repos/{repo}/refs/main/objects", params={"path": "r.bin"}, headers={"Range": "bytes=-10"})
    assert h.status_code == 206 and h.headers["content-range"] == f"bytes {size - 10}-{size - 1}/{size}"
    for spec in (f"bytes={size}-", f"bytes={size + 5}-{size + 10}", "bytes=-0"):
        r = get(c, repo, "main", "r.bin", Range=spec)
        err = expect_error(r, 416, code="range_not_satisfiable")
        assert spec in err["message"] or str(size) in err["message"], err
        if spec != "bytes=-0":
            assert r.headers["content-range"] == f"bytes */{size}", spec
            assert str(size) in err["message"]
    expect_error(get(c, repo, "main", "r.bin", Range="bytes=0-1,5-6"), 416, "bytes=0-1,5-6")
    expect_error(get(c, repo, "main", "r.bin", Range="bytes=x-y"), 416, "bytes=x-y")
    expect_error(get(c, repo, "main", "r.bin", Range="items=0-1"), 416, "items=0-1")
    # Every byte of an empty file is out of range.
    put(c, repo, "empty", b"")
    r = get(c, repo, "main", "empty", Range="bytes=0-")
    expect_error(r, 416)
    assert r.headers["content-range"] == "bytes */0"


def test_list_prefix_delimiter_pagination(c: httpx.Client, repo: str):
    paths = [f"img/{i:03d}.jpg" for i in range(23)] + ["img/sub/a.jpg", "img/sub/b.jpg", "labels.csv", "readme.md", "z/deep/x"]
    for p in paths:
        put(c, repo, p, p.encode())
    commit(c, repo, "tree")
    lst = c.get(f"{API}/repos/{repo}/refs/main/list").json()
    assert [e["path"] for e in lst["entries"]] == sorted(paths) and lst["prefixes"] == [] and lst["next_after"] is None
    e = lst["entries"][0]
    assert set(e) >= {"path", "type", "size", "mode", "mtime", "etag"} and e["size"] == len(e["path"])
    top = c.get(f"{API}/repos/{repo}/refs/main/list", params={"delimiter": "/"}).json()
    assert top["prefixes"] == ["img/", "z/"] and [e["path"] for e in top["entries"]] == ["labels.csv", "readme.md"]
    img = c.get(f"{API}/repos/{repo}/refs/main/list", params={"prefix": "img/", "delimiter": "/"}).json()
    assert img["prefixes"] == ["img/sub/"] and len(img["entries"]) == 23
    # Pages of 5 with a delimiter: entries and prefixes together, no repeats.
    got, after = [], ""
    while True:
        page = c.get(f"{API}/repos/{repo}/refs/main/list", params={"prefix": "img/", "delimiter": "/", "limit": 5, "after": after}).json()
        items = [e["path"] for e in page["entries"]] + page["prefixes"]
        assert 0 < len(items) <= 5
        got += items
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert sorted(got) == sorted([f"img/{i:03d}.jpg" for i in range(23)] + ["img/sub/"]) and len(got) == 24
    # Plain pagination with after.
    page = c.get(f"{API}/repos/{repo}/refs/main/list", params={"limit": 2, "after": "img/021.jpg"}).json()
    assert [e["path"] for e in page["entries"]] == ["img/022.jpg", "img/sub/a.jpg"] and page["next_after"] == "img/sub/a.jpg"
    assert c.get(f"{API}/repos/{repo}/refs/main/list", params={"prefix": "nothing/"}).json()["entries"] == []
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/list", params={"delimiter": ","}), 400, "delimiter")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/list", params={"limit": 0}), 400, "limit")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/list", params={"limit": 100000}), 400, "limit")
    expect_error(c.get(f"{API}/repos/{repo}/refs/main/list", params={"prefix": "../"}), 400, "..")
    expect_error(c.get(f"{API}/repos/{repo}/refs/nosuch/list"), 404, "nosuch")


def test_delete_bulk_delete_copy(c: httpx.Client, repo: str):
    for p in ("a", "b", "c", "d"):
        put(c, repo, p, p.encode() * 10)
    commit(c, repo, "four")
    assert c.delete(f"{API}/repos/{repo}/branches/main/objects", params={"path": "a"}).status_code == 204
    expect_error(get(c, repo, "main", "a"), 404, "a")
    expect_error(c.delete(f"{API}/repos/{repo}/branches/main/objects", params={"path": "a"}), 404, "'a'")
    expect_error(c.delete(f"{API}/repos/{repo}/branches/main/objects", params={"path": "zz"}), 404, "zz")
    expect_error(c.delete(f"{API}/repos/{repo}/branches/nob/objects", params={"path": "b"}), 404, "nob")
    expect_error(c.delete(f"{API}/repos/{repo}/branches/main/objects", params={"path": "/b"}), 400, "/b")
    r = c.post(f"{API}/repos/{repo}/branches/main/objects/delete", json={"paths": ["b", "nope", "c", "../x"]})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["deleted"] == ["b", "c"]
    errs = {e["path"]: e for e in res["errors"]}
    assert set(errs) == {"nope", "../x"}
    assert errs["nope"]["code"] == "not_found" and "nope" in errs["nope"]["message"]
    assert errs["../x"]["code"] == "invalid_path"
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/objects/delete", json={"paths": "b"}), 400, "paths")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/objects/delete", json={"paths": ["x"] * 10001}), 400, "paths")
    # Copy from any ref (here: the committed version of 'b', now deleted on main) to a path on the branch.
    r = c.post(f"{API}/repos/{repo}/branches/main/objects/copy", json={"src_ref": head(c, repo)[:12], "src_path": "b", "dest_path": "copies/b"})
    assert r.status_code == 201, r.text
    assert r.json()["path"] == "copies/b" and r.json()["size"] == 10
    assert get(c, repo, "main", "copies/b").content == b"b" * 10
    r = c.post(f"{API}/repos/{repo}/branches/main/objects/copy", json={"src_ref": "main", "src_path": "d", "dest_path": "d2"})
    assert r.status_code == 201 and get(c, repo, "main", "d2").content == b"d" * 10
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/objects/copy", json={"src_ref": "main", "src_path": "b", "dest_path": "x"}), 404, "b")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/objects/copy", json={"src_ref": "nosuch", "src_path": "d", "dest_path": "x"}), 404, "nosuch")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/objects/copy", json={"src_ref": "main", "src_path": "d", "dest_path": "../x"}), 400, "../x")
    expect_error(c.post(f"{API}/repos/{repo}/branches/nob/objects/copy", json={"src_ref": "main", "src_path": "d", "dest_path": "x"}), 404, "nob")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/objects/copy", json={"src_ref": "main"}), 400, "src_path")
    changes = {x["path"]: x["type"] for x in c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"]}
    assert changes == {"a": "removed", "b": "removed", "c": "removed", "copies/b": "added", "d2": "added"}


def test_uncommitted_changes_and_discard(c: httpx.Client, repo: str):
    put(c, repo, "keep", b"k")
    put(c, repo, "edit", b"old")
    put(c, repo, "del", b"d")
    commit(c, repo, "base")
    put(c, repo, "edit", b"new!")
    put(c, repo, "add/1", b"1")
    put(c, repo, "add/2", b"2")
    c.delete(f"{API}/repos/{repo}/branches/main/objects", params={"path": "del"}).raise_for_status()
    page = c.get(f"{API}/repos/{repo}/branches/main/changes").json()
    assert page == {
        "changes": [
            {"path": "add/1", "type": "added", "size": 1},
            {"path": "add/2", "type": "added", "size": 1},
            {"path": "del", "type": "removed", "size": 1},
            {"path": "edit", "type": "changed", "size": 4},
        ],
        "next_after": None,
    }
    p1 = c.get(f"{API}/repos/{repo}/branches/main/changes", params={"limit": 3}).json()
    assert len(p1["changes"]) == 3 and p1["next_after"] == "del"
    p2 = c.get(f"{API}/repos/{repo}/branches/main/changes", params={"limit": 3, "after": "del"}).json()
    assert [x["path"] for x in p2["changes"]] == ["edit"] and p2["next_after"] is None
    assert [x["path"] for x in c.get(f"{API}/repos/{repo}/branches/main/changes", params={"prefix": "add/"}).json()["changes"]] == ["add/1", "add/2"]
    c.post(f"{API}/repos/{repo}/tags", json={"name": "t1", "ref": "main"}).raise_for_status()
    expect_error(c.get(f"{API}/repos/{repo}/branches/t1/changes"), 400, "t1", "not a branch")
    expect_error(c.get(f"{API}/repos/{repo}/branches/nob/changes"), 404, "nob")
    assert c.delete(f"{API}/repos/{repo}/branches/main/changes").status_code == 204
    assert c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"] == []
    assert get(c, repo, "main", "edit").content == b"old" and get(c, repo, "main", "del").content == b"d"
    expect_error(c.delete(f"{API}/repos/{repo}/branches/nob/changes"), 404, "nob")


def test_stage_entries_msgpack(c: httpx.Client, repo: str):
    # An entry whose chunks the hub holds (from an upload) can be staged under another path.
    info = put(c, repo, "orig", b"0123456789" * 5000)
    r = c.get(f"{API}/repos/{repo}/refs/main/stat", params={"path": "orig"}).json()
    assert r["etag"] == info["etag"]
    from fabric.format import chunking
    from fabric.format.model import Entry

    data = b"0123456789" * 5000
    chunks = [(chunking.chunk_id(p), len(p)) for p in chunking.cut(data)]
    entry = Entry("file", len(data), 0o644, 1_600_000_000_000_000_000, md5=hashlib.md5(data).hexdigest(), chunks=tuple(chunks))
    body = msgpack.packb({"changes": {"alias": entry.to_wire(), "orig": None}}, use_bin_type=True)
    r = c.post(f"{API}/repos/{repo}/branches/main/entries", content=body, headers={"Content-Type": "application/msgpack"})
    assert r.status_code == 204, r.text
    assert get(c, repo, "main", "alias").content == data
    expect_error(get(c, repo, "main", "orig"), 404, "orig")
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/entries", content=b"junk"), 400, "msgpack")
    body = msgpack.packb({"changes": {"../up": None}}, use_bin_type=True)
    expect_error(c.post(f"{API}/repos/{repo}/branches/main/entries", content=body), 400, "../up")
    body = msgpack.packb({"changes": {"x": entry.to_wire()}}, use_bin_type=True)
    expect_error(c.post(f"{API}/repos/{repo}/branches/nob/entries", content=body), 404, "nob")


def test_admin_endpoints(c: httpx.Client, repo: str):
    put(c, repo, "s", b"stats" * 1000)
    commit(c, repo)
    s = c.get(f"{API}/stats").json()
    assert s["logical_bytes"] >= 5000 and s["stored_bytes"] > 0 and s["repositories"] >= 1
    r = c.post(f"{API}/admin/fsck", params={"deep": "false"})
    assert r.status_code == 200 and r.json()["ok"] is True, r.text
    r = c.post(f"{API}/admin/gc", params={"dry_run": "true"})
    assert r.status_code == 200 and "bytes_freed" in r.json(), r.text
    expect_error(c.post(f"{API}/admin/gc", params={"grace": -1}), 400, "grace")
    expect_error(c.post(f"{API}/admin/fsck", params={"deep": "maybe"}), 400, "deep")


def test_framework_errors_use_the_error_document(c: httpx.Client):
    expect_error(c.get(f"{API}/nothing-here"), 404, "/api/v1/nothing-here", code="not_found")
    err = expect_error(c.patch(f"{API}/repos"), 405, "PATCH", "/api/v1/repos", code="method_not_allowed")
    assert err
    # A body that is not UTF-8 JSON.
    r = c.post(f"{API}/repos", content=b"\xff\xfe{\x00", headers={"Content-Type": "application/json"})
    expect_error(r, 400, "JSON", code="bad_request")


def test_out_of_range_numbers_are_400(c: httpx.Client, repo: str):
    """Integers beyond 64 bits are the client's mistake, not an overflow inside the hub."""
    for value in ("99999999999999999999999", str(2**64), str(-(2**63) - 1)):
        r = c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "t"}, content=b"x", headers={"X-Fabric-Mtime-Ns": value})
        expect_error(r, 400, "mtime")
    for mode in ("77777777777777777777", "-1", "10000"):
        r = c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "t"}, content=b"x", headers={"X-Fabric-Mode": mode})
        expect_error(r, 400, mode, "X-Fabric-Mode")
    assert c.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"] == []
    old = put(c, repo, "old", b"x", **{"X-Fabric-Mtime-Ns": str(-(10**18)), "X-Fabric-Mode": "7755"})
    assert old["mtime"] == -1e9 and old["mode"] == "7755"
    expect_error(c.get(f"{API}/watch", params={"since": 10**20, "once": "true"}), 400, "since")
    expect_error(c.get(f"{API}/repos/{repo}/branches/main/staging", params={"since": 10**20}), 400, "since")


# -- the core flow on both catalogs --------------------------------------------------------
def test_core_flow_on_both_catalogs(any_hub: Hub):
    """Repo -> upload -> commit -> read -> branch -> merge -> tag -> delete, on SQLite and PostgreSQL."""
    with any_hub.client() as c:
        repo = unique_name("core")
        assert c.post(f"{API}/repos", json={"name": repo}).status_code == 201
        data = os.urandom(700_000)
        info = put(c, repo, "data/blob.bin", data)
        assert info["etag"] == hashlib.md5(data).hexdigest()
        start = head(c, repo)
        first = commit(c, repo, "blob", expected_head=start)
        expect_error(
            c.post(f"{API}/repos/{repo}/branches/main/commits", json={"message": "x", "expected_head": start, "allow_empty": True}),
            409,
            start[:12],
        )
        assert get(c, repo, first["id"], "data/blob.bin").content == data
        assert get(c, repo, "main", "data/blob.bin", Range="bytes=-100").content == data[-100:]
        assert c.post(f"{API}/repos/{repo}/branches", json={"name": "dev", "source": "main"}).status_code == 201
        put(c, repo, "data/other.txt", b"other", branch="dev")
        commit(c, repo, "other", branch="dev")
        assert c.post(f"{API}/repos/{repo}/branches/main/merge", json={"source": "dev"}).status_code == 201
        assert c.post(f"{API}/repos/{repo}/tags", json={"name": "v1", "ref": "main"}).status_code == 201
        lst = c.get(f"{API}/repos/{repo}/refs/v1/list", params={"prefix": "data/"}).json()
        assert [e["path"] for e in lst["entries"]] == ["data/blob.bin", "data/other.txt"]
        diff = c.get(f"{API}/repos/{repo}/refs/{first['id']}/diff/v1").json()
        assert diff["changes"] == [{"path": "data/other.txt", "type": "added", "size": 5}]
        log = c.get(f"{API}/repos/{repo}/refs/main/log").json()["commits"]
        assert len(log) == 4  # merge, other, blob, repository created
        r = c.post(f"{API}/chunks/missing", json={"ids": ["00" * 32]})
        assert r.json() == {"missing": ["00" * 32]}
        assert c.post(f"{API}/admin/fsck").json()["ok"] is True
        assert c.delete(f"{API}/repos/{repo}").status_code == 204
        expect_error(c.get(f"{API}/repos/{repo}/branches"), 404, repo)
        json.dumps(c.get(f"{API}/stats").json())
