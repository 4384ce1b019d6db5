"""``fabric mount --writeback`` (fuse/writeback.py, fuse/journal.py): fsync and close return
once the file is on the mount's disk, the file is staged in the background, a killed mount's
parked files are taken over by the next mount of its write directory (served at once, staged
in the background), and a full backlog slows the writer instead."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from fabric.util.progress import Progress
from fuse.flush import flush_journal
from fuse.journal import Journal, Record
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import fabric, mount_log, mount_to_kill, mounted, needs_fuse
from tests.hubserver import ROOT, unique_name
from tests.spokeserver import start_restartable_hub, wait_for


def _records(write_dir) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(write_dir, "writeback")) if n.endswith(".json"))


def _timed_fsync_and_close(f) -> float:
    t0 = time.monotonic()
    f.flush()
    os.fsync(f.fileno())
    f.close()
    return time.monotonic() - t0


def _save(path: str, data: bytes) -> None:
    """Write ``path`` afresh with ``data``, fsync and close it (a checkpoint's save)."""
    with open(path, "wb") as f:
        f.write(data)
        _timed_fsync_and_close(f)


def _resave_partly(path: str, partial: bytes):
    """Open ``path`` again for writing (truncating it) and write ``partial``: the next save, under
    way; the file, still open (for :func:`_kill_with_open`)."""
    half = open(path, "wb")  # noqa: SIM115 - open until the mount is killed
    half.write(partial)
    half.flush()
    return half


def _kill_with_open(pid: int, f) -> None:
    """kill -9 of the mount ``pid`` while ``f``, a file in it, is open."""
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):  # (its mount is gone)
        f.close()


# -- the journal on its own ----------------------------------------------------------------
def _record(rid: str, path: str, branch: str = "main") -> Record:
    return Record(rid, "repo", branch, path, 0o644, 0, 0, 1, 1, {})


def test_journal_keeps_whole_records_and_drops_leftovers(tmp_path):
    journal = Journal(str(tmp_path))
    fd = os.open(tmp_path, os.O_RDWR | os.O_TMPFILE, 0o600)
    os.write(fd, b"parked bytes")
    journal.link("a", fd)
    journal.write(_record("a", "x/a.bin"), durable=True)
    os.write(fd, b" and more")  # (the record's data is the file itself, not a copy)
    os.close(fd)
    wb = tmp_path / "writeback"
    (wb / "orphan.data").write_bytes(b"a fsync that never returned")
    (wb / "half.json.tmp").write_text("{")
    (wb / "bad.json").write_text("not json")
    (wb / "bad.data").write_bytes(b"")
    (wb / "nodata.json").write_text('{"repo": "r", "branch": "b", "path": "p", "mode": 420, "uid": 0, "gid": 0, "mtime_ns": 1, "ctime_ns": 1}')

    records = journal.records()

    assert [(r.id, r.path) for r in records] == [("a", "x/a.bin")]
    assert open(journal.data_path("a"), "rb").read() == b"parked bytes and more"
    assert sorted(os.listdir(wb)) == ["a.data", "a.json", "bad.data", "bad.json"]  # (bad: left for a person)
    journal.drop("a")
    assert journal.records() == []
    journal.close()


def test_a_second_process_on_one_write_dir_is_refused_with_the_holder(tmp_path):
    def second() -> subprocess.CompletedProcess:
        code = f"from fuse.journal import Journal; Journal({str(tmp_path)!r})"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)

    first = Journal(str(tmp_path))
    refused = second()
    assert refused.returncode != 0 and f"is in use by process {os.getpid()}" in refused.stderr, refused.stderr
    first.close()
    assert second().returncode == 0  # free again once the first is closed


# -- mounts ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _hub_with_repo(tmp_path) -> Iterator[tuple]:
    """A hub the test may kill and start again, and a new repository on it."""
    with start_restartable_hub(tmp_path / "hub") as hub:
        plane = hub.plane()
        repo = unique_name("wb")
        plane.create_repo(repo)
        yield hub, plane, repo


