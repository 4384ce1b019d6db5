#!/usr/bin/env python3
"""FUSE benchmark: a fabric mount of a pinned commit vs an rclone mount vs the local directory.

The same files several ways, side by side in one run:

- ``local``: the plain directory the data was generated in;
- ``rclone``: ``rclone mount DIR MNT --vfs-cache-mode full`` of that directory
  (a fresh, empty VFS cache per round);
- ``fabric``: ``fabric mount HUB repo@COMMIT MNT`` of the commit the directory
  was imported into, served by a ``fabric hub`` on loopback (a fresh mount
  process per round, so nothing of an earlier round is cached in it);
- ``fabric-cached``: the same mount with ``--cache-dir``, a directory filled by one
  read of every file before the rounds: a locally cached commit (a fresh mount process
  per round; the chunks come from the local disk, the hub serves only metadata);
- ``fabric-spoke``: ``fabric mount SPOKE repo@COMMIT MNT`` of a ``fabric spoke`` in front of
  that hub on loopback, whose cache holds every chunk (one read of every file through a mount
  before the rounds): warm reads at a spoke, to compare with ``fabric``'s reads at the hub
  (issue 18: at least as fast). Caches are dropped before first reads here too, so the spoke
  reads its cache files from the disk, as the hub reads its packs;
- ``fabric-spoke-beside``: ``fabric-spoke`` with ``--spoke-cache`` the spoke's cache directory
  (a mount on the spoke's machine, as the CSI driver makes one): the mount reads the chunks
  the spoke's files hold from them;
- ``fabric-passthrough``: ``fabric-cached`` with ``--passthrough`` (root only): the fill also
  leaves a plain copy of each large file in the cache directory (half its size bound), and
  the mount, served without libfuse, hands the kernel those copies at open;
- ``local-copies`` (with ``fabric-passthrough``): the copies that mount's kernel reads, read
  directly (large rows): the local read of the very files it reads;
- ``passthrough``: libfuse's own C example ``passthrough_ll`` over the local directory,
  built from the libfuse3-dev examples when they are installed: what a FUSE mount that
  serves reads in user space costs at best on this machine (one copy fewer than fabric: it
  splices file pages to the kernel);
- ``kernel-passthrough``: ``bench/kernel_passthrough.py`` over the local directory, a FUSE
  server in Python that speaks the kernel's protocol itself (no libfuse) and whose opens
  hand the kernel the source file (FUSE passthrough, Linux 6.9+), so no read reaches user
  space: what a mount could reach for files whose plain bytes are on the local disk. Left
  out where the kernel was not built with passthrough;
- ``kernel-reads``: the same server answering every READ itself with ``pread``
  (``--no-passthrough``; 4 threads): what a Python server without libfuse gets.

Both ``kernel-*`` systems mount with mount(2), so they run as root only.

With ``--baseline-src DIR`` each fabric mount runs a second time from the source tree DIR
(``NAME@base``, e.g. a ``git archive`` of the previous revision), in the same rounds:
before/after figures measured side by side.

Rows (medians over the counted rounds):

- ``large first`` / ``large second``: sequential reads of each large file (1 GiB unless
  ``--large-size``) with 1 MiB ``read`` calls, MB/s (10^6 bytes/s); the second read right after the first;
- ``large parallel``: 8 reader processes, each reading a different large file at once
  (with at least 8 large files), aggregate MB/s, on a fresh mount with caches dropped;
- ``small first`` / ``small second``: every 100 KiB file read whole by 8 reader
  processes (reader k takes every 8th file of the sorted list), files/s.

"first" starts cold: as root, ``echo 3 > /proc/sys/vm/drop_caches`` runs
before each first read (the local directory, rclone's source, and the hub's
packs all come from disk); without root the page cache is left as it is and
the report says so. Systems rotate their order round by round.

Goals (issue 5): fabric >= rclone on every row; fabric's second reads within
2x of the local directory's. Issue 21: cold large reads of a locally cached commit
>= 0.6x the local directory's and >= 2x rclone's, and >= 0.5x the local directory's
from the hub with nothing cached; the parallel row >= 0.8x the local directory's.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import time
from multiprocessing import Pool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import FABRIC_SRC, MB, drop_page_cache, fabric_env, machine, median, read_sequential, remove, save_json, unmount
from bench_remote import Spoke
from kernel_passthrough import P

GIB = 1024**3
MIB = 1024**2
SMALL = 100 * 1024
READERS = 8
PASSTHROUGH_SRC = "/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c"


# -- data ----------------------------------------------------------------------------
def generate(root: str, large: int, large_size: int, small: int, seed: int) -> dict:
    manifest = os.path.join(root, "manifest.json")
    params = {"large_files": large, "large_size": large_size, "small_files": small, "small_size": SMALL, "seed": seed}
    if os.path.exists(manifest):
        with open(manifest) as f:
            if json.load(f).get("params") == params:
                return params
        remove(root)
    tree = os.path.join(root, "tree")
    os.makedirs(os.path.join(tree, "large"))
    rnd = random.Random(seed)
    for i in range(large):
        with open(os.path.join(tree, "large", f"big{i}.bin"), "wb") as f:
            f.writelines(rnd.randbytes(8 << 20) for _ in range(large_size // (8 << 20)))
    for i in range(small):
        d = os.path.join(tree, "small", f"d{i // 1000:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}.bin"), "wb") as f:
            f.write(rnd.randbytes(SMALL))
    with open(manifest, "w") as f:
        json.dump({"params": params}, f)
    return params


# -- readers -------------------------------------------------------------------------
def _read_files(paths: list[str]) -> int:
    n = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while piece := f.read(1 << 20):
                n += len(piece)
    return n


def large_files(root: str) -> list[str]:
    return sorted(os.path.join(root, "large", n) for n in os.listdir(os.path.join(root, "large")))


def large_rate(root: str) -> float:
    t0 = time.perf_counter()
    total = sum(read_sequential(p) for p in large_files(root))
    return total / (time.perf_counter() - t0) / MB


def parallel_rate(root: str, pool: Pool) -> float:
    """READERS processes at once, each reading a different large file: aggregate MB/s."""
    files = large_files(root)[:READERS]
    t0 = time.perf_counter()
    total = sum(pool.map(read_sequential, files, chunksize=1))
    return total / (time.perf_counter() - t0) / MB


def small_rate(root: str, pool: Pool) -> float:
    files = sorted(
        os.path.join(d, n) for d, _, names in os.walk(os.path.join(root, "small")) for n in names
    )
    parts = [files[k::READERS] for k in range(READERS)]
    t0 = time.perf_counter()
    total = sum(pool.map(_read_files, parts))
    dt = time.perf_counter() - t0
    assert total == len(files) * SMALL, (total, len(files))
    return len(files) / dt


# -- systems -------------------------------------------------------------------------
def wait_mount(mp: str, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mp):
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"mount of {mp} exited: {proc.stdout.read() if proc.stdout else ''}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{mp} was not mounted within {timeout}s")
        time.sleep(0.1)


class Fabric:
    name = "fabric"

    def __init__(self, python: str, hub_url: str, token: str, target: str, mp: str, log: str, *options: str) -> None:
        self.server = hub_url
        self.cmd = [python, "-m", "fabric.cli.main", "mount", hub_url, target, mp, "--log-file", log, *options]
        self.env = dict(fabric_env(), FABRIC_TOKEN=token)
        self.mp = mp

    def mount(self) -> str:
        os.makedirs(self.mp, exist_ok=True)
        subprocess.run(self.cmd, env=self.env, check=True, capture_output=True, cwd=FABRIC_SRC)
        return self.mp

    def unmount(self) -> None:
        subprocess.run([*self.cmd[:3], "umount", self.mp], env=self.env, capture_output=True, cwd=FABRIC_SRC)
        unmount(self.mp)

    def fill(self) -> None:
        """Read every file once through a mount of its own (what a cache behind it keeps)."""
        root = self.mount()
        try:
            for d, _, names in os.walk(root):
                for n in names:
                    read_sequential(os.path.join(d, n))
        finally:
            self.unmount()

    def baseline(self, src: str) -> Fabric:
        """The same mount run from the source tree ``src`` (an earlier revision), as ``NAME@base``."""
        other = copy.copy(self)
        other.name = self.name + "@base"
        other.mp = self.mp + "-base"
        other.cmd = [*self.cmd[:6], other.mp, "--log-file", self.cmd[8] + ".base", *self.cmd[9:]]
        other.env = dict(self.env, PYTHONPATH=src)
        return other


class FabricCached(Fabric):
    """A fabric mount whose --cache-dir holds every chunk (filled once by :meth:`fill`)."""

    name = "fabric-cached"

    def __init__(self, python: str, hub_url: str, token: str, target: str, mp: str, log: str, cache: str, size: int) -> None:
        super().__init__(python, hub_url, token, target, mp, log, "--cache-dir", cache, "--cache-size", str(size))

    def baseline(self, src: str) -> Fabric:
        """As for :class:`Fabric`, with a cache directory of its own (the layouts of two
        revisions may differ), filled as this one is."""
        other = super().baseline(src)
        at = other.cmd.index("--cache-dir") + 1
        other.cmd = [*other.cmd[:at], other.cmd[at] + "-base", *other.cmd[at + 1 :]]
        return other


class FabricSpoke(Fabric):
    """A fabric mount of a spoke whose cache holds every chunk (warmed by :meth:`fill`)."""

    name = "fabric-spoke"


class FabricSpokeBeside(FabricSpoke):
    """:class:`FabricSpoke` with ``--spoke-cache``: a mount on the spoke's machine that reads the
    chunks the spoke's cache files hold from them (what the CSI driver mounts on a node with a spoke)."""

    name = "fabric-spoke-beside"


