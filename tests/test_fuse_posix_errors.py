"""Errors in the order POSIX gives them, and open files whose name is gone (issue 13,
points 3 and 4), through a real ``--rw`` mount with a local ext4 directory as the reference:
the same operations on both, their results compared."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator

import pytest

from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import unique_name

pytestmark = needs_fuse

NOBODY = 65534
LONG = "n" * 256  # one byte over NAME_MAX


def outcome(fn: Callable[[], object]) -> str:
    """``"ok"`` or the errno's name."""
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def as_user(uid: int, fn: Callable[[], object]) -> str:
    """:func:`outcome` of ``fn`` run in a child process as ``uid`` (group ``uid``, no others)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result = outcome(fn)
        except BaseException as exc:  # noqa: BLE001
            result = f"child failed: {exc!r}"
        os.write(w, result.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def open_dirs(hub) -> Iterator[tuple[str, str, str]]:
    """``(mount, local, repo)``: a ``--rw`` mount that other users may use, and a local
    directory; both under a directory everyone may traverse (pytest's are private)."""
    base = tempfile.mkdtemp(prefix="fabric-posix-")
    os.chmod(base, 0o755)
    repo = unique_name("posix")
    hub.plane().create_repo(repo)
    local = os.path.join(base, "local")
    os.mkdir(local)
    try:
        with mounted(hub.url, hub.token, f"{repo}@main", os.path.join(base, "mnt"), "--rw", "--allow-other") as mnt:
            yield mnt, local, repo
    finally:
        shutil.rmtree(base, ignore_errors=True)


def prepare(root: str) -> None:
    """The same starting tree in both directories."""
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    with open(j("f"), "w") as f:
        f.write("file\n")
    os.mkdir(j("d"))
    os.mkdir(j("open"))
    os.chmod(j("open"), 0o777)  # others may create here
    with open(j("open", "mine"), "w") as f:
        f.write("x")
    os.symlink("f", j("sl"))


def long_name_operations(root: str) -> dict[str, Callable[[], object]]:
    """Every operation that looks a name up, on a missing name of 256 bytes (and a few
    that name an existing file or directory on the other side)."""
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    L = j(LONG)
    return {
        "stat": lambda: os.stat(L),
        "lstat": lambda: os.lstat(L),
        "stat-below": lambda: os.stat(os.path.join(L, "x")),
        "stat-in-dir": lambda: os.stat(j("d", LONG)),
        "access": lambda: os.access(L, os.F_OK) or os.stat(L),
        "readlink": lambda: os.readlink(L),
        "listdir": lambda: os.listdir(L),
        "unlink": lambda: os.unlink(L),
        "rmdir": lambda: os.rmdir(L),
        "chmod": lambda: os.chmod(L, 0o600),
        "chown": lambda: os.chown(L, 1, 1),
        "utime": lambda: os.utime(L, ns=(1, 1)),
        "truncate": lambda: os.truncate(L, 0),
        "rename-from": lambda: os.rename(L, j("x")),
        "rename-to": lambda: os.rename(j("f2"), L),  # missing source: ENOENT comes first
        "rename-existing-to": lambda: os.rename(j("f"), L),
        "open": lambda: os.close(os.open(L, os.O_RDONLY)),
        "open-write": lambda: os.close(os.open(L, os.O_WRONLY)),
        "create": lambda: os.close(os.open(L, os.O_WRONLY | os.O_CREAT, 0o644)),
        "create-excl": lambda: os.close(os.open(L, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)),
        "mkdir": lambda: os.mkdir(L),
        "mkdir-in-dir": lambda: os.mkdir(j("d", LONG)),
        "mkfifo": lambda: os.mkfifo(L),
        "mknod-char": lambda: os.mknod(L, stat.S_IFCHR | 0o600, os.makedev(1, 3)),
        "mknod-reg": lambda: os.mknod(L, stat.S_IFREG | 0o600),
        "symlink": lambda: os.symlink("f", L),
        "link-to": lambda: os.link(j("f"), L),
        "link-from": lambda: os.link(L, j("x")),
        "bind": lambda: _bind(L),
    }


def existing_name_operations(root: str) -> dict[str, Callable[[], object]]:
    """Creating a name that exists: EEXIST, whatever else the call would refuse."""
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    return {
        "mkfifo-over-file": lambda: os.mkfifo(j("f")),
        "mkfifo-over-dir": lambda: os.mkfifo(j("d")),
        "mknod-char-over-file": lambda: os.mknod(j("f"), stat.S_IFCHR | 0o600, os.makedev(1, 3)),
        "mknod-block-over-symlink": lambda: os.mknod(j("sl"), stat.S_IFBLK | 0o600, os.makedev(7, 0)),
        "mkdir-over-file": lambda: os.mkdir(j("f")),
        "symlink-over-dir": lambda: os.symlink("x", j("d")),
        "link-over-file": lambda: os.link(j("f"), j("sl")),
        "link-over-dir": lambda: os.link(j("f"), j("d")),
        "bind-over-file": lambda: _bind(j("f")),
        "create-excl-over-file": lambda: os.open(j("f"), os.O_WRONLY | os.O_CREAT | os.O_EXCL),
    }


def unprivileged_operations(root: str) -> dict[str, Callable[[], object]]:
    """What a user without CAP_MKNOD gets: EEXIST and ENAMETOOLONG before EPERM."""
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    return {
        "mknod-char": lambda: os.mknod(j("open", "dev"), stat.S_IFCHR | 0o600, os.makedev(1, 3)),
        "mknod-char-existing": lambda: os.mknod(j("open", "mine"), stat.S_IFCHR | 0o600, os.makedev(1, 3)),
        "mknod-char-long": lambda: os.mknod(j("open", LONG), stat.S_IFCHR | 0o600, os.makedev(1, 3)),
        "mknod-block-long": lambda: os.mknod(j("open", LONG), stat.S_IFBLK | 0o600, os.makedev(7, 0)),
        "mkfifo": lambda: os.mkfifo(j("open", "fifo")),
        "mkfifo-long": lambda: os.mkfifo(j("open", LONG)),
        "create-in-root": lambda: os.close(os.open(j("nobody"), os.O_WRONLY | os.O_CREAT, 0o644)),
        "chmod-others": lambda: os.chmod(j("f"), 0o777),
        "chmod-others-long": lambda: os.chmod(j(LONG), 0o777),
        "unlink-long": lambda: os.unlink(j("open", LONG)),
    }


def _bind(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)


def test_long_names_and_existing_names_fail_as_on_ext4(open_dirs):
    mnt, local, _ = open_dirs
    for root in (mnt, local):
        prepare(root)
    for table in (long_name_operations, existing_name_operations):
        want = {name: outcome(fn) for name, fn in table(local).items()}
        got = {name: outcome(fn) for name, fn in table(mnt).items()}
        assert got == want, {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    # Nothing was created or changed by the failed calls.
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(local)) == ["d", "f", "open", "sl"]
    assert open(os.path.join(mnt, "f")).read() == "file\n"


def test_an_unprivileged_user_gets_the_errors_in_posix_order(open_dirs):
    mnt, local, _ = open_dirs
    for root in (mnt, local):
        prepare(root)
    want = {name: as_user(NOBODY, fn) for name, fn in unprivileged_operations(local).items()}
    got = {name: as_user(NOBODY, fn) for name, fn in unprivileged_operations(mnt).items()}
    assert want["mknod-char"] == "EPERM" and want["mknod-char-long"] == "ENAMETOOLONG"  # the reference itself
    assert got == want, {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert sorted(os.listdir(os.path.join(mnt, "open"))) == sorted(os.listdir(os.path.join(local, "open")))


def _unlinked_scenario(root: str) -> dict[str, object]:
    """Files unlinked (or replaced by a rename) while open, used through their descriptors."""
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    seen: dict[str, object] = {}

    def fstat(fd: int) -> tuple:
        st = os.fstat(fd)
        return (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_nlink, st.st_size)

    # created, written, unlinked, written again: never anywhere but on this descriptor
    fd = os.open(j("scratch"), os.O_RDWR | os.O_CREAT, 0o640)
    os.write(fd, b"scratch data")
    ino = os.fstat(fd).st_ino
    os.unlink(j("scratch"))
    seen["scratch-same-inode"] = os.fstat(fd).st_ino == ino
    seen["scratch-fstat"] = fstat(fd)
    os.write(fd, b" more")
    seen["scratch-fstat-after-write"] = fstat(fd)
    seen["scratch-read"] = os.pread(fd, 100, 0)
    os.fchmod(fd, 0o600)
    seen["scratch-fchmod"] = fstat(fd)
    os.close(fd)
    # an existing file opened for reading, then unlinked
    fd = os.open(j("old"), os.O_RDONLY)
    ino = os.fstat(fd).st_ino
    os.unlink(j("old"))
    seen["old-same-inode"] = os.fstat(fd).st_ino == ino
    seen["old-fstat"] = fstat(fd)
    seen["old-read"] = os.pread(fd, 100, 0)
    os.close(fd)
    # an existing file opened for writing, then unlinked and changed through the descriptor
    fd = os.open(j("kept"), os.O_RDWR)
    os.unlink(j("kept"))
    os.pwrite(fd, b"KEPT", 0)
    os.ftruncate(fd, 6)
    seen["kept-fstat"] = fstat(fd)
    seen["kept-read"] = os.pread(fd, 100, 0)
    os.fsync(fd)
    os.close(fd)
    # a file replaced by a rename while open
    fd = os.open(j("target"), os.O_RDONLY)
    os.rename(j("new"), j("target"))
    seen["replaced-fstat"] = fstat(fd)
    seen["replaced-read"] = os.pread(fd, 100, 0)
    seen["target-now"] = open(j("target"), "rb").read()
    os.close(fd)
    seen["names"] = sorted(os.listdir(root))
    return seen


def test_open_unlinked_files_keep_working_with_nlink_zero(hub, tmp_path):
    repo = unique_name("unlinked")
    hub.plane().create_repo(repo)
    local = tmp_path / "local"
    local.mkdir()

    def prepare_files(root: str) -> None:
        for name, data in (("old", b"old contents"), ("kept", b"kept contents"), ("target", b"target v1"), ("new", b"target v2")):
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)

    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "m0", "--rw") as mnt:
        prepare_files(mnt)
    hub.plane().commit(repo, "main", "files")
    prepare_files(str(local))
    want = _unlinked_scenario(str(local))
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        got = _unlinked_scenario(mnt)
    assert got == want, {k: (got.get(k), want[k]) for k in want if got.get(k) != want[k]}
    assert want["scratch-fstat"][2] == 0  # (the reference: nlink 0)
    # What the branch holds: the unlinked names are gone, nothing of them was staged after.
    plane = hub.plane()
    changed = {c.path for c in plane.uncommitted(repo, "main")}
    assert changed == {"old", "kept", "target", "new"}
    assert {p for p, _ in plane.walk(repo, "main", "")} == {"target"}
    assert b"".join(plane.read_stream(repo, "main", "target")) == b"target v2"