@needs_fuse
def test_writeback_needs_rw_and_a_write_dir_and_one_mount_per_write_dir(hub, tmp_path):
    repo = unique_name("wbbad")
    hub.plane().create_repo(repo)
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    os.makedirs(tmp_path / "mnt2")
    no_rw = fabric("mount", hub.url, f"{repo}@main", mp, "--writeback", "--write-dir", str(tmp_path / "w"), token=hub.token, check=False)
    assert no_rw.returncode == 2 and "--writeback needs --rw" in no_rw.stderr
    no_dir = fabric("mount", hub.url, f"{repo}@main", mp, "--rw", "--writeback", token=hub.token, check=False)
    assert no_dir.returncode == 2 and "--writeback needs --write-dir" in no_dir.stderr
    assert not os.path.ismount(mp) and not os.path.exists(tmp_path / "w")
    with mounted(hub.url, hub.token, f"{repo}@main", mp, "--rw", "--writeback", "--write-dir", str(tmp_path / "w")):
        second = fabric("mount", hub.url, f"{repo}@main", str(tmp_path / "mnt2"), "--rw", "--writeback",
                        "--write-dir", str(tmp_path / "w"), token=hub.token, check=False)
        assert second.returncode != 0 and "write-back directory (--write-dir)" in second.stderr and "is in use by process" in second.stderr
        assert not os.path.ismount(tmp_path / "mnt2")


@needs_fuse
@pytest.mark.timeout(300)
def test_fsync_returns_with_the_server_away_and_a_killed_mount_stages_its_parked_files_when_restarted(tmp_path):
    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        plane.put_object(repo, "main", "old.txt", io.BytesIO(b"committed before\n"))
        plane.commit(repo, "main", "base")
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--server-timeout", "60", "--log-file", mp + ".mount.log")
        with mount_to_kill(hub.url, hub.token, f"{repo}@main", mp, opts) as pid:
            shard = os.urandom(6 * 1024 * 1024)
            assert open(f"{mp}/old.txt").read() == "committed before\n"
            files = {name: open(f"{mp}/{name}", "wb") for name in ("shard.bin", "note.txt", "gone.bin", ".metadata.tmp")}
            files["shard.bin"].write(shard)
            files["note.txt"].write(b"a small one")
            files["gone.bin"].write(b"unlinked before it was staged")
            files[".metadata.tmp"].write(b"renamed before it was staged")
            hub.kill()
            # Each returns once its file is on the mount's disk: no server needed.
            files["shard.bin"].flush()
            t0 = time.monotonic()
            os.fsync(files["shard.bin"].fileno())
            with open(f"{mp}/shard.bin", "rb") as f:
                assert f.read() == shard  # read-your-writes while parked (and open: not being staged yet)
            waits = [time.monotonic() - t0] + [_timed_fsync_and_close(f) for f in files.values()]
            assert max(waits) < 5.0, waits
            assert len(_records(write_dir)) == 4
            t0 = time.monotonic()
            os.rename(f"{mp}/.metadata.tmp", f"{mp}/.metadata")  # a file only the mount has: no server needed
            assert time.monotonic() - t0 < 5.0
            assert not os.path.exists(f"{mp}/.metadata.tmp") and open(f"{mp}/.metadata", "rb").read() == b"renamed before it was staged"
            assert len(_records(write_dir)) == 4
            t0 = time.monotonic()
            os.unlink(f"{mp}/gone.bin")  # (its staging, after its close, waits for the server)
            assert time.monotonic() - t0 < 5.0, "an unlink waited for a staging of the file"
            assert len(_records(write_dir)) == 3  # its record is gone with it
            time.sleep(0.5)  # (the workers are now staging the closed files, waiting for the server)
            t0 = time.monotonic()
            assert open(f"{mp}/note.txt", "rb").read() == b"a small one"  # opened and read during its staging
            assert time.monotonic() - t0 < 5.0, "a read waited for the staging of its file"
            os.kill(pid, signal.SIGKILL)

        hub.start()
        # A record of another branch, in the same journal: left for a mount of it.
        foreign = Journal(str(write_dir))
        fd = os.open(write_dir, os.O_RDWR | os.O_TMPFILE, 0o600)
        os.write(fd, b"for another branch")
        foreign.link("foreign", fd)
        os.close(fd)
        foreign.write(Record("foreign", repo, "other", "f.txt", 0o644, 0, 0, 1, 1, {}), durable=True)
        foreign.close()

        with mounted(hub.url, hub.token, f"{repo}@main", mp, *opts[:-2]) as again:
            assert sorted(os.listdir(again)) == [".metadata", "note.txt", "old.txt", "shard.bin"]
            wait_for(lambda: _records(write_dir) == ["foreign.json"], timeout=60, interval=0.2)
            log = mount_log(mp)
            assert "took over 3 parked file(s) left in the write-back journal" in log
            assert "is for " + repo + "@other" in log
        plane.commit(repo, "main", "after the restart")
        assert plane.read(repo, "main", "shard.bin") == shard
        assert plane.read(repo, "main", "note.txt") == b"a small one"
        assert plane.read(repo, "main", ".metadata") == b"renamed before it was staged"
        assert sorted(p for p, _ in plane.walk(repo, "main")) == [".metadata", "note.txt", "old.txt", "shard.bin"]


