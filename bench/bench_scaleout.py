#!/usr/bin/env python3
"""Scale-out (issue 15): spoke groups across a WAN, and several hubs on one catalog and pack store.

Part 1 — **a region of spokes reading one dataset across a WAN.** One hub holds
a dataset of incompressible 1 MiB files (96 MiB; ``--quick`` 16 MiB). The
region reaches the hub through one :class:`testbed.wanproxy.WanProxy` (default
50 ms RTT, 1 Gbit/s each way, shared by every connection, like one link;
``--rate-mbit 200`` for a thinner one), which counts every byte that crosses it.
Spokes talk to each other directly on loopback (the LAN). Per cell, fresh
spokes (cold caches) and 1, 2 or 3 readers, started together, each reading the
whole dataset::

    fabric --server SPOKE_i --token T export bench@main out-i      # reader i, checked byte for byte afterwards

Layouts: ``1 spoke`` (every reader on the same spoke), ``3 spokes, group``
(``fabric spoke --group NAME --advertise URL``; reader i on spoke i) and
``3 spokes, no group`` (three independent spokes; reader i on spoke i): the
baseline a group is for. Reported: WAN bytes / the dataset's compressed chunk
bytes (as the hub stores them), aggregate read throughput (readers x dataset /
wall time from the first reader's start to the last one's end, CLI start-up
included), bytes spokes passed each other over the LAN, and the CPU seconds
hub and spokes spent.

Part 2 — **several hub processes on one PostgreSQL catalog and one S3 pack
store.** A throwaway PostgreSQL (``tests/pgserver.py``: initdb/pg_ctl, fsync
off) and moto's S3 server as the pack store (``--pack-store local``: one local
directory shared by the hubs instead). 1 or 2 ``fabric hub --db postgresql://…
--store s3://… --s3-listen`` processes; 16 clients (4 processes x 4 threads,
keep-alive, presigned SigV4) PUT new 4 KiB objects for ``--duration`` seconds,
each request to the next hub in turn; then each client reads its first 16
objects once (untimed: warms the frame cache of the hub it reads them through)
and GETs them over and over for as long, each through another hub than its PUT
when there are two; every body is checked. Reported: PUT and GET requests per
second and the 2-hub / 1-hub ratio, with the cores each component kept busy in
each phase (hubs, PostgreSQL, moto, the load generator).

    python bench/bench_scaleout.py                   # full size, 3 rounds (about 15-20 min on 2 cores)
    python bench/bench_scaleout.py --quick           # 16 MiB, 1 round, 3 s phases (a few minutes)
    python bench/bench_scaleout.py --rate-mbit 200   # a 200 Mbit/s WAN
    python bench/bench_scaleout.py --only region     # or --only hubs
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import multiprocessing as mp
import os
import random
import shlex
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import (
    FABRIC_SRC,
    MB,
    Timed,
    fabric_cmd,
    fabric_env,
    loadavg,
    machine,
    median,
    remove,
    run,
    run_timed,
    save_json,
    save_report,
    with_retries,
)
from bench_remote import WORK, Hub, Moto, Spoke, free_port, proc_cpu, wan, wire

# fabric and tests/ from the revision measured: the working tree, or run_all.sh --rev's snapshot.
sys.path.insert(0, FABRIC_SRC)
from fabric.api.s3.sigv4 import presign_url

MiB = 1 << 20
LAYOUTS = ("single", "group", "nogroup")
LAYOUT_NAMES = {"single": "1 spoke", "group": "3 spokes, group", "nogroup": "3 spokes, no group"}
OBJECT_SIZE = 4096


# -- part 1: a region of spokes --------------------------------------------------------------------
def ensure_dataset(mib: int, seed: int) -> dict:
    """``mib`` incompressible 1 MiB files under bench/work/data/ (made once); manifest with sha256 per file."""
    root = os.path.join(WORK, "data", f"scaleout-{mib}mib-s{seed}")
    manifest_path = os.path.join(root, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            return json.load(f)
    files = os.path.join(root, "files")
    remove(root)
    os.makedirs(os.path.join(files, "part"))
    digests = {}
    for i in range(mib):
        data = random.Random(seed * 100_000 + i).randbytes(MiB)
        rel = f"part/{i:03d}.bin"
        with open(os.path.join(files, rel), "wb") as f:
            f.write(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    manifest = {"root": files, "files": digests, "bytes": mib * MiB, "seed": seed}
    save_json(manifest_path, manifest)
    return manifest


def compressed_bytes(hub: Hub) -> tuple[int, int]:
    """(bytes of the stored frames of every chunk of bench@main, number of chunks), as the hub serves them."""
    from fabric.client.http import HttpPlane
    from tests.spokeserver import chunk_ids, frame_bytes

    plane = HttpPlane(hub.url, hub.token)
    try:
        ids = chunk_ids(plane, "bench", "main")
        return frame_bytes(plane, ids), len(ids)
    finally:
        plane.close()


def wait_members(spokes: list[Spoke], n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(s.stats()["group"]["members"]) == n for s in spokes):
            return
        time.sleep(0.2)
    raise SystemExit(f"the group did not reach {n} members within {timeout:.0f} s")


def run_readers(cmds: list[list[str]]) -> tuple[float, list[Timed]]:
    """Start every reader at once; (wall from the first start to the last exit, each reader's Timed)."""
    results: list[Timed | BaseException | None] = [None] * len(cmds)

    def one(i: int) -> None:
        try:
            results[i] = run_timed(cmds[i], env=fabric_env(), cwd=FABRIC_SRC, sync=False)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cmds))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for res in results:
        if isinstance(res, BaseException):
            raise res
    return wall, results  # type: ignore[return-value]


