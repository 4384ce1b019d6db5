"""Every client command of the ``fabric`` CLI against a remote hub (--server/--token, or the env)."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.hubserver import Hub, hub_env, unique_name


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


class RemoteCli:
    """``fabric`` in a subprocess, pointed at a hub through FABRIC_SERVER / FABRIC_TOKEN."""

    def __init__(self, hub: Hub, token: str | None, tmp) -> None:
        # --data points at an empty directory, so a command that wrongly ignored --server would fail.
        self.env = hub_env({"FABRIC_SERVER": hub.url, "FABRIC_DATA": str(tmp / "not-used")})
        self.env.pop("FABRIC_TOKEN", None)
        if token:
            self.env["FABRIC_TOKEN"] = token
        self.cwd = str(tmp)

    def __call__(self, *args: str, input: bytes | None = None, check: bool = True, env: dict | None = None) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "fabric.cli.main", "-q", *args],
            input=input,
            capture_output=True,
            env={**self.env, **(env or {})},
            cwd=self.cwd,
            timeout=300,
            check=False,
        )
        res = Result(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))
        if check and proc.returncode != 0:
            raise AssertionError(f"fabric {' '.join(args)} exited {proc.returncode}:\n{res.stderr}")
        return res


@pytest.fixture
def fab(hub: Hub, tmp_path) -> RemoteCli:
    return RemoteCli(hub, hub.token, tmp_path)


def make_tree(root, files: dict[str, bytes], mtime: int = 1_600_000_000) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.utime(p, (mtime, mtime))


def assert_same_tree(a, b) -> None:
    def listing(root):
        out = {}
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                full = os.path.join(dirpath, f)
                st = os.lstat(full)
                out[os.path.relpath(full, root)] = (st.st_size, st.st_mode & 0o777, st.st_mtime_ns)
        return out

    la, lb = listing(a), listing(b)
    assert la == lb
    for rel in la:
        assert filecmp.cmp(os.path.join(a, rel), os.path.join(b, rel), shallow=False), rel


def test_repo_create_list_delete(fab: RemoteCli, hub: Hub):
    name = unique_name("cli")
    out = fab("repo", "create", name, "--default-branch", "trunk")
    assert name in out.stdout and "trunk" in out.stdout
    listed = fab("--json", "repo", "list").json()
    assert {"name": name, "default_branch": "trunk"}.items() <= next(r for r in listed if r["name"] == name).items()
    assert name in fab("repo", "list").stdout
    # The hub really has it.
    with hub.client() as c:
        assert c.get(f"/api/v1/repos/{name}").json()["default_branch"] == "trunk"
    dup = fab("repo", "create", name, check=False)
    assert dup.returncode == 4 and name in dup.stderr and "already exists" in dup.stderr
    bad = fab("repo", "create", "Not_Valid", check=False)
    assert bad.returncode == 2 and "Not_Valid" in bad.stderr
    assert fab("repo", "delete", name, "--yes").returncode == 0
    gone = fab("repo", "delete", name, "--yes", check=False)
    assert gone.returncode == 3 and name in gone.stderr
    assert name not in fab("repo", "list").stdout


def test_flags_instead_of_env(hub: Hub, tmp_path):
    fab = RemoteCli(hub, None, tmp_path)
    fab.env.pop("FABRIC_SERVER")
    name = unique_name("flags")
    fab("--server", hub.url, "--token", hub.token, "repo", "create", name)
    assert name in fab("--server", hub.url, "--token", hub.token, "repo", "list").stdout
    # Without a token: 401 -> exit 5 with the hub's message.
    r = fab("--server", hub.url, "repo", "list", check=False)
    assert r.returncode == 5 and "Bearer" in r.stderr
    r = fab("--server", hub.url, "--token", "fab_000000000000_bad", "repo", "list", check=False)
    assert r.returncode == 5 and "unknown token" in r.stderr
    r = fab("--server", "http://127.0.0.1:9", "--token", "x", "repo", "list", check=False)
    assert r.returncode == 7 and "cannot reach" in r.stderr
    r = fab("--json", "--server", hub.url, "repo", "list", check=False)
    assert r.returncode == 5 and json.loads(r.stderr)["error"]["code"] == "unauthorized"


def test_import_export_roundtrip(fab: RemoteCli, tmp_path):
    repo = unique_name("imp")
    fab("repo", "create", repo)
    src = tmp_path / "src"
    files = {f"bin/{i}.dat": os.urandom(200_000 + i) for i in range(6)}
    files.update({f"txt/{i}.txt": (f"line {i}\n" * 3000).encode() for i in range(5)})
    files["empty"] = b""
    files["deep/a/b/c/d.txt"] = b"deep"
    make_tree(src, files)
    os.chmod(src / "bin/0.dat", 0o600)
    os.utime(src / "bin/0.dat", (1_650_000_000, 1_650_000_000))
    out = fab("import", str(src), f"{repo}@main", "-m", "v1")
    commit_id = out.stdout.strip()
    assert len(commit_id) == 64
    # Importing the same tree again changes nothing.
    assert "no changes" in fab("import", str(src), f"{repo}@main", "-m", "again").stdout
    res = fab("--json", "import", str(src), f"{repo}@main", "-m", "again").json()
    assert res["commit_id"] is None
    dest = tmp_path / "dest"
    out = fab("export", f"{repo}@main", str(dest))
    assert f"exported {len(files)} files" in out.stdout
    assert_same_tree(src, dest)
    # Export a commit id and a prefix.
    fab("export", f"{repo}@{commit_id[:12]}", str(tmp_path / "d2"), "--prefix", "txt")
    assert sorted(os.listdir(tmp_path / "d2")) == [f"{i}.txt" for i in range(5)]
    # Import under a prefix; --no-delete keeps what SRC lacks.
    (src / "txt/0.txt").unlink()
    fab("import", str(src), f"{repo}@main", "-m", "no-delete", "--no-delete")
    assert fab("cat", f"{repo}@main", "txt/0.txt").stdout.startswith("line 0")
    fab("import", str(src), f"{repo}@main", "-m", "mirror")
    assert fab("cat", f"{repo}@main", "txt/0.txt", check=False).returncode == 3
    fab("import", str(src / "txt"), f"{repo}@main", "--prefix", "copy/of", "-m", "prefixed")
    assert "copy/of/1.txt" in fab("ls", f"{repo}@main", "copy/of").stdout
    bad = fab("import", str(tmp_path / "nosuchdir"), f"{repo}@main", "-m", "x", check=False)
    assert bad.returncode != 0
    bad = fab("import", str(src), f"{repo}", "-m", "x", check=False)
    assert bad.returncode == 2 and "BRANCH" in bad.stderr


def test_objects_and_history_commands(fab: RemoteCli, tmp_path):
    repo = unique_name("hist")
    fab("repo", "create", repo)
    src = tmp_path / "src"
    make_tree(src, {"a.txt": b"alpha\n", "dir/b.txt": b"bravo\n", "dir/sub/c.txt": b"charlie\n"})
    c1 = fab("import", str(src), f"{repo}@main", "-m", "first").stdout.strip()

    # ls / cat / stat
    top = fab("--json", "ls", f"{repo}@main").json()
    assert [(r["path"], r["type"]) for r in top] == [("a.txt", "file"), ("dir/", "dir")]
    rec = fab("--json", "ls", f"{repo}@main", "-r").json()
    assert [r["path"] for r in rec] == ["a.txt", "dir/b.txt", "dir/sub/c.txt"]
    assert "dir/sub/" in fab("ls", f"{repo}@main", "dir").stdout
    assert [r["path"] for r in fab("--json", "ls", f"{repo}@main", "-r", "-n", "2").json()] == ["a.txt", "dir/b.txt"]
    assert fab("cat", f"{repo}@main", "dir/b.txt").stdout == "bravo\n"
    assert fab("cat", repo, "a.txt").stdout == "alpha\n"  # the default branch
    st = fab("--json", "stat", f"{repo}@main", "a.txt").json()
    assert st["size"] == 6 and st["type"] == "file" and st["etag"]
    assert "size: 6" in fab("stat", f"{repo}@main", "a.txt").stdout
    nf = fab("cat", f"{repo}@main", "nope.txt", check=False)
    assert nf.returncode == 3 and "nope.txt" in nf.stderr

    # put / rm / status / commit
    fab("put", f"{repo}@main", "new.txt", "-", input=b"from stdin")
    (tmp_path / "local.bin").write_bytes(b"\x00\x01" * 1000)
    assert "staged" in fab("put", f"{repo}@main", "dir/local.bin", str(tmp_path / "local.bin")).stdout
    fab("rm", f"{repo}@main", "dir/b.txt")
    status = fab("status", f"{repo}@main").stdout.splitlines()
    assert status == ["A dir/local.bin", "R dir/b.txt", "A new.txt"] or sorted(status) == sorted(
        ["A dir/local.bin", "R dir/b.txt", "A new.txt"]
    )
    assert fab("cat", f"{repo}@main", "new.txt").stdout == "from stdin"  # read-your-writes on the branch
    assert fab("cat", f"{repo}@{c1[:12]}", "new.txt", check=False).returncode == 3
    stale = fab("commit", f"{repo}@main", "-m", "x", "--expect-head", "0" * 64, check=False)
    assert stale.returncode == 4 and c1[:12] in stale.stderr
    c2 = fab("commit", f"{repo}@main", "-m", "second", "--meta", "k=v", "--author", "bob", "--expect-head", c1).stdout.strip()
    assert fab("status", f"{repo}@main").stdout.strip() == "nothing to commit"
    empty = fab("commit", f"{repo}@main", "-m", "nothing", check=False)
    assert empty.returncode == 2 and "nothing to commit" in empty.stderr
    fab("commit", f"{repo}@main", "-m", "empty", "--allow-empty")

    # log (paged, filtered) / diff
    log = fab("--json", "log", f"{repo}@main").json()
    assert [c["message"] for c in log][:3] == ["empty", "second", "first"]
    assert log[1]["id"] == c2 and log[1]["author"] == "bob" and log[1]["meta"] == {"k": "v"}
    assert [c["message"] for c in fab("--json", "log", f"{repo}@main", "-n", "1", "--after", c2).json()] == ["first"]
    assert [c["message"] for c in fab("--json", "log", f"{repo}@main", "--path", "new.txt").json()] == ["second"]
    assert "second" in fab("log", f"{repo}@main").stdout
    d = fab("--json", "diff", repo, c1, c2).json()
    assert {(x["path"], x["type"]) for x in d} == {("dir/b.txt", "removed"), ("dir/local.bin", "added"), ("new.txt", "added")}
    assert "- dir/b.txt" in fab("diff", repo, c1, c2).stdout
    assert fab("--json", "diff", repo, c1, c2, "--prefix", "dir/").json()[0]["path"].startswith("dir/")

    # branch create/list/delete/reset, merge, tag, revert
    fab("branch", "create", repo, "exp", "--from", "main")
    assert {b["name"] for b in fab("--json", "branch", "list", repo).json()} == {"main", "exp"}
    fab("put", f"{repo}@exp", "exp.txt", "-", input=b"experiment")
    c3 = fab("commit", f"{repo}@exp", "-m", "exp work").stdout.strip()
    merged = fab("--json", "merge", repo, "exp", "main", "-m", "merge exp").json()
    assert merged["message"] == "merge exp" and c3 in merged["parents"]
    assert fab("cat", f"{repo}@main", "exp.txt").stdout == "experiment"
    again = fab("merge", repo, "exp", "main", check=False)
    assert again.returncode == 2 and "already merged" in again.stderr
    # A conflicting merge lists the paths and exits 4.
    fab("put", f"{repo}@main", "a.txt", "-", input=b"main version")
    fab("commit", f"{repo}@main", "-m", "main edit")
    fab("put", f"{repo}@exp", "a.txt", "-", input=b"exp version")
    fab("commit", f"{repo}@exp", "-m", "exp edit")
    conflict = fab("merge", repo, "exp", "main", check=False)
    assert conflict.returncode == 4 and "conflict: a.txt" in conflict.stderr
    fab("merge", repo, "exp", "main", "--strategy", "ours")
    assert fab("cat", f"{repo}@main", "a.txt").stdout == "main version"
    fab("tag", "create", repo, "v1", "main")
    assert fab("--json", "tag", "list", repo).json()[0]["name"] == "v1"
    assert fab("cat", f"{repo}@v1", "a.txt").stdout == "main version"
    dup = fab("tag", "create", repo, "v1", "main", check=False)
    assert dup.returncode == 4 and "v1" in dup.stderr
    fab("tag", "delete", repo, "v1")
    assert fab("--json", "tag", "list", repo).json() == []
    rev = fab("--json", "revert", f"{repo}@main", c2).json()
    assert rev["message"].startswith(f"Revert {c2[:12]}")
    assert fab("cat", f"{repo}@main", "dir/b.txt").stdout == "bravo\n"
    assert fab("cat", f"{repo}@main", "new.txt", check=False).returncode == 3
    reset = fab("--json", "branch", "reset", repo, "exp", "--to", c1).json()
    assert reset["commit_id"] == c1
    fab("branch", "delete", repo, "exp")
    assert [b["name"] for b in fab("--json", "branch", "list", repo).json()] == ["main"]
    nob = fab("branch", "delete", repo, "exp", check=False)
    assert nob.returncode == 3 and "exp" in nob.stderr


def test_maintenance_commands(fab: RemoteCli, tmp_path):
    repo = unique_name("maint")
    fab("repo", "create", repo)
    fab("put", f"{repo}@main", "x.bin", "-", input=os.urandom(100_000))
    fab("commit", f"{repo}@main", "-m", "x")
    report = fab("--json", "fsck").json()
    assert report["ok"] is True and report["chunks"] >= 1
    assert "no problems" in fab("fsck", "--fast").stdout
    gc = fab("--json", "gc", "--dry-run").json()
    assert {"chunks_deleted", "packs_deleted", "bytes_freed"} <= set(gc)
    assert "would remove" in fab("gc", "--dry-run", "--grace", "3600").stdout
    fab("gc")
    stats = fab("--json", "stats").json()
    assert stats["logical_bytes"] >= 100_000 and stats["stored_bytes"] >= 100_000
    assert "logical_bytes" in fab("stats").stdout
    # The data survived gc.
    assert len(fab("cat", f"{repo}@main", "x.bin").stdout.encode("utf-8", "surrogateescape")) > 0


def test_token_commands(fab: RemoteCli, hub: Hub, tmp_path):
    repo = unique_name("tok")
    fab("repo", "create", repo)
    created = fab("--json", "token", "create", "--repo", repo, "--role", "read", "--name", "cli-reader").json()
    assert created["token"].startswith("fab_") and created["s3_access_key_id"] and created["s3_secret_access_key"]
    plain = fab("token", "create", "--repo", repo, "--role", "write").stdout.strip()
    assert plain.startswith("fab_") and "\n" not in plain
    admin_tok = fab("token", "create", "--admin", "--name", "ops").stdout.strip()
    listed = fab("--json", "token", "list").json()
    row = next(t for t in listed if t["id"] == created["id"])
    assert row["name"] == "cli-reader" and row["roles"] == {repo: "read"} and row["revoked"] is False
    assert created["token"] not in json.dumps(listed)
    assert "cli-reader" in fab("token", "list").stdout
    # whoami with each token.
    reader = RemoteCli(hub, created["token"], tmp_path)
    me = reader("--json", "token", "whoami").json()
    assert me["name"] == "cli-reader" and me["roles"] == {repo: "read"} and me["admin"] is False
    assert "cli-reader" in reader("token", "whoami").stdout
    assert RemoteCli(hub, admin_tok, tmp_path)("--json", "token", "whoami").json()["admin"] is True
    # The reader reads but cannot write (exit 5, the hub's message), and cannot manage tokens.
    assert reader("--json", "ls", f"{repo}@main").json() == []
    denied = reader("put", f"{repo}@main", "x", "-", input=b"x", check=False)
    assert denied.returncode == 5 and "cli-reader" in denied.stderr and repo in denied.stderr
    denied = reader("token", "list", check=False)
    assert denied.returncode == 5 and "administrator" in denied.stderr
    writer = RemoteCli(hub, plain, tmp_path)
    writer("put", f"{repo}@main", "w", "-", input=b"w")
    writer("commit", f"{repo}@main", "-m", "by writer")
    # Revoke.
    assert created["id"] in fab("token", "revoke", created["id"]).stdout
    gone = reader("ls", f"{repo}@main", check=False)
    assert gone.returncode == 5 and "revoked" in gone.stderr
    again = fab("token", "revoke", created["id"], check=False)
    assert again.returncode == 3 and created["id"] in again.stderr
    assert next(t for t in fab("--json", "token", "list").json() if t["id"] == created["id"])["revoked"] is True
    usage = fab("token", "create", "--repo", repo, check=False)
    assert usage.returncode == 2 and "--role" in usage.stderr
    # Token commands need a server.
    local = fab("token", "list", check=False, env={"FABRIC_SERVER": ""})
    assert local.returncode != 0 and "--server" in local.stderr
