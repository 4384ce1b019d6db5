"""Long-running services raise their soft limit of open files to the hard limit at start
(``fabric/util/limits.py``): a hub, a spoke and a mount started under a soft limit of 512
each run with the hard limit."""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
from collections.abc import Iterator

from fabric.client.transfer import import_directory
from fuse.mount import read_state
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import start_hub, unique_name
from tests.spokeserver import start_spoke

LOW = 512


@contextlib.contextmanager
def soft_open_files(limit: int) -> Iterator[int]:
    """This process's soft limit of open files set to ``limit`` (inherited by what it starts
    meanwhile); yields the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_files_limit(pid: int) -> tuple[str, str]:
    """The soft and hard limits of open files of process ``pid`` (as ``/proc`` writes them)."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return soft, hard
    raise AssertionError(f"no open-file limit in /proc/{pid}/limits")


def expected(hard: int) -> str:
    return "1048576" if hard == resource.RLIM_INFINITY else str(hard)


def test_the_soft_limit_is_raised_to_the_hard_one_and_never_lowered():
    probe = "from fabric.util.limits import raise_open_files_limit as r; import resource; print(r(), *resource.getrlimit(resource.RLIMIT_NOFILE))"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > LOW, "the test needs a hard limit above 512"
    with soft_open_files(LOW):
        raised = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert raised[0] == raised[1] == expected(hard)
    with soft_open_files(LOW):
        # A hard limit of its own at 600: raised to that, not beyond.
        lowered = subprocess.run(
            [sys.executable, "-c", f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({LOW}, 600)); {probe}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    assert lowered == ["600", "600", "600"]


@needs_fuse
def test_a_hub_a_spoke_and_a_mount_started_under_a_low_limit_run_with_the_hard_one(tmp_path):
    with soft_open_files(LOW) as hard, start_hub(tmp_path / "hub") as hub:
        plane = hub.plane()
        repo = unique_name("nofile")
        plane.create_repo(repo)
        src = tmp_path / "src"
        src.mkdir()
        (src / "a.txt").write_bytes(b"open files\n")
        import_directory(plane, str(src), repo, "main", "one file")
        with start_spoke(hub.url, tmp_path / "cache", token=hub.token) as spoke, mounted(spoke.url, hub.token, f"{repo}@main", tmp_path / "mnt") as mp:
            assert (tmp_path / "mnt" / "a.txt").read_bytes() == b"open files\n"
            for pid in (hub.proc.pid, spoke.proc.pid, read_state(mp)["pid"]):
                assert open_files_limit(pid) == (expected(hard), "unlimited" if hard == resource.RLIM_INFINITY else str(hard)), pid