class FabricPassthrough(FabricCached):
    """:class:`FabricCached` with ``--passthrough``: the fill leaves a plain copy of each large
    file in the cache directory, which the kernel then reads itself (root only)."""

    name = "fabric-passthrough"

    def __init__(self, python: str, hub_url: str, token: str, target: str, mp: str, log: str, cache: str, size: int) -> None:
        super().__init__(python, hub_url, token, target, mp, log, cache, size)
        self.cmd.append("--passthrough")
        self.cache = cache

    def copies(self, out: str) -> str:
        """A directory whose ``large/`` holds hard links to the copies the fill left: the files
        this mount's kernel reads, to be read directly side by side (see :class:`LocalCopies`)."""
        large = os.path.join(out, "large")
        os.makedirs(large)
        files = os.path.join(self.cache, "files")
        for i, path in enumerate(sorted(os.path.join(d.path, f) for d in os.scandir(files) if d.name != "partial" for f in os.listdir(d.path))):
            os.link(path, os.path.join(large, f"copy{i}.bin"))
        return out


class Passthrough:
    """libfuse's example passthrough_ll (C, low-level API, splice) over the local directory."""

    name = "passthrough"

    def __init__(self, src: str, mp: str, binary: str) -> None:
        self.src, self.mp = src, mp
        self.cmd = [binary, "-o", f"source={src}", "-o", "cache=always", mp]

    @staticmethod
    def build(out: str) -> str | None:
        """Compile the example (the path of the binary), or None without its source or a compiler."""
        cc = shutil.which("cc") or shutil.which("gcc")
        if not (cc and os.path.exists(PASSTHROUGH_SRC) and shutil.which("pkg-config")):
            return None
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
        if flags.returncode != 0:
            return None
        done = subprocess.run([cc, "-O2", PASSTHROUGH_SRC, *flags.stdout.split(), "-o", out], capture_output=True)
        return out if done.returncode == 0 else None

    def mount(self) -> str:
        os.makedirs(self.mp, exist_ok=True)
        subprocess.run(self.cmd, check=True, capture_output=True)
        wait_mount(self.mp)
        # The kernel readahead fabric's mount sets for itself (32 MiB; FUSE starts at 128 KiB).
        dev = os.stat(self.mp).st_dev
        try:
            with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
                f.write("32768")
        except OSError:
            pass
        return self.mp

    def unmount(self) -> None:
        unmount(self.mp)


