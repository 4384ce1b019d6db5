"""Large files read through fsspec from a warm spoke: ``fabric://`` against s3fs and the local disk.

What a training job or a restore (torch DCP's ``FsspecReader``) gets from a spoke next to it
that holds the data already: the spoke's chunks are on its disk, the WAN is not involved.
Same files, side by side, each reader in a process of its own, rounds rotating the order:

- ``fabric``: ``fsspec.filesystem("fabric", server=SPOKE)``, each file opened and read in
  8 MiB ``read`` calls (fsspec's default read-ahead cache, fabric's default block size);
- ``fabric-glibc``: the same with ``FABRIC_MALLOC=glibc``, which keeps glibc's malloc
  settings in the reader instead of reusing freed buffers (``fabric.util.heap``);
- ``fabric-copies``: ``fabric`` with ``copies=DIR``, where DIR holds the plain copies a save of
  the same bytes through ``fabric://`` with ``copies=DIR`` left on this machine (a restore on
  the machine that saved a checkpoint): opens return the local copies;
- ``fabric-beside``: ``fabric`` with ``spoke_cache=`` the spoke's ``--cache`` directory (a
  reader on the spoke's own machine): the chunks its files hold are read from them, not sent
  over HTTP;
- ``s3fs``: ``s3fs.S3FileSystem`` against the same spoke's S3 API, the same 8 MiB reads,
  s3fs's defaults otherwise (from the S3 tools venv that ``make test`` builds);
- ``local``: the source files on the local disk, the same reads.

The kernel's page cache is dropped before every read (as root), so the spoke's chunk files
and the local files both come from the disk; with ``--keep-page-cache`` both stay in memory
after the first read (what the reader and the spoke cost when the disk is not the limit). With ``--rtt-ms``, both fsspec readers reach the
spoke (its REST and its S3 port) through a ``testbed.wanproxy.WanProxy`` link of that RTT
and ``--rate-mbit``: a reader in another region than the spoke, where a sequential reader
that waits for each range pays a round trip per range. Reported per reader: MB/s (10^6 bytes/s), the
reader's CPU seconds per GB and the spoke's (user + system), medians over the rounds, and
the ratios to ``local`` and ``s3fs`` taken round by round.

    python bench/bench_fsspec.py                      # 8 x 64 MiB, 5 rounds, ~2 minutes
    python bench/bench_fsspec.py --files 4 --mib 256 --rounds 3 --json-out r.json --md-out r.md
    python bench/bench_fsspec.py --rtt-ms 50 --rate-mbit 1000 --readers fabric,s3fs

With ``--writes``, it times saves instead (what ``copies=DIR`` costs a writer): each round,
fresh incompressible files (made before the clock starts, in the page cache) are written
through ``fabric://`` to a new directory of a branch at the spoke, 8 MiB ``write`` calls,
``close`` returning once the spoke holds the file (``--durability local``): ``fabric``
plain, ``fabric-copies`` with ``copies=DIR`` (each file also written to a local copy), and
``local`` (the same writes to a local directory, each file fsynced before its close).

    python bench/bench_fsspec.py --writes --files 4 --mib 64 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import REPO_ROOT, drop_page_cache, fabric_cmd, fabric_env, machine, median, remove, save_report, stop_process  # noqa: E402

READ = 8 << 20
READERS = ("fabric", "fabric-glibc", "fabric-copies", "fabric-beside", "s3fs", "local")

#: The reader: opens each path with the given file system and reads it in READ-byte calls;
#: prints bytes, seconds and the sha256 of all bytes in order. argv: kind, JSON settings.
READER = r"""
import hashlib, json, sys, time
kind, cfg = sys.argv[1], json.loads(sys.argv[2])
if kind == "s3fs":
    import s3fs
    fs = s3fs.S3FileSystem(key=cfg["key"], secret=cfg["secret"], skip_instance_cache=True,
                           client_kwargs={"endpoint_url": cfg["s3"], "region_name": "us-east-1"})
elif kind == "local":
    import fsspec
    fs = fsspec.filesystem("file")
else:
    import fsspec
    extra = {"copies": cfg["copies"]} if kind == "fabric-copies" else {"spoke_cache": cfg["spoke_cache"]} if kind == "fabric-beside" else {}
    fs = fsspec.filesystem("fabric", server=cfg["spoke"], token=cfg["token"], skip_instance_cache=True, **extra)
