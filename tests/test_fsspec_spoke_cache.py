"""``fabric://`` beside its spoke (``spoke_cache=``, fabric/fsspec/beside.py): the chunks the
spoke's cache files hold are read from them, the rest over HTTP, and the spoke counts those
reads as its own and the job's. A real hub and spoke; the file system's traffic to the spoke
goes through a counting proxy."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator

import pytest

from testbed.wanproxy import WanProxy
from tests.hubserver import Hub, unique_name
from tests.spokeserver import Spoke, start_spoke, wait_for
from tests.test_corruption import flip
from tests.test_fsspec import new_fs
from tests.test_spoke_jobs import put_files

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
KiB = 1 << 10


@pytest.fixture
def spoke(hub: Hub, tmp_path) -> Iterator[Spoke]:
    with start_spoke(hub.url, tmp_path / "spoke-cache", "256MiB", token=hub.token) as s:
        yield s


def _publish(hub: Hub, files: dict[str, bytes]) -> str:
    repo = unique_name("beside")
    put_files(hub, repo, files)
    return repo


def test_reads_beside_a_warm_spoke_take_its_files_and_ask_it_only_for_what_they_lack(hub: Hub, spoke: Spoke, tmp_path) -> None:
    files = {f"d/f{i}.bin": os.urandom(3 * MiB + 777 * i) for i in range(3)}
    files["d/small.txt"] = b"tiny " * 1000
    repo = _publish(hub, files)
    warm = ["d/f0.bin", "d/f1.bin", "d/small.txt"]
    assert new_fs(spoke.url, hub.token).cat([f"{repo}/{p}" for p in warm]) == {f"{repo}/{p}": files[p] for p in warm}

    with WanProxy("127.0.0.1", int(spoke.url.rsplit(":", 1)[1])) as link:
        fs = new_fs(link.url_for(), hub.token, spoke_cache=str(tmp_path / "spoke-cache"), job="beside-job")
        reported = spoke.stats()["cache_local_reads"]
        before = link.stats().bytes_down
        with fs.open(f"{repo}/d/f0.bin", "rb") as f:
            f.seek(MiB + 5)
            assert f.read(100 * KiB) == files["d/f0.bin"][MiB + 5 : MiB + 5 + 100 * KiB]
            f.seek(0)
            assert f.read() == files["d/f0.bin"]
        got = fs.cat_ranges([f"{repo}/d/f1.bin", f"{repo}/d/small.txt"], [10, 0], [2 * MiB, None])
        assert got == [files["d/f1.bin"][10 : 2 * MiB], files["d/small.txt"]]
        warm_bytes = link.stats().bytes_down - before
        assert warm_bytes < 256 * KiB, f"{warm_bytes} bytes came over HTTP for chunks the spoke's files hold"

        # A file the spoke has never read comes over HTTP, whole and right.
        assert fs.cat_file(f"{repo}/d/f2.bin") == files["d/f2.bin"]
        assert link.stats().bytes_down - before - warm_bytes >= len(files["d/f2.bin"])

        # The spoke hears of the reads from its files, as reads of its cache and of the job.
        time.sleep(1.1)  # reports go once the oldest waited a second, at the next read
        assert fs.cat_file(f"{repo}/d/f1.bin", 0, 10) == files["d/f1.bin"][:10]
        whole = ["d/f0.bin", "d/small.txt"]  # (of f1, only the chunks of the range were read)
        chunks = sum(len(hub.plane().stat_chunks(repo, "main", p).chunks) for p in whole)
        wait_for(lambda: spoke.stats()["cache_local_reads"] - reported >= chunks)  # the reads reported
        job = spoke.stats()["jobs"]["beside-job"]
        read_beside = len(files["d/f0.bin"]) + 2 * MiB - 10 + len(files["d/small.txt"])
        assert job["hit_bytes"] >= read_beside
        assert job["demand_bytes"] >= read_beside + len(files["d/f2.bin"])


def test_a_batch_larger_than_the_files_held_open_at_once_is_read_in_turns(hub: Hub, spoke: Spoke, tmp_path, monkeypatch) -> None:
    import fabric.client.spoke_files

    monkeypatch.setattr(fabric.client.spoke_files, "OPEN_AT_ONCE", 3)
    data = os.urandom(2 * MiB + 11)
    repo = _publish(hub, {"y.bin": data})
    assert new_fs(spoke.url, hub.token).cat_file(f"{repo}/y.bin") == data
    with WanProxy("127.0.0.1", int(spoke.url.rsplit(":", 1)[1])) as link:
        fs = new_fs(link.url_for(), hub.token, spoke_cache=str(tmp_path / "spoke-cache"))
        assert fs.cat_file(f"{repo}/y.bin") == data  # (opens the connection and the reports' thread)
        fds = len(os.listdir("/proc/self/fd"))
        assert fs.cat_file(f"{repo}/y.bin") == data
        assert len(os.listdir("/proc/self/fd")) == fds  # every file opened was closed
        assert link.stats().bytes_down < 64 * KiB


def test_a_damaged_file_of_the_spokes_is_read_over_http_instead(hub: Hub, spoke: Spoke, tmp_path) -> None:
    data = os.urandom(2 * MiB + 3)
    repo = _publish(hub, {"x.bin": data})
    assert new_fs(spoke.url, hub.token).cat_file(f"{repo}/x.bin") == data
    cache = tmp_path / "spoke-cache"
    largest = max((p for p in (cache / "chunks").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    flip(str(largest), largest.stat().st_size // 2, 0xFF)
    with WanProxy("127.0.0.1", int(spoke.url.rsplit(":", 1)[1])) as link:
        fs = new_fs(link.url_for(), hub.token, spoke_cache=str(cache))
        assert fs.cat_file(f"{repo}/x.bin") == data
        assert link.stats().bytes_down >= largest.stat().st_size - 64  # that chunk, over HTTP


def _read_in_child(fs, path: str, want: bytes, out) -> None:  # noqa: ANN001 - a fork's target
    out.put(fs.cat_file(path) == want)
    time.sleep(1.1)
    fs.cat_file(path, 0, 1)  # sends the reports gathered
    time.sleep(0.5)


def test_a_forked_reader_reports_its_own_reads(hub: Hub, spoke: Spoke, tmp_path) -> None:
    """A DataLoader worker is a fork of the process that made the file system: its reads of the
    spoke's files reach the spoke from a reporting thread of its own."""
    data = os.urandom(MiB)
    repo = _publish(hub, {"w.bin": data})
    fs = new_fs(spoke.url, hub.token, spoke_cache=str(tmp_path / "spoke-cache"))
    assert fs.cat_file(f"{repo}/w.bin") == data  # warms the spoke (nothing in its files yet)
    reported = spoke.stats()["cache_local_reads"]
    out = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_read_in_child, args=(fs, f"{repo}/w.bin", data, out))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and out.get(timeout=5)
    assert spoke.stats()["cache_local_reads"] > reported


def test_a_directory_that_is_not_a_spokes_cache_is_refused(hub: Hub, tmp_path) -> None:
    with pytest.raises(ValueError, match="is not a spoke's cache directory"):
        new_fs(hub.url, hub.token, spoke_cache=str(tmp_path))
