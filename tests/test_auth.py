"""Authentication and authorization of a real hub: tokens, roles, revocation, bootstrap, logs."""

from __future__ import annotations

import os
import re
import stat

import httpx
import msgpack

from tests.hubserver import Hub, start_hub, unique_name
from tests.test_rest_api import expect_error

API = "/api/v1"
NO_AUTH_ROUTES = {("GET", "/healthz")}


# -- helpers --------------------------------------------------------------------
def make_token(hub: Hub, name: str, roles: dict | None = None, admin: bool = False) -> dict:
    with hub.client() as c:
        r = c.post(f"{API}/tokens", json={"name": name, "admin": admin, "roles": roles or {}})
        assert r.status_code == 201, r.text
        return r.json()


def make_repo(hub: Hub, stem: str) -> str:
    name = unique_name(stem)
    with hub.client() as c:
        assert c.post(f"{API}/repos", json={"name": name}).status_code == 201
        r = c.put(f"{API}/repos/{name}/branches/main/objects", params={"path": "f.txt"}, content=b"hello")
        assert r.status_code == 201, r.text
        assert c.post(f"{API}/repos/{name}/branches/main/commits", json={"message": "f"}).status_code == 201
    return name


def operations(hub: Hub) -> list[tuple[str, str]]:
    spec = httpx.get(hub.url + "/openapi.json").json()
    return [(m.upper(), p) for p, ops in spec["paths"].items() for m in ops if m in ("get", "post", "put", "delete", "head", "patch")]


JSON_BODIES = {
    ("POST", "/api/v1/repos"): {"name": "auth-probe-repo"},
    ("POST", "/api/v1/repos/{repo}/branches"): {"name": "probe", "source": "main"},
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/reset"): {"ref": "main"},
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/revert"): {"commit": "main"},
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/merge"): {"source": "main"},
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/commits"): {"message": "m", "allow_empty": True},
    ("POST", "/api/v1/repos/{repo}/tags"): {"name": "probe", "ref": "main"},
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/objects/delete"): {"paths": ["f.txt"]},
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/objects/copy"): {"src_ref": "main", "src_path": "f.txt", "dest_path": "g"},
    ("POST", "/api/v1/chunks/missing"): {"ids": ["00" * 32]},
    ("POST", "/api/v1/chunks/frames"): {"ids": []},
    ("POST", "/api/v1/tokens"): {"name": "probe"},
}
RAW_BODIES = {
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/commit-changes"): msgpack.packb({"changes": {}, "message": "m"}),
    ("POST", "/api/v1/repos/{repo}/branches/{branch}/entries"): msgpack.packb({"changes": {}}),
    ("PUT", "/api/v1/repos/{repo}/branches/{branch}/objects"): b"data",
    ("POST", "/api/v1/chunks/packs"): b"not a pack",
}


def request(c: httpx.Client, method: str, template: str, repo: str) -> httpx.Response:
    """A well-formed request to one operation, aimed at ``repo``."""
    values = {"repo": repo, "branch": "main", "ref": "main", "left": "main", "right": "main", "commit_id": "main", "tag": "probe", "token_id": "nosuch"}
    url = re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "probe"), template)
    params: dict = {}
    if template.endswith(("/objects", "/stat", "/entry")):
        params["path"] = "f.txt"
    if template.endswith("/watch"):
        params.update(once="true", repo=repo, since=0)
    kwargs: dict = {"params": params}
    if template.endswith("/chunks/share"):
        kwargs["json"] = {"source_repo": repo, "ids": []}
    elif (method, template) in JSON_BODIES:
        kwargs["json"] = JSON_BODIES[(method, template)]
    elif (method, template) in RAW_BODIES:
        kwargs["content"] = RAW_BODIES[(method, template)]
    return c.request(method, url, **kwargs)


