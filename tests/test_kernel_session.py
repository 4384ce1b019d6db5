"""``fuse.kernel.session.Session``, the request loop of ``fabric mount --passthrough``: two
threads read and answer requests while answers are quick; while one is slow, more threads are
started (up to the limit), so the other requests are still answered, and they end again
once the slow ones are done."""

from __future__ import annotations

import errno
import os
import stat
import threading
import time

from fuse.kernel import protocol as P
from fuse.kernel.session import READERS, Session
from tests.fuse_helpers import needs_fuse

MOST = 6


class _Handler:
    """A mount of an empty directory whose lookups wait for ``release`` (slow), and whose
    root's attributes are never cached (each ``stat`` asks)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lookups = 0
        self._lock = threading.Lock()

    def handle(self, op: int, nodeid: int, arg: memoryview) -> bytes | None:
        if op == P.INIT:
            major, minor, max_readahead, flags, _ = P.INIT_IN.unpack_from(arg)
            want = flags & P.PARALLEL_DIROPS  # (lookups in one directory at once)
            return P.INIT_OUT.pack(P.MAJOR, min(minor, P.MINOR), max_readahead, want, 16, 12, 4096, 1, 32, 0, 0, 0)
        if op == P.GETATTR:
            return P.ATTR_OUT.pack(0, 0, 0) + P.attr({"st_ino": 1, "st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2})
        if op == P.LOOKUP:
            with self._lock:
                self.lookups += 1
            self.release.wait(30)
            raise OSError(errno.ENOENT, "")
        if op in P.NO_REPLY or op == P.DESTROY:
            return None
        raise OSError(errno.ENOSYS, "")


def _stat_quietly(path: str) -> None:
    try:
        os.stat(path)
    except OSError:
        pass


def _until(test, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not test() and time.monotonic() < deadline:
        time.sleep(0.01)
    return test()


@needs_fuse
def test_more_threads_serve_while_answers_are_slow_and_end_after(tmp_path):
    mp = str(tmp_path / "mnt")
    os.mkdir(mp)
    session = Session(mp, "fabric-test", allow_other=False, read_only=True)
    handler = _Handler()
    server = threading.Thread(target=session.serve, args=(handler, MOST), daemon=True)
    server.start()
    slow = [threading.Thread(target=_stat_quietly, args=(os.path.join(mp, f"slow-{i}"),), daemon=True)
            for i in range(MOST - 1)]
    try:
        assert _until(lambda: session.readers is not None)
        for _ in range(200):  # quick requests: the two readers answer them all
            os.stat(mp)
        assert session.readers.threads() == READERS
        for t in slow:
            t.start()
        assert _until(lambda: handler.lookups == MOST - 1)  # each waits in a thread of its own
        started = time.monotonic()
        for _ in range(20):  # each asks the mount again (the attributes are valid for 0 s)
            assert stat.S_ISDIR(os.stat(mp).st_mode)
        assert time.monotonic() - started < 2.0  # answered by the thread started to read
        assert session.readers.threads() == MOST
    finally:
        handler.release.set()
        for t in slow:
            t.join(10)
    assert handler.lookups == len(slow)  # each slow lookup was answered in the end
    assert _until(lambda: session.readers.threads() == READERS)  # the threads added have ended
    session.unmount()
    server.join(10)
    assert not server.is_alive()
