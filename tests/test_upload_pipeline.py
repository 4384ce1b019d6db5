"""The remote chunk sink: round trips off the reading thread, bounded memory, errors kept.

Unit tests drive :class:`PipelinedSink` with plain functions in place of the
server's answers (the sink's contract is about when it calls them); the last
two tests upload to a real hub.
"""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc
import uuid

import pytest

from fabric.client.http import HttpPlane
from fabric.client.upload import PipelinedSink
from fabric.format import frames, packs
from fabric.format.chunking import chunk_id
from fabric.format.ingest import Boundaries, PackSession
from tests.hubserver import Hub

KIB = 1024


def _chunks(n: int, size: int = 4 * KIB) -> list[tuple[bytes, bytes]]:
    out = []
    for _ in range(n):
        raw = os.urandom(size)
        out.append((chunk_id(raw), raw))
    return out


class _Server:
    """What a server answers: it holds ``known`` ids; ``gate`` holds every question until set."""

    def __init__(self, known: set[bytes] = frozenset()) -> None:
        self.known = set(known)
        self.stored: dict[bytes, bytes] = {}
        self.questions = 0
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Exception | None = None

    def missing(self, ids):
        self.questions += 1
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail is not None:
            raise self.fail
        return [c for c in ids if c not in self.known and c not in self.stored]

    def deliver(self, builder: packs.PackBuilder) -> None:
        pack = builder.finish()
        for c in packs.parse_index(pack):
            self.stored[c.id] = frames.decode(pack[c.offset : c.offset + c.length], c.id)


def _sink(server: _Server, batch: int = 16 * KIB, depth: int = 2) -> PipelinedSink:
    return PipelinedSink(PackSession(server.missing, server.deliver, 64 * KIB), batch_bytes=batch, depth=depth)


def _offer(sink: PipelinedSink, chunks) -> None:
    new = sink.filter_new([cid for cid, _ in chunks])
    for cid, raw in chunks:
        if cid in new:
            new.discard(cid)
            sink.add(cid, raw)


def test_only_what_the_server_lacks_is_sent_and_counted():
    chunks = _chunks(40)
    server = _Server(known={cid for cid, _ in chunks[:10]})
    sink = _sink(server)
    _offer(sink, chunks)
    _offer(sink, chunks[20:30])  # offered again: taken once
    sink.close()
    assert set(server.stored) == {cid for cid, _ in chunks[10:]}
    assert all(server.stored[cid] == raw for cid, raw in chunks[10:])
    assert sink.new_chunks == 30 and sink.new_bytes == 30 * 4 * KIB


def test_the_caller_does_not_wait_on_a_question_until_the_pipeline_is_full():
    server = _Server()
    server.gate.clear()  # every question hangs until the test lets it through
    sink = _sink(server, batch=16 * KIB, depth=2)
    _offer(sink, _chunks(8))  # two batches: both in flight, the caller goes on
    assert server.questions <= 2
    third = threading.Thread(target=_offer, args=(sink, _chunks(4)))
    third.start()
    third.join(0.5)
    assert third.is_alive(), "a third batch must wait for one of the two in flight (bounded memory)"
    server.gate.set()
    third.join(10)
    assert not third.is_alive()
    sink.close()
    assert len(server.stored) == 12


def test_the_first_batches_and_packs_are_small_and_double_up_to_their_full_size():
    """A slow start: the first question and the first pack go out after a few chunks, not a full
    batch; each batch or pack is as large as all before it, so from the full size on they end
    where full-size ones would."""
    server = _Server()
    asked: list[int] = []
    packed: list[int] = []

    def missing(ids):
        asked.append(len(ids))
        return server.missing(ids)

    def deliver(builder: packs.PackBuilder) -> None:
        packed.append(len(builder))
        server.deliver(builder)

    frame = 4 * KIB + frames.HEADER_LEN  # a frame of 4 KiB of random bytes (stored raw)
    session = PackSession(missing, deliver, 16 * frame, first_size=2 * frame)
    sink = PipelinedSink(session, batch_bytes=64 * KIB, depth=1, first_batch_bytes=8 * KIB)
    chunks = _chunks(64)
    _offer(sink, chunks)
    sink.close()
    assert asked == [2, 2, 4, 8, 16, 16, 16]  # chunks of 4 KiB: 8, 8, 16, 32, then 64 KiB (ends at 64, 128, 192 KiB)
    assert packed == [2, 2, 4, 8, 16, 16, 16]  # each as large as all before it: full packs end at 16, 32, 48
    assert set(server.stored) == {cid for cid, _ in chunks}


def test_the_boundaries_of_a_slow_start_do_not_drift_with_pieces_that_overshoot_them():
    ends = Boundaries(2, 16)
    passed, filling, at = 0, 0, []
    for _ in range(22):  # items of 3 units: each piece overshoots its boundary
        filling += 3
        if ends.reached(filling):
            passed += filling
            filling = 0
            at.append(passed)
    assert at == [3, 6, 9, 18, 33, 48, 66]  # the first end at or past 2, 4, 8, 16, 32, 48, 64

def test_an_error_of_a_background_batch_is_raised_and_nothing_more_is_sent():
    server = _Server()
    server.fail = RuntimeError("the hub refused")
    sink = _sink(server, batch=16 * KIB, depth=1)
    with pytest.raises(RuntimeError, match="the hub refused"):
        _offer(sink, _chunks(12))  # the second batch's dispatch sees the first one's error
        sink.close()
    assert server.stored == {}


def test_close_raises_the_error_of_the_last_batch():
    server = _Server()
    sink = _sink(server, batch=1024 * KIB)
    _offer(sink, _chunks(3))
    server.fail = RuntimeError("gone")
    with pytest.raises(RuntimeError, match="gone"):
        sink.close()


def test_an_import_to_a_hub_through_the_pipelined_sink_reads_back(hub: Hub, tmp_path):
    plane = HttpPlane(hub.url, hub.token)
    repo = "up-" + uuid.uuid4().hex[:8]
    plane.create_repo(repo)
    from fabric.client.transfer import export_tree, import_directory

    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i}.bin").write_bytes(os.urandom(300 * KIB))
    (src / "dup.bin").write_bytes((src / "f0.bin").read_bytes())
    result = import_directory(plane, str(src), repo, "main", "m")
    assert result.added == 31 and result.new_bytes <= 30 * 300 * KIB
    export_tree(plane, repo, "main", str(tmp_path / "out"))
    for f in src.iterdir():
        assert (tmp_path / "out" / f.name).read_bytes() == f.read_bytes()


def test_uploaded_packs_are_let_go_of_with_the_cycle_collector_off(hub: Hub):
    """``fabric import`` turns the cycle collector off; httpx's request/response objects form
    cycles, so a pack passed to them as bytes stayed in memory for the whole import."""
    plane = HttpPlane(hub.url, hub.token)
    repo = "mem-" + uuid.uuid4().hex[:8]
    plane.create_repo(repo)

    def upload_one_pack() -> None:
        builder = packs.PackBuilder()
        for cid, raw in _chunks(16, 64 * KIB):
            builder.add(cid, frames.encode(raw))
        plane.receive_pack(builder.finish(), repo=repo)

    upload_one_pack()  # warm: the connection, lazy imports
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        for _ in range(7):
            upload_one_pack()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        gc.enable()
    assert held < 2 * 1024 * KIB, f"{held} bytes still held after 7 uploads of 1 MiB"