# -- 401 ------------------------------------------------------------------------
def test_every_operation_needs_a_token(hub: Hub):
    repo = make_repo(hub, "auth401")
    ops = [op for op in operations(hub) if op not in NO_AUTH_ROUTES]
    assert len(ops) >= 40
    wrong = [
        None,
        "fab_0123456789ab_notthesecret",  # well formed, unknown
        "garbage",  # malformed
        hub.token[:-3] + "xyz",  # the admin token with a wrong secret
    ]
    failures = []
    for token in wrong:
        with hub.client(token=token) as c:
            for method, path in ops:
                r = request(c, method, path, repo)
                if r.status_code != 401:
                    failures.append(f"{method} {path} with {token!r}: {r.status_code} {r.text[:200]}")
                    continue
                if method != "HEAD":
                    err = r.json()["error"]
                    if err["code"] != "unauthorized" or not err["message"]:
                        failures.append(f"{method} {path}: bad error document {err}")
                if not r.headers.get("www-authenticate", "").startswith("Bearer"):
                    failures.append(f"{method} {path}: no WWW-Authenticate: Bearer header")
    assert not failures, "\n".join(failures)
    with hub.client(token=None) as c:
        err = expect_error(c.get(f"{API}/repos"), 401, "Bearer", "admin.token")
        assert err["code"] == "unauthorized"
        expect_error(c.get(f"{API}/repos", headers={"Authorization": "Basic dXNlcjpwdw=="}), 401, "Bearer")
        expect_error(c.get(f"{API}/repos", headers={"Authorization": "Bearer fab_0123456789ab_x"}), 401, "unknown token")
        expect_error(c.get(f"{API}/repos", headers={"Authorization": "Bearer nope"}), 401, "malformed token")
        # The service endpoints stay open: health checks and scrapers carry no token.
        assert c.get("/healthz").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert c.get("/openapi.json").status_code == 200


# -- 403 ------------------------------------------------------------------------
def test_token_for_repo_a_cannot_touch_repo_b(hub: Hub):
    a, b = make_repo(hub, "auth-a"), make_repo(hub, "auth-b")
    tok = make_token(hub, "a-writer", {a: "write"})
    with hub.client(token=tok["token"]) as c:
        # Its own repository works...
        assert c.get(f"{API}/repos/{a}").status_code == 200
        assert c.get(f"{API}/repos/{a}/refs/main/objects", params={"path": "f.txt"}).content == b"hello"
        # ...B is invisible in the list and every B route is 403, naming the token and repository.
        names = [r["name"] for r in c.get(f"{API}/repos").json()]
        assert a in names and b not in names
        failures = []
        for method, path in operations(hub):
            if "{repo}" not in path:
                continue
            r = request(c, method, path, b)
            if r.status_code != 403:
                failures.append(f"{method} {path}: {r.status_code} {r.text[:200]}")
            elif method != "HEAD":
                msg = r.json()["error"]["message"]
                if b not in msg or "a-writer" not in msg:
                    failures.append(f"{method} {path}: message does not name the token and repository: {msg}")
        assert not failures, "\n".join(failures)
        expect_error(c.get(f"{API}/watch", params={"repo": b, "once": "true"}), 403, b)
        # The unfiltered watch stream carries only A's events.
        lines = [ln for ln in c.get(f"{API}/watch", params={"once": "true", "since": 0}).text.splitlines() if "heartbeat" not in ln]
        assert lines and all(f'"repo": "{a}"' in line for line in lines), lines[:5]
    with hub.client() as admin:
        assert admin.get(f"{API}/repos/{b}/branches").json()[0]["name"] == "main"  # B untouched
        assert [t["name"] for t in admin.get(f"{API}/repos/{b}/tags").json()] == []


def test_reader_cannot_write(hub: Hub):
    repo = make_repo(hub, "auth-r")
    tok = make_token(hub, "reader", {repo: "read"})
    with hub.client(token=tok["token"]) as c:
        assert c.get(f"{API}/repos/{repo}/refs/main/list").status_code == 200
        assert c.get(f"{API}/repos/{repo}/refs/main/log").status_code == 200
        assert c.get(f"{API}/repos/{repo}/refs/main/objects", params={"path": "f.txt"}, headers={"Range": "bytes=1-2"}).content == b"el"
        # Store-wide answers are not for a token of one repository; its own repository's chunks are.
        expect_error(c.get(f"{API}/stats"), 403, "reader", "every repository")
        expect_error(c.post(f"{API}/chunks/frames", json={"ids": []}), 403, "reader", "?repo=")
        assert c.post(f"{API}/chunks/frames", json={"ids": []}, params={"repo": repo}).status_code == 200
        writes = [
            op
            for op in operations(hub)
            if op[0] != "GET" and op[0] != "HEAD" and "{repo}" in op[1] and not op[1].endswith("/hints")
        ]  # (a hint is a POST that only says what a reader will read: readers may send one)
        assert len(writes) >= 15
        failures = []
        for method, path in writes:
            r = request(c, method, path, repo)
            if r.status_code != 403:
                failures.append(f"{method} {path}: {r.status_code} {r.text[:200]}")
            elif "reader" not in r.json()["error"]["message"]:
                failures.append(f"{method} {path}: {r.json()}")
        assert not failures, "\n".join(failures)
        expect_error(c.post(f"{API}/chunks/missing", json={"ids": []}, params={"repo": repo}), 403, "reader", "write")
        expect_error(c.post(f"{API}/chunks/packs", content=b"x"), 403, "reader")
    with hub.client() as admin:  # nothing changed
        assert [b["name"] for b in admin.get(f"{API}/repos/{repo}/branches").json()] == ["main"]
        assert admin.get(f"{API}/repos/{repo}/branches/main/changes").json()["changes"] == []
        assert admin.get(f"{API}/repos/{repo}/refs/main/objects", params={"path": "f.txt"}).content == b"hello"


