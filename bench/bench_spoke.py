#!/usr/bin/env python3
"""Reads through a spoke over a WAN (issue 4): fabric's spoke vs rsync and rclone, same emulated link.

A :class:`testbed.wanproxy.WanProxy` (default 50 ms RTT, 1 Gbit/s each way)
sits between the reader's side and the origin of every tool, and counts the
bytes that cross it (TCP payload both ways, protocol included):

* fabric: ``client -> spoke (loopback) -> WAN -> hub``. Per round a fresh hub
  holding v1 (a copy of a template store) and a cold spoke (empty cache)::

      fabric --server SPOKE export bench@main out          # v1, cold cache, empty directory
      fabric --server HUB import v2 bench@main -m v2       # untimed, at the hub, not over the WAN
      fabric --server SPOKE export bench@main out --delete # v2 in place: unchanged files are skipped, v1's others removed
      fabric --server SPOKE export bench@main out-v2-warm  # v2-warm: empty directory, warm spoke, no WAN

* fabric-hub (tool ``fabric-hub``): the same v1 and v2 exports straight from the
  hub across the link, no spoke (``fabric --server PROXY-TO-HUB export``).

* fabric-mount (tool ``fabric-mount``): a read-only ``fabric mount`` of the same cold spoke,
  ``bench@COMMIT`` of each version (mounted untimed), read by the tools a user runs on it::

      cp -a MOUNT-V1/. out/ ; rsync -a --delete MOUNT-V2/ out/

* rsync: ``rsync -> WAN -> rsync daemon`` (modules v1, v2 read-only)::

      rsync -a --delete --stats rsync://PROXY/v1/ dst/ ; rsync -a --delete --stats rsync://PROXY/v2/ dst/
      (and the same with -z --zc=zstd)

* rclone: ``rclone -> WAN -> moto S3 server``; buckets bench-v1 and bench-v2
  uploaded once (directly, with rclone, so objects carry rclone's mtime)::

      rclone sync wan:bench-v1 dst ; rclone sync wan:bench-v2 dst

Goals: v2 update bytes below rsync's and <= 0.2x rclone's.

Listing: a 100,000-file directory (one flat directory) through a cold spoke
over the same link: ``fabric --server SPOKE ls tree@main d0000`` — round trips
to the hub (the spoke's ``upstream_requests`` delta) and time; goal < 50 round
trips. ``rsync --list-only`` of the same directory through the same link is
the reference.

    python bench/bench_spoke.py              # full size, 3 rounds (about 20-30 min on 2 busy cores)
    python bench/bench_spoke.py --quick      # 1/10 data, 10,000-file directory, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import (
    MB,
    drop_page_cache,
    fabric_cmd,
    fabric_env,
    loadavg,
    machine,
    median,
    remove,
    run,
    run_timed,
    save_report,
    unmount,
    with_retries,
)
from bench_remote import (
    WORK,
    Hub,
    MiB,
    Moto,
    RsyncDaemon,
    Spoke,
    ensure_versions,
    load_manifest,
    rclone_env,
    rsync_stats,
    timed_phase,
    wan,
    warm_page_cache,
)

from testbed.wanproxy import WanProxy


# -- preparation (once per invocation, untimed) -------------------------------------------
def ensure_flat_tree(python: str, files: int, seed: int) -> str:
    """``files`` small files in ONE directory (d0000/), generated once under bench/work/data/."""
    out = os.path.join(WORK, "data", f"flat-{files // 1000}k-s{seed}")
    subprocess.run([python, os.path.join(HERE, "gen_dataset.py"), "tree", "--out", out, "--seed", str(seed),
                    "--files", str(files), "--per-dir", str(files), "--min-size", "100", "--max-size", "400"], check=True)
    return os.path.join(out, "tree")


def local_store(python: str, data: str, repo: str, src: str) -> None:
    """A hub data directory holding ``src`` as ``repo@main`` (built with the engine directly: no server)."""
    remove(data)
    base = fabric_cmd(python) + ["--data", data, "-q", "--json"]
    run(base + ["repo", "create", repo], env=fabric_env())
    run(base + ["import", src, f"{repo}@main", "-m", "template"], env=fabric_env())


def tree_index(root: str) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, int(st.st_mtime))
    return out


def verify(dst: str, src: str, changed: list[str], stale: frozenset[str] = frozenset()) -> None:
    """``dst`` holds exactly ``src``'s files (size, mtime to the second), and the changed files byte for
    byte; ``stale``: paths ``dst`` may hold besides (an in-place export without ``--delete``)."""
    a, b = tree_index(dst), tree_index(src)
    a = {k: v for k, v in a.items() if k in b or k not in stale}
    if a != b:
        only_dst, only_src = sorted(a.keys() - b.keys())[:5], sorted(b.keys() - a.keys())[:5]
        diff = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])[:5]
        raise SystemExit(f"{dst} differs from {src}: extra {only_dst}, missing {only_src}, different {diff}")
    for rel in changed:
        if not filecmp.cmp(os.path.join(dst, rel), os.path.join(src, rel), shallow=False):
            raise SystemExit(f"{dst}/{rel} has other bytes than {src}/{rel}")


def changed_files(manifest: dict, v2: str) -> list[str]:
    """v2's files whose bytes a reader must get anew: edited, new, renamed, duplicated."""
    out = list(manifest["edited"])
    for rel in manifest["renamed"]:
        head, tail = os.path.split(rel)
        out.append(os.path.join(head, "renamed-" + tail))
    for rel in manifest["duplicated"]:
        head, tail = os.path.split(rel)
        out.append(os.path.join(head, "copy-" + tail))
    out += sorted(os.path.relpath(os.path.join(d, n), v2) for d, _, ns in os.walk(os.path.join(v2, "new")) for n in ns)
    return out


