#!/usr/bin/env python3
"""Ingest benchmark: ``fabric import`` v1 then v2 vs ``restic backup`` v1 then v2.

Each round starts from empty stores (a fresh fabric data directory with one
repository, a fresh ``restic init`` repository; neither creation is timed),
then times, as whole processes:

    fabric --data D -q --json import DATASET/v1 bench@main -m v1
    fabric --data D -q --json import DATASET/v2 bench@main -m v2
    (cd DATASET/v1 && restic backup --no-cache --json .)
    (cd DATASET/v2 && restic backup --no-cache --json --parent <v1 snapshot> --ignore-inode --ignore-ctime .)

Fairness: both tools skip a file whose metadata matches the previous version
(fabric: size + mode + mtime against the branch; restic: its parent snapshot).
v2's untouched files are copies of v1's with mtimes kept, so restic is told to
ignore the inode and ctime (which a copy changes and fabric does not look at)
and is given the v1 snapshot as parent explicitly (restic picks a parent by
the backed-up path, which differs between v1 and v2; backing up ``.`` from
inside each directory makes both snapshots' trees line up). restic runs with
its defaults otherwise: repository format 2, compression ``auto``, all CPUs;
``--no-cache`` because the repository is a local directory (the cache is a
local copy of metadata meant for remote repositories) and fabric has no cache
either. Both fsync what they write. ``sync`` (untimed) precedes each timed
command. The data set fits in RAM, so after the warm-up round reads come from
the page cache for both tools: these are CPU-bound figures.

Reported per round: wall and CPU seconds, throughput = dataset bytes / wall
seconds, and the store's size after v1 and after v2 (apparent bytes of every
file under the data directory / repository, as ``du -sb``). Medians over the
counted rounds; ratios are taken round by round (fabric / restic) and their
median quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    MB,
    dir_size,
    fabric_cmd,
    fabric_env,
    last_json_line,
    machine,
    median,
    remove,
    run,
    run_timed,
    save_json,
    with_retries,
)

REPO = "bench"


def fabric_round(py: str, dataset: str, store: str) -> dict:
    env = fabric_env()
    base = fabric_cmd(py) + ["--data", store, "-q", "--json"]
    remove(store)
    run(base + ["repo", "create", REPO], env=env)
    out: dict = {"commands": []}
    for ver in ("v1", "v2"):
        cmd = base + ["import", os.path.join(dataset, ver), f"{REPO}@main", "-m", ver]
        t = run_timed(cmd, env=env)
        res = json.loads(t.stdout)
        out[ver] = {"wall": t.wall, "cpu": t.cpu, "user": t.user, "sys": t.sys, "maxrss_kib": t.maxrss_kib,
                    "store": dir_size(store), "tool": res}
        out["commands"].append(cmd)
    remove(store)
    return out


def restic_round(dataset: str, store: str, extra: list[str]) -> dict:
    env = dict(os.environ, RESTIC_PASSWORD="bench", RESTIC_REPOSITORY=store)
    remove(store)
    run(["restic", "init"], env=env)
    out: dict = {"commands": []}
    parent = None
    for ver in ("v1", "v2"):
        cmd = ["restic", "backup", "--no-cache", "--json", *extra]
        if parent:
            cmd += ["--parent", parent, "--ignore-inode", "--ignore-ctime"]
        cmd.append(".")
        t = run_timed(cmd, cwd=os.path.join(dataset, ver), env=env)
        summary = last_json_line(t.stdout, "message_type", "summary")
        parent = summary["snapshot_id"]
        out[ver] = {"wall": t.wall, "cpu": t.cpu, "user": t.user, "sys": t.sys, "maxrss_kib": t.maxrss_kib,
                    "store": dir_size(store), "tool": summary}
        out["commands"].append(["cd", os.path.join(dataset, ver), "&&", *cmd])
    remove(store)
    return out


def summarize(rounds: list[dict], manifest: dict) -> dict:
    size = {v: manifest[v]["bytes"] for v in ("v1", "v2")}
    # Bytes of v2's new files: no store can keep them in less (incompressible), so
    # they set a floor under both tools' "added by v2"; the row "beyond new files"
    # shows what each tool spends on edits, renames, duplicates and metadata.
    new_bytes = manifest["params"]["new"] * manifest["params"]["file_size"]
    s: dict = {"dataset_bytes": size, "v2_new_file_bytes": new_bytes}
    for tool in ("fabric", "restic"):
        rs = [r[tool] for r in rounds]
        s[tool] = {
            "v1_wall": [r["v1"]["wall"] for r in rs],
            "v2_wall": [r["v2"]["wall"] for r in rs],
            "v1_cpu": [r["v1"]["cpu"] for r in rs],
            "v2_cpu": [r["v2"]["cpu"] for r in rs],
            "v1_mbps": [size["v1"] / MB / r["v1"]["wall"] for r in rs],
            "v2_mbps": [size["v2"] / MB / r["v2"]["wall"] for r in rs],
            "v1_maxrss_mib": [r["v1"]["maxrss_kib"] / 1024 for r in rs],
            "v2_maxrss_mib": [r["v2"]["maxrss_kib"] / 1024 for r in rs],
            "stored_after_v1": [r["v1"]["store"]["apparent"] for r in rs],
            "stored_after_v2": [r["v2"]["store"]["apparent"] for r in rs],
            "added_by_v2": [r["v2"]["store"]["apparent"] - r["v1"]["store"]["apparent"] for r in rs],
            "added_beyond_new_files": [
                r["v2"]["store"]["apparent"] - r["v1"]["store"]["apparent"] - new_bytes for r in rs
            ],
            "added_by_v2_allocated": [r["v2"]["store"]["allocated"] - r["v1"]["store"]["allocated"] for r in rs],
        }
    ratios = {
        "v1_throughput": [
            (size["v1"] / r["fabric"]["v1"]["wall"]) / (size["v1"] / r["restic"]["v1"]["wall"]) for r in rounds
        ],
        "v2_throughput": [
            (size["v2"] / r["fabric"]["v2"]["wall"]) / (size["v2"] / r["restic"]["v2"]["wall"]) for r in rounds
        ],
        "v1_cpu": [r["fabric"]["v1"]["cpu"] / r["restic"]["v1"]["cpu"] for r in rounds],
        "v2_cpu": [r["fabric"]["v2"]["cpu"] / r["restic"]["v2"]["cpu"] for r in rounds],
        "stored_after_v1": [
            r["fabric"]["v1"]["store"]["apparent"] / r["restic"]["v1"]["store"]["apparent"] for r in rounds
        ],
        "added_by_v2": [
            (r["fabric"]["v2"]["store"]["apparent"] - r["fabric"]["v1"]["store"]["apparent"])
            / (r["restic"]["v2"]["store"]["apparent"] - r["restic"]["v1"]["store"]["apparent"])
            for r in rounds
        ],
        "added_beyond_new_files": [
            (r["fabric"]["v2"]["store"]["apparent"] - r["fabric"]["v1"]["store"]["apparent"] - new_bytes)
            / (r["restic"]["v2"]["store"]["apparent"] - r["restic"]["v1"]["store"]["apparent"] - new_bytes)
            for r in rounds
        ],
        "added_by_v2_floor": [
            new_bytes / (r["restic"]["v2"]["store"]["apparent"] - r["restic"]["v1"]["store"]["apparent"])
            for r in rounds
        ],
    }
    s["ratios"] = ratios
    s["goals"] = {
        "throughput_v1 >= 1.0 (fabric/restic)": median(ratios["v1_throughput"]) >= 1.0,
        "throughput_v2 >= 1.0 (fabric/restic)": median(ratios["v2_throughput"]) >= 1.0,
        "added_by_v2 <= 0.40 (fabric/restic)": median(ratios["added_by_v2"]) <= 0.40,
    }
    return s


def fmt(xs: list[float], p: int = 2) -> str:
    return f"{median(xs):.{p}f} ({min(xs):.{p}f}..{max(xs):.{p}f})"


def mib(xs: list[float]) -> list[float]:
    return [x / 1024 / 1024 for x in xs]


def report(s: dict, runs: int, warmup: int) -> str:
    f, r, q = s["fabric"], s["restic"], s["ratios"]
    d = s["dataset_bytes"]
    lines = [
        (f"Ingest: v1 = {d['v1'] / 2**20:.0f} MiB, v2 = {d['v2'] / 2**20:.0f} MiB; "
        f"median (min..max) of {runs} counted round(s) after {warmup} warm-up round(s), fresh stores each round"),
        "",
        "| figure | fabric | restic | fabric/restic | goal |",
        "| --- | --- | --- | --- | --- |",
        f"| v1 ingest wall s | {fmt(f['v1_wall'])} | {fmt(r['v1_wall'])} | | |",
        f"| v1 throughput MB/s | {fmt(f['v1_mbps'], 1)} | {fmt(r['v1_mbps'], 1)} | {fmt(q['v1_throughput'])} | >= 1.00 |",
        f"| v1 CPU s (user+sys) | {fmt(f['v1_cpu'])} | {fmt(r['v1_cpu'])} | {fmt(q['v1_cpu'])} | |",
        f"| v2 ingest wall s | {fmt(f['v2_wall'])} | {fmt(r['v2_wall'])} | | |",
        f"| v2 throughput MB/s | {fmt(f['v2_mbps'], 1)} | {fmt(r['v2_mbps'], 1)} | {fmt(q['v2_throughput'])} | >= 1.00 |",
        f"| v2 CPU s (user+sys) | {fmt(f['v2_cpu'])} | {fmt(r['v2_cpu'])} | {fmt(q['v2_cpu'])} | |",
        f"| peak RSS v1 MiB | {fmt(f['v1_maxrss_mib'], 0)} | {fmt(r['v1_maxrss_mib'], 0)} | | |",
        (f"| stored after v1 MiB | {fmt(mib(f['stored_after_v1']), 1)} | {fmt(mib(r['stored_after_v1']), 1)} "
        f"| {fmt(q['stored_after_v1'])} | |"),
        (f"| stored added by v2 MiB | {fmt(mib(f['added_by_v2']), 2)} | {fmt(mib(r['added_by_v2']), 2)} "
        f"| {fmt(q['added_by_v2'])} | <= 0.40 |"),
        (f"| of which beyond v2's new files ({s['v2_new_file_bytes'] / 2**20:.0f} MiB of incompressible bytes) MiB "
        f"| {fmt(mib(f['added_beyond_new_files']), 2)} | {fmt(mib(r['added_beyond_new_files']), 2)} "
        f"| {fmt(q['added_beyond_new_files'])} | |"),
        "",
        (f"Floor of the added-by-v2 ratio: v2's new files alone are {fmt(q['added_by_v2_floor'])} of restic's added bytes "
        "(what fabric would score if its edits, renames, copies and metadata cost nothing)."),
        "",
    ]
    for goal, ok in s["goals"].items():
        lines.append(f"- goal {goal}: {'MET' if ok else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="directory made by gen_dataset.py versions (v1/, v2/, manifest.json)")
    p.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "work", "stores"),
                   help="where the throwaway stores go")
    p.add_argument("--runs", type=int, default=3, help="counted rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted rounds first (default 1)")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs fabric")
    p.add_argument("--restic-arg", action="append", default=[], help="extra argument for restic backup")
    p.add_argument("--json-out", help="write all figures here")
    p.add_argument("--md-out", help="write the markdown table here")
    a = p.parse_args(argv)

    dataset = os.path.abspath(a.dataset)
    with open(os.path.join(dataset, "manifest.json")) as f:
        manifest = json.load(f)
    rounds = []
    total = a.warmup + a.runs
    for i in range(total):
        counted = i >= a.warmup
        res: dict = {}
        order = ("fabric", "restic") if i % 2 == 0 else ("restic", "fabric")
        for tool in order:
            store = os.path.join(os.path.abspath(a.work), f"ingest-{tool}")
            t0 = time.perf_counter()
            if tool == "fabric":
                res[tool] = with_retries(fabric_round, a.python, dataset, store)
            else:
                res[tool] = with_retries(restic_round, dataset, store, a.restic_arg)
            print(
                f"round {i + 1}/{total}{'' if counted else ' (warm-up)'} {tool}: "
                f"v1 {res[tool]['v1']['wall']:.2f}s, v2 {res[tool]['v2']['wall']:.2f}s, "
                f"added by v2 {(res[tool]['v2']['store']['apparent'] - res[tool]['v1']['store']['apparent']) / 2**20:.2f} MiB "
                f"({time.perf_counter() - t0:.0f}s with setup)",
                file=sys.stderr, flush=True,
            )
        if counted:
            rounds.append(res)
    s = summarize(rounds, manifest)
    md = report(s, a.runs, a.warmup)
    print(md)
    commands = {tool: rounds[-1][tool]["commands"] for tool in ("fabric", "restic")}
    if a.json_out:
        save_json(a.json_out, {"machine": machine(), "manifest_params": manifest["params"], "summary": s,
                               "rounds": rounds, "commands": commands})
    if a.md_out:
        os.makedirs(os.path.dirname(os.path.abspath(a.md_out)), exist_ok=True)
        with open(a.md_out, "w") as f:
            f.write(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
