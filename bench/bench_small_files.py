#!/usr/bin/env python3
"""Import of many small files (issue 18): ``fabric import`` vs ``restic backup`` of one tree.

Goal: fabric's throughput >= 1.0x restic's, with a peak RSS within 2x restic's.

The tree is the commit benchmark's (``gen_dataset.py tree``: 100,000 text files of
100 B..2 KiB in 100 directories, 102 MiB). Each round starts from empty stores
(neither ``fabric repo create`` nor ``restic init`` is timed) and times, as whole
processes, in turn (the order alternates round by round):

    fabric --data D -q --json import TREE bench@main -m first
    (cd TREE && restic backup --no-cache --json .)

and the walk-and-read floor of the same tree on the same machine, one process
that lists, opens and reads every file: ``tar cf - -C TREE . | cat >/dev/null``
(GNU tar skips reading when its output is /dev/null, hence the pipe).

Fairness: both tools read every file, chunk, hash and compress it and fsync what
they store; restic with its defaults (repository format 2, compression ``auto``,
all CPUs; ``--no-cache``: the repository is local). On a VM whose page cache is
reclaimed within seconds (DAMON) or dropped by others' benchmarks, a tree on
disk is partly read cold and the figures swing with the cache; so the floor
command reads the tree (untimed for the tool) right before each timed command,
and ``--tmpfs`` copies the tree to /dev/shm once, which takes the disk out and
leaves the per-file costs this benchmark is about. ``sync`` (untimed) precedes
each timed command. Peak RSS is the process's ``ru_maxrss`` (both tools run as
one process). Ratios are taken round by round: throughput ratio = restic's wall
/ fabric's wall, RSS ratio = fabric's / restic's; their medians are quoted.

``--baseline-src DIR`` times a third import in each round, of the fabric package in
DIR (e.g. a ``git archive`` of an earlier revision): before/after in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    fabric_cmd,
    fabric_env,
    last_json_line,
    loadavg,
    machine,
    median,
    remove,
    run,
    run_timed,
    save_report,
    with_retries,
)

REPO = "bench"
TOOLS = ("fabric", "restic")
#: The import of ``--baseline-src``'s fabric, when given.
BASELINE = "fabric-baseline"


def floor_cmd(tree: str) -> list[str]:
    return ["sh", "-c", 'tar cf - -C "$1" . | cat >/dev/null', "floor", tree]


def timed_fabric(py: str, tree: str, store: str, src: str | None = None) -> dict:
    env = fabric_env()
    if src:
        env["PYTHONPATH"] = src
    base = fabric_cmd(py) + ["--data", store, "-q", "--json"]
    remove(store)
    run(base + ["repo", "create", REPO], env=env)
    t = run_timed(base + ["import", tree, f"{REPO}@main", "-m", "first"], env=env)
    result = json.loads(t.stdout)
    assert result["added"] == result["files"], result
    remove(store)
    return {"wall": t.wall, "user": t.user, "sys": t.sys, "cpu": t.cpu, "maxrss_kib": t.maxrss_kib, "files": result["files"]}


def timed_restic(tree: str, store: str) -> dict:
    env = dict(os.environ, RESTIC_PASSWORD="bench", RESTIC_REPOSITORY=store)
    remove(store)
    run(["restic", "init"], env=env)
    t = run_timed(["restic", "backup", "--no-cache", "--json", "."], cwd=tree, env=env)
    summary = last_json_line(t.stdout, "message_type", "summary")
    remove(store)
    return {"wall": t.wall, "user": t.user, "sys": t.sys, "cpu": t.cpu, "maxrss_kib": t.maxrss_kib,
            "files": summary["files_new"]}


def one_round(py: str, tree: str, work: str, order: tuple[str, ...], baseline: str | None) -> dict:
    res: dict = {"order": list(order), "load": loadavg()}
    for tool in order:
        floor = run_timed(floor_cmd(tree))  # also brings the tree into the page cache
        res.setdefault("floor", []).append(floor.wall)
        if tool == "fabric":
            res[tool] = timed_fabric(py, tree, os.path.join(work, "small-fabric"))
        elif tool == BASELINE:
            res[tool] = timed_fabric(py, tree, os.path.join(work, "small-fabric"), baseline)
        else:
            res[tool] = timed_restic(tree, os.path.join(work, "small-restic"))
    res["throughput_ratio"] = res["restic"]["wall"] / res["fabric"]["wall"]
    res["cpu_ratio"] = res["fabric"]["cpu"] / res["restic"]["cpu"]
    res["rss_ratio"] = res["fabric"]["maxrss_kib"] / res["restic"]["maxrss_kib"]
    if baseline:
        res["baseline_throughput_ratio"] = res["restic"]["wall"] / res[BASELINE]["wall"]
        res["baseline_rss_ratio"] = res[BASELINE]["maxrss_kib"] / res["restic"]["maxrss_kib"]
    return res


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(median(xs))} ({fmt.format(min(xs))}..{fmt.format(max(xs))})"


def report(rounds: list[dict], files: int, nbytes: int, warmup: int, where: str, tools: tuple[str, ...]) -> str:
    lines = [
        f"{files} files ({nbytes / 2**20:.0f} MiB) read from {where}; median (min..max) of {len(rounds)} "
        f"counted round(s) after {warmup} warm-up round(s), fresh stores each round",
        "",
        "| tool | wall s | files/s | user s | sys s | CPU s | peak RSS MiB |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for tool in tools:
        rs = [r[tool] for r in rounds]
        lines.append(
            f"| {tool} | {spread([r['wall'] for r in rs])} | {spread([files / r['wall'] for r in rs], '{:.0f}')} "
            f"| {spread([r['user'] for r in rs])} | {spread([r['sys'] for r in rs])} | {spread([r['cpu'] for r in rs])} "
            f"| {spread([r['maxrss_kib'] / 1024 for r in rs], '{:.0f}')} |"
        )
    floors = [min(r["floor"]) for r in rounds]
    lines.append(f"| walk-and-read floor (`tar \\| cat`) | {spread(floors)} | {spread([files / f for f in floors], '{:.0f}')} | | | | |")
    thr = [r["throughput_ratio"] for r in rounds]
    rss = [r["rss_ratio"] for r in rounds]
    cpu = [r["cpu_ratio"] for r in rounds]
    lines += [
        "",
        f"- throughput, fabric / restic (restic's wall / fabric's, round by round): **{spread(thr)}x** "
        f"(goal >= 1.0x: {'MET' if median(thr) >= 1.0 else 'MISSED'})",
        f"- peak RSS, fabric / restic: **{spread(rss)}x** (goal <= 2x: {'MET' if median(rss) <= 2.0 else 'MISSED'})",
        f"- CPU seconds, fabric / restic: {spread(cpu)}x",
        f"- load average at the start of each round: {', '.join(r['load'] for r in rounds)}",
    ]
    if BASELINE in tools:
        lines += [
            f"- baseline: throughput {spread([r['baseline_throughput_ratio'] for r in rounds])}x restic's, "
            f"peak RSS {spread([r['baseline_rss_ratio'] for r in rounds])}x; fabric's wall / the baseline's: "
            f"{spread([r['fabric']['wall'] / r[BASELINE]['wall'] for r in rounds])}",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", required=True, help="directory made by gen_dataset.py tree (tree/, manifest.json)")
    p.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "work", "stores"))
    p.add_argument("--tmpfs", action="store_true", help="copy the tree to /dev/shm first and read it from there")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--baseline-src", help="also import with the fabric package in this directory, each round")
    p.add_argument("--json-out")
    p.add_argument("--md-out")
    a = p.parse_args(argv)
    if not shutil.which("restic"):
        raise SystemExit("restic is not on PATH (scripts/install-system-deps.sh installs it)")

    top = os.path.abspath(a.tree)
    with open(os.path.join(top, "manifest.json")) as f:
        manifest = json.load(f)
    tree = os.path.join(top, "tree")
    shm = None
    if a.tmpfs:
        shm = os.path.join("/dev/shm", f"fabric-bench-small-{os.getpid()}")
        shutil.copytree(tree, shm, copy_function=shutil.copy2)
        tree = shm
    baseline = os.path.abspath(a.baseline_src) if a.baseline_src else None
    tools = (*TOOLS, BASELINE) if baseline else TOOLS
    rounds = []
    try:
        for i in range(a.warmup + a.runs):
            order = tools if i % 2 == 0 else tools[::-1]
            r = with_retries(one_round, a.python, tree, os.path.abspath(a.work), order, baseline)
            counted = i >= a.warmup
            print(
                f"round {i + 1}/{a.warmup + a.runs}{'' if counted else ' (warm-up)'}: "
                + ", ".join(
                    f"{tool} {r[tool]['wall']:.2f}s ({r[tool]['cpu']:.2f} CPU, {r[tool]['maxrss_kib'] // 1024} MiB)"
                    for tool in tools
                )
                + f", floor {min(r['floor']):.2f}s, throughput ratio {r['throughput_ratio']:.2f}x, load {r['load']}",
                file=sys.stderr, flush=True,
            )
            if counted:
                rounds.append(r)
    finally:
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
    md = report(rounds, manifest["tree"]["files"], manifest["tree"]["bytes"], a.warmup, "tmpfs" if a.tmpfs else "disk", tools)
    print(md)
    commands = {
        "fabric": fabric_cmd("python") + ["--data", "STORE", "-q", "--json", "import", "TREE", f"{REPO}@main", "-m", "first"],
        "restic": ["cd", "TREE", "&&", "restic", "backup", "--no-cache", "--json", "."],
        "floor": floor_cmd("TREE"),
    }
    save_report(md, {"machine": machine(), "manifest_params": manifest["params"], "tmpfs": a.tmpfs,
                     "baseline_src": baseline, "rounds": rounds, "commands": commands}, a.json_out, a.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
