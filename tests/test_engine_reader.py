"""Streaming a file's chunks (fabric/engine/reader.py): a ``readahead`` callback hears of each
batch after the first exactly once, a fixed number of batches before it is read."""

from __future__ import annotations

import io
import random

from fabric.engine.reader import READ_BATCH, READAHEAD_BATCHES, Reader
from fabric.format.model import HOLE_ID


def test_readahead_is_told_each_later_batch_once_before_it_is_read(sqlite_engine) -> None:
    engine = sqlite_engine
    engine.create_repo("ahead")
    data = random.Random(5).randbytes(24 * 1024 * 1024)
    engine.put_object("ahead", "main", "big.bin", io.BytesIO(data))
    entry = engine.stat_chunks("ahead", "main", "big.bin")
    ids = [cid for cid, _ in entry.chunks if cid != HOLE_ID]
    assert len(ids) > (2 + READAHEAD_BATCHES) * READ_BATCH  # enough batches to see the window move
    events: list[tuple[str, list[bytes]]] = []

    def read_chunks(batch):
        events.append(("read", list(batch)))
        return engine.chunks.read_many(batch)

    reader = Reader(engine.meta, engine.trees, read_chunks)
    got = b"".join(reader.read_entry(entry, readahead=lambda ahead: events.append(("ahead", list(ahead)))))
    assert got == data
    told = [cid for kind, batch in events if kind == "ahead" for cid in batch]
    assert sorted(told) == sorted(ids[READ_BATCH:])  # every batch after the first, once
    # Each batch was told of before the reader came within READAHEAD_BATCHES batches of it.
    reads = [batch for kind, batch in events if kind == "read"]
    for k, batch in enumerate(reads[1:], start=1):
        position = events.index(("read", batch))
        told_at = next(i for i, (kind, ahead) in enumerate(events) if kind == "ahead" and batch[0] in ahead)
        assert told_at < events.index(("read", reads[max(0, k - READAHEAD_BATCHES)])) <= position
