"""Times that last (issue 13, point 5): ctime, and the mtime and ctime a directory gets
from the creates, renames and unlinks in it, survive a remount and a commit.

The same operations run on a ``--rw`` mount and on a local directory; which operation
last set each time (mtime and ctime of every file and directory) must agree. Then the
mount is unmounted and mounted again, and its commit mounted: every time is what it
was, to the nanosecond.
"""

from __future__ import annotations

import io
import json
import os
import time

from tests.fuse_helpers import fabric, mounted, needs_fuse
from tests.hubserver import unique_name

pytestmark = needs_fuse

#: Between two operations: far more than a coarse file-system clock's tick.
PAUSE = 0.05


def _ops(root: str) -> None:
    """The same changes, applied to any directory (each after a pause, so each has its own time)."""
    j = lambda *p: os.path.join(root, "top", *p)  # noqa: E731
    steps = [
        lambda: os.makedirs(j("d", "sub")),
        lambda: open(j("d", "f"), "w").write("one"),
        lambda: open(j("d", "sub", "keep"), "w").write("keep"),
        lambda: os.chmod(j("d", "f"), 0o600),  # ctime of f only
        lambda: open(j("d", "sub", "keep"), "a").write("more"),  # mtime and ctime of keep
        lambda: os.rename(j("d", "f"), j("d", "sub", "g")),  # d, sub and g's ctime
        lambda: os.symlink("g", j("d", "sub", "l")),
        lambda: open(j("d", "w"), "w").close(),
        lambda: os.unlink(j("d", "w")),  # d changes
        lambda: os.mkdir(j("e")),
        lambda: os.mkdir(j("e", "gone")),
        lambda: os.rmdir(j("e", "gone")),  # e changes
        lambda: os.chown(j("d", "sub", "keep"), 1234, 5678),  # ctime of keep
        lambda: os.truncate(j("d", "sub", "keep"), 2),  # mtime and ctime of keep
        lambda: os.rename(j("d", "sub"), j("e", "sub2")),  # d, e, and the moved directory's ctime
    ]
    for step in steps:
        time.sleep(PAUSE)
        step()
    time.sleep(PAUSE)


def _times(root: str, below: str = "top") -> dict[str, tuple[int, int]]:
    """``path -> (mtime_ns, ctime_ns)`` of everything under ``root/below`` (``below`` itself too)."""
    out = {}
    base = os.path.join(root, below)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in ["", *dirnames, *filenames]:
            full = os.path.join(dirpath, name) if name else dirpath
            if name == "" and dirpath != base:
                continue
            st = os.lstat(full)
            out[os.path.relpath(full, root)] = (st.st_mtime_ns, st.st_ctime_ns)
    return out


def _which_step(times: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Each time replaced by the number of the group of times it falls in (groups: times closer
    than half a pause), so that two file systems' clocks can be compared by what set each time."""
    values = sorted({v for pair in times.values() for v in pair})
    group, last, index = -1, None, {}
    for v in values:
        if last is None or v - last > PAUSE * 1e9 / 2:
            group += 1
        index[v] = group
        last = v
    return {p: (index[m], index[c]) for p, (m, c) in times.items()}


def test_times_follow_the_operations_and_survive_remount_and_commit(hub, tmp_path):
    repo = unique_name("times")
    hub.plane().create_repo(repo)
    local = tmp_path / "local"
    local.mkdir()
    os.mkdir(local / "top")
    _ops(str(local))
    expected = _which_step(_times(str(local)))
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        os.mkdir(os.path.join(mnt, "top"))
        _ops(mnt)
        seen = _times(mnt)
    assert _which_step(seen) == expected
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt2", "--rw") as mnt:
        assert _times(mnt) == seen
    out = json.loads(fabric("--server", hub.url, "--json", "commit", f"{repo}@main", "-m", "times", token=hub.token).stdout)
    with mounted(hub.url, hub.token, f"{repo}@{out['id']}", tmp_path / "mnt3") as mnt:
        assert _times(mnt) == seen


def test_an_implicit_directory_keeps_the_time_a_create_gave_it(hub, tmp_path):
    repo = unique_name("times")
    plane = hub.plane()
    plane.create_repo(repo)
    plane.put_object(repo, "main", "imp/deeper/a.txt", io.BytesIO(b"a"))  # no directory markers
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", "--rw") as mnt:
        before = os.stat(os.path.join(mnt, "imp", "deeper"))
        time.sleep(PAUSE)
        open(os.path.join(mnt, "imp", "deeper", "b.txt"), "w").write("b")
        os.unlink(os.path.join(mnt, "imp", "deeper", "a.txt"))
        seen = _times(mnt, "imp")
        assert seen["imp/deeper"][0] > before.st_mtime_ns
        assert seen["imp/deeper"][1] > before.st_ctime_ns
    with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt2") as mnt:
        assert _times(mnt, "imp") == seen
