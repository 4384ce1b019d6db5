"""Where a process's threads wait inside the kernel: sample the kernel stacks of its threads
that are in one of a few system calls, and count them.

Python profilers see a thread sitting on the line of a system call either way; this tells a
thread that waits in the kernel (for a disk's writeback, say) from one that does not.
Reads ``/proc/PID/task/*/syscall`` and ``.../stack`` (root).

    python scripts/kernel_stacks.py PID SECONDS [--syscalls 1,18,296,328,74,75,306]

The default system calls (x86-64 numbers) are write, pwrite64, pwritev, pwritev2, fsync,
fdatasync and syncfs.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

DEFAULT_SYSCALLS = "1,18,296,328,74,75,306"


def thread_in(pid: int, tid: str, syscalls: set[str]) -> tuple[str, list[str]] | None:
    """(system call number, kernel stack's function names) of a thread inside one of
    ``syscalls``; ``None`` otherwise (or when it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            call = f.read().split()
        if not call or call[0] not in syscalls:
            return None
        with open(f"/proc/{pid}/task/{tid}/stack") as f:
            lines = f.read().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return call[0], [line.split("]", 1)[1].strip().split("+")[0] for line in lines if "]" in line]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pid", type=int)
    ap.add_argument("seconds", type=float)
    ap.add_argument("--syscalls", default=DEFAULT_SYSCALLS, help=f"system call numbers (default {DEFAULT_SYSCALLS})")
    ap.add_argument("--interval", type=float, default=0.005, help="seconds between samples (default 0.005)")
    args = ap.parse_args()
    syscalls = set(args.syscalls.split(","))
    by_call: collections.Counter[str] = collections.Counter()
    tops: collections.Counter[str] = collections.Counter()
    paths: collections.Counter[str] = collections.Counter()
    rounds = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end and os.path.isdir(f"/proc/{args.pid}"):
        for tid in os.listdir(f"/proc/{args.pid}/task"):
            found = thread_in(args.pid, tid, syscalls)
            if found is None:
                continue
            call, stack = found
            by_call[call] += 1
            if stack:
                tops[stack[0]] += 1
                paths[" <- ".join(stack[:6])] += 1
        rounds += 1
        time.sleep(args.interval)
    print(f"{rounds} rounds of samples; threads found in system calls (by number): {dict(by_call)}")
    for name, n in tops.most_common(12):
        print(f"{n:6} {name}")
    print("innermost six frames:")
    for path, n in paths.most_common(8):
        print(f"{n:6} {path}")


if __name__ == "__main__":
    main()
