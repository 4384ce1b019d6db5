#!/usr/bin/env python3
"""A long chaos soak: a hub (or two on PostgreSQL), two spokes behind WAN links, mounts, S3 and
REST clients, faults at random moments from a seeded schedule; prints a table, writes JSON,
exits 1 if anything acknowledged was lost, any read was wrong, or any check failed.

    .venv/bin/python scripts/chaos_soak.py --seed 7 --minutes 30 [--postgres] [--json out.json]

See docs/chaos.md.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.chaos.soak import Config, run, save, table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--postgres", action="store_true", help="two hub processes on one PostgreSQL catalog")
    ap.add_argument("--workdir", default="/tmp/fabric-chaos-soak")
    ap.add_argument("--checkpoint-every", type=float, default=300.0, help="seconds between checkpoints")
    ap.add_argument("--fault-scale", type=float, default=1.0, help="multiplies the gaps between faults")
    ap.add_argument("--no-mounts", action="store_true", help="leave out the FUSE mounts (no /dev/fuse)")
    ap.add_argument("--json", default=None, help="write the report here (default: WORKDIR/report.json)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    cfg = Config(seed=a.seed, seconds=a.minutes * 60, workdir=a.workdir, postgres=a.postgres,
                 checkpoint_every=a.checkpoint_every, fault_scale=a.fault_scale, mounts=not a.no_mounts,
                 verbose=not a.quiet)
    report = run(cfg)
    out = a.json or os.path.join(os.path.dirname(a.workdir.rstrip("/")) or ".", os.path.basename(a.workdir.rstrip("/")) + ".json")
    save(report, out)
    print(table(report))
    print(f"report: {out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