@needs_fuse
@pytest.mark.timeout(300)
def test_a_full_backlog_makes_fsync_stage_its_file_before_returning(tmp_path):
    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--writeback-backlog", "1M", "--server-timeout", "60")
        with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", *opts) as mp:
            small, big = os.urandom(300 * 1024), os.urandom(2 * 1024 * 1024)
            hub.kill()
            with open(f"{mp}/small.bin", "wb") as f:
                f.write(small)
                assert _timed_fsync_and_close(f) < 5.0  # fits the backlog: parked
            done = threading.Event()
            failed: list[BaseException] = []

            def write_big() -> None:
                try:
                    with open(f"{mp}/big.bin", "wb") as f:
                        f.write(big)
                        f.flush()
                        os.fsync(f.fileno())
                except BaseException as exc:  # noqa: BLE001 - reported below
                    failed.append(exc)
                finally:
                    done.set()

            t = threading.Thread(target=write_big)
            t.start()
            assert not done.wait(3.0), "fsync beyond the backlog returned while the server was away"
            hub.start()
            assert done.wait(60) and not failed, failed
            t.join()
            assert len(_records(write_dir)) <= 1  # big.bin was staged, never parked
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.2)  # small.bin reaches it too
        plane.commit(repo, "main", "both")
        assert plane.read(repo, "main", "big.bin") == big
        assert plane.read(repo, "main", "small.bin") == small


@needs_fuse
@pytest.mark.timeout(300)
def test_a_mount_killed_while_it_stages_parked_files_stages_them_whole_when_restarted(tmp_path):
    """kill -9 of the mount while its workers chunk, upload and stage the files just closed (some
    chunks at the server, some files staged, some not): the restarted mount stages every file
    the journal still holds, and the branch ends with exactly what was written."""
    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--log-file", mp + ".mount.log")
        shards = {f"ckpt/shard{i}.bin": os.urandom(12 * 1024 * 1024) for i in range(4)}
        # (over 100 Mbit/s, so that the kill finds stagings under way)
        with WanProxy("127.0.0.1", hub.port, rate_mbit=100) as link, mount_to_kill(link.url_for(), hub.token, f"{repo}@main", mp, opts) as pid:
            os.mkdir(f"{mp}/ckpt")
            for name, data in shards.items():
                with open(f"{mp}/{name}", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            assert len(_records(write_dir)) == 4
            time.sleep(1.0)  # (the workers are sending: 48 MiB take about 4 s at 100 Mbit/s)
            os.kill(pid, signal.SIGKILL)
        assert len(_records(write_dir)) >= 1  # the kill came before every file was staged
        with mounted(hub.url, hub.token, f"{repo}@main", mp, *opts[:-2]) as again:
            assert sorted(os.listdir(f"{again}/ckpt")) == sorted(n.split("/")[1] for n in shards)
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.2)
        plane.commit(repo, "main", "after the kill")
        for name, data in shards.items():
            assert plane.read(repo, "main", name) == data, name


