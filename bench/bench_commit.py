#!/usr/bin/env python3
"""Commit benchmark: the initial commit of a many-file tree vs committing 10 changed files onto it.

Goal (from the issue): the second commit takes <= 5% of the time of the first.

Each round starts from an empty fabric data directory (repository creation not
timed) and times, as whole processes unless said otherwise:

1. ``first``: ``fabric import TREE bench@main -m first`` (every file read, chunked, committed).
2. ``import_10``: 10 files of TREE get new content and a new mtime, then
   ``fabric import TREE bench@main -m second`` again (CLI path: it still walks
   and stats every file and reads the whole tree of the branch to compare).
3. ``import_noop``: the same import once more with nothing changed (the floor
   of the CLI path: walk + stat + tree read, no commit).
4. Engine path through the CLI: 10 x ``fabric put bench@main PATH FILE`` then
   ``fabric commit bench@main -m third``; ``commit_cli`` is the commit process
   alone, ``put_commit_cli`` the 11 processes together.
5. Engine path in one process: ``Engine.open`` then 10 x ``engine.put_object``
   and one ``engine.commit``, timed inside the process with perf_counter
   (``commit_inproc`` is engine.commit alone; ``put_commit_inproc`` includes the
   puts). This excludes interpreter start-up and imports.

Also measured once per round: ``startup`` = ``fabric --version`` (interpreter +
CLI import cost every CLI figure above includes).

The 10 files are restored (content and mtime) after each round, so TREE stays
as generated. Medians over the counted rounds after the warm-up rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    fabric_cmd,
    fabric_env,
    machine,
    median,
    remove,
    run,
    run_timed,
    save_json,
    with_retries,
)

REPO = "bench"
CHANGED = 10

INPROC = r"""
import json, sys, time
from fabric.engine.engine import Engine
store, repo, files = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t0 = time.perf_counter()
engine = Engine.open(store)
t1 = time.perf_counter()
for path, src in files:
    with open(src, "rb") as f:
        engine.put_object(repo, "main", path, f)
