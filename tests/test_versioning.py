"""Versioning through the Engine, on SQLite and PostgreSQL (the ``engine`` fixture).

Repositories, branches, tags, objects, staging, commits, log, diff, merge,
revert, ref resolution, listing, and concurrency at the catalog level.
"""

from __future__ import annotations

import hashlib
import io
import random
import threading

import pytest

from fabric.engine.engine import Engine
from fabric.errors import (
    BadRequest,
    Conflict,
    InvalidName,
    MergeConflict,
    NotFound,
    RangeNotSatisfiable,
)
from fabric.format.model import DIR, FILE, INLINE_CHUNKS, Entry

REPO = "datasets"


@pytest.fixture
def e(engine: Engine) -> Engine:
    engine.create_repo(REPO)
    return engine


@pytest.fixture
def se(sqlite_engine: Engine) -> Engine:
    """For tests of the data path (chunks, reads), whose subject is not the catalog."""
    sqlite_engine.create_repo(REPO)
    return sqlite_engine


def put(e: Engine, path: str, data: bytes, branch: str = "main", repo: str = REPO) -> Entry:
    return e.put_object(repo, branch, path, io.BytesIO(data))


def commit_files(e: Engine, files: dict[str, bytes | None], message: str = "change", branch: str = "main") -> str:
    for path, data in files.items():
        if data is None:
            e.delete_object(REPO, branch, path)
        else:
            put(e, path, data, branch)
    return e.commit(REPO, branch, message).id


def empty_file(tag: int = 0) -> Entry:
    """A file entry without chunks (nothing to upload), distinguishable by mtime."""
    return Entry(kind=FILE, size=0, mtime_ns=tag)


def tree_paths(e: Engine, ref: str) -> dict[str, Entry]:
    return dict(e.trees.iter(e.resolve(REPO, ref).tree))


def staged(e: Engine, branch: str = "main") -> list:
    return list(e.catalog.staged(REPO, branch))


def rnd_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


# -- repositories ------------------------------------------------------------


def test_repo_create_list_get_delete(engine: Engine) -> None:
    assert engine.list_repos() == []
    r = engine.create_repo("images")
    assert r["name"] == "images" and r["default_branch"] == "main" and r["created"] > 0
    engine.create_repo("checkpoints", default_branch="trunk")
    assert [x["name"] for x in engine.list_repos()] == ["checkpoints", "images"]
    assert engine.get_repo("checkpoints")["default_branch"] == "trunk"
    assert [b["name"] for b in engine.list_branches("checkpoints")] == ["trunk"]
    assert engine.log("checkpoints", "trunk")[0].message == "Repository created"
    engine.delete_repo("images")
    assert [x["name"] for x in engine.list_repos()] == ["checkpoints"]
    with pytest.raises(NotFound):
        engine.get_repo("images")
    with pytest.raises(NotFound):
        engine.list_branches("images")


def test_repo_recreated_after_delete_starts_fresh(engine: Engine) -> None:
    engine.create_repo(REPO)
    put(engine, "a", b"hello")
    engine.commit(REPO, "main", "one")
    engine.create_branch(REPO, "dev", "main")
    engine.create_tag(REPO, "v1", "main")
    put(engine, "staged", b"x")
    engine.delete_repo(REPO)
    engine.create_repo(REPO)
    assert [b["name"] for b in engine.list_branches(REPO)] == ["main"]
    assert engine.list_tags(REPO) == []
    assert engine.list(REPO, "main").entries == []
    assert staged(engine) == []
    assert len(engine.log(REPO, "main")) == 1


def test_repo_errors(engine: Engine) -> None:
    engine.create_repo(REPO)
    with pytest.raises(Conflict) as info:
        engine.create_repo(REPO)
    assert REPO in info.value.message
    with pytest.raises(NotFound):
        engine.get_repo("nope-repo")
    with pytest.raises(NotFound):
        engine.delete_repo("nope-repo")
    with pytest.raises(NotFound):
        engine.resolve("nope-repo", "main")
    with pytest.raises(NotFound):
        put(engine, "a", b"x", repo="nope-repo")
    assert [r["name"] for r in engine.list_repos()] == [REPO]


INVALID_REPO_NAMES = ["ab", "A-repo", "my_repo", "-repo", "repo-", "re--po", "a" * 64, "re po", "rep/o", "", "...", "r\x00po"]


def test_invalid_repo_names(engine: Engine) -> None:
    for name in INVALID_REPO_NAMES:
        with pytest.raises(InvalidName) as info:
            engine.create_repo(name)
        assert repr(name) in info.value.message
        with pytest.raises(InvalidName):
            engine.get_repo(name)
        with pytest.raises(InvalidName):
            engine.delete_repo(name)
    assert engine.list_repos() == []
    engine.create_repo("abc")
    engine.create_repo("a" * 63)
    engine.create_repo("0-9")
    assert len(engine.list_repos()) == 3


def test_invalid_default_branch_creates_nothing(engine: Engine) -> None:
    with pytest.raises(InvalidName):
        engine.create_repo(REPO, default_branch="a/b")
    assert engine.list_repos() == []


# -- branches and tags -------------------------------------------------------


