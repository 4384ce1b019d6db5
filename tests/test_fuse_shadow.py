"""The mount follows the namespace rule of file-system views (``fabric.format.namespace``).

A tree keeps S3's key space: ``a`` (a file) and ``a/b`` may coexist. The mount, like
``fabric export``, shows what :func:`~fabric.format.namespace.visible` shows: the
directory ``a`` (with its child), never the file ``a``, and each name once.
"""

from __future__ import annotations

import io
import os
import stat
import time

import pytest

from fabric.format.model import SYMLINK, Entry
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import unique_name

pytestmark = needs_fuse

#: key -> content (bytes: a file; str: a symlink's target)
TREE: dict[str, bytes | str] = {
    "a": b"file a\n",
    "a/b": b"file a/b\n",
    "a.txt": b"between\n",
    "a-z/c": b"c\n",
    "deep/x": b"shadowed deeper\n",
    "deep/x/y/z": b"z\n",
    "link": "/etc",
    "link/evil.txt": b"below a link\n",
    "plain/f": b"f\n",
}


def shadow_repo(hub) -> tuple[str, str]:
    """A repository whose ``main`` holds :data:`TREE` (committed), and the commit id."""
    plane = hub.plane()
    repo = unique_name("shadow")
    plane.create_repo(repo)
    for path, content in TREE.items():
        if isinstance(content, bytes):
            plane.put_object(repo, "main", path, io.BytesIO(content))
        else:
            plane.stage(repo, "main", {path: Entry(SYMLINK, len(content), 0o777, time.time_ns(), target=content)})
    c = plane.commit(repo, "main", "files and directories of one name")
    listed = [p for p, _ in plane.walk(repo, c.id)]
    assert "a" in listed and "a/b" in listed and "link" in listed, "the tree keeps both keys"
    return repo, c.id


def check_view(mnt: str) -> None:
    names = os.listdir(mnt)
    assert len(names) == len(set(names)), f"duplicate names in readdir: {sorted(names)}"
    assert sorted(names) == ["a", "a-z", "a.txt", "deep", "link", "plain"]
    kinds = {e.name: (e.is_dir(follow_symlinks=False), e.is_symlink()) for e in os.scandir(mnt)}
    assert kinds["a"] == (True, False) and kinds["link"] == (True, False) and kinds["a.txt"] == (False, False)
    for name in ("a", "link", "deep", "deep/x"):
        st = os.lstat(os.path.join(mnt, name))
        assert stat.S_ISDIR(st.st_mode), f"{name} is not shown as the directory that shadows it"
    assert os.listdir(os.path.join(mnt, "a")) == ["b"]
    assert os.listdir(os.path.join(mnt, "link")) == ["evil.txt"]
    assert os.listdir(os.path.join(mnt, "deep")) == ["x"]
    assert os.listdir(os.path.join(mnt, "deep", "x")) == ["y"]
    with open(os.path.join(mnt, "a", "b"), "rb") as f:
        assert f.read() == b"file a/b\n"
    with open(os.path.join(mnt, "link", "evil.txt"), "rb") as f:
        assert f.read() == b"below a link\n"
    with open(os.path.join(mnt, "deep", "x", "y", "z"), "rb") as f:
        assert f.read() == b"z\n"
    with open(os.path.join(mnt, "a.txt"), "rb") as f:
        assert f.read() == b"between\n"
    with pytest.raises(IsADirectoryError):
        open(os.path.join(mnt, "a"), "rb").close()
    with pytest.raises(OSError):
        os.readlink(os.path.join(mnt, "link"))
    # Every name under the root, with attributes (READDIRPLUS) and by walking: each once.
    walked = []
    for dirpath, dirnames, filenames in os.walk(mnt):
        for n in dirnames + filenames:
            walked.append(os.path.relpath(os.path.join(dirpath, n), mnt))
    assert len(walked) == len(set(walked)), sorted(walked)
    assert sorted(walked) == sorted(
        ["a", "a/b", "a.txt", "a-z", "a-z/c", "deep", "deep/x", "deep/x/y", "deep/x/y/z", "link", "link/evil.txt", "plain", "plain/f"]
    )


@pytest.mark.parametrize("ref", ["commit", "branch", "rw"])
def test_directory_shadows_file_of_same_name(hub, tmp_path, ref) -> None:
    repo, commit = shadow_repo(hub)
    target = f"{repo}@{commit}" if ref == "commit" else f"{repo}@main"
    opts = ("--rw",) if ref == "rw" else ()
    with mounted(hub.url, hub.token, target, tmp_path / "mnt", *opts) as mnt:
        check_view(mnt)


def test_removing_the_last_child_keeps_the_shadowed_file(hub, tmp_path) -> None:
    """Removing ``a/b`` through a ``--rw`` mount never replaces the hidden file ``a`` with a
    directory marker: the file (shown again once nothing is below it) keeps its content."""
    repo, _ = shadow_repo(hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        os.unlink(os.path.join(mnt, "a", "b"))
        os.unlink(os.path.join(mnt, "plain", "f"))
        assert os.path.isdir(os.path.join(mnt, "plain")), "an emptied directory stays"
    plane = hub.plane()
    assert b"".join(plane.read_stream(repo, "main", "a")) == b"file a\n"
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "again") as mnt:
        with open(os.path.join(mnt, "a"), "rb") as f:
            assert f.read() == b"file a\n"
        assert os.path.isdir(os.path.join(mnt, "plain"))


def test_moving_or_changing_a_shadowing_directory_keeps_the_hidden_entry(hub, tmp_path) -> None:
    """A rename of the directory ``link`` moves what is below it and leaves the hidden symlink
    ``link`` alone; a chmod of ``deep/x`` (which would need a marker over the hidden file) is refused."""
    repo, _ = shadow_repo(hub)
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        os.rename(os.path.join(mnt, "link"), os.path.join(mnt, "moved"))
        with open(os.path.join(mnt, "moved", "evil.txt"), "rb") as f:
            assert f.read() == b"below a link\n"
        with pytest.raises(PermissionError):
            os.chmod(os.path.join(mnt, "deep", "x"), 0o700)
        assert os.path.isdir(os.path.join(mnt, "deep", "x"))
    plane = hub.plane()
    assert plane.stat(repo, "main", "link").target == "/etc"
    assert b"".join(plane.read_stream(repo, "main", "deep/x")) == b"shadowed deeper\n"
    assert b"".join(plane.read_stream(repo, "main", "moved/evil.txt")) == b"below a link\n"


def test_name_created_after_the_listing_is_shown_as_the_directory(hub, tmp_path) -> None:
    """A read-only branch mount asks the server about a name its cached listing lacks: a file
    ``n`` created together with ``n/x`` is shown as the directory ``n``."""
    repo, _ = shadow_repo(hub)
    plane = hub.plane()
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--attr-timeout", "60") as mnt:
        assert "n" not in os.listdir(mnt)  # the root's listing is now cached for 60 s
        plane.put_object(repo, "main", "n", io.BytesIO(b"file n\n"))
        plane.put_object(repo, "main", "n/x", io.BytesIO(b"x\n"))
        assert stat.S_ISDIR(os.lstat(os.path.join(mnt, "n")).st_mode)
        with open(os.path.join(mnt, "n", "x"), "rb") as f:
            assert f.read() == b"x\n"
