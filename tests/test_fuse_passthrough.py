"""``fabric mount --passthrough`` (issue 21): an immutable mount served on the kernel's FUSE
protocol (fuse/kernel), whose files read whole once are then read by the kernel itself from
plain copies in the cache directory (fabric/cache/files.py).

Real mounts of a real hub, as root on a kernel with FUSE passthrough (the CI machines'); the
copies' bookkeeping is tested on its own first.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time

import pytest

from fabric.cache.files import CHECKED_XATTR, MAX_FILLING, PARTIAL, FileCopies, copy_key
from fabric.cache.scrub import CopyScrub
from fabric.client.transfer import import_directory
from fuse.kernel.protocol import kernel_has_passthrough
from fuse.mount import read_state
from tests.ci_requirements import requires
from tests.fuse_helpers import fabric, mount_stats, mounted, needs_fuse
from tests.hubserver import unique_name
from tests.test_corruption import flip
from tests.test_fuse_cold_reads import make_files

MIB = 1024 * 1024

needs_passthrough = requires(
    None if os.geteuid() == 0 and kernel_has_passthrough() else "FUSE passthrough needs root and a kernel built with CONFIG_FUSE_PASSTHROUGH"
)


# -- the copies ------------------------------------------------------------------------------
def test_a_copy_written_out_of_order_is_complete_once_every_byte_is_in(tmp_path):
    copies = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    data = os.urandom(3 * MIB + 123)
    key = copy_key(len(data), [b"a" * 32])
    f = copies.filling(key, len(data))
    assert f is not None and copies.filling(key, len(data)) is f  # one filling per key
    pieces = [(o, data[o : o + 65536]) for o in range(0, len(data), 65536)]
    for o, piece in reversed(pieces[1:]):
        f.write(piece, o)
    f.write(data[:100], 0)  # overlapping writes count once
    assert copies.open(key, len(data)) is None
    f.write(data[:65536], 0)
    copies.close()  # waits for the copy to be flushed and renamed into place
    fd = copies.open(key, len(data))
    assert fd is not None
    try:
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)
    assert os.listdir(os.path.join(copies.dir, PARTIAL)) == []
    assert copies.snapshot()["made"] == 1


def test_copies_stay_within_their_budget_least_recently_opened_first(tmp_path):
    copies = FileCopies(str(tmp_path), budget=5 * MIB, min_size=MIB)
    keys = [copy_key(2 * MIB, [bytes([i]) * 32]) for i in range(3)]
    assert copies.filling(copy_key(MIB - 1, [b"s" * 32]), MIB - 1) is None  # too small to copy
    assert copies.filling(copy_key(6 * MIB, [b"b" * 32]), 6 * MIB) is None  # larger than the budget
    for i, key in enumerate(keys[:2]):
        copies.filling(key, 2 * MIB).write(bytes([i]) * (2 * MIB), 0)
    copies._finisher.submit(lambda: None).result()
    os.close(copies.open(keys[0], 2 * MIB))  # opened: keys[1] is now the least recently used
    copies.filling(keys[2], 2 * MIB).write(b"\2" * (2 * MIB), 0)
    copies.close()
    assert copies.open(keys[1], 2 * MIB) is None
    assert copies.snapshot()["bytes"] == 4 * MIB and copies.snapshot()["evicted"] == 1
    # A restart finds the copies, their order, and removes what was being filled.
    os.close(os.open(os.path.join(copies.partial, "torn"), os.O_CREAT | os.O_WRONLY))
    again = FileCopies(str(tmp_path), budget=5 * MIB, min_size=MIB)
    assert os.listdir(again.partial) == []
    for key in (keys[0], keys[2]):
        fd = again.open(key, 2 * MIB)
        assert fd is not None
        os.close(fd)
    # A copy whose size is not its file's is removed, not served.
    assert again.open(keys[0], 2 * MIB + 1) is None and again.open(keys[0], 2 * MIB) is None
    again.close()


def test_a_copies_directory_is_shared_a_start_removes_only_what_processes_gone_left(tmp_path):
    partial = tmp_path / "files" / PARTIAL
    partial.mkdir(parents=True)
    live, gone, stray = partial / f"1-{'a' * 64}", partial / f"999999999-{'b' * 64}", partial / "torn"
    for p in (live, gone, stray):
        p.write_bytes(b"x")
    copies = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    assert sorted(os.listdir(partial)) == [live.name]  # process 1's copy being filled stays
    f = copies.filling(copy_key(MIB, [b"p" * 32]), MIB)
    assert os.path.basename(f.path) == f"{os.getpid()}-{f.key}"
    copies.close()


def test_a_copy_whose_last_check_is_stale_is_checked_whole_at_its_first_open(tmp_path):
    copies = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    data = os.urandom(2 * MIB)
    key = copy_key(len(data), [b"c" * 32])
    copies.filling(key, len(data)).write(data, 0)
    copies.close()
    [path] = [os.path.join(d, f) for d, _, names in os.walk(copies.dir) for f in names]
    flip(path, MIB, 0xFF)  # damaged on the disk after its check, the size unchanged
    stray = os.path.join(copies.dir, "ab", "not-a-copy")
    os.makedirs(os.path.dirname(stray))
    open(stray, "wb").close()
    _record_check(path, time.time() - 25 * 3600)  # checked more than a day ago
    again = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    assert not os.path.exists(stray)  # what is not a copy is removed at start-up
    assert again.snapshot()["unchecked"] == 1
    assert again.open(key, len(data)) is None and not os.path.exists(path)
    assert again.snapshot()["corruptions"] == 1 and again.snapshot()["copies"] == 0
    again.close()


def _record_check(path: str, when: float, checksum: str | None = None) -> None:
    """Set the check recorded with the copy at ``path`` (its own checksum unless given)."""
    checksum = checksum or os.path.basename(path).partition("-")[2]
    os.setxattr(path, CHECKED_XATTR, f"{when:.0f} {checksum}".encode())


def _made_copies(root, count: int) -> tuple[dict[str, bytes], dict[str, str]]:
    """``count`` copies of random files made in ``root`` (as a mount fills them): their bytes
    and their paths, by key."""
    made = FileCopies(str(root), budget=64 * MIB, min_size=1)
    blobs = {copy_key(MIB + i, [bytes([i]) * 32]): os.urandom(MIB + i) for i in range(count)}
    for key, data in blobs.items():
        made.filling(key, len(data)).write(data, 0)
    made.close()
    return blobs, {key: next(str(p) for p in (root / "files" / key[:2]).iterdir() if p.name.startswith(key)) for key in blobs}


def test_a_copy_checked_within_a_day_is_served_at_once_after_a_restart(tmp_path):
    blobs, paths = _made_copies(tmp_path, 4)
    recent, old, other_bytes, unrecorded = list(blobs)
    for key in blobs:  # the same damage to each, unseen by its metadata
        flip(paths[key], 7, 0xFF)
    _record_check(paths[recent], time.time() - 3600)
    _record_check(paths[old], time.time() - 25 * 3600)
    _record_check(paths[other_bytes], time.time(), checksum="0" * 32)
    os.removexattr(paths[unrecorded], CHECKED_XATTR)

    again = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    assert set(again.unchecked()) == {old, other_bytes, unrecorded}
    fd = again.open(recent, len(blobs[recent]))  # its check an hour ago stands, as in a mount that stayed up
    assert fd is not None
    os.close(fd)
    for key in (old, other_bytes, unrecorded):  # read whole before they are served: the damage is found
        assert again.open(key, len(blobs[key])) is None and not os.path.exists(paths[key])
    assert again.snapshot()["corruptions"] == 3
    again.close()
    # A copy checked at an open records it: the next start trusts it.
    key = copy_key(3 * MIB, [b"r" * 32])
    made = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    made.filling(key, 3 * MIB).write(b"r" * (3 * MIB), 0)
    made.close()
    [path] = [str(p) for p in (tmp_path / "files" / key[:2]).iterdir() if p.name.startswith(key)]
    _record_check(path, time.time() - 25 * 3600)
    first = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    os.close(first.open(key, 3 * MIB))
    first.close()
    assert FileCopies(str(tmp_path), budget=64 * MIB, min_size=1).snapshot()["unchecked"] == 0


def test_the_scrub_checks_copies_before_their_opens_and_again_as_their_checks_go_stale(tmp_path):
    blobs, paths = _made_copies(tmp_path, 3)
    bad, later, good = list(blobs)
    flip(paths[bad], 1000, 0xFF)

    time.sleep(0.6)
    copies = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1, recheck_after=0.5)  # the checks at their making are stale
    assert set(copies.unchecked()) == set(blobs)
    scrub = CopyScrub(copies)
    try:
        deadline = time.monotonic() + 10
        while copies.unchecked() and time.monotonic() < deadline:
            time.sleep(0.02)
        snap = copies.snapshot()
        assert snap["unchecked"] == 0 and snap["scrubbed"] == 2 and snap["corruptions"] == 1  # before any open
        assert not os.path.exists(paths[bad]) and copies.open(bad, len(blobs[bad])) is None
        fd = copies.open(good, len(blobs[good]))
        assert fd is not None and os.pread(fd, len(blobs[good]), 0) == blobs[good]
        os.close(fd)
        flip(paths[later], 5, 0xFF)  # damaged at rest while the mount runs: the next pass finds it
        while copies.snapshot()["corruptions"] < 2 and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        assert copies.snapshot()["corruptions"] == 2 and not os.path.exists(paths[later])
        assert copies.open(later, len(blobs[later])) is None
    finally:
        scrub.close()
        copies.close()


def test_copies_can_be_trusted_at_rest_where_the_file_system_checks_them(tmp_path):
    copies = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1)
    key = copy_key(MIB, [b"t" * 32])
    copies.filling(key, MIB).write(b"t" * MIB, 0)
    copies.close()
    [path] = [os.path.join(d, f) for d, _, names in os.walk(copies.dir) for f in names]
    with open(path, "r+b") as f:
        f.write(b"x")
    trusting = FileCopies(str(tmp_path), budget=64 * MIB, min_size=1, check=False)
    fd = trusting.open(key, MIB)  # not read back: the damage goes unseen, as --no-passthrough-check says
    assert fd is not None
    os.close(fd)
    trusting.close()


def test_copies_being_filled_count_in_the_budget_at_their_full_size(tmp_path):
    # A reader that reads half of many large files must not fill the disk with halves.
    copies = FileCopies(str(tmp_path), budget=5 * MIB, min_size=MIB)
    first = copies.filling(copy_key(3 * MIB, [b"1" * 32]), 3 * MIB)
    first.write(b"1" * MIB, 0)
    second = copies.filling(copy_key(3 * MIB, [b"2" * 32]), 3 * MIB)
    assert first.failed and not second.failed  # 6 MiB would not fit: the least recently written went
    assert copies.snapshot()["filling_bytes"] == 3 * MIB
    second.write(b"2" * (3 * MIB), 0)
    copies._finisher.submit(lambda: None).result()
    assert copies.snapshot()["bytes"] == 3 * MIB and copies.snapshot()["filling_bytes"] == 0
    copies.filling(copy_key(4 * MIB, [b"3" * 32]), 4 * MIB)  # makes room: the copy goes
    assert copies.snapshot()["bytes"] == 0 and copies.snapshot()["evicted"] == 1
    copies.close()


def test_at_most_so_many_copies_are_filled_at_once(tmp_path):
    copies = FileCopies(str(tmp_path), budget=1 << 40, min_size=1)
    started = [copies.filling(copy_key(10, [i.to_bytes(32, "little")]), 10) for i in range(MAX_FILLING + 1)]
    assert started[0].failed and not any(f.failed for f in started[1:])  # the least recently written went
    started[0].write(b"x" * 10, 0)  # a write to a dropped copy does nothing
    assert len(os.listdir(copies.partial)) == MAX_FILLING
    copies.close()
    assert os.listdir(copies.partial) == []


# -- through real mounts -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tagged(hub, tmp_path_factory):
    src = tmp_path_factory.mktemp("pt") / "tree"
    sizes = {f"big/f{i}.bin": 5 * MIB + i * 4099 for i in range(3)}
    sizes |= {f"small/s{i}.bin": 1000 + i for i in range(20)}
    data = make_files(str(src), sizes)
    os.symlink("big/f0.bin", src / "link")
    os.makedirs(src / "empty")
    repo = unique_name("pt")
    plane = hub.plane()
    plane.create_repo(repo)
    commit = import_directory(plane, str(src), repo, "main", "passthrough").commit.id
    plane.create_tag(repo, "v1", commit)
    return hub, repo, data


def kernel_stats(mp: str, until=lambda s: True, timeout: float = 10.0) -> dict:
    """The mount's ``kernel`` counters, once ``until`` holds of them."""
    return mount_stats(mp, "kernel", until, timeout)


def sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@needs_fuse
@needs_passthrough
def test_a_passthrough_mount_serves_the_commit_and_the_kernel_reads_the_copies(tagged, tmp_path):
    hub, repo, data = tagged
    cache = tmp_path / "cache"
    want = {n: hashlib.sha256(b).hexdigest() for n, b in data.items()}
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "m", "--passthrough", "--cache-dir", str(cache)) as mp:
        assert kernel_stats(mp)["passthrough"] is True
        assert sorted(os.listdir(mp)) == ["big", "empty", "link", "small"]
        assert os.listdir(os.path.join(mp, "empty")) == []
        assert os.readlink(os.path.join(mp, "link")) == "big/f0.bin"
        assert os.stat(os.path.join(mp, "big/f2.bin")).st_size == len(data["big/f2.bin"])
        assert not os.path.exists(os.path.join(mp, "nothing"))
        assert {n: sha(os.path.join(mp, n)) for n in data} == want  # first reads: from chunks
        first = kernel_stats(mp, lambda s: s["copies"]["made"] == 3)
        assert first["passthrough_opens"] == 0 and first["read_requests"] > 0
        assert first["copies"]["copies"] == 3  # the big files; small ones are not copied

        big = [n for n in data if n.startswith("big/")]
        assert {n: sha(os.path.join(mp, n)) for n in big} == {n: want[n] for n in big}
        fd = os.open(os.path.join(mp, "big/f1.bin"), os.O_RDONLY)
        try:
            assert os.pread(fd, 10_000, 3 * MIB - 7) == data["big/f1.bin"][3 * MIB - 7 : 3 * MIB + 9993]
        finally:
            os.close(fd)
        second = kernel_stats(mp, lambda s: s["passthrough_opens"] >= 4)
        assert second["passthrough_opens"] == 4
        assert second["read_requests"] == first["read_requests"]  # no read of a copied file reached the mount
        assert 2 <= second["threads"] <= 8  # (two wait for requests; more only while answers are slow)

        # Read-only, whatever the kernel asks.
        for attempt in (lambda: open(os.path.join(mp, "big/f0.bin"), "r+b"), lambda: os.mkdir(os.path.join(mp, "d")),
                        lambda: os.unlink(os.path.join(mp, "big/f0.bin")), lambda: open(os.path.join(mp, "new"), "wb")):
            with pytest.raises(OSError) as info:
                attempt()
            assert info.value.errno == errno.EROFS
        assert sorted(os.listdir(os.path.join(mp, "big"))) == ["f0.bin", "f1.bin", "f2.bin"]


