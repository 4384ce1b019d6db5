"""Special files (issue 13, point 1): FIFOs, UNIX sockets and character and block devices
made through a real ``--rw`` mount, compared with a local ext4 directory (the same calls on
both); kept across a remount, committed, exported, imported, and shown by REST and S3."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading

from fabric.client.transfer import export_tree, import_directory
from fabric.format.model import BLOCKDEV, CHARDEV, FIFO, SOCKET
from tests.fuse_helpers import FABRIC, env, fabric, mounted, needs_fuse
from tests.hubserver import ROOT, unique_name

pytestmark = needs_fuse

NOBODY = 65534
NULL_DEV = os.makedev(1, 3)
LOOP_DEV = os.makedev(7, 0)


def make_specials(root: str) -> None:
    """The same special files, made the ways programs make them."""
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    os.mkfifo(j("fifo"), 0o640)
    os.mknod(j("chr"), stat.S_IFCHR | 0o604, NULL_DEV)
    os.mknod(j("blk"), stat.S_IFBLK | 0o600, LOOP_DEV)
    os.mknod(j("plain"), stat.S_IFREG | 0o644)  # mknod of a regular file: an empty file
    os.mkdir(j("d"))
    os.mkfifo(j("d", "fifo2"))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(j("sock"))  # the socket file stays after the socket is closed
    os.chmod(j("fifo"), 0o604)
    os.chown(j("chr"), 1234, 5678)
    os.rename(j("d", "fifo2"), j("moved-fifo"))
    os.mkfifo(j("gone"))
    os.unlink(j("gone"))


def describe(root: str, owners: bool = True) -> dict[str, tuple]:
    """What ``lstat`` and ``readdir`` show of each path below ``root``."""
    out: dict[str, tuple] = {}
    for dirpath, _dirs, _files in os.walk(root):
        for de in os.scandir(dirpath):
            st = de.stat(follow_symlinks=False)
            rel = os.path.relpath(de.path, root)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
                continue
            # readdir's types (what scandir learns without a stat), then lstat's fields
            row: tuple = (de.is_file(follow_symlinks=False), de.is_dir(follow_symlinks=False), de.is_symlink())
            row += (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_rdev, st.st_nlink, st.st_size)
            if owners:
                row += (st.st_uid, st.st_gid)
            out[rel] = row
    return out


def fifo_round_trip(path: str) -> bytes:
    """Bytes written into the FIFO at ``path`` by one thread, read by another."""
    got: list[bytes] = []

    def reader() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=reader)
    t.start()
    with open(path, "wb") as f:
        f.write(b"through the pipe")
    t.join(30)
    assert not t.is_alive()
    return got[0]


def socket_round_trip(path: str) -> bytes:
    """A listening UNIX socket bound at ``path`` answers a client that connects by path."""
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen(1)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            conn, _ = server.accept()
            with conn:
                client.sendall(b"hello socket")
                data = conn.recv(100)
    os.unlink(path)
    return data


def new_repo(s3hub) -> str:
    repo = unique_name("special")
    s3hub.plane().create_repo(repo)
    return repo


def test_special_files_match_a_local_directory(s3hub, tmp_path):
    hub = s3hub.hub
    repo = new_repo(s3hub)
    local = tmp_path / "local"
    local.mkdir()
    make_specials(str(local))
    want = describe(str(local))
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        make_specials(mnt)
        assert describe(mnt) == want
        # The kernel does the I/O of FIFOs and sockets once stat gives their type.
        assert fifo_round_trip(os.path.join(mnt, "fifo")) == b"through the pipe"
        assert socket_round_trip(os.path.join(mnt, "live.sock")) == b"hello socket"
        mtimes = {p: os.lstat(os.path.join(mnt, p)).st_mtime_ns for p in want}
    # Staged: a new mount shows them as they were.
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "again", "--rw") as mnt:
        assert describe(mnt) == want
    plane = s3hub.plane()
    plane.commit(repo, "main", "special files")
    kinds = {p: (e.kind, e.rdev) for p, e in plane.walk(repo, "main", "")}
    assert kinds["fifo"] == (FIFO, 0) and kinds["moved-fifo"] == (FIFO, 0) and kinds["sock"] == (SOCKET, 0)
    assert kinds["chr"] == (CHARDEV, NULL_DEV) and kinds["blk"] == (BLOCKDEV, LOOP_DEV)
    # An export (as root) recreates them, with their modes and times (owners are not restored).
    out = tmp_path / "out"
    r = fabric("--server", hub.url, "--json", "export", f"{repo}@main", str(out), token=hub.token)
    info = json.loads(r.stdout)
    assert info["skipped"] == [] and info["specials"] == 5
    assert describe(str(out), owners=False) == describe(str(local), owners=False)
    for p, t in mtimes.items():
        if not p.startswith("d"):
            assert os.lstat(out / p).st_mtime_ns == t, p


def test_export_without_privilege_skips_devices_and_says_so(s3hub, tmp_path):
    """Without CAP_MKNOD (root, less that capability: as a user would be) devices are skipped."""
    hub = s3hub.hub
    repo = new_repo(s3hub)
    src = tmp_path / "src"
    src.mkdir()
    make_specials(str(src))
    import_directory(s3hub.plane(), str(src), repo, "main", "specials")
    dest = tmp_path / "out"
    r = subprocess.run(
        ["setpriv", "--bounding-set=-mknod", "--", *FABRIC, "--server", hub.url, "--json", "export", f"{repo}@main", str(dest)],
        env=env(hub.token), cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["skipped"] == ["blk", "chr"] and info["specials"] == 3
    assert "warning: skipped blk" in r.stderr and "warning: skipped chr" in r.stderr
    assert set(describe(str(dest))) == {"d", "fifo", "moved-fifo", "plain", "sock"}
    assert stat.S_ISFIFO(os.lstat(dest / "fifo").st_mode) and stat.S_ISSOCK(os.lstat(dest / "sock").st_mode)


def test_import_stores_special_files_and_export_recreates_them(s3hub, tmp_path):
    repo = new_repo(s3hub)
    src = tmp_path / "src"
    src.mkdir()
    make_specials(str(src))
    plane = s3hub.plane()
    result = import_directory(plane, str(src), repo, "main", "specials")
    assert result.skipped == []
    entries = dict(plane.walk(repo, "main", ""))
    assert (entries["chr"].kind, entries["chr"].rdev, entries["chr"].mode) == (CHARDEV, NULL_DEV, 0o604)
    assert (entries["fifo"].kind, entries["fifo"].mode) == (FIFO, 0o604)
    assert entries["sock"].kind == SOCKET and entries["blk"].kind == BLOCKDEV
    # Unchanged: nothing to import again.
    assert import_directory(plane, str(src), repo, "main", "again").commit is None
    # A changed device number is a change.
    os.unlink(src / "chr")
    os.mknod(src / "chr", stat.S_IFCHR | 0o604, os.makedev(1, 5))
    assert import_directory(plane, str(src), repo, "main", "zero").changed == 1
    out = tmp_path / "out"
    result = export_tree(plane, repo, "main", str(out))
    assert result.skipped == [] and result.specials == 5
    assert describe(str(out), owners=False) == describe(str(src), owners=False)


def test_rest_and_s3_show_special_files(s3hub, s3, tmp_path):
    hub = s3hub.hub
    repo = new_repo(s3hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        make_specials(mnt)
        with open(os.path.join(mnt, "d", "file"), "w") as f:
            f.write("data")
    with s3hub.rest() as c:
        st = c.get(f"/api/v1/repos/{repo}/refs/main/stat", params={"path": "chr"}).json()
        assert (st["type"], st["rdev"], st["size"], st["mode"]) == ("chardev", NULL_DEV, 0, "604")
        page = c.get(f"/api/v1/repos/{repo}/refs/main/list").json()
        types = {e["path"]: e["type"] for e in page["entries"]}
        assert types == {"blk": "blockdev", "chr": "chardev", "fifo": "fifo", "moved-fifo": "fifo", "plain": "file", "sock": "socket", "d": "dir", "d/file": "file"}
        r = c.get(f"/api/v1/repos/{repo}/refs/main/objects", params={"path": "fifo"})
        assert r.status_code == 400 and "fifo" in r.text
    listed = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=repo, Prefix="main/")["Contents"]}
    assert listed == {"main/blk": 0, "main/chr": 0, "main/d/": 0, "main/d/file": 4, "main/fifo": 0, "main/moved-fifo": 0, "main/plain": 0, "main/sock": 0}
    head = s3.head_object(Bucket=repo, Key="main/sock")
    assert head["ContentLength"] == 0 and head["Metadata"] == {"fabric-type": "socket"}
    got = s3.get_object(Bucket=repo, Key="main/chr")
    assert got["Body"].read() == b"" and got["Metadata"] == {"fabric-type": "chardev", "fabric-rdev": str(NULL_DEV)}
    assert s3.head_object(Bucket=repo, Key="main/plain")["Metadata"] == {}


def test_special_files_cannot_be_opened_as_files_on_a_read_only_mount(s3hub, tmp_path):
    """A FIFO of a committed tree, on a mount of the commit: its type is shown, and the
    kernel (not the mount) handles its opens."""
    hub = s3hub.hub
    repo = new_repo(s3hub)
    src = tmp_path / "src"
    src.mkdir()
    make_specials(str(src))
    cid = import_directory(s3hub.plane(), str(src), repo, "main", "specials").commit.id
    with mounted(hub.url, hub.token, f"{repo}@{cid}", tmp_path / "ro") as mnt:
        assert describe(mnt, owners=False) == describe(str(src), owners=False)
        fd = os.open(os.path.join(mnt, "fifo"), os.O_RDONLY | os.O_NONBLOCK)  # a pipe: opens at once
        assert os.read(fd, 10) == b""
        os.close(fd)
