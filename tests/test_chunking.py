"""Content-defined chunking: boundaries, sizes, streaming equivalence, chunk ids."""

from __future__ import annotations

import hashlib
import io
import random

import blake3
import pytest

from fabric.format import chunking
from fabric.format.chunking import MAX_CHUNK, MIN_CHUNK, chunk_id, cut, cut_stream, file_chunks

MiB = 1024 * 1024


def _random(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _text_like(n: int, seed: int) -> bytes:
    """Low-entropy but non-repeating data (compressible, still content-defined)."""
    rnd = random.Random(seed)
    words = [bytes(rnd.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 9))) for _ in range(500)]
    out = bytearray()
    while len(out) < n:
        out += rnd.choice(words) + b" "
    return bytes(out[:n])


DATA = {
    "empty": b"",
    "one-byte": b"x",
    "below-min": _random(MIN_CHUNK - 1, 1),
    "exactly-min": _random(MIN_CHUNK, 2),
    "exactly-max": _random(MAX_CHUNK, 3),
    "random-3MiB": _random(3 * MiB + 12345, 4),
    "zeros-2MiB": b"\0" * (2 * MiB + 7),
    "text-2MiB": _text_like(2 * MiB, 5),
    "repeated-block": _random(300_000, 6) * 5,
}


def _lengths(pieces) -> list[int]:
    return [len(p) for p in pieces]


class ShortReads(io.RawIOBase):
    """A stream that returns fewer bytes than asked (like a pipe or a socket)."""

    def __init__(self, data: bytes, seed: int) -> None:
        self._data = data
        self._pos = 0
        self._rnd = random.Random(seed)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = len(self._data) - self._pos
        n = min(n, self._rnd.randint(1, 200_000))
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out


# -- chunk ids ---------------------------------------------------------------


def test_chunk_id_is_blake3_256_known_vectors() -> None:
    # Official BLAKE3 test vector for the empty input.
    assert chunk_id(b"").hex() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert chunk_id(b"abc").hex() == "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    assert len(chunk_id(b"abc")) == chunking.ID_LEN == 32


def test_chunk_id_matches_blake3_for_large_inputs_and_views() -> None:
    data = _random(3 * MiB, 7)
    assert chunk_id(data) == blake3.blake3(data).digest()
    assert chunk_id(memoryview(data)[100:200_100]) == blake3.blake3(data[100:200_100]).digest()
    # Not some other 256-bit hash.
    assert chunk_id(data) != hashlib.sha256(data).digest()
    assert chunk_id(data) != hashlib.blake2b(data, digest_size=32).digest()


# -- cut() -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DATA))
def test_cut_covers_data_exactly_and_respects_sizes(name: str) -> None:
    data = DATA[name]
    pieces = list(cut(data))
    assert b"".join(bytes(p) for p in pieces) == data
    if not data:
        assert pieces == []
        return
    assert all(len(p) > 0 for p in pieces)
    for p in pieces[:-1]:
        assert MIN_CHUNK <= len(p) <= MAX_CHUNK, _lengths(pieces)
    assert len(pieces[-1]) <= MAX_CHUNK


def test_cut_yields_views_into_the_buffer_without_copies() -> None:
    data = bytearray(_random(1 * MiB, 8))
    pieces = list(cut(data))
    assert all(isinstance(p, memoryview) for p in pieces)
    first = bytes(pieces[0][:16])
    data[0] ^= 0xFF  # a view sees the change; a copy would not
    assert bytes(pieces[0][:16]) != first


def test_zeros_are_cut_at_max_size() -> None:
    pieces = list(cut(b"\0" * (4 * MAX_CHUNK + 5)))
    assert _lengths(pieces) == [MAX_CHUNK] * 4 + [5]


def test_random_data_chunks_average_near_target() -> None:
    data = _random(16 * MiB, 9)
    pieces = list(cut(data))
    avg = len(data) / len(pieces)
    # avg target 64 KiB; normalized chunking keeps the mean within a factor ~2.
    assert 32 * 1024 <= avg <= 128 * 1024, avg


def test_cut_is_deterministic_and_dedups_repeated_content() -> None:
    block = _random(2 * MiB, 10)
    once = [chunk_id(p) for p in cut(block)]
    assert once == [chunk_id(p) for p in cut(bytes(block))]
    twice = [chunk_id(p) for p in cut(block + block)]
    # The second copy re-synchronises after at most a couple of chunks.
    assert len(set(twice)) <= len(set(once)) + 3
    assert set(once[1:-1]) <= set(twice)


def test_params_record_the_format() -> None:
    p = chunking.PARAMS
    assert (p.version, p.min_size, p.avg_size, p.max_size) == (
        chunking.FORMAT_VERSION,
        16 * 1024,
        64 * 1024,
        256 * 1024,
    )


# -- cut_stream() == cut() ---------------------------------------------------

WINDOWS = [4096, MIN_CHUNK - 1, 65536, MAX_CHUNK, MAX_CHUNK + 1, 1_000_003, 8 * MiB]


@pytest.mark.parametrize("name", list(DATA))
@pytest.mark.parametrize("window", WINDOWS)
def test_cut_stream_matches_cut(name: str, window: int) -> None:
    data = DATA[name]
    whole = [bytes(p) for p in cut(data)]
    streamed = [bytes(p) for p in cut_stream(io.BytesIO(data), window=window)]
    assert _lengths(streamed) == _lengths(whole)
    assert streamed == whole


