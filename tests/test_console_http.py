"""The web console over plain HTTP, against a real hub and spoke: sessions and cookies,
CSRF, access between repositories, pagination, escaping, downloads, health and spokes pages.
(The browser tests are tests/test_console.py.)"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest

from fabric.api.console.sessions import SessionStore
from tests.console_env import BIG_DIR_FILES, HOSTILE_MESSAGE, HOSTILE_NAME, ConsoleEnv, console_env
from tests.hubserver import unique_name

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[ConsoleEnv]:
    with console_env(tmp_path_factory.mktemp("console")) as e:
        yield e


def bases(env: ConsoleEnv) -> list[str]:
    return [env.hub.url, env.spoke.url]


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def test_pages_need_a_session(env: ConsoleEnv) -> None:
    for base in bases(env):
        r = httpx.get(base + f"/ui/repos/{env.repo}/tree?path=big")
        assert r.status_code == 303
        assert r.headers["location"].startswith("/ui/signin?next=")
        # A bearer token does not open console pages: only a session does.
        r = httpx.get(base + "/ui/repos", headers={"Authorization": f"Bearer {env.hub.token}"})
        assert r.status_code == 303


def test_signin_cookie_flags_and_token_never_shown(env: ConsoleEnv) -> None:
    for base in bases(env):
        c = httpx.Client(base_url=base, follow_redirects=False)
        form = c.get("/ui/signin")
        assert "Content-Security-Policy" in form.headers and "default-src 'self'" in form.headers["Content-Security-Policy"]
        r = c.post("/ui/signin", data={"token": env.reader, "csrf": csrf_of(form.text), "next": "/ui/repos"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/repos"
        cookie = next(v for v in r.headers.get_list("set-cookie") if v.startswith("fabric_console="))
        flags = [f.strip().lower() for f in cookie.split(";")]
        assert "httponly" in flags and "samesite=strict" in flags and "path=/ui" in flags
        assert env.reader not in cookie
        seen = []
        for path in ("/ui/repos", f"/ui/repos/{env.repo}", f"/ui/repos/{env.repo}/log", f"/ui/repos/{env.repo}/tree",
                     f"/ui/repos/{env.repo}/file?path=README.md", f"/ui/repos/{env.repo}/commits/{env.second}"):  # fmt: skip
            page = c.get(path)
            assert page.status_code == 200, (path, page.text[:300])
            assert page.headers["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
            seen.append(page.text)
            assert env.reader not in page.text and env.reader not in str(page.url)
        assert env.repo in seen[0]
    # Nor in the services' logs (the sign-ins above went to both).
    for log in (env.hub.log(), env.spoke.log()):
        assert env.reader not in log


def test_bad_token_and_forged_signin_are_refused(env: ConsoleEnv) -> None:
    c = httpx.Client(base_url=env.hub.url, follow_redirects=False)
    form = c.get("/ui/signin")
    r = c.post("/ui/signin", data={"token": "fabric_not-a-token", "csrf": csrf_of(form.text)})
    assert r.status_code == 401 and "not accepted" in r.text
    assert "fabric_console=" not in r.headers.get("set-cookie", "")
    # A sign-in posted without the form's own cookie (a cross-site form) is refused.
    other = httpx.Client(base_url=env.hub.url, follow_redirects=False)
    r = other.post("/ui/signin", data={"token": env.reader, "csrf": csrf_of(form.text)})
    assert r.status_code == 403 and "fabric_console=" not in r.headers.get("set-cookie", "")
    # After a sign-in, ``next`` never leads off the console.
    r = c.post("/ui/signin", data={"token": env.reader, "csrf": csrf_of(form.text), "next": "//evil.example/x"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/repos"


def test_writes_need_csrf_token_and_write_role(env: ConsoleEnv) -> None:
    for base in bases(env):
        writer = env.session(base, env.writer)
        page = writer.get(f"/ui/repos/{env.repo}")
        token = csrf_of(page.text)
        name = unique_name("br")
        url = f"/ui/repos/{env.repo}/branches"
        assert writer.post(url, data={"name": name, "source": "main"}).status_code == 403
        assert writer.post(url, data={"name": name, "source": "main", "csrf": "x" + token}).status_code == 403
        cross = writer.post(url, data={"name": name, "source": "main", "csrf": token}, headers={"Origin": "https://evil.example"})
        assert cross.status_code == 403
        assert name not in [b["name"] for b in env.hub.plane().list_branches(env.repo)]
        ok = writer.post(url, data={"name": name, "source": "main", "csrf": token})
        assert ok.status_code == 303, ok.text
        assert name in [b["name"] for b in env.hub.plane().list_branches(env.repo)]
        tag = unique_name("t")
        ok = writer.post(f"/ui/repos/{env.repo}/tags", data={"name": tag, "ref": env.first, "csrf": token})
        assert ok.status_code == 303
        assert {"name": tag, "commit_id": env.first} in env.hub.plane().list_tags(env.repo)
        # A reader's session has a valid CSRF token but not the role.
        reader = env.session(base, env.reader)
        page = reader.get(f"/ui/repos/{env.repo}")
        assert "Create branch" not in page.text
        denied = reader.post(url, data={"name": unique_name("br"), "source": "main", "csrf": csrf_of(page.text)})
        assert denied.status_code == 403


def test_other_repositories_stay_invisible(env: ConsoleEnv) -> None:
    for base in bases(env):
        reader = env.session(base, env.reader)
        listing = reader.get("/ui/repos").text
        assert env.repo in listing and env.secret not in listing
        missing = unique_name("nosuch")
        for template in ("/ui/repos/{}", "/ui/repos/{}/tree?path=private", "/ui/repos/{}/file?path=private/plan.txt",
                         "/ui/repos/{}/raw?path=private/plan.txt", "/ui/repos/{}/log", "/ui/repos/{}/diff?left=main~1&right=main"):  # fmt: skip
            secret, absent = reader.get(template.format(env.secret)), reader.get(template.format(missing))
            assert secret.status_code == absent.status_code == 404, template
            assert secret.text.replace(env.secret, "R") == absent.text.replace(missing, "R")
            assert "secret plans" not in secret.text
        # The service pages need read access to every repository.
        assert reader.get("/ui/health").status_code in (303, 404)
        assert reader.get("/ui/spokes").status_code in (303, 404)
        admin = env.session(base, env.hub.token)
        assert env.secret in admin.get("/ui/repos").text


def test_directory_listing_is_paginated(env: ConsoleEnv) -> None:
    for base in bases(env):
        c = env.session(base, env.reader)
        names: list[str] = []
        url = f"/ui/repos/{env.repo}/tree?path=big"
        pages = 0
        while url:
            page = c.get(url)
            assert page.status_code == 200
            names += re.findall(r">(shard-\d+\.bin)</a>", page.text)
            nxt = re.search(r'id="next" href="([^"]+)"', page.text)
            url = nxt.group(1).replace("&amp;", "&") if nxt else None
            pages += 1
        assert pages == 3
        assert len(names) == len(set(names)) == BIG_DIR_FILES - 1  # one was removed in the second commit
        assert names == sorted(names)


def test_diff_and_commit_pages(env: ConsoleEnv) -> None:
    for base in bases(env):
        c = env.session(base, env.reader)
        page = c.get(f"/ui/repos/{env.repo}/diff", params={"left": env.first, "right": env.second})
        assert page.status_code == 200
        text = page.text
        assert "1 added" in text and "1 changed" in text and "1 removed" in text
        assert "notes/extra.txt" in text and "big/shard-00001.bin" in text and "data/train.csv" in text
        # A diff of more than a page: the whole big directory against the first commit's parent (empty).
        first = c.get(f"/ui/repos/{env.repo}/diff", params={"left": f"{env.first}~1", "right": env.first})
        assert "200 added" in first.text and 'id="next"' in first.text
        log = c.get(f"/ui/repos/{env.repo}/log")
        assert env.second[:12] in log.text and env.first[:12] in log.text
        assert "+" in log.text  # size changes
        commit = c.get(f"/ui/repos/{env.repo}/commits/{env.second[:16]}")
        assert commit.status_code == 200 and "notes/extra.txt" in commit.text


def test_hostile_names_and_messages_are_escaped(env: ConsoleEnv) -> None:
    for base in bases(env):
        c = env.session(base, env.reader)
        pages = [
            c.get(f"/ui/repos/{env.repo}/tree?path=evil").text,
            c.get(f"/ui/repos/{env.repo}/file", params={"path": f"evil/{HOSTILE_NAME}"}).text,
            c.get(f"/ui/repos/{env.repo}/log").text,
            c.get(f"/ui/repos/{env.repo}/commits/{env.second}").text,
            c.get("/ui/repos").text,
            c.get(f"/ui/repos/{env.repo}/file", params={"path": "page.html"}).text,
        ]
        joined = "\n".join(pages)
        assert "<img src=x" not in joined and "<script>" not in joined and "<b>loader" not in joined
        assert "&lt;img src=x onerror=alert(1)&gt;" in pages[0]
        assert "&lt;script&gt;alert(" in pages[2]
        assert "&lt;script&gt;alert(&#39;page&#39;)" in pages[5]
        assert HOSTILE_MESSAGE not in joined


def test_previews_and_downloads(env: ConsoleEnv) -> None:
    for base in bases(env):
        c = env.session(base, env.reader)
        csv_page = c.get(f"/ui/repos/{env.repo}/file?path=data/train.csv").text
        assert "<th>label</th>" in csv_page and "cat-3" in csv_page and "First 20 rows" in csv_page
        pq_page = c.get(f"/ui/repos/{env.repo}/file?path=data/table.parquet").text
        assert "<th>score</th>" in pq_page and "of 100" in pq_page
        png_page = c.get(f"/ui/repos/{env.repo}/file?path=images/sample.png").text
        assert "raw?ref=main&amp;path=images%2Fsample.png&amp;inline=1" in png_page
        image = c.get(f"/ui/repos/{env.repo}/raw?path=images/sample.png&inline=1")
        assert image.status_code == 200 and image.headers["content-type"] == "image/png" and image.content.startswith(b"\x89PNG")
        assert image.headers["x-content-type-options"] == "nosniff"
        # HTML (or anything not a plain image) is never served inline, even when asked.
        html = c.get(f"/ui/repos/{env.repo}/raw?path=page.html&inline=1")
        assert html.headers["content-type"] == "application/octet-stream"
        assert html.headers["content-disposition"].startswith("attachment;")
        assert "sandbox" in html.headers["content-security-policy"]
        evil = c.get(f"/ui/repos/{env.repo}/raw", params={"path": f"evil/{HOSTILE_NAME}"})
        assert evil.status_code == 200
        assert re.fullmatch(r"attachment; filename=\"[A-Za-z0-9._-]+\"; filename\*=UTF-8''[^\"\s;<>]+", evil.headers["content-disposition"])
        assert c.get(f"/ui/repos/{env.repo}/raw?path=README.md").content.startswith(b"# Datasets")


def test_signout_ends_the_session(env: ConsoleEnv) -> None:
    c = env.session(env.spoke.url, env.reader)
    page = c.get("/ui/repos")
    cookie = c.cookies.get("fabric_console")
    r = c.post("/ui/signout", data={"csrf": csrf_of(page.text)})
    assert r.status_code == 303
    assert c.get("/ui/repos").status_code == 303
    # The old cookie, replayed, opens nothing.
    replay = httpx.get(env.spoke.url + "/ui/repos", cookies={"fabric_console": cookie})
    assert replay.status_code == 303


def test_revoked_token_ends_its_sessions(env: ConsoleEnv) -> None:
    admin = env.hub.plane()
    tok = admin.create_token(unique_name("shortlived"), roles={env.repo: "read"})
    c = env.session(env.hub.url, tok["token"])
    assert c.get("/ui/repos").status_code == 200
    admin.revoke_token(tok["id"])
    deadline = time.time() + 10
    while c.get("/ui/repos").status_code == 200 and time.time() < deadline:
        time.sleep(0.5)
    assert c.get("/ui/repos").status_code == 303


def test_spoke_health_has_plots(env: ConsoleEnv) -> None:
    c = env.session(env.spoke.url, env.hub.token)
    # Reads through the spoke (as a job) so the hit ratio and WAN plots have something to show.
    plane = httpx.Client(base_url=env.spoke.api, headers={"Authorization": f"Bearer {env.hub.token}", "X-Fabric-Job": "train-1"})
    for _ in range(3):
        for i in range(0, 40):
            plane.get(f"/repos/{env.repo}/refs/main/objects", params={"path": f"big/shard-{i + 2:05d}.bin"}).raise_for_status()
        time.sleep(0.5)
    page = c.get("/ui/health").text
    assert 'id="hub-reachable">reachable' in page and 'id="watch-state">live' in page
    counts = [int(n) for n in re.findall(r'<polyline class="series" data-series="[^"]*" data-points="(\d+)"', page)]
    assert len(counts) >= 4 and max(counts) >= 2
    assert "hit ratio" in page and "received demand" in page
    assert "train-1" in page


def test_hub_lists_its_spokes(env: ConsoleEnv) -> None:
    c = env.session(env.hub.url, env.hub.token)
    page = c.get("/ui/spokes")
    assert page.status_code == 200
    rows = re.findall(r'<tr class="live">(.*?)</tr>', page.text, re.S)
    assert rows, page.text
    lags = [int(m) for row in rows for m in re.findall(r'<td class="num">\d+</td><td class="num">(\d+)</td>', row)]
    assert lags and min(lags) == 0
    assert 'data-points="' in page.text
    # the spoke page redirects to the right page per role
    assert c.get("/ui/health").headers["location"] == "/ui/spokes"


def test_session_store_is_bounded_and_expires() -> None:
    store = SessionStore(max_sessions=3, lifetime=0.2)
    sessions = [store.create(f"t{i}") for i in range(5)]
    assert len(store) == 3
    assert store.get(sessions[0].sid) is None and store.get(sessions[4].sid) is not None
    time.sleep(0.25)
    assert store.get(sessions[4].sid) is None
    assert store.get(None) is None and store.get("") is None


def test_url_building_quotes_everything() -> None:
    from fabric.api.console.views import _download_name, _safe_next, repo_url

    assert repo_url("r", "file", path="a b/<c>&d") == "/ui/repos/r/file?path=a+b%2F%3Cc%3E%26d"
    assert _safe_next("https://evil.example") == "/ui/repos" and _safe_next("/ui/repos/x") == "/ui/repos/x"
    assert _safe_next("/ui/\\evil") == "/ui/repos"
    header = _download_name('x/"quoted"\r\nname.bin')
    assert "\r" not in header and "\n" not in header and header.count('"') == 2
    assert urllib.parse.unquote(header.split("UTF-8''")[1]) == '"quoted"\r\nname.bin'