t2 = time.perf_counter()
engine.commit(repo, "main", "fourth")
t3 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "puts": t2 - t1, "commit": t3 - t2}))
"""


def pick_files(tree: str, n: int, seed: int) -> list[str]:
    dirs = sorted(os.listdir(tree))
    r = random.Random(f"{seed}:commit-bench")
    out: set[str] = set()
    while len(out) < n:
        d = r.choice(dirs)
        out.add(f"{d}/{r.choice(sorted(os.listdir(os.path.join(tree, d))))}")
    return sorted(out)


def one_round(py: str, tree: str, store: str, rels: list[str], tmp: str) -> dict:
    env = fabric_env()
    base = fabric_cmd(py) + ["--data", store, "-q", "--json"]
    remove(store)
    run(base + ["repo", "create", REPO], env=env)
    res: dict = {}
    res["startup"] = run_timed(fabric_cmd(py) + ["--version"], env=env).wall
    t = run_timed(base + ["import", tree, f"{REPO}@main", "-m", "first"], env=env)
    res["first"], res["first_cpu"] = t.wall, t.cpu
    res["first_result"] = json.loads(t.stdout)

    saved = {}
    for rel in rels:
        path = os.path.join(tree, rel)
        st = os.stat(path)
        with open(path, "rb") as f:
            saved[rel] = (f.read(), st.st_mtime_ns)
    try:
        for i, rel in enumerate(rels):
            path = os.path.join(tree, rel)
            with open(path, "ab") as f:
                f.write(b"changed for the second commit %d\n" % i)
            os.utime(path, ns=(saved[rel][1] + 10**9, saved[rel][1] + 10**9))
        t = run_timed(base + ["import", tree, f"{REPO}@main", "-m", "second"], env=env)
        res["import_10"], res["import_10_cpu"] = t.wall, t.cpu
        res["import_10_result"] = json.loads(t.stdout)
        assert res["import_10_result"]["changed"] == CHANGED, res["import_10_result"]
        t = run_timed(base + ["import", tree, f"{REPO}@main", "-m", "noop"], env=env)
        res["import_noop"], res["import_noop_cpu"] = t.wall, t.cpu
    finally:
        for rel, (data, mtime_ns) in saved.items():
            path = os.path.join(tree, rel)
            with open(path, "wb") as f:
                f.write(data)
            os.utime(path, ns=(mtime_ns, mtime_ns))

    # Engine path through the CLI: put x10 + commit.
    puts = 0.0
    for i, rel in enumerate(rels):
        src = os.path.join(tmp, f"put{i}")
        with open(src, "wb") as f:
            f.write(saved[rel][0] + b"changed for the third commit %d\n" % i)
        puts += run_timed(base + ["put", f"{REPO}@main", rel, src], env=env).wall
    t = run_timed(base + ["commit", f"{REPO}@main", "-m", "third"], env=env)
    res["puts_cli"], res["commit_cli"], res["commit_cli_cpu"] = puts, t.wall, t.cpu
    res["put_commit_cli"] = puts + t.wall

    # Engine path in one process.
    files = []
    for i, rel in enumerate(rels):
        src = os.path.join(tmp, f"inproc{i}")
        with open(src, "wb") as f:
            f.write(saved[rel][0] + b"changed for the fourth commit %d\n" % i)
        files.append([rel, src])
    t = run_timed([py, "-c", INPROC, store, REPO, json.dumps(files)], env=env)
    inproc = json.loads(t.stdout.strip().splitlines()[-1])
    res["commit_inproc"] = inproc["commit"]
    res["put_commit_inproc"] = inproc["puts"] + inproc["commit"]
    res["engine_open_inproc"] = inproc["open"]
    res["store_bytes"] = sum(
        os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(store) for n in ns
    )
    remove(store)
    return res


ROWS = [
    ("first", "initial import of the tree (CLI)"),
    ("import_10", "`fabric import` again, 10 files changed (CLI path)"),
    ("import_noop", "`fabric import` again, nothing changed (walk + compare floor)"),
    ("commit_cli", "`fabric commit` of 10 staged files (engine path, one CLI process)"),
    ("put_commit_cli", "10 x `fabric put` + `fabric commit` (11 CLI processes)"),
    ("commit_inproc", "engine.commit of 10 staged files, in process"),
    ("put_commit_inproc", "10 x engine.put_object + engine.commit, in process"),
    ("startup", "`fabric --version` (interpreter + CLI start-up)"),
]


def report(rounds: list[dict], nfiles: int, nbytes: int, warmup: int) -> tuple[str, dict]:
    first = [r["first"] for r in rounds]
    lines = [
        (f"Commit: tree of {nfiles} files ({nbytes / 2**20:.0f} MiB), {CHANGED} files changed; "
        f"median (min..max) of {len(rounds)} counted round(s) after {warmup} warm-up round(s), fresh store each round"),
        "",
        "| figure | wall s | / first | goal |",
        "| --- | --- | --- | --- |",
    ]
    ratios = {}
    for key, label in ROWS:
        xs = [r[key] for r in rounds]
        rs = [r[key] / f for r, f in zip(rounds, first)]
        ratios[key] = median(rs)
        goal = "" if key in ("first", "startup", "import_noop") else "<= 5%"
        rel = "" if key == "first" else f"{100 * median(rs):.2f}%"
        lines.append(f"| {label} | {median(xs):.3f} ({min(xs):.3f}..{max(xs):.3f}) | {rel} | {goal} |")
    lines.append("")
    for key in ("import_10", "commit_cli", "put_commit_cli", "commit_inproc"):
        ok = ratios[key] <= 0.05
        lines.append(f"- goal second <= 5% of first, {key}: {100 * ratios[key]:.2f}% -> {'MET' if ok else 'MISSED'}")
    return "\n".join(lines), ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", required=True, help="directory made by gen_dataset.py tree (tree/, manifest.json)")
    p.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "work", "stores"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json-out")
    p.add_argument("--md-out")
    a = p.parse_args(argv)

    top = os.path.abspath(a.tree)
    with open(os.path.join(top, "manifest.json")) as f:
        manifest = json.load(f)
    tree = os.path.join(top, "tree")
    rels = pick_files(tree, CHANGED, a.seed)
    store = os.path.join(os.path.abspath(a.work), "commit-fabric")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.warmup + a.runs):
            r = with_retries(one_round, a.python, tree, store, rels, tmp)
            counted = i >= a.warmup
            print(
                f"round {i + 1}/{a.warmup + a.runs}{'' if counted else ' (warm-up)'}: first {r['first']:.2f}s, "
                f"import_10 {r['import_10']:.2f}s, noop {r['import_noop']:.2f}s, commit_cli {r['commit_cli']:.2f}s, "
                f"commit_inproc {r['commit_inproc']:.3f}s",
                file=sys.stderr, flush=True,
            )
            if counted:
                rounds.append(r)
    md, ratios = report(rounds, manifest["tree"]["files"], manifest["tree"]["bytes"], a.warmup)
    print(md)
    base = fabric_cmd("python") + ["--data", "STORE", "-q", "--json"]
    commands = {
        "first / import_10 / import_noop": base + ["import", tree, f"{REPO}@main", "-m", "MSG"],
        "put": base + ["put", f"{REPO}@main", "PATH", "FILE"],
        "commit": base + ["commit", f"{REPO}@main", "-m", "third"],
    }
    if a.json_out:
        save_json(a.json_out, {"machine": machine(), "manifest_params": manifest["params"], "changed": rels,
                               "ratios": ratios, "rounds": rounds, "commands": commands})
    if a.md_out:
        os.makedirs(os.path.dirname(os.path.abspath(a.md_out)), exist_ok=True)
        with open(a.md_out, "w") as f:
            f.write(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