def test_branches_create_list_delete(e: Engine) -> None:
    c1 = commit_files(e, {"a": b"1"})
    b = e.create_branch(REPO, "dev", "main")
    assert b == {"name": "dev", "commit_id": c1}
    e.create_branch(REPO, "alpha", c1)
    assert [(x["name"], x["commit_id"]) for x in e.list_branches(REPO)] == [("alpha", c1), ("dev", c1), ("main", c1)]
    with pytest.raises(Conflict):
        e.create_branch(REPO, "dev", "main")
    with pytest.raises(NotFound):
        e.create_branch(REPO, "other", "no-such-ref")
    e.delete_branch(REPO, "alpha")
    assert [x["name"] for x in e.list_branches(REPO)] == ["dev", "main"]
    with pytest.raises(NotFound):
        e.delete_branch(REPO, "alpha")
    with pytest.raises(BadRequest):
        e.delete_branch(REPO, "main")
    assert [x["name"] for x in e.list_branches(REPO)] == ["dev", "main"]


def test_branch_from_older_commit_and_tag(e: Engine) -> None:
    c1 = commit_files(e, {"a": b"1"})
    c2 = commit_files(e, {"b": b"2"})
    e.create_tag(REPO, "v1", c1)
    assert e.create_branch(REPO, "from-tag", "v1")["commit_id"] == c1
    assert e.create_branch(REPO, "from-parent", "main~1")["commit_id"] == c1
    assert e.create_branch(REPO, "from-prefix", c2[:10])["commit_id"] == c2
    assert sorted(tree_paths(e, "from-tag")) == ["a"]


def test_branch_staging_is_private_and_dropped_with_the_branch(e: Engine) -> None:
    e.create_branch(REPO, "dev", "main")
    put(e, "only-dev", b"d", branch="dev")
    with pytest.raises(NotFound):
        e.stat(REPO, "main", "only-dev")
    assert e.read(REPO, "dev", "only-dev") == b"d"
    e.delete_branch(REPO, "dev")
    e.create_branch(REPO, "dev", "main")
    with pytest.raises(NotFound):
        e.stat(REPO, "dev", "only-dev")
    assert staged(e, "dev") == []


def test_reset_branch_moves_head_and_discards_staging(e: Engine) -> None:
    c1 = commit_files(e, {"a": b"1"})
    c2 = commit_files(e, {"b": b"2"})
    put(e, "c", b"3")
    assert e.reset_branch(REPO, "main", c1) == {"name": "main", "commit_id": c1}
    assert e.head(REPO, "main") == c1
    assert staged(e) == []
    assert sorted(tree_paths(e, "main")) == ["a"]
    # The newer commit is still reachable by id.
    assert sorted(tree_paths(e, c2)) == ["a", "b"]
    with pytest.raises(NotFound):
        e.reset_branch(REPO, "no-branch", c1)


def test_tags(e: Engine) -> None:
    c1 = commit_files(e, {"a": b"1"})
    assert e.create_tag(REPO, "v1.0", "main") == {"name": "v1.0", "commit_id": c1}
    c2 = commit_files(e, {"a": b"2"})
    e.create_tag(REPO, "v2.0", c2)
    assert [(t["name"], t["commit_id"]) for t in e.list_tags(REPO)] == [("v1.0", c1), ("v2.0", c2)]
    assert e.read(REPO, "v1.0", "a") == b"1"  # tags do not move with the branch
    assert e.read(REPO, "v2.0", "a") == b"2"
    with pytest.raises(Conflict):
        e.create_tag(REPO, "v1.0", c2)
    with pytest.raises(Conflict):
        e.create_tag(REPO, "main", c2)  # a branch has that name
    with pytest.raises(Conflict):
        e.create_branch(REPO, "v1.0", "main")  # a tag has that name
    with pytest.raises(NotFound):
        e.create_tag(REPO, "v3", "nowhere")
    e.delete_tag(REPO, "v1.0")
    assert [t["name"] for t in e.list_tags(REPO)] == ["v2.0"]
    with pytest.raises(NotFound):
        e.delete_tag(REPO, "v1.0")
    with pytest.raises(NotFound):
        e.resolve(REPO, "v1.0")


# -- objects -----------------------------------------------------------------


def test_put_stat_read(se: Engine) -> None:
    e = se
    data = rnd_bytes(1_500_000, 1)  # many chunks
    entry = put(e, "dir/file.bin", data)
    assert entry.kind == FILE and entry.size == len(data)
    assert entry.md5 == hashlib.md5(data).hexdigest()
    st = e.stat(REPO, "main", "dir/file.bin")
    assert st.size == len(data) and st.md5 == entry.md5
    assert len(e.reader.chunk_list(st)) > 5
    assert e.read(REPO, "main", "dir/file.bin") == data
    assert b"".join(e.read_stream(REPO, "main", "dir/file.bin")) == data


def test_read_ranges(se: Engine) -> None:
    e = se
    data = rnd_bytes(1_500_000, 2)
    put(e, "f", data)
    bounds = [0] + [sum(n for _, n in e.reader.chunk_list(e.stat(REPO, "main", "f"))[:k]) for k in (1, 2, 3)]
    cases = [(0, None), (0, 1), (7, 100), (65_000, 200_000), (1_499_999, None), (1_499_999, 5), (123_456, 0)]
    cases += [(3, 10**12), (0, 1_500_000), (0, 1_499_999)]
    # Reads that start or end exactly on chunk boundaries, or span several chunks.
    cases += [(b, None) for b in bounds] + [(b - 1, 2) for b in bounds[1:]] + [(bounds[1], bounds[3] - bounds[1])]
    for offset, length in cases:
        end = len(data) if length is None else offset + length
        assert e.read(REPO, "main", "f", offset, length) == data[offset:end], (offset, length)