def test_write_and_repo_admin_roles(hub: Hub):
    repo = make_repo(hub, "auth-w")
    writer = make_token(hub, "writer", {repo: "write"})
    owner = make_token(hub, "owner", {repo: "admin"})
    with hub.client(token=writer["token"]) as c:
        r = c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "w.txt"}, content=b"w")
        assert r.status_code == 201
        assert c.post(f"{API}/repos/{repo}/branches/main/commits", json={"message": "w"}).json()["author"] == "writer"
        assert c.post(f"{API}/chunks/missing", json={"ids": []}, params={"repo": repo}).json() == {"missing": []}
        expect_error(c.delete(f"{API}/repos/{repo}"), 403, "writer", "admin", repo)
        expect_error(c.post(f"{API}/repos", json={"name": unique_name("x")}), 403, "writer", "administrator")
    with hub.client(token=owner["token"]) as c:
        # A repository admin is not a global admin.
        for method, path in [("POST", f"{API}/tokens"), ("GET", f"{API}/tokens"), ("DELETE", f"{API}/tokens/{writer['id']}"), ("POST", f"{API}/admin/fsck"), ("POST", f"{API}/admin/gc")]:
            kwargs = {"json": {"name": "x"}} if path.endswith("/tokens") and method == "POST" else {}
            expect_error(c.request(method, path, **kwargs), 403, "owner", "administrator")
        expect_error(c.post(f"{API}/repos", json={"name": unique_name("x")}), 403, "owner")
        assert c.delete(f"{API}/repos/{repo}").status_code == 204


def test_wildcard_role(hub: Hub):
    a, b = make_repo(hub, "auth-wa"), make_repo(hub, "auth-wb")
    tok = make_token(hub, "all-reader", {"*": "read"})
    with hub.client(token=tok["token"]) as c:
        names = {r["name"] for r in c.get(f"{API}/repos").json()}
        assert {a, b} <= names
        assert c.get(f"{API}/repos/{b}/refs/main/objects", params={"path": "f.txt"}).content == b"hello"
        expect_error(c.put(f"{API}/repos/{b}/branches/main/objects", params={"path": "x"}, content=b"x"), 403, b)


def test_admin_only_endpoints(hub: Hub):
    repo = make_repo(hub, "auth-adm")
    plain = make_token(hub, "plain", {repo: "write"})
    with hub.client(token=plain["token"]) as c:
        for method, path, body in [
            ("POST", f"{API}/tokens", {"name": "evil", "admin": True}),
            ("GET", f"{API}/tokens", None),
            ("DELETE", f"{API}/tokens/{plain['id']}", None),
            ("POST", f"{API}/admin/fsck", None),
            ("POST", f"{API}/admin/gc", None),
        ]:
            expect_error(c.request(method, path, json=body), 403, "plain", "administrator")
        me = c.get(f"{API}/auth/whoami").json()
        assert me == {"token_id": plain["id"], "name": "plain", "admin": False, "roles": {repo: "write"}, "rights": []}
    with hub.client() as admin:
        assert admin.post(f"{API}/admin/fsck", params={"deep": "false"}).json()["ok"] is True
        assert admin.post(f"{API}/admin/gc", params={"dry_run": "true"}).status_code == 200
        assert admin.get(f"{API}/auth/whoami").json()["admin"] is True
        listed = admin.get(f"{API}/tokens").json()
        assert plain["id"] in {t["id"] for t in listed}
        assert plain["token"] not in str(listed) and plain["s3_secret_access_key"] not in str(listed)
        # Token creation validates its input.
        expect_error(admin.post(f"{API}/tokens", json={"name": "x", "roles": {repo: "owner"}}), 400, "roles")
        expect_error(admin.post(f"{API}/tokens", json={"name": ""}), 400, "name")


def test_new_admin_token_is_admin(hub: Hub):
    tok = make_token(hub, "ops", admin=True)
    assert tok["token"].startswith("fab_") and tok["s3_access_key_id"] and len(tok["s3_secret_access_key"]) >= 20
    with hub.client(token=tok["token"]) as c:
        name = unique_name("byops")
        assert c.post(f"{API}/repos", json={"name": name}).status_code == 201
        assert c.get(f"{API}/tokens").status_code == 200