@needs_fuse
@pytest.mark.timeout(300)
def test_a_restarted_mount_serves_its_parked_files_at_once_and_stages_them_in_the_background(tmp_path):
    """The mount started after a kill does not wait for the upload of what the killed one
    parked (24 MiB over a 20 Mbit/s link: about 10 s): it serves at once, the parked files
    read back from its disk; an unlink of one that rewrote a file of the branch deletes it
    there, and the rest reaches the branch."""
    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        plane.put_object(repo, "main", "old.txt", io.BytesIO(b"committed before\n"))
        plane.commit(repo, "main", "base")
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--server-timeout", "60", "--log-file", mp + ".mount.log")
        big = os.urandom(24 * 1024 * 1024)
        with mount_to_kill(hub.url, hub.token, f"{repo}@main", mp, opts) as pid:
            files = {name: open(f"{mp}/{name}", "wb") for name in ("big.bin", "old.txt")}  # (opening old.txt asks the server)
            files["big.bin"].write(big)
            files["old.txt"].write(b"rewritten, parked\n")
            hub.kill()  # nothing parked reaches it
            assert max(_timed_fsync_and_close(f) for f in files.values()) < 5.0
            assert len(_records(write_dir)) == 2
            os.kill(pid, signal.SIGKILL)
        hub.start()

        link = WanProxy("127.0.0.1", hub.port, rate_mbit=20).start()
        try:
            t0 = time.monotonic()
            with mounted(link.url_for(), hub.token, f"{repo}@main", mp, *opts[:-2]) as again:
                ready = time.monotonic() - t0
                assert ready < 8.0, f"the mount waited {ready:.1f} s for the upload before serving"
                assert len(_records(write_dir)) >= 1, "the upload was not still under way"
                assert sorted(os.listdir(again)) == ["big.bin", "old.txt"]
                assert os.stat(f"{again}/big.bin").st_size == len(big)
                with open(f"{again}/big.bin", "rb") as f:
                    assert f.read() == big
                assert open(f"{again}/old.txt", "rb").read() == b"rewritten, parked\n"
                os.unlink(f"{again}/old.txt")
                assert sorted(os.listdir(again)) == ["big.bin"]
                wait_for(lambda: not _records(write_dir), timeout=120, interval=0.2)
        finally:
            link.stop()
        plane.commit(repo, "main", "after the restart")
        assert plane.read(repo, "main", "big.bin") == big
        assert sorted(p for p, _ in plane.walk(repo, "main")) == ["big.bin"]


@needs_fuse
@pytest.mark.timeout(300)
def test_saving_again_under_the_same_name_does_not_wait_for_the_last_saves_upload(tmp_path):
    """A checkpoint saved again as the same file while its last version is still being
    uploaded (24 MiB over a 20 Mbit/s link: about 10 s): the truncating open supersedes
    that version at once and the branch ends with the new one. Killed after such an open,
    before the new version's fsync, the mount brings back the last version fsync returned for."""
    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--log-file", mp + ".mount.log")
        first, second = os.urandom(24 * 1024 * 1024), os.urandom(1024 * 1024)
        with WanProxy("127.0.0.1", hub.port, rate_mbit=20) as link, mount_to_kill(link.url_for(), hub.token, f"{repo}@main", mp, opts) as pid:
            sent = link.stats().bytes_up
            _save(f"{mp}/latest.pt", first)
            wait_for(lambda: link.stats().bytes_up - sent > 1024 * 1024, timeout=30, interval=0.05)  # its upload is under way
            t0 = time.monotonic()
            _save(f"{mp}/latest.pt", second)
            assert time.monotonic() - t0 < 4.0, "the save waited for the last one's upload"
            assert open(f"{mp}/latest.pt", "rb").read() == second
            assert os.listdir(mp) == ["latest.pt"]
            wait_for(lambda: not _records(write_dir), timeout=120, interval=0.2)
            assert plane.read(repo, "main", "latest.pt") == second

            # Saved, then opened again and half written when the mount is killed.
            sent = link.stats().bytes_up
            _save(f"{mp}/ckpt.pt", first)
            wait_for(lambda: link.stats().bytes_up - sent > 1024 * 1024, timeout=30, interval=0.05)
            _kill_with_open(pid, _resave_partly(f"{mp}/ckpt.pt", second[:1000]))
        with mounted(hub.url, hub.token, f"{repo}@main", mp, *opts[:-2]) as again:
            assert open(f"{again}/ckpt.pt", "rb").read() == first
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.2)
        assert plane.read(repo, "main", "ckpt.pt") == first
        assert plane.read(repo, "main", "latest.pt") == second


