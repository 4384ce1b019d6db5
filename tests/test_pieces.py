"""Streamed answers are joined into pieces of about a MiB (fabric/util/pieces.py)."""

from __future__ import annotations

from fabric.util.pieces import in_pieces


def test_parts_are_joined_into_pieces_of_at_least_the_size_in_order() -> None:
    parts = [bytes([i]) * 3 for i in range(10)]  # 30 bytes in parts of 3
    pieces = list(in_pieces(parts, size=7))
    assert [len(p) for p in pieces] == [9, 9, 9, 3]
    assert b"".join(pieces) == b"".join(parts)
    assert all(type(p) is bytes for p in pieces)


def test_a_part_larger_than_the_size_is_one_piece_and_views_become_bytes() -> None:
    big = memoryview(b"x" * 100)
    pieces = list(in_pieces([b"ab", big, b"cd"], size=10))
    assert pieces == [b"ab" + b"x" * 100, b"cd"]
    assert list(in_pieces([memoryview(b"abc")], size=10)) == [b"abc"]
    assert list(in_pieces([], size=10)) == []