digest = hashlib.sha256() if cfg["verify"] else None
n, t = 0, time.perf_counter()
for path in cfg["paths"]:
    with fs.open(path, "rb") as f:
        while piece := f.read(cfg["read"]):
            n += len(piece)
            if digest is not None:
                digest.update(piece)
print(json.dumps({"bytes": n, "s": time.perf_counter() - t, "sha256": digest.hexdigest() if digest else None}))
"""


#: The writer: copies each source file to its destination with the given file system, in
#: ``read``-byte calls; prints bytes and seconds. argv: kind, JSON settings.
WRITER = r"""
import json, os, sys, time
kind, cfg = sys.argv[1], json.loads(sys.argv[2])
if kind != "local":
    import fsspec
    copies = {"copies": cfg["copies"]} if kind == "fabric-copies" else {}
    fs = fsspec.filesystem("fabric", server=cfg["spoke"], token=cfg["token"], skip_instance_cache=True, **copies)
n, t = 0, time.perf_counter()
for src, dst in cfg["pairs"]:
    with open(src, "rb") as s, (open(dst, "wb") if kind == "local" else fs.open(dst, "wb")) as d:
        while piece := s.read(cfg["read"]):
            d.write(piece)
            n += len(piece)
        if kind == "local":
            d.flush()
            os.fsync(d.fileno())
s = time.perf_counter() - t
if kind == "fabric-copies":
    from fabric.client.copies import seeder
    seeder(cfg["copies"], 0).close()  # (every copy placed: after the clock, as a job's next step would not wait)