def test_revoked_token_gets_401(hub: Hub):
    repo = make_repo(hub, "auth-rev")
    tok = make_token(hub, "short-lived", {repo: "read"})
    with hub.client(token=tok["token"]) as c:
        assert c.get(f"{API}/repos/{repo}").status_code == 200
        with hub.client() as admin:
            assert admin.delete(f"{API}/tokens/{tok['id']}").status_code == 204
            expect_error(admin.delete(f"{API}/tokens/{tok['id']}"), 404, tok["id"])
            expect_error(admin.delete(f"{API}/tokens/nosuchtoken"), 404, "nosuchtoken")
            row = next(t for t in admin.get(f"{API}/tokens").json() if t["id"] == tok["id"])
            assert row["revoked"] is True
        # Immediately, not after a cache expires.
        expect_error(c.get(f"{API}/repos/{repo}"), 401, "short-lived", "revoked")
        expect_error(c.get(f"{API}/auth/whoami"), 401, "revoked")


# -- bootstrap token and logs -------------------------------------------------------------
def test_bootstrap_token_file(tmp_path):
    data = tmp_path / "hub"
    with start_hub(data) as h:
        path = data / "admin.token"
        assert path.exists()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        first = path.read_text().strip()
        assert first == h.token and first.startswith("fab_")
        with h.client() as c:
            assert c.get(f"{API}/auth/whoami").json()["admin"] is True
            c.post(f"{API}/repos", json={"name": "survives"}).raise_for_status()
        assert "wrote a bootstrap admin token" in h.log()
    with start_hub(data) as h2:
        assert (data / "admin.token").read_text().strip() == first  # not rotated
        assert stat.S_IMODE(os.stat(data / "admin.token").st_mode) == 0o600
        with h2.client() as c:
            assert c.get(f"{API}/auth/whoami").json()["name"] == "bootstrap-admin"
            assert [t["name"] for t in c.get(f"{API}/tokens").json()].count("bootstrap-admin") == 1
            assert c.get(f"{API}/repos/survives").status_code == 200
        assert "wrote a bootstrap admin token" not in h2.log()


def test_tokens_never_appear_in_logs(tmp_path):
    secrets: list[str] = []
    with start_hub(tmp_path / "hub", args=["--log-level", "debug"]) as h:
        secrets.append(h.token)
        repo = make_repo(h, "logs")
        made = [make_token(h, f"t{i}", {repo: role}) for i, role in enumerate(["read", "write", "admin"])]
        made.append(make_token(h, "adm", admin=True))
        for t in made:
            secrets += [t["token"], t["s3_secret_access_key"]]
        wrong = ["fab_" + "a" * 12 + "_" + "wrongsecretwrongsecret", "totally-wrong-token-xyz", h.token + "tail"]
        secrets += wrong
        for t in made + [{"token": w} for w in wrong]:
            with h.client(token=t["token"]) as c:
                for _ in range(5):
                    c.get(f"{API}/repos/{repo}")
                    c.get(f"{API}/auth/whoami")
                    c.put(f"{API}/repos/{repo}/branches/main/objects", params={"path": "p"}, content=b"x")
                    c.get(f"{API}/tokens")
                    c.get(f"{API}/repos/{repo}/refs/main/objects", params={"path": "nope"})
        with h.client() as c:
            c.delete(f"{API}/tokens/{made[0]['id']}")
        with h.client(token=made[0]["token"]) as c:
            assert c.get(f"{API}/repos").status_code == 401
    log = h.log()
    assert "GET /api/v1/repos" in log  # the access log was captured
    leaked = []
    for s in secrets:
        pieces = [s] + ([s.split("_", 2)[2]] if s.startswith("fab_") and s.count("_") >= 2 else [])
        leaked += [p for p in pieces if len(p) >= 8 and p in log]
    assert not leaked, f"secrets in the hub log: {leaked}"


def test_no_auth_mode_lets_requests_through(tmp_path):
    with start_hub(tmp_path / "hub", no_auth=True) as h:
        assert "auth off" in h.log()
        with h.client(token=None) as c:
            assert c.get(f"{API}/auth/whoami").json()["admin"] is True
            name = unique_name("open")
            assert c.post(f"{API}/repos", json={"name": name}).status_code == 201
            assert c.put(f"{API}/repos/{name}/branches/main/objects", params={"path": "a"}, content=b"a").status_code == 201
            assert c.post(f"{API}/repos/{name}/branches/main/commits", json={"message": "a"}).status_code == 201
            assert c.get(f"{API}/repos/{name}/refs/main/objects", params={"path": "a"}).content == b"a"
            assert c.post(f"{API}/admin/fsck").json()["ok"] is True
            # A token is ignored, even a bad one.
            assert c.get(f"{API}/repos", headers={"Authorization": "Bearer junk"}).status_code == 200
