"""``fabric export`` into a directory that already holds the tree (issue 18).

A file the destination holds with the entry's size, mode and mtime is not read
again (rsync's quick check); anything else at its path is written, never
followed. The files to read are fetched many chunks per request, and their order
is sent to the server as a loader hint, best effort. The library tests count
what the plane is asked for; the server tests count what a real hub and spoke
served (their ``/metrics`` and ``/api/v1/stats``).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest

from fabric.client import transfer
from fabric.client.transfer import export_tree
from fabric.errors import BadRequest, Conflict
from fabric.plane.wrapper import PlaneWrapper
from tests.helpers.fstree import write_file
from tests.hubserver import ROOT, Hub, metric_value, unique_name
from tests.spokeserver import Spoke, random_bytes, start_spoke

MiB = 1 << 20


class Counting(PlaneWrapper):
    """Counts the calls of each method, keeps the hints; ``refuse_hints``: a hint raises BadRequest."""

    def __init__(self, inner, refuse_hints: bool = False) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.chunks_asked = 0
        self.hints: list[list[str]] = []
        self.refuse_hints = refuse_hints

    def around(self, name, call, args, kwargs):
        self.calls[name] += 1
        if name == "frames":
            self.chunks_asked += len(args[0])
        if name == "hint":
            self.hints.append(list(args[2]))
            if self.refuse_hints:
                raise BadRequest("no hints here")
        return call(*args, **kwargs)


@pytest.fixture
def tree(sqlite_engine, tmp_path) -> tuple[str, dict[str, bytes]]:
    """Repository ``demo@main``: files of several sizes, one larger than an export window."""
    src = tmp_path / "src"
    files = {
        "a.txt": b"alpha\n",
        "empty": b"",
        "d/b.bin": random_bytes(300_000, 1),
        "d/e/c.bin": random_bytes(200_000, 2),
        "big.bin": random_bytes(transfer.EXPORT_WINDOW * 2 + 12345, 3),
    }
    for rel, data in files.items():
        write_file(str(src / rel), data)
    os.chmod(src / "a.txt", 0o600)
    sqlite_engine.create_repo("demo")
    transfer.import_directory(sqlite_engine, str(src), "demo", "main", "v1")
    return "demo", files


def _contents(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def test_a_second_export_of_an_unchanged_tree_reads_nothing(sqlite_engine, tree, tmp_path) -> None:
    repo, files = tree
    dest = tmp_path / "dest"
    first = export_tree(Counting(sqlite_engine), repo, "main", str(dest))
    assert _contents(dest) == files and first.unchanged == 0 and first.files == len(files)

    plane = Counting(sqlite_engine)
    again = export_tree(plane, repo, "main", str(dest), job="export:again")
    assert again.unchanged == len(files) and again.unchanged_bytes == sum(map(len, files.values()))
    assert again.files == len(files) and again.bytes == again.unchanged_bytes
    assert plane.calls["frames"] == 0 and plane.calls["stat_chunks"] == 0 and plane.calls["open_file"] == 0
    assert plane.hints == [], "nothing to read: no hint"
    assert _contents(dest) == files

    forced = Counting(sqlite_engine)
    result = export_tree(forced, repo, "main", str(dest), rewrite=True)
    assert result.unchanged == 0 and forced.calls["frames"] > 0
    assert _contents(dest) == files


def test_a_changed_file_of_the_same_size_is_rewritten_when_its_mtime_or_mode_differs(sqlite_engine, tree, tmp_path) -> None:
    repo, files = tree
    dest = tmp_path / "dest"
    export_tree(sqlite_engine, repo, "main", str(dest))
    b, c, a = dest / "d" / "b.bin", dest / "d" / "e" / "c.bin", dest / "a.txt"
    st = os.stat(b)
    b.write_bytes(bytes(len(files["d/b.bin"])))  # same size, other bytes, a new mtime
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    # Same size and mtime, other bytes: the quick check cannot see it (as rsync without -c).
    st_c = os.stat(c)
    c.write_bytes(bytes(len(files["d/e/c.bin"])))
    os.utime(c, ns=(st_c.st_atime_ns, st_c.st_mtime_ns))
    os.chmod(a, 0o644)  # only the mode differs

    plane = Counting(sqlite_engine)
    result = export_tree(plane, repo, "main", str(dest), job="export:one")
    assert b.read_bytes() == files["d/b.bin"] and os.stat(b).st_mtime_ns == st.st_mtime_ns
    assert a.read_bytes() == files["a.txt"] and os.stat(a).st_mode & 0o777 == 0o600
    assert c.read_bytes() == bytes(len(files["d/e/c.bin"]))
    assert result.unchanged == len(files) - 2
    assert plane.hints == [["a.txt", "d/b.bin"]], "the hint names exactly the files read, in order"

    export_tree(sqlite_engine, repo, "main", str(dest), rewrite=True)
    assert c.read_bytes() == files["d/e/c.bin"]


def test_an_edited_file_fetches_only_the_chunks_its_old_version_lacks(sqlite_engine, tree, tmp_path) -> None:
    repo, files = tree
    dest, src = tmp_path / "dest", tmp_path / "src"
    export_tree(sqlite_engine, repo, "main", str(dest))
    edited = bytearray(files["d/b.bin"])
    edited[150_000:150_010] = b"0123456789"
    (src / "d" / "b.bin").write_bytes(bytes(edited))
    transfer.import_directory(sqlite_engine, str(src), repo, "main", "v2")
    chunks = sqlite_engine.stat_chunks(repo, "main", "d/b.bin").chunks
    assert len(chunks) >= 3

    plane = Counting(sqlite_engine)
    result = export_tree(plane, repo, "main", str(dest))
    assert (dest / "d" / "b.bin").read_bytes() == bytes(edited) and result.unchanged == len(files) - 1
    assert 1 <= plane.chunks_asked <= 2 < len(chunks), "the chunks the old file holds are not fetched"


def test_what_is_not_a_regular_file_is_replaced_whatever_its_size_and_time(sqlite_engine, tree, tmp_path) -> None:
    repo, files = tree
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    export_tree(sqlite_engine, repo, "main", str(dest))
    mtime = os.stat(dest / "a.txt").st_mtime_ns
    # A symlink whose own size (its target's length) and time are the entry's, to a file
    # outside DEST with the entry's size and time: neither is taken for the file.
    write_file(str(outside / "victim"), b"x" * len(files["a.txt"]))
    os.utime(outside / "victim", ns=(mtime, mtime))
    target = str(outside / "victim")
    os.unlink(dest / "a.txt")
    os.symlink(target, dest / "a.txt")
    os.utime(dest / "a.txt", ns=(mtime, mtime), follow_symlinks=False)
    result = export_tree(sqlite_engine, repo, "main", str(dest))
    assert not os.path.islink(dest / "a.txt") and (dest / "a.txt").read_bytes() == files["a.txt"]
    assert (outside / "victim").read_bytes() == b"x" * len(files["a.txt"]), "the link was followed"
    assert result.unchanged == len(files) - 1

    # A directory where the tree has a file: a Conflict, never taken for the file.
    os.unlink(dest / "empty")
    os.mkdir(dest / "empty")
    with pytest.raises(Conflict):
        export_tree(sqlite_engine, repo, "main", str(dest))
    assert os.path.isdir(dest / "empty")


def test_a_refused_hint_does_not_fail_the_export(sqlite_engine, tree, tmp_path) -> None:
    repo, files = tree
    plane = Counting(sqlite_engine, refuse_hints=True)
    result = export_tree(plane, repo, "main", str(tmp_path / "dest"), job="export:x")
    assert plane.calls["hint"] == 1 and sorted(plane.hints[0]) == sorted(files)
    assert _contents(tmp_path / "dest") == files and result.unchanged == 0


def test_a_destination_that_is_a_file_is_refused_and_left_alone(sqlite_engine, tree, tmp_path) -> None:
    repo, _ = tree
    dest = tmp_path / "dest"
    dest.write_bytes(b"keep")
    with pytest.raises(BadRequest, match="not a directory"):
        export_tree(sqlite_engine, repo, "main", str(dest))
    assert dest.read_bytes() == b"keep"


def test_large_files_stream_in_windows_with_bounded_reads_ahead(sqlite_engine, tree, tmp_path, monkeypatch) -> None:
    """A file of many windows is asked for one window per frames call, never all at once."""
    repo, files = tree
    monkeypatch.setattr(transfer, "EXPORT_AHEAD", 1)
    plane = Counting(sqlite_engine)
    export_tree(plane, repo, "main", str(tmp_path / "dest"))
    assert _contents(tmp_path / "dest") == files
    windows = -(-len(files["big.bin"]) // transfer.EXPORT_WINDOW)
    assert plane.calls["frames"] >= windows + 1  # the big file's windows, and the small files'


# -- real servers ------------------------------------------------------------------------
def _fabric(server: str, token: str, *args: str, job: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("FABRIC_JOB", None)
    if job is not None:
        env["FABRIC_JOB"] = job
    proc = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "--server", server, "--token", token, "-q", "--json", *args],
        capture_output=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


@pytest.fixture
def served(hub: Hub) -> tuple[str, dict[str, bytes]]:
    repo = unique_name("export")
    plane = hub.plane()
    plane.create_repo(repo)
    files = {f"d{i % 3}/{i:03d}.bin": random_bytes(200_000 + i, 500 + i) for i in range(24)}
    for path, data in files.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    plane.commit(repo, "main", "data")
    return repo, files


@pytest.fixture
def spoke(hub: Hub, tmp_path) -> Iterator[Spoke]:
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as s:
        yield s


def _frames_served(server) -> float:
    return sum(
        metric_value(server.metrics(), "fabric_http_requests_total", route=route)
        for route in ("/api/v1/chunks/frames",)
    )


def test_through_a_spoke_the_order_is_hinted_and_a_second_export_fetches_nothing(hub: Hub, spoke: Spoke, served, tmp_path) -> None:
    repo, files = served
    total = sum(map(len, files.values()))
    dest = tmp_path / "dest"
    got = _fabric(spoke.url, hub.token, "export", f"{repo}@main", str(dest), job="export-test-1")
    assert _contents(dest) == files and got["unchanged"] == 0 and got["files"] == len(files)
    job = spoke.stats()["jobs"]["export-test-1"]
    assert job["prefetch"]["hint"]["prefetched_bytes"] > 0, "the spoke fetched ahead along the hinted order"
    assert job["demand_bytes"] == total

    before = spoke.stats()
    again = _fabric(spoke.url, hub.token, "export", f"{repo}@main", str(dest), job="export-test-2")
    after = spoke.stats()
    assert again["unchanged"] == len(files) and again["unchanged_bytes"] == total
    assert after["upstream_bytes_received"] - before["upstream_bytes_received"] < 64 * 1024  # metadata at most
    assert after["cache_hit_bytes"] == before["cache_hit_bytes"] and after["cache_miss_bytes"] == before["cache_miss_bytes"]
    assert "export-test-2" not in after["jobs"], "no chunk was read for the second export"


def test_straight_from_a_hub_that_only_checks_hints(hub: Hub, served, tmp_path) -> None:
    repo, files = served
    dest = tmp_path / "dest"
    first = _frames_served(hub)
    got = _fabric(hub.url, hub.token, "export", f"{repo}@main", str(dest))
    assert _contents(dest) == files and got["unchanged"] == 0
    middle = _frames_served(hub)
    assert 0 < middle - first < len(files), "several files' chunks per frames request"

    (dest / "d0/000.bin").write_bytes(b"changed")
    again = _fabric(hub.url, hub.token, "export", f"{repo}@main", str(dest))
    assert again["unchanged"] == len(files) - 1 and _contents(dest) == files
    assert _frames_served(hub) - middle == 1, "only the changed file was read"
