"""Packs: layout roundtrip, malformed input refused, bad frames never indexed."""

from __future__ import annotations

import os
import random
import struct

import pytest

from fabric.engine.engine import Engine
from fabric.errors import BadRequest, Corruption, NotFound
from fabric.format import frames, packs
from fabric.format.chunking import chunk_id
from fabric.format.packs import (
    FOOTER,
    INDEX_ROW,
    MAGIC,
    PackBuilder,
    PackedChunk,
    parse_index,
    verify_pack,
)


def _chunks(n: int, seed: int = 0) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2:
            out.append(rnd.randbytes(rnd.randint(1, 40_000)))
        else:
            out.append((b"compressible %d " % i) * rnd.randint(1, 3000))
    return out


def _pack(raws: list[bytes]) -> tuple[bytes, PackBuilder]:
    b = PackBuilder()
    for raw in raws:
        b.add(chunk_id(raw), frames.encode(raw))
    return b.finish(), b


def _footer(data: bytes) -> tuple[int, int, bytes]:
    return FOOTER.unpack_from(data, len(data) - FOOTER.size)


def _with_footer(data: bytes, count: int, index_off: int, magic: bytes = MAGIC) -> bytes:
    return data[: -FOOTER.size] + FOOTER.pack(count, index_off, magic)


def _rewrite_row(data: bytes, i: int, **fields) -> bytes:
    _, index_off, _ = _footer(data)
    pos = index_off + i * INDEX_ROW.size
    cid, off, length, raw_len = INDEX_ROW.unpack_from(data, pos)
    row = {"cid": cid, "off": off, "length": length, "raw_len": raw_len}
    row.update(fields)
    return data[:pos] + INDEX_ROW.pack(row["cid"], row["off"], row["length"], row["raw_len"]) + data[pos + INDEX_ROW.size :]


# -- layout ------------------------------------------------------------------


def test_builder_parse_verify_roundtrip() -> None:
    raws = _chunks(12)
    data, builder = _pack(raws)
    assert len(builder) == 12
    assert builder.ids == {chunk_id(r) for r in raws}
    index = parse_index(data)
    assert index == builder.chunks
    assert verify_pack(data) == index
    assert verify_pack(memoryview(data)) == index
    pos = 0
    for raw, c in zip(raws, index):
        assert c == PackedChunk(chunk_id(raw), pos, c.length, len(raw))
        frame = data[c.offset : c.offset + c.length]
        assert frames.decode(frame, c.id) == raw
        pos += c.length
    count, index_off, magic = _footer(data)
    assert (count, index_off, magic) == (12, builder.size, MAGIC)
    assert len(data) == builder.size + 12 * INDEX_ROW.size + FOOTER.size


def test_empty_pack() -> None:
    data = PackBuilder().finish()
    assert len(data) == FOOTER.size
    assert parse_index(data) == []
    assert verify_pack(data) == []


def test_pack_ids_sort_by_creation_time() -> None:
    a = packs.new_pack_id()
    b = packs.new_pack_id()
    assert a < b
    assert packs.pack_key(a).startswith(packs.PACK_PREFIX + a[:8] + "/")
    assert abs(packs.pack_created(a) - packs.pack_created(b)) < 5


# -- malformed layouts: BadRequest -------------------------------------------


def _malformed_cases() -> dict[str, bytes]:
    data, _ = _pack(_chunks(4, 1))
    count, index_off, _ = _footer(data)
    rows = parse_index(data)
    return {
        "empty": b"",
        "shorter-than-footer": data[-FOOTER.size + 1 :],
        "wrong-magic": _with_footer(data, count, index_off, b"FPK2"),
        "count-too-high": _with_footer(data, count + 1, index_off),
        "count-too-low": _with_footer(data, count - 1, index_off),
        "index-offset-too-high": _with_footer(data, count, index_off + 1),
        "index-offset-huge": _with_footer(data, count, 2**63),
        "truncated-front": data[1:],
        "truncated-end": data[:-1],
        "trailing-garbage": data + b"\0",
        "gap-between-frames": _rewrite_row(data, 1, off=rows[1].offset + 1),
        "overlapping-frames": _rewrite_row(data, 1, off=rows[1].offset - 1),
        "frame-past-index": _rewrite_row(data, 3, length=rows[3].length + 1),
        "frame-area-short": _rewrite_row(data, 3, length=rows[3].length - 1),
        "not-a-pack": b"x" * 200,
    }