class KernelPassthrough:
    """``bench/kernel_passthrough.py`` over the local directory: with ``passthrough``, no read
    reaches user space; without, its threads answer each READ with ``pread``."""

    def __init__(self, python: str, src: str, mp: str, passthrough: bool = True) -> None:
        self.src, self.mp = src, mp
        self.name = "kernel-passthrough" if passthrough else "kernel-reads"
        self.cmd = [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_passthrough.py"), src, mp]
        if not passthrough:
            self.cmd.append("--no-passthrough")
        self.proc: subprocess.Popen | None = None

    def mount(self) -> str:
        os.makedirs(self.mp, exist_ok=True)
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL)
        wait_mount(self.mp, self.proc)
        return self.mp

    def unmount(self) -> None:
        unmount(self.mp)
        if self.proc is not None:
            self.proc.wait(30)
            self.proc = None


class Rclone:
    name = "rclone"

    def __init__(self, src: str, mp: str, cache: str) -> None:
        self.src, self.mp, self.cache = src, mp, cache
        self.cmd = ["rclone", "mount", src, mp, "--vfs-cache-mode", "full", "--cache-dir", cache, "--daemon"]

    def mount(self) -> str:
        remove(self.cache)
        os.makedirs(self.mp, exist_ok=True)
        subprocess.run(self.cmd, check=True, capture_output=True)
        wait_mount(self.mp)
        return self.mp

    def unmount(self) -> None:
        unmount(self.mp)
        remove(self.cache)