def test_read_unsatisfiable_ranges(se: Engine) -> None:
    e = se
    put(e, "f", rnd_bytes(1_000, 3))
    for offset, length in [(1_000, None), (1_001, 1), (5_000, None), (-1, None), (0, -1), (10, -5)]:
        with pytest.raises(RangeNotSatisfiable):
            e.read(REPO, "main", "f", offset, length)


def test_empty_file(se: Engine) -> None:
    e = se
    entry = put(e, "empty", b"")
    assert entry.size == 0 and entry.md5 == hashlib.md5(b"").hexdigest()
    assert e.read(REPO, "main", "empty") == b""
    assert e.read(REPO, "main", "empty", 0, 10) == b""
    with pytest.raises(RangeNotSatisfiable):
        e.read(REPO, "main", "empty", 1)


def test_large_file_uses_a_chunk_list_object(se: Engine) -> None:
    e = se
    data = rnd_bytes(7 * 1024 * 1024, 4)
    put(e, "big", data)
    e.commit(REPO, "main", "big")
    st = e.stat(REPO, "main", "big")
    assert len(e.reader.chunk_list(st)) > INLINE_CHUNKS
    assert st.chunklist and not st.chunks
    assert e.read(REPO, "main", "big") == data
    assert e.read(REPO, "main", "big", 3_000_000, 2_000_000) == data[3_000_000:5_000_000]


def test_identical_content_is_stored_once(se: Engine) -> None:
    e = se
    data = rnd_bytes(2_000_000, 5)
    put(e, "one", data)
    before = e.catalog.stats()
    put(e, "two", data)
    put(e, "three", data[:1_000_000] + b"tail")
    after = e.catalog.stats()
    assert after["chunks"] - before["chunks"] <= 2
    assert after["unique_bytes"] - before["unique_bytes"] < 300_000
    assert e.read(REPO, "main", "two") == data


def test_stat_and_read_errors(e: Engine) -> None:
    with pytest.raises(NotFound):
        e.stat(REPO, "main", "missing")
    with pytest.raises(NotFound):
        e.read(REPO, "main", "missing")
    with pytest.raises(NotFound):
        e.stat(REPO, "no-branch", "x")
    e.stage(REPO, "main", {"adir": Entry(kind=DIR, mode=0o755)})
    assert e.stat(REPO, "main", "adir").kind == DIR
    with pytest.raises(BadRequest):
        e.read(REPO, "main", "adir")


def test_put_to_missing_branch_or_tag_stages_nothing(e: Engine) -> None:
    c = commit_files(e, {"a": b"1"})
    e.create_tag(REPO, "v1", c)
    with pytest.raises(NotFound):
        put(e, "x", b"data", branch="nobranch")
    with pytest.raises(NotFound):
        put(e, "x", b"data", branch="v1")
    assert staged(e) == []


def test_stage_refuses_entries_whose_chunks_are_missing(e: Engine) -> None:
    ghost = Entry(kind=FILE, size=10, chunks=((b"\x01" * 32, 10),))
    with pytest.raises(BadRequest):
        e.stage(REPO, "main", {"ghost": ghost})
    with pytest.raises(BadRequest):
        e.commit_changes(REPO, "main", {"ghost": ghost}, "m")
    assert staged(e) == []
    assert len(e.log(REPO, "main")) == 1


# -- staging: read-your-writes on branches only ------------------------------


def test_staging_visible_on_branch_reads_only(e: Engine) -> None:
    c1 = commit_files(e, {"kept": b"k", "gone": b"g", "changed": b"old"})
    e.create_tag(REPO, "v1", "main")
    put(e, "new", b"fresh")
    put(e, "changed", b"new")
    e.delete_object(REPO, "main", "gone")

    assert e.read(REPO, "main", "new") == b"fresh"
    assert e.read(REPO, "main", "changed") == b"new"
    with pytest.raises(NotFound):
        e.stat(REPO, "main", "gone")
    assert [p for p, _ in e.list(REPO, "main").entries] == ["changed", "kept", "new"]

    for ref in (c1, c1[:12], "v1"):
        with pytest.raises(NotFound):
            e.stat(REPO, ref, "new")
        assert e.read(REPO, ref, "changed") == b"old"
        assert e.read(REPO, ref, "gone") == b"g"
        assert [p for p, _ in e.list(REPO, ref).entries] == ["changed", "gone", "kept"]
    assert e.resolve(REPO, "main").branch == "main"
    assert e.resolve(REPO, c1).branch is None
    assert e.resolve(REPO, "v1").branch is None

    c2 = e.commit(REPO, "main", "apply").id
    for ref in ("main", c2):
        assert [p for p, _ in e.list(REPO, ref).entries] == ["changed", "kept", "new"]
        assert e.read(REPO, ref, "changed") == b"new"
    assert staged(e) == []

    # An ancestor expression of a branch is a commit read: no staging either.
    put(e, "later", b"l")
    e.delete_object(REPO, "main", "kept")
    for ref in ("main~1", "main^", c2 + "~1"):
        assert e.resolve(REPO, ref).commit_id == c1
        with pytest.raises(NotFound):
            e.stat(REPO, ref, "later")
        assert [p for p, _ in e.list(REPO, ref).entries] == ["changed", "gone", "kept"]
    assert [p for p, _ in e.list(REPO, "main").entries] == ["changed", "later", "new"]


