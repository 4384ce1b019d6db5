"""The web console in a real browser: playwright driving Debian's chromium, headless, against
a real hub and spoke (tests/env.py). With ``FABRIC_SCREENSHOTS=1`` the tests save
screenshots of the main pages to docs/img/console-*.png."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.ci_requirements import requires
from tests.console_env import HOSTILE_MESSAGE, HOSTILE_NAME, ConsoleEnv, console_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOTS = os.path.join(ROOT, "docs", "img")


def chromium_path() -> str | None:
    return os.environ.get("FABRIC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if chromium_path() is None:
        return "chromium is not installed (scripts/install-system-deps.sh installs Debian's chromium)"
    return None


pytestmark = [requires(browser_missing), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[ConsoleEnv]:
    with console_env(tmp_path_factory.mktemp("console")) as e:
        yield e


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)  # the `requires` mark has already failed the test under CI
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser):  # noqa: ANN001, ANN201 - playwright types
    context = browser.new_context(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
    p = context.new_page()
    p.set_default_timeout(15000)
    dialogs: list[str] = []
    p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    p.dialogs = dialogs
    yield p
    context.close()


def shot(page, name: str) -> None:  # noqa: ANN001
    """Save a screenshot (with FABRIC_SCREENSHOTS=1), once the page is styled by the console's stylesheet."""
    assert page.evaluate("getComputedStyle(document.body).marginTop") == "0px", f"{name}: stylesheet not applied"
    if os.environ.get("FABRIC_SCREENSHOTS") == "1":
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"console-{name}.png"))


def sign_in(page, base: str, token: str, path: str = "/ui/repos") -> None:  # noqa: ANN001
    page.goto(base + path)
    assert "/ui/signin" in page.url
    page.fill("#token", token)
    page.click("#signin")
    page.wait_for_url(base + path)


def test_browse_preview_diff_plots_and_sign_out(env: ConsoleEnv, page) -> None:  # noqa: ANN001
    base = env.spoke.url
    # Reads through the spoke as a job, so its plots and job table have data.
    client = httpx.Client(base_url=env.spoke.api, headers={"Authorization": f"Bearer {env.hub.token}", "X-Fabric-Job": "train-7"})
    for _ in range(3):
        for i in range(2, 60):
            client.get(f"/repos/{env.repo}/refs/main/objects", params={"path": f"big/shard-{i:05d}.bin"}).raise_for_status()
        client.get(f"/repos/{env.repo}/refs/main/objects", params={"path": "data/table.parquet"}).raise_for_status()
        time.sleep(0.4)

    sign_in(page, base, env.hub.token)
    assert page.locator(f"a.repo:text-is('{env.repo}')").count() == 1
    shot(page, "repos")

    page.click(f"a.repo:text-is('{env.repo}')")
    page.wait_for_selector("#branches")
    assert page.locator("#branches tbody tr").count() >= 1
    shot(page, "repo")

    page.click("nav.tabs >> text=History")
    page.wait_for_selector("#log")
    assert page.locator("#log tbody tr").count() == 3  # the empty first commit and two imports
    shot(page, "log")
    page.locator("#log tbody tr").first.locator("a.mono").click()
    page.wait_for_selector("#changes")
    assert "notes/extra.txt" in page.inner_text("#changes")

    page.goto(base + f"/ui/repos/{env.repo}/diff?left={env.first}&right=main")
    rows = page.locator("#changes tbody tr")
    assert rows.count() == 3
    assert page.locator("#changes tr.removed").count() == 1 and page.locator("#changes tr.added").count() == 1
    shot(page, "diff")

    page.goto(base + f"/ui/repos/{env.repo}/tree")
    page.click("#tree >> text=data")
    page.click("#tree >> text=train.csv")
    page.wait_for_selector("#preview table")
    assert page.locator("#preview tbody tr").count() == 20
    assert page.locator("#preview th").all_inner_texts() == ["id", "label", "score"]
    shot(page, "preview-csv")
    with page.expect_download() as download:
        page.click("#download")
    assert download.value.suggested_filename == "train.csv"

    page.goto(base + f"/ui/repos/{env.repo}/file?path=data/table.parquet")
    assert page.locator("#preview tbody tr").count() == 20
    shot(page, "preview-parquet")
    page.goto(base + f"/ui/repos/{env.repo}/file?path=images/sample.png")
    page.wait_for_function("document.querySelector('#preview img').naturalWidth > 0")
    assert page.evaluate("document.querySelector('#preview img').naturalWidth") == 48

    page.goto(base + f"/ui/repos/{env.repo}/tree?path=big")
    assert page.locator("#tree tbody tr").count() == 200
    page.click("#next")
    page.wait_for_url("**after=**")
    assert page.locator("#tree tbody tr").count() == 200
    shot(page, "tree")

    page.click("#nav-health")
    page.wait_for_selector("svg.chart")
    assert page.inner_text("#watch-state") == "live" and page.inner_text("#hub-reachable") == "reachable"
    points = page.eval_on_selector_all("svg.chart polyline.series", "els => els.map(e => e.points.numberOfItems)")
    assert len(points) >= 4 and max(points) >= 2, points
    # each plot's lines lie inside its drawing area
    assert page.eval_on_selector_all("svg.chart", "els => els.every(e => e.getBBox().width > 0)")
    assert "train-7" in page.inner_text("#jobs")
    shot(page, "spoke-health")

    page.click("#signout")
    page.wait_for_url("**/ui/signin**")
    page.goto(base + "/ui/repos")
    assert "/ui/signin" in page.url
    assert page.dialogs == []