def test_cut_stream_tiny_window_matches_cut() -> None:
    data = _random(80_000, 11)
    whole = _lengths(cut(data))
    assert _lengths(cut_stream(io.BytesIO(data), window=97)) == whole
    assert _lengths(cut_stream(io.BytesIO(data), window=1)) == whole


@pytest.mark.parametrize("seed", range(6))
def test_cut_stream_matches_cut_random_sizes_and_windows(seed: int) -> None:
    rnd = random.Random(1000 + seed)
    data = _random(rnd.randint(1, 5 * MiB), seed)
    window = rnd.choice([rnd.randint(1000, 300_000), rnd.randint(300_000, 3 * MiB)])
    assert _lengths(cut_stream(io.BytesIO(data), window=window)) == _lengths(cut(data))


def test_cut_stream_handles_short_reads() -> None:
    data = _random(4 * MiB + 1, 12)
    whole = [bytes(p) for p in cut(data)]
    streamed = [bytes(p) for p in cut_stream(ShortReads(data, 1), window=1 << 20)]
    assert streamed == whole


def test_cut_stream_memory_is_bounded_by_window() -> None:
    data = _random(6 * MiB, 13)
    window = 256 * 1024
    for piece in cut_stream(io.BytesIO(data), window=window):
        # Each yielded view belongs to a buffer of at most window + one carried chunk.
        assert len(piece.obj) <= window + MAX_CHUNK


def test_file_chunks_match_cut(tmp_path) -> None:
    data = _random(3 * MiB + 5, 14)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert [bytes(p) for p in file_chunks(path)] == [bytes(p) for p in cut(data)]
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert list(file_chunks(empty)) == []


# -- content-defined: local edits change few chunks --------------------------


@pytest.mark.parametrize("edit", ["insert", "delete", "overwrite"])
def test_local_edit_in_10MiB_changes_only_a_few_chunks(edit: str) -> None:
    data = _random(10 * MiB, 15)
    mid = 5 * MiB + 333
    if edit == "insert":
        changed = data[:mid] + b"hello, inserted bytes!" * 7 + data[mid:]
    elif edit == "delete":
        changed = data[:mid] + data[mid + 1000 :]
    else:
        changed = data[:mid] + bytes(b ^ 0x5A for b in data[mid : mid + 100]) + data[mid + 100 :]
    old_pieces, new_pieces = list(cut(data)), list(cut(changed))
    old = [chunk_id(p) for p in old_pieces]
    new = [chunk_id(p) for p in new_pieces]
    assert len(old) > 100
    fresh = [c for c in new if c not in set(old)]
    lost = [c for c in old if c not in set(new)]
    assert 1 <= len(fresh) <= 3, len(fresh)
    assert 1 <= len(lost) <= 3, len(lost)
    # Chunks before and after the edit are literally the same sequence: the
    # unchanged prefix and suffix reach to within a couple of chunks of the edit.
    k = 0
    while old[k] == new[k]:
        k += 1
    assert sum(len(p) for p in old_pieces[:k]) >= mid - 2 * MAX_CHUNK
    j = 0
    while old[-1 - j] == new[-1 - j]:
        j += 1
    assert sum(len(p) for p in old_pieces[len(old) - j :]) >= len(data) - mid - 2 * MAX_CHUNK
    assert len(new) - k - j <= 3


class _ListSink:
    """A sink that holds what it is given (a destination that lacks nothing it was not given)."""

    def __init__(self) -> None:
        self.chunks: dict[bytes, bytes] = {}
        self.closed = 0
        self.new_chunks = self.new_bytes = self.stored_bytes = 0

    def filter_new(self, ids):
        return {cid for cid in ids if cid not in self.chunks}

    def add_many(self, pairs) -> None:
        for cid, raw in pairs:
            self.chunks[cid] = bytes(raw)

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("seed", range(4))
def test_stream_chunker_matches_a_whole_ingest_whatever_the_blocks(seed: int) -> None:
    from fabric.format.ingest import StreamChunker

    rnd = random.Random(seed)
    data = _random(3 * 1024 * 1024 + rnd.randrange(100_000), seed)
    sink = _ListSink()
    chunker = StreamChunker(lambda: sink)
    pos = 0
    while pos < len(data):
        n = rnd.choice([1, 4096, MIN_CHUNK - 1, MAX_CHUNK + 1, 700_000])
        chunker.feed(data[pos : pos + n])
        pos += n
    assert len(sink.chunks) > 0 and not sink.closed  # sent while fed, before finish
    chunks, md5 = chunker.finish()
    assert chunks == [(chunk_id(p), len(p)) for p in cut(data)]
    assert md5 == hashlib.md5(data).hexdigest() and sink.closed == 1
    assert b"".join(sink.chunks[cid] for cid, _ in chunks) == data


def test_stream_chunker_goes_on_after_a_finish() -> None:
    from fabric.format.ingest import StreamChunker

    data = _random(1024 * 1024, 9)
    sinks: list[_ListSink] = []
    chunker = StreamChunker(lambda: sinks.append(_ListSink()) or sinks[-1])
    chunker.feed(data[:300_000])
    first, _ = chunker.finish()  # a sync in the middle of the file
    assert sum(n for _, n in first) == 300_000
    chunker.feed(data[300_000:])
    chunks, md5 = chunker.finish()
    assert chunks == [(chunk_id(p), len(p)) for p in cut(data)] and md5 == hashlib.md5(data).hexdigest()
    assert all(s.closed == 1 for s in sinks) and len(sinks) == 2
    empty = StreamChunker(lambda: _ListSink())
    assert empty.finish() == ([], hashlib.md5(b"").hexdigest())