print(json.dumps({"bytes": n, "s": s}))
"""
WRITERS = ("fabric", "fabric-copies", "local")


def make_files(root: str, files: int, mib: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    paths = []
    for i in range(files):
        path = os.path.join(root, f"shard-{i:03d}.bin")
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(rnd.randbytes(1 << 20))
        paths.append(path)
    return paths


def seed_copies(server: str, token: str, local: list[str], copies: str) -> None:
    """Leave plain copies of the files' versions in ``copies``, as a save through ``fabric://``
    with ``copies=`` on this machine does (written to another repository: the same bytes are
    the same versions)."""
    import fsspec

    from fabric.client.copies import seeder

    fs = fsspec.filesystem("fabric", server=server, token=token, copies=copies, skip_instance_cache=True)
    for path in local:
        with open(path, "rb") as src, fs.open(f"seeds@main/{os.path.basename(path)}", "wb") as dst:
            while piece := src.read(READ):
                dst.write(piece)
    seeder(copies, 0).close()  # (every copy placed)


def write_rounds(args: argparse.Namespace, work: str, spoke: str, token: str, hub) -> list[dict]:  # noqa: ANN001 - bench_checkpoint.Hub
    """``--writes``: each round, each writer saves fresh files; their MB/s."""
    hub.create_repo("saves")
    cfg = {"spoke": spoke, "token": token, "read": READ, "copies": os.path.join(work, "copies")}
    rounds = []
    for rnd in range(args.rounds):
        order = WRITERS[rnd % len(WRITERS):] + WRITERS[: rnd % len(WRITERS)]
        row = {}
        for kind in order:
            sources = make_files(os.path.join(work, "src"), args.files, args.mib, args.seed * 1000 + rnd * 10 + WRITERS.index(kind))
            names = [os.path.basename(p) for p in sources]
            if kind == "local":
                os.makedirs(os.path.join(work, "saved", str(rnd)), exist_ok=True)
                pairs = [(p, os.path.join(work, "saved", str(rnd), n)) for p, n in zip(sources, names, strict=True)]
            else:
                pairs = [(p, f"saves@main/{kind}/{rnd}/{n}") for p, n in zip(sources, names, strict=True)]
            out = subprocess.run([args.python, "-c", WRITER, kind, json.dumps(dict(cfg, pairs=pairs))],
                                 capture_output=True, text=True, env=fabric_env(), check=False)
            if out.returncode != 0:
                raise SystemExit(f"{kind} writer failed: {out.stderr[-2000:]}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            got["mbps"] = got["bytes"] / got["s"] / 1e6
            row[kind] = got
        rounds.append(row)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {row[k]['mbps']:.0f} MB/s" for k in WRITERS), flush=True)
    return rounds


def write_report(args: argparse.Namespace, rounds: list[dict]) -> str:
    lines = [f"{args.files} x {args.mib} MiB incompressible files saved to a spoke on loopback through `fabric://` "
             f"(close: the spoke holds it); {len(rounds)} rounds, writers' order rotating; medians.", "",
             "| writer | MB/s | x fabric, per round | x local, per round |", "|---|---:|---|---|"]
    for kind in WRITERS:
        def per_round(peer: str, kind: str = kind) -> str:
            return "-" if kind == peer else ", ".join(f"{r[kind]['mbps'] / r[peer]['mbps']:.2f}" for r in rounds)

        lines.append(f"| {kind} | {median([r[kind]['mbps'] for r in rounds]):,.0f} | {per_round('fabric')} | {per_round('local')} |")
    return "\n".join(lines) + "\n"


def sha256_of(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while piece := f.read(READ):
                digest.update(piece)
    return digest.hexdigest()


class Readers:
    """Runs one reader process per read; knows each reader's paths and settings."""

    def __init__(self, args: argparse.Namespace, local: list[str], spoke: str, s3: str, keys: tuple[str, str], token: str) -> None:
        names = [os.path.basename(p) for p in local]
        self.paths = {"local": local, "fabric": [f"data@main/{n}" for n in names], "s3fs": [f"data/main/{n}" for n in names]}
        self.paths["fabric-glibc"] = self.paths["fabric-copies"] = self.paths["fabric-beside"] = self.paths["fabric"]
        self.cfg = {"spoke": spoke, "s3": s3, "key": keys[0], "secret": keys[1], "token": token, "read": READ,
                    "copies": os.path.join(args.work_dir, "copies"), "spoke_cache": os.path.join(args.work_dir, "spoke")}
        self.python = {"s3fs": os.path.join(args.s3tools, "bin", "python")}
        self.default_python = args.python

    def run(self, kind: str, verify: bool = False) -> dict:
        env = fabric_env()
        if kind == "fabric-glibc":
            env["FABRIC_MALLOC"] = "glibc"
        if kind == "s3fs":
            env.pop("PYTHONPATH", None)
        cfg = dict(self.cfg, paths=self.paths[kind], verify=verify)
        before = os.times()
        out = subprocess.run([self.python.get(kind, self.default_python), "-c", READER, kind, json.dumps(cfg)],
                             capture_output=True, text=True, env=env, check=False)
        after = os.times()
        if out.returncode != 0:
            raise SystemExit(f"{kind} reader failed: {out.stderr[-2000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["cpu_s"] = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mib", type=int, default=64, help="MiB per file")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--readers", default=",".join(READERS), help=f"comma-separated, of {', '.join(READERS)} (default all)")
    ap.add_argument("--keep-page-cache", action="store_true", help="do not drop the page cache before each read")
    ap.add_argument("--rtt-ms", type=float, default=0.0, help="a WAN link of this RTT between the readers and the spoke (default none)")
    ap.add_argument("--rate-mbit", type=float, default=1000.0, help="the link's rate each way, with --rtt-ms")
    ap.add_argument("--writes", action="store_true", help="time saves through fabric:// with and without copies=DIR instead of reads")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--s3tools", default=os.path.join(REPO_ROOT, ".venv-s3tools"), help="a venv with s3fs (make test builds it)")
    ap.add_argument("--work", default=None, help="working directory (default: a new temporary one)")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    args = ap.parse_args()

    from bench_checkpoint import Hub
    from bench_remote import proc_cpu, wan
    from bench_s3 import start_hub, start_spoke

    asked = args.readers.split(",")
    if unknown := set(asked) - set(READERS):
        ap.error(f"unknown readers: {', '.join(sorted(unknown))}")
    readers = [r for r in READERS if r in asked and (r != "s3fs" or os.path.exists(os.path.join(args.s3tools, "bin", "python")))]
    if "s3fs" in asked and "s3fs" not in readers:
        print(f"bench_fsspec.py: no s3fs venv at {args.s3tools} (make test builds it): s3fs left out", file=sys.stderr)
    work = args.work or tempfile.mkdtemp(prefix="bench-fsspec-")
    with contextlib.ExitStack() as stack:
        if not args.work:
            stack.callback(remove, work)
        hub_proc, hub_url, _, token = start_hub(work, args.python)
        stack.callback(stop_process, hub_proc)
        hub = Hub(hub_url, token)
        if args.writes:
            spoke_proc, spoke_url, _ = start_spoke(work, args.python, hub_url, token)
            stack.callback(stop_process, spoke_proc)
            rounds = write_rounds(args, work, spoke_url, token, hub)
            text = write_report(args, rounds)
            print(text)
            save_report(text, {"machine": machine(), "args": vars(args), "rounds": rounds}, args.json_out, args.md_out)
            return
        local = make_files(os.path.join(work, "data"), args.files, args.mib, args.seed)
        expected = sha256_of(local)
        hub.create_repo("data")
        subprocess.run([*fabric_cmd(args.python), "--server", hub_url, "--token", token, "-q", "import", os.path.join(work, "data"),
                        "data@main", "-m", "bench fsspec"], check=True, env=fabric_env(), capture_output=True)
        spoke_proc, spoke_url, spoke_s3 = start_spoke(work, args.python, hub_url, token)
        stack.callback(stop_process, spoke_proc)
        if args.rtt_ms:  # (a link, in this process, in front of each of the spoke's ports)
            links = [stack.enter_context(wan(int(url.rsplit(":", 1)[1]), args.rtt_ms, args.rate_mbit)) for url in (spoke_url, spoke_s3)]
            spoke_url, spoke_s3 = (f"http://127.0.0.1:{link.port}" for link in links)
        args.work_dir = work
        run = Readers(args, local, spoke_url, spoke_s3, hub.s3_keys(), token)
        if "fabric-copies" in readers:
            hub.create_repo("seeds")
            seed_copies(hub_url, token, local, run.cfg["copies"])
        for kind in readers:  # warms the spoke (its first read) and checks every reader's bytes
            got = run.run(kind, verify=True)
            if got["sha256"] != expected:
                raise SystemExit(f"{kind}: DATA MISMATCH")
        rounds = []
        for rnd in range(args.rounds):
            order = readers[rnd % len(readers):] + readers[: rnd % len(readers)]
            row = {}
            for kind in order:
                dropped = not args.keep_page_cache and drop_page_cache()
                spoke_before = proc_cpu(spoke_proc.pid)
                got = run.run(kind)
                got["spoke_cpu_s"] = proc_cpu(spoke_proc.pid) - spoke_before if kind != "local" else 0.0
                got["mbps"] = got["bytes"] / got["s"] / 1e6
                got["dropped"] = dropped
                row[kind] = got
            rounds.append(row)
            print(f"round {rnd + 1}: " + ", ".join(f"{k} {row[k]['mbps']:.0f} MB/s" for k in readers), flush=True)
        text = report(args, readers, rounds)
        print(text)
        save_report(text, {"machine": machine(), "args": vars(args), "rounds": rounds}, args.json_out, args.md_out)


