"""``fabric export/import --files-from FILE``: only the listed paths are copied, a directory
with everything under it; a list naming a path the source lacks copies nothing
(``fabric/client/filters.py`` ``FileList``, ``fabric/client/transfer.py``)."""

from __future__ import annotations

import os

import pytest

from fabric.client.filters import FileList, read_path_list
from fabric.errors import BadRequest
from tests.helpers.fstree import write_file
from tests.test_export_delete import listing

MTIME = 1_700_000_000_000_000_000
TREE = {
    "train/a.bin": "a\n",
    "train/b.bin": "b\n",
    "val/c.bin": "c\n",
    "val/sub/d.bin": "d\n",
    "meta/labels.csv": "x,1\n",
    "README": "read me\n",
}


@pytest.fixture
def dataset(cli, tmp_path) -> str:
    for path, text in TREE.items():
        write_file(str(tmp_path / "src" / path), text.encode(), 0o644, MTIME)
    cli("repo", "create", "split")
    cli("import", str(tmp_path / "src"), "split@main", "-m", "v1")
    return "split@main"


def test_a_list_reads_as_rsync_writes_one():
    text = "# the validation split\n\nval/\n./meta/labels.csv\n/README\r\n"
    assert read_path_list(text) == ["val", "meta/labels.csv", "README"]
    with pytest.raises(BadRequest, match="line 2"):
        read_path_list("ok\n../etc/passwd\n")


def test_a_listed_directory_holds_everything_under_it():
    files = FileList(["val", "README"])
    assert files.holds("val/sub/d.bin") and files.holds("README")
    assert not files.holds("valx/c.bin") and not files.holds("README2")
    assert files.missing(["val/sub/d.bin"]) == ["README"]


def test_only_the_listed_paths_are_written(cli, dataset, tmp_path):
    lst = tmp_path / "val.txt"
    lst.write_text("val/c.bin\nmeta/\n")
    dest = tmp_path / "dest"
    r = cli("--json", "export", dataset, str(dest), "--files-from", str(lst)).json()
    assert listing(dest) == {"val": "dir", "val/c.bin": "c\n", "meta": "dir", "meta/labels.csv": "x,1\n"}
    assert r["files"] == 2

    # From stdin, beside rules: the list first, then what the rules leave out.
    out = tmp_path / "train"
    cli("export", dataset, str(out), "--files-from", "-", "--exclude", "b.bin", input=b"train\nREADME\n")
    assert listing(out) == {"train": "dir", "train/a.bin": "a\n", "README": "read me\n"}

    # Under --prefix, the list's paths are relative to it.
    sub = tmp_path / "sub"
    cli("export", dataset, str(sub), "--prefix", "val", "--files-from", "-", input=b"sub/d.bin\n")
    assert listing(sub) == {"sub": "dir", "sub/d.bin": "d\n"}


def test_a_path_the_version_lacks_writes_nothing(cli, dataset, tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("val/c.bin\nval/nope.bin\ntest/\n")
    dest = tmp_path / "dest"
    r = cli("export", dataset, str(dest), "--files-from", str(lst), check=False)
    assert r.returncode == 3, r.stderr
    assert "2 path(s) of the file list are not in split@main: test, val/nope.bin" in r.stderr
    assert not dest.exists()


@pytest.mark.parametrize(
    "extra, text, message",
    [
        (["--delete"], "val\n", "give one of them"),
        ([], "val/../../etc\n", "line 1"),
    ],
)
def test_bad_lists_are_refused_and_write_nothing(cli, dataset, tmp_path, extra, text, message):
    lst = tmp_path / "list.txt"
    lst.write_text(text)
    dest = tmp_path / "dest"
    r = cli("export", dataset, str(dest), "--files-from", str(lst), *extra, check=False)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not dest.exists()


def files_of(cli, target: str) -> dict[str, int]:
    return {e["path"]: e["size"] for e in cli("--json", "ls", "-r", target).json() if e["type"] == "file"}


def head(cli) -> str:
    return {b["name"]: b["commit_id"] for b in cli("--json", "branch", "list", "split").json()}["main"]


def test_an_import_sends_the_listed_paths_and_keeps_the_rest(cli, dataset, tmp_path):
    src = tmp_path / "src"
    write_file(str(src / "val" / "c.bin"), b"c, changed\n", 0o644, MTIME + 1)
    os.unlink(src / "val" / "sub" / "d.bin")
    write_file(str(src / "train" / "a.bin"), b"a, changed but not listed\n", 0o644, MTIME + 1)
    write_file(str(src / "new.txt"), b"new\n", 0o644, MTIME)
    plan = cli("--json", "import", str(src), dataset, "-n", "--files-from", "-", input=b"val/\nnew.txt\n").json()["plan"]
    assert plan == {"add": ["new.txt", "val/sub"], "change": ["val/c.bin"], "remove": ["val/sub/d.bin"]}  # val/sub: empty now
    cli("import", str(src), dataset, "-m", "val", "--files-from", "-", input=b"val/\nnew.txt\n")
    after = files_of(cli, dataset)
    assert after["val/c.bin"] == len(b"c, changed\n") and "val/sub/d.bin" not in after
    assert after["train/a.bin"] == len(b"a\n") and after["new.txt"] == 4 and "README" in after


def test_an_import_of_a_path_src_lacks_commits_nothing(cli, dataset, tmp_path):
    src = tmp_path / "src"
    outside = tmp_path / "outside"
    write_file(str(outside / "secret.txt"), b"secret\n", 0o644, MTIME)
    os.symlink(outside, src / "linked")  # a listed path under a link is not followed
    before = head(cli)
    for listed in (b"val/c.bin\nval/gone.bin\n", b"linked/secret.txt\n"):
        r = cli("import", str(src), dataset, "-m", "x", "--files-from", "-", input=listed, check=False)
        assert r.returncode == 3 and "1 path(s) of the file list are not in" in r.stderr, r.stderr
    assert head(cli) == before
