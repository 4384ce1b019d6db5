"""FUSE mounts (issue 5), on real mounts of a real hub: read-only commits, tags and branches.

The write side (``--rw``) is in test_fuse_rw.py, the 100,000-file tree in
test_fuse_tree.py, server restarts in test_fuse_restart.py.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from fabric.cache.packs import HEADER, INDEX_RECORD, PACKS, PackCache
from fabric.client.transfer import import_directory
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import (
    diff_snapshots,
    fabric,
    file_digest,
    ls_lines,
    mounted,
    needs_fuse,
    snapshot,
)
from tests.hubserver import unique_name

pytestmark = needs_fuse


def make_source(root: str, seed: int = 1) -> None:
    """A small tree with the shapes a mount must get right."""
    rnd = random.Random(seed)
    os.makedirs(f"{root}/a/b/c")
    os.makedirs(f"{root}/empty/inner")
    os.makedirs(f"{root}/spaced dir/ünïcødé")
    files = {
        "a/zero.bin": b"",
        "a/small.txt": b"hello\n",
        "a/b/text.log": b"".join(f"line {i} {rnd.random()}\n".encode() for i in range(20000)),
        "a/b/c/random.bin": rnd.randbytes(3 * 1024 * 1024 + 17),  # > 64 chunks: a chunk-list object
        "a/b/c/mid.bin": rnd.randbytes(300_000),
        "spaced dir/ünïcødé/name with spaces.txt": b"spaces\n",
        "top.bin": rnd.randbytes(6 * 1024 * 1024),
    }
    for i in range(40):
        files[f"a/many/f{i:03d}.dat"] = rnd.randbytes(rnd.randint(0, 5000))
    for rel, data in files.items():
        os.makedirs(os.path.dirname(f"{root}/{rel}"), exist_ok=True)
        with open(f"{root}/{rel}", "wb") as f:
            f.write(data)
    os.chmod(f"{root}/a/small.txt", 0o600)
    os.chmod(f"{root}/top.bin", 0o755)
    os.chmod(f"{root}/empty/inner", 0o750)  # an empty directory: import records it (with its mode)
    os.chmod(f"{root}/a/b", 0o700)  # so is a directory with files whose mode is not 755
    os.symlink("../top.bin", f"{root}/a/link-to-top")
    os.symlink("dangling/target", f"{root}/a/dangling")
    t = 1_600_000_000_123_456_789
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), ns=(t, t), follow_symlinks=False)
            t += 1_000_000_007


@pytest.fixture(scope="module")
def committed(hub, tmp_path_factory):
    """A repository with the source tree committed: (hub, repo, commit id, source dir)."""
    src = str(tmp_path_factory.mktemp("src") / "tree")
    make_source(src)
    repo = unique_name("fuse")
    plane = hub.plane()
    plane.create_repo(repo)
    result = import_directory(plane, src, repo, "main", "source tree")
    plane.create_tag(repo, "v1", result.commit.id)
    return hub, repo, result.commit.id, src


def test_commit_mount_is_the_commit(committed, tmp_path):
    hub, repo, commit, src = committed
    with mounted(hub.url, hub.token, f"{repo}@{commit}", tmp_path / "mnt") as mnt:
        # Content, modes, sizes and exact mtimes of every file; symlinks; directories.
        problems = diff_snapshots(snapshot(src), snapshot(mnt))
        assert not problems, problems
        # find and ls -lR see the same tree.
        find = lambda root: sorted(
            line.replace(root, "ROOT")
            for line in subprocess.run(["find", root, "-printf", "%p %y %s %m\n"], capture_output=True, text=True, check=True).stdout.splitlines()
            if " d " not in line  # directory sizes differ by file system
        )
        assert find(mnt) == find(src)
        assert ls_lines(mnt) == ls_lines(src)
        # stat fields
        for rel in ("a/b/c/random.bin", "a/small.txt", "top.bin", "a/zero.bin"):
            a, b = os.stat(f"{src}/{rel}"), os.stat(f"{mnt}/{rel}")
            assert (b.st_size, b.st_mode, b.st_mtime_ns) == (a.st_size, a.st_mode, a.st_mtime_ns)
        assert os.readlink(f"{mnt}/a/link-to-top") == "../top.bin"
        assert file_digest(f"{mnt}/a/link-to-top") == file_digest(f"{src}/top.bin")
        assert os.path.isdir(f"{mnt}/empty/inner") and os.listdir(f"{mnt}/empty/inner") == []
        # mmap reads, random offsets
        with open(f"{mnt}/a/b/c/random.bin", "rb") as f, open(f"{src}/a/b/c/random.bin", "rb") as g:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            want = g.read()
            assert m[:] == want
            rnd = random.Random(5)
            for _ in range(200):
                lo = rnd.randrange(len(want))
                hi = min(len(want), lo + rnd.randrange(1, 300_000))
                assert m[lo:hi] == want[lo:hi]
            m.close()
        # pread at odd offsets and sizes
        fd = os.open(f"{mnt}/top.bin", os.O_RDONLY)
        try:
            with open(f"{src}/top.bin", "rb") as g:
                want = g.read()
            for off, n in [(0, 1), (1, 4095), (65535, 3), (6 * 1024 * 1024 - 5, 100), (6 * 1024 * 1024, 10), (123457, 1 << 20)]:
                assert os.pread(fd, n, off) == want[off : off + n]
        finally:
            os.close(fd)
        # Errors of a read-only mount.
        with pytest.raises(OSError) as e:
            open(f"{mnt}/new.txt", "w")
        assert e.value.errno == errno.EROFS
        with pytest.raises(OSError) as e:
            os.mkdir(f"{mnt}/d")
        assert e.value.errno == errno.EROFS
        with pytest.raises(FileNotFoundError):
            os.stat(f"{mnt}/nope")


def test_parallel_readers_agree(committed, tmp_path):
    hub, repo, commit, src = committed
    files = sorted(
        os.path.relpath(os.path.join(d, n), src)
        for d, _, names in os.walk(src)
        for n in names
        if not os.path.islink(os.path.join(d, n))
    )
    want = {f: file_digest(f"{src}/{f}") for f in files}
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "mnt") as mnt:

        def reader(seed: int) -> dict[str, str]:
            order = list(files)
            random.Random(seed).shuffle(order)
            out = {}
            for f in order:
                h = hashlib.sha256()
                with open(f"{mnt}/{f}", "rb", buffering=0) as fh:
                    while piece := fh.read(seed * 7919 + 4096):  # every reader its own read size
                        h.update(piece)
                out[f] = h.hexdigest()
            return out

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(reader, range(8)))
    for r in results:
        assert r == want


def test_second_epoch_is_served_by_the_kernel(committed, tmp_path):
    from fuse.mount import read_stats

    hub, repo, commit, src = committed
    size = os.path.getsize(f"{src}/top.bin")
    with mounted(hub.url, hub.token, f"{repo}@{commit}", tmp_path / "mnt") as mnt:
        assert file_digest(f"{mnt}/top.bin") == file_digest(f"{src}/top.bin")
        time.sleep(1.5)
        first = read_stats(mnt)
        assert first["fetched_bytes"] >= size and first["read_bytes"] >= size
        for _ in range(3):
            assert file_digest(f"{mnt}/top.bin") == file_digest(f"{src}/top.bin")
        time.sleep(1.5)
        after = read_stats(mnt)
        # The kernel serves the later reads from its page cache: (almost) nothing reaches the
        # mount (a page reclaimed here and there may be asked again), nothing the network.
        assert after["read_bytes"] - first["read_bytes"] < 0.05 * 3 * size, "later reads reached the mount: no page cache"
        assert after["fetched_bytes"] == first["fetched_bytes"]


def test_branch_mount_follows_head(hub, tmp_path):
    plane = hub.plane()
    repo = unique_name("fuse")
    plane.create_repo(repo)
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.txt").write_bytes(b"one\n")
    import_directory(plane, str(src), repo, "main", "one")
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--attr-timeout", "0.2") as mnt:
        assert open(f"{mnt}/d/a.txt", "rb").read() == b"one\n"
        held = open(f"{mnt}/d/a.txt", "rb")
        (src / "d" / "a.txt").write_bytes(b"two, longer\n")
        (src / "d" / "b.txt").write_bytes(b"new file\n")
        import_directory(plane, str(src), repo, "main", "two")
        # Close-to-open: a new open sees the commit; a listing sees the new file.
        assert open(f"{mnt}/d/a.txt", "rb").read() == b"two, longer\n"
        assert sorted(os.listdir(f"{mnt}/d")) == ["a.txt", "b.txt"]
        # The handle opened before keeps reading the version it opened (snapshot isolation).
        assert held.read() == b"one\n"
        held.close()
        # Uncommitted (staged) changes of the branch are visible too.
        plane.put_object(repo, "main", "d/staged.txt", __import__("io").BytesIO(b"staged\n"))
        assert open(f"{mnt}/d/staged.txt", "rb").read() == b"staged\n"
        time.sleep(0.3)
        assert os.stat(f"{mnt}/d/a.txt").st_size == len(b"two, longer\n")
        with pytest.raises(OSError) as e:
            open(f"{mnt}/d/a.txt", "w")
        assert e.value.errno == errno.EROFS


def test_a_branch_reset_to_a_version_the_kernel_holds_pages_of_reads_whole(hub, tmp_path):
    # The kernel may hold the size of one version (from a listing) and the pages of another
    # (from an open). An open of the version whose pages it holds must still correct its size:
    # found by the chaos soak as a read of bytes never written (a version cut to another's size).
    plane, repo = hub.plane(), hub.new_repo("fuse")
    src = tmp_path / "src"
    src.mkdir()
    long, short = bytes(range(256)) * 12, b"short\n"
    (src / "f.bin").write_bytes(long)
    first = import_directory(plane, str(src), repo, "main", "long").commit.id
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--attr-timeout", "30") as mnt:
        assert open(f"{mnt}/f.bin", "rb").read() == long  # the kernel keeps its pages
        (src / "f.bin").write_bytes(short)
        import_directory(plane, str(src), repo, "main", "short")
        assert os.listdir(mnt) == ["f.bin"]  # a listing: the kernel is told the short size
        assert os.stat(f"{mnt}/f.bin").st_size == len(short)
        plane.reset_branch(repo, "main", first)  # back to the version whose pages it holds
        with open(f"{mnt}/f.bin", "rb") as f:
            assert f.read() == long


def test_mount_command_errors_and_help(hub, tmp_path):
    plane = hub.plane()
    repo = unique_name("fuse")
    plane.create_repo(repo)
    c = plane.resolve_commit(repo, "main")
    mp = tmp_path / "mnt"
    mp.mkdir()
    r = fabric("mount", hub.url, f"{repo}@{c}", str(mp), "--rw", token=hub.token, check=False)
    assert r.returncode != 0 and "--rw needs a branch" in r.stderr
    r = fabric("mount", hub.url, f"{repo}@nope", str(mp), token=hub.token, check=False)
    assert r.returncode != 0 and "nope" in r.stderr
    r = fabric("mount", hub.url, f"{repo}@main", str(tmp_path / "missing"), token=hub.token, check=False)
    assert r.returncode != 0 and "not a directory" in r.stderr
    r = fabric("umount", str(mp), check=False)
    assert r.returncode != 0 and "not a mount point" in r.stderr
    assert not os.path.ismount(mp)
    help_text = fabric("mount", "--help").stdout
    for word in ("--rw", "--durability", "--server-timeout", "--commit-interval", "--allow-other", "--foreground", "EPERM", "EROFS"):
        assert word in help_text


def test_foreground_mount_and_umount(hub, tmp_path):
    from tests.fuse_helpers import FABRIC, env, force_unmount

    plane = hub.plane()
    repo = unique_name("fuse")
    plane.create_repo(repo)
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_text("x")
    import_directory(plane, str(src), repo, "main", "x")
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.Popen(
        [*FABRIC, "mount", hub.url, f"{repo}@main", str(mp), "--foreground"],
        env=env(hub.token),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mp) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.1)
        assert (mp / "x").read_text() == "x"
        fabric("umount", str(mp))
        assert proc.wait(60) == 0
        out = proc.stdout.read().decode()
        assert "operation latencies" in out and "getattr" in out  # the per-operation statistics
    finally:
        force_unmount(str(mp))
        if proc.poll() is None:
            proc.kill()


def test_cache_dir_serves_a_remount_and_drops_a_damaged_chunk(committed, tmp_path):
    """--cache-dir keeps chunks across mounts: a second mount reads them from disk, not the
    server; a cached chunk damaged on disk is not served but fetched again, and cached again."""
    hub, repo, commit, src = committed
    cache = tmp_path / "chunk-cache"
    opts = ("--cache-dir", str(cache), "--cache-size", "256M")
    want = snapshot(src)
    with WanProxy("127.0.0.1", int(hub.url.rsplit(":", 1)[1])) as wan:
        with mounted(wan.url_for(), hub.token, f"{repo}@{commit}", tmp_path / "m1", *opts) as mnt:
            assert not diff_snapshots(want, snapshot(mnt))
        cold = wan.stats().bytes_down
        packs = sorted((cache / PACKS).glob("*.pack"))
        records = sum((p.with_suffix(".idx")).stat().st_size for p in packs) // INDEX_RECORD.size  # sealed at unmount
        chunk_bytes = sum(p.stat().st_size for p in packs) - records * HEADER.size
        assert chunk_bytes == sum(v[2] for v in want.values() if v[0] == "file")  # every chunk
        _, length, damaged, _ = HEADER.unpack(packs[0].read_bytes()[: HEADER.size])  # the first record's chunk
        with open(packs[0], "r+b") as f:
            f.seek(HEADER.size + length // 2)
            byte = f.read(1)
            f.seek(HEADER.size + length // 2)
            f.write(bytes([byte[0] ^ 0xFF]))

        with mounted(wan.url_for(), hub.token, f"{repo}@{commit}", tmp_path / "m2", *opts) as mnt:
            assert not diff_snapshots(want, snapshot(mnt))
        warm = wan.stats().bytes_down - cold
    assert length <= warm < cold / 4, (warm, cold)
    again = PackCache(str(cache), 256 << 20)
    assert again.read(damaged) is not None  # fetched again, and cached again intact
