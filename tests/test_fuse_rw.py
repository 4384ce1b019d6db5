"""Writable branch mounts (``fabric mount --rw``): POSIX operations, tools, commits, errors.

Each scenario is run on the mount and on a local directory side by side;
the two must end up identical, and so must an export of the commit made
from the mount's staged changes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time

import pytest

from tests.ci_requirements import missing
from tests.fuse_helpers import (
    diff_snapshots,
    fabric,
    mount_log,
    mounted,
    needs_fuse,
    snapshot,
)
from tests.hubserver import unique_name

pytestmark = needs_fuse

NOBODY = 65534


def new_repo(hub) -> str:
    repo = unique_name("rw")
    hub.plane().create_repo(repo)
    return repo


def commit_and_export(hub, repo: str, dest: str, message: str = "from the mount") -> str:
    out = fabric("--server", hub.url, "--json", "commit", f"{repo}@main", "-m", message, token=hub.token).stdout
    import json

    cid = json.loads(out)["id"]
    fabric("--server", hub.url, "export", f"{repo}@{cid}", dest, token=hub.token)
    return cid


def scenario(root: str) -> None:
    """The same sequence of changes, applied to any directory."""
    j = os.path.join
    with open(j(root, "a.txt"), "w") as f:  # create + write
        f.write("hello\n")
    with open(j(root, "a.txt"), "a") as f:  # append
        f.write("world\n")
    with open(j(root, "b.bin"), "wb") as f:  # a bigger file, written in pieces, fsynced
        rnd = random.Random(3)
        f.writelines(rnd.randbytes(100_000) for _ in range(40))
        f.flush()
        os.fsync(f.fileno())
    with open(j(root, "b.bin"), "r+b") as f:  # overwrite in the middle
        f.seek(1_000_000)
        f.write(b"X" * 5000)
    os.truncate(j(root, "b.bin"), 2_500_000)  # shrink
    with open(j(root, "grow.bin"), "wb") as f:
        f.write(b"abc")
        f.truncate(70_000)  # extend with zeros through the handle
    os.makedirs(j(root, "d1/d2/d3"))
    with open(j(root, "d1/d2/d3/deep.txt"), "w") as f:
        f.write("deep\n")
    with open(j(root, "d1/keep.txt"), "w") as f:
        f.write("keep\n")
    os.rename(j(root, "d1/d2"), j(root, "d1/moved"))  # directory rename with contents
    os.mkdir(j(root, "gone"))
    os.rmdir(j(root, "gone"))
    os.mkdir(j(root, "empty-target"))
    os.mkdir(j(root, "src-dir"))
    with open(j(root, "src-dir/f"), "w") as f:
        f.write("f\n")
    os.rename(j(root, "src-dir"), j(root, "empty-target"))  # replaces an empty directory
    with open(j(root, "old.txt"), "w") as f:
        f.write("old\n")
    with open(j(root, "new.txt"), "w") as f:
        f.write("new contents\n")
    os.rename(j(root, "new.txt"), j(root, "old.txt"))  # atomic replace of an existing file
    with open(j(root, "doomed.txt"), "w") as f:
        f.write("x")
    os.unlink(j(root, "doomed.txt"))
    os.symlink("a.txt", j(root, "link"))
    os.symlink("d1/moved/d3", j(root, "dirlink"))
    os.chmod(j(root, "a.txt"), 0o640)
    os.chmod(j(root, "d1"), 0o700)
    os.utime(j(root, "old.txt"), ns=(1_500_000_000_000_000_001, 1_500_000_000_123_456_789))
    os.mkdir(j(root, "lonely"))
    with open(j(root, "lonely/only"), "w") as f:
        f.write("1")
    os.unlink(j(root, "lonely/only"))  # the directory must stay, empty
    fd = os.open(j(root, "trunc.txt"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    os.write(fd, b"0123456789")
    os.close(fd)
    fd = os.open(j(root, "trunc.txt"), os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"ab")
    os.close(fd)


def test_rw_operations_match_a_local_directory(hub, tmp_path):
    repo = new_repo(hub)
    local = tmp_path / "local"
    local.mkdir()
    scenario(str(local))
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        scenario(mnt)
        # read-your-writes, inside the mount (times differ: the two ran at different moments)
        problems = diff_snapshots(snapshot(str(local), mtimes=False), snapshot(mnt, mtimes=False))
        assert not problems, problems
        assert os.stat(f"{mnt}/old.txt").st_mtime_ns == 1_500_000_000_123_456_789
        assert open(f"{mnt}/link").read() == "hello\nworld\n"
        assert os.listdir(f"{mnt}/lonely") == []
        # staged (not committed) on the branch
        plane = hub.plane()
        staged = {c.path for c in plane.uncommitted(repo, "main")}
        assert {"a.txt", "b.bin", "old.txt", "d1/moved/d3/deep.txt"} <= staged
        assert "doomed.txt" not in staged and "new.txt" not in staged
        assert plane.read(repo, "main", "a.txt") == b"hello\nworld\n"
        assert plane.resolve_commit(repo, "main") == plane.log(repo, "main")[0].id
    export = tmp_path / "export"
    commit_and_export(hub, repo, str(export))
    problems = diff_snapshots(snapshot(str(local), dirs=False, mtimes=False), snapshot(str(export), dirs=False, mtimes=False))
    assert not problems, problems
    assert os.stat(export / "old.txt").st_mtime_ns == 1_500_000_000_123_456_789
    assert sorted(p for p, v in snapshot(str(local)).items() if v[0] == "dir") == sorted(
        p for p, v in snapshot(str(export)).items() if v[0] == "dir"
    )
    # A fresh mount of the committed branch shows the same tree.
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt2") as mnt:
        problems = diff_snapshots(snapshot(str(local), mtimes=False), snapshot(mnt, mtimes=False))
        assert not problems, problems
        problems = diff_snapshots(snapshot(str(export)), snapshot(mnt))
        assert not problems, problems


def _tree(root) -> None:
    """A source tree for the tool tests: nested dirs, modes, times, symlinks, an empty dir."""
    rnd = random.Random(11)
    for i in range(60):
        d = root / f"dir{i % 6}" / f"sub{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}.dat").write_bytes(rnd.randbytes(rnd.choice([0, 10, 4000, 70_000, 300_000])))
    (root / "big.bin").write_bytes(rnd.randbytes(5 * 1024 * 1024))
    (root / "empty").mkdir()
    (root / "exec.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "exec.sh", 0o755)
    os.chmod(root / "dir1", 0o750)
    os.symlink("big.bin", root / "link")
    os.symlink("dir0/sub0", root / "dlink")
    t = 1_650_000_000_000_000_000
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + dirnames:
            t += 1_000_003_000
            os.utime(os.path.join(dirpath, n), ns=(t, t), follow_symlinks=False)
    os.utime(root / "dir1", ns=(t, t))


@pytest.mark.parametrize("tool", ["cp", "tar", "rsync"])
def test_tools_write_into_the_mount(hub, tmp_path, tool):
    if tool == "rsync" and not shutil.which("rsync"):
        missing("rsync is not installed (apt-get install rsync)")
    src = tmp_path / "src"
    src.mkdir()
    _tree(src)
    repo = new_repo(hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        dest = os.path.join(mnt, "data")
        if tool == "cp":
            subprocess.run(["cp", "-a", f"{src}/.", dest + "/"], check=False)
            if not os.path.isdir(dest):
                os.mkdir(dest)
                subprocess.run(["cp", "-a", f"{src}/.", dest + "/"], check=True)
        elif tool == "tar":
            archive = tmp_path / "src.tar"
            with tarfile.open(archive, "w") as tf:
                tf.add(src, arcname="data")
            subprocess.run(["tar", "-xf", str(archive), "-C", mnt], check=True)
        else:
            subprocess.run(["rsync", "-a", f"{src}/", dest + "/"], check=True)
        problems = diff_snapshots(snapshot(str(src)), snapshot(dest))
        assert not problems, problems
    export = tmp_path / "export"
    commit_and_export(hub, repo, str(export), f"{tool} into the mount")
    problems = diff_snapshots(snapshot(str(src), dirs=False), snapshot(str(export / "data"), dirs=False))
    assert not problems, problems
    # Directories: the same set, with their modes.
    want = {p: v for p, v in snapshot(str(src)).items() if v[0] == "dir"}
    got = {p: v for p, v in snapshot(str(export / "data")).items() if v[0] == "dir"}
    assert want == got


def _as(uid: int, gid: int, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *cmd], capture_output=True, text=True
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_posix_ownership_permissions_and_times(hub, tmp_path):
    repo = new_repo(hub)
    # Other users must be able to reach the mount point (pytest's tmp_path is private).
    public = tempfile.mkdtemp(prefix="fabric-fuse-", dir="/tmp")
    os.chmod(public, 0o755)
    try:
        _posix_checks(hub, repo, public, tmp_path)
    finally:
        shutil.rmtree(public, ignore_errors=True)


def _posix_checks(hub, repo: str, public: str, tmp_path) -> None:
    with mounted(hub.url, hub.token, f"{repo}@main", os.path.join(public, "mnt"), "--rw", "--allow-other") as mnt:
        os.chmod(mnt, 0o755)
        j = lambda *p: os.path.join(mnt, *p)
        # chown is stored per entry (and survives a remount, below)
        open(j("owned"), "w").write("x")
        os.chown(j("owned"), 1234, 5678)
        st = os.stat(j("owned"))
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        os.symlink("owned", j("sl"))
        os.lchown(j("sl"), 42, 43)
        assert (os.lstat(j("sl")).st_uid, os.lstat(j("sl")).st_gid) == (42, 43)
        os.mkdir(j("shared"))
        os.chmod(j("shared"), 0o777)
        # permission bits are enforced by the kernel (default_permissions)
        open(j("private"), "w").write("secret")
        os.chmod(j("private"), 0o600)
        r = _as(NOBODY, NOBODY, "cat", j("private"))
        assert r.returncode != 0 and "Permission denied" in r.stderr
        r = _as(NOBODY, NOBODY, "sh", "-c", f"echo hi > {j('nobody-file')}")
        assert r.returncode != 0 and "Permission denied" in r.stderr  # the root dir is 0755 root
        r = _as(NOBODY, NOBODY, "sh", "-c", f"echo hi > {j('shared', 'mine')}")
        assert r.returncode == 0, r.stderr
        st = os.stat(j("shared", "mine"))
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)  # the creator owns new files
        r = _as(NOBODY, NOBODY, "chmod", "600", j("owned"))
        assert r.returncode != 0 and "Operation not permitted" in r.stderr
        # setuid/setgid: cleared when a non-root user writes, kept for root
        open(j("shared", "suid"), "w").write("x")
        os.chmod(j("shared", "suid"), 0o6777)
        r = _as(NOBODY, NOBODY, "sh", "-c", f"echo more >> {j('shared', 'suid')}")
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(os.stat(j("shared", "suid")).st_mode) & (stat.S_ISUID | stat.S_ISGID) == 0
        open(j("shared", "suid2"), "w").write("x")
        os.chmod(j("shared", "suid2"), 0o4755)
        open(j("shared", "suid2"), "a").write("root writes")
        assert stat.S_IMODE(os.stat(j("shared", "suid2")).st_mode) == 0o4755
        # a setgid directory: new entries take its group, new directories its setgid bit
        os.mkdir(j("sgid"))
        os.chown(j("sgid"), 0, 777)
        os.chmod(j("sgid"), 0o2777)
        r = _as(NOBODY, NOBODY, "sh", "-c", f"echo x > {j('sgid', 'f')} && mkdir {j('sgid', 'd')}")
        assert r.returncode == 0, r.stderr
        assert os.stat(j("sgid", "f")).st_gid == 777
        assert os.stat(j("sgid", "d")).st_gid == 777
        assert os.stat(j("sgid", "d")).st_mode & stat.S_ISGID
        # times: write moves mtime and ctime; chmod moves ctime only; utimens sets both
        open(j("t"), "w").write("1")
        st0 = os.stat(j("t"))
        time.sleep(0.05)
        with open(j("t"), "a") as f:
            f.write("2")
        st1 = os.stat(j("t"))
        assert st1.st_mtime_ns > st0.st_mtime_ns and st1.st_ctime_ns > st0.st_ctime_ns
        time.sleep(0.05)
        os.chmod(j("t"), 0o604)
        st2 = os.stat(j("t"))
        assert st2.st_mtime_ns == st1.st_mtime_ns and st2.st_ctime_ns > st1.st_ctime_ns
        os.utime(j("t"), ns=(1_000_000_000_000_000_000, 1_100_000_000_000_000_000))
        st3 = os.stat(j("t"))
        assert (st3.st_atime_ns, st3.st_mtime_ns) == (1_000_000_000_000_000_000, 1_100_000_000_000_000_000)
        assert st3.st_ctime_ns >= st2.st_ctime_ns
        d0 = os.stat(j("shared"))
        time.sleep(0.05)
        open(j("shared", "newfile"), "w").close()
        d1 = os.stat(j("shared"))
        assert d1.st_mtime_ns > d0.st_mtime_ns and d1.st_ctime_ns > d0.st_ctime_ns  # a directory changes with its entries
        # names up to 255 bytes, paths up to 4096
        long_name = "n" * 255
        open(j(long_name), "w").write("long")
        assert open(j(long_name)).read() == "long"
        with pytest.raises(OSError) as e:
            open(j("n" * 256), "w")
        assert e.value.errno == errno.ENAMETOOLONG
        parts = []
        while len(os.path.join(*parts, "x" * 200).encode()) + 201 < 4000:
            parts.append("p" * 200)
        os.makedirs(os.path.join(mnt, *parts))
        target = os.path.join(mnt, *parts, "f" * 30)
        open(target, "w").write("deep")
        assert open(target).read() == "deep"
        assert len(os.path.relpath(target, mnt).encode()) > 3500
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt2", "--rw") as mnt:
        st = os.stat(os.path.join(mnt, "owned"))
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        assert stat.S_IMODE(os.stat(os.path.join(mnt, "private")).st_mode) == 0o600
        assert os.stat(os.path.join(mnt, "t")).st_mtime_ns == 1_100_000_000_000_000_000
        assert os.stat(os.path.join(mnt, "sgid", "d")).st_mode & stat.S_ISGID


def test_unsupported_operations_return_the_documented_errno(hub, tmp_path):
    repo = new_repo(hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        j = lambda *p: os.path.join(mnt, *p)
        open(j("f"), "w").write("f")
        os.mkdir(j("d"))
        cases = {
            "link-dir": (lambda: os.link(j("d"), j("hard")), errno.EPERM),
            "setxattr": (lambda: os.setxattr(j("f"), "user.k", b"v"), errno.EOPNOTSUPP),
            "getxattr": (lambda: os.getxattr(j("f"), "user.k"), errno.EOPNOTSUPP),
            "rmdir-file": (lambda: os.rmdir(j("f")), errno.ENOTDIR),
            "unlink-dir": (lambda: os.unlink(j("d")), errno.EISDIR),
            "bad-utf8": (lambda: open(os.fsencode(j("x")) + b"\xff\xfe", "w"), errno.EILSEQ),
        }
        for name, (fn, want) in cases.items():
            with pytest.raises(OSError) as e:
                fn()
            assert e.value.errno == want, f"{name}: {os.strerror(e.value.errno)} instead of {os.strerror(want)}"
        assert not os.path.exists(j("hard"))
        # rename flags: RENAME_NOREPLACE works, RENAME_EXCHANGE is refused
        libc = ctypes.CDLL(None, use_errno=True)
        open(j("g"), "w").write("g")
        AT_FDCWD = -100
        rc = libc.renameat2(AT_FDCWD, os.fsencode(j("f")), AT_FDCWD, os.fsencode(j("g")), 1)
        assert rc == -1 and ctypes.get_errno() == errno.EEXIST
        rc = libc.renameat2(AT_FDCWD, os.fsencode(j("f")), AT_FDCWD, os.fsencode(j("g")), 2)
        assert rc == -1 and ctypes.get_errno() == errno.EINVAL
        assert open(j("f")).read() == "f" and open(j("g")).read() == "g"
        # non-empty directories
        open(j("d", "x"), "w").close()
        with pytest.raises(OSError) as e:
            os.rmdir(j("d"))
        assert e.value.errno == errno.ENOTEMPTY
        os.mkdir(j("d2"))
        open(j("d2", "y"), "w").close()
        with pytest.raises(OSError) as e:
            os.rename(j("d"), j("d2"))
        assert e.value.errno == errno.ENOTEMPTY
    fabric("--server", hub.url, "commit", f"{repo}@main", "-m", "x", token=hub.token)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "ro") as mnt:
        for fn in (lambda: open(os.path.join(mnt, "f"), "a"), lambda: os.unlink(os.path.join(mnt, "f"))):
            with pytest.raises(OSError) as e:
                fn()
            assert e.value.errno == errno.EROFS


def test_commit_on_unmount_and_on_interval(hub, tmp_path):
    plane = hub.plane()
    repo = new_repo(hub)
    head0 = plane.resolve_commit(repo, "main")
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "m1", "--rw", "--commit-on-unmount", "--commit-message", "unmounted") as mnt:
        open(os.path.join(mnt, "one.txt"), "w").write("1")
    head1 = plane.resolve_commit(repo, "main")
    assert head1 != head0
    assert plane.get_commit(repo, head1).message.startswith("unmounted")
    assert plane.read(repo, head1, "one.txt") == b"1"
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "m2", "--rw", "--commit-interval", "1") as mnt:
        open(os.path.join(mnt, "two.txt"), "w").write("2")
        deadline = time.monotonic() + 30
        while plane.resolve_commit(repo, "main") == head1 and time.monotonic() < deadline:
            time.sleep(0.2)
        head2 = plane.resolve_commit(repo, "main")
        assert head2 != head1, mount_log(str(tmp_path / "m2"))
        assert plane.read(repo, head2, "two.txt") == b"2"
        assert list(plane.uncommitted(repo, "main")) == []


def test_open_unlinked_and_renamed_files_keep_working(hub, tmp_path):
    repo = new_repo(hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        j = lambda *p: os.path.join(mnt, *p)
        f = open(j("tmpfile"), "w+b")
        f.write(b"scratch data")
        os.unlink(j("tmpfile"))
        f.seek(0)
        assert f.read() == b"scratch data"
        f.write(b" more")
        f.close()
        assert not os.path.exists(j("tmpfile"))
        g = open(j("before"), "wb")
        g.write(b"part one ")
        os.rename(j("before"), j("after"))
        g.write(b"part two")
        g.close()
        assert open(j("after"), "rb").read() == b"part one part two"
        assert not os.path.exists(j("before"))
    plane = hub.plane()
    assert {c.path for c in plane.uncommitted(repo, "main")} == {"after"}
    assert plane.read(repo, "main", "after") == b"part one part two"


def test_a_file_unlinked_right_after_its_close_leaves_no_hidden_name(hub, tmp_path):
    """The kernel releases a closed file after close(2) returns; an unlink that overtakes
    the release is hidden by libfuse (as for an open file) and must still leave nothing."""
    repo = new_repo(hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        for i in range(300):
            path = os.path.join(mnt, f"f{i % 7}")
            with open(path, "w") as f:
                f.write("x")
            os.unlink(path)
        names = os.listdir(mnt)
    staged = {c.path for c in hub.plane().uncommitted(repo, "main")}
    assert names == [] and not staged, (names, staged)


def test_a_full_write_directory_is_enospc_for_the_writer_and_the_mount_goes_on(hub, tmp_path):
    """The disk of --write-dir fills up: the writer gets ENOSPC, as on a local disk, and the
    mount stays usable once room is made."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    repo = new_repo(hub)
    write_dir = tmp_path / "writes"
    write_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(write_dir)], check=True)
    try:
        with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw", "--write-dir", str(write_dir)) as mp:
            fd = os.open(os.path.join(mp, "big.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
            written = 0
            try:
                with pytest.raises(OSError) as info:
                    for _ in range(8):
                        written += os.write(fd, os.urandom(1 << 20))
                assert info.value.errno == errno.ENOSPC
                assert written <= 1 << 20
            finally:
                os.close(fd)
            os.unlink(os.path.join(mp, "big.bin"))
            data = os.urandom(100_000)
            with open(os.path.join(mp, "after.bin"), "wb") as f:
                f.write(data)
            with open(os.path.join(mp, "after.bin"), "rb") as f:
                assert f.read() == data
            assert sorted(os.listdir(mp)) == ["after.bin"]
    finally:
        subprocess.run(["umount", "-l", str(write_dir)], check=False)


def test_server_errors_become_the_errno_a_program_expects():
    from fabric.errors import BadRequest, Forbidden, InvalidPath, NotFound, StorageFull, Unavailable
    from fuse.errors import fs_errno

    assert fs_errno(StorageFull("the spoke's pinned budget is full")) == errno.ENOSPC
    assert fs_errno(NotFound("gone")) == errno.ENOENT
    assert fs_errno(Forbidden("no")) == errno.EACCES
    assert fs_errno(InvalidPath("name longer than 255 bytes")) == errno.ENAMETOOLONG
    assert fs_errno(BadRequest("bad")) == errno.EINVAL
    assert fs_errno(Unavailable("server away")) == errno.EIO
