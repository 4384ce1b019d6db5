"""Hard links through a ``--rw`` mount, and in ``fabric import`` / ``fabric export``.

The mount is compared with a local directory: the same operations on both, the
results (return values, errno, link counts, whether names share an inode, contents)
compared. Then the links must survive a remount, a commit and an export, and
``fabric import`` of a tree with hard links must store them as groups.
"""

from __future__ import annotations

import errno
import json
import os
import stat

from tests.fuse_helpers import fabric, mount_log, mounted, needs_fuse
from tests.hubserver import unique_name

pytestmark = needs_fuse


def _errno(fn) -> str:
    try:
        fn()
    except OSError as exc:
        return errno.errorcode[exc.errno]
    return "ok"


def _names(root: str, *names: str) -> tuple:
    """Link counts, modes, sizes and contents of ``names``, and whether they share one inode."""
    sts = [os.lstat(os.path.join(root, n)) for n in names]
    contents = [open(os.path.join(root, n), "rb").read() if stat.S_ISREG(s.st_mode) else b"" for n, s in zip(names, sts)]
    return (
        [s.st_nlink for s in sts],
        len({s.st_ino for s in sts}) == 1,
        [stat.S_IMODE(s.st_mode) for s in sts],
        [s.st_size for s in sts],
        contents,
    )


def scenario(root: str) -> list:
    """The same hard-link operations on any directory; what each returned."""
    j = os.path.join
    out: list = []
    os.mkdir(j(root, "sub"))
    os.mkdir(j(root, "sub/inner"))
    with open(j(root, "a.txt"), "w") as f:
        f.write("hello\n")
    ino = os.stat(j(root, "a.txt")).st_ino
    out.append(("link", _errno(lambda: os.link(j(root, "a.txt"), j(root, "b.txt")))))
    out.append(("link into a subdirectory", _errno(lambda: os.link(j(root, "a.txt"), j(root, "sub/c.txt")))))
    out.append(("inode kept by link", os.stat(j(root, "a.txt")).st_ino == ino))
    out.append(("three names", _names(root, "a.txt", "b.txt", "sub/c.txt")))
    with open(j(root, "b.txt"), "a") as f:  # a write through one name ...
        f.write("world\n")
    out.append(("written through b", _names(root, "a.txt", "b.txt", "sub/c.txt")))  # ... shows through all
    with open(j(root, "sub/c.txt"), "r+") as f:
        f.write("HE")
    out.append(("written through c", _names(root, "a.txt", "b.txt", "sub/c.txt")))
    out.append(("EEXIST", _errno(lambda: os.link(j(root, "a.txt"), j(root, "b.txt")))))
    out.append(("EPERM: a directory", _errno(lambda: os.link(j(root, "sub"), j(root, "sub2")))))
    out.append(("ENOENT: no source", _errno(lambda: os.link(j(root, "nope"), j(root, "x")))))
    out.append(("ENOENT: no directory", _errno(lambda: os.link(j(root, "a.txt"), j(root, "nodir/x")))))
    os.chmod(j(root, "b.txt"), 0o600)  # one inode: every name has the mode
    out.append(("chmod", _names(root, "a.txt", "b.txt", "sub/c.txt")))
    os.rename(j(root, "sub/c.txt"), j(root, "sub/d.txt"))
    out.append(("renamed", _names(root, "a.txt", "b.txt", "sub/d.txt"), os.path.exists(j(root, "sub/c.txt"))))
    os.unlink(j(root, "a.txt"))
    out.append(("unlinked", _names(root, "b.txt", "sub/d.txt"), os.path.exists(j(root, "a.txt"))))
    os.truncate(j(root, "sub/d.txt"), 4)
    out.append(("truncated", _names(root, "b.txt", "sub/d.txt")))
    with open(j(root, "one.txt"), "w") as f:
        f.write("1")
    os.link(j(root, "one.txt"), j(root, "two.txt"))
    os.unlink(j(root, "two.txt"))
    out.append(("back to one name", _names(root, "one.txt")))
    os.symlink("b.txt", j(root, "sym"))
    os.link(j(root, "sym"), j(root, "sym2"), follow_symlinks=False)
    out.append(("symlink", _names(root, "sym", "sym2"), os.readlink(j(root, "sym2"))))
    out.append(("directories", [os.stat(j(root, d)).st_nlink for d in ("sub", "sub/inner")]))
    return out


