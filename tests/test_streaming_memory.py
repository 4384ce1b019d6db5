"""Uploads and downloads stream through the hub: a 2 GiB object never sits in its memory.

The body is generated on the fly (a seeded PRNG) and hashed on the fly on the
way back; the hub's resident set size is sampled in a background thread
during each transfer and may grow by less than 200 MiB.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.hubserver import start_hub

MiB = 1024 * 1024
SIZE = 2 * 1024 * MiB
BLOCK = MiB
MAX_GROWTH = 200 * MiB
API = "/api/v1"


class RssSampler:
    """Samples a process's RSS every ``interval`` seconds until stopped; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = self.start = self.proc.memory_info().rss
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


def generated_body(size: int, seed: int, md5) -> Iterator[bytes]:
    rng = random.Random(seed)
    left = size
    while left:
        block = rng.randbytes(min(BLOCK, left))
        md5.update(block)
        left -= len(block)
        yield block


@pytest.mark.slow
def test_two_gib_upload_and_download_stream_through_the_hub(tmp_path):
    with start_hub(tmp_path / "hub") as hub, hub.client(timeout=900) as c:
        c.post(f"{API}/repos", json={"name": "big"}).raise_for_status()
        # Warm up: the first requests import and allocate what every request needs.
        for i in range(3):
            c.put(f"{API}/repos/big/branches/main/objects", params={"path": f"warm{i}"}, content=random.randbytes(4 * MiB)).raise_for_status()
            c.get(f"{API}/repos/big/refs/main/objects", params={"path": f"warm{i}"}).raise_for_status()
        time.sleep(0.5)

        # Upload: a chunked request body, never materialized on either side.
        sent_md5 = hashlib.md5()
        t0 = time.monotonic()
        with RssSampler(hub.proc.pid) as up:
            r = c.put(
                f"{API}/repos/big/branches/main/objects",
                params={"path": "blob.bin"},
                content=generated_body(SIZE, 1234, sent_md5),
                headers={"Content-Type": "application/octet-stream"},
            )
        up_seconds = time.monotonic() - t0
        assert r.status_code == 201, r.text
        info = r.json()
        assert info["size"] == SIZE
        assert info["etag"] == sent_md5.hexdigest()
        c.post(f"{API}/repos/big/branches/main/commits", json={"message": "2 GiB"}).raise_for_status()
        time.sleep(0.5)

        # Download: hashed as it arrives.
        got_md5 = hashlib.md5()
        received = 0
        t0 = time.monotonic()
        with RssSampler(hub.proc.pid) as down, c.stream(
            "GET", f"{API}/repos/big/refs/main/objects", params={"path": "blob.bin"}
        ) as resp:
            assert resp.status_code == 200
            etag = resp.headers["etag"].strip('"')
            assert int(resp.headers["content-length"]) == SIZE
            for piece in resp.iter_raw(BLOCK):
                got_md5.update(piece)
                received += len(piece)
        down_seconds = time.monotonic() - t0

    assert received == SIZE
    assert got_md5.hexdigest() == etag == sent_md5.hexdigest()
    print(
        f"\n2 GiB through the hub: upload {up_seconds:.1f}s ({SIZE / MiB / up_seconds:.0f} MiB/s), "
        f"RSS {up.start / MiB:.0f} -> peak {up.peak / MiB:.0f} MiB (+{up.growth / MiB:.0f} MiB, {up.samples} samples); "
        f"download {down_seconds:.1f}s ({SIZE / MiB / down_seconds:.0f} MiB/s), "
        f"RSS {down.start / MiB:.0f} -> peak {down.peak / MiB:.0f} MiB (+{down.growth / MiB:.0f} MiB, {down.samples} samples)"
    )
    assert up.samples > 20 and down.samples > 20
    assert up.growth < MAX_GROWTH, f"upload grew the hub's RSS by {up.growth / MiB:.0f} MiB"
    assert down.growth < MAX_GROWTH, f"download grew the hub's RSS by {down.growth / MiB:.0f} MiB"
    # Against the baseline before any transfer too (memory freed after the upload may be reused unseen).
    assert down.peak - up.start < MAX_GROWTH, f"the hub's RSS peaked {(down.peak - up.start) / MiB:.0f} MiB above its idle size"