@needs_fuse
@pytest.mark.timeout(300)
def test_a_file_fsynced_and_kept_open_reaches_the_branch_once_its_writes_pause(tmp_path):
    """A log fsynced now and then and never closed: each fsync parks it; once it has not been
    written for OPEN_IDLE_SECONDS it is staged although still open, and writes after that park
    and reach the branch the same way."""
    from fuse.writeback import OPEN_IDLE_SECONDS

    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw", "--writeback", "--write-dir", str(write_dir)) as mp:

            def staged() -> bytes | None:
                try:
                    return plane.read(repo, "main", "train.log")
                except Exception:  # noqa: BLE001 - not staged yet
                    return None

            with open(f"{mp}/train.log", "wb") as log:
                log.write(b"step 1\n")
                log.flush()
                os.fsync(log.fileno())
                assert len(_records(write_dir)) == 1
                time.sleep(OPEN_IDLE_SECONDS / 2)
                assert staged() is None, "staged before its writes paused"
                wait_for(lambda: staged() == b"step 1\n", timeout=OPEN_IDLE_SECONDS * 4, interval=0.2)
                wait_for(lambda: not _records(write_dir), timeout=10, interval=0.1)
                log.write(b"step 2\n")
                log.flush()
                os.fsync(log.fileno())
                wait_for(lambda: staged() == b"step 1\nstep 2\n", timeout=OPEN_IDLE_SECONDS * 4, interval=0.2)
                assert not log.closed


@needs_fuse
@pytest.mark.timeout(300)
def test_a_truncating_open_of_a_parked_file_waiting_for_its_staging_keeps_the_parked_version(tmp_path):
    """The staging workers are all busy (four uploads over a 20 Mbit/s link), so a file just
    saved waits for its staging. Opened again with O_TRUNC and half written when the mount is
    killed: the restarted mount brings back the version that was saved, not the half-written
    one (the journal's copy of it was never truncated)."""
    from fuse.writeback import WORKERS

    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--log-file", mp + ".mount.log")
        saved = os.urandom(512 * 1024)
        with WanProxy("127.0.0.1", hub.port, rate_mbit=20) as link, mount_to_kill(link.url_for(), hub.token, f"{repo}@main", mp, opts) as pid:
            for i in range(WORKERS):  # the workers' uploads: about 7 s in all
                with open(f"{mp}/busy{i}.bin", "wb") as f:
                    f.write(os.urandom(4 * 1024 * 1024))
            _save(f"{mp}/model.pt", saved)
            half = _resave_partly(f"{mp}/model.pt", b"half of the next save")
            assert open(f"{mp}/model.pt", "rb").read() == b"half of the next save"
            _kill_with_open(pid, half)
        with mounted(hub.url, hub.token, f"{repo}@main", mp, *opts[:-2]) as again:
            assert open(f"{again}/model.pt", "rb").read() == saved
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.2)
        assert plane.read(repo, "main", "model.pt") == saved


