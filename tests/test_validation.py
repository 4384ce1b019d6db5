"""Bad paths and names are refused with a clear message and change nothing."""

from __future__ import annotations

import io

import pytest

from fabric.engine.engine import Engine
from fabric.errors import BadRequest, InvalidName, InvalidPath
from fabric.format.model import FILE, Entry
from fabric.format.paths import (
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    check_path,
    check_prefix,
    check_ref_name,
)

REPO = "datasets"

LONG_PATH = "/".join(["d" * 200] * 21)  # 4220 bytes of 200-byte names
assert len(LONG_PATH.encode()) > MAX_PATH_BYTES

#: (path, words the message must contain)
BAD_PATHS = [
    ("../etc/passwd", "'..'"),
    ("a/../../b", "'..'"),
    ("a/..", "'..'"),
    ("..", "'..'"),
    ("./a", "'.'"),
    ("a/./b", "'.'"),
    ("/etc/passwd", "absolute"),
    ("/", "absolute"),
    ("a//b", "empty segments"),
    ("a/", "empty segments"),
    ("", "empty"),
    ("a\x00b", "NUL"),
    ("\x00", "NUL"),
    ("x" * (MAX_NAME_BYTES + 1), f"longer than {MAX_NAME_BYTES} bytes"),
    ("dir/" + "é" * 128, f"longer than {MAX_NAME_BYTES} bytes"),  # 256 bytes in UTF-8
    (LONG_PATH, f"longer than {MAX_PATH_BYTES} bytes"),
    ("bad\udcffsurrogate", "UTF-8"),
]

GOOD_PATHS = [
    "a",
    "a/b/c.txt",
    "..a",
    "a..",
    "a/.hidden",
    "...",
    "with space/and-üñíçødé",
    "x" * MAX_NAME_BYTES,
    "dir/" + "é" * 127 + "a",  # 255 bytes
    "/".join(["d" * 255] * 16)[: MAX_PATH_BYTES - 16] + "/" + "e" * 15,
]

BAD_REF_NAMES = [
    "a/b",
    "feature/x",
    "a..b",
    "..",
    "-leading-dash",
    ".leading-dot",
    "trailing-dot.",
    "x.lock",
    "",
    "has space",
    "a~1",
    "a^",
    "a@b",
    "a:b",
    "nul\x00",
    "x" * 256,
    "0123456789abcdef" * 4,  # looks like a full commit id
]

GOOD_REF_NAMES = ["main", "dev", "feature-1", "v1.0", "release_2024", "_x", "deadbeef", "0123456789abcdef" * 3, "x" * 255]


def _ids(cases) -> list[str]:
    return [ascii(c[0] if isinstance(c, tuple) else c)[:40] for c in cases]


# -- the checks themselves ---------------------------------------------------


@pytest.mark.parametrize("path,words", BAD_PATHS, ids=_ids(BAD_PATHS))
def test_bad_paths_are_refused_with_the_reason(path: str, words: str) -> None:
    with pytest.raises(InvalidPath) as info:
        check_path(path)
    assert words in info.value.message
    assert "invalid path" in info.value.message
    assert info.value.status == 400 and info.value.code == "invalid_path"


@pytest.mark.parametrize("path", GOOD_PATHS, ids=_ids(GOOD_PATHS))
def test_good_paths_pass(path: str) -> None:
    assert len(path.encode()) <= MAX_PATH_BYTES
    assert check_path(path) == path


def test_path_length_limits_are_exact() -> None:
    exact = "/".join(["p" * 240] * 17)
    assert len(exact.encode()) == MAX_PATH_BYTES
    check_path(exact)
    with pytest.raises(InvalidPath):
        check_path(exact + "r")
    check_path("n" * MAX_NAME_BYTES)
    with pytest.raises(InvalidPath):
        check_path("n" * MAX_NAME_BYTES + "n")


def test_prefix_check() -> None:
    assert check_prefix("") == ""
    assert check_prefix("a/") == "a/"
    assert check_prefix("a/b") == "a/b"
    for bad in ["../", "/a", "a//", "a/../", "\x00"]:
        with pytest.raises(InvalidPath):
            check_prefix(bad)


@pytest.mark.parametrize("name", BAD_REF_NAMES, ids=_ids(BAD_REF_NAMES))
def test_bad_ref_names_are_refused(name: str) -> None:
    for what in ("branch", "tag"):
        with pytest.raises(InvalidName) as info:
            check_ref_name(name, what)
        assert f"invalid {what} name {name!r}" in info.value.message
        assert info.value.code == "invalid_name"


@pytest.mark.parametrize("name", GOOD_REF_NAMES, ids=_ids(GOOD_REF_NAMES))
def test_good_ref_names_pass(name: str) -> None:
    assert check_ref_name(name) == name


# -- through the engine: refused, and nothing changes -------------------------