@pytest.mark.parametrize("case", list(_malformed_cases()))
def test_malformed_packs_are_bad_requests(case: str) -> None:
    data = _malformed_cases()[case]
    with pytest.raises(BadRequest):
        parse_index(data)
    with pytest.raises(BadRequest):
        verify_pack(data)


# -- bad frames: Corruption --------------------------------------------------


def test_verify_pack_detects_every_flipped_frame_byte_sampled() -> None:
    data, builder = _pack(_chunks(6, 2))
    rnd = random.Random(3)
    for pos in rnd.sample(range(builder.size), 200):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        with pytest.raises(Corruption):
            verify_pack(bytes(bad))


def test_verify_pack_detects_wrong_id_and_wrong_raw_len() -> None:
    data, _ = _pack(_chunks(3, 4))
    with pytest.raises(Corruption) as info:
        verify_pack(_rewrite_row(data, 2, cid=chunk_id(b"not this chunk")))
    assert chunk_id(b"not this chunk").hex() in info.value.message
    with pytest.raises(Corruption):
        verify_pack(_rewrite_row(data, 0, raw_len=parse_index(data)[0].raw_len + 1))


def test_verify_pack_detects_forged_frame_with_valid_checksum() -> None:
    good = b"good chunk" * 100
    evil = b"evil chunk" * 100
    b = PackBuilder()
    b.add(chunk_id(good), frames.encode(evil))  # checksum fine, id wrong
    with pytest.raises(Corruption):
        verify_pack(b.finish())


# -- ChunkStore.receive_pack (both catalogs) ---------------------------------


def _pack_object_keys(engine: Engine) -> list[str]:
    return [o.key for o in engine.store.list(packs.PACK_PREFIX)]


def test_receive_pack_stores_and_indexes_then_reads(engine: Engine) -> None:
    raws = _chunks(8, 5)
    data, _ = _pack(raws)
    assert engine.chunks.receive_pack(data) == (8, 8)
    stats = engine.catalog.stats()
    assert stats["chunks"] == 8 and stats["packs"] == 1 and stats["pack_bytes"] == len(data)
    assert stats["unique_bytes"] == sum(len(r) for r in raws)
    assert len(_pack_object_keys(engine)) == 1
    for raw in raws:
        loc = engine.catalog.locate(chunk_id(raw))
        assert loc is not None and loc.raw_len == len(raw)
    assert engine.chunks.read_many([chunk_id(r) for r in reversed(raws)]) == list(reversed(raws))
    # The same pack again: nothing new is stored or indexed.
    assert engine.chunks.receive_pack(data) == (8, 0)
    assert engine.catalog.stats() == stats
    assert len(_pack_object_keys(engine)) == 1


def test_receive_pack_indexes_only_new_chunks(engine: Engine) -> None:
    raws = _chunks(6, 6)
    first, _ = _pack(raws[:3])
    assert engine.chunks.receive_pack(first) == (3, 3)
    old_loc = engine.catalog.locate(chunk_id(raws[0]))
    second, _ = _pack(raws)
    assert engine.chunks.receive_pack(second) == (6, 3)
    assert engine.catalog.locate(chunk_id(raws[0])) == old_loc
    assert engine.catalog.stats()["chunks"] == 6
    assert engine.chunks.missing([chunk_id(r) for r in raws] + [chunk_id(b"absent")]) == [chunk_id(b"absent")]
    assert engine.chunks.read_many([chunk_id(r) for r in raws]) == raws