@needs_fuse
@pytest.mark.timeout(300)
def test_attribute_changes_of_a_parked_file_do_not_wait_for_its_upload(tmp_path):
    """``shutil.copy2`` into the mount: the copy's close parks it, then its times and mode are
    set. Those do not stage it inline (8 MiB over a 20 Mbit/s link: about 3.4 s), nor wait
    for the staging that runs: stat shows them at once, a kill of the mount after them brings
    them back with the file, and the branch ends with them."""
    import shutil

    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--log-file", mp + ".mount.log")
        src = tmp_path / "weights.bin"
        src.write_bytes(os.urandom(8 * 1024 * 1024))
        os.chmod(src, 0o600)
        os.utime(src, ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
        with WanProxy("127.0.0.1", hub.port, rate_mbit=20) as link, mount_to_kill(link.url_for(), hub.token, f"{repo}@main", mp, opts) as pid:
            t0 = time.monotonic()
            shutil.copy2(src, f"{mp}/weights.bin")
            assert time.monotonic() - t0 < 2.0, "the copy's chmod or utime staged the file"
            st = os.stat(f"{mp}/weights.bin")
            assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o600, 1_600_000_000_123_456_789)

            # While its staging runs (its upload under way), another chmod returns at once.
            sent = link.stats().bytes_up
            wait_for(lambda: link.stats().bytes_up - sent > 1024 * 1024, timeout=30, interval=0.05)
            t0 = time.monotonic()
            os.chmod(f"{mp}/weights.bin", 0o640)
            assert time.monotonic() - t0 < 1.0, "the chmod waited for the upload"
            assert os.stat(f"{mp}/weights.bin").st_mode & 0o7777 == 0o640
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.1)
            wait_for(lambda: plane.stat(repo, "main", "weights.bin").mode & 0o7777 == 0o640, timeout=60, interval=0.2)
            e = plane.stat(repo, "main", "weights.bin")
            assert (e.size, e.mtime_ns) == (8 * 1024 * 1024, 1_600_000_000_123_456_789)

            # Parked and then changed, the mount killed before the staging: the restarted mount
            # brings the file back with the changed mode and times.
            with open(f"{mp}/other.bin", "wb") as f:  # (a create asks the server: before the kill)
                f.write(b"parked")
                hub.kill()
                os.fsync(f.fileno())
            os.chmod(f"{mp}/other.bin", 0o604)
            os.utime(f"{mp}/other.bin", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_007))
            os.kill(pid, signal.SIGKILL)
        hub.start()
        with mounted(hub.url, hub.token, f"{repo}@main", mp, *opts[:-2]) as again:
            st = os.stat(f"{again}/other.bin")
            assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o604, 1_700_000_000_000_000_007)
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.1)
        e = plane.stat(repo, "main", "other.bin")
        assert (e.mode & 0o7777, e.mtime_ns) == (0o604, 1_700_000_000_000_000_007)
        assert plane.read(repo, "main", "weights.bin") == src.read_bytes()


@needs_fuse
@pytest.mark.timeout(300)
def test_a_save_renamed_over_the_last_one_does_not_wait_for_its_upload(tmp_path):
    """The atomic-replace save (write ``latest.pt.tmp``, fsync, rename it over ``latest.pt``):
    a rename over the file of the branch asks the server nothing (8 MiB over a 20 Mbit/s link
    take about 3.4 s), nor does one over the version still being uploaded, whose record goes.
    The mount killed then, the restarted one brings back the newest version, and the branch
    ends with it alone."""
    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--log-file", mp + ".mount.log")
        versions = [os.urandom(8 * 1024 * 1024) for _ in range(3)]

        def save(data: bytes) -> float:
            _save(f"{mp}/latest.pt.tmp", data)
            t0 = time.monotonic()
            os.rename(f"{mp}/latest.pt.tmp", f"{mp}/latest.pt")
            return time.monotonic() - t0

        with WanProxy("127.0.0.1", hub.port, rate_mbit=20) as link, mount_to_kill(link.url_for(), hub.token, f"{repo}@main", mp, opts) as pid:
            save(versions[0])
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.1)
            assert plane.read(repo, "main", "latest.pt") == versions[0]

            assert save(versions[1]) < 1.0, "the rename over the staged file waited for the upload"
            assert sorted(os.listdir(mp)) == ["latest.pt"]
            assert open(f"{mp}/latest.pt", "rb").read() == versions[1]
            assert save(versions[2]) < 1.0, "the rename over the file being uploaded waited for it"
            assert open(f"{mp}/latest.pt", "rb").read() == versions[2]
            assert len(_records(write_dir)) == 1, "the replaced version's record is left"
            os.kill(pid, signal.SIGKILL)
        with mounted(hub.url, hub.token, f"{repo}@main", mp, *opts[:-2]) as again:
            assert sorted(os.listdir(again)) == ["latest.pt"]
            assert open(f"{again}/latest.pt", "rb").read() == versions[2]
            wait_for(lambda: not _records(write_dir), timeout=60, interval=0.1)
        assert plane.read(repo, "main", "latest.pt") == versions[2]
        assert [p for p, _ in plane.walk(repo, "main")] == ["latest.pt"]


