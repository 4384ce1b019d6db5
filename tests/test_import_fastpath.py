"""The import's shortcuts (issue 18): a commit skips the ownership check of chunks that a
live chunk sink of the same process just made the repository's, and only while nothing
can have dropped them since; the catalog's chunk-drop count; ``Entry`` as a slots class.

Each test of the shortcut drops or disowns a sink's chunk between the sink and the commit,
the way the code base can (gc, a deleted repository) or behind its back, and checks what
the commit does.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import threading
import time
from dataclasses import replace

import pytest

from fabric.engine.engine import Engine
from fabric.errors import ChunksMissing
from fabric.format import frames, packs
from fabric.format.chunking import chunk_id
from fabric.format.ingest import PackSession, file_entry, ingest_stream
from fabric.format.model import Entry

REPO = "fast"


def sink_file(engine: Engine, repo: str, data: bytes) -> tuple[PackSession, Entry]:
    """A file stored through a chunk sink of ``repo`` (closed, still alive) and its entry."""
    sink = engine.chunk_sink(repo)
    chunks, md5 = ingest_stream(io.BytesIO(data), sink)
    sink.close()
    return sink, file_entry(chunks, md5)


def disown(engine: Engine, repo: str) -> None:
    """Drop ``repo``'s ownership rows behind the catalog's drop count (no code path does)."""
    with engine.catalog.db.tx() as cur:
        cur.execute("DELETE FROM repo_chunks WHERE repo = ?", (repo,))


def test_a_live_sinks_chunks_skip_the_ownership_check_and_only_while_it_lives(sqlite_engine: Engine) -> None:
    sqlite_engine.create_repo(REPO)
    sink, entry = sink_file(sqlite_engine, REPO, os.urandom(5000))
    disown(sqlite_engine, REPO)
    # The sink saw the chunk stored and made it the repository's: the commit does not ask again.
    sqlite_engine.commit_changes(REPO, "main", {"a": entry}, "a")
    del sink
    gc.collect()
    # With the sink gone, the same chunk (disowned) is checked and refused.
    with pytest.raises(ChunksMissing):
        sqlite_engine.commit_changes(REPO, "main", {"b": entry}, "b")


def test_present_chunks_claimed_by_a_sink_count_too(sqlite_engine: Engine) -> None:
    sqlite_engine.create_repo(REPO)
    data = os.urandom(5000)
    first, _ = sink_file(sqlite_engine, REPO, data)
    second, entry = sink_file(sqlite_engine, REPO, data)  # stores nothing: the chunk is there
    assert second.new_chunks == 0
    del first
    gc.collect()
    disown(sqlite_engine, REPO)
    sqlite_engine.commit_changes(REPO, "main", {"a": entry}, "a")


def test_a_chunk_gc_dropped_between_sink_and_commit_is_caught(sqlite_engine: Engine) -> None:
    sqlite_engine.create_repo(REPO)
    sink, entry = sink_file(sqlite_engine, REPO, os.urandom(5000))
    report = sqlite_engine.gc(grace=0)  # nothing references the chunk yet
    assert report["chunks_deleted"] == 1
    with pytest.raises(ChunksMissing):
        sqlite_engine.commit_changes(REPO, "main", {"a": entry}, "a")
    assert sink.new_chunks == 1


def test_a_repository_deleted_and_made_again_between_sink_and_commit_is_caught(sqlite_engine: Engine) -> None:
    sqlite_engine.create_repo(REPO)
    sink, entry = sink_file(sqlite_engine, REPO, os.urandom(5000))
    sqlite_engine.delete_repo(REPO)
    sqlite_engine.create_repo(REPO)
    # The chunk is still stored, but no longer the (new) repository's.
    with pytest.raises(ChunksMissing):
        sqlite_engine.commit_changes(REPO, "main", {"a": entry}, "a")
    assert sink.new_chunks == 1


def test_one_repositorys_sink_vouches_for_no_other(sqlite_engine: Engine) -> None:
    sqlite_engine.create_repo(REPO)
    sqlite_engine.create_repo("other")
    sink, entry = sink_file(sqlite_engine, REPO, os.urandom(5000))
    with pytest.raises(ChunksMissing):
        sqlite_engine.commit_changes("other", "main", {"a": entry}, "a")
    assert sink.new_chunks == 1


def test_chunks_no_sink_took_are_still_checked(sqlite_engine: Engine) -> None:
    sqlite_engine.create_repo(REPO)
    sink, entry = sink_file(sqlite_engine, REPO, os.urandom(5000))
    unknown = file_entry([(os.urandom(32), 10)], "0" * 32)
    with pytest.raises(ChunksMissing) as refused:
        sqlite_engine.commit_changes(REPO, "main", {"a": entry, "b": unknown}, "ab")
    assert refused.value.message.startswith("1 chunk(s)")
    assert sink.new_chunks == 1


def test_old_claims_are_checked_again(tmp_path) -> None:
    """Claims count for a quarter of the gc grace (a chunk checked at the commit gets its gc
    clock refreshed; a claimed one was refreshed when the sink took it)."""
    engine = Engine.open(str(tmp_path / "hub"), gc_grace=0.4)
    try:
        engine.create_repo(REPO)
        sink, entry = sink_file(engine, REPO, os.urandom(5000))
        time.sleep(0.15)
        disown(engine, REPO)
        with pytest.raises(ChunksMissing):
            engine.commit_changes(REPO, "main", {"a": entry}, "a")
        assert sink.new_chunks == 1
    finally:
        engine.close()


def test_chunk_drops_count_every_dropping_transaction(engine: Engine) -> None:
    """On both catalog backends: gc's unindexing and a deleted repository each count one."""
    assert engine.catalog.chunk_drops() == 0
    engine.create_repo(REPO)
    sink_file(engine, REPO, os.urandom(5000))
    engine.gc(grace=0)
    assert engine.catalog.chunk_drops() == 1
    engine.gc(grace=0)  # nothing left to drop: no transaction, no count
    assert engine.catalog.chunk_drops() == 1
    engine.delete_repo(REPO)
    assert engine.catalog.chunk_drops() == 2