# -- tools --------------------------------------------------------------------------------
@contextlib.contextmanager
def _fresh_hub(a: argparse.Namespace, ctx: dict, name: str) -> Iterator[tuple[str, Hub]]:
    """A new work directory ``name`` and a hub started on a copy of the v1 template store in it;
    both gone on the way out."""
    base = os.path.join(a.work, name)
    remove(base)
    os.makedirs(base)
    shutil.copytree(ctx["template_v1"], os.path.join(base, "hub"))
    hub = Hub(a.python, os.path.join(base, "hub"))
    drop_page_cache()  # before the round's first timed command: the servers read their disks
    try:
        yield base, hub
    finally:
        hub.stop()
        remove(base)


def fabric_round(a: argparse.Namespace, ctx: dict, r: int, via_spoke: bool = True) -> dict:
    """``fabric export`` of v1 into an empty directory, then of v2 into the same one (in place: only
    files whose size or mtime differ are written). Through a cold spoke (``via_spoke``; then also
    "v2-warm": v2 into an empty directory from the now-warm spoke, no WAN bytes: the local cost of
    a whole export), or straight from the hub across the WAN."""
    name = "fabric" if via_spoke else "fabric-hub"
    with _fresh_hub(a, ctx, f"spoke-{name}-{r}") as (base, hub), wan(hub.port, a.rtt_ms, a.rate_mbit) as proxy:
        with _cold_spoke(a, base, hub, proxy) if via_spoke else contextlib.nullcontext() as spoke:
            out: dict = {"tool": name}
            for ver in ("v1", "v2", "v2-warm") if via_spoke else ("v1", "v2"):
                dst = os.path.join(base, "out-v2-warm" if ver == "v2-warm" else "out")
                if ver == "v2":
                    _import_v2(hub, spoke, ctx)
                out[ver] = _fabric_phase(proxy, hub, spoke, dst, ctx["export_deletes"])
                stale = ctx["v1_only"] if ver == "v2" and not ctx["export_deletes"] else frozenset()
                verify(dst, ctx[ver[:2]], ctx["changed"] if ver != "v1" else [], stale)
            return out


@contextlib.contextmanager
def _cold_spoke(a: argparse.Namespace, base: str, hub: Hub, proxy: WanProxy) -> Iterator[Spoke]:
    """A spoke with an empty cache under ``base``, whose hub is ``hub`` across ``proxy``."""
    spoke = Spoke(a.python, proxy.url_for(), os.path.join(base, "cache"), a.cache_size, hub.token)
    try:
        spoke.stats()  # the spoke checks the caller's token with the hub once; not part of the reads
        yield spoke
    finally:
        spoke.stop()


