"""A ``--rw`` mount never makes one change wait for another's network round trip (issue 11, point 11).

The mount sits behind a WAN with a long round trip. While an unlink in one
directory waits for the server, a create, a stat and a listing in another
directory answer from the mount's own state at once: they do not queue
behind a mount-wide lock held across the unlink's network call. (A listing is
not timed: ``opendir`` lists anew, close-to-open, which takes a round trip.)
"""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from fuse.pathlocks import PathLocks, ancestors
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import unique_name

pytestmark = pytest.mark.timeout(300)

#: One-way delay of the WAN: a staged change takes at least one round trip (1.6 s).
ONE_WAY_MS = 800
RTT = 2 * ONE_WAY_MS / 1000


@needs_fuse
def test_create_elsewhere_does_not_wait_for_a_slow_unlink(hub, tmp_path) -> None:
    plane = hub.plane()
    repo = unique_name("lock")
    plane.create_repo(repo)
    for path in ("d1/x", "d1/y", "d2/old"):
        plane.put_object(repo, "main", path, io.BytesIO(path.encode()))
    plane.commit(repo, "main", "two directories")

    host, port = hub.url.removeprefix("http://").split(":")
    with (
        WanProxy(host, int(port), delay_ms_up=ONE_WAY_MS, delay_ms_down=ONE_WAY_MS) as wan,
        mounted(wan.url_for(), hub.token, f"{repo}@main", tmp_path / "mnt", "--rw", "--attr-timeout", "120") as mnt,
    ):
        d1, d2 = os.path.join(mnt, "d1"), os.path.join(mnt, "d2")
        # Warm the mount's listings (and the kernel's names): what follows needs no listing.
        assert sorted(os.listdir(mnt)) == ["d1", "d2"]
        assert sorted(os.listdir(d1)) == ["x", "y"] and os.listdir(d2) == ["old"]
        os.stat(os.path.join(d1, "x"))
        os.stat(os.path.join(d2, "old"))

        slow: dict[str, float] = {}

        def unlink() -> None:
            t0 = time.monotonic()
            os.unlink(os.path.join(d1, "x"))  # one stage call: at least a round trip
            slow["unlink"] = time.monotonic() - t0

        worker = threading.Thread(target=unlink)
        worker.start()
        time.sleep(0.4)  # the unlink is now waiting for the server
        assert worker.is_alive()

        t0 = time.monotonic()
        fd = os.open(os.path.join(d2, "new"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        created = time.monotonic() - t0
        t0 = time.monotonic()
        os.stat(os.path.join(d2, "old"))
        os.stat(os.path.join(d2, "new"))
        looked = time.monotonic() - t0
        unlink_running = worker.is_alive()

        os.close(fd)  # staged now (an empty file: one round trip)
        worker.join(30)
        assert not worker.is_alive()

        assert slow["unlink"] >= RTT * 0.9, f"the unlink took {slow['unlink']:.2f} s: not slowed by the WAN"
        assert created < RTT / 4, f"a create in another directory took {created:.2f} s while an unlink waited for the server"
        assert looked < RTT / 4, f"stats in another directory took {looked:.2f} s while an unlink waited"
        assert unlink_running, "the unlink ended before the create was measured: nothing overlapped"
        assert sorted(os.listdir(d1)) == ["y"] and sorted(os.listdir(d2)) == ["new", "old"]

    assert plane.stat(repo, "main", "d2/new").size == 0
    assert sorted(p for p, _ in plane.walk(repo, "main", "d1/")) == ["d1/y"]


# -- the name locks themselves -------------------------------------------------------


def _blocked(locks: PathLocks, *paths: str) -> bool:
    """Does ``hold(*paths)`` wait (tried from another thread for 0.2 s)?"""
    got = threading.Event()

    def take() -> None:
        with locks.hold(*paths):
            got.set()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    return not got.wait(0.2)


def test_name_locks_conflict_only_on_the_same_names() -> None:
    assert ancestors("a/b/c") == ["a", "a/b"] and ancestors("a") == []
    locks = PathLocks()
    with locks.hold("d1/x"):
        assert _blocked(locks, "d1/x")  # a second change of one name waits (two creates, unlink during create)
        assert _blocked(locks, "d1")  # so does removing or renaming the directory above it
        assert not _blocked(locks, "d1/y")  # another name in the same directory goes on
        assert not _blocked(locks, "d2/z")  # and so does anything elsewhere
    with locks.hold("src", "dst/n"):  # a rename holds both names
        assert _blocked(locks, "src/deep/f") and _blocked(locks, "dst/n") and _blocked(locks, "dst")
        assert not _blocked(locks, "dst/m")
    assert not _blocked(locks, "d1/x") and not _blocked(locks, "src")  # all let go


def test_name_locks_are_taken_all_at_once() -> None:
    """Two renames in opposite directions never deadlock: each takes both names or waits for both."""
    locks = PathLocks()
    done = []

    def rename(a: str, b: str) -> None:
        for _ in range(2000):
            with locks.hold(a, b):
                pass
        done.append(a)

    threads = [threading.Thread(target=rename, args=ab) for ab in (("p", "q"), ("q", "p"), ("p/x", "q/y"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(done) == ["p", "p/x", "q"]