def _state(e: Engine) -> tuple:
    repos = [r["name"] for r in e.list_repos()]
    refs = []
    for repo in repos:
        for b in e.list_branches(repo):
            refs.append(("branch", repo, b["name"], b["commit_id"], tuple(e.catalog.staged(repo, b["name"]))))
        for t in e.list_tags(repo):
            refs.append(("tag", repo, t["name"], t["commit_id"]))
    return repos, refs, e.catalog.stats(), sorted(o.key for o in e.store.list("packs/"))


@pytest.fixture
def e(engine: Engine) -> Engine:
    engine.create_repo(REPO)
    engine.put_object(REPO, "main", "existing/file", io.BytesIO(b"payload"))
    engine.commit(REPO, "main", "first")
    engine.create_branch(REPO, "dev", "main")
    engine.create_tag(REPO, "v1", "main")
    engine.put_object(REPO, "main", "staged/file", io.BytesIO(b"staged"))
    return engine


def test_bad_paths_through_the_engine_change_nothing(e: Engine) -> None:
    before = _state(e)
    for path, words in BAD_PATHS:
        calls = {
            "put_object": lambda p=path: e.put_object(REPO, "main", p, io.BytesIO(b"new bytes that would be stored" * 100)),
            "stage": lambda p=path: e.stage(REPO, "main", {p: Entry(kind=FILE)}),
            "stage-delete": lambda p=path: e.stage(REPO, "main", {p: None}),
            "delete_object": lambda p=path: e.delete_object(REPO, "main", p),
            "commit_changes": lambda p=path: e.commit_changes(REPO, "main", {"ok": Entry(kind=FILE), p: Entry(kind=FILE)}, "m"),
            "stat": lambda p=path: e.stat(REPO, "main", p),
            "read": lambda p=path: e.read(REPO, "main", p),
            "stat-at-tag": lambda p=path: e.stat(REPO, "v1", p),
        }
        for what, call in calls.items():
            with pytest.raises(InvalidPath) as info:
                call()
            assert words in info.value.message, (what, path)
    assert _state(e) == before


def test_bad_prefixes_and_log_paths_are_refused(e: Engine) -> None:
    before = _state(e)
    for bad in ["../", "/abs", "a//b", "a/../b/", "x\x00/"]:
        with pytest.raises(InvalidPath):
            e.list(REPO, "main", prefix=bad)
        with pytest.raises(InvalidPath):
            list(e.diff(REPO, "main", "dev", prefix=bad))
        with pytest.raises(InvalidPath):
            list(e.uncommitted(REPO, "main", prefix=bad))
    for bad in ["../x", "/abs", "a//b"]:
        with pytest.raises(InvalidPath):
            e.log(REPO, "main", path=bad)
    assert _state(e) == before


def test_bad_ref_names_through_the_engine_change_nothing(e: Engine) -> None:
    before = _state(e)
    for name in BAD_REF_NAMES:
        with pytest.raises(InvalidName) as info:
            e.create_branch(REPO, name, "main")
        assert f"invalid branch name {name!r}" in info.value.message
        with pytest.raises(InvalidName) as info:
            e.create_tag(REPO, name, "main")
        assert f"invalid tag name {name!r}" in info.value.message
        with pytest.raises(InvalidName):
            e.put_object(REPO, name, "some/file", io.BytesIO(b"bytes" * 1000))
        with pytest.raises(InvalidName):
            e.create_repo("another-repo", default_branch=name)
    assert _state(e) == before


def test_bad_repo_names_change_nothing(e: Engine) -> None:
    before = _state(e)
    for name in ["UPPER", "a", "bad_name", "../x", "x" * 64, "-dash"]:
        with pytest.raises(InvalidName):
            e.create_repo(name)
        with pytest.raises(InvalidName):
            e.delete_repo(name)
    assert _state(e) == before


def test_good_names_and_paths_work_end_to_end(e: Engine) -> None:
    for name in ["feature-1", "v1.0", "deadbeef", "x" * 255]:
        e.create_branch(REPO, name, "main")
    e.create_tag(REPO, "release_2024", "main")
    for i, path in enumerate(GOOD_PATHS):
        e.put_object(REPO, "feature-1", path, io.BytesIO(b"%d" % i))
    e.commit(REPO, "feature-1", "good paths")
    for i, path in enumerate(GOOD_PATHS):
        assert e.read(REPO, "feature-1", path) == b"%d" % i
    assert e.resolve(REPO, "deadbeef").branch == "deadbeef"


def test_invalid_ref_expression_is_a_bad_request(e: Engine) -> None:
    before = _state(e)
    for expr in ["", "~1", "main~x", "^"]:
        with pytest.raises(BadRequest):
            e.create_branch(REPO, "newbranch", expr)
    assert _state(e) == before


def test_list_after_with_nul_is_a_bad_request(e: Engine) -> None:
    before = _state(e)
    for after in ["a\x00", "\x00", "existing/\x00file"]:
        with pytest.raises(BadRequest):
            e.list(REPO, "main", after=after)
        with pytest.raises(BadRequest):
            e.list(REPO, "main", delimiter="/", after=after)
    assert _state(e) == before