@needs_fuse
@needs_passthrough
def test_a_file_open_from_chunks_stays_so_until_closed_then_opens_from_its_copy(tagged, tmp_path):
    # The kernel refuses a passthrough open of an inode open from its page cache (ETXTBSY):
    # while one is, further opens are of the same kind.
    hub, repo, data = tagged
    name = "big/f2.bin"
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "m", "--passthrough", "--cache-dir", str(tmp_path / "c")) as mp:
        path = os.path.join(mp, name)
        with open(path, "rb") as first:
            assert first.read() == data[name]
            kernel_stats(mp, lambda s: s["copies"]["made"] == 1)
            with open(path, "rb") as second:  # the copy is complete, but the file is still open from chunks
                assert second.read() == data[name]
        assert kernel_stats(mp, lambda s: s["cached_opens"] >= 2)["passthrough_opens"] == 0
        with open(path, "rb") as third, open(path, "rb") as fourth:
            assert third.read() == data[name] and fourth.read(1000) == data[name][:1000]
        assert kernel_stats(mp, lambda s: s["passthrough_opens"] == 2)["cached_opens"] == 2


@needs_fuse
@needs_passthrough
def test_a_mount_killed_while_copying_leaves_a_cache_the_next_mount_reads_right(tagged, tmp_path):
    hub, repo, data = tagged
    cache = str(tmp_path / "cache")
    opts = ("--passthrough", "--cache-dir", cache)
    name = "big/f1.bin"
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "m1", *opts) as mp:
        fd = os.open(os.path.join(mp, name), os.O_RDONLY)
        assert os.read(fd, 2 * MIB) == data[name][: 2 * MIB]  # a copy half filled
        assert os.listdir(os.path.join(cache, "files", PARTIAL))
        os.kill(read_state(mp)["pid"], signal.SIGKILL)
        with contextlib.suppress(OSError):  # (the connection is gone)
            os.close(fd)
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "m2", *opts) as mp:
        assert os.listdir(os.path.join(cache, "files", PARTIAL)) == []
        assert {n: sha(os.path.join(mp, n)) for n in data} == {n: hashlib.sha256(b).hexdigest() for n, b in data.items()}
        kernel_stats(mp, lambda s: s["copies"]["made"] == 3)
    # Copies survive a remount (here trusted at rest: not read back at their first open).
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "m3", *opts, "--no-passthrough-check") as mp:
        assert sha(os.path.join(mp, name)) == hashlib.sha256(data[name]).hexdigest()
        assert kernel_stats(mp, lambda s: s["passthrough_opens"] == 1)["read_requests"] == 0


