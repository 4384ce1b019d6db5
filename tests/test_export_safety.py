"""``fabric export`` never writes outside its destination (issue 11, point 1).

A tree keeps S3's namespace (keys ``a`` and ``a/b`` may coexist); a file-system
view follows Mountpoint for S3: a directory shadows a file or symlink of the same
name. Export writes every file relative to its destination without following a
link, whether the link came from the commit or was already in the destination.
"""

from __future__ import annotations

import os

import pytest

from fabric.format.model import DIR, FILE, SYMLINK, Entry
from fabric.format.namespace import visible
from tests.helpers.fstree import write_file


def _listing(tree) -> list[str]:
    """Every path under ``tree`` (as a set of relative paths, links not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            out.append(os.path.relpath(os.path.join(dirpath, name), tree))
    return sorted(out)


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    return d


def test_file_below_a_committed_symlink_stays_in_dest(cli, tmp_path, outside) -> None:
    """The issue's reproduction: ``link -> OUTSIDE`` and ``link/evil.txt`` in one commit."""
    src = tmp_path / "src"
    write_file(str(src / "a.txt"), b"alpha\n")
    os.symlink(str(outside), src / "link")
    cli("repo", "create", "demo")
    cli("import", str(src), "demo@main", "-m", "v1")
    evil = tmp_path / "evil.txt"
    evil.write_bytes(b"evil\n")
    cli("put", "demo@main", "link/evil.txt", str(evil))
    cli("commit", "demo@main", "-m", "v2")
    # The tree keeps both keys, as S3 does: listings and reads are unchanged.
    assert "link -> " in cli("ls", "demo@main").stdout
    assert cli("cat", "demo@main", "link/evil.txt").stdout == "evil\n"

    # An older export left the symlink in DEST: exporting v2 over it replaces the link.
    old = tmp_path / "old"
    cli("export", "demo@main~1", str(old))
    assert (old / "link").is_symlink()
    r = cli("export", "demo@main", str(old), check=False)
    assert _listing(outside) == [], "export wrote outside its destination"
    assert r.returncode == 0, r.stderr
    assert not (old / "link").is_symlink() and (old / "link" / "evil.txt").read_bytes() == b"evil\n"

    # A fresh destination.
    dest = tmp_path / "dest"
    r = cli("export", "demo@main", str(dest), check=False)
    assert _listing(outside) == [], "export wrote outside its destination"
    assert r.returncode == 0, r.stderr
    assert not (dest / "link").is_symlink() and (dest / "link").is_dir()
    assert (dest / "link" / "evil.txt").read_bytes() == b"evil\n"
    assert (dest / "a.txt").read_bytes() == b"alpha\n"
    assert "warning: skipped link" in r.stderr and "shadow" in r.stderr
    assert "exported 2 files" in r.stdout and "1 shadowed" in r.stdout

    # --json reports the shadowed paths too; exporting over the same tree again is safe.
    info = cli("--json", "export", "demo@main", str(dest)).json()
    assert info["shadowed"] == ["link"] and info["files"] == 2 and info["symlinks"] == 0
    assert _listing(outside) == []



def test_file_and_directory_of_the_same_name(cli, tmp_path) -> None:
    """Keys ``a`` and ``a/b`` coexist in the tree; export shows the directory and skips the file."""
    cli("repo", "create", "demo")
    for path, data in {"a": b"file a\n", "a/b": b"file a/b\n", "a.txt": b"between\n", "a-z/c": b"c\n"}.items():
        f = tmp_path / "input"
        f.write_bytes(data)
        cli("put", "demo@main", path, str(f))
    cli("commit", "demo@main", "-m", "both")
    ls = cli("--json", "ls", "demo@main", "--recursive").stdout
    assert '"a"' in ls and '"a/b"' in ls, "the tree keeps both keys"
    dest = tmp_path / "dest"
    r = cli("--json", "export", "demo@main", str(dest))
    assert r.json()["shadowed"] == ["a"]
    assert "warning: skipped a:" in r.stderr
    assert (dest / "a").is_dir() and (dest / "a" / "b").read_bytes() == b"file a/b\n"
    assert (dest / "a.txt").read_bytes() == b"between\n" and (dest / "a-z" / "c").read_bytes() == b"c\n"
    assert r.json()["files"] == 3


def test_symlink_already_in_dest_is_replaced_not_followed(cli, tmp_path, outside) -> None:
    """A link in DEST pointing out is replaced by what the commit holds at its path, never written through."""
    src = tmp_path / "src"
    write_file(str(src / "sub" / "x.txt"), b"x\n")
    write_file(str(src / "top.txt"), b"top\n")
    write_file(str(src / "deep" / "er" / "y.txt"), b"y\n")
    cli("repo", "create", "demo")
    cli("import", str(src), "demo@main", "-m", "v1")
    (outside / "er").mkdir()
    victim = outside / "top.txt"
    victim.write_bytes(b"precious\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(str(outside), dest / "sub")  # where the commit has a directory
    os.symlink(str(victim), dest / "top.txt")  # where the commit has a file
    os.symlink(str(outside), dest / "deep")  # a directory with a directory below it
    cli("export", "demo@main", str(dest))
    assert _listing(outside) == ["er", "top.txt"] and victim.read_bytes() == b"precious\n"
    assert not (dest / "sub").is_symlink() and (dest / "sub" / "x.txt").read_bytes() == b"x\n"
    assert not (dest / "top.txt").is_symlink() and (dest / "top.txt").read_bytes() == b"top\n"
    assert not (dest / "deep").is_symlink() and (dest / "deep" / "er" / "y.txt").read_bytes() == b"y\n"


def test_directory_in_dest_where_the_commit_has_a_file(cli, tmp_path) -> None:
    """Without --delete export never deletes a directory of DEST: a clear error, and nothing inside it is touched."""
    src = tmp_path / "src"
    write_file(str(src / "thing"), b"file\n")
    cli("repo", "create", "demo")
    cli("import", str(src), "demo@main", "-m", "v1")
    dest = tmp_path / "dest"
    write_file(str(dest / "thing" / "mine.txt"), b"mine\n")
    r = cli("export", "demo@main", str(dest), check=False)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr
    assert "thing" in r.stderr and "is a directory" in r.stderr
    assert (dest / "thing" / "mine.txt").read_bytes() == b"mine\n"
    assert [n for n in os.listdir(dest / "thing")] == ["mine.txt"], "no temporary file left behind"


# -- the rule itself (fabric.format.namespace) -------------------------------------


def _f(kind: str = FILE) -> Entry:
    return Entry(kind, 0, 0o777 if kind == SYMLINK else 0o644, 0, target="t" if kind == SYMLINK else "")


def test_visible_drops_files_and_symlinks_shadowed_by_directories() -> None:
    items = [
        ("a", _f()), ("a.b", _f(SYMLINK)), ("a.b/c", _f()), ("a/x", _f()),
        ("d", _f(DIR)), ("d/e", _f()),  # a directory entry with contents is not shadowed
        ("f", _f()), ("f0", _f()),  # 'f0' sorts after 'f/': nothing under f
        ("g", _f()), ("g/", _f(DIR)),  # a listing's common prefix shadows too
    ]
    shadowed: list[str] = []
    kept = [p for p, _ in visible(items, shadowed)]
    assert kept == ["a.b/c", "a/x", "d", "d/e", "f", "f0", "g/"]
    assert shadowed == ["a.b", "a", "g"]
    assert [p for p, _ in visible([("z", _f())])] == ["z"]
    with pytest.raises(ValueError, match="sorted"):
        list(visible([("b", _f()), ("a", _f())]))