def test_pack_with_one_mismatched_frame_is_refused_whole(engine: Engine) -> None:
    raws = _chunks(7, 7)
    for bad_index in (0, 3, 6):
        b = PackBuilder()
        for i, raw in enumerate(raws):
            cid = chunk_id(raw)
            b.add(cid, frames.encode(raw if i != bad_index else raw + b"!"))
        data = b.finish()
        with pytest.raises(Corruption) as info:
            engine.chunks.receive_pack(data)
        assert chunk_id(raws[bad_index]).hex() in info.value.message
        for raw in raws:
            assert engine.catalog.locate(chunk_id(raw)) is None
        assert engine.catalog.locate_many([chunk_id(r) for r in raws]) == {}
        stats = engine.catalog.stats()
        assert stats["chunks"] == 0 and stats["packs"] == 0 and stats["pack_bytes"] == 0
        assert _pack_object_keys(engine) == []
        with pytest.raises(NotFound):
            engine.chunks.read(chunk_id(raws[0]))
    assert engine.chunks.missing([chunk_id(r) for r in raws]) == [chunk_id(r) for r in raws]


def test_malformed_or_empty_pack_through_receive_pack(engine: Engine) -> None:
    assert engine.chunks.receive_pack(PackBuilder().finish()) == (0, 0)
    data, _ = _pack(_chunks(3, 8))
    for bad in (data[:-3], data[1:], b"", b"garbage" * 10):
        with pytest.raises(BadRequest):
            engine.chunks.receive_pack(bad)
    assert engine.catalog.stats()["chunks"] == 0
    assert engine.catalog.stats()["packs"] == 0
    assert _pack_object_keys(engine) == []


# -- corrupted pack at rest: reads and verify detect it ----------------------


def _pack_file(engine: Engine) -> str:
    (key,) = _pack_object_keys(engine)
    return os.path.join(engine.store.root, key)


def test_corrupted_pack_byte_detected_by_reads_and_verify(sqlite_engine: Engine) -> None:
    e = sqlite_engine
    raws = _chunks(5, 9)
    ids = [chunk_id(r) for r in raws]
    with e.chunks.session() as s:
        for raw in raws:
            s.add(chunk_id(raw), raw)
    assert s.new_chunks == 5
    path = _pack_file(e)
    victim = e.catalog.locate(ids[2])
    with open(path, "r+b") as f:
        f.seek(victim.offset + victim.length - 1)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(Corruption) as info:
        e.chunks.read(ids[2])
    assert ids[2].hex() in info.value.message
    # Neighbours in the same pack still read fine.
    assert e.chunks.read(ids[0]) == raws[0]
    assert e.chunks.read(ids[4]) == raws[4]
    problems = dict(e.chunks.verify(ids + [chunk_id(b"never stored")]))
    assert problems[chunk_id(b"never stored")] == "not indexed"
    assert problems[ids[2]] is not None and "checksum" in problems[ids[2]]
    assert all(problems[c] is None for c in ids if c != ids[2])


def test_session_skips_chunks_already_stored(sqlite_engine: Engine) -> None:
    e = sqlite_engine
    raws = _chunks(4, 10)
    with e.chunks.session() as s:
        for raw in raws:
            s.add(chunk_id(raw), raw)
        s.add(chunk_id(raws[0]), raws[0])  # a repeat within the session
    assert s.new_chunks == 4
    with e.chunks.session() as s2:
        new = s2.filter_new([chunk_id(r) for r in raws] + [chunk_id(b"fresh")])
    assert new == {chunk_id(b"fresh")}
    assert e.catalog.stats()["packs"] == 1


def test_index_row_struct_is_the_documented_layout() -> None:
    assert INDEX_ROW.size == 32 + 8 + 4 + 4
    assert FOOTER.size == 4 + 8 + 4
    assert struct.calcsize("<IQ4s") == FOOTER.size
