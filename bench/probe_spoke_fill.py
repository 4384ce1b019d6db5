#!/usr/bin/env python3
"""What a spoke's chunk cache costs while it fills, and whether it takes in a new working set.

A hub and a spoke run on loopback (no WAN). The hub holds ``--mib`` MiB of random bytes in
one file, and optionally an ``--old-mib`` file read first (an old working set that fills the
cache and is then never read again). One client reads the file's chunks from the spoke with
``/chunks/frames`` requests of 2,000 ids, ``--passes`` times. Each pass prints its wall time,
the spoke's and the hub's CPU seconds (user + system, from ``/proc``), the MiB the spoke
fetched from the hub in it, and the spoke's evictions and cache files reused so far.

- ``--cache-root`` puts the spoke's cache elsewhere (``/dev/shm``: no disk file system, to
  see what the cache's file operations cost);
- ``--fabric-src`` runs another checkout of fabric (a ``git archive`` of a revision) for
  the hub, the spoke and this client.

    python bench/probe_spoke_fill.py --mib 512 --rounds 2
    python bench/probe_spoke_fill.py --old-mib 256 --mib 192 --cache-size 256MiB --passes 6
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_remote import proc_cpu  # noqa: E402

MiB = 1 << 20
IDS_PER_REQUEST = 2000


def write_random(path: str, mib: int, seed: int) -> None:
    from tests.spokeserver import random_bytes

    with open(path, "wb") as f:
        for i in range(0, mib, 64):
            f.write(random_bytes(min(64, mib - i) * MiB, seed + i))


def make_data(work: str | None, prefix: str, mib: int, old_mib: int) -> tuple[str, str]:
    """A work directory (``work``, or a new one under /tmp, kept) and in it ``src/`` holding
    ``data.bin`` of ``mib`` MiB and, unless ``old_mib`` is 0, ``old.bin``: random bytes."""
    work = work or tempfile.mkdtemp(prefix=prefix)
    src = os.path.join(work, "src")
    os.makedirs(src)
    write_random(os.path.join(src, "data.bin"), mib, 0)
    if old_mib:
        write_random(os.path.join(src, "old.bin"), old_mib, 100_000)
    print(f"work directory {work} (kept: removing it at once would slow the next file creations on ext4 without a journal)")
    return work, src


def read_all(plane, repo: str, ids: list[bytes]) -> int:  # noqa: ANN001 - an HttpPlane
    n = 0
    for i in range(0, len(ids), IDS_PER_REQUEST):
        for _, frame in plane.frames(ids[i : i + IDS_PER_REQUEST], repo=repo):
            n += len(frame)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="size of the file read (MiB)")
    ap.add_argument("--old-mib", type=int, default=0, help="size of a file read once before it (MiB; 0: none)")
    ap.add_argument("--cache-size", default="4GiB", help="the spoke's --cache-size")
    ap.add_argument("--cache-root", default=None, help="directory for the spoke's cache (default: the work directory)")
    ap.add_argument("--rounds", type=int, default=1, help="fresh spokes, one after the other")
    ap.add_argument("--passes", type=int, default=1, help="reads of the file per spoke")
    ap.add_argument("--work", default=None, help="work directory (default: a new one under /tmp; kept)")
    ap.add_argument("--fabric-src", default=ROOT, help="the fabric checkout to run")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.fabric_src))
    from fabric.client.http import HttpPlane
    from fabric.client.transfer import import_directory
    from tests.spokeserver import start_restartable_hub, start_spoke

    work, src = make_data(args.work, "probe-spoke-fill-", args.mib, args.old_mib)
    with start_restartable_hub(os.path.join(work, "hub")) as hub:
        repo = "probe-spoke-fill"
        hub.plane().create_repo(repo)
        commit = import_directory(hub.plane(), src, repo, "main", "probe").commit.id
        for rnd in range(args.rounds):
            cache = os.path.join(args.cache_root or work, f"cache{rnd}")
            with start_spoke(hub.url, cache, args.cache_size, token=hub.token) as spoke:
                plane = HttpPlane(spoke.url, hub.token)
                if args.old_mib:
                    read_all(plane, repo, [c for c, _ in plane.stat_chunks(repo, commit, "old.bin").chunks])
                ids = [c for c, _ in plane.stat_chunks(repo, commit, "data.bin").chunks]
                for p in range(args.passes):
                    spoke_cpu, hub_cpu = proc_cpu(spoke.proc.pid), proc_cpu(hub.proc.pid)
                    missed = spoke.stats()["cache_miss_bytes"]
                    started = time.monotonic()
                    n = read_all(plane, repo, ids)
                    wall = time.monotonic() - started
                    st = spoke.stats()
                    print(
                        f"round {rnd} pass {p}: {n / MiB:.0f} MiB in {wall:.2f} s ({n / wall / 1e6:.0f} MB/s); "
                        f"CPU s: spoke {proc_cpu(spoke.proc.pid) - spoke_cpu:.2f}, hub {proc_cpu(hub.proc.pid) - hub_cpu:.2f}; "
                        f"fetched from the hub {(st['cache_miss_bytes'] - missed) / MiB:.0f} MiB; "
                        f"evictions {st['cache_evictions']}, files reused {st.get('cache_files_reused', '-')}",
                        flush=True,
                    )
                plane.close()


if __name__ == "__main__":
    main()
