"""A committed 100,000-file tree through a mount: every byte, every attribute, 8 readers at once."""

from __future__ import annotations

import hashlib
import mmap
import os
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from fabric.client.transfer import import_directory
from fabric.engine.engine import Engine
from tests.fuse_helpers import ls_lines, mounted, needs_fuse
from tests.hubserver import start_hub

pytestmark = [needs_fuse, pytest.mark.slow]

FILES = 100_000
PER_DIR = 1_000


def _generate(root: str) -> dict[str, str]:
    """100,000 files of 100 B..2 KiB in directories of 1,000, mtimes spread out; returns digests."""
    rnd = random.Random(7)
    words = [rnd.randbytes(8).hex() for _ in range(512)]
    digests = {}
    t = 1_600_000_000_000_000_000
    for i in range(FILES):
        d = f"d{i // PER_DIR:03d}"
        if i % PER_DIR == 0:
            os.makedirs(os.path.join(root, d))
        rel = f"{d}/f{i:06d}.txt"
        n = rnd.randint(100, 2048)
        data = (" ".join(rnd.choices(words, k=n // 16 + 1)).encode() + b"\n")[:n]
        path = os.path.join(root, rel)
        with open(path, "wb") as f:
            f.write(data)
        t += 1_000_003
        os.utime(path, ns=(t, t))
        if i % 97 == 0:
            os.chmod(path, 0o600)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_100k_file_tree(tmp_path):
    src = str(tmp_path / "src")
    want = _generate(src)
    data = tmp_path / "hub"
    # Import in-process (the HTTP path is exercised by the other tests), then serve it.
    engine = Engine.open(str(data))
    engine.create_repo("tree")
    commit = import_directory(engine, src, "tree", "main", "100k files").commit.id
    engine.close()
    with start_hub(data) as hub, mounted(hub.url, hub.token, f"tree@{commit}", tmp_path / "mnt") as mnt:
        # 8 parallel readers first, on a cold mount, each over the same sample in its own order.
        sample = random.Random(1).sample(sorted(want), 4000)

        def reader(seed: int) -> dict[str, str]:
            order = list(sample)
            random.Random(seed).shuffle(order)
            return {rel: _digest(os.path.join(mnt, rel)) for rel in order}

        with ThreadPoolExecutor(8) as pool:
            for got in pool.map(reader, range(8)):
                assert got == {rel: want[rel] for rel in sample}
        # find and ls -lR
        found = subprocess.run(["find", mnt, "-type", "f"], capture_output=True, text=True, check=True).stdout.split("\n")
        assert sorted(os.path.relpath(p, mnt) for p in found if p) == sorted(want)
        assert ls_lines(mnt) == ls_lines(src)
        # stat fields of every file
        for rel in want:
            a, b = os.stat(os.path.join(src, rel)), os.stat(os.path.join(mnt, rel))
            assert (b.st_size, b.st_mode, b.st_mtime_ns) == (a.st_size, a.st_mode, a.st_mtime_ns), rel
        # every byte of every file
        bad = [rel for rel in sorted(want) if _digest(os.path.join(mnt, rel)) != want[rel]]
        assert not bad, bad[:10]
        # mmap reads
        for rel in sample[:50]:
            with open(os.path.join(mnt, rel), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                assert hashlib.sha256(m[:]).hexdigest() == want[rel]