def test_batch_compression_makes_the_frames_one_by_one_does(monkeypatch) -> None:
    raws = [os.urandom(50), b"text " * 200, b"", memoryview(b"abc" * 300)[5:700]] * (frames.BATCH_MIN // 4 + 1)
    monkeypatch.setattr(frames, "BATCH_THREADS", 2)
    batch = frames.encode_many(raws)
    assert batch == [frames.encode(raw) for raw in raws]
    assert [frames.decode(f) for f in batch[:4]] == [bytes(r) for r in raws[:4]]


def _batch(n: int, tag: bytes) -> list[tuple[bytes, bytes]]:
    raws = [tag + b"%06d " % i * 40 for i in range(n)]
    return [(chunk_id(raw), raw) for raw in raws]


def _delivering_session() -> tuple[PackSession, dict[bytes, bytes]]:
    """A session whose packs land in a dict of id -> frame."""
    delivered: dict[bytes, bytes] = {}

    def deliver(builder: packs.PackBuilder) -> None:
        pack = builder.finish()
        for c in packs.verify_pack(pack):
            assert c.id not in delivered, "a chunk delivered twice"
            delivered[c.id] = pack[c.offset : c.offset + c.length]

    return PackSession(lambda ids: list(ids), deliver, 64 * 1024), delivered


def test_a_large_batch_is_compressed_in_the_background_while_the_caller_goes_on(monkeypatch) -> None:
    """add_many of a batch of many chunks returns before the batch is compressed; the next
    one puts its frames into packs, close puts the last; every chunk lands once, framed as
    encode() frames it."""
    release = threading.Event()
    compressed_in: list[str] = []
    real = frames.compress_batch

    def slow_compress(raws, threads):
        compressed_in.append(threading.current_thread().name)
        assert release.wait(10)
        return real(raws, threads)

    monkeypatch.setattr(frames, "compress_batch", slow_compress)
    session, delivered = _delivering_session()
    first, second = _batch(frames.BATCH_MIN, b"a"), _batch(frames.BATCH_MIN + 7, b"b")
    caller = threading.Thread(target=session.add_many, args=(first,))
    caller.start()
    caller.join(5)
    assert not caller.is_alive(), "add_many waited for the compression"
    assert compressed_in and compressed_in[0] != threading.current_thread().name
    release.set()
    session.add_many(second)  # puts the first batch's frames
    assert len(delivered) + len(session._builder) >= len(first)  # the first batch is in packs
    session.close()
    assert delivered == {cid: frames.encode(raw) for cid, raw in first + second}
    assert session.new_chunks == len(first) + len(second)


def test_a_failed_background_compression_fails_the_close(monkeypatch) -> None:
    def broken(raws, threads):
        raise MemoryError("no room")

    monkeypatch.setattr(frames, "compress_batch", broken)
    session, delivered = _delivering_session()
    session.add_many(_batch(frames.BATCH_MIN, b"c"))
    with pytest.raises(MemoryError):
        session.close()
    assert not delivered


def test_entry_is_a_slots_class_that_still_pickles_and_replaces() -> None:
    entry = Entry("file", 3, 0o600, 7, md5="m", chunks=((b"x" * 32, 3),), meta={"k": "v"})
    assert not hasattr(entry, "__dict__")
    assert pickle.loads(pickle.dumps(entry)) == entry
    assert replace(entry, size=4).size == 4 and entry.with_(mode=0o644).mode == 0o644
    assert Entry.decode(entry.encode()) == entry