# -- `fabric mount-flush`: a killed mount's journal staged without mounting -------------------
def _park(journal: Journal, rid: str, repo: str, branch: str, path: str, data: bytes, mode: int, mtime_ns: int, age: float) -> None:
    """A record as a mount parks one, ``age`` seconds old (records replay oldest first)."""
    with open(journal.data_path(rid), "wb") as f:
        f.write(data)
    journal.write(Record(rid, repo, branch, path, mode, 0, 0, mtime_ns, mtime_ns, {"k": rid}), durable=False)
    then = time.time() - age
    os.utime(os.path.join(journal.dir, rid + ".json"), (then, then))


def _new_repo_and_journal(hub, tmp_path, prefix: str) -> tuple:
    """A new repository on ``hub``, and the journal of a new write directory (opened)."""
    plane = hub.plane()
    repo = unique_name(prefix)
    plane.create_repo(repo)
    write_dir = tmp_path / "writes"
    return plane, repo, write_dir, Journal(str(write_dir))


def _flush(server: str, token: str, write_dir, *opts: str) -> subprocess.CompletedProcess:
    return fabric("mount-flush", server, str(write_dir), "--json", *opts, token=token, check=False)


def test_mount_flush_stages_the_latest_version_of_each_path_and_keeps_what_it_cannot_stage(hub, tmp_path):
    plane, repo, write_dir, journal = _new_repo_and_journal(hub, tmp_path, "flush")
    _park(journal, "r1", repo, "main", "ckpt/a.pt", b"first save\n", 0o100600, 1_700_000_000_123_456_789, age=30)
    _park(journal, "r2", repo, "main", "ckpt/a.pt", b"second save\n", 0o100640, 1_700_000_001_987_654_321, age=20)
    _park(journal, "r3", repo, "later", "b.txt", b"for a branch made later\n", 0o100644, 1_700_000_002_000_000_000, age=10)
    journal.close()

    first = _flush(hub.url, hub.token, write_dir)
    assert first.returncode == 1, first.stderr
    report = json.loads(first.stdout)
    assert report["staged"] == [f"{repo}@main:ckpt/a.pt"] and report["superseded"] == 1
    assert list(report["failed"]) == [f"{repo}@later:b.txt"]
    assert f"not staged, kept in {write_dir}: {repo}@later:b.txt" in first.stderr
    assert _records(write_dir) == ["r3.json"], "only what could not be staged stays"
    entry = plane.stat_chunks(repo, "main", "ckpt/a.pt")
    assert plane.read(repo, "main", "ckpt/a.pt") == b"second save\n"
    assert (stat.S_IMODE(entry.mode), entry.mtime_ns, entry.meta) == (0o640, 1_700_000_001_987_654_321, {"k": "r2"})

    plane.create_branch(repo, "later", "main")
    second = _flush(hub.url, hub.token, write_dir, "--commit-message", "flushed")
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout)
    assert report["staged"] == [f"{repo}@later:b.txt"] and list(report["committed"]) == [f"{repo}@later"]
    assert _records(write_dir) == []
    assert plane.get_commit(repo, "later").message == "flushed"
    assert plane.read(repo, "later", "b.txt") == b"for a branch made later\n"


def test_mount_flush_refuses_a_directory_without_a_journal_and_one_a_mount_holds(hub, tmp_path):
    empty = tmp_path / "not-a-write-dir"
    empty.mkdir()
    refused = _flush(hub.url, hub.token, empty)
    assert refused.returncode != 0 and "holds no write-back journal" in refused.stderr, refused.stderr
    assert os.listdir(empty) == [], "a refused flush made nothing"

    write_dir = tmp_path / "writes"
    journal = Journal(str(write_dir))  # as a live mount holds it
    _park(journal, "r1", "repo", "main", "a.txt", b"parked\n", 0o100644, 1, age=1)
    try:
        busy = _flush(hub.url, hub.token, write_dir)
        assert busy.returncode != 0 and f"is in use by process {os.getpid()}" in busy.stderr, busy.stderr
        assert _records(write_dir) == ["r1.json"]
    finally:
        journal.close()


