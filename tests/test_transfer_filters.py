"""``fabric import --include/--exclude/--include-from/--exclude-from/--delete-excluded/--dry-run``,
run as the real command on a local hub data directory (``fabric/client/filters.py``,
``fabric/client/transfer.py``)."""

from __future__ import annotations

import os

import pytest

from fabric.client.filters import EXCLUDE, INCLUDE, Filters, read_patterns
from fabric.errors import BadRequest
from tests.helpers.fstree import write_file

MTIME = 1_700_000_000_000_000_000


@pytest.mark.parametrize(
    "pattern, path, is_dir, left_out",
    [
        ("*.tmp", "a.tmp", False, True),
        ("*.tmp", "d/e/a.tmp", False, True),
        ("*.tmp", "a.tmpx", False, False),
        (".git", "sub/.git", True, True),
        (".git", "x.git", True, False),
        ("cache/", "a/cache", True, True),
        ("cache/", "cache", False, False),  # a file named like a directory-only pattern
        ("/build", "build", True, True),
        ("/build", "lib/build", True, False),
        ("data/raw/*.csv", "data/raw/x.csv", False, True),
        ("data/raw/*.csv", "data/raw/deep/x.csv", False, False),
        ("data/raw/*.csv", "old/data/raw/x.csv", False, False),
        ("a/**/b", "a/b", False, True),
        ("a/**/b", "a/x/y/b", False, True),
        ("a/**/b", "a/x/y/c", False, False),
        ("file?.bin", "file1.bin", False, True),
        ("file?.bin", "file12.bin", False, False),
        ("[!abc].txt", "b.txt", False, False),
        ("[!abc].txt", "d.txt", False, True),
        ("\\!x", "!x", False, True),
        ("foo\\*", "foox", False, False),
    ],
)
def test_patterns_match_as_rsync_and_gitignore_write_them(pattern, path, is_dir, left_out):
    assert Filters.excluding([pattern]).excluded(path, is_dir) is left_out


def test_a_path_under_an_excluded_directory_is_covered():
    assert Filters.excluding(["cache/"]).covers("a/cache/x/y.bin", False)
    assert not Filters.excluding(["cache/"]).covers("a/cachex/y.bin", False)


CSV_ONLY = [(INCLUDE, "*/"), (INCLUDE, "*.csv"), (EXCLUDE, "*")]


@pytest.mark.parametrize(
    "rules, path, is_dir, left_out",
    [
        (CSV_ONLY, "x.csv", False, False),
        (CSV_ONLY, "a/b/x.csv", False, False),
        (CSV_ONLY, "a/b", True, False),
        (CSV_ONLY, "a/b/x.txt", False, True),
        # The first rule that matches decides: an exclude given first wins.
        ([(EXCLUDE, "*"), (INCLUDE, "*.csv")], "x.csv", False, True),
        ([(EXCLUDE, "*.tmp"), (INCLUDE, "keep.tmp")], "keep.tmp", False, True),
        ([(INCLUDE, "keep.tmp"), (EXCLUDE, "*.tmp")], "keep.tmp", False, False),
        ([(INCLUDE, "keep.tmp"), (EXCLUDE, "*.tmp")], "other.tmp", False, True),
        ([(INCLUDE, "*.csv")], "x.txt", False, False),  # no rule matches: kept
    ],
)
def test_the_first_rule_that_matches_decides(rules, path, is_dir, left_out):
    assert Filters(rules).excluded(path, is_dir) is left_out


def test_an_include_cannot_bring_back_a_path_under_an_excluded_directory():
    rules = Filters([(INCLUDE, "*.csv"), (EXCLUDE, "*")])  # no '*/': every directory is left out
    assert not rules.covers("top.csv", False)
    assert rules.covers("a/x.csv", False)
    assert not Filters(CSV_ONLY).covers("a/x.csv", False)


def test_an_exclude_file_skips_comments_and_blank_lines():
    assert read_patterns("# build output\n\n*.o  \nname\\ \n") == ["*.o", "name\\ "]


@pytest.mark.parametrize("pattern", ["", "/", "!keep.txt", "[abc", "[/]"])
def test_a_pattern_that_cannot_mean_anything_is_refused(pattern):
    with pytest.raises(BadRequest):
        Filters.excluding([pattern])


SOURCE = {
    "a.txt": b"alpha\n",
    "b.tmp": b"scratch\n",
    ".git/config": b"[core]\n",
    "sub/.git/HEAD": b"ref\n",
    "sub/keep.txt": b"keep\n",
    "cache/dir/f.bin": b"cached\n",
    "build/o.o": b"object\n",
    "lib/build/o2.o": b"object 2\n",
    "data/raw/x.csv": b"1,2\n",
    "data/raw/deep/y.csv": b"3,4\n",
}
EXCLUDES = ["--exclude", "*.tmp", "--exclude", ".git", "--exclude", "cache/", "--exclude", "/build", "--exclude", "data/raw/*.csv"]
LEFT_OUT = {"b.tmp", ".git/config", "sub/.git/HEAD", "cache/dir/f.bin", "build/o.o", "data/raw/x.csv"}


