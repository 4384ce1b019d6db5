"""How a spoke could make a pinned batch of chunk files durable, and what each way costs.

A spoke pins a pack's chunks as one file each (``DiskCache.put_pinned``) and makes the
batch durable with one ``syncfs`` of the cache's file system
(:func:`fabric.cache.disk.sync_filesystem`). ``syncfs`` also waits for every other
process's unwritten pages on that file system. This compares it, batch by batch, with
making only the batch's own files durable:

- ``syncfs``: what the spoke does;
- ``fsync``: one ``fsync`` per file, then one per directory;
- ``fsync-threads``: the same from 16 threads (the file system may commit them together);
- ``range-fdatasync``: ``sync_file_range`` (start writeback) on every file, then ``fdatasync`` each;
- ``journal``: the batch's bytes written once more as one new file, ``fdatasync``ed with its
  directory (the chunk files stay unsynced; a restart would rebuild them from the journal);
- ``journal-reused``: the same written over a journal file of fixed size whose blocks already
  exist, so ``fdatasync`` flushes data and no file-system metadata.

Each round writes ``--files`` files of ``--kib`` KiB (one 16 MiB pack of 64 KiB chunks by
default) as the cache does (a temporary file renamed into one of 256 directories), then
times the sync alone. ``--dirty-mb N`` runs another writer beside it that keeps N MB of
unwritten pages on the same file system (what a training job's local checkpoint, or a
test suite, does to a shared disk).

    python bench/bench_cache_sync.py [--rounds 5] [--dirty-mb 1500] [--dir DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fabric.cache.disk import sync_filesystem

_LIBC = ctypes.CDLL(None, use_errno=True)
SYNC_FILE_RANGE_WRITE = 2


def write_batch(root: str, tag: str, files: int, data: bytes) -> list[str]:
    paths = []
    for i in range(files):
        parent = os.path.join(root, f"{i % 256:02x}")
        os.makedirs(parent, exist_ok=True)
        path = os.path.join(parent, f"{tag}-{i}")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


def _on_each(paths: list[str], call: Callable[[int], object]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            call(fd)
        finally:
            os.close(fd)


def _dirs(paths: list[str]) -> list[str]:
    return sorted({os.path.dirname(p) for p in paths})


def sync_each(paths: list[str]) -> None:
    _on_each(paths, os.fsync)
    _on_each(_dirs(paths), os.fsync)


def sync_threads(paths: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: _on_each([p], os.fsync), paths))
    _on_each(_dirs(paths), os.fsync)


def sync_ranges(paths: list[str]) -> None:
    _on_each(paths, lambda fd: _LIBC.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), SYNC_FILE_RANGE_WRITE))
    _on_each(paths, os.fdatasync)
    _on_each(_dirs(paths), os.fsync)


def journal_new(root: str, data: bytes, tag: str) -> None:
    path = os.path.join(root, f"journal-{tag}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    _on_each([root], os.fsync)
    os.unlink(path)


def journal_reused(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def dirty_writer(root: str, mb: int, stop: threading.Event) -> None:
    """Keep rewriting an ``mb`` MB file without syncing it: unwritten pages on the file system."""
    block = b"\0" * (1 << 20)
    path = os.path.join(root, "dirty.bin")
    while not stop.is_set():
        with open(path, "wb") as f:
            for _ in range(mb):
                if stop.is_set():
                    break
                f.write(block)
        time.sleep(0.5)
    os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=256)
    ap.add_argument("--kib", type=int, default=64)
    ap.add_argument("--dirty-mb", type=int, default=0, help="another writer keeps this many MB unwritten (0: none)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-cache-sync-", dir=args.dir)
    data = os.urandom(args.kib * 1024)
    batch = data * args.files
    reused = os.path.join(root, "reused-journal.bin")
    with open(reused, "wb") as f:
        f.write(os.urandom(len(batch)))
        os.fsync(f.fileno())
    modes: dict[str, Callable[[list[str]], None]] = {
        "syncfs": lambda paths: sync_filesystem(root),
        "fsync": sync_each,
        "fsync-threads": sync_threads,
        "range-fdatasync": sync_ranges,
        "journal": lambda paths: journal_new(root, batch, "j"),
        "journal-reused": lambda paths: journal_reused(reused, batch),
    }
    stop = threading.Event()
    writer = threading.Thread(target=dirty_writer, args=(root, args.dirty_mb, stop), daemon=True) if args.dirty_mb else None
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        if writer is not None:
            writer.start()
            time.sleep(2)  # let it build up unwritten pages
        for rnd in range(args.rounds):
            order = list(modes)[rnd % len(modes):] + list(modes)[: rnd % len(modes)]  # rotate
            for mode in order:
                paths = write_batch(os.path.join(root, mode), str(rnd), args.files, data)
                t0 = time.perf_counter()
                modes[mode](paths)
                times[mode].append(time.perf_counter() - t0)
                # Untimed: the journal ways leave the batch's own files unwritten; the next way
                # must not find them (syncfs would flush them and be charged for it).
                _on_each(paths, os.fdatasync)
    finally:
        stop.set()
        if writer is not None:
            writer.join()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.files} files of {args.kib} KiB per batch, {args.rounds} rounds, other writer: "
          f"{args.dirty_mb or 'none'}{' MB' if args.dirty_mb else ''}")
    print("| way | sync median ms | min..max ms | / syncfs |")
    print("|---|---:|---:|---:|")
    base = statistics.median(times["syncfs"])
    for mode, ts in times.items():
        med = statistics.median(ts)
        print(f"| {mode} | {med * 1000:.0f} | {min(ts) * 1000:.0f}..{max(ts) * 1000:.0f} | {med / base:.1f}x |")


if __name__ == "__main__":
    main()