def test_delete_object_errors_and_staged_only_delete(e: Engine) -> None:
    with pytest.raises(NotFound):
        e.delete_object(REPO, "main", "never-existed")
    put(e, "tmp", b"t")
    e.delete_object(REPO, "main", "tmp")
    with pytest.raises(NotFound):
        e.stat(REPO, "main", "tmp")
    assert list(e.uncommitted(REPO, "main")) == []
    with pytest.raises(BadRequest):
        e.commit(REPO, "main", "nothing really")
    with pytest.raises(NotFound):
        e.delete_object(REPO, "main", "tmp")


def test_uncommitted_and_discard(e: Engine) -> None:
    commit_files(e, {"a": b"1", "b": b"2", "sub/c": b"3"})
    put(e, "a", b"1-changed")
    e.delete_object(REPO, "main", "b")
    put(e, "sub/d", b"4")
    got = [(c.path, c.kind) for c in e.uncommitted(REPO, "main")]
    assert got == [("a", "changed"), ("b", "removed"), ("sub/d", "added")]
    assert [(c.path, c.kind) for c in e.uncommitted(REPO, "main", prefix="sub/")] == [("sub/d", "added")]
    with pytest.raises(BadRequest):
        list(e.uncommitted(REPO, "main~1"))
    e.discard(REPO, "main")
    assert list(e.uncommitted(REPO, "main")) == []
    assert e.read(REPO, "main", "a") == b"1"


# -- commits -----------------------------------------------------------------


def test_commit_folds_staging(e: Engine) -> None:
    head0 = e.head(REPO, "main")
    put(e, "x", b"1")
    c = e.commit(REPO, "main", "first data", author="alice", meta={"run": "42"})
    assert c.parents == (head0,)
    assert (c.author, c.message, c.meta) == ("alice", "first data", {"run": "42"})
    assert e.head(REPO, "main") == c.id
    assert e.get_commit(REPO, c.id) == c
    assert staged(e) == []
    assert list(e.uncommitted(REPO, "main")) == []
    assert tree_paths(e, c.id)["x"].size == 1


def test_commit_with_expected_head(e: Engine) -> None:
    head0 = e.head(REPO, "main")
    put(e, "x", b"1")
    c1 = e.commit(REPO, "main", "m", expected_head=head0)
    put(e, "y", b"2")
    with pytest.raises(Conflict) as info:
        e.commit(REPO, "main", "stale", expected_head=head0)
    assert info.value.details["head"] == c1.id
    assert e.head(REPO, "main") == c1.id
    assert [p for p, _ in staged(e)] == ["y"]  # staging kept after the conflict
    with pytest.raises(Conflict):
        e.commit_changes(REPO, "main", {"z": empty_file()}, "stale", expected_head=head0)
    assert e.head(REPO, "main") == c1.id
    c2 = e.commit(REPO, "main", "fresh", expected_head=c1.id)
    assert c2.parents == (c1.id,)


def test_empty_commit_refused_unless_allowed(e: Engine) -> None:
    head0 = e.head(REPO, "main")
    with pytest.raises(BadRequest) as info:
        e.commit(REPO, "main", "nothing")
    assert "nothing to commit" in info.value.message
    assert e.head(REPO, "main") == head0
    c = e.commit(REPO, "main", "marker", allow_empty=True)
    assert c.tree == e.get_commit(REPO, head0).tree and c.parents == (head0,)
    # Staging the same content that is committed is no change either.
    commit_files(e, {"a": b"same"})
    e.stage(REPO, "main", {"a": e.stat(REPO, "main", "a")})
    with pytest.raises(BadRequest):
        e.commit(REPO, "main", "no-op")


def test_commit_needs_a_message(e: Engine) -> None:
    put(e, "x", b"1")
    head0 = e.head(REPO, "main")
    for message in ["", "   ", "\n"]:
        with pytest.raises(BadRequest):
            e.commit(REPO, "main", message)
    assert e.head(REPO, "main") == head0
    assert len(staged(e)) == 1


def test_commit_to_missing_branch(e: Engine) -> None:
    with pytest.raises(NotFound):
        e.commit(REPO, "ghost", "m")
    with pytest.raises(NotFound):
        e.commit("no-repo", "main", "m")


def test_commit_changes_leaves_staging_alone(e: Engine) -> None:
    put(e, "staged", b"s")
    c = e.commit_changes(REPO, "main", {"direct": empty_file(1)}, "direct")
    assert sorted(tree_paths(e, c.id)) == ["direct"]
    assert [p for p, _ in staged(e)] == ["staged"]
    assert [p for p, _ in e.list(REPO, "main").entries] == ["direct", "staged"]


# -- log ---------------------------------------------------------------------


def test_log_order_and_pagination(e: Engine) -> None:
    ids = [e.head(REPO, "main")]
    for i in range(7):
        ids.append(commit_files(e, {f"f{i}": b"%d" % i}, f"commit {i}"))
    newest_first = list(reversed(ids))
    assert [c.id for c in e.log(REPO, "main")] == newest_first
    assert [c.id for c in e.log(REPO, "main", limit=3)] == newest_first[:3]
    for page_size in (1, 2, 3, 5, 8, 100):
        seen: list[str] = []
        after = None
        for _ in range(len(ids) + 2):
            page = e.log(REPO, "main", limit=page_size, after=after)
            assert len(page) <= page_size
            if not page:
                break
            seen += [c.id for c in page]
            after = page[-1].id
        assert seen == newest_first, page_size
    assert [c.id for c in e.log(REPO, "main~2")] == newest_first[2:]
    assert [c.message for c in e.log(REPO, "main", limit=2)] == ["commit 6", "commit 5"]