def report(args: argparse.Namespace, readers: list[str], rounds: list[dict]) -> str:
    gb = args.files * args.mib * (1 << 20) / 1e9
    where = f"through a {args.rtt_ms:g} ms, {args.rate_mbit:g} Mbit/s link" if args.rtt_ms else "on loopback"
    lines = [f"{args.files} x {args.mib} MiB incompressible files from a warm spoke {where}; {len(rounds)} rounds, medians;"
             f" page cache dropped before each read: {all(r[k]['dropped'] for r in rounds for k in readers)}.", "",
             "| reader | MB/s | reader CPU-s per GB | spoke CPU-s per GB | x local, per round | x s3fs, per round |",
             "|---|---:|---:|---:|---|---|"]
    def ratios(kind: str, peer: str) -> str:
        if peer not in readers or kind == peer:
            return "-"
        return ", ".join(f"{r[kind]['mbps'] / r[peer]['mbps']:.2f}" for r in rounds)

    for kind in readers:
        lines.append(f"| {kind} | {median([r[kind]['mbps'] for r in rounds]):,.0f} | {median([r[kind]['cpu_s'] for r in rounds]) / gb:.2f}"
                     f" | {median([r[kind]['spoke_cpu_s'] for r in rounds]) / gb:.2f} | {ratios(kind, 'local')} | {ratios(kind, 's3fs')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