def make_tree(root, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        write_file(str(root / path), data, 0o644, MTIME)


def files_of(cli, target: str) -> dict[str, int]:
    """Every file of ``target`` with its size."""
    return {e["path"]: e["size"] for e in cli("--json", "ls", "-r", target).json() if e["type"] == "file"}


def head(cli, repo: str) -> str:
    return {b["name"]: b["commit_id"] for b in cli("--json", "branch", "list", repo).json()}["main"]


def test_excluded_paths_are_neither_sent_nor_removed_unless_asked(cli, tmp_path):
    src = tmp_path / "src"
    make_tree(src, SOURCE)
    (src / "only-tmp").mkdir()
    write_file(str(src / "only-tmp" / "x.tmp"), b"x\n", 0o644, MTIME)
    cli("repo", "create", "excl")

    fresh = cli("--json", "import", str(src), "excl@main", "-m", "with excludes", *EXCLUDES).json()
    assert set(files_of(cli, "excl@main")) == set(SOURCE) - LEFT_OUT
    assert {"b.tmp", ".git", "sub/.git", "cache", "build", "data/raw/x.csv", "only-tmp/x.tmp"} <= set(fresh["excluded"])
    # A directory all of whose contents are left out is still imported, empty (as rsync makes it).
    assert any(e["path"] == "only-tmp" and e["type"] == "dir" for e in cli("--json", "ls", "excl@main").json())

    cli("import", str(src), "excl@main", "-m", "everything")
    assert set(files_of(cli, "excl@main")) == set(SOURCE) | {"only-tmp/x.tmp"}

    # Excluded paths changed or removed in SRC: the branch keeps them as they were.
    write_file(str(src / "b.tmp"), b"changed scratch, longer\n", 0o644, MTIME + 1)
    os.unlink(src / "cache" / "dir" / "f.bin")
    write_file(str(src / "a.txt"), b"alpha, changed\n", 0o644, MTIME + 1)
    plan = cli("--json", "import", str(src), "excl@main", "-m", "a.txt only", *EXCLUDES, "--dry-run").json()["plan"]
    # only-tmp/ holds nothing but what is left out: it gets an entry of its own, as in the first import.
    assert plan == {"add": ["only-tmp"], "change": ["a.txt"], "remove": []}
    cli("import", str(src), "excl@main", "-m", "a.txt only", *EXCLUDES)
    after = files_of(cli, "excl@main")
    assert after["b.tmp"] == len(SOURCE["b.tmp"]) and "cache/dir/f.bin" in after
    assert after["a.txt"] == len(b"alpha, changed\n")

    # --delete-excluded: what the patterns leave out goes from the branch too; look-alikes stay.
    cli("import", str(src), "excl@main", "-m", "drop excluded", *EXCLUDES, "--delete-excluded")
    assert set(files_of(cli, "excl@main")) == set(SOURCE) - LEFT_OUT


def test_patterns_read_from_a_file(cli, tmp_path):
    src = tmp_path / "src"
    make_tree(src, SOURCE)
    patterns = tmp_path / "excludes"
    patterns.write_text("# scratch and tools\n*.tmp\n\n.git\ncache/\n/build\ndata/raw/*.csv\n")
    cli("repo", "create", "exfile")
    cli("import", str(src), "exfile@main", "-m", "v1", "--exclude-from", str(patterns))
    assert set(files_of(cli, "exfile@main")) == set(SOURCE) - LEFT_OUT


def test_includes_and_excludes_apply_in_the_order_given(cli, tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"top.csv": b"1\n", "top.txt": b"t\n", "a/b/deep.csv": b"2\n", "a/b/deep.bin": b"b\n", "c/keep.tmp": b"k\n"})
    cli("repo", "create", "ordered")

    # rsync's idiom: every directory, the CSV files, nothing else.
    r = cli("--json", "import", str(src), "ordered@main", "-m", "csv", "--include", "*/", "--include", "*.csv", "--exclude", "*").json()
    assert set(files_of(cli, "ordered@main")) == {"top.csv", "a/b/deep.csv"}
    assert {"top.txt", "a/b/deep.bin", "c/keep.tmp"} <= set(r["excluded"])

    # The same rules in another order: the exclude comes first and leaves out everything.
    reordered = ["--exclude", "*", "--include", "*/", "--include", "*.csv"]
    plan = cli("--json", "import", str(src), "ordered@main", "-n", *reordered).json()["plan"]
    assert plan == {"add": [], "change": [], "remove": []}  # left out, and kept on the branch
    plan = cli("--json", "import", str(src), "ordered@main", "-n", *reordered, "--delete-excluded").json()["plan"]
    assert plan == {"add": [], "change": [], "remove": ["a/b/deep.csv", "c", "top.csv"]}  # c: imported empty before

    # Rules read from a file take their place among the others.
    includes = tmp_path / "includes"
    includes.write_text("# what to keep\nkeep.tmp\n*/\n")
    cli("import", str(src), "ordered@main", "-m", "tmp", "--include-from", str(includes), "--exclude", "*", "--delete-excluded")
    assert set(files_of(cli, "ordered@main")) == {"c/keep.tmp"}


