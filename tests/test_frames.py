"""Frames: a chunk as stored and sent; corruption is always detected, never returned."""

from __future__ import annotations

import random

import pytest
import xxhash
import zstandard

from fabric.errors import Corruption
from fabric.format import frames
from fabric.format.chunking import MAX_CHUNK, chunk_id


def _random(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _compressible(n: int, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    words = [b"tensor", b"epoch", b"shard", b"label", b"image", b"token", b"batch"]
    out = bytearray()
    while len(out) < n:
        out += rnd.choice(words) + b"%d," % rnd.randint(0, 99)
    return bytes(out[:n])


def _kind(frame: bytes) -> int:
    return frame[0]


# -- roundtrips --------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"", b"a", _random(1), _random(100), _random(70_000, 1), _random(MAX_CHUNK, 2), _compressible(70_000), b"\0" * MAX_CHUNK],
    ids=["empty", "a", "1B", "100B", "random", "random-max", "text", "zeros"],
)
def test_roundtrip(raw: bytes) -> None:
    frame = frames.encode(raw)
    assert frames.raw_length(frame) == len(raw)
    assert frames.verify_checksum(frame)
    assert frames.decode(frame) == raw
    assert frames.decode(frame, chunk_id(raw)) == raw
    assert frames.decode(memoryview(frame), chunk_id(raw)) == raw
    assert frames.decode(bytearray(frame)) == raw


def test_encode_accepts_memoryview() -> None:
    raw = _compressible(50_000, 3)
    assert frames.encode(memoryview(raw)) == frames.encode(raw)


def test_compressible_data_is_stored_zstd_and_smaller() -> None:
    raw = _compressible(64 * 1024, 4)
    frame = frames.encode(raw)
    assert _kind(frame) == frames.ZSTD
    assert len(frame) < len(raw) // 2
    assert zstandard.ZstdDecompressor().decompress(frame[frames.HEADER_LEN :]) == raw


@pytest.mark.parametrize("raw", [_random(64 * 1024, 5), _random(10, 6), b""], ids=["random", "tiny", "empty"])
def test_incompressible_data_stays_raw(raw: bytes) -> None:
    frame = frames.encode(raw)
    assert _kind(frame) == frames.RAW
    assert frame[frames.HEADER_LEN :] == raw
    assert len(frame) == frames.HEADER_LEN + len(raw)


def test_header_layout() -> None:
    raw = _random(1000, 7)
    frame = frames.encode(raw)
    kind, raw_len, digest = frames.HEADER.unpack_from(frame)
    assert frames.HEADER_LEN == 13
    assert (kind, raw_len) == (frames.RAW, 1000)
    assert digest == xxhash.xxh3_64_intdigest(raw)


def test_barely_compressible_data_stays_raw() -> None:
    # Random data with a tiny compressible tail: zstd saves less than MIN_SAVING.
    raw = _random(60_000, 8) + b"\0" * 100
    assert _kind(frames.encode(raw)) == frames.RAW


# -- corruption --------------------------------------------------------------


def _frames_under_test() -> list[tuple[str, bytes]]:
    return [
        ("zstd", _compressible(3000, 9)),
        ("raw", _random(600, 10)),
        ("empty", b""),
    ]


@pytest.mark.parametrize("name,raw", _frames_under_test(), ids=[n for n, _ in _frames_under_test()])
@pytest.mark.parametrize("flip", [0x01, 0x80, 0xFF])
def test_every_single_flipped_byte_is_detected(name: str, raw: bytes, flip: int) -> None:
    frame = frames.encode(raw)
    assert (_kind(frame) == frames.ZSTD) == (name == "zstd")
    cid = chunk_id(raw)
    for pos in range(len(frame)):
        bad = bytearray(frame)
        bad[pos] ^= flip
        for expected in (cid, None):
            with pytest.raises(Corruption) as info:
                frames.decode(bytes(bad), expected)
            assert "corrupt chunk" in info.value.message
        # A flip in the checksum field or the payload is caught by the cheap check
        # alone (what caches and the wire rely on); raw_len flips need decoding.
        if pos >= 5 or (pos == 0 and bad[0] not in (frames.RAW, frames.ZSTD)):
            assert not frames.verify_checksum(bytes(bad)), pos


def test_flipped_bytes_in_a_large_frame_are_detected() -> None:
    raw = _random(200_000, 11)
    frame = frames.encode(raw)
    cid = chunk_id(raw)
    rnd = random.Random(12)
    for pos in list(range(frames.HEADER_LEN + 8)) + rnd.sample(range(len(frame)), 300) + [len(frame) - 1]:
        bad = bytearray(frame)
        bad[pos] ^= 1 << rnd.randint(0, 7)
        with pytest.raises(Corruption):
            frames.decode(bytes(bad), cid)
        with pytest.raises(Corruption):
            frames.decode(bytes(bad))


@pytest.mark.parametrize("cut_to", [0, 1, frames.HEADER_LEN - 1, frames.HEADER_LEN, frames.HEADER_LEN + 5, -1])
def test_truncated_frames_are_detected(cut_to: int) -> None:
    raw = _compressible(5000, 13)
    frame = frames.encode(raw)
    with pytest.raises(Corruption):
        frames.decode(frame[:cut_to], chunk_id(raw))
    with pytest.raises(Corruption):
        frames.decode(frame[:cut_to])


def test_appended_bytes_are_detected() -> None:
    raw = _random(1000, 14)
    with pytest.raises(Corruption):
        frames.decode(frames.encode(raw) + b"\0", chunk_id(raw))


def test_wrong_expected_id_raises_corruption_naming_the_id() -> None:
    raw = _compressible(10_000, 15)
    frame = frames.encode(raw)
    other = chunk_id(b"something else")
    with pytest.raises(Corruption) as info:
        frames.decode(frame, other)
    assert other.hex() in info.value.message
    assert "does not match" in info.value.message


def test_valid_checksum_but_wrong_content_is_caught_by_id() -> None:
    # A frame re-checksummed after tampering passes the cheap check, not the id check.
    raw = _random(1000, 16)
    tampered = bytearray(raw)
    tampered[500] ^= 1
    forged = frames.HEADER.pack(frames.RAW, len(raw), xxhash.xxh3_64_intdigest(bytes(tampered))) + bytes(tampered)
    assert frames.verify_checksum(forged)
    with pytest.raises(Corruption):
        frames.decode(forged, chunk_id(raw))


def test_unknown_kind_is_refused_even_with_a_valid_checksum() -> None:
    raw = _random(100, 17)
    forged = frames.HEADER.pack(7, len(raw), xxhash.xxh3_64_intdigest(raw)) + raw
    assert not frames.verify_checksum(forged)
    with pytest.raises(Corruption):
        frames.decode(forged)


def test_decompression_bomb_is_refused_without_inflating() -> None:
    """A checksummed frame whose zstd payload inflates far beyond its declared length."""
    payload = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    forged = frames.HEADER.pack(frames.ZSTD, 1000, xxhash.xxh3_64_intdigest(payload)) + payload
    with pytest.raises(Corruption):
        frames.decode(forged)
    # A frame claiming more than any chunk can hold is refused before decompressing.
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (MAX_CHUNK + 1))
    forged = frames.HEADER.pack(frames.ZSTD, MAX_CHUNK + 1, xxhash.xxh3_64_intdigest(no_size)) + no_size
    with pytest.raises(Corruption) as info:
        frames.decode(forged)
    assert "more than a chunk" in info.value.message


def test_zstd_payload_declaring_wrong_length_is_refused() -> None:
    raw = _compressible(4000, 18)
    payload = zstandard.ZstdCompressor().compress(raw)
    forged = frames.HEADER.pack(frames.ZSTD, len(raw) + 1, xxhash.xxh3_64_intdigest(payload)) + payload
    with pytest.raises(Corruption):
        frames.decode(forged)
    forged = frames.HEADER.pack(frames.ZSTD, len(raw) - 1, xxhash.xxh3_64_intdigest(payload)) + payload
    with pytest.raises(Corruption):
        frames.decode(forged)