@needs_fuse
@pytest.mark.timeout(300)
def test_mount_flush_stages_what_a_killed_mount_parked_with_its_attributes(tmp_path):
    with _hub_with_repo(tmp_path) as (hub, plane, repo):
        write_dir = tmp_path / "writes"
        mp = str(tmp_path / "mnt")
        opts = ("--rw", "--writeback", "--write-dir", str(write_dir), "--server-timeout", "60", "--log-file", mp + ".mount.log")
        shard = os.urandom(3 * 1024 * 1024)
        with mount_to_kill(hub.url, hub.token, f"{repo}@main", mp, opts) as pid:
            files = {name: open(f"{mp}/{name}", "wb") for name in ("shard.bin", "notes.txt")}
            files["shard.bin"].write(shard)
            files["notes.txt"].write(b"step 100\n")
            hub.kill()  # nothing parked reaches it
            for f in files.values():
                _timed_fsync_and_close(f)
            os.chmod(f"{mp}/notes.txt", 0o600)
            os.utime(f"{mp}/notes.txt", ns=(1_700_000_000_000_000_007, 1_700_000_000_000_000_007))
            assert len(_records(write_dir)) == 2
            os.kill(pid, signal.SIGKILL)
        hub.start()

        done = _flush(hub.url, hub.token, write_dir, "--commit-message", "after the kill")
        assert done.returncode == 0, done.stderr
        assert sorted(json.loads(done.stdout)["staged"]) == [f"{repo}@main:notes.txt", f"{repo}@main:shard.bin"]
        assert _records(write_dir) == []
        assert plane.read(repo, "main", "shard.bin") == shard
        notes = plane.stat_chunks(repo, "main", "notes.txt")
        assert (stat.S_IMODE(notes.mode), notes.mtime_ns) == (0o600, 1_700_000_000_000_000_007)
        assert plane.get_commit(repo, "main").message == "after the kill"


def test_mount_flush_to_a_server_that_is_away_keeps_every_record_and_stops_at_the_first(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_dir = tmp_path / "writes"
    journal = Journal(str(write_dir))
    for i in range(3):
        _park(journal, f"r{i}", "repo", "main", f"f{i}.txt", b"parked\n", 0o100644, 1, age=10 - i)
    journal.close()
    t0 = time.monotonic()
    away = _flush(f"http://127.0.0.1:{port}", "token", write_dir)
    took = time.monotonic() - t0
    assert away.returncode == 1, away.stderr
    failed = json.loads(away.stdout)["failed"]
    assert list(failed) == [f"repo@main:f{i}.txt" for i in range(3)]
    assert [why.startswith("not tried") for why in failed.values()] == [False, True, True]
    assert _records(write_dir) == ["r0.json", "r1.json", "r2.json"]
    assert took < 60, f"{took:.0f} s: a flush to a server that is away must not try every file"


class _Recorded(Progress):
    def __init__(self) -> None:
        self.total: int | None = None
        self.done = 0
        self.closed = False

    def start(self, total: int | None, unit: str = "B", desc: str = "") -> None:
        self.total = total

    def advance(self, n: int = 1) -> None:
        self.done += n

    def close(self) -> None:
        self.closed = True


def test_mount_flush_reports_its_progress_in_bytes_of_the_files_it_stages(hub, tmp_path):
    plane, repo, write_dir, journal = _new_repo_and_journal(hub, tmp_path, "flushp")
    _park(journal, "old", repo, "main", "a.bin", b"x" * 1000, 0o100644, 1, age=20)  # superseded: not counted
    _park(journal, "new", repo, "main", "a.bin", os.urandom(300_000), 0o100644, 1, age=10)
    _park(journal, "b", repo, "main", "b.bin", os.urandom(5_000), 0o100644, 1, age=5)
    journal.close()
    progress = _Recorded()
    report = flush_journal(str(write_dir), plane, progress=progress)
    assert report.staged_bytes == 305_000
    assert (progress.total, progress.done, progress.closed) == (305_000, 305_000, True)