def _import_v2(hub: Hub, spoke: Spoke | None, ctx: dict) -> str:
    """Import v2 at the hub (untimed, not over the WAN); its commit, once the spoke (if any) has it."""
    commit = json.loads(run(hub.cli("import", ctx["v2"], "bench@main", "-m", "v2"), env=fabric_env()))["commit_id"]
    deadline = time.monotonic() + 60
    while spoke is not None and spoke.head("bench", "main") != commit:  # the hub's watch stream tells the spoke
        if time.monotonic() > deadline:
            raise SystemExit("the spoke did not see the v2 commit within 60 s")
        time.sleep(0.05)
    return commit


def mount_round(a: argparse.Namespace, ctx: dict, r: int) -> dict:
    """A spoke's FUSE mount read by the tools a user would run on it: ``cp -a`` of v1 into an
    empty directory from a cold spoke, then ``rsync -a --delete`` of v2 into the same directory
    (rsync's quick check, size and mtime, skips the unchanged files; a local rsync copies
    changed files whole). Each version is its own read-only mount of ``bench@COMMIT`` (mounted
    and unmounted untimed)."""
    with _fresh_hub(a, ctx, f"spoke-fabric-mount-{r}") as (base, hub), wan(hub.port, a.rtt_ms, a.rate_mbit) as proxy:
        with _cold_spoke(a, base, hub, proxy) as spoke:
            dst = os.path.join(base, "out")
            out: dict = {"tool": "fabric-mount"}
            for ver in ("v1", "v2"):
                commit = _import_v2(hub, spoke, ctx) if ver == "v2" else spoke.head("bench", "main")
                mp = os.path.join(base, f"mnt-{ver}")
                beside = ["--spoke-cache", os.path.join(base, "cache")] if a.mount_beside else []
                with _mounted(a.python, spoke, f"bench@{commit}", mp, os.path.join(base, f"mount-{ver}.log"), *beside):
                    cmd = ["cp", "-a", f"{mp}/.", dst] if ver == "v1" else ["rsync", "-a", "--delete", f"{mp}/", f"{dst}/"]
                    if ver == "v1":
                        os.makedirs(dst)
                    st0 = spoke.stats()
                    t, w = timed_phase(cmd, proxy, servers=(spoke.proc.pid, hub.proc.pid, _mount_pid(mp)))
                    st1 = spoke.stats()
                out[ver] = {"wall": t.wall, "cpu": t.cpu, "wire": w, "cmd": shlex.join(t.cmd),
                            "upstream_requests": st1["upstream_requests"] - st0["upstream_requests"],
                            "top_up_bytes": _top_up_bytes(st1) - _top_up_bytes(st0)}
                verify(dst, ctx[ver], ctx["changed"] if ver == "v2" else [])
            return out


def _top_up_bytes(stats: dict) -> int:
    """Bytes a spoke fetched for mounts' top-up hints (jobs ``mount-scan:*``, fuse/topups.py)."""
    return sum(j.get("prefetch", {}).get("hint", {}).get("prefetched_bytes", 0)
               for name, j in stats.get("jobs", {}).items() if name.startswith("mount-scan:"))


@contextlib.contextmanager
def _mounted(python: str, spoke: Spoke, target: str, mp: str, log: str, *options: str) -> Iterator[str]:
    """``fabric mount SPOKE TARGET MP [OPTIONS]`` (read-only), unmounted on the way out."""
    os.makedirs(mp, exist_ok=True)
    env = dict(fabric_env(), FABRIC_TOKEN=spoke.token)
    run(fabric_cmd(python) + ["mount", spoke.url, target, mp, "--log-file", log, *options], env=env)
    try:
        yield mp
    finally:
        unmount(mp)