def test_log_path_filter(e: Engine) -> None:
    c1 = commit_files(e, {"a/x": b"1", "ab": b"1"})
    c2 = commit_files(e, {"ab": b"2"})
    c3 = commit_files(e, {"a/y": b"3"})
    c4 = commit_files(e, {"a/x": None})
    c5 = commit_files(e, {"b": b"5"})
    assert [c.id for c in e.log(REPO, "main", path="a/x")] == [c4, c1]
    assert [c.id for c in e.log(REPO, "main", path="a")] == [c4, c3, c1]
    assert [c.id for c in e.log(REPO, "main", path="a/")] == [c4, c3, c1]
    assert [c.id for c in e.log(REPO, "main", path="ab")] == [c2, c1]
    assert [c.id for c in e.log(REPO, "main", path="b")] == [c5]
    assert [c.id for c in e.log(REPO, "main", path="a", limit=2)] == [c4, c3]
    assert [c.id for c in e.log(REPO, "main", path="a", after=c4)] == [c3, c1]
    assert e.log(REPO, "main", path="zzz") == []


def test_log_includes_both_sides_of_a_merge(e: Engine) -> None:
    base = commit_files(e, {"a": b"1"})
    e.create_branch(REPO, "dev", "main")
    d1 = commit_files(e, {"d": b"d"}, branch="dev")
    m1 = commit_files(e, {"m": b"m"})
    merge = e.merge(REPO, "dev", "main")
    ids = [c.id for c in e.log(REPO, "main")]
    assert ids[0] == merge.id
    assert set(ids[1:3]) == {d1, m1}
    assert ids[3] == base
    assert len(ids) == len(set(ids)) == 5


# -- diff --------------------------------------------------------------------


def test_diff_between_refs(e: Engine) -> None:
    c1 = commit_files(e, {"keep": b"k", "mod": b"1", "del": b"d", "sub/a": b"a"})
    c2 = commit_files(e, {"mod": b"2", "del": None, "add": b"n", "sub/b": b"b"})
    got = [(c.path, c.kind) for c in e.diff(REPO, c1, c2)]
    assert got == [("add", "added"), ("del", "removed"), ("mod", "changed"), ("sub/b", "added")]
    back = [(c.path, c.kind) for c in e.diff(REPO, "main", "main~1")]
    assert back == [("add", "removed"), ("del", "added"), ("mod", "changed"), ("sub/b", "removed")]
    assert [c.path for c in e.diff(REPO, c1, c2, prefix="sub/")] == ["sub/b"]
    assert list(e.diff(REPO, "main", c2)) == []
    changed = next(c for c in e.diff(REPO, c1, c2) if c.path == "mod")
    assert changed.left.md5 == hashlib.md5(b"1").hexdigest() and changed.right.md5 == hashlib.md5(b"2").hexdigest()
    # Diff of a branch ignores its staging.
    put(e, "staged-only", b"s")
    assert list(e.diff(REPO, c2, "main")) == []
    with pytest.raises(NotFound):
        list(e.diff(REPO, "main", "nope"))


def test_diff_returns_exactly_the_changed_paths_among_thousands(e: Engine) -> None:
    base = {f"data/{i:05d}": empty_file(i) for i in range(3000)}
    c1 = e.commit_changes(REPO, "main", base, "bulk").id
    changes: dict[str, Entry | None] = {f"data/{i:05d}": empty_file(10_000 + i) for i in (5, 700, 1500, 2999)}
    changes.update({f"data/{i:05d}": None for i in (0, 1200, 2500)})
    changes.update({"data/01000-x": empty_file(1), "new/one": empty_file(2), "aaa": empty_file(3)})
    c2 = e.commit_changes(REPO, "main", changes, "ten").id
    got = {c.path: c.kind for c in e.diff(REPO, c1, c2)}
    assert sorted(got) == sorted(changes)
    assert [got[p] for p in ("data/00005", "data/00000", "new/one")] == ["changed", "removed", "added"]
    t1, t2 = e.resolve(REPO, c1).tree, e.resolve(REPO, c2).tree
    r1, r2 = {r.id for r in e.trees.ranges(t1)}, {r.id for r in e.trees.ranges(t2)}
    assert len(r1 ^ r2) <= 2 * len(changes) + 2


# -- merge -------------------------------------------------------------------


def test_clean_merge(e: Engine) -> None:
    commit_files(e, {"shared": b"s", "x": b"x"})
    e.create_branch(REPO, "dev", "main")
    d = commit_files(e, {"dev-file": b"d", "x": None}, branch="dev")
    m = commit_files(e, {"main-file": b"m"})
    merged = e.merge(REPO, "dev", "main")
    assert merged.parents == (m, d)
    assert e.head(REPO, "main") == merged.id
    assert sorted(tree_paths(e, "main")) == ["dev-file", "main-file", "shared"]
    assert e.head(REPO, "dev") == d  # the source does not move
    with pytest.raises(BadRequest) as info:
        e.merge(REPO, "dev", "main")
    assert "already merged" in info.value.message
    # Merging back the other way brings main's file to dev.
    back = e.merge(REPO, "main", "dev")
    assert sorted(tree_paths(e, back.id)) == ["dev-file", "main-file", "shared"]