@needs_fuse
@needs_passthrough
def test_a_copy_damaged_on_disk_is_never_served(tagged, tmp_path):
    hub, repo, data = tagged
    opts = ("--passthrough", "--cache-dir", str(tmp_path / "cache"))
    name = "big/f0.bin"
    want = hashlib.sha256(data[name]).hexdigest()
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "m1", *opts) as mp:
        assert sha(os.path.join(mp, name)) == want
        kernel_stats(mp, lambda s: s["copies"]["made"] == 1)
    [copy] = list((tmp_path / "cache" / "files").glob("??/*"))
    with open(copy, "r+b") as f:  # a bad disk: one byte changed, the size the same
        f.seek(3 * MIB)
        f.write(bytes([data[name][3 * MIB] ^ 0xFF]))
    _record_check(str(copy), time.time() - 25 * 3600)  # a day has passed since its check
    with mounted(hub.url, hub.token, f"{repo}@v1", tmp_path / "m2", *opts) as mp:
        assert sha(os.path.join(mp, name)) == want  # from chunks, not from the copy
        stats = kernel_stats(mp, lambda s: s["copies"]["made"] == 1)
        assert stats["copies"]["corruptions"] == 1 and stats["passthrough_opens"] == 0
        assert sha(os.path.join(mp, name)) == want  # from the new copy
        assert kernel_stats(mp, lambda s: s["passthrough_opens"] == 1)["copies"]["corruptions"] == 1


@needs_fuse
def test_passthrough_refuses_what_it_cannot_serve(tagged, tmp_path):
    hub, repo, _ = tagged
    mp = tmp_path / "m"
    mp.mkdir()
    cases = [
        (("--passthrough", "--cache-dir", str(tmp_path / "c")), "main", "is a branch"),
        (("--passthrough",), "v1", "needs --cache-dir"),
        (("--passthrough", "--cache-dir", str(tmp_path / "c"), "-o", "max_read=65536"), "v1", "takes no -o options"),
        (("--no-passthrough-check", "--cache-dir", str(tmp_path / "c")), "v1", "needs --passthrough"),
        (("--copies-dir", str(tmp_path / "k"), "--cache-dir", str(tmp_path / "c")), "v1", "--copies-dir needs --passthrough"),
    ]
    for options, ref, message in cases:
        proc = fabric("mount", hub.url, f"{repo}@{ref}", str(mp), *options, token=hub.token, check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
        assert not os.path.ismount(mp)
