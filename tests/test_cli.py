"""The ``fabric`` command line, run as a real subprocess on a local hub data directory.

Happy paths and errors of every command, with the documented exit codes
(2 bad input, 3 not found, 4 conflict, 6 fsck problems) and messages a person
can act on. Errors must never be tracebacks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from fabric.cli.main import cli as fabric_group
from tests.helpers.fstree import assert_same_tree, snapshot, write_file

HEX64 = re.compile(r"^[0-9a-f]{64}$")

FILES = {
    "a.txt": b"alpha\n",
    "dir/b.txt": b"bravo\n",
    "dir/sub/c.bin": bytes(range(256)) * 400,
}


def fail(cli, code: int, *args: str, match: str | None = None, input: bytes | None = None):
    """Run a command that must fail with ``code`` and a one-line, human message on stderr."""
    r = cli(*args, check=False, input=input)
    assert r.returncode == code, f"fabric {' '.join(args)}: exit {r.returncode}, expected {code}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip(), "an error must say what went wrong"
    if match is not None:
        assert re.search(match, r.stderr, re.IGNORECASE), f"stderr does not match {match!r}: {r.stderr}"
    return r


@pytest.fixture
def demo(cli, tmp_path):
    src = tmp_path / "src"
    for path, data in FILES.items():
        write_file(str(src / path), data, 0o644, 1_700_000_000_000_000_000)
    os.symlink("a.txt", src / "link")
    cli("repo", "create", "demo")
    r = cli("import", str(src), "demo@main", "-m", "v1")
    assert HEX64.match(r.stdout.strip()), r.stdout
    return cli


def head(cli, branch: str = "main", repo: str = "demo") -> str:
    return {b["name"]: b["commit_id"] for b in cli("--json", "branch", "list", repo).json()}[branch]


def cat(cli, path: str, ref: str = "main") -> bytes:
    p = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "--data", cli.data, "cat", f"demo@{ref}", path],
        capture_output=True,
        env=cli.env,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout


# -- repositories -------------------------------------------------------------


def test_repo_create_list_delete(cli) -> None:
    r = cli("repo", "create", "demo")
    assert "demo" in r.stdout
    cli("repo", "create", "other-repo", "--default-branch", "dev")
    fail(cli, 4, "repo", "create", "demo", match="already exists")
    fail(cli, 2, "repo", "create", "Bad_Name", match="lowercase")
    fail(cli, 2, "repo", "create", "ab", match="3-63")
    fail(cli, 2, "repo", "create", "demo", "--default-branch", "a/b", match="branch name")
    repos = {r["name"]: r for r in cli("--json", "repo", "list").json()}
    assert set(repos) == {"demo", "other-repo"}
    assert repos["other-repo"]["default_branch"] == "dev"
    # --json works after the subcommand too.
    assert cli("repo", "list", "--json").json() == cli("--json", "repo", "list").json()
    assert "demo" in cli("repo", "list").stdout
    # Without --yes (and no terminal to answer) nothing is deleted.
    r = cli("repo", "delete", "demo", check=False, input=b"")
    assert r.returncode != 0
    assert "demo" in {x["name"] for x in cli("--json", "repo", "list").json()}
    r = cli("repo", "delete", "demo", check=False, input=b"y\n")
    assert r.returncode == 0
    cli("repo", "delete", "other-repo", "--yes")
    assert cli("--json", "repo", "list").json() == []
    fail(cli, 3, "repo", "delete", "demo", "--yes", match="does not exist")
    fail(cli, 3, "ls", "demo@main", match="does not exist")


def test_errors_as_json(cli) -> None:
    r = cli("--json", "repo", "delete", "nope", "--yes", check=False)
    assert r.returncode == 3
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "not_found" and "nope" in err["message"]


# -- import / export -------------------------------------------------------------


def test_import_export(demo, tmp_path) -> None:
    cli = demo
    src = tmp_path / "src"
    # Re-import of the unchanged tree: no commit.
    before = head(cli)
    r = cli("import", str(src), "demo@main", "-m", "again")
    assert "no changes" in r.stdout
    assert head(cli) == before
    write_file(str(src / "new.txt"), b"new\n")
    r = cli("--json", "import", str(src), "demo@main", "-m", "v2")
    info = r.json()
    assert info["added"] == 1 and info["changed"] == info["removed"] == 0
    assert HEX64.match(info["commit_id"]) and info["commit_id"] == head(cli)
    out = tmp_path / "out"
    r = cli("export", "demo@main", str(out))
    assert "exported" in r.stdout
    assert_same_tree(snapshot(str(src)), snapshot(str(out)))
    # Export of an older ref, and of a sub-tree with --prefix.
    cli("export", "demo@main~1", str(tmp_path / "old"))
    assert not (tmp_path / "old" / "new.txt").exists() and (tmp_path / "old" / "a.txt").exists()
    cli("export", "demo@main", str(tmp_path / "sub"), "--prefix", "dir/sub")
    assert (tmp_path / "sub" / "c.bin").read_bytes() == FILES["dir/sub/c.bin"]
    # --prefix and --no-delete on import.
    other = tmp_path / "other"
    write_file(str(other / "x.txt"), b"x")
    cli("import", str(other), "demo@main", "-m", "under prefix", "--prefix", "more")
    assert cat(cli, "more/x.txt") == b"x"
    (src / "new.txt").unlink()
    cli("import", str(src), "demo@main", "-m", "keep", "--no-delete")
    assert cat(cli, "new.txt") == b"new\n"

    fail(cli, 2, "import", str(tmp_path / "missing"), "demo@main", "-m", "x", match="not a directory")
    fail(cli, 2, "import", str(src / "a.txt"), "demo@main", "-m", "x")
    fail(cli, 2, "import", str(src), "demo", "-m", "x", match="branch")
    fail(cli, 2, "import", str(src), "demo@main", match="message")
    fail(cli, 3, "import", str(src), "nope@main", "-m", "x", match="nope")
    fail(cli, 3, "import", str(src), "demo@nobranch", "-m", "x", match="nobranch")
    fail(cli, 2, "import", str(src), "demo@main", "-m", "x", "--prefix", "../up", match="invalid path")
    fail(cli, 3, "export", "demo@nosuchref", str(tmp_path / "o2"), match="nosuchref")
    fail(cli, 3, "export", "nope@main", str(tmp_path / "o3"), match="nope")
    fail(cli, 3, "export", "demo@main", str(tmp_path / "o4"), "--prefix", "not/there", match="nothing under")


# -- reading -------------------------------------------------------------------


def test_ls(demo) -> None:
    cli = demo
    top = cli("ls", "demo@main").stdout
    assert re.search(r"\ba\.txt$", top, re.MULTILINE) and re.search(r"\bdir/$", top, re.MULTILINE) and "link -> a.txt" in top
    assert "b.txt" not in top
    rows = cli("--json", "ls", "demo@main", "-r").json()
    assert [r["path"] for r in rows] == ["a.txt", "dir/b.txt", "dir/sub/c.bin", "link"]
    by_path = {r["path"]: r for r in rows}
    assert by_path["dir/sub/c.bin"]["size"] == len(FILES["dir/sub/c.bin"])
    assert by_path["link"]["type"] == "symlink" and by_path["link"]["target"] == "a.txt"
    assert [r["path"] for r in cli("--json", "ls", "demo@main", "dir").json()] == ["dir/b.txt", "dir/sub/"]
    assert len(cli("--json", "ls", "demo@main", "-r", "-n", "2").json()) == 2
    assert [r["path"] for r in cli("--json", "ls", "demo", "-r", "--after", "dir/b.txt").json()] == ["dir/sub/c.bin", "link"]
    fail(cli, 3, "ls", "demo@nope", match="nope")
    fail(cli, 3, "ls", "nope@main", match="nope")
    fail(cli, 2, "ls", "demo@main", "-n", "0")
    assert cli("--json", "ls", "demo@main", "no/such/dir").json() == []


def test_cat_and_stat(demo) -> None:
    cli = demo
    for path, data in FILES.items():
        assert cat(cli, path) == data
    info = cli("--json", "stat", "demo@main", "dir/sub/c.bin").json()
    assert info["type"] == "file" and info["size"] == len(FILES["dir/sub/c.bin"]) and info["mode"] == "644"
    assert info["etag"] == hashlib.md5(FILES["dir/sub/c.bin"]).hexdigest()
    assert "size: 6" in cli("stat", "demo@main", "a.txt").stdout
    assert cli("--json", "stat", "demo@main", "link").json()["target"] == "a.txt"
    # Any ref expression: tag, commit id (and a prefix of it), ancestor.
    cid = head(cli)
    cli("tag", "create", "demo", "v1", "main")
    for ref in ("v1", cid, cid[:12], "main"):
        assert cat(cli, "a.txt", ref) == FILES["a.txt"]
    fail(cli, 3, "cat", "demo@main", "missing.txt", match="not found")
    fail(cli, 3, "stat", "demo@main", "missing.txt", match="not found")
    fail(cli, 3, "cat", "demo@main~5", "a.txt", match="first commit")
    fail(cli, 2, "cat", "demo@main", "dir/sub/c.bin/", match="invalid path")
    r = cli("cat", "demo@main", "link", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr


# -- writing -------------------------------------------------------------------


def test_put_rm_status_commit(demo, tmp_path) -> None:
    cli = demo
    f = tmp_path / "upload.bin"
    f.write_bytes(b"uploaded\n")
    r = cli("put", "demo@main", "new/upload.bin", str(f))
    assert "staged" in r.stdout
    cli("put", "demo@main", "from-stdin.txt", "-", input=b"piped\n")
    cli("rm", "demo@main", "a.txt")
    status = cli("status", "demo@main").stdout.splitlines()
    assert sorted(status) == ["A from-stdin.txt", "A new/upload.bin", "R a.txt"]
    js = {c["path"]: c["type"] for c in cli("--json", "status", "demo@main").json()}
    assert js == {"from-stdin.txt": "added", "new/upload.bin": "added", "a.txt": "removed"}
    # Uncommitted writes are visible on the branch, not at a commit.
    assert cat(cli, "from-stdin.txt") == b"piped\n"
    fail(cli, 3, "cat", f"demo@{head(cli)}", "from-stdin.txt")
    fail(cli, 3, "rm", "demo@main", "does-not-exist", match="not found")
    fail(cli, 3, "put", "demo@nobranch", "x", str(f), match="nobranch")
    fail(cli, 2, "put", "demo", "x", str(f), match="branch")
    fail(cli, 2, "put", "demo@main", "x", str(tmp_path / "no-such-file"))
    fail(cli, 2, "rm", "demo@main")

    old = head(cli)
    fail(cli, 4, "commit", "demo@main", "-m", "stale", "--expect-head", "0" * 64, match="expected")
    assert head(cli) == old
    fail(cli, 2, "commit", "demo@main", "-m", "  ", match="message")
    fail(cli, 2, "commit", "demo@main", "-m", "m", "--meta", "novalue")
    r = cli("commit", "demo@main", "-m", "second", "--expect-head", old, "--meta", "run=42", "--author", "alice")
    new = r.stdout.strip()
    assert HEX64.match(new) and head(cli) == new
    c = cli("--json", "log", "demo@main", "-n", "1").json()[0]
    assert c["id"] == new and c["parents"] == [old] and c["meta"] == {"run": "42"} and c["author"] == "alice"
    assert cli("status", "demo@main").stdout.strip() == "nothing to commit"
    fail(cli, 2, "commit", "demo@main", "-m", "empty", match="nothing to commit")
    cli("commit", "demo@main", "-m", "empty on purpose", "--allow-empty")
    fail(cli, 4, "commit", "demo@main", "-m", "again", "--allow-empty", "--expect-head", old, match="expected")
    fail(cli, 3, "commit", "demo@nobranch", "-m", "x", match="nobranch")
    fail(cli, 3, "status", "demo@nobranch", match="nobranch")


def test_log(demo, tmp_path) -> None:
    cli = demo
    f = tmp_path / "f"
    for i in range(3):
        f.write_bytes(b"%d" % i)
        cli("put", "demo@main", "counter", str(f))
        cli("commit", "demo@main", "-m", f"counter {i}")
    cli("put", "demo@main", "other", str(f))
    cli("commit", "demo@main", "-m", "other")
    log = cli("--json", "log", "demo@main").json()
    assert [c["message"] for c in log] == ["other", "counter 2", "counter 1", "counter 0", "v1", "Repository created"]
    assert [c["message"] for c in cli("--json", "log", "demo@main", "-n", "2").json()] == ["other", "counter 2"]
    assert [c["message"] for c in cli("--json", "log", "demo@main", "--path", "counter").json()] == [
        "counter 2", "counter 1", "counter 0"
    ]
    assert [c["message"] for c in cli("--json", "log", "demo@main", "--path", "dir").json()] == ["v1"]
    page = cli("--json", "log", "demo@main", "-n", "2", "--after", log[1]["id"]).json()
    assert [c["id"] for c in page] == [log[2]["id"], log[3]["id"]]
    text = cli("log", "demo@main", "-n", "1").stdout
    assert log[0]["id"][:12] in text and "other" in text
    fail(cli, 3, "log", "demo@nope", match="nope")
    fail(cli, 2, "log", "demo@main", "-n", "0")
    fail(cli, 2, "log", "demo@main", "--path", "../x", match="invalid path")


def test_diff(demo, tmp_path) -> None:
    cli = demo
    f = tmp_path / "f"
    f.write_bytes(b"changed")
    cli("put", "demo@main", "dir/b.txt", str(f))
    cli("put", "demo@main", "added.txt", str(f))
    cli("rm", "demo@main", "a.txt")
    cli("commit", "demo@main", "-m", "v2")
    lines = cli("diff", "demo", "main~1", "main").stdout.splitlines()
    assert sorted(lines) == ["+ added.txt", "- a.txt", "~ dir/b.txt"]
    js = cli("--json", "diff", "demo", "main~1", "main").json()
    assert {c["path"]: c["type"] for c in js} == {"added.txt": "added", "a.txt": "removed", "dir/b.txt": "changed"}
    assert [c["path"] for c in cli("--json", "diff", "demo", "main~1", "main", "--prefix", "dir/").json()] == ["dir/b.txt"]
    assert cli("--json", "diff", "demo", "main", "main").json() == []
    fail(cli, 3, "diff", "demo", "main", "nope", match="nope")
    fail(cli, 3, "diff", "nope", "main", "main", match="nope")


# -- branches, tags, merge, revert ---------------------------------------------


def test_branches(demo, tmp_path) -> None:
    cli = demo
    first = head(cli)
    r = cli("branch", "create", "demo", "exp", "--from", "main")
    assert "exp" in r.stdout
    fail(cli, 4, "branch", "create", "demo", "exp", "--from", "main", match="already exists")
    fail(cli, 2, "branch", "create", "demo", "bad/name", "--from", "main", match="invalid branch name")
    fail(cli, 2, "branch", "create", "demo", "..", "--from", "main", match="invalid branch name")
    fail(cli, 3, "branch", "create", "demo", "x", "--from", "nope", match="nope")
    fail(cli, 2, "branch", "create", "demo", "x")  # --from is required
    assert {b["name"] for b in cli("--json", "branch", "list", "demo").json()} == {"main", "exp"}
    assert "exp" in cli("branch", "list", "demo").stdout
    f = tmp_path / "f"
    f.write_bytes(b"exp")
    cli("put", "demo@exp", "exp.txt", str(f))
    cli("commit", "demo@exp", "-m", "on exp")
    cli("put", "demo@exp", "staged.txt", str(f))
    assert head(cli, "exp") != first
    r = cli("branch", "reset", "demo", "exp", "--to", "main")
    assert head(cli, "exp") == first
    assert cli("--json", "status", "demo@exp").json() == []  # staging discarded
    fail(cli, 3, "branch", "reset", "demo", "exp", "--to", "nope", match="nope")
    fail(cli, 3, "branch", "reset", "demo", "nobranch", "--to", "main", match="nobranch")
    fail(cli, 2, "branch", "delete", "demo", "main", match="default branch")
    cli("branch", "delete", "demo", "exp")
    fail(cli, 3, "branch", "delete", "demo", "exp", match="exp")
    fail(cli, 3, "branch", "list", "nope", match="nope")


def test_tags(demo, tmp_path) -> None:
    cli = demo
    r = cli("tag", "create", "demo", "v1", "main")
    assert "v1" in r.stdout
    fail(cli, 4, "tag", "create", "demo", "v1", "main", match="already exists")
    fail(cli, 4, "tag", "create", "demo", "main", "main", match="branch named")
    fail(cli, 4, "branch", "create", "demo", "v1", "--from", "main", match="tag named")
    fail(cli, 3, "tag", "create", "demo", "v2", "nope", match="nope")
    fail(cli, 2, "tag", "create", "demo", "bad tag", "main", match="invalid tag name")
    tags = cli("--json", "tag", "list", "demo").json()
    assert tags == [{"name": "v1", "commit_id": head(cli)}]
    # A tag does not move when its branch does.
    f = tmp_path / "f"
    f.write_bytes(b"later")
    cli("put", "demo@main", "later.txt", str(f))
    cli("commit", "demo@main", "-m", "later")
    fail(cli, 3, "cat", "demo@v1", "later.txt")
    assert cat(cli, "later.txt") == b"later"
    # Writing to a tag is refused.
    r = cli("put", "demo@v1", "x", str(f), check=False)
    assert r.returncode in (2, 3, 4) and "Traceback" not in r.stderr
    cli("tag", "delete", "demo", "v1")
    fail(cli, 3, "tag", "delete", "demo", "v1", match="v1")
    assert cli("--json", "tag", "list", "demo").json() == []


def test_merge(demo, tmp_path) -> None:
    cli = demo
    f = tmp_path / "f"
    cli("branch", "create", "demo", "exp", "--from", "main")
    f.write_bytes(b"main version\n")
    cli("put", "demo@main", "a.txt", str(f))
    cli("put", "demo@main", "dir/b.txt", str(f))
    cli("commit", "demo@main", "-m", "main edits")
    f.write_bytes(b"exp version\n")
    cli("put", "demo@exp", "a.txt", str(f))
    cli("put", "demo@exp", "dir/b.txt", str(f))
    cli("put", "demo@exp", "exp-only.txt", str(f))
    cli("commit", "demo@exp", "-m", "exp edits")
    main_head = head(cli)
    r = fail(cli, 4, "merge", "demo", "exp", "main", match="conflict")
    assert "conflict: a.txt" in r.stderr and "conflict: dir/b.txt" in r.stderr
    assert "--strategy" in r.stderr
    assert head(cli) == main_head  # nothing changed
    js = cli("--json", "merge", "demo", "exp", "main", check=False)
    assert js.returncode == 4 and sorted(json.loads(js.stderr)["error"]["conflicts"]) == ["a.txt", "dir/b.txt"]
    fail(cli, 2, "merge", "demo", "exp", "main", "--strategy", "mine")
    # ours: keep main's versions, still take what only exp changed.
    cli("branch", "create", "demo", "m-ours", "--from", "main")
    r = cli("merge", "demo", "exp", "m-ours", "--strategy", "ours", "-m", "merge ours")
    merge_id = r.stdout.strip()
    assert HEX64.match(merge_id)
    c = cli("--json", "log", "demo@m-ours", "-n", "1").json()[0]
    assert c["message"] == "merge ours" and set(c["parents"]) == {main_head, head(cli, "exp")}
    assert cat(cli, "a.txt", "m-ours") == b"main version\n" and cat(cli, "exp-only.txt", "m-ours") == b"exp version\n"
    cli("merge", "demo", "exp", "main", "--strategy", "theirs")
    assert cat(cli, "a.txt") == b"exp version\n" and cat(cli, "dir/b.txt") == b"exp version\n"
    fail(cli, 2, "merge", "demo", "exp", "main", match="already merged")
    fail(cli, 3, "merge", "demo", "nope", "main", match="nope")
    fail(cli, 3, "merge", "demo", "exp", "nobranch", match="nobranch")


def test_revert(demo, tmp_path) -> None:
    cli = demo
    f = tmp_path / "f"
    f.write_bytes(b"bad data\n")
    cli("put", "demo@main", "a.txt", str(f))
    cli("rm", "demo@main", "dir/b.txt")
    bad = cli("commit", "demo@main", "-m", "bad change").stdout.strip()
    r = cli("revert", "demo@main", bad)
    assert HEX64.match(r.stdout.strip())
    assert cat(cli, "a.txt") == FILES["a.txt"] and cat(cli, "dir/b.txt") == FILES["dir/b.txt"]
    assert cli("--json", "log", "demo@main", "-n", "1").json()[0]["message"].startswith(f"Revert {bad[:12]}")
    # Reverting the bad commit again conflicts: those paths changed since.
    r = fail(cli, 4, "revert", "demo@main", bad, match="changed since")
    assert "conflict: a.txt" in r.stderr
    first = cli("--json", "log", "demo@main").json()[-1]["id"]
    fail(cli, 2, "revert", "demo@main", first, match="first commit")
    fail(cli, 2, "revert", "demo@main", bad, "--parent", "2", match="parent")
    fail(cli, 3, "revert", "demo@main", "0123456789abcdef", match="no branch, tag or commit")


# -- maintenance ---------------------------------------------------------------


def test_fsck_gc_stats(demo, tmp_path) -> None:
    cli = demo
    r = cli("fsck")
    assert "no problems" in r.stdout
    report = cli("--json", "fsck").json()
    assert report["ok"] and report["commits"] == 2 and report["chunks"] > 0
    assert cli("--json", "fsck", "--fast").json()["ok"]
    stats = cli("--json", "stats").json()
    logical = sum(len(v) for v in FILES.values()) + len("a.txt")  # the symlink's size is its target's length
    assert stats["logical_bytes"] == logical
    assert 0 < stats["stored_bytes"] < logical  # c.bin compresses well
    assert "logical_bytes" in cli("stats").stdout
    # Garbage: a branch with its own data, deleted.
    f = tmp_path / "f"
    f.write_bytes(os.urandom(300_000))
    cli("branch", "create", "demo", "tmp", "--from", "main")
    cli("put", "demo@tmp", "junk", str(f))
    cli("commit", "demo@tmp", "-m", "junk")
    cli("branch", "delete", "demo", "tmp")
    assert cli("--json", "stats").json()["stored_bytes"] > 300_000
    dry = cli("--json", "gc", "--grace", "0", "--dry-run").json()
    assert dry["dry_run"] and dry["chunks_deleted"] > 0
    assert cli("--json", "stats").json()["stored_bytes"] > 300_000  # dry run removed nothing
    kept = cli("--json", "gc").json()  # default grace: everything is young, nothing goes
    assert kept["chunks_deleted"] == 0
    r = cli("gc", "--grace", "0")
    assert "removed" in r.stdout and "freed" in r.stdout
    assert cli("--json", "stats").json()["stored_bytes"] == stats["stored_bytes"]
    assert cli("--json", "fsck").json()["ok"]
    fail(cli, 2, "gc", "--grace", "soon")


# -- bad input changes nothing ----------------------------------------------------


def test_path_traversal_is_refused_and_changes_nothing(demo, tmp_path) -> None:
    cli = demo
    f = tmp_path / "payload"
    f.write_bytes(b"payload")
    before_head = head(cli)
    before_stats = cli("--json", "stats").json()
    # Through the real command, in a subprocess.
    fail(cli, 2, "put", "demo@main", "../x", str(f), match="invalid path")
    fail(cli, 2, "cat", "demo@main", "/etc/passwd", match="absolute paths are not allowed")
    fail(cli, 2, "cat", "demo@main", "../../../../etc/passwd", match="invalid path")
    fail(cli, 2, "rm", "demo@main", "../a.txt", match="invalid path")
    fail(cli, 2, "ls", "demo@main", "../", match="invalid path")
    fail(cli, 2, "export", "demo@main", str(tmp_path / "out"), "--prefix", "../..", match="invalid path")
    # The whole matrix through the same CLI code in-process (and NUL, which argv cannot carry).
    runner = CliRunner()

    def refused(*args: str, match: str = "invalid path") -> None:
        res = runner.invoke(fabric_group, ["--data", cli.data, *args])
        assert res.exit_code == 2, (args, res.exit_code, res.output)
        assert match in res.stderr and "Traceback" not in res.output, (args, res.output)

    bad_paths = ["../x", "../../etc/passwd", "/abs/path", "a/../b", "a//b", "./a", "dir/./b", "..", "x/..", "a\x00b", "/"]
    for bad in bad_paths:
        refused("put", "demo@main", bad, str(f))
        refused("rm", "demo@main", bad)
        refused("cat", "demo@main", bad)
        refused("stat", "demo@main", bad)
    refused("put", "demo@main", "x" * 256, str(f), match="255")
    refused("put", "demo@main", "d/" * 2049 + "x", str(f), match="4096")
    refused("cat", "demo@main", "a.txt\x00/etc/passwd", match="NUL")
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()
    assert cli("--json", "status", "demo@main").json() == []
    assert head(cli) == before_head
    assert cli("--json", "stats").json() == before_stats
    fail(cli, 2, "ls", "demo@main~x", match="invalid ref")


# -- help ------------------------------------------------------------------------

COMMANDS = [
    ["repo", "create"], ["repo", "list"], ["repo", "delete"], ["import"], ["export"], ["ls"], ["cat"], ["stat"],
    ["put"], ["rm"], ["status"], ["commit"], ["log"], ["diff"], ["branch", "create"], ["branch", "list"],
    ["branch", "delete"], ["branch", "reset"], ["tag", "create"], ["tag", "list"], ["tag", "delete"], ["merge"],
    ["revert"], ["fsck"], ["gc"], ["stats"], ["repo"], ["branch"], ["tag"],
]


def _command(path: list[str]) -> click.Command:
    cmd: click.Command = fabric_group
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help(path: list[str]) -> None:
    # In-process (the same click code the command runs); the subprocess path is covered below.
    r = CliRunner().invoke(fabric_group, [*path, "--help"], prog_name="fabric")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Usage: ") and " ".join(path) in r.stdout.splitlines()[0]
    cmd = _command(path)
    flat = " ".join(r.stdout.split())
    assert cmd.help and " ".join(cmd.help.split("\n\n")[0].split()) in flat
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert any(opt in r.stdout for opt in param.opts), f"{param.opts} missing from help"
            assert param.help, f"`fabric {' '.join(path)}` option {'/'.join(param.opts)} has no help text"
    assert "-h, --help" in r.stdout


def test_top_level_help_and_version(cli) -> None:
    assert cli("import", "--help").stdout.startswith("Usage: ")
    r = cli("--help")
    for name in ("repo", "import", "export", "ls", "cat", "stat", "put", "rm", "status", "commit", "log", "diff",
                 "branch", "tag", "merge", "revert", "fsck", "gc", "stats"):
        assert re.search(rf"^\s+{name}\s", r.stdout, re.MULTILINE), f"{name} missing from fabric --help"
    assert cli("--version").stdout.startswith("fabric")
    fail(cli, 2, "no-such-command", match="no such command")