def test_merge_when_destination_did_not_move(e: Engine) -> None:
    base = commit_files(e, {"a": b"1"})
    e.create_branch(REPO, "dev", "main")
    commit_files(e, {"b": b"2"}, branch="dev")
    merged = e.merge(REPO, "dev", "main", message="bring dev")
    assert merged.message == "bring dev"
    assert merged.parents[0] == base
    assert sorted(tree_paths(e, "main")) == ["a", "b"]


def test_merge_same_change_on_both_sides_is_not_a_conflict(e: Engine) -> None:
    commit_files(e, {"a": b"1"})
    e.create_branch(REPO, "dev", "main")
    e.commit_changes(REPO, "dev", {"same": empty_file(9)}, "dev")
    e.commit_changes(REPO, "main", {"same": empty_file(9)}, "main")
    e.merge(REPO, "dev", "main")
    assert tree_paths(e, "main")["same"] == empty_file(9)


def _conflicting_branches(e: Engine) -> tuple[str, str]:
    commit_files(e, {"both": b"base", "del-vs-mod": b"base", "clean": b"base"})
    e.create_branch(REPO, "dev", "main")
    d = commit_files(e, {"both": b"dev", "del-vs-mod": None, "dev-only": b"d"}, branch="dev")
    m = commit_files(e, {"both": b"main", "del-vs-mod": b"main", "main-only": b"m"})
    return d, m


def test_merge_conflict_lists_paths_and_changes_nothing(e: Engine) -> None:
    _, m = _conflicting_branches(e)
    with pytest.raises(MergeConflict) as info:
        e.merge(REPO, "dev", "main")
    assert sorted(info.value.conflicts) == ["both", "del-vs-mod"]
    assert info.value.status == 409
    assert e.head(REPO, "main") == m


def test_merge_strategy_theirs(e: Engine) -> None:
    d, m = _conflicting_branches(e)
    merged = e.merge(REPO, "dev", "main", strategy="theirs")
    assert merged.parents == (m, d)
    assert e.read(REPO, "main", "both") == b"dev"
    with pytest.raises(NotFound):
        e.stat(REPO, "main", "del-vs-mod")
    assert sorted(tree_paths(e, "main")) == ["both", "clean", "dev-only", "main-only"]


def test_merge_strategy_ours(e: Engine) -> None:
    _conflicting_branches(e)
    e.merge(REPO, "dev", "main", strategy="ours")
    assert e.read(REPO, "main", "both") == b"main"
    assert e.read(REPO, "main", "del-vs-mod") == b"main"
    assert e.read(REPO, "main", "dev-only") == b"d"


def test_merge_errors(e: Engine) -> None:
    _conflicting_branches(e)
    with pytest.raises(BadRequest):
        e.merge(REPO, "dev", "main", strategy="mine")
    with pytest.raises(NotFound):
        e.merge(REPO, "nope", "main")
    with pytest.raises(NotFound):
        e.merge(REPO, "dev", "nope")


# -- revert ------------------------------------------------------------------


def test_revert(e: Engine) -> None:
    commit_files(e, {"a": b"1", "b": b"1"})
    bad = commit_files(e, {"a": b"broken", "b": None, "c": b"junk"}, "bad change")
    later = commit_files(e, {"d": b"fine"})
    r = e.revert(REPO, "main", bad)
    assert r.parents == (later,)
    assert bad[:12] in r.message and "bad change" in r.message
    assert e.read(REPO, "main", "a") == b"1"
    assert e.read(REPO, "main", "b") == b"1"
    assert sorted(tree_paths(e, "main")) == ["a", "b", "d"]


def test_revert_conflict(e: Engine) -> None:
    commit_files(e, {"a": b"1"})
    target = commit_files(e, {"a": b"2", "other": b"o"})
    head = commit_files(e, {"a": b"3"})
    with pytest.raises(MergeConflict) as info:
        e.revert(REPO, "main", target)
    assert info.value.conflicts == ["a"]
    assert e.head(REPO, "main") == head


def test_revert_errors(e: Engine) -> None:
    first = e.head(REPO, "main")
    c = commit_files(e, {"a": b"1"})
    with pytest.raises(BadRequest):
        e.revert(REPO, "main", first)
    with pytest.raises(BadRequest):
        e.revert(REPO, "main", c, parent=2)
    with pytest.raises(NotFound):
        e.revert(REPO, "main", "nope")


# -- resolve -----------------------------------------------------------------


def test_resolve_expressions(e: Engine) -> None:
    c0 = e.head(REPO, "main")
    c1 = commit_files(e, {"a": b"1"})
    c2 = commit_files(e, {"a": b"2"})
    e.create_tag(REPO, "v2", c2)
    for expr, want in [
        ("main", c2),
        ("main~1", c1),
        ("main^", c1),
        ("main~2", c0),
        ("main^^", c0),
        ("main~1^", c0),
        ("v2", c2),
        ("v2~1", c1),
        (c1, c1),
        (c1[:8], c1),
        (c1[:20], c1),
        (c2 + "~1", c1),
    ]:
        assert e.resolve(REPO, expr).commit_id == want, expr
    view = e.resolve(REPO, "main")
    assert view.branch == "main" and view.tree == e.get_commit(REPO, c2).tree
    assert e.resolve(REPO, "main~1").branch is None
    assert e.resolve_commit(REPO, "main~1") == c1


