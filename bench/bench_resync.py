#!/usr/bin/env python3
"""Bringing a copy up to date after its files' times were lost: ``fabric export --checksum`` vs
``rsync -a`` (its delta transfer) and ``rsync -a -c``, over the same emulated WAN.

A copy made without keeping times (``cp`` without ``-p``, a restore from an archive that kept
none) holds the right bytes with the wrong modification times, so the quick check of size and
time fails for every file. Per round, each tool first makes an exact copy of v1 of the
versions data set (1,256 files of 1 MiB) through the link (untimed), then every file of the
copy is given the current time, and the timed command brings the copy up to date again:

    fabric --server PROXY-TO-HUB export bench@main DST             # quick check only: every file written again
    fabric --server PROXY-TO-HUB export bench@main DST --checksum   # read and cut locally, times set
    rsync -a rsync://PROXY/v1/ DST/                                # rsync's delta transfer per file
    rsync -a -c rsync://PROXY/v1/ DST/                             # whole-file checksums first

The link: ``WanProxy`` at 50 ms RTT and 1 Gbit/s (``--rtt-ms``, ``--rate-mbit``). Reported
per tool: wall time, bytes through the link, and whether the copy is exact afterwards.

    python bench/bench_resync.py --runs 2
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import fabric_env, median, remove, run, spread  # noqa: E402
from bench_remote import Hub, RsyncDaemon, ensure_versions, timed_phase, wan  # noqa: E402
from bench_spoke import tree_index  # noqa: E402


def lose_times(root: str) -> None:
    """Give every file under ``root`` the current time, as a copy without ``-p`` would."""
    now = time.time_ns()
    for dirpath, _, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(dirpath, name), ns=(now, now))


def exact(dst: str, src: str) -> bool:
    """Same files, sizes and times (to the second) as ``src``."""
    return tree_index(dst) == tree_index(src)


def fabric_rows(a: argparse.Namespace, work: str, v1: str, r: int) -> list[dict]:
    hub = Hub(a.python, os.path.join(work, f"hub-{r}"))
    rows = []
    try:
        run(hub.cli("repo", "create", "bench"), env=fabric_env())
        run(hub.cli("import", v1, "bench@main", "-m", "v1"), env=fabric_env())
        with wan(hub.port, a.rtt_ms, a.rate_mbit) as proxy:
            for name, extra in (("fabric export", []), ("fabric export --checksum", ["--checksum"])):
                dst = os.path.join(work, f"fabric-{r}")
                remove(dst)
                run(hub.cli("export", "bench@main", dst, url=proxy.url_for()), env=fabric_env())
                lose_times(dst)
                cmd = hub.cli("export", "bench@main", dst, *extra, url=proxy.url_for())
                t, w = timed_phase(cmd, proxy, env=fabric_env(), servers=(hub.proc.pid,))
                rows.append({"tool": name, "round": r, "wall": t.wall, "wire": w["total"], "exact": exact(dst, v1), "cmd": shlex.join(cmd)})
                remove(dst)
    finally:
        hub.stop()
        remove(os.path.join(work, f"hub-{r}"))
    return rows


def rsync_rows(a: argparse.Namespace, work: str, v1: str, r: int) -> list[dict]:
    daemon = RsyncDaemon(os.path.join(work, f"daemon-{r}"), {"v1": (v1, True)})
    rows = []
    try:
        with wan(daemon.port, a.rtt_ms, a.rate_mbit) as proxy:
            source = f"rsync://127.0.0.1:{proxy.port}/v1/"
            for name, extra in (("rsync -a", []), ("rsync -a -c", ["-c"])):
                dst = os.path.join(work, f"rsync-{r}")
                remove(dst)
                subprocess.run(["rsync", "-a", source, dst + "/"], check=True)
                lose_times(dst)
                cmd = ["rsync", "-a", *extra, source, dst + "/"]
                t, w = timed_phase(cmd, proxy, servers=(daemon.proc.pid,))
                rows.append({"tool": name, "round": r, "wall": t.wall, "wire": w["total"], "exact": exact(dst, v1), "cmd": shlex.join(cmd)})
                remove(dst)
    finally:
        daemon.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rtt-ms", type=float, default=50.0)
    ap.add_argument("--rate-mbit", type=float, default=1000.0)
    ap.add_argument("--dataset", help="versions data set (default: generated under bench/work/data/)")
    ap.add_argument("--work", default=os.path.join(HERE, "work", "stores", "resync"))
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    v1 = os.path.join(a.dataset or ensure_versions(a.python, False, 1), "v1")
    remove(a.work)
    os.makedirs(a.work)
    rows = []
    try:
        for r in range(a.runs):
            for row in fabric_rows(a, a.work, v1, r) + rsync_rows(a, a.work, v1, r):
                rows.append(row)
                print(f"round {r}: {row['tool']}: {row['wall']:.2f} s, {row['wire'] / 2**20:.1f} MiB over the link, exact {row['exact']}", flush=True)
    finally:
        remove(a.work)
    print(f"\nv1 ({len(tree_index(v1))} files) brought up to date after its copy's times were lost; "
          f"{a.rtt_ms:g} ms RTT, {a.rate_mbit:g} Mbit/s; {a.runs} round(s), median (min..max):\n")
    print("| tool | wall s | MiB over the link | copy exact afterwards |")
    print("|---|---:|---:|---|")
    for tool in dict.fromkeys(row["tool"] for row in rows):
        mine = [row for row in rows if row["tool"] == tool]
        wire = median([row["wire"] / 2**20 for row in mine])
        print(f"| `{tool}` | {spread([row['wall'] for row in mine])} | {wire:.1f} | {all(row['exact'] for row in mine)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
