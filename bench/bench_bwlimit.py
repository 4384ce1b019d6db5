#!/usr/bin/env python3
"""How closely a bandwidth cap is held: ``fabric --bwlimit`` against ``rsync --bwlimit``.

A hub and an rsync daemon on loopback (no WAN: the cap is the only limit). Per round and cap,
each tool moves the same directory of incompressible files (``--files`` x ``--mib`` MiB) both
ways, capped one way at a time:

    fabric --server HUB --bwlimit CAP:off import DATA bench-N@main -m up     # upload
    fabric --server HUB --bwlimit off:CAP export bench@main OUT              # download
    rsync -a --bwlimit=CAP_KIB DATA/ rsync://DAEMON/dst/                      # upload
    rsync -a --bwlimit=CAP_KIB rsync://DAEMON/src/ OUT/                       # download

It prints each transfer's rate (bytes over the whole command's wall time) as a share of its
cap: 1.00 is a cap held exactly, less is time lost to start-up and the tool's own limits, more
is a cap overrun. rsync is configured as its users cap it (``--bwlimit`` in KiB/s, the daemon
protocol, no compression: the bytes do not compress).

    python bench/bench_bwlimit.py                          # caps 20M and 50M, 3 rounds
    python bench/bench_bwlimit.py --caps 10M --runs 1
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import fabric_env, remove, run, spread  # noqa: E402
from bench_remote import Hub, RsyncDaemon  # noqa: E402

from fabric.util.sizes import parse_size  # noqa: E402

MiB = 1 << 20


def upload_repo(r: int, cap_text: str) -> str:
    """The repository round ``r`` imports into under the cap ``cap_text``."""
    return f"up-{r}-{cap_text.lower().replace('.', '-')}"


def make_data(root: str, files: int, mib: int) -> int:
    os.makedirs(root)
    for i in range(files):
        with open(os.path.join(root, f"f{i:03d}.bin"), "wb") as f:
            f.write(os.urandom(mib * MiB))
    return files * mib * MiB


def timed(cmd: list[str], env: dict | None = None) -> float:
    started = time.monotonic()
    run(cmd, env=env)
    return time.monotonic() - started


def one_round(a: argparse.Namespace, work: str, data: str, size: int, hub: Hub, daemon: RsyncDaemon, r: int) -> list[dict]:
    out = []
    for cap_text in a.caps:
        cap = parse_size(cap_text)
        cap_kib = str(cap // 1024)
        dst = os.path.join(work, f"out-{r}-{cap_text}")
        up = timed(hub.cli("--bwlimit", f"{cap_text}:off", "import", data, f"{upload_repo(r, cap_text)}@main", "-m", "up"), fabric_env())
        down = timed(hub.cli("--bwlimit", f"off:{cap_text}", "export", "bench@main", dst + "-fabric"), fabric_env())
        rs_up = timed(["rsync", "-a", f"--bwlimit={cap_kib}", data + "/", f"rsync://127.0.0.1:{daemon.port}/dst/{r}-{cap_text}/"])
        rs_down = timed(["rsync", "-a", f"--bwlimit={cap_kib}", f"rsync://127.0.0.1:{daemon.port}/src/", dst + "-rsync/"])
        for tool, direction, wall in (("fabric", "up", up), ("fabric", "down", down), ("rsync", "up", rs_up), ("rsync", "down", rs_down)):
            out.append({"round": r, "cap": cap_text, "tool": tool, "direction": direction, "wall": wall, "share": size / wall / cap})
        remove(dst + "-fabric")
        remove(dst + "-rsync")
        print(f"round {r} cap {cap_text}: " + ", ".join(f"{o['tool']} {o['direction']} {o['share']:.2f}" for o in out[-4:]), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", type=lambda s: s.split(","), default=["20M", "50M"], help="caps, comma-separated (K, M, G: binary units)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mib", type=int, default=16, help="MiB per file")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    work = tempfile.mkdtemp(prefix="bench-bwlimit-")
    try:
        data = os.path.join(work, "data")
        size = make_data(data, a.files, a.mib)
        hub = Hub(a.python, os.path.join(work, "hub"))
        daemon = RsyncDaemon(os.path.join(work, "daemon"), {"dst": (os.path.join(work, "rsync-dst"), False), "src": (data, True)})
        os.makedirs(os.path.join(work, "rsync-dst"))
        try:
            run(hub.cli("repo", "create", "bench"), env=fabric_env())
            run(hub.cli("import", data, "bench@main", "-m", "data"), env=fabric_env())  # untimed
            for r in range(a.runs):
                for cap_text in a.caps:
                    run(hub.cli("repo", "create", upload_repo(r, cap_text)), env=fabric_env())
            rows = [row for r in range(a.runs) for row in one_round(a, work, data, size, hub, daemon, r)]
        finally:
            hub.stop()
            daemon.stop()
        print(f"\n{a.files} files x {a.mib} MiB ({size / MiB:.0f} MiB), loopback, {a.runs} round(s); rate / cap, median (min..max):\n")
        print("| cap | direction | fabric --bwlimit | rsync --bwlimit |")
        print("|---|---|---:|---:|")
        for cap_text in a.caps:
            for direction in ("up", "down"):
                cells = []
                for tool in ("fabric", "rsync"):
                    shares = [o["share"] for o in rows if o["cap"] == cap_text and o["direction"] == direction and o["tool"] == tool]
                    cells.append(spread(shares))
                print(f"| {cap_text} | {direction} | {cells[0]} | {cells[1]} |")
    finally:
        remove(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
