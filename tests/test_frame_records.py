"""Parsing a ``frames`` response's records as they arrive (fabric/client/records.py):
whatever the pieces' boundaries, each record comes out whole and in order; a stream cut
inside a record or a length no frame can have is an error, not data."""

from __future__ import annotations

import os
import random
import struct

import pytest

from fabric import errors
from fabric.client.records import MAX_FRAME, parse_records
from fabric.format import chunking, frames


def record(raw: bytes) -> tuple[bytes, bytes, bytes]:
    """``(id, frame, the record's bytes)`` of a chunk."""
    cid, frame = chunking.chunk_id(raw), frames.encode(raw)
    return cid, frame, cid + struct.pack("<I", len(frame)) + frame


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    """``data`` in pieces of the given sizes, cycled."""
    pieces, pos, i = [], 0, 0
    while pos < len(data):
        pieces.append(data[pos : pos + sizes[i % len(sizes)]])
        pos += sizes[i % len(sizes)]
        i += 1
    return pieces


@pytest.mark.parametrize("sizes", [[1], [7, 1, 36], [35], [36], [37], [4096], [65_536], [100_000, 3], [1 << 22]])
def test_records_come_out_whole_whatever_the_pieces(sizes: list[int]) -> None:
    rnd = random.Random(sum(sizes))
    raws = [rnd.randbytes(rnd.choice([1, 35, 36, 5000, 65_536, 70_000])) for _ in range(12)]
    raws.append(b"compressible " * 4000)
    recs = [record(raw) for raw in raws]
    stream = b"".join(r[2] for r in recs)
    got = list(parse_records(cut(stream, sizes)))
    assert got == [(cid, frame) for cid, frame, _ in recs]
    assert all(type(cid) is bytes and type(frame) is bytes for cid, frame in got)
    assert [frames.decode(frame, cid) for cid, frame in got] == raws


def test_empty_pieces_and_an_empty_stream_are_no_records() -> None:
    assert list(parse_records([])) == []
    cid, frame, rec = record(os.urandom(100))
    assert list(parse_records([b"", rec[:10], b"", rec[10:], b""])) == [(cid, frame)]


@pytest.mark.parametrize("keep", [1, 35, 36, 40, -1])
def test_a_stream_cut_inside_a_record_is_unavailable_after_the_whole_ones(keep: int) -> None:
    first, second = record(os.urandom(1000)), record(os.urandom(1000))
    stream = first[2] + second[2][:keep]
    got = []
    with pytest.raises(errors.Unavailable, match="middle of a record"):
        for item in parse_records(cut(stream, [300])):
            got.append(item)
    assert got == [first[:2]]


def test_a_length_no_frame_can_have_is_refused_before_it_is_buffered() -> None:
    head = os.urandom(32) + struct.pack("<I", MAX_FRAME + 1)
    fed = []

    def pieces():
        yield head
        fed.append("more")  # the parser must stop before asking for the frame's bytes
        yield os.urandom(1 << 20)

    with pytest.raises(errors.Corruption, match="no frame is longer"):
        list(parse_records(pieces()))
    assert fed == []
    # The longest frame there can be is accepted.
    raw = os.urandom(chunking.MAX_CHUNK)
    cid, frame, rec = record(raw)
    assert len(frame) == MAX_FRAME
    assert list(parse_records([rec])) == [(cid, frame)]