def test_links_match_a_local_directory_and_survive_commit_and_export(hub, tmp_path):
    repo = unique_name("links")
    hub.plane().create_repo(repo)
    local = tmp_path / "local"
    local.mkdir()
    want = scenario(str(local))
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        got = scenario(mnt)
        assert got == want, mount_log(mnt)
    # A fresh mount: the names are still one file.
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt2", "--rw") as mnt:
        assert _names(mnt, "b.txt", "sub/d.txt") == _names(str(local), "b.txt", "sub/d.txt")
        assert [os.stat(os.path.join(mnt, d)).st_nlink for d in ("", "sub")] == [os.stat(local / d).st_nlink for d in ("", "sub")]
        with open(os.path.join(mnt, "sub/d.txt"), "a") as f:
            f.write("!")
        with open(local / "sub/d.txt", "a") as f:
            f.write("!")
        assert _names(mnt, "b.txt", "sub/d.txt") == _names(str(local), "b.txt", "sub/d.txt")
        assert os.listdir(mnt) and os.stat(os.path.join(mnt, "one.txt")).st_nlink == 1
    out = fabric("--server", hub.url, "--json", "commit", f"{repo}@main", "-m", "links", token=hub.token).stdout
    cid = json.loads(out)["id"]
    export = tmp_path / "export"
    fabric("--server", hub.url, "export", f"{repo}@{cid}", str(export), token=hub.token)
    assert _names(str(export), "b.txt", "sub/d.txt") == _names(str(local), "b.txt", "sub/d.txt")
    assert _names(str(export), "sym", "sym2") == _names(str(local), "sym", "sym2")
    assert os.stat(export / "one.txt").st_nlink == 1
    # Each name is an object of its own for REST and S3.
    plane = hub.plane()
    assert plane.read(repo, cid, "b.txt") == plane.read(repo, cid, "sub/d.txt") == (local / "b.txt").read_bytes()


def test_import_stores_hard_links_and_export_recreates_them(hub, tmp_path):
    repo = unique_name("linkimp")
    hub.plane().create_repo(repo)
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "y").mkdir()
    (src / "x/f1").write_bytes(b"one" * 1000)
    os.link(src / "x/f1", src / "y/f2")
    (src / "g1").write_bytes(b"group of three")
    os.link(src / "g1", src / "x/g2")
    os.link(src / "g1", src / "y/g3")
    (src / "single").write_bytes(b"alone")
    target = f"{repo}@main"
    fabric("--server", hub.url, "import", str(src), target, "-m", "links", token=hub.token)
    plane = hub.plane()

    def stored(path: str):
        return plane.stat_chunks(repo, "main", path)  # the whole entry (stat's JSON form has no link id)

    e1, e2 = stored("x/f1"), stored("y/f2")
    assert e1.link and e1.link == e2.link and e1.md5 == e2.md5
    groups = {stored(p).link for p in ("g1", "x/g2", "y/g3")}
    assert len(groups) == 1 and "" not in groups and e1.link not in groups
    assert stored("single").link == ""
    # Importing the same tree again changes nothing.
    out = fabric("--server", hub.url, "--json", "import", str(src), target, "-m", "again", token=hub.token).stdout
    assert json.loads(out)["commit_id"] is None
    # A mount shows the groups.
    with mounted(hub.url, hub.token, target, tmp_path / "mnt") as mnt:
        assert _names(mnt, "x/f1", "y/f2") == _names(str(src), "x/f1", "y/f2")
        assert _names(mnt, "g1", "x/g2", "y/g3") == _names(str(src), "g1", "x/g2", "y/g3")
    export = tmp_path / "export"
    fabric("--server", hub.url, "export", target, str(export), token=hub.token)
    for names in (("x/f1", "y/f2"), ("g1", "x/g2", "y/g3"), ("single",)):
        assert _names(str(export), *names) == _names(str(src), *names)
    # A name that leaves its group locally leaves it in the repository too.
    os.unlink(src / "y/f2")
    (src / "y/f2").write_bytes(b"one" * 1000)
    fabric("--server", hub.url, "import", str(src), target, "-m", "unlinked", token=hub.token)
    assert stored("y/f2").link == "" and stored("x/f1").link == ""
    assert stored("x/g2").link in groups
