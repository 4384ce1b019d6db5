"""``fabric export --delete`` and ``--dry-run``: DEST becomes exactly REPO@REF, as with
``rsync -a --delete``, removing nothing outside DEST and following no link; a dry run
lists what would be written and removed and changes nothing (``fabric/client/destdir.py``
``DestDir.prune``, ``fabric/client/transfer.py``)."""

from __future__ import annotations

import os

from tests.helpers.fstree import write_file

MTIME = 1_700_000_000_000_000_000


def listing(tree) -> dict[str, str]:
    """Every path under ``tree``: 'dir', 'link' or the file's bytes as text (links not followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, tree)
            out[rel] = "link" if os.path.islink(path) else "dir" if os.path.isdir(path) else open(path).read()
    return out


def versions(cli, tmp_path) -> str:
    """Repository ``mirror`` with v1 (main~1) and v2 (main): a file renamed, one removed,
    one changed, a directory gone, a file where v1 had a directory."""
    src = tmp_path / "src"
    v1 = {"keep.txt": "keep\n", "old-name.txt": "moved\n", "gone.txt": "gone\n", "edit.txt": "v1\n", "dir/a.txt": "a\n", "was-dir/x.txt": "x\n"}
    for path, text in v1.items():
        write_file(str(src / path), text.encode(), 0o644, MTIME)
    cli("repo", "create", "mirror")
    cli("import", str(src), "mirror@main", "-m", "v1")
    os.rename(src / "old-name.txt", src / "new-name.txt")
    os.unlink(src / "gone.txt")
    write_file(str(src / "edit.txt"), b"v2, longer\n", 0o644, MTIME + 1)
    for name in os.listdir(src / "dir"):
        os.unlink(src / "dir" / name)
    os.rmdir(src / "dir")
    os.unlink(src / "was-dir" / "x.txt")
    os.rmdir(src / "was-dir")
    write_file(str(src / "was-dir"), b"now a file\n", 0o644, MTIME)
    cli("import", str(src), "mirror@main", "-m", "v2")
    return str(src)


V2 = {"keep.txt": "keep\n", "new-name.txt": "moved\n", "edit.txt": "v2, longer\n", "was-dir": "now a file\n"}


def test_an_export_with_delete_makes_dest_exactly_the_version(cli, tmp_path):
    versions(cli, tmp_path)
    stale = tmp_path / "stale"
    cli("export", "mirror@main~1", str(stale))
    without = cli("export", "mirror@main", str(stale), check=False)
    assert without.returncode == 4 and "--delete" in without.stderr  # was-dir/ is in the way

    dest = tmp_path / "dest"
    cli("export", "mirror@main~1", str(dest))
    write_file(str(dest / "dir" / "mine.txt"), b"a local file\n")

    r = cli("--json", "export", "mirror@main", str(dest), "--delete").json()
    assert listing(dest) == V2
    assert r["deleted"] == ["dir", "gone.txt", "old-name.txt", "was-dir"]
    assert r["unchanged"] == 1  # keep.txt was not read again

    again = cli("--json", "export", "mirror@main", str(dest), "--delete").json()
    assert again["deleted"] == [] and again["unchanged"] == len(V2)


def test_a_dry_run_lists_what_would_change_and_changes_nothing(cli, tmp_path):
    versions(cli, tmp_path)
    dest = tmp_path / "dest"
    cli("export", "mirror@main~1", str(dest))
    before = listing(dest)
    r = cli("export", "mirror@main", str(dest), "--delete", "-n")
    assert r.stdout.splitlines() == [
        "write edit.txt",
        "write new-name.txt",
        "write was-dir",
        "delete dir",
        "delete gone.txt",
        "delete old-name.txt",
        "delete was-dir",
    ]
    assert "nothing was changed" in r.stderr
    assert listing(dest) == before
    plan = cli("--json", "export", "mirror@main", str(dest), "--dry-run").json()
    assert plan["dry_run"] is True and plan["deleted"] == []  # without --delete nothing would go
    fresh = tmp_path / "never-made"
    assert cli("--json", "export", "mirror@main", str(fresh), "-n").json()["to_write"] == sorted(V2)
    assert not os.path.lexists(fresh)


def test_delete_removes_links_and_never_what_they_point_to(cli, tmp_path):
    versions(cli, tmp_path)
    outside = tmp_path / "outside"
    write_file(str(outside / "precious.txt"), b"precious\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "link-to-dir")
    os.symlink(outside / "precious.txt", dest / "link-to-file")
    os.symlink(outside, dest / "keep.txt")  # a link where the version has a file
    (dest / "deep" / "er").mkdir(parents=True)
    os.symlink(outside, dest / "deep" / "er" / "inner-link")

    r = cli("--json", "export", "mirror@main", str(dest), "--delete").json()
    assert listing(dest) == V2
    assert r["deleted"] == ["deep", "link-to-dir", "link-to-file"]
    assert listing(outside) == {"precious.txt": "precious\n"}


def test_a_dest_that_is_a_link_to_a_directory_is_pruned_inside_that_directory(cli, tmp_path):
    versions(cli, tmp_path)
    real = tmp_path / "real"
    write_file(str(real / "stale.txt"), b"stale\n")
    os.symlink(real, tmp_path / "dest")
    cli("export", "mirror@main", str(tmp_path / "dest"), "--delete")
    assert listing(real) == V2


def test_excluded_paths_are_neither_written_nor_removed(cli, tmp_path):
    versions(cli, tmp_path)
    dest = tmp_path / "dest"
    write_file(str(dest / "notes" / "mine.txt"), b"local notes\n")
    write_file(str(dest / "scratch.tmp"), b"scratch\n")
    r = cli("--json", "export", "mirror@main", str(dest), "--delete", "--exclude", "notes/", "--exclude", "*.tmp", "--exclude", "edit.txt").json()
    assert r["deleted"] == []
    assert listing(dest) == {**{k: v for k, v in V2.items() if k != "edit.txt"}, "notes": "dir", "notes/mine.txt": "local notes\n", "scratch.tmp": "scratch\n"}

    cli("export", "mirror@main", str(dest), "--delete", "--exclude", "notes/", "--exclude", "*.tmp", "--delete-excluded")
    assert listing(dest) == V2


def test_includes_choose_what_is_written_and_what_delete_may_remove(cli, tmp_path):
    versions(cli, tmp_path)
    dest = tmp_path / "dest"
    write_file(str(dest / "mine.log"), b"local\n")
    rules = ["--include", "*/", "--include", "*.txt", "--exclude", "*"]
    r = cli("--json", "export", "mirror@main", str(dest), "--delete", *rules).json()
    # was-dir is a file in v2 with no .txt name: left out, and mine.log is kept as excluded.
    assert listing(dest) == {"keep.txt": "keep\n", "new-name.txt": "moved\n", "edit.txt": "v2, longer\n", "mine.log": "local\n"}
    assert r["deleted"] == []
    cli("export", "mirror@main", str(dest), "--delete", "--exclude", "*", *rules, "--delete-excluded")
    assert listing(dest) == {}  # the exclude comes first: everything is left out, and removed


def test_delete_excluded_without_delete_is_refused(cli, tmp_path):
    versions(cli, tmp_path)
    r = cli("export", "mirror@main", str(tmp_path / "dest"), "--exclude", "*.tmp", "--delete-excluded", check=False)
    assert r.returncode == 2 and "--delete" in r.stderr
    assert not (tmp_path / "dest").exists()
