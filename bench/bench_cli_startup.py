#!/usr/bin/env python3
"""CLI start-up (issue 18): how long ``fabric`` takes to start, next to its peers' start-up.

Each command is timed as a whole process (fork to reap, CPU from the kernel's
rusage), in rounds: every round runs every command once, in turn, so that a
drift of the machine's speed touches them all alike; figures are medians over
the rounds with (min..max), and each ratio is taken round by round, then its
median is quoted::

    fabric --version
    fabric --help
    fabric ls --help
    fabric --server URL --token T repo list       # against a local hub (this benchmark starts it)
    python -c pass                                # the interpreter's own floor (same python, same site)
    restic version ; rclone version ; rsync --version   # the peers, where installed

``fabric`` is the console script beside this python (``python -m
fabric.cli.main`` where there is none), importing fabric from the working tree
(or ``FABRIC_SRC``, see README.md). ``--compare-rev REV`` also times the same
commands with fabric from a ``git archive`` of REV (in ``bench/work/src/``), in
the same rounds, and quotes the working tree's time over REV's.

Python's bytecode cache is on, as for an installed package: the benchmark
drops ``PYTHONDONTWRITEBYTECODE`` and keeps the cache under
``bench/work/pycache`` (``PYTHONPYCACHEPREFIX``), so the tree stays clean and
the warm-up rounds fill it. ``--no-bytecode-cache`` keeps the environment's
setting instead (with ``PYTHONDONTWRITEBYTECODE=1`` every start compiles
fabric's modules from source).

    python bench/bench_cli_startup.py                       # 15 rounds after 2 warm-up rounds
    python bench/bench_cli_startup.py --compare-rev 44409da --runs 21
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import REPO_ROOT, fabric_env, fabric_revision, loadavg, machine, median, run, run_timed, save_json  # noqa: E402
from bench_remote import Hub  # noqa: E402

WORK = os.path.join(HERE, "work")
PEERS = [["restic", "version"], ["rclone", "version"], ["rsync", "--version"]]


def fabric_launcher(python: str) -> list[str]:
    script = os.path.join(os.path.dirname(python), "fabric")
    return [script] if os.access(script, os.X_OK) else [python, "-m", "fabric.cli.main"]


def snapshot(rev: str) -> str:
    """A ``git archive`` of REV's packages in bench/work/src/cli-<rev>/ (made once)."""
    full = run(["git", "-C", REPO_ROOT, "rev-parse", "--verify", f"{rev}^{{commit}}"]).strip()
    dest = os.path.join(WORK, "src", f"cli-{full[:12]}")
    if not os.path.isdir(os.path.join(dest, "fabric")):
        tmp = dest + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        archive = subprocess.run(["git", "-C", REPO_ROOT, "archive", full], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        os.rename(tmp, dest)
    return dest


def environment(src: str | None, bytecode_cache: bool) -> dict[str, str]:
    env = fabric_env()
    if src is not None:
        env["PYTHONPATH"] = src
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(WORK, "pycache")
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="Counted rounds (default 15).")
    ap.add_argument("--warmup", type=int, default=2, help="Rounds run first and not counted (default 2).")
    ap.add_argument("--compare-rev", metavar="REV", help="Also time fabric from this revision (git archive), in the same rounds.")
    ap.add_argument("--no-bytecode-cache", action="store_true", help="Keep the environment's PYTHONDONTWRITEBYTECODE setting.")
    ap.add_argument("--python", default=sys.executable, help="The python whose fabric script is timed (default: this one).")
    ap.add_argument("--json-out", help="Also write every round's figures here (JSON).")
    a = ap.parse_args(argv)

    fabric = fabric_launcher(a.python)
    variants = {"tree": environment(None, not a.no_bytecode_cache)}
    if a.compare_rev:
        variants[a.compare_rev] = environment(snapshot(a.compare_rev), not a.no_bytecode_cache)

    os.makedirs(WORK, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="cli-startup-", dir=WORK)
    hub = Hub(a.python, os.path.join(tmp, "hub"))
    try:
        server = ["--server", hub.url, "--token", hub.token]
        for i in range(3):
            run([*fabric, *server, "-q", "repo", "create", f"startup-{i}"], env=variants["tree"])
        commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        for label, env in variants.items():
            suffix = "" if label == "tree" else f" @{label}"
            for args in (["--version"], ["--help"], ["ls", "--help"], [*server, "repo", "list"]):
                shown = "fabric " + " ".join("URL" if x == hub.url else "T" if x == hub.token else x for x in args)
                commands[shown + suffix] = ([*fabric, *args], env)
        commands["python -c pass"] = ([a.python, "-c", "pass"], variants["tree"])
        for cmd in PEERS:
            if shutil.which(cmd[0]):
                commands[" ".join(cmd)] = (cmd, None)

        walls: dict[str, list[float]] = {k: [] for k in commands}
        cpus: dict[str, list[float]] = {k: [] for k in commands}
        for r in range(a.warmup + a.runs):
            for key, (cmd, env) in commands.items():
                t = run_timed(cmd, env=env, sync=False)
                if r >= a.warmup:
                    walls[key].append(t.wall)
                    cpus[key].append(t.cpu)
            print(f"round {r + 1}/{a.warmup + a.runs}{' (warm-up)' if r < a.warmup else ''} done; load {loadavg()}",
                  file=sys.stderr, flush=True)
    finally:
        hub.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def ratio(a_key: str, b_key: str) -> float:
        return median([x / y for x, y in zip(walls[a_key], walls[b_key])])

    yardsticks = ["python -c pass"] + [" ".join(c) for c in PEERS if " ".join(c) in commands]
    info = machine()
    print(f"\nfabric {fabric_revision()}; python {info['python']}; {info.get('host_cpus')} CPUs ({info.get('cpu', '?')}); "
          f"load {loadavg()}; {a.runs} rounds after {a.warmup} warm-up; bytecode cache "
          f"{'as the environment says' if a.no_bytecode_cache else 'on'}; fabric = {shlex.join(fabric)}")
    head = ["command", "wall ms median (min..max)", "cpu ms"] + [f"x {y.split()[0]}" for y in yardsticks]
    if a.compare_rev:
        head.append(f"tree / {a.compare_rev}")
    print("\n| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for key in commands:
        w = walls[key]
        row = [f"`{key}`", f"{1000 * median(w):.0f} ({1000 * min(w):.0f}..{1000 * max(w):.0f})", f"{1000 * median(cpus[key]):.0f}"]
        row += ["" if key == y else f"{ratio(key, y):.2f}" for y in yardsticks]
        if a.compare_rev:
            before = f"{key} @{a.compare_rev}"
            row.append(f"{ratio(key, before):.2f}" if before in commands else "")
        print("| " + " | ".join(row) + " |")
    if a.json_out:
        save_json(a.json_out, {"machine": info, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "fabric": fabric,
                               "commands": {k: shlex.join(c) for k, (c, _) in commands.items()}, "wall": walls, "cpu": cpus})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
