#!/usr/bin/env python3
"""Where a cold read of cached chunks spends its time at the disk: per file, or per I/O?

A spoke's cache keeps one file per chunk (64 KiB on average), as a mount's
``--cache-dir`` did before it kept packs, so a cold read of 1 GiB costs 16,000 small
reads. This probe reads the same bytes from the disk in the ways a cache could lay them
out, caches dropped before each read, and reports MB/s and CPU seconds per GiB of this
process (user + system):

- ``chunk files``: :class:`fabric.cache.disk.DiskCache` files (the spoke's layout), read
  whole with ``O_DIRECT``, with 1 and with ``--threads`` readers;
- ``packs``: the same chunks appended to files of ``--pack-mib`` MiB, read with
  ``O_DIRECT`` in pieces of 64 KiB (one read per chunk) and of 1 MiB (runs of
  neighbouring chunks in one read);
- ``pack cache``: the mount's ``--cache-dir`` (:class:`fabric.cache.packs.PackCache`),
  read as a mount reads it: 16 chunks (a 1 MiB kernel request) at a time with
  :meth:`~fabric.cache.packs.PackCache.read_into`, each chunk checked against its id;
- ``one file``: the bytes as one plain file read in 1 MiB pieces through the page cache,
  as bench_fuse.py reads the local directory.

No fabric server runs: this measures only the disk layer under the read path.

    python bench/probe_cache_io.py --mib 256 --rounds 3
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import drop_page_cache, median, remove, save_report  # noqa: E402
from fabric.cache.disk import DiskCache  # noqa: E402
from fabric.cache.packs import PackCache  # noqa: E402
from fabric.format.chunking import chunk_id  # noqa: E402
from fabric.util.direct_io import DirectReader  # noqa: E402

CHUNK = 64 * 1024
MIB = 1 << 20


class Layouts:
    """The same ``mib`` MiB of random chunks as cache files, as packs and as one file, under ``work``."""

    def __init__(self, work: str, mib: int, pack_mib: int) -> None:
        self.work = work
        remove(work)
        os.makedirs(work)
        self.cache = DiskCache(os.path.join(work, "chunks"), 4 * mib * MIB)
        self.pack_cache = PackCache(os.path.join(work, "pack-cache"), 4 * mib * MIB, lambda cid, data: chunk_id(data) == cid)
        self.ids: list[bytes] = []
        self.packs: list[str] = []
        per_pack = pack_mib * MIB // CHUNK
        pack = None
        with open(os.path.join(work, "one-file"), "wb") as whole:
            for i in range(mib * MIB // CHUNK):
                data = os.urandom(CHUNK)
                cid = chunk_id(data)
                self.ids.append(cid)
                if not (self.cache.put(cid, data) and self.pack_cache.put(cid, data)):
                    raise SystemExit(f"a cache did not keep chunk {i}")
                whole.write(data)
                if i % per_pack == 0:
                    if pack is not None:
                        pack.close()
                    self.packs.append(os.path.join(work, f"pack-{len(self.packs):04d}"))
                    pack = open(self.packs[-1], "wb")  # noqa: SIM115 - closed when the next one opens, or below
                pack.write(data)
        if pack is not None:
            pack.close()

    def read_chunk_files(self, threads: int) -> None:
        reader = DirectReader(CHUNK)

        def one(cid: bytes) -> None:
            if len(reader.read(self.cache.file(cid), 0, CHUNK)) != CHUNK:
                raise SystemExit(f"short read of chunk {cid.hex()}")

        if threads == 1:
            for cid in self.ids:
                one(cid)
            return
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, self.ids))

    def read_packs(self, piece: int) -> None:
        buf = memoryview(mmap.mmap(-1, piece))  # page-aligned, as O_DIRECT needs
        for path in self.packs:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            try:
                for offset in range(0, os.fstat(fd).st_size, piece):
                    os.preadv(fd, [buf], offset)
            finally:
                os.close(fd)

    def read_pack_cache(self) -> None:
        buf = memoryview(bytearray(MIB))
        per_request = MIB // CHUNK
        for at in range(0, len(self.ids), per_request):
            ids = self.ids[at : at + per_request]
            pairs = [(cid, buf[j * CHUNK : (j + 1) * CHUNK]) for j, cid in enumerate(ids)]
            if len(self.pack_cache.read_into(pairs)) != len(set(ids)):
                raise SystemExit(f"the pack cache did not serve chunks {at} to {at + len(ids)}")

    def read_one_file(self) -> None:
        with open(os.path.join(self.work, "one-file"), "rb", buffering=0) as f:
            while f.read(MIB):
                pass


def timed(read: Callable[[], None]) -> tuple[float, float]:
    """Seconds and CPU seconds (this process, user + system) of one read, caches dropped first."""
    if not drop_page_cache():
        raise SystemExit("dropping the page cache needs root")
    t0, c0 = time.perf_counter(), os.times()
    read()
    c1 = os.times()
    return time.perf_counter() - t0, (c1.user + c1.system) - (c0.user + c0.system)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="MiB of chunks (64 KiB each) to lay out and read")
    ap.add_argument("--pack-mib", type=int, default=4, help="size of one pack file, MiB")
    ap.add_argument("--threads", type=int, default=8, help="readers of chunk files at once, for the threaded row")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "work", "probe-cache-io"))
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    args = ap.parse_args()

    layouts = Layouts(args.work, args.mib, args.pack_mib)
    ways: dict[str, Callable[[], None]] = {
        "chunk files, 1 reader (the spoke's cache)": lambda: layouts.read_chunk_files(1),
        f"chunk files, {args.threads} readers": lambda: layouts.read_chunk_files(args.threads),
        f"packs of {args.pack_mib} MiB, 64 KiB reads": lambda: layouts.read_packs(CHUNK),
        f"packs of {args.pack_mib} MiB, 1 MiB reads": lambda: layouts.read_packs(MIB),
        "pack cache, 16 chunks a read (the mount's --cache-dir)": layouts.read_pack_cache,
        "one file, buffered 1 MiB reads (the local disk)": layouts.read_one_file,
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, read in ways.items():  # each round reads every layout once, in turn
            runs[name].append(timed(read))
    remove(args.work)

    gib = args.mib / 1024
    baseline = median([s for s, _ in runs[next(iter(ways))]])
    lines = [
        f"{args.mib} MiB in 64 KiB chunks, caches dropped before each read, {args.rounds} rounds, medians",
        "",
        "| layout and read | MB/s | CPU-s per GiB | time / chunk files' |",
        "|---|---:|---:|---:|",
    ]
    for name, got in runs.items():
        secs, cpu = median([s for s, _ in got]), median([c for _, c in got])
        lines.append(f"| {name} | {args.mib * MIB / secs / 1e6:,.0f} | {cpu / gib:.2f} | {secs / baseline:.2f} |")
    text = "\n".join(lines)
    print(text)
    save_report(text, {"args": vars(args), "runs": runs}, args.json_out, args.md_out)


if __name__ == "__main__":
    main()
