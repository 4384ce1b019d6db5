"""Dedup between checkpoints, measured at the wire (issue 16.5).

Checkpoint N+1 written after N through ``fabric://`` across a counting proxy: a
frozen-backbone step (a few tensors of each shard changed) sends little more than the
changed bytes and stores no more; a full fine-tuning step (every byte new) costs no
more than its size, on the wire and in the store.
"""

from __future__ import annotations

import os
import random

import fsspec
import pytest

from testbed.wanproxy import WanProxy
from tests.hubserver import Hub, unique_name

MIB = 1 << 20
TENSORS = 16
TENSOR = MIB


def shard(tensors: list[bytes]) -> bytes:
    return b"".join(tensors)


def stored_bytes(hub: Hub) -> int:
    return hub.plane().stats()["stored_bytes"]


@pytest.fixture
def link(hub: Hub):
    with WanProxy("127.0.0.1", int(hub.url.rsplit(":", 1)[1])) as wan:
        yield wan


def write(fs, url: str, data: bytes) -> None:
    with fs.open(url, "wb") as f:
        for i in range(0, len(data), MIB):
            f.write(data[i : i + MIB])


@pytest.mark.parametrize(("case", "changed"), [("frozen backbone", 2), ("full fine-tune", TENSORS)])
def test_step_n_plus_1_sends_and_stores_about_what_changed(hub: Hub, link: WanProxy, case: str, changed: int) -> None:
    repo = unique_name("dedup")
    hub.plane().create_repo(repo)
    fs = fsspec.filesystem("fabric", server=link.url_for(), token=hub.token, skip_instance_cache=True, commit="step")
    rnd = random.Random(changed)
    step_n = [rnd.randbytes(TENSOR) for _ in range(TENSORS)]
    for rank in range(2):
        write(fs, f"{repo}@main/step-1/__{rank}_0.distcp", shard(step_n))
    step_next = step_n[: TENSORS - changed] + [os.urandom(TENSOR) for _ in range(changed)]
    diff = changed * TENSOR
    sent, stored = link.bytes_up, stored_bytes(hub)
    write(fs, f"{repo}@main/step-2/__0_0.distcp", shard(step_next))
    sent, stored = link.bytes_up - sent, stored_bytes(hub) - stored
    # Changed bytes, plus at most one chunk (64 KiB average, 256 KiB at most) cut differently
    # at the edge of the changed tensors, plus the requests themselves.
    assert sent <= 1.1 * diff + 300_000, (case, sent, diff)
    assert stored <= 1.1 * diff + 300_000, (case, stored, diff)
    assert sent >= diff  # (random bytes: nothing to gain by compression)
    assert fs.cat(f"{repo}@main/step-2/__0_0.distcp") == shard(step_next)