def test_resolve_not_found(e: Engine) -> None:
    commit_files(e, {"a": b"1"})
    commit_files(e, {"a": b"2"})
    for expr in ["main~3", "main~100", "nope", "0123abc", "zzzzzzzz", "deadbeefdeadbeef", "v9~1"]:
        with pytest.raises(NotFound):
            e.resolve(REPO, expr)


def test_resolve_short_prefix_and_bad_expressions(e: Engine) -> None:
    c1 = commit_files(e, {"a": b"1"})
    with pytest.raises(NotFound):
        e.resolve(REPO, c1[:7])  # too short to be taken as a commit id
    for bad in ["", "~1", "main~x"]:
        with pytest.raises(BadRequest):
            e.resolve(REPO, bad)


def test_resolve_commit_of_another_repo_is_not_found(e: Engine) -> None:
    c1 = commit_files(e, {"a": b"1"})
    e.create_repo("other-repo")
    with pytest.raises(NotFound):
        e.resolve("other-repo", c1)
    with pytest.raises(NotFound):
        e.resolve("other-repo", c1[:10])


def test_resolve_ambiguous_prefix(e: Engine) -> None:
    # Two recorded commit ids sharing a long prefix (recorded straight into the catalog).
    e.catalog.record_commit(REPO, "deadbeef" + "0" * 56)
    e.catalog.record_commit(REPO, "deadbeef" + "1" * 56)
    with pytest.raises(BadRequest) as info:
        e.resolve(REPO, "deadbeef")
    assert "ambiguous" in info.value.message


def test_branch_named_like_hex_wins_over_commit_prefix(e: Engine) -> None:
    c1 = commit_files(e, {"a": b"1"})
    c2 = commit_files(e, {"a": b"2"})
    e.create_branch(REPO, c1[:8], c2)
    assert e.resolve(REPO, c1[:8]).commit_id == c2
    assert e.resolve(REPO, c1[:9]).commit_id == c1


# -- list: pagination against a brute-force expectation ---------------------


def _visible(e: Engine, ref: str) -> list[str]:
    """Brute force: the committed tree overlaid with staging when ``ref`` is a branch."""
    view = e.resolve(REPO, ref)
    items = {p for p, _ in e.trees.iter(view.tree)}
    if view.branch:
        for p, enc in e.catalog.staged(REPO, view.branch):
            if enc is None:
                items.discard(p)
            else:
                items.add(p)
    return sorted(items)


def _expected(paths: list[str], prefix: str, delimiter: str, after: str = "") -> tuple[list[str], list[str]]:
    entries, groups = [], []
    for p in paths:
        if not p.startswith(prefix):
            continue
        rest = p[len(prefix) :]
        if delimiter and delimiter in rest:
            g = prefix + rest[: rest.index(delimiter) + 1]
            if g > after and g not in groups:
                groups.append(g)
        elif p > after:
            entries.append(p)
    return entries, groups


def _list_all(e: Engine, ref: str, prefix: str, delimiter: str, limit: int, after: str = "") -> tuple[list[str], list[str]]:
    entries: list[str] = []
    groups: list[str] = []
    pages = 0
    while True:
        page = e.list(REPO, ref, prefix=prefix, delimiter=delimiter, after=after, limit=limit)
        pages += 1
        assert pages < 1000, "pagination does not terminate"
        assert len(page.entries) + len(page.prefixes) <= limit
        for p, _ in page.entries:
            assert p > after
        for g in page.prefixes:
            assert g > after
        entries += [p for p, _ in page.entries]
        groups += page.prefixes
        if page.next_after is None:
            return entries, groups
        assert page.next_after > after
        assert page.entries or page.prefixes
        after = page.next_after


@pytest.fixture
def listing_repo(e: Engine) -> Engine:
    committed = [
        "a", "a-b", "a.txt", "a/b/c", "a/b/d", "a/b0", "a/c", "a/d/e/f", "ab", "b/x", "b/y",
        "c", "d/1", "d/2", "d/3", "e/deep/er/file", "z",
    ] + [f"many/{i:03d}" for i in range(40)]  # fmt: skip
    e.commit_changes(REPO, "main", {p: empty_file(i) for i, p in enumerate(committed)}, "tree")
    # Staging overlay: adds (new dirs, inside existing dirs, before/after everything),
    # deletes (a whole dir's only file, a file in a group), and an overwrite.
    e.stage(
        REPO,
        "main",
        {
            "0first": empty_file(100),
            "a/b/cc": empty_file(101),
            "b/x": None,
            "b/y": None,
            "d/2": None,
            "d/9": empty_file(102),
            "many/015": None,
            "many/zz": empty_file(103),
            "new-dir/f": empty_file(104),
            "c": empty_file(105),
            "zz/top": empty_file(106),
            "never-existed": None,
        },
    )
    return e


LIST_PREFIXES = ["", "a", "a/", "a/b/", "b/", "d/", "many/", "many/01", "zz/", "nothing/"]


@pytest.mark.parametrize("delimiter", ["", "/"])
@pytest.mark.parametrize("ref", ["branch", "commit"])
def test_list_pagination_matches_brute_force(listing_repo: Engine, delimiter: str, ref: str) -> None:
    e = listing_repo
    r = "main" if ref == "branch" else e.head(REPO, "main")
    visible = _visible(e, r)
    if ref == "branch":
        assert "0first" in visible and "b/x" not in visible and "many/015" not in visible
    else:
        assert "0first" not in visible and "b/x" in visible
    for prefix in LIST_PREFIXES:
        want = _expected(visible, prefix, delimiter)
        for limit in (1, 2, 3, 7, 1000):
            got = _list_all(e, r, prefix, delimiter, limit)
            assert got == want, (prefix, delimiter, limit)


