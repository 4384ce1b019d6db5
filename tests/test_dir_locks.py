"""One process per directory: a second spoke, hub, mount or DiskCache on a directory in use is
refused with a message naming the directory and the holder's pid, and touches nothing of the first's."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from fabric.cache.disk import DiskCache
from fabric.util.dirlock import DirectoryInUse, DirLock
from fabric.util.net import free_port
from tests.fuse_helpers import fabric, force_unmount, mounted, needs_fuse
from tests.hubserver import ROOT, hub_env, start_hub, unique_name
from tests.spokeserver import start_spoke

#: A second process refused at start-up exits at once; one that is not refused serves until killed.
REFUSED_WITHIN = 60


def run_second(argv: list[str]) -> subprocess.CompletedProcess:
    """Run a second user of a directory; it must exit (refused) rather than serve."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=hub_env(), cwd=ROOT, timeout=REFUSED_WITHIN)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{argv[3:5]} on a directory in use was not refused: it kept running") from exc


def read(plane, repo: str) -> bytes:
    return b"".join(plane.read_stream(repo, "main", "a.bin"))


def files_under(root: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names}


def test_a_second_disk_cache_in_another_process_is_refused(tmp_path) -> None:
    root = str(tmp_path / "cache")
    cache = DiskCache(root, 1 << 20)
    cache.put(b"\x01" * 32, b"kept")
    code = textwrap.dedent(
        f"""
        from fabric.cache.disk import DiskCache
        DiskCache({root!r}, 1 << 20)
        """
    )
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert second.returncode != 0
    assert "DirectoryInUse" in second.stderr and root in second.stderr
    if os.path.exists("/proc/locks"):
        assert f"process {os.getpid()}" in second.stderr
    assert cache.get(b"\x01" * 32) == b"kept"

    cache.close()  # released: another process may take the directory now
    third = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert third.returncode == 0, third.stderr


def test_the_lock_is_shared_within_a_process_and_released_by_its_last_holder(tmp_path) -> None:
    d = str(tmp_path / "d")
    first, second = DirLock(d), DirLock(d)
    probe = [sys.executable, "-c", f"from fabric.util.dirlock import DirLock; DirLock({d!r})"]
    first.release()
    first.release()  # idempotent: does not release the second holder's reference
    assert subprocess.run(probe, capture_output=True, cwd=ROOT, timeout=60).returncode != 0
    second.release()
    assert subprocess.run(probe, capture_output=True, cwd=ROOT, timeout=60).returncode == 0
    assert os.listdir(d) == []  # no lock file joins the directory's contents


def test_the_error_names_directory_and_role(tmp_path) -> None:
    d = str(tmp_path / "d")
    code = f"from fabric.util.dirlock import DirLock; import sys; DirLock({d!r}); sys.stdout.write('held\\n'); sys.stdout.flush(); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(DirectoryInUse) as info:
            DirLock(d, "cache directory")
        assert info.value.message.startswith(f"cache directory {d} is in use by ")
        if os.path.exists("/proc/locks"):
            assert info.value.details["pid"] == holder.pid
    finally:
        holder.stdin.close()
        holder.wait(30)
    DirLock(d).release()  # the holder has exited: the kernel dropped its lock


def test_a_second_spoke_on_the_same_cache_is_refused_and_leaves_the_first_alone(fresh_hub, tmp_path) -> None:
    repo = unique_name("locks")
    fresh_hub.plane().create_repo(repo)
    cache = str(tmp_path / "spoke-cache")
    with start_spoke(fresh_hub.url, cache, "64MiB", token=fresh_hub.token) as spoke:
        plane = spoke.plane()
        data = os.urandom(300_000)
        plane.put_object(repo, "main", "a.bin", io.BytesIO(data))
        plane.commit(repo, "main", "one")
        assert read(plane, repo) == data
        # A write of the first spoke in flight: the second must not clean it up.
        inflight = os.path.join(cache, "chunks", "ab", ".tmp-1-2-abababab")
        os.makedirs(os.path.dirname(inflight), exist_ok=True)
        with open(inflight, "wb") as f:
            f.write(b"half a frame")
        before = files_under(cache)

        second = run_second(
            [sys.executable, "-m", "fabric.cli.main", "spoke", "--hub", fresh_hub.url, "--cache", cache,
             "--cache-size", "64MiB", "--listen", f"127.0.0.1:{free_port()}", "--token", fresh_hub.token]
        )  # fmt: skip

        assert second.returncode != 0
        assert f"spoke cache directory {cache} is in use by process {spoke.proc.pid}" in second.stderr or (
            not os.path.exists("/proc/locks") and f"{cache} is in use" in second.stderr
        ), second.stderr
        assert os.path.exists(inflight)
        assert before <= files_under(cache)
        assert httpx.get(spoke.url + "/healthz", timeout=10).status_code == 200
        assert read(plane, repo) == data
        os.unlink(inflight)
    # Once the first has stopped, the directory is free again.
    with start_spoke(fresh_hub.url, cache, "64MiB", token=fresh_hub.token) as again:
        assert read(again.plane(), repo) == data


def test_a_second_hub_on_the_same_data_is_refused(tmp_path) -> None:
    data = str(tmp_path / "hub")
    with start_hub(data) as hub:
        second = run_second(
            [sys.executable, "-m", "fabric.cli.main", "hub", "--data", data, "--listen", f"127.0.0.1:{free_port()}"]
        )
        assert second.returncode != 0
        assert f"hub data directory {data} is in use" in second.stderr, second.stderr
        if os.path.exists("/proc/locks"):
            assert f"process {hub.proc.pid}" in second.stderr
        assert httpx.get(hub.url + "/healthz", timeout=10).status_code == 200
        hub.plane().create_repo(unique_name("still"))


@needs_fuse
def test_a_second_mount_on_the_same_cache_dir_is_refused(fresh_hub, tmp_path) -> None:
    repo = unique_name("mnt")
    plane = fresh_hub.plane()
    plane.create_repo(repo)
    plane.put_object(repo, "main", "a.bin", io.BytesIO(b"abc" * 1000))
    plane.commit(repo, "main", "one")
    cache = str(tmp_path / "mount-cache")
    with mounted(fresh_hub.url, fresh_hub.token, f"{repo}@main", tmp_path / "m1", "--cache-dir", cache) as mp:
        with open(os.path.join(mp, "a.bin"), "rb") as f:
            assert f.read() == b"abc" * 1000
        before = files_under(cache)
        os.makedirs(tmp_path / "m2")
        started = time.monotonic()
        second = fabric("mount", fresh_hub.url, f"{repo}@main", str(tmp_path / "m2"), "--cache-dir", cache,
                        "--log-file", str(tmp_path / "m2.log"), token=fresh_hub.token, check=False, timeout=120)  # fmt: skip
        try:
            assert second.returncode != 0
            # The command itself says why, at once (not "not ready within 120s").
            assert f"cache directory {cache} is in use" in second.stderr, second.stderr
            assert time.monotonic() - started < 30
        finally:
            force_unmount(str(tmp_path / "m2"))
        assert files_under(cache) == before
        with open(os.path.join(mp, "a.bin"), "rb") as f:
            assert f.read() == b"abc" * 1000
