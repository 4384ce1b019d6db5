"""``fabric export --files-from FILE``: only the listed paths are written, a directory with
everything under it; a list naming a path the version lacks writes nothing
(``fabric/client/filters.py`` ``FileList``, ``fabric/client/transfer.py``)."""

from __future__ import annotations

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