def test_list_groups_and_entries(listing_repo: Engine) -> None:
    e = listing_repo
    page = e.list(REPO, "main", delimiter="/")
    assert [p for p, _ in page.entries] == ["0first", "a", "a-b", "a.txt", "ab", "c", "z"]
    # b/ had only deleted files: it is gone; new-dir/ and zz/ exist only in staging.
    assert page.prefixes == ["a/", "d/", "e/", "many/", "new-dir/", "zz/"]
    assert page.next_after is None
    assert e.list(REPO, "main", prefix="b/").entries == []
    sub = e.list(REPO, "main", prefix="a/b/", delimiter="/")
    assert [p for p, _ in sub.entries] == ["a/b/c", "a/b/cc", "a/b/d"]
    assert e.list(REPO, "main", prefix="c").entries[0][1] == empty_file(105)


@pytest.mark.parametrize("delimiter", ["", "/"])
def test_list_after_arbitrary_points(listing_repo: Engine, delimiter: str) -> None:
    e = listing_repo
    visible = _visible(e, "main")
    for after in ["", "0", "a", "a-b", "a/", "a/b/c", "ab", "b/", "many/039", "many/zz", "zz/top", "~"]:
        if delimiter and "/" in after and not after.endswith("/"):
            continue  # resuming inside a group re-reports the group (S3 start-after semantics)
        want = _expected(visible, "", delimiter, after)
        assert _list_all(e, "main", "", delimiter, 4, after) == want, after


def test_list_argument_errors(listing_repo: Engine) -> None:
    e = listing_repo
    with pytest.raises(BadRequest):
        e.list(REPO, "main", limit=0)
    with pytest.raises(BadRequest):
        e.list(REPO, "main", delimiter="-")
    with pytest.raises(NotFound):
        e.list(REPO, "nope")


# -- concurrency at the catalog level ----------------------------------------


def _run_threads(n: int, target) -> list:
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target(i)
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    return results


def test_concurrent_commits_with_same_expected_head_exactly_one_wins(e: Engine) -> None:
    head = e.head(REPO, "main")
    n = 8
    results = _run_threads(
        n, lambda i: e.commit_changes(REPO, "main", {f"t{i}": empty_file(i)}, f"thread {i}", expected_head=head)
    )
    winners = [r for r in results if not isinstance(r, Exception)]
    losers = [r for r in results if isinstance(r, Exception)]
    assert len(winners) == 1, results
    assert all(isinstance(x, Conflict) for x in losers), losers
    assert e.head(REPO, "main") == winners[0].id
    assert winners[0].parents == (head,)
    assert len(tree_paths(e, "main")) == 1


def test_concurrent_staging_commits_exactly_one_wins(e: Engine) -> None:
    put(e, "payload", b"p")
    head = e.head(REPO, "main")
    results = _run_threads(6, lambda i: e.commit(REPO, "main", f"c{i}", expected_head=head))
    winners = [r for r in results if not isinstance(r, Exception)]
    assert len(winners) == 1, results
    assert all(isinstance(r, Conflict) for r in results if isinstance(r, Exception))
    assert e.head(REPO, "main") == winners[0].id
    assert staged(e) == []
    assert e.read(REPO, "main", "payload") == b"p"


def test_concurrent_commits_without_expected_head_never_lose_updates(e: Engine) -> None:
    """Each thread retries on Conflict; every committed change ends up in the final tree."""

    def worker(i: int) -> int:
        wins = 0
        for k in range(3):
            while True:
                head = e.head(REPO, "main")
                try:
                    e.commit_changes(REPO, "main", {f"w{i}/{k}": empty_file(k)}, f"{i}/{k}", expected_head=head)
                    wins += 1
                    break
                except Conflict:
                    continue
        return wins

    results = _run_threads(4, worker)
    assert results == [3, 3, 3, 3]
    assert sorted(tree_paths(e, "main")) == sorted(f"w{i}/{k}" for i in range(4) for k in range(3))
    assert len(e.log(REPO, "main", limit=100)) == 13  # linear history, nothing lost


def test_staged_writes_concurrent_with_commits_are_never_lost(e: Engine) -> None:
    writers, per_writer = 4, 25
    done = threading.Event()
    commits: list[str] = []

    def writer(i: int) -> None:
        for k in range(per_writer):
            e.stage(REPO, "main", {f"w{i}/f{k:03d}": empty_file(k)})

    def committer() -> None:
        while not done.is_set():
            try:
                commits.append(e.commit(REPO, "main", "periodic").id)
            except (BadRequest, Conflict):
                pass

    def run(i: int) -> None:
        if i < writers:
            writer(i)
        else:
            committer()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers + 2)]
    for t in threads:
        t.start()
    for t in threads[:writers]:
        t.join(120)
    done.set()
    for t in threads[writers:]:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert commits, "the committers never got a commit in"

    expected = {f"w{i}/f{k:03d}" for i in range(writers) for k in range(per_writer)}
    committed = set(tree_paths(e, "main"))
    still_staged = {p for p, enc in staged(e) if enc is not None}
    assert committed | still_staged == expected
    assert not (committed - expected)
    if still_staged:
        e.commit(REPO, "main", "final")
    assert set(tree_paths(e, "main")) == expected
    assert staged(e) == []
