"""``fabric export --checksum``: a file DEST holds with the right size but another time or mode is
read and compared chunk by chunk; the same content is kept (only its time and mode set), other
content is written again, and no link is followed (``fabric/client/transfer.py``)."""

from __future__ import annotations

import os

from fabric.client.transfer import export_tree, import_directory
from fabric.util.progress import Progress
from tests.helpers.fstree import write_file

MTIME = 1_700_000_000_000_000_000
FILES = {"big.bin": os.urandom(10 << 20), "small.txt": b"small\n", "dir/mid.bin": os.urandom(300_000)}


def exported(cli, tmp_path):
    src = tmp_path / "src"
    for path, data in FILES.items():
        write_file(str(src / path), data, 0o644, MTIME)
    cli("repo", "create", "sums")
    cli("import", str(src), "sums@main", "-m", "v1")
    dest = tmp_path / "dest"
    cli("export", "sums@main", str(dest))
    return dest


def inodes(dest) -> dict[str, int]:
    return {path: os.lstat(dest / path).st_ino for path in FILES}


def test_files_whose_times_were_lost_are_checked_not_fetched(cli, tmp_path):
    dest = exported(cli, tmp_path)
    before = inodes(dest)
    for path in FILES:
        os.utime(dest / path)  # a copy without -p: today's time
    os.chmod(dest / "small.txt", 0o600)

    r = cli("--json", "export", "sums@main", str(dest), "--checksum").json()
    assert (r["verified"], r["unchanged"]) == (3, 3)
    assert inodes(dest) == before, "no file was written again"
    for path, data in FILES.items():
        st = os.stat(dest / path)
        assert (st.st_mtime_ns, st.st_mode & 0o777) == (MTIME, 0o644)
        assert (dest / path).read_bytes() == data

    for path in FILES:
        os.utime(dest / path)
    plain = cli("--json", "export", "sums@main", str(dest)).json()
    assert plain["verified"] == 0 and plain["unchanged"] == 0
    assert all(inodes(dest)[p] != before[p] for p in FILES), "without --checksum the quick check writes them again"


def test_other_bytes_of_the_same_size_are_written_again(cli, tmp_path):
    dest = exported(cli, tmp_path)
    with open(dest / "big.bin", "r+b") as f:
        f.seek(5 << 20)
        f.write(b"\0" if FILES["big.bin"][5 << 20] else b"\1")
    os.utime(dest / "big.bin")
    os.utime(dest / "small.txt")

    plan = cli("export", "sums@main", str(dest), "--checksum", "--dry-run")
    assert plan.stdout.splitlines() == ["write big.bin"]
    assert os.stat(dest / "small.txt").st_mtime_ns != MTIME, "a dry run sets no time"

    r = cli("--json", "export", "sums@main", str(dest), "--checksum").json()
    assert r["verified"] == 1  # small.txt
    assert (dest / "big.bin").read_bytes() == FILES["big.bin"]


def test_a_link_in_dest_is_never_read_through(cli, tmp_path):
    dest = exported(cli, tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(FILES["dir/mid.bin"])  # the same bytes, outside DEST
    os.unlink(dest / "dir" / "mid.bin")
    os.symlink(outside, dest / "dir" / "mid.bin")
    r = cli("--json", "export", "sums@main", str(dest), "--checksum").json()
    assert r["verified"] == 0
    assert not os.path.islink(dest / "dir" / "mid.bin") and (dest / "dir" / "mid.bin").read_bytes() == FILES["dir/mid.bin"]
    assert os.stat(outside).st_mtime_ns != MTIME, "the link's target was not touched"


class Recorded(Progress):
    def __init__(self) -> None:
        self.started: list[tuple] = []
        self.advanced = 0

    def start(self, total, unit="B", desc=""):  # noqa: ANN001, ANN201 - Progress's signature
        self.started.append((total, unit, desc))

    def advance(self, n=1):  # noqa: ANN001, ANN201
        self.advanced += n


def test_the_files_read_are_shown_as_progress(sqlite_engine, tmp_path):
    src = tmp_path / "src"
    for path, data in FILES.items():
        write_file(str(src / path), data, 0o644, MTIME)
    sqlite_engine.create_repo("progress")
    import_directory(sqlite_engine, str(src), "progress", "main", "v1")
    dest = tmp_path / "dest"
    export_tree(sqlite_engine, "progress", "main", str(dest))
    os.utime(dest / "big.bin")
    seen = Recorded()
    result = export_tree(sqlite_engine, "progress", "main", str(dest), checksum=True, progress=seen)
    assert result.verified == 1
    assert (None, "B", "checking files by content") in seen.started
    assert seen.advanced >= len(FILES["big.bin"])
