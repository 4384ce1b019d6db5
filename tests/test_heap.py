"""``map_big_buffers``: an import gives freed packs and compressed batches back to the system."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def freed_mib(mode: str) -> int:
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONSAFEPATH="1")
    out = subprocess.run([sys.executable, "-c", FREED, mode], capture_output=True, text=True, env=env, timeout=60, check=True)
    return int(out.stdout)


def test_big_buffers_go_back_to_the_system_when_freed() -> None:
    assert freed_mib("default") < 16  # glibc kept them in its heap
    assert freed_mib("mapped") >= 60
