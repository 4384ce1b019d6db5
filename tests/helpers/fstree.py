"""Build directory trees for tests and compare them exactly.

A *snapshot* maps each relative path (str, as the file system spells it) to
what a round trip must preserve:

- regular file: ``("file", mode, mtime_ns, size, blake3 hex of the content)``
  (the content is hashed in a streaming fashion, so 2 GiB files are fine);
- symlink: ``("symlink", target)``;
- empty directory: ``("dir", mode, mtime_ns)``.

Non-empty directories are implied by their contents (fabric stores no entry
for them), so they are not part of a snapshot.
"""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Iterable

import blake3

from fabric.format.model import DEFAULT_DIR_MODE

BLOCK = 1 << 20


def file_digest(path: str) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb", buffering=0) as f:
        while True:
            block = f.read(8 * BLOCK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def snapshot(root: str, hash_content: bool = True) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    stack = [("", root)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        entries = list(os.scandir(abs_dir))
        st = os.lstat(abs_dir)
        if rel_dir and (not entries or stat.S_IMODE(st.st_mode) != DEFAULT_DIR_MODE):
            out[rel_dir] = ("dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        for de in entries:
            rel = f"{rel_dir}/{de.name}" if rel_dir else de.name
            st = de.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                stack.append((rel, de.path))
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(de.path))
            elif stat.S_ISREG(st.st_mode):
                digest = file_digest(de.path) if hash_content else None
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size, digest)
            else:
                out[rel] = ("other", st.st_mode)
    return out


def assert_same_tree(expected: dict[str, tuple], actual: dict[str, tuple]) -> None:
    """Fail with a readable summary of the first differences."""
    if expected == actual:
        return
    missing = sorted(expected.keys() - actual.keys())
    extra = sorted(actual.keys() - expected.keys())
    differ = sorted(p for p in expected.keys() & actual.keys() if expected[p] != actual[p])
    lines = [f"trees differ: {len(missing)} missing, {len(extra)} extra, {len(differ)} different"]
    lines += [f"  missing {p!r}: {expected[p]}" for p in missing[:10]]
    lines += [f"  extra   {p!r}: {actual[p]}" for p in extra[:10]]
    lines += [f"  differ  {p!r}: expected {expected[p]} got {actual[p]}" for p in differ[:10]]
    raise AssertionError("\n".join(lines))


def write_file(path: str, data: bytes, mode: int = 0o644, mtime_ns: int | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def random_files(
    root: str,
    count: int,
    seed: int,
    sizes: tuple[int, int] = (0, 2048),
    fanout: int = 100,
    compressible: float = 0.0,
) -> int:
    """``count`` files of random size in ``sizes`` under ``root/dNNN/``; returns total bytes.

    ``compressible``: the fraction of files filled with repetitive text instead
    of random bytes.
    """
    rng = random.Random(seed)
    total = 0
    made_dirs: set[str] = set()
    for i in range(count):
        d = os.path.join(root, f"d{i % fanout:03d}")
        if d not in made_dirs:
            os.makedirs(d, exist_ok=True)
            made_dirs.add(d)
        n = rng.randint(*sizes)
        if rng.random() < compressible:
            data = (f"line {i} of a compressible file {seed}\n" * (n // 30 + 1)).encode()[:n]
        else:
            data = rng.randbytes(n)
        with open(os.path.join(d, f"f{i:06d}.bin"), "wb") as f:
            f.write(data)
        total += n
    return total


def write_stream(path: str, size: int, block: int = 4 * BLOCK) -> str:
    """Write ``size`` bytes of os.urandom data without holding it in memory; return its digest."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "wb", buffering=0) as f:
        left = size
        while left:
            data = os.urandom(min(block, left))
            f.write(data)
            h.update(data)
            left -= len(data)
    return h.hexdigest()


def paths_of(snap: dict[str, tuple], kinds: Iterable[str] = ("file", "symlink", "dir")) -> set[str]:
    kinds = set(kinds)
    return {p for p, v in snap.items() if v[0] in kinds}
