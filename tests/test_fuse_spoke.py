"""Mounts through a spoke (the normal deployment): reads, writes, a spoke restart mid-read,
and fsync durability while the hub is away."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import threading
import time

import pytest

from fabric.client.transfer import import_directory
from tests.fuse_helpers import fabric, file_digest, mount_log, mounted, needs_fuse, slow_digest
from tests.hubserver import unique_name
from tests.spokeserver import start_restartable_hub, start_spoke, wait_for

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
        digest = slow_digest(f"{mnt}/d/big.bin", slow_for=3.0)
        t.join()
        assert digest == hashlib.sha256(data).hexdigest()
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


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fsync_is_durable_at_the_level_the_mount_asked_while_the_hub_is_away(tmp_path):
    """--durability local: fsync returns once the spoke holds the data, hub or no hub, and the
    data lands at the hub once it is back. --durability hub: fsync fails with EIO after
    --server-timeout while the hub is away, and the mount works again once it is back."""
    with (
        start_restartable_hub(tmp_path / "hub") as hub,
        start_spoke(hub.url, tmp_path / "cache", "512MiB", token=hub.token, lease=1.0) as spoke,
    ):
        plane = hub.plane()
        repo = unique_name("dur")
        plane.create_repo(repo)
        plane.put_object(repo, "main", "a.txt", io.BytesIO(b"from before the outage\n"))
        base = plane.commit(repo, "main", "base").id
        shard = os.urandom(6 * 1024 * 1024)
        with (
            mounted(spoke.url, hub.token, f"{repo}@main", tmp_path / "local", "--rw", "--server-timeout", "60") as local,
            mounted(spoke.url, hub.token, f"{repo}@main", tmp_path / "hubdur", "--rw", "--durability", "hub", "--server-timeout", "3") as hubdur,
        ):
            assert open(f"{local}/a.txt").read() == "from before the outage\n"
            assert os.listdir(hubdur) == ["a.txt"]
            hub.kill()
            time.sleep(1.5)

            os.mkdir(f"{local}/ckpt")
            _write_synced(f"{local}/ckpt/shard0.bin", shard)
            os.rename(f"{local}/a.txt", f"{local}/ckpt/a.txt")
            assert spoke.stats()["writeback_pending"] >= 3
            spoke.restart(kill=True)  # fsynced data outlives a kill -9 of the spoke, hub still away
            with open(f"{local}/ckpt/shard0.bin", "rb") as f:
                assert f.read() == shard
            assert sorted(os.listdir(f"{local}/ckpt")) == ["a.txt", "shard0.bin"]
            # New mounts while the hub is away: a pinned commit, and the branch as this spoke sees it.
            with mounted(spoke.url, hub.token, f"{repo}@{base}", tmp_path / "pinned") as pinned:
                assert os.listdir(pinned) == ["a.txt"]
                assert open(f"{pinned}/a.txt").read() == "from before the outage\n"
            with mounted(spoke.url, hub.token, f"{repo}@main", tmp_path / "branch") as branch:
                assert sorted(os.listdir(branch)) == ["ckpt"]
                assert file_digest(f"{branch}/ckpt/shard0.bin") == hashlib.sha256(shard).hexdigest()

            with pytest.raises(OSError) as failed:
                _write_synced(f"{hubdur}/must-reach-hub.bin", b"x" * 1000)
            assert failed.value.errno == errno.EIO
            assert "hub" in mount_log(str(tmp_path / "hubdur"))

            hub.start()
            wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=60, interval=0.2)
            _write_synced(f"{hubdur}/after.bin", b"the hub is back")
        fabric("--server", spoke.url, "commit", f"{repo}@main", "-m", "written while the hub was away", token=hub.token)
        assert plane.read(repo, "main", "ckpt/shard0.bin") == shard
        assert plane.read(repo, "main", "ckpt/a.txt") == b"from before the outage\n"
        assert plane.read(repo, "main", "after.bin") == b"the hub is back"
        paths = [p for p, _ in plane.walk(repo, "main")]
        assert "a.txt" not in paths and "ckpt/shard0.bin" in paths