class Local:
    name = "local"
    small = True  # measured on the small files too

    def __init__(self, src: str) -> None:
        self.src = src
        self.cmd = ["(the directory itself)", src]

    def mount(self) -> str:
        return self.src

    def unmount(self) -> None:
        pass


class LocalCopies(Local):
    """The copies ``fabric-passthrough`` reads, read directly (large rows only). They are newer on
    the disk than the local directory, which every round reads twice (``local``,
    ``kernel-passthrough``): on a virtual disk whose host caches what is read often, this is the
    local read of the same bytes the mount reads."""

    name = "local-copies"
    small = False


# -- main ----------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "work"))
    ap.add_argument("--large-files", type=int, default=2, help="large files (default 2; 8 or more for the parallel row)")
    ap.add_argument("--large-size", type=int, default=1024, help="MiB per large file (default 1024)")
    ap.add_argument("--small-files", type=int, default=4000, help="100 KiB files (default 4000)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--only", choices=["fabric", "fabric-cached", "fabric-spoke", "fabric-spoke-beside", "fabric-passthrough", "rclone", "passthrough", "kernel-passthrough", "kernel-reads", "local"], action="append")
    ap.add_argument("--no-tmpfs-reference", dest="tmpfs_reference", action="store_false",
                    help="skip the tmpfs reference read of the large files")
    ap.add_argument("--baseline-src", metavar="DIR",
                    help="also run the fabric mounts from this source tree (e.g. `git archive` of an earlier revision), side by side")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    args = ap.parse_args()

    if not shutil.which("rclone"):
        raise SystemExit("bench_fuse.py: rclone is not on PATH (scripts/install-system-deps.sh installs it)")
    size_tag = "" if args.large_size == 1024 else f"-m{args.large_size}"
    data = os.path.join(args.work, "data", f"fuse-l{args.large_files}{size_tag}-s{args.small_files}-s{args.seed}")
    params = generate(data, args.large_files, args.large_size * MIB, args.small_files, args.seed)
    tree = os.path.join(data, "tree")
    stores = os.path.join(args.work, "stores", "fuse")
    remove(stores)
    os.makedirs(stores)

    # The hub: import the tree in-process (not what is measured), then serve it.
    sys.path.insert(0, FABRIC_SRC)
    from fabric.client.transfer import import_directory
    from fabric.engine.engine import Engine
    from fabric.util.net import free_port

    hub_dir = os.path.join(stores, "hub")
    engine = Engine.open(hub_dir)
    engine.create_repo("bench")
    commit = import_directory(engine, tree, "bench", "main", "bench data").commit.id
    engine.close()
    port = free_port()
    hub_log = open(os.path.join(stores, "hub.log"), "wb")
    hub_cmd = [args.python, "-m", "fabric.cli.main", "hub", "--data", hub_dir, "--listen", f"127.0.0.1:{port}", "--log-level", "warning"]
    hub = subprocess.Popen(hub_cmd, stdout=hub_log, stderr=subprocess.STDOUT, env=fabric_env(), cwd=FABRIC_SRC)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(600):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    token = open(os.path.join(hub_dir, "admin.token")).read().strip()

    data_bytes = params["large_files"] * params["large_size"] + params["small_files"] * SMALL
    target = f"bench@{commit}"
    systems = [
        Fabric(args.python, url, token, target, os.path.join(stores, "mnt-fabric"), os.path.join(stores, "mount.log")),
        FabricCached(args.python, url, token, target, os.path.join(stores, "mnt-fabric-cached"),
                     os.path.join(stores, "mount-cached.log"), os.path.join(stores, "chunk-cache"), 2 * data_bytes),
        Rclone(tree, os.path.join(stores, "mnt-rclone"), os.path.join(stores, "rclone-cache")),
        Local(tree),
    ]
    binary = Passthrough.build(os.path.join(stores, "passthrough_ll"))
    if binary:
        systems.insert(3, Passthrough(tree, os.path.join(stores, "mnt-passthrough"), binary))
    if os.geteuid() == 0:
        if P.kernel_has_passthrough():
            systems.insert(2, FabricPassthrough(args.python, url, token, target, os.path.join(stores, "mnt-fabric-passthrough"),
                                                os.path.join(stores, "mount-passthrough.log"), os.path.join(stores, "copy-cache"), 2 * data_bytes))
            systems.insert(-1, KernelPassthrough(args.python, tree, os.path.join(stores, "mnt-kernel-passthrough")))
        systems.insert(-1, KernelPassthrough(args.python, tree, os.path.join(stores, "mnt-kernel-reads"), passthrough=False))
    spoke = None
    if not args.only or {"fabric-spoke", "fabric-spoke-beside"} & set(args.only):
        spoke = Spoke(args.python, url, os.path.join(stores, "spoke-cache"), str(2 * data_bytes), token)
        systems.insert(2, FabricSpoke(args.python, spoke.url, token, target, os.path.join(stores, "mnt-fabric-spoke"),
                                      os.path.join(stores, "mount-spoke.log")))
        systems.insert(3, FabricSpokeBeside(args.python, spoke.url, token, target, os.path.join(stores, "mnt-fabric-spoke-beside"),
                                            os.path.join(stores, "mount-spoke-beside.log"), "--spoke-cache", os.path.join(stores, "spoke-cache")))
    if args.only:
        systems = [s for s in systems if s.name in args.only]
    if args.baseline_src:
        systems = [b for s in systems for b in ([s, s.baseline(args.baseline_src)] if isinstance(s, Fabric) else [s])]
    warmed: set[str] = set()  # spokes filled: one fill warms a spoke for every mount of it
    for s in systems:
        if isinstance(s, FabricSpoke) and s.server in warmed:
            continue
        if isinstance(s, (FabricCached, FabricSpoke)):
            s.fill()
            warmed.add(s.server)
    filled = [s for s in systems if isinstance(s, FabricPassthrough) and not s.name.endswith("@base")]
    systems += [LocalCopies(s.copies(os.path.join(stores, "copies-tree"))) for s in filled]
    parallel = params["large_files"] >= READERS
    rows = ("large_first", "large_second", "large_parallel", "small_first", "small_second")
    results: dict[str, dict[str, list[float]]] = {s.name: {r: [] for r in rows} for s in systems}
    references = ("rclone", "local", "local-copies") if any(isinstance(s, LocalCopies) for s in systems) else ("rclone", "local")
    dropped = True
    try:
        with Pool(READERS) as pool:
            for rnd in range(args.runs):
                order = systems[rnd % len(systems) :] + systems[: rnd % len(systems)]
                for s in order:
                    root = s.mount()
                    try:
                        dropped &= drop_page_cache()
                        results[s.name]["large_first"].append(large_rate(root))
                        results[s.name]["large_second"].append(large_rate(root))
                        if getattr(s, "small", True):
                            dropped &= drop_page_cache()
                            results[s.name]["small_first"].append(small_rate(root, pool))
                            results[s.name]["small_second"].append(small_rate(root, pool))
                    finally:
                        s.unmount()
                    if parallel:  # on a fresh mount: nothing of the rows above in its memory
                        root = s.mount()
                        try:
                            dropped &= drop_page_cache()
                            results[s.name]["large_parallel"].append(parallel_rate(root, pool))
                        finally:
                            s.unmount()
                    print(f"round {rnd + 1} {s.name}: " + ", ".join(f"{r} {v[-1]:.0f}" for r, v in results[s.name].items() if v), file=sys.stderr)
    finally:
        if spoke is not None:
            spoke.stop()
        hub.terminate()
        hub.wait(30)

    # Reference for the second reads of large files: the same files in tmpfs, whose page cache
    # uses small pages like a FUSE mount's (a local ext4/xfs directory may use large folios).
    tmpfs_rates: list[float] = []
    shm = "/dev/shm"
    if args.tmpfs_reference and os.path.isdir(shm):
        ref = os.path.join(shm, f"fabric-bench-{os.getpid()}")
        try:
            shutil.copytree(os.path.join(tree, "large"), os.path.join(ref, "large"))
            large_rate(ref)
            tmpfs_rates = [large_rate(ref) for _ in range(args.runs)]
        finally:
            remove(ref)
    med = {s: {r: median(v) for r, v in rs.items() if v} for s, rs in results.items()}
    report = {
        "machine": machine(),
        "params": params,
        "runs": args.runs,
        "caches_dropped_before_first_reads": dropped,
        "results": results,
        "medians": med,
        "commands": {
            **{s.name: " ".join(s.cmd) for s in systems if s.name != "local"},
            "hub": " ".join(hub_cmd),
            "benchmark": " ".join([sys.executable, *sys.argv]),
        },
    }
    names = [s.name for s in systems]
    fabrics = [n for n in names if n.startswith("fabric") and not n.endswith("@base")]
    md = [
        f"Data: {params['large_files']} x {params['large_size'] // MIB} MiB incompressible files; {params['small_files']} x 100 KiB files "
        f"(directories of 1,000). {args.runs} rounds, medians; caches dropped before first reads: {'yes' if dropped else 'NO'}.",
        "",
        "| row | unit | " + " | ".join(names) + " | " + " | ".join(f"{f} / {o}" for f in fabrics for o in references) + " |",
        "|---|---|" + "---:|" * (len(names) + len(references) * len(fabrics)),
    ]
    for r in rows:
        if not any(r in med.get(n, {}) for n in names):
            continue
        unit = "MB/s" if r.startswith("large") else "files/s"
        figures = [_figure(med[n].get(r)) for n in names]
        ratios = [_ratio(med[f].get(r), med.get(o, {}).get(r)) for f in fabrics for o in references]
        md.append(f"| {r.replace('_', ' ')} | {unit} | " + " | ".join(figures + ratios) + " |")
    for spoke_row in ("fabric-spoke", "fabric-spoke-beside"):
        if spoke_row in med and "fabric" in med:
            by_round = {r: [_ratio(a, b) for a, b in zip(results[spoke_row][r], results["fabric"][r])] for r in rows}
            md += ["", f"Warm spoke / hub (`{spoke_row}` / `fabric`), round by round: "
                   + "; ".join(f"{r.replace('_', ' ')} {', '.join(v)}" for r, v in by_round.items() if v) + "."]
    if tmpfs_rates:
        t = median(tmpfs_rates)
        md += [
            "",
            f"Reference: the large files read from tmpfs (page cache, small pages): {t:,.0f} MB/s; "
            f"fabric's second read / tmpfs = {med['fabric']['large_second'] / t:.2f}." if "fabric" in med else f"tmpfs: {t:,.0f} MB/s",
        ]
        report["tmpfs_large_second"] = tmpfs_rates
    text = "\n".join(md)
    print(text)
    if args.json_out:
        save_json(args.json_out, report)
    if args.md_out:
        with open(args.md_out, "w") as fh:
            fh.write(text + "\n")


def _figure(x: float | None) -> str:
    return f"{x:,.0f}" if x is not None else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


if __name__ == "__main__":
    main()