def test_hub_shows_its_spokes(env: ConsoleEnv, page) -> None:  # noqa: ANN001
    sign_in(page, env.hub.url, env.hub.token, "/ui/spokes")
    live = page.locator("#streams tr.live")
    assert live.count() >= 1
    assert "connected" in live.first.inner_text()
    assert page.eval_on_selector_all("svg.chart polyline.series", "els => Math.max(...els.map(e => e.points.numberOfItems))") >= 2
    shot(page, "hub-spokes")


def test_reader_sees_nothing_of_another_repository(env: ConsoleEnv, page) -> None:  # noqa: ANN001
    sign_in(page, env.hub.url, env.reader)
    text = page.inner_text("main")
    assert env.repo in text and env.secret not in text
    assert page.locator("#nav-spokes").count() == 0
    for path in (f"/ui/repos/{env.secret}", f"/ui/repos/{env.secret}/tree?path=private", f"/ui/repos/{env.secret}/log"):
        response = page.goto(env.hub.url + path)
        assert response.status == 404
        assert page.inner_text("h1") == "Not found" and "secret plans" not in page.content()
    # and the repository it may read has no write forms
    page.goto(env.hub.url + f"/ui/repos/{env.repo}")
    assert page.locator("text=Create branch").count() == 0


def test_hostile_names_and_messages_stay_inert(env: ConsoleEnv, page) -> None:  # noqa: ANN001
    sign_in(page, env.spoke.url, env.reader)
    page.goto(env.spoke.url + f"/ui/repos/{env.repo}/tree?path=evil")
    link = page.locator("#tree tbody a")
    assert link.inner_text() == HOSTILE_NAME  # shown as text
    assert page.locator("#tree img").count() == 0
    link.click()
    page.wait_for_selector("#preview")
    assert page.inner_text("strong.filename") == HOSTILE_NAME
    assert "<script>alert('content')</script>" in page.inner_text("#preview")
    page.goto(env.spoke.url + f"/ui/repos/{env.repo}/log")
    assert HOSTILE_MESSAGE in page.inner_text("#log")
    page.goto(env.spoke.url + f"/ui/repos/{env.repo}/commits/{env.second}")
    assert page.inner_text("pre.message") == HOSTILE_MESSAGE
    assert page.locator("main b").count() == 0 and page.locator("main script").count() == 0
    page.goto(env.spoke.url + f"/ui/repos/{env.repo}/file?path=page.html")
    assert "<script>alert('page')</script>" in page.inner_text("#preview")
    page.wait_for_timeout(300)
    assert page.dialogs == []