def verify(dst: str, manifest: dict) -> None:
    """``dst`` holds exactly the dataset's files, byte for byte."""
    got = sorted(os.path.relpath(os.path.join(d, n), dst) for d, _, ns in os.walk(dst) for n in ns)
    if got != sorted(manifest["files"]):
        raise SystemExit(f"{dst} holds {len(got)} files, expected {len(manifest['files'])}")
    for rel, digest in manifest["files"].items():
        with open(os.path.join(dst, rel), "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != digest:
                raise SystemExit(f"{dst}/{rel} has other bytes than the dataset")


def region_cell(a: argparse.Namespace, ctx: dict, layout: str, readers: int, r: int) -> dict:
    """Fresh spokes of one layout behind one WAN proxy; ``readers`` concurrent cold reads of the whole dataset."""
    base = os.path.join(a.work, f"scaleout-{layout}-{readers}-{r}")
    remove(base)
    os.makedirs(base)
    hub = ctx["hub"]
    ports = [free_port() for _ in range(1 if layout == "single" else 3)]
    group = f"region-{uuid.uuid4().hex[:8]}"
    spokes: list[Spoke] = []
    try:
        with wan(hub.port, a.rtt_ms, a.rate_mbit) as proxy:
            for i, port in enumerate(ports):  # chosen beforehand, so that group members can advertise them
                args = ["--group", group, "--advertise", f"http://127.0.0.1:{port}"] if layout == "group" else []
                spokes.append(Spoke(a.python, proxy.url_for(), os.path.join(base, f"cache{i}"), "4GiB", ctx["spoke_token"],
                                    port=port, args=args))
            if layout == "group":
                wait_members(spokes, len(spokes))
            for s in spokes:
                s.stats(hub.token)  # each spoke checks the readers' token with the hub once: not part of the reads
            targets = [spokes[i % len(spokes)] for i in range(readers)]
            cmds = [fabric_cmd(a.python) + ["--server", s.url, "--token", hub.token, "-q", "--json", "export", "bench@main",
                                            os.path.join(base, f"out{i}")] for i, s in enumerate(targets)]
            servers = (hub.proc.pid, *(s.proc.pid for s in spokes))
            cpu0, w0, st0 = sum(proc_cpu(p) for p in servers), proxy.stats(), [s.stats() for s in spokes]
            wall, timed = run_readers(cmds)
            w = wire(w0, proxy.stats())
            server_cpu = sum(proc_cpu(p) for p in servers) - cpu0
            st1 = [s.stats() for s in spokes]
        for i in range(readers):
            verify(os.path.join(base, f"out{i}"), ctx["manifest"])

        def delta(key: str, part: str | None = None) -> int:
            pick = (lambda st: st.get(key, 0)) if part is None else (lambda st: (st.get(part) or {}).get(key, 0))
            return sum(pick(b) - pick(a0) for a0, b in zip(st0, st1, strict=True))

        return {"layout": layout, "readers": readers, "spokes": len(spokes), "wall": wall,
                "reader_walls": [t.wall for t in timed], "reader_cpu": sum(t.cpu for t in timed), "server_cpu": server_cpu,
                "wire": w, "wan_ratio": w["total"] / ctx["frames"],
                "mb_per_s": readers * ctx["manifest"]["bytes"] / wall / MB,
                "upstream_bytes_received": delta("upstream_bytes_received"),
                "peer_bytes_received": delta("peer_bytes_received"),
                "peer_fallback_chunks": delta("peer_fallback_chunks", "group"),
                "peer_failures": delta("peer_failures", "group"),
                "cmd": shlex.join(cmds[0])}
    finally:
        for s in spokes:
            s.stop()
        remove(base)


def prepare_region(a: argparse.Namespace, ctx: dict) -> None:
    import httpx

    ctx["manifest"] = ensure_dataset(a.mib, a.seed)
    remove(os.path.join(a.work, "scaleout-region"))
    data = os.path.join(a.work, "scaleout-region", "hub")  # its log goes next to it, removed with it
    base = fabric_cmd(a.python) + ["--data", data, "-q", "--json"]
    run(base + ["repo", "create", "bench"], env=fabric_env())
    run(base + ["import", ctx["manifest"]["root"], "bench@main", "-m", "dataset"], env=fabric_env())
    ctx["hub_data"] = data
    ctx["hub"] = hub = Hub(a.python, data)
    ctx["frames"], ctx["chunks"] = compressed_bytes(hub)
    r = httpx.post(hub.url + "/api/v1/tokens", headers={"Authorization": f"Bearer {hub.token}"}, timeout=30,
                   json={"name": "bench-spokes", "roles": {"*": "read"}, "rights": ["spoke"]})
    r.raise_for_status()
    ctx["spoke_token"] = r.json()["token"]


def region_rounds(a: argparse.Namespace, ctx: dict) -> list[dict]:
    rounds = []
    for r in range(a.runs):
        order = list(LAYOUTS[r % 3:] + LAYOUTS[:r % 3])  # each round starts with another layout
        got: dict = {"round": r, "order": order, "load_before": loadavg(), "cells": []}
        for layout in order:
            for n in (1, 2, 3):
                cell = with_retries(region_cell, a, ctx, layout, n, r)
                got["cells"].append(cell)
                print(f"round {r} {LAYOUT_NAMES[layout]}, {n} reader(s): WAN {cell['wire']['total'] / MiB:.1f} MiB "
                      f"({cell['wan_ratio']:.2f}x), {cell['mb_per_s']:.0f} MB/s in {cell['wall']:.1f}s", file=sys.stderr, flush=True)
        got["load_after"] = loadavg()
        rounds.append(got)
    return rounds


def summarize_region(rounds: list[dict]) -> dict:
    def cells(layout: str, n: int) -> list[dict]:
        return [c for r in rounds for c in r["cells"] if c["layout"] == layout and c["readers"] == n]

    s: dict = {"cells": {}, "ratios": {}}
    for layout in LAYOUTS:
        for n in (1, 2, 3):
            cs = cells(layout, n)
            s["cells"][f"{layout}/{n}"] = {
                "wan_bytes": median([c["wire"]["total"] for c in cs]),
                "wan_ratio": median([c["wan_ratio"] for c in cs]),
                "wan_ratio_max": max(c["wan_ratio"] for c in cs),
                "mb_per_s": median([c["mb_per_s"] for c in cs]),
                "wall": median([c["wall"] for c in cs]),
                "wall_min": min(c["wall"] for c in cs),
                "wall_max": max(c["wall"] for c in cs),
                "peer_bytes": median([c["peer_bytes_received"] for c in cs]),
                "server_cpu": median([c["server_cpu"] for c in cs]),
                "reader_cpu": median([c["reader_cpu"] for c in cs]),
                "connections": median([c["wire"]["connections"] for c in cs]),
                "peer_fallback_chunks": sum(c["peer_fallback_chunks"] for c in cs),
            }
    for n in (1, 2, 3):  # ratios taken within each round, then the median
        pairs = [(g, s1, ng) for g, s1, ng in zip(cells("group", n), cells("single", n), cells("nogroup", n), strict=True)]
        s["ratios"][str(n)] = {
            "wan_nogroup_over_group": median([ng["wire"]["total"] / g["wire"]["total"] for g, _, ng in pairs]),
            "throughput_group_over_single": median([g["mb_per_s"] / s1["mb_per_s"] for g, s1, _ in pairs]),
            "throughput_group_over_nogroup": median([g["mb_per_s"] / ng["mb_per_s"] for g, _, ng in pairs]),
        }
    return s


# -- part 2: several hubs over one catalog and one pack store ---------------------------------------
def body_of(key: str) -> bytes:
    return random.Random(key).randbytes(OBJECT_SIZE)


GET_KEYS = 16  # keys per client thread that the GET phase reads, over and over (warmed first)


def _s3_thread(endpoints: list[str], ak: str, sk: str, wid: str, times: tuple[float, float, float], out: list) -> None:
    """PUT new keys until ``times[0]``, each to the next hub in turn; then read the first GET_KEYS of them once
    (untimed: it warms each hub's frame cache), and GET them over and over from ``times[1]`` to ``times[2]``,
    each through another hub than its PUT when there are several."""
    put_end, get_start, get_end = times
    conns: list[http.client.HTTPConnection | None] = [None] * len(endpoints)

    def request(hub: int, method: str, key: str, body: bytes | None) -> tuple[int, bytes]:
        conn = conns[hub]
        if conn is None:
            u = urlsplit(endpoints[hub])
            conn = conns[hub] = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        u = urlsplit(presign_url(method, endpoints[hub], f"/bench/{key}", ak, sk, expires=3600))
        try:
            conn.request(method, f"{u.path}?{u.query}", body=body)
            r = conn.getresponse()
            return r.status, r.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conns[hub] = None
            return 0, b""

    def get(key: str, hub: int) -> int:
        """0: the right body; 1: an error status; 2: a wrong body."""
        status, body = request((hub + 1) % len(endpoints), "GET", key, None)
        return 1 if status != 200 else 0 if body == body_of(key) else 2

    put = got = put_err = 0
    get_err = [0, 0, 0]
    stored: list[tuple[str, int]] = []
    i = 0
    while time.monotonic() < put_end:
        key, hub = f"{wid}/{i:06d}", i % len(endpoints)
        i += 1
        status, _ = request(hub, "PUT", key, body_of(key))
        if status == 200:
            put += 1
            stored.append((key, hub))
        else:
            put_err += 1
    stored = stored[:GET_KEYS]
    for key, hub in stored:
        get_err[get(key, hub)] += 1
    late = time.monotonic() > get_start  # the warm-up ran into the GET phase
    while time.monotonic() < get_start:
        time.sleep(0.005)
    j = 0
    while stored and time.monotonic() < get_end:
        result = get(*stored[j % len(stored)])
        j += 1
        got += result == 0
        get_err[result] += 1
    for conn in conns:
        if conn is not None:
            conn.close()
    out.append((put, got, put_err, get_err[1], get_err[2], int(late)))


def _s3_proc(endpoints: list[str], ak: str, sk: str, k: int, threads: int, times: tuple[float, float, float], q) -> None:
    out: list = []
    ts = [threading.Thread(target=_s3_thread, args=(endpoints, ak, sk, f"p{k}t{t}", times, out)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put([sum(x[i] for x in out) for i in range(6)])


def s3_load(endpoints: list[str], ak: str, sk: str, procs: int, threads: int, duration: float, pids: dict[str, list[int]]) -> dict:
    """``procs * threads`` clients: PUT for ``duration`` s, a 2 s pause (warm-up reads), GET for ``duration`` s.
    CPU seconds of each component in ``pids`` (and of the clients) per phase, sampled at the phase boundaries."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    t0 = time.monotonic() + 1.0
    times = (t0 + duration, t0 + duration + 2.0, t0 + 2 * duration + 2.0)
    ps = [ctx.Process(target=_s3_proc, args=(endpoints, ak, sk, k, threads, times, q)) for k in range(procs)]
    for p in ps:
        p.start()
    pids = {**pids, "clients": [p.pid for p in ps]}
    samples = []
    for at in (t0, times[0], times[1], times[2]):
        time.sleep(max(0.0, at - time.monotonic()))
        samples.append({k: sum(proc_cpu(pid) for pid in v) for k, v in pids.items()})
    got = [q.get(timeout=2 * duration + 300) for _ in ps]
    for p in ps:
        p.join()
    put, get, put_err, get_err, wrong, late = (sum(g[i] for g in got) for i in range(6))
    return {"puts": put, "gets": get, "put_errors": put_err, "get_errors": get_err, "wrong_bodies": wrong,
            "late_warmups": late, "put_per_s": put / duration, "get_per_s": get / duration,
            "cpu_put": {k: (samples[1][k] - samples[0][k]) / duration for k in pids},
            "cpu_get": {k: (samples[3][k] - samples[2][k]) / duration for k in pids}}


def postmaster_pid(db_url: str) -> int | None:
    """PostgreSQL's postmaster PID (its CPU figures include its backends'), from the data directory it reports."""
    import psycopg

    with psycopg.connect(db_url, connect_timeout=10) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


def check_round_trip(hubs: list[Hub], ak: str, sk: str) -> None:
    """A PUT through each hub reads back through every hub (the bucket binding is cached up to 2 s per process)."""
    import httpx

    deadline = time.monotonic() + 15
    for i, h in enumerate(hubs):
        key = f"check/{i}"
        httpx.put(presign_url("PUT", h.s3, f"/bench/{key}", ak, sk), content=body_of(key), timeout=30).raise_for_status()
        for other in hubs:
            while True:
                r = httpx.get(presign_url("GET", other.s3, f"/bench/{key}", ak, sk), timeout=30)
                if r.status_code == 200 and r.content == body_of(key):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{key} put through {h.s3} does not read back through {other.s3}: {r.status_code}")
                time.sleep(0.2)


def hubs_cell(a: argparse.Namespace, ctx: dict, n_hubs: int, r: int) -> dict:
    """``n_hubs`` hub processes on a fresh database and store prefix; the PUT/GET load spread over them."""
    import boto3
    import httpx
    from botocore.config import Config

    from tests.moto_server import DUMMY_AWS_ENV
    from tests.pgserver import drop_database, fresh_database

    base = os.path.join(a.work, f"scaleout-hubs{n_hubs}-{r}")
    remove(base)
    os.makedirs(base)
    db = fresh_database(ctx["pg"], prefix="bench")
    prefix = f"r{r}-h{n_hubs}-{uuid.uuid4().hex[:6]}"
    store = (f"s3://{ctx['bucket']}/{prefix}?endpoint_url={ctx['moto'].url}&region=us-east-1" if a.pack_store == "moto"
             else os.path.join(base, "packs"))
    env = {**fabric_env(), **DUMMY_AWS_ENV}
    hubs: list[Hub] = []
    try:
        for i in range(n_hubs):  # one hub served by n_hubs processes: one catalog, one pack store
            hubs.append(Hub(a.python, os.path.join(base, f"hub{i}"), ["--db", db, "--store", store], env, s3=True))
        tok = httpx.post(hubs[0].url + "/api/v1/tokens", json={"name": "bench", "admin": True},
                         headers={"Authorization": f"Bearer {hubs[0].token}"}, timeout=30).json()
        ak, sk = tok["s3_access_key_id"], tok["s3_secret_access_key"]
        boto3.client("s3", endpoint_url=hubs[0].s3, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1",
                     config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket="bench")
        check_round_trip(hubs, ak, sk)
        pids = {"hubs": [h.proc.pid for h in hubs], "postgres": [p for p in (ctx["pg_pid"],) if p]}
        if a.pack_store == "moto":
            pids["moto"] = [ctx["moto"].proc.pid]
        res = s3_load([h.s3 for h in hubs], ak, sk, a.procs, a.threads, a.duration, pids)
        res["hubs"] = n_hubs
        return res
    finally:
        for h in hubs:
            h.stop()
        drop_database(db)
        remove(base)


def hubs_rounds(a: argparse.Namespace, ctx: dict) -> list[dict]:
    rounds = []
    for r in range(a.runs):
        order = [1, 2] if r % 2 == 0 else [2, 1]
        got: dict = {"round": r, "order": order, "load_before": loadavg()}
        for n in order:
            got[str(n)] = res = with_retries(hubs_cell, a, ctx, n, r)
            print(f"round {r} {n} hub(s): PUT {res['put_per_s']:.0f}/s, GET {res['get_per_s']:.0f}/s, errors "
                  f"{res['put_errors']}+{res['get_errors']}+{res['wrong_bodies']}", file=sys.stderr, flush=True)
        got["load_after"] = loadavg()
        rounds.append(got)
    return rounds


def summarize_hubs(rounds: list[dict]) -> dict:
    s: dict = {}
    for n in ("1", "2"):
        rows = [r[n] for r in rounds]
        s[n] = {k: median([x[k] for x in rows]) for k in ("put_per_s", "get_per_s")}
        s[n].update({k: sum(x[k] for x in rows) for k in ("put_errors", "get_errors", "wrong_bodies")})
        s[n]["late_warmups"] = sum(x["late_warmups"] for x in rows)
        for phase in ("cpu_put", "cpu_get"):
            s[n][phase] = {k: median([x[phase][k] for x in rows]) for k in rows[0][phase]}
    s["ratio"] = {k: median([r["2"][k] / r["1"][k] for r in rounds]) for k in ("put_per_s", "get_per_s")}
    return s


@contextlib.contextmanager
def hub_backends(a: argparse.Namespace, ctx: dict):
    """PostgreSQL (and moto, with its bucket) for part 2, stopped on exit."""
    import boto3

    from tests.pgserver import find_bindir, start_postgres

    with start_postgres() as pg:
        ctx["pg"], ctx["pg_pid"] = pg, postmaster_pid(pg)
        ctx["postgres"] = run([os.path.join(find_bindir() or "", "postgres"), "--version"]).strip()
        if a.pack_store != "moto":
            yield
            return
        ctx["moto"] = Moto(a.python, os.path.join(a.work, "scaleout-moto"))
        try:
            ctx["bucket"] = "bench-packs"
            boto3.client("s3", endpoint_url=ctx["moto"].url, aws_access_key_id="testing", aws_secret_access_key="testing",
                         region_name="us-east-1").create_bucket(Bucket=ctx["bucket"])
            yield
        finally:
            ctx["moto"].stop()
            remove(os.path.join(a.work, "scaleout-moto"))


# -- report ----------------------------------------------------------------------------------------
def render(results: dict) -> str:
    a, mach = results["args"], results["machine"]
    lines = [
        (f"- date: {mach['date']}; machine: {mach.get('host_cpus')} CPUs ({mach.get('cpu', '?')}), {mach.get('mem_gib', '?')} GiB; "
         f"python {mach.get('python')}; fabric {mach['fabric_commit']}{'; QUICK (smoke test)' if a['quick'] else ''}"),
        f"- command: `{results['command']}`",
    ]
    if "region" in results:
        reg, s = results["region"], results["region"]["summary"]
        lines += [
            "- load average (1/5/15 min) per round, before -> after: "
            + "; ".join(f"{r['load_before']} -> {r['load_after']}" for r in reg["rounds"]),
            "",
            (f"**Part 1: one dataset read by 1-3 readers through a region's spokes.** Dataset: {len(reg['manifest']['files'])} "
             f"files of 1 MiB of random bytes ({reg['manifest']['bytes'] / MiB:.0f} MiB), {reg['chunks']} chunks, "
             f"{reg['frames'] / MiB:.2f} MiB as stored (compressed frames). WAN: one WanProxy between the region and the hub, "
             f"RTT {a['rtt_ms']:g} ms, {a['rate_mbit']:g} Mbit/s each way shared by all connections; WAN bytes = TCP payload both "
             f"ways (HTTP, heartbeats and watch streams included). Each cell: fresh spokes (cold), readers started together, "
             f"`fabric export` of the whole dataset each, checked byte for byte. {a['runs']} round(s), medians (min..max)."),
            "",
            "| layout | readers | WAN MiB | WAN / dataset | aggregate MB/s | wall s | LAN (peer) MiB | hub+spokes CPU s | readers CPU s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for layout in LAYOUTS:
            for n in (1, 2, 3):
                c = s["cells"][f"{layout}/{n}"]
                lines.append(
                    f"| {LAYOUT_NAMES[layout]} | {n} | {c['wan_bytes'] / MiB:.1f} | **{c['wan_ratio']:.2f}x** | {c['mb_per_s']:.0f} | "
                    f"{c['wall']:.1f} ({c['wall_min']:.1f}..{c['wall_max']:.1f}) | {c['peer_bytes'] / MiB:.1f} | "
                    f"{c['server_cpu']:.1f} | {c['reader_cpu']:.1f} |")
        r3 = s["ratios"]["3"]
        fallbacks = sum(c["peer_fallback_chunks"] for c in s["cells"].values())
        lines += [
            "",
            f"- chunks a group member fetched from the hub because their owner failed or was slow: {fallbacks} (all cells, all rounds).",
            (f"- 3 readers: WAN bytes without a group / with one: **{r3['wan_nogroup_over_group']:.2f}x**; aggregate throughput "
             f"group / 1 spoke {r3['throughput_group_over_single']:.2f}x, group / no group "
             f"{r3['throughput_group_over_nogroup']:.2f}x (ratios per round, then the median)."),
            ("- 2 readers: " + f"no group / group WAN {s['ratios']['2']['wan_nogroup_over_group']:.2f}x, throughput group / 1 spoke "
             f"{s['ratios']['2']['throughput_group_over_single']:.2f}x."),
            (f"- The machine has {mach.get('host_cpus')} cores for the hub, up to 3 spokes, up to 3 reader processes and the "
             "WAN proxy: aggregate throughput is bounded by CPU (compare the CPU seconds with the wall time), not by the link; "
             "it says little about what 3 spokes on 3 machines would sustain. The WAN ratios do not depend on it."),
        ]
    if "hubs" in results:
        h = results["hubs"]
        s = h["summary"]
        store = ("moto's S3 server (one process, in-memory)" if a["pack_store"] == "moto"
                 else "one local directory shared by the hubs (`--store DIR`)")
        lines += [
            "",
            (f"**Part 2: small-object S3 PUT and GET through 1 and 2 hub processes** on one PostgreSQL catalog "
             f"({h.get('postgres', '?')}, throwaway server, fsync off) and one pack store: {store}. "
             f"{a['procs'] * a['threads']} clients ({a['procs']} processes x {a['threads']} threads, keep-alive, presigned SigV4), "
             f"each request to the next hub in turn: PUT new {OBJECT_SIZE // 1024} KiB objects for {a['duration']:g} s; then "
             f"each client reads its first {GET_KEYS} objects once (untimed, warms the frame cache of the hub it reads them "
             f"through) and GETs them over and over for {a['duration']:g} s, each through another hub than its PUT when there "
             f"are two; every body checked. {a['runs']} round(s), order alternating, medians. CPU: seconds per second of the "
             "phase (cores busy), from /proc."),
            "- load average (1/5/15 min) per round, before -> after: "
            + "; ".join(f"{r['load_before']} -> {r['load_after']}" for r in h["rounds"]),
            "",
            "| hub processes | PUT req/s | GET req/s | errors (PUT / GET / wrong body) | cores busy in PUT: hubs / postgres / moto / clients "
            "| cores busy in GET: hubs / postgres / moto / clients |",
            "| ---: | ---: | ---: | --- | --- | --- |",
        ]

        def cores(c: dict) -> str:
            return " / ".join(f"{c.get(k, 0):.2f}" for k in ("hubs", "postgres", "moto", "clients"))

        for n in ("1", "2"):
            x = s[n]
            lines.append(f"| {n} | {x['put_per_s']:.0f} | {x['get_per_s']:.0f} | {x['put_errors']} / {x['get_errors']} / "
                         f"{x['wrong_bodies']} | {cores(x['cpu_put'])} | {cores(x['cpu_get'])} |")
        lines += [
            "",
            (f"- 2 hubs / 1 hub: PUT **{s['ratio']['put_per_s']:.2f}x**, GET **{s['ratio']['get_per_s']:.2f}x** (ratios per "
             "round, then the median)."
             + (f" Client threads whose warm-up reads ran into the GET phase: {s['1']['late_warmups'] + s['2']['late_warmups']}."
                if s['1']['late_warmups'] + s['2']['late_warmups'] else "")),
            (f"- On {mach.get('host_cpus')} cores shared by the hubs, PostgreSQL, the pack store, the load generator (and "
             "other users' processes: see the load average), a second hub process helps only as far as CPU is left over: "
             "one process is one interpreter and keeps at most about one core busy (1 hub: "
             f"{s['1']['cpu_put']['hubs']:.2f} cores in PUT, {s['1']['cpu_get']['hubs']:.2f} in GET). A ratio near 1 is "
             "expected here; it says little about hubs on separate machines. Each PUT also writes one pack object to the "
             f"pack store{' (moto: its CPU in the PUT phase)' if a['pack_store'] == 'moto' else ''}. What the figures do "
             "show: two processes on one catalog serve the "
             "load with no errors, every object readable through the other process."),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="16 MiB dataset, 1 round, 3 s load phases (smoke test)")
    p.add_argument("--only", choices=("region", "hubs"), help="run one part")
    p.add_argument("--runs", type=int, default=None, help="rounds (default 3, quick 1)")
    p.add_argument("--mib", type=int, default=None, help="dataset size in 1 MiB files (default 96, quick 16)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="WAN rate each way (e.g. 200)")
    p.add_argument("--duration", type=float, default=None, help="seconds of each load phase (default 8, quick 3)")
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--pack-store", choices=("moto", "local"), default="moto", help="part 2's shared pack store")
    p.add_argument("--work", default=os.path.join(WORK, "stores"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json-out")
    p.add_argument("--md-out")
    a = p.parse_args(argv)
    a.runs = a.runs or (1 if a.quick else 3)
    a.mib = a.mib or (16 if a.quick else 96)
    a.duration = a.duration or (3.0 if a.quick else 8.0)
    os.makedirs(a.work, exist_ok=True)
    results: dict = {"machine": machine(), "args": vars(a),
                     "command": shlex.join(["python", "bench/bench_scaleout.py", *(argv if argv is not None else sys.argv[1:])])}
    if a.only in (None, "region"):
        ctx: dict = {}
        try:
            prepare_region(a, ctx)
            rounds = region_rounds(a, ctx)
        finally:
            if "hub" in ctx:
                ctx["hub"].stop()
            if "hub_data" in ctx:
                remove(os.path.dirname(ctx["hub_data"]))
        results["region"] = {"manifest": {k: ctx["manifest"][k] for k in ("files", "bytes", "seed")}, "frames": ctx["frames"],
                             "chunks": ctx["chunks"], "rounds": rounds, "summary": summarize_region(rounds)}
    if a.only in (None, "hubs"):
        ctx = {}
        with hub_backends(a, ctx):
            rounds = hubs_rounds(a, ctx)
        results["hubs"] = {"postgres": ctx["postgres"], "rounds": rounds, "summary": summarize_hubs(rounds)}
    md = render(results)
    save_report(md, results, a.json_out, a.md_out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