def _mount_pid(mp: str) -> int:
    """The process of the ``fabric mount`` serving ``mp``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"mount" in args and mp.encode() in args:
            return int(pid)
    raise SystemExit(f"no fabric mount process serves {mp}")


def export_deletes(python: str) -> bool:
    """Whether the fabric run has ``fabric export --delete`` (a revision from before it, run with
    ``FABRIC_SRC``, leaves the files v2 dropped in place)."""
    return "--delete" in run(fabric_cmd(python) + ["export", "--help"], env=fabric_env())


def _fabric_phase(proxy: WanProxy, hub: Hub, spoke: Spoke | None, dst: str, delete: bool) -> dict:
    """One timed ``fabric export bench@main DST [--delete]`` from the spoke (its stats before and
    after) or the hub."""
    args = ("export", "bench@main", dst, *(("--delete",) if delete else ()))
    cmd = spoke.cli(*args) if spoke is not None else hub.cli(*args, url=proxy.url_for())
    st0 = spoke.stats() if spoke is not None else None
    t, w = timed_phase(cmd, proxy, env=fabric_env(),
                       servers=(spoke.proc.pid, hub.proc.pid) if spoke is not None else (hub.proc.pid,))
    got = json.loads(t.stdout)
    phase = {"wall": t.wall, "cpu": t.cpu, "wire": w, "cmd": shlex.join(t.cmd), "unchanged": got.get("unchanged", 0)}
    if spoke is not None:
        st1 = spoke.stats()
        for key in ("upstream_requests", "upstream_bytes_received", "upstream_bytes_sent", "cache_hit_bytes", "cache_miss_bytes"):
            phase[key] = st1[key] - st0[key]
    return phase


def rsync_round(a: argparse.Namespace, ctx: dict, r: int, compress: bool) -> dict:
    name = "rsync-z" if compress else "rsync"
    base = os.path.join(a.work, f"spoke-{name}-{r}")
    remove(base)
    dst = os.path.join(base, "dst")
    os.makedirs(dst)
    drop_page_cache()  # before the round's first timed command: the servers read their disks
    flags = ["-a", "--delete", "--stats"] + (["-z", "--zc=zstd"] if compress else [])
    try:
        out: dict = {"tool": name}
        with wan(ctx["rsyncd"].port, a.rtt_ms, a.rate_mbit) as proxy:
            for ver in ("v1", "v2"):
                cmd = ["rsync", *flags, f"rsync://127.0.0.1:{proxy.port}/{ver}/", dst + "/"]
                t, w = timed_phase(cmd, proxy, servers=(ctx["rsyncd"].proc.pid,))
                verify(dst, ctx[ver], ctx["changed"] if ver == "v2" else [])
                out[ver] = {"wall": t.wall, "cpu": t.cpu, "wire": w, "cmd": shlex.join(cmd), "rsync_stats": rsync_stats(t.stdout)}
        return out
    finally:
        remove(base)


def rclone_round(a: argparse.Namespace, ctx: dict, r: int) -> dict:
    base = os.path.join(a.work, f"spoke-rclone-{r}")
    remove(base)
    dst = os.path.join(base, "dst")
    os.makedirs(dst)
    drop_page_cache()  # before the round's first timed command: the servers read their disks
    try:
        out: dict = {"tool": "rclone"}
        with wan(ctx["moto"].port, a.rtt_ms, a.rate_mbit) as proxy:
            env = rclone_env({"wan": proxy.url_for()})
            for ver in ("v1", "v2"):
                cmd = ["rclone", "sync", f"wan:bench-{ver}", dst]
                t, w = timed_phase(cmd, proxy, env=env, servers=(ctx["moto"].proc.pid,))
                verify(dst, ctx[ver], ctx["changed"] if ver == "v2" else [])
                out[ver] = {"wall": t.wall, "cpu": t.cpu, "wire": w, "cmd": shlex.join(cmd)}
        return out
    finally:
        remove(base)


def listing_round(a: argparse.Namespace, ctx: dict, r: int) -> dict:
    base = os.path.join(a.work, f"spoke-list-{r}")
    remove(base)
    os.makedirs(base)
    hub, spoke = ctx["list_hub"], None
    try:
        with wan(hub.port, a.rtt_ms, a.rate_mbit) as proxy:
            spoke = Spoke(a.python, proxy.url_for(), os.path.join(base, "cache"), a.cache_size, hub.token)
            spoke.stats()  # token check with the hub, once
            out: dict = {"round": r, "files": ctx["tree_files"]}
            for phase in ("cold", "warm"):
                st0 = spoke.stats()
                t, w = timed_phase(spoke.cli("ls", "tree@main", "d0000"), proxy, env=fabric_env(),
                                   servers=(spoke.proc.pid, hub.proc.pid))
                st1 = spoke.stats()
                n = len(json.loads(t.stdout))
                if n != ctx["tree_files"]:
                    raise SystemExit(f"ls listed {n} entries, expected {ctx['tree_files']}")
                out[phase] = {"wall": t.wall, "cpu": t.cpu, "wire": w, "cmd": shlex.join(t.cmd), "entries": n,
                              "upstream_requests": st1["upstream_requests"] - st0["upstream_requests"],
                              "upstream_bytes_received": st1["upstream_bytes_received"] - st0["upstream_bytes_received"]}
            floor = run_timed(fabric_cmd(a.python) + ["--version"], env=fabric_env())
            out["cli_startup"] = floor.wall
        with wan(ctx["rsyncd"].port, a.rtt_ms, a.rate_mbit) as proxy:
            cmd = ["rsync", "--list-only", f"rsync://127.0.0.1:{proxy.port}/tree/d0000/"]
            t, w = timed_phase(cmd, proxy)
            n = sum(1 for line in t.stdout.splitlines() if line.startswith("-"))
            out["rsync"] = {"wall": t.wall, "cpu": t.cpu, "wire": w, "cmd": shlex.join(cmd), "entries": n}
        return out
    finally:
        if spoke is not None:
            spoke.stop()
        remove(base)


# -- driver -------------------------------------------------------------------------------
def prepare(a: argparse.Namespace, data: str, ctx: dict) -> None:
    ctx.update({"v1": os.path.join(data, "v1"), "v2": os.path.join(data, "v2"), "manifest": load_manifest(data)})
    ctx["changed"] = changed_files(ctx["manifest"], ctx["v2"])
    ctx["v1_only"] = frozenset(tree_index(ctx["v1"]).keys() - tree_index(ctx["v2"]).keys())
    ctx["export_deletes"] = export_deletes(a.python)
    prep = os.path.join(a.work, "spoke-prep")
    remove(prep)
    os.makedirs(prep)
    ctx["prep"] = prep
    t0 = time.perf_counter()
    if {"fabric", "fabric-hub", "fabric-mount"} & set(a.tools):
        local_store(a.python, os.path.join(prep, "hub-v1"), "bench", ctx["v1"])
        ctx["template_v1"] = os.path.join(prep, "hub-v1")
    if a.listing:
        ctx["tree"] = ensure_flat_tree(a.python, a.tree_files, a.seed)
        ctx["tree_files"] = a.tree_files
        local_store(a.python, os.path.join(prep, "hub-tree"), "tree", ctx["tree"])
        ctx["list_hub"] = Hub(a.python, os.path.join(prep, "hub-tree"))
    modules = {"v1": (ctx["v1"], True), "v2": (ctx["v2"], True)}
    if a.listing:
        modules["tree"] = (ctx["tree"], True)
    ctx["rsyncd"] = RsyncDaemon(os.path.join(prep, "rsyncd"), modules)
    if "rclone" in a.tools:
        ctx["moto"] = Moto(a.python, os.path.join(prep, "moto"))
        env = rclone_env({"moto": ctx["moto"].url})
        for ver in ("v1", "v2"):
            run(["rclone", "mkdir", f"moto:bench-{ver}"], env=env)
            run(["rclone", "copy", ctx[ver], f"moto:bench-{ver}"], env=env)
    print(f"prepared in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)


def teardown(ctx: dict) -> None:
    for key in ("list_hub", "rsyncd", "moto"):
        if key in ctx:
            ctx[key].stop()
    if "prep" in ctx:
        remove(ctx["prep"])


def run_rounds(a: argparse.Namespace, ctx: dict) -> tuple[list[dict], list[dict]]:
    rounds, listings = [], []
    for r in range(a.runs):
        order = a.tools if r % 2 == 0 else a.tools[::-1]
        got = {"round": r, "load_before": loadavg(), "order": order}
        for tool in order:
            if tool in ("fabric", "fabric-hub"):
                got[tool] = with_retries(fabric_round, a, ctx, r, tool == "fabric")
            elif tool == "fabric-mount":
                got[tool] = with_retries(mount_round, a, ctx, r)
            elif tool == "rclone":
                got[tool] = with_retries(rclone_round, a, ctx, r)
            else:
                got[tool] = with_retries(rsync_round, a, ctx, r, tool == "rsync-z")
            print(f"round {r} {tool}: " + ", ".join(
                f"{v} {got[tool][v]['wire']['total'] / MiB:.2f} MiB in {got[tool][v]['wall']:.1f}s" for v in ("v1", "v2")),
                file=sys.stderr, flush=True)
        got["load_after"] = loadavg()
        rounds.append(got)
        if a.listing:
            lst = with_retries(listing_round, a, ctx, r)
            lst["load"] = loadavg()
            listings.append(lst)
            c = lst["cold"]
            print(f"round {r} listing: cold {c['upstream_requests']} upstream requests, {c['wall']:.1f}s; "
                  f"warm {lst['warm']['wall']:.1f}s; rsync {lst['rsync']['wall']:.1f}s", file=sys.stderr, flush=True)
    return rounds, listings


def summarize(rounds: list[dict], listings: list[dict], manifest: dict) -> dict:
    tools = [t for t in ("fabric", "fabric-hub", "fabric-mount", "rsync", "rsync-z", "rclone") if t in rounds[0]]
    size = {"v1": manifest["v1"]["bytes"], "v2": manifest["v2"]["bytes"]}
    s: dict = {"tools": {}}
    for t in tools:
        s["tools"][t] = {}
        for v in [v for v in ("v1", "v2", "v2-warm") if v in rounds[0][t]]:
            rows = [r[t][v] for r in rounds]
            x = {
                "wire_total": median([w["wire"]["total"] for w in rows]),
                "wire_up": median([w["wire"]["up"] for w in rows]),
                "wire_down": median([w["wire"]["down"] for w in rows]),
                "wire_min": min(w["wire"]["total"] for w in rows),
                "wire_max": max(w["wire"]["total"] for w in rows),
                "connections": median([w["wire"]["connections"] for w in rows]),
                "wall": median([w["wall"] for w in rows]),
                "wall_min": min(w["wall"] for w in rows),
                "wall_max": max(w["wall"] for w in rows),
                "cpu": median([w["cpu"] for w in rows]),
                "server_cpu": median([w["wire"]["server_cpu"] for w in rows]),
                "mb_per_s": median([size[v[:2]] / w["wall"] / MB for w in rows]),
            }
            if t in ("fabric", "fabric-mount"):
                x["upstream_requests"] = median([w["upstream_requests"] for w in rows])
            if t == "fabric-mount":
                x["top_up_bytes"] = median([w["top_up_bytes"] for w in rows])
                x["server_cpu_each"] = [median(list(each)) for each in zip(*(w["wire"]["server_cpu_each"] for w in rows))]
            s["tools"][t][v] = x
    s["ratios"] = {}
    for mine in [t for t in tools if t.startswith("fabric")]:
        for peer in [t for t in tools if not t.startswith("fabric")]:
            s["ratios"][peer if mine == "fabric" else f"{peer} ({mine})"] = {
                v: {"bytes": median([r[mine][v]["wire"]["total"] / r[peer][v]["wire"]["total"] for r in rounds]),
                    "time": median([r[mine][v]["wall"] / r[peer][v]["wall"] for r in rounds])}
                for v in ("v1", "v2")
            }
    if listings:
        s["listing"] = {
            phase: {
                "wall": median([x[phase]["wall"] for x in listings]),
                "wall_min": min(x[phase]["wall"] for x in listings),
                "wall_max": max(x[phase]["wall"] for x in listings),
                "upstream_requests": median([x[phase]["upstream_requests"] for x in listings]),
                "wire_total": median([x[phase]["wire"]["total"] for x in listings]),
                "connections": median([x[phase]["wire"]["connections"] for x in listings]),
                "cpu": median([x[phase]["cpu"] for x in listings]),
                "server_cpu": median([x[phase]["wire"]["server_cpu"] for x in listings]),
            }
            for phase in ("cold", "warm")
        }
        s["listing"]["rsync"] = {
            "wall": median([x["rsync"]["wall"] for x in listings]),
            "wire_total": median([x["rsync"]["wire"]["total"] for x in listings]),
            "connections": median([x["rsync"]["wire"]["connections"] for x in listings]),
        }
        s["listing"]["cli_startup"] = median([x["cli_startup"] for x in listings])
    return s


def novel_bytes(manifest: dict) -> int:
    """A floor for any v2 update: bytes of v2 that occur nowhere in v1 (new files + the edited ranges)."""
    p = manifest["params"]
    return p["new"] * p["file_size"] + len(manifest["edited"]) * p["edit_size"]


def render(results: dict) -> str:
    s, m, a, mach = results["summary"], results["manifest"], results["args"], results["machine"]
    lines = [
        (f"- date: {mach['date']}; machine: {mach.get('host_cpus')} CPUs ({mach.get('cpu', '?')}), {mach.get('mem_gib', '?')} GiB; "
        f"fabric {mach['fabric_commit']}; {mach.get('rsync', '')}; {mach.get('rclone', '')}; moto {mach.get('moto', '?')}"),
        "- load average (1/5/15 min) per round, before -> after: "
        + "; ".join(f"{r['load_before']} -> {r['load_after']}" for r in results["rounds"]),
        (f"- data: v1 = {m['v1']['files']} files, {m['v1']['bytes'] / MiB:.0f} MiB; v2 = {m['v2']['files']} files, "
        f"{m['v2']['bytes'] / MiB:.0f} MiB ({len(m['edited'])} edited by {m['params']['edit_size']} B, {m['params']['new']} new, "
        f"{len(m['renamed'])} renamed, {len(m['duplicated'])} duplicated); bytes of v2 found nowhere in v1: "
        f"{novel_bytes(m) / MiB:.2f} MiB"),
        (f"- link: WanProxy, RTT {a['rtt_ms']:g} ms, {a['rate_mbit']:g} Mbit/s each way, one-RTT TCP handshake; "
        "bytes = TCP payload both ways at the proxy (HTTP/rsync/S3 protocol included)"),
        (f"- {a['runs']} round(s), fresh hub store + cold spoke cache ({a['cache_size']}) / empty destination per round; "
        "medians (min..max); time = whole client process"),
        f"- command: `{results['command']}`",
        "",
        "| tool | phase | wire MiB (up / down) | TCP conns | wall s | MB/s | client CPU s | server CPU s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t, per in s["tools"].items():
        for v, x in per.items():
            lines.append(
                f"| {t} | {v} | {x['wire_total'] / MiB:.2f} ({x['wire_up'] / MiB:.2f} / {x['wire_down'] / MiB:.2f}) | "
                f"{x['connections']:.0f} | {x['wall']:.2f} ({x['wall_min']:.2f}..{x['wall_max']:.2f}) | {x['mb_per_s']:.0f} | "
                f"{x['cpu']:.2f} | {x['server_cpu']:.2f} |"
            )
    lines.append("")
    rate = a["rate_mbit"] * 1e6 / 8
    lines.append(f"- link floor (bytes / rate, no protocol, no RTT): v1 {m['v1']['bytes'] / rate:.2f} s, "
                 f"v2's novel bytes {novel_bytes(m) / rate:.2f} s at {a['rate_mbit']:g} Mbit/s")
    if "fabric" in s["tools"]:
        f = s["tools"]["fabric"]
        lines.append(f"- fabric upstream requests (spoke stats): v1 {f['v1']['upstream_requests']:.0f}, "
                     f"v2 {f['v2']['upstream_requests']:.0f}; server CPU = spoke + hub; v2 updates v1's directory in "
                     "place; `v2-warm` = v2 exported into an empty directory from the now-warm spoke (no WAN bytes): "
                     "the local cost of a whole export")
    if "fabric-hub" in s["tools"]:
        lines.append("- fabric-hub: `fabric --server HUB export` straight across the link (no spoke); server CPU = hub")
    if "fabric-mount" in s["tools"]:
        f = s["tools"]["fabric-mount"]
        beside = " with `--spoke-cache` (on the spoke's machine: it reads the chunks the spoke's files hold)" if a.get("mount_beside") else ""
        lines.append("- fabric-mount: `cp -a` (v1) and `rsync -a --delete` (v2, in place) from a read-only mount of a cold "
                     f"spoke{beside}; upstream requests v1 {f['v1']['upstream_requests']:.0f}, v2 {f['v2']['upstream_requests']:.0f}; "
                     f"fetched for top-up hints v1 {f['v1']['top_up_bytes'] / MiB:.1f} MiB, v2 {f['v2']['top_up_bytes'] / MiB:.1f} MiB; "
                     "client CPU = cp/rsync; server CPU = spoke + hub + the mount process ("
                     + "; ".join(f"{v} {' + '.join(f'{c:.2f}' for c in f[v]['server_cpu_each'])} s" for v in ("v1", "v2")) + ")")
    for peer, r in s["ratios"].items():
        goal = ""
        if peer in ("rsync", "rsync-z"):
            goal = f" (goal < 1.0: {'met' if r['v2']['bytes'] < 1.0 else 'MISSED'})"
        elif peer == "rclone":
            goal = f" (goal <= 0.2: {'met' if r['v2']['bytes'] <= 0.2 else 'MISSED'})"
        lines.append(f"- fabric / {peer}: v2 bytes **{r['v2']['bytes']:.3f}x**{goal}, v1 bytes {r['v1']['bytes']:.2f}x; "
                     f"time v1 {r['v1']['time']:.2f}x, v2 {r['v2']['time']:.2f}x (<1: fabric faster)")
    if "listing" in s:
        L = s["listing"]
        lines += [
            "",
            (f"Listing one directory of {results['listings'][0]['files']:,} files through a cold spoke "
            f"(`fabric --server SPOKE ls tree@main d0000`, {a['rtt_ms']:g} ms RTT):"),
            "",
            "| what | upstream requests | wire MiB | TCP conns | wall s | client CPU s | server CPU s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for phase in ("cold", "warm"):
            x = L[phase]
            lines.append(f"| fabric ls, {phase} spoke | {x['upstream_requests']:.0f} | {x['wire_total'] / MiB:.2f} | "
                         f"{x['connections']:.0f} | {x['wall']:.2f} ({x['wall_min']:.2f}..{x['wall_max']:.2f}) | "
                         f"{x['cpu']:.2f} | {x['server_cpu']:.2f} |")
        x = L["rsync"]
        lines.append(f"| rsync --list-only (reference) | - | {x['wire_total'] / MiB:.2f} | {x['connections']:.0f} | "
                     f"{x['wall']:.2f} | - | - |")
        lines += [
            "",
            (f"- cold listing: **{L['cold']['upstream_requests']:.0f} round trips** to the hub (goal < 50: "
            f"{'met' if L['cold']['upstream_requests'] < 50 else 'MISSED'}); `fabric --version` alone takes "
            f"{L['cli_startup']:.2f} s (interpreter + CLI start-up, included in every fabric wall time)"),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help="versions data set (default: generated under bench/work/data/)")
    p.add_argument("--quick", action="store_true", help="1/10 data set, 10,000-file directory, 1 round")
    p.add_argument("--runs", type=int, default=None, help="rounds (default 3, quick 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", default=os.path.join(WORK, "stores"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--rate-mbit", type=float, default=1000.0)
    p.add_argument("--cache-size", default="4GiB")
    p.add_argument("--tools", default="fabric,rsync,rsync-z,rclone", help="comma-separated subset")
    p.add_argument("--tree-files", type=int, default=None, help="files in the listed directory (default 100,000; quick 10,000)")
    p.add_argument("--no-listing", dest="listing", action="store_false")
    p.add_argument("--mount-beside", action="store_true",
                   help="fabric-mount mounts with --spoke-cache (a mount on the spoke's machine, as the CSI driver makes one)")
    p.add_argument("--json-out")
    p.add_argument("--md-out")
    a = p.parse_args(argv)
    a.tools = [t for t in a.tools.split(",") if t]
    a.runs = a.runs or (1 if a.quick else 3)
    a.tree_files = a.tree_files or (10_000 if a.quick else 100_000)
    for tool in ("rsync", "rclone"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not on PATH")
    os.makedirs(a.work, exist_ok=True)
    data = a.dataset or ensure_versions(a.python, a.quick, a.seed)
    info = machine()
    info["rsync"] = run(["rsync", "--version"]).splitlines()[0]
    info["rclone"] = run(["rclone", "version"]).splitlines()[0]
    info["moto"] = run([a.python, "-c", "import moto; print(moto.__version__)"]).strip()
    ctx: dict = {}
    try:
        prepare(a, data, ctx)
        warm_page_cache(ctx["v1"], ctx["v2"])
        rounds, listings = run_rounds(a, ctx)
    finally:
        teardown(ctx)
    results = {
        "machine": info, "args": vars(a),
        "manifest": {k: ctx["manifest"][k] for k in ("params", "v1", "v2", "edited", "renamed", "duplicated")},
        "rounds": rounds, "listings": listings, "summary": summarize(rounds, listings, ctx["manifest"]),
        "command": shlex.join(["python", "bench/bench_spoke.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    md = render(results)
    save_report(md, results, a.json_out, a.md_out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
