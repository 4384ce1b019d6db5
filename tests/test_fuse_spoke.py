"""Mounts through a spoke (the normal deployment): reads, writes, and a spoke restart mid-read."""

from __future__ import annotations

import hashlib
import os
import threading
import time

from fabric.transfer import import_directory
from tests.fuse_helpers import fabric, mount_log, mounted, needs_fuse
from tests.hubserver import unique_name

pytestmark = needs_fuse


def test_mount_through_a_spoke(hub, cold_spoke_of_hub, tmp_path):
    spoke = cold_spoke_of_hub
    plane = hub.plane()
    repo = unique_name("spk")
    plane.create_repo(repo)
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    data = os.urandom(48 * 1024 * 1024)
    (src / "d" / "big.bin").write_bytes(data)
    (src / "small.txt").write_text("small\n")
    commit = import_directory(plane, str(src), repo, "main", "data").commit.id
    opts = ("--memory-cache", "16M", "--readahead", "4M", "--server-timeout", "60")
    with mounted(spoke.url, hub.token, f"{repo}@{commit}", tmp_path / "ro", *opts) as mnt:
        assert open(f"{mnt}/small.txt").read() == "small\n"

        def restart() -> None:
            time.sleep(0.8)
            spoke.restart(kill=True)

        t = threading.Thread(target=restart)
        t.start()
        h = hashlib.sha256()
        t0 = time.monotonic()
        with open(f"{mnt}/d/big.bin", "rb", buffering=0) as f:
            while piece := f.read(1 << 20):
                h.update(piece)
                if time.monotonic() - t0 < 3:
                    time.sleep(0.03)
        t.join()
        assert h.hexdigest() == hashlib.sha256(data).hexdigest()
        assert "server unreachable" in mount_log(str(tmp_path / "ro"))
    with mounted(spoke.url, hub.token, f"{repo}@main", tmp_path / "rw", "--rw") as mnt:
        with open(f"{mnt}/d/new.bin", "wb") as f:
            f.write(b"written through the spoke")
            f.flush()
            os.fsync(f.fileno())
        os.rename(f"{mnt}/small.txt", f"{mnt}/d/small.txt")
        assert sorted(os.listdir(f"{mnt}/d")) == ["big.bin", "new.bin", "small.txt"]
    fabric("--server", spoke.url, "commit", f"{repo}@main", "-m", "through the spoke", token=hub.token)
    assert plane.read(repo, "main", "d/new.bin") == b"written through the spoke"
    assert plane.read(repo, "main", "d/small.txt") == b"small\n"
