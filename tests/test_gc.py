"""gc removes exactly what nothing reaches, keeps everything else readable, respects its grace.

Runs on both catalogs (``engine`` fixture) where the catalog matters.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import time

from fabric.client.transfer import import_directory
from fabric.engine.engine import Engine
from fabric.engine.maintenance import Walker, fsck, gc
from fabric.format.ingest import file_entry
from fabric.format.packs import PACK_PREFIX
from tests.helpers.fstree import write_file

MiB = 1 << 20


def put(engine: Engine, branch: str, files: dict[str, bytes], repo: str = "demo", message: str = "put") -> str:
    for path, data in files.items():
        engine.put_object(repo, branch, path, io.BytesIO(data))
    return engine.commit(repo, branch, message).id


def rand(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def store_state(engine: Engine) -> dict:
    return {
        "chunks": {cid for cid, *_ in engine.catalog.iter_chunk_ids()},
        "pack_rows": {row[0] for row in engine.catalog.packs()},
        "pack_files": {i.key.rsplit("/", 1)[-1] for i in engine.store.list(PACK_PREFIX)},
        "objects": {i.key.rsplit("/", 1)[-1] for i in engine.store.list("objects/")},
    }


def assert_exactly_reachable(engine: Engine) -> None:
    """After gc with grace 0: the store holds what is reachable, and nothing else."""
    found = Walker(engine, verify=False).walk_all()
    assert found.problems == []
    state = store_state(engine)
    assert state["chunks"] == found.chunks
    assert state["objects"] == found.objects
    assert state["pack_files"] == state["pack_rows"]
    for pack_id in state["pack_rows"]:
        assert engine.catalog.chunks_of_pack(pack_id), f"pack {pack_id} has no live chunk but was kept"


def assert_reads(engine: Engine, repo: str, ref: str, files: dict[str, bytes]) -> None:
    got = {p for p, e in engine.walk(repo, ref) if e.kind == "file"}
    assert got == set(files), (repo, ref)
    for path, data in files.items():
        assert engine.read(repo, ref, path) == data, (repo, ref, path)


def assert_fsck_clean(engine: Engine) -> None:
    report = fsck(engine)
    assert report.ok, report.problems


def test_gc_after_branch_delete_removes_exactly_the_unreachable(engine: Engine) -> None:
    engine.create_repo("demo")
    base = {"shared.bin": rand(1, 3 * MiB), "small.txt": b"small\n", "deep/x.csv": b"1,2,3\n" * 10_000}
    put(engine, "main", base, message="base")
    engine.create_branch("demo", "exp", "main")
    exp_only = {"exp-big.bin": rand(2, 5 * MiB), "exp-small.txt": b"exp\n"}
    put(engine, "exp", exp_only, message="exp 1")
    put(engine, "exp", {"exp-2.bin": rand(3, MiB)}, message="exp 2")
    engine.create_tag("demo", "v1", "main")
    before = store_state(engine)
    assert fsck(engine).ok

    # Nothing is garbage yet: gc with grace 0 removes nothing.
    r = gc(engine, grace=0)
    assert (r.chunks_deleted, r.packs_deleted, r.objects_deleted, r.packs_rewritten) == (0, 0, 0, 0)
    assert store_state(engine) == before

    engine.delete_branch("demo", "exp")
    r = gc(engine, grace=0)
    assert r.chunks_deleted > 0 and r.packs_deleted >= 2 and r.objects_deleted > 0
    assert r.bytes_freed > 6 * MiB
    after = store_state(engine)
    assert after["chunks"] < before["chunks"] and after["objects"] < before["objects"]
    assert_exactly_reachable(engine)
    assert_fsck_clean(engine)
    for ref in ("main", "v1"):
        assert_reads(engine, "demo", ref, base)
    # A second gc finds nothing more.
    r = gc(engine, grace=0)
    assert (r.chunks_deleted, r.packs_deleted, r.objects_deleted, r.packs_rewritten) == (0, 0, 0, 0)


def test_gc_after_repo_delete_keeps_shared_chunks(engine: Engine) -> None:
    shared = rand(10, 2 * MiB)
    a = {"shared.bin": shared, "a-only.bin": rand(11, 2 * MiB)}
    b = {"copy-of-shared.bin": shared, "b-only.bin": rand(12, 2 * MiB)}
    for repo, files in (("repo-a", a), ("repo-b", b)):
        engine.create_repo(repo)
        put(engine, "main", files, repo=repo)
    engine.delete_repo("repo-a")
    r = gc(engine, grace=0)
    assert r.chunks_deleted > 0
    assert_exactly_reachable(engine)
    assert_fsck_clean(engine)
    assert_reads(engine, "repo-b", "main", b)  # its chunks shared with the deleted repo survived

    # The last repository goes: the store empties completely.
    engine.delete_repo("repo-b")
    gc(engine, grace=0)
    state = store_state(engine)
    assert state == {"chunks": set(), "pack_rows": set(), "pack_files": set(), "objects": set()}
    # The same engine (a long-running hub) can still create repositories afterwards.
    engine.create_repo("repo-c")
    put(engine, "main", {"f": b"after the store was emptied"}, repo="repo-c")
    assert_fsck_clean(engine)
    fresh = Engine.open(_data_dir(engine), db_url=engine.catalog.db.url)
    try:
        assert_fsck_clean(fresh)
        assert fresh.read("repo-c", "main", "f") == b"after the store was emptied"
        assert len(fresh.log("repo-c", "main")) == 2
    finally:
        fresh.close()


def _data_dir(engine: Engine) -> str:
    return os.path.dirname(engine.store.root)  # type: ignore[attr-defined]


def test_gc_respects_grace_period(engine: Engine) -> None:
    engine.create_repo("demo")
    put(engine, "main", {"keep": b"keep"})
    engine.create_branch("demo", "tmp", "main")
    put(engine, "tmp", {"junk.bin": rand(20, 2 * MiB)})
    engine.delete_branch("demo", "tmp")
    before = store_state(engine)
    r = gc(engine, grace=3600)
    assert (r.chunks_deleted, r.packs_deleted, r.objects_deleted, r.packs_rewritten, r.bytes_freed) == (0, 0, 0, 0, 0)
    assert store_state(engine) == before
    r = gc(engine)  # the engine's own grace (3600 in these tests)
    assert r.chunks_deleted == 0 and store_state(engine) == before
    # A dry run reports what would go and removes nothing.
    dry = gc(engine, grace=0, dry_run=True)
    assert dry.dry_run and dry.chunks_deleted > 0 and dry.packs_deleted > 0 and dry.objects_deleted > 0
    assert store_state(engine) == before
    real = gc(engine, grace=0)
    assert (real.chunks_deleted, real.packs_deleted, real.objects_deleted) == (
        dry.chunks_deleted, dry.packs_deleted, dry.objects_deleted
    )
    assert_exactly_reachable(engine)
    assert_reads(engine, "demo", "main", {"keep": b"keep"})


def test_gc_repacks_partially_dead_pack(engine: Engine, tmp_path) -> None:
    engine.create_repo("demo")
    src = tmp_path / "src"
    big, small = rand(30, 6 * MiB), rand(31, 400_000)
    write_file(str(src / "big.bin"), big)
    write_file(str(src / "small.bin"), small)
    engine.create_branch("demo", "mix", "main")
    import_directory(engine, str(src), "demo", "mix", "both in one pack")
    (old_pack,) = store_state(engine)["pack_rows"]
    # Only the small file stays reachable (on main); the pack becomes mostly dead.
    engine.stage("demo", "main", {"kept.bin": engine.stat("demo", "mix", "small.bin")})
    engine.commit("demo", "main", "keep the small one")
    engine.delete_branch("demo", "mix")
    stored_before = engine.stats()["stored_bytes"]
    r = gc(engine, grace=0)
    assert r.packs_rewritten == 1 and r.chunks_deleted > 0
    state = store_state(engine)
    assert old_pack not in state["pack_rows"] and old_pack not in state["pack_files"]
    assert len(state["pack_rows"]) == 1
    stored_after = engine.stats()["stored_bytes"]
    assert stored_after < 500_000 < 6 * MiB < stored_before
    assert_exactly_reachable(engine)
    assert_fsck_clean(engine)
    assert_reads(engine, "demo", "main", {"kept.bin": small})
    # A fresh engine (no chunk cache) reads the repacked data too.
    fresh = Engine.open(_data_dir(engine), db_url=engine.catalog.db.url)
    try:
        assert fresh.read("demo", "main", "kept.bin") == small
    finally:
        fresh.close()


def test_gc_keeps_staged_uncommitted_data(engine: Engine) -> None:
    engine.create_repo("demo")
    data = rand(40, MiB)
    engine.put_object("demo", "main", "staged.bin", io.BytesIO(data))
    gc(engine, grace=0)
    assert_fsck_clean(engine)
    assert engine.read("demo", "main", "staged.bin") == data
    engine.commit("demo", "main", "commit after gc")
    assert engine.read("demo", "main", "staged.bin") == data


def _age(engine: Engine, seconds: float) -> None:
    """Make every chunk and pack look ``seconds`` older (as if written long ago)."""
    with engine.catalog.db.tx() as cur:
        cur.execute("UPDATE chunks SET touched = touched - ?", (seconds,))
        cur.execute("UPDATE packs SET created = created - ?", (seconds,))


def _dead_setup(engine: Engine) -> tuple[dict[str, bytes], list[bytes]]:
    """A deleted branch whose chunks are older than the grace period; returns its files and chunk ids."""
    engine.create_repo("demo")
    put(engine, "main", {"keep": b"keep"})
    engine.create_branch("demo", "old", "main")
    files = {"old.bin": rand(50, 2 * MiB)}
    put(engine, "old", files)
    ids = [cid for cid, _ in engine.stat_chunks("demo", "old", "old.bin").chunks]
    engine.delete_branch("demo", "old")
    _age(engine, 2 * engine.gc_grace)
    return files, ids


def test_chunk_touched_by_a_writer_after_the_walk_is_not_deleted(engine: Engine) -> None:
    """gc's walk finds a chunk dead; a writer's missing() check then finds it present; gc must keep it."""
    files, ids = _dead_setup(engine)
    grace = engine.gc_grace
    # gc, step by step: walk, pick the dead chunks older than the grace period ...
    found = Walker(engine, verify=False).walk_all()
    cutoff = time.time() - grace
    dead = [cid for cid, _p, _l, touched in engine.catalog.iter_chunk_ids() if cid not in found.chunks and touched < cutoff]
    assert set(ids) <= set(dead)
    # ... a writer uploading the same bytes asks which chunks the store lacks (it has them all) ...
    assert engine.chunks.missing(ids) == []
    # ... and gc deletes its dead list, minus what was touched after its cutoff.
    engine.catalog.delete_chunks(dead, older_than=cutoff)
    assert engine.catalog.locate_many(ids).keys() == set(ids)
    # The rest of gc (packs, objects) keeps the pack those chunks live in.
    gc(engine, grace=grace)
    assert engine.catalog.locate_many(ids).keys() == set(ids)
    # The writer commits a file made of those chunks, and it reads back.
    entry = file_entry(_sizes(engine, ids), hashlib.md5(files["old.bin"]).hexdigest())
    engine.stage("demo", "main", {"revived.bin": entry})
    engine.commit("demo", "main", "revive")
    assert engine.read("demo", "main", "revived.bin") == files["old.bin"]
    assert_fsck_clean(engine)


def _sizes(engine: Engine, ids: list[bytes]) -> list[tuple[bytes, int]]:
    located = engine.catalog.locate_many(ids)
    return [(cid, located[cid].raw_len) for cid in ids]


def test_real_gc_keeps_chunks_a_writer_touches_mid_run(engine: Engine) -> None:
    """The same race through gc() itself: the writer runs between the walk and the chunk deletion."""
    _, ids = _dead_setup(engine)
    original = engine.catalog.delete_chunks
    calls = []

    def writer_then_delete(dead, older_than):
        calls.append(len(dead))
        assert engine.chunks.missing(ids) == []  # a concurrent writer's dedup check
        return original(dead, older_than)

    engine.catalog.delete_chunks = writer_then_delete  # type: ignore[method-assign]
    try:
        r = gc(engine)
    finally:
        engine.catalog.delete_chunks = original  # type: ignore[method-assign]
    assert calls and r.chunks_deleted >= len(set(ids))  # gc counted them as dead ...
    assert engine.catalog.locate_many(ids).keys() == set(ids)  # ... yet they survived
    assert all(engine.chunks.read(cid) for cid in ids)


def test_untouched_dead_chunks_are_deleted(engine: Engine) -> None:
    """Control for the two tests above: without the writer, the same chunks go."""
    _, ids = _dead_setup(engine)
    r = gc(engine)
    assert r.chunks_deleted >= len(set(ids))
    assert engine.catalog.locate_many(ids) == {}
    assert_fsck_clean(engine)
