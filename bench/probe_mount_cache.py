#!/usr/bin/env python3
"""Whether a mount's ``--cache-dir`` (packs) takes in a new working set, and what a cyclic
read larger than it keeps.

A hub runs on loopback; a mount of it (``--cache-dir`` bounded by ``--cache-size``, a small
``--memory-cache``) reads files of random bytes. An ``--old-mib`` file is read once and
again (a working set that fills the cache and is then never read again), then the
``--mib`` file is read ``--passes`` times, the page cache dropped before each read (root
only). Each pass prints its wall time and the MiB the mount fetched from the hub, from the
mount's stats file.

- ``--fabric-src`` runs another checkout of fabric (a ``git archive`` of a revision).

    python bench/probe_mount_cache.py --old-mib 256 --mib 192 --cache-size 256MiB --passes 5
    python bench/probe_mount_cache.py --mib 768 --cache-size 256MiB --passes 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from _common import drop_page_cache, read_sequential  # noqa: E402
from probe_spoke_fill import MiB, make_data  # noqa: E402


def fetched_bytes(stats_file: str) -> int:
    """The mount's bytes fetched so far (its stats file is rewritten every second)."""
    time.sleep(1.2)
    with open(stats_file) as f:
        return json.load(f)["fetched_bytes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=192, help="size of the file read over and over (MiB)")
    ap.add_argument("--old-mib", type=int, default=0, help="size of a file read twice before it (MiB; 0: none)")
    ap.add_argument("--cache-size", default="256MiB", help="the mount's --cache-size")
    ap.add_argument("--memory-cache", default="16MiB", help="the mount's --memory-cache")
    ap.add_argument("--passes", type=int, default=5, help="reads of the file")
    ap.add_argument("--work", default=None, help="work directory (default: a new one under /tmp; kept)")
    ap.add_argument("--fabric-src", default=os.path.dirname(ROOT), help="the fabric checkout to run")
    args = ap.parse_args()
    src_root = os.path.abspath(args.fabric_src)
    sys.path.insert(0, src_root)
    from fabric.client.transfer import import_directory
    from fuse.mount import stats_path
    from tests.spokeserver import start_restartable_hub

    work, src = make_data(args.work, "probe-mount-cache-", args.mib, args.old_mib)
    env = {**os.environ, "PYTHONPATH": src_root}
    fabric = [sys.executable, "-m", "fabric.cli.main"]
    with start_restartable_hub(os.path.join(work, "hub")) as hub:
        repo = "probe-mount-cache"
        hub.plane().create_repo(repo)
        commit = import_directory(hub.plane(), src, repo, "main", "probe").commit.id
        mp = os.path.join(work, "mnt")
        os.makedirs(mp)
        subprocess.run(
            [*fabric, "mount", hub.url, f"{repo}@{commit}", mp, "--token", hub.token,
             "--cache-dir", os.path.join(work, "cache"), "--cache-size", args.cache_size,
             "--memory-cache", args.memory_cache, "--log-file", os.path.join(work, "mount.log")],
            check=True, env=env,
        )
        try:
            stats = stats_path(mp)
            if args.old_mib:
                for _ in range(2):
                    drop_page_cache()
                    read_sequential(os.path.join(mp, "old.bin"))
            for p in range(args.passes):
                dropped = drop_page_cache()
                before = fetched_bytes(stats)
                started = time.monotonic()
                n = read_sequential(os.path.join(mp, "data.bin"))
                wall = time.monotonic() - started
                print(
                    f"pass {p}: {n / MiB:.0f} MiB in {wall:.2f} s; fetched from the hub "
                    f"{(fetched_bytes(stats) - before) / MiB:.0f} MiB; page cache dropped: {dropped}",
                    flush=True,
                )
        finally:
            subprocess.run([*fabric, "umount", mp], check=False, env=env)


if __name__ == "__main__":
    main()
