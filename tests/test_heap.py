"""``map_big_buffers``: an import gives freed packs and compressed batches back to the system."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fabric.util.heap import CHOICE, USER_SETTINGS
from tests.conftest import ROOT

#: Frees 64 buffers of 1 MiB, each hemmed in on the heap by a smaller one kept alive,
#: after one 8 MiB buffer was freed (which would raise glibc's mmap threshold to 8 MiB);
#: prints by how many MiB the resident set shrank.
FREED = textwrap.dedent(
    """
    import sys
    from fabric.util.heap import map_big_buffers

    def rss_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) // 1024

    if sys.argv[1] == "mapped":
        assert map_big_buffers()
    big = bytearray(8 << 20)
    del big
    bufs, kept = [], []
    for _ in range(64):
        bufs.append(bytearray(1 << 20))
        kept.append(bytearray(150_000))
    before = rss_mib()
    del bufs
    print(before - rss_mib())
    """
)


def run_script(script: str, mode: str, **env: str) -> str:
    """What ``script`` prints, run with ``mode`` as its argument in a process of its own, whose
    malloc settings come from ``env`` alone (not from this process's environment)."""
    full = {k: v for k, v in os.environ.items() if k not in (*USER_SETTINGS, CHOICE)}
    full.update(PYTHONPATH=ROOT, PYTHONSAFEPATH="1", **env)
    return subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, env=full, timeout=60, check=True).stdout


def freed_mib(mode: str) -> int:
    return int(run_script(FREED, mode))


def test_big_buffers_go_back_to_the_system_when_freed() -> None:
    assert freed_mib("default") < 16  # glibc kept them in its heap
    assert freed_mib("mapped") >= 60


#: Makes and frees 200 buffers of 4 MiB, writing each whole, as a reader does with each
#: block it assembles; prints the page faults that took (and whether the setting took).
REUSED = textwrap.dedent(
    """
    import resource, sys
    from fabric.util.heap import reuse_freed_buffers

    tuned = reuse_freed_buffers() if sys.argv[1] == "reused" else False
    if sys.argv[1] == "fabric://":
        import fsspec
        fsspec.filesystem("fabric", server="http://127.0.0.1:9", token="t")  # connects to nothing yet
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        block = bytearray(4 << 20)
        block[:] = bytes(4 << 20)
        del block
    print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def faults(mode: str, **env: str) -> tuple[bool, int]:
    tuned, count = run_script(REUSED, mode, **env).split()
    return tuned == "True", int(count)


def test_a_streaming_process_reuses_freed_buffers_instead_of_faulting_in_fresh_pages() -> None:
    tuned, reused = faults("reused")
    assert tuned
    _, default = faults("default")
    # 200 x 4 MiB is 204,800 pages: glibc maps (and faults in) many of them anew by default.
    assert default > 50_000
    assert reused < 10_000


def test_a_fabric_file_system_has_its_process_reuse_freed_buffers() -> None:
    assert faults("fabric://")[1] < 10_000
    assert faults("fabric://", FABRIC_MALLOC="glibc")[1] > 50_000


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"FABRIC_MALLOC": "glibc"}])
def test_malloc_settings_of_the_environment_win(env: dict[str, str]) -> None:
    tuned, count = faults("reused", **env)
    assert not tuned
    assert count > 50_000
