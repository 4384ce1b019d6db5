#!/usr/bin/env python3
"""Deterministic benchmark data sets (stdlib only; same seed -> same bytes and mtimes).

Two generators:

``versions``  v1 and v2 of a mixed data set, in two sibling directories::

    OUT/v1/bin/NN/fNNNN.bin   incompressible files (--bin-files x --file-size)
    OUT/v1/text/NN/logNNNN.txt compressible log lines (--text-files x --file-size)
    OUT/v2                    a copy of v1 (shutil.copy2: mtimes kept) where
                              --edits files get --edit-size bytes overwritten in
                              the middle (same size, new mtime), --new new
                              incompressible files are added, --renames files
                              are renamed and --dups files are copied under a
                              new name (mtime kept).

    The edited, renamed and duplicated files are disjoint random picks (by seed)
    among all of v1's files. Every v1 file has a fixed mtime (BASE_MTIME + i).

``tree``      OUT: --files small files of --min-size..--max-size bytes of text,
              in directories of --per-dir files (the commit benchmark's tree).

A ``manifest.json`` next to the data records the parameters and totals; when it
matches the requested parameters the data is not generated again (``--force``
regenerates).

    python bench/gen_dataset.py versions --out bench/work/data/versions --seed 1
    python bench/gen_dataset.py versions --out bench/work/data/quick --quick
    python bench/gen_dataset.py tree --out bench/work/data/tree --files 100000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time

MiB = 1024 * 1024
BASE_MTIME = 1_700_000_000  # 2023-11-14, fixed so runs are reproducible
EDIT_MTIME = BASE_MTIME + 10_000_000
MANIFEST = "manifest.json"

LEVELS = ["INFO"] * 12 + ["DEBUG"] * 6 + ["WARN"] * 2 + ["ERROR"]
SERVICES = ["api", "worker", "loader", "scheduler", "auth", "storage", "gateway", "trainer"]


def _vocab(seed: int, n: int = 2000) -> list[str]:
    r = random.Random(f"{seed}:vocab")
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(r.choice(letters) for _ in range(r.randint(2, 10))) for _ in range(n)]


def random_bytes(seed: int, name: str, size: int) -> bytes:
    """Incompressible bytes, a pure function of (seed, name, size)."""
    return random.Random(f"{seed}:{name}").randbytes(size)


def log_text(seed: int, name: str, size: int, vocab: list[str]) -> bytes:
    """Plausible log lines (compress ~3-5x with zstd), exactly ``size`` bytes."""
    r = random.Random(f"{seed}:{name}")
    t = BASE_MTIME * 1000 + r.randrange(10**9)
    parts: list[str] = []
    total = 0
    choices, randrange = r.choices, r.randrange
    while total < size:
        t += randrange(1, 2000)
        words = " ".join(choices(vocab, k=randrange(3, 12)))
        line = (
            f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t // 1000))}.{t % 1000:03d}Z "
            f"{choices(LEVELS)[0]} {choices(SERVICES)[0]}-{randrange(32)} req={randrange(1 << 32):08x} "
            f"{words} latency_ms={randrange(2000)}\n"
        )
        parts.append(line)
        total += len(line)
    return "".join(parts).encode()[:size]


def _write(path: str, data: bytes, mtime: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, (mtime, mtime))


def _tree_totals(root: str) -> dict:
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, n)).st_size
    return {"files": files, "bytes": size}


def _load_manifest(out: str) -> dict | None:
    try:
        with open(os.path.join(out, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _save_manifest(out: str, manifest: dict) -> None:
    tmp = os.path.join(out, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(out, MANIFEST))


def gen_versions(a: argparse.Namespace) -> dict:
    params = {
        "kind": "versions", "seed": a.seed, "bin_files": a.bin_files, "text_files": a.text_files,
        "file_size": a.file_size, "edits": a.edits, "edit_size": a.edit_size, "new": a.new,
        "renames": a.renames, "dups": a.dups, "format": 1,
    }
    old = _load_manifest(a.out)
    if old and old.get("params") == params and not a.force:
        return old
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    v1, v2 = os.path.join(a.out, "v1"), os.path.join(a.out, "v2")
    t0 = time.perf_counter()
    vocab = _vocab(a.seed)
    rels: list[str] = []
    for i in range(a.bin_files):
        rel = f"bin/{i // 100:02d}/f{i:04d}.bin"
        _write(os.path.join(v1, rel), random_bytes(a.seed, rel, a.file_size), BASE_MTIME + len(rels))
        rels.append(rel)
    for i in range(a.text_files):
        rel = f"text/{i // 100:02d}/log{i:04d}.txt"
        _write(os.path.join(v1, rel), log_text(a.seed, rel, a.file_size, vocab), BASE_MTIME + len(rels))
        rels.append(rel)

    # v2: copy with mtimes kept (as an rsync -a or cp -a of an unchanged file would).
    shutil.copytree(v1, v2, copy_function=shutil.copy2)
    r = random.Random(f"{a.seed}:v2")
    picks = r.sample(rels, a.edits + a.renames + a.dups)
    edited = sorted(picks[: a.edits])
    renamed = sorted(picks[a.edits : a.edits + a.renames])
    duplicated = sorted(picks[a.edits + a.renames :])
    for n, rel in enumerate(edited):
        path = os.path.join(v2, rel)
        size = os.path.getsize(path)
        if rel.endswith(".txt"):
            patch = log_text(a.seed, f"edit:{rel}", a.edit_size, vocab)
        else:
            patch = random_bytes(a.seed, f"edit:{rel}", a.edit_size)
        with open(path, "r+b") as f:
            f.seek(max(0, size // 2 - a.edit_size // 2))
            f.write(patch)
        os.utime(path, (EDIT_MTIME + n, EDIT_MTIME + n))
    for rel in renamed:
        head, tail = os.path.split(rel)
        os.rename(os.path.join(v2, rel), os.path.join(v2, head, "renamed-" + tail))
    for rel in duplicated:
        head, tail = os.path.split(rel)
        shutil.copy2(os.path.join(v2, rel), os.path.join(v2, head, "copy-" + tail))
    for i in range(a.new):
        rel = f"new/f{i:04d}.bin"
        _write(os.path.join(v2, rel), random_bytes(a.seed, rel, a.file_size), EDIT_MTIME + 100_000 + i)

    manifest = {
        "params": params,
        "v1": _tree_totals(v1),
        "v2": _tree_totals(v2),
        "edited": edited,
        "renamed": renamed,
        "duplicated": duplicated,
        "generated_in_s": round(time.perf_counter() - t0, 1),
    }
    _save_manifest(a.out, manifest)
    return manifest


def gen_tree(a: argparse.Namespace) -> dict:
    params = {
        "kind": "tree", "seed": a.seed, "files": a.files, "min_size": a.min_size,
        "max_size": a.max_size, "per_dir": a.per_dir, "format": 1,
    }
    old = _load_manifest(a.out)
    if old and old.get("params") == params and not a.force:
        return old
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    t0 = time.perf_counter()
    root = os.path.join(a.out, "tree")
    vocab = _vocab(a.seed)
    r = random.Random(f"{a.seed}:tree")
    # One long text stream sliced into files: fast, and files differ from each other.
    blob = log_text(a.seed, "tree-blob", 8 * MiB, vocab)
    for i in range(a.files):
        size = r.randint(a.min_size, a.max_size)
        start = r.randrange(len(blob) - size)
        rel = f"d{i // a.per_dir:04d}/s{i:06d}.txt"
        _write(os.path.join(root, rel), b"%06d " % i + blob[start : start + size - 7], BASE_MTIME + i)
    manifest = {"params": params, "tree": _tree_totals(root), "generated_in_s": round(time.perf_counter() - t0, 1)}
    _save_manifest(a.out, manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("versions", help="v1 and v2 of the mixed data set")
    v.add_argument("--out", required=True)
    v.add_argument("--seed", type=int, default=1)
    v.add_argument("--bin-files", type=int, default=1000)
    v.add_argument("--text-files", type=int, default=256)
    v.add_argument("--file-size", type=int, default=MiB)
    v.add_argument("--edits", type=int, default=100)
    v.add_argument("--edit-size", type=int, default=4096)
    v.add_argument("--new", type=int, default=50)
    v.add_argument("--renames", type=int, default=20)
    v.add_argument("--dups", type=int, default=20)
    v.add_argument("--quick", action="store_true", help="1/10 scale: 100+26 files, 10 edits, 5 new, 2+2 renames/dups")
    v.add_argument("--force", action="store_true")
    t = sub.add_parser("tree", help="many small files (commit benchmark)")
    t.add_argument("--out", required=True)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--files", type=int, default=100_000)
    t.add_argument("--min-size", type=int, default=100)
    t.add_argument("--max-size", type=int, default=2048)
    t.add_argument("--per-dir", type=int, default=1000)
    t.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "versions":
        if a.quick:
            a.bin_files, a.text_files, a.edits, a.new, a.renames, a.dups = 100, 26, 10, 5, 2, 2
        m = gen_versions(a)
        print(f"v1: {m['v1']['files']} files, {m['v1']['bytes']} bytes; "
              f"v2: {m['v2']['files']} files, {m['v2']['bytes']} bytes  ({a.out})", file=sys.stderr)
    else:
        m = gen_tree(a)
        print(f"tree: {m['tree']['files']} files, {m['tree']['bytes']} bytes  ({a.out}/tree)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