def test_includes_with_no_exclude_leave_nothing_out_and_say_so(cli, tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"a.csv": b"1\n", "b.txt": b"2\n"})
    cli("repo", "create", "onlyinc")
    r = cli("import", str(src), "onlyinc@main", "-m", "v1", "--include", "*.csv")
    assert "nothing is left out" in r.stderr and "--exclude '*'" in r.stderr
    assert set(files_of(cli, "onlyinc@main")) == {"a.csv", "b.txt"}


def test_a_dry_run_lists_what_would_change_and_changes_nothing(cli, tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"keep.txt": b"same\n", "edit.txt": b"before\n", "gone.txt": b"bye\n"})
    cli("repo", "create", "dryrun")
    cli("import", str(src), "dryrun@main", "-m", "v1")
    before = head(cli, "dryrun")
    write_file(str(src / "edit.txt"), b"after, longer\n", 0o644, MTIME + 5)
    write_file(str(src / "new.bin"), os.urandom(200_000), 0o644, MTIME)
    os.unlink(src / "gone.txt")
    packs = sorted(os.listdir(os.path.join(cli.data, "store")))

    r = cli("import", str(src), "dryrun@main", "-n")  # a dry run needs no message
    assert r.stdout.splitlines() == ["add new.bin", "change edit.txt", "remove gone.txt"]
    assert "would add 1, change 1, remove 1" in r.stderr and "nothing was changed" in r.stderr
    plan = cli("--json", "import", str(src), "dryrun@main", "-m", "v2", "--dry-run").json()
    assert plan["dry_run"] is True and plan["commit_id"] is None
    assert plan["plan"] == {"add": ["new.bin"], "change": ["edit.txt"], "remove": ["gone.txt"]}
    assert plan["bytes_hashed"] == 200_000 + len(b"after, longer\n")
    assert head(cli, "dryrun") == before
    assert sorted(os.listdir(os.path.join(cli.data, "store"))) == packs
    assert set(files_of(cli, "dryrun@main")) == {"keep.txt", "edit.txt", "gone.txt"}

    done = cli("--json", "import", str(src), "dryrun@main", "-m", "v2").json()
    assert (done["added"], done["changed"], done["removed"]) == (1, 1, 1)


def test_a_dry_run_lists_every_name_of_a_hard_link_group(cli, tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"a.txt": b"a\n"})
    cli("repo", "create", "dryhard")
    cli("import", str(src), "dryhard@main", "-m", "v1")
    write_file(str(src / "one.bin"), b"linked\n", 0o644, MTIME)
    os.link(src / "one.bin", src / "two.bin")
    plan = cli("--json", "import", str(src), "dryhard@main", "-n").json()
    assert plan["plan"] == {"add": ["one.bin", "two.bin"], "change": [], "remove": []}
    done = cli("--json", "import", str(src), "dryhard@main", "-m", "v2").json()
    assert (done["added"], done["changed"], done["removed"]) == (plan["added"], plan["changed"], plan["removed"]) == (2, 0, 0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--exclude", "[abc"], "never closed"),
        (["--include", "!keep.txt"], "include pattern '!keep.txt': negation"),
        (["--include", "*.txt", "--delete-excluded"], "needs an --exclude"),
        (["--include-from", "/nonexistent/patterns"], "nonexistent"),
        (["--exclude", "!keep.txt"], "negation"),
        (["--exclude", "/"], "matches no name"),
        (["--delete-excluded"], "needs an --exclude"),
        (["--exclude", "*.tmp", "--delete-excluded", "--no-delete"], "give one of them"),
        (["--exclude-from", "/nonexistent/patterns"], "nonexistent"),
    ],
)
def test_bad_exclude_options_are_refused_and_change_nothing(cli, tmp_path, args, message):
    refused(cli, tmp_path, ["-m", "v2", *args], message)


def test_an_import_that_is_no_dry_run_needs_a_message(cli, tmp_path):
    refused(cli, tmp_path, [], "commit message")


def refused(cli, tmp_path, args: list[str], message: str) -> None:
    """``fabric import ARGS`` exits 2 with ``message`` and leaves the branch as it was."""
    src = tmp_path / "src"
    make_tree(src, {"a.txt": b"a\n", "b.tmp": b"b\n"})
    cli("repo", "create", "badopts")
    cli("import", str(src), "badopts@main", "-m", "v1")
    before = head(cli, "badopts")
    write_file(str(src / "c.txt"), b"c\n", 0o644, MTIME)
    r = cli("import", str(src), "badopts@main", *args, check=False)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr
    assert head(cli, "badopts") == before
