"""export(import(tree)) is byte-identical: content, modes, mtimes, symlinks, empty dirs.

Everything runs against the real engine (and, for the 2 GiB file, the real
``fabric`` command in a subprocess whose peak RSS is measured by the kernel).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import unicodedata

import pytest

from fabric.client.transfer import export_tree, import_directory
from fabric.engine.engine import Engine
from fabric.errors import BadRequest
from tests.helpers.fstree import (
    assert_same_tree,
    file_digest,
    random_files,
    snapshot,
    write_file,
    write_stream,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
GiB = 1 << 30
T0 = 1_600_000_000_123_456_789  # an mtime with full nanosecond precision


def _mt(i: int) -> int:
    return T0 + i * 1_000_000_007


def edge_case_tree(root: str) -> None:
    """Names and shapes that tend to break import/export."""
    rng = random.Random(7)
    os.makedirs(root)
    write_file(f"{root}/empty.txt", b"", 0o644, _mt(1))
    write_file(f"{root}/exec.sh", b"#!/bin/sh\necho hi\n", 0o755, _mt(2))
    write_file(f"{root}/private", b"secret\n", 0o600, _mt(3))
    write_file(f"{root}/readonly", b"ro\n", 0o444, _mt(4))
    write_file(f"{root}/old-mtime", b"1970\n", 0o644, 1_000_000_001)
    # Several chunks, random (stored raw) and compressible (stored zstd).
    write_file(f"{root}/multi/random.bin", rng.randbytes(3 * MiB + 12345), 0o644, _mt(5))
    write_file(f"{root}/multi/text.txt", b"".join(b"row %d of a csv file,1,2,3\n" % i for i in range(200_000)), 0o644, _mt(6))
    # 50 levels deep, with a file and an empty directory at the bottom.
    deep = "/".join(f"level{i:02d}" for i in range(50))
    write_file(f"{root}/{deep}/bottom.txt", b"deep\n", 0o644, _mt(7))
    os.makedirs(f"{root}/{deep}/empty-at-bottom")
    # Unicode: the same visible name in NFC and NFD are two different files.
    nfc = unicodedata.normalize("NFC", "caf\u00e9")
    nfd = unicodedata.normalize("NFD", "caf\u00e9")
    assert nfc != nfd
    write_file(f"{root}/unicode/{nfc}", b"nfc\n", 0o644, _mt(8))
    write_file(f"{root}/unicode/{nfd}", b"nfd\n", 0o644, _mt(9))
    write_file(f"{root}/unicode/\U0001f600 emoji \U0001f680.txt", b"emoji\n", 0o644, _mt(10))
    write_file(f"{root}/unicode/\u4e2d\u6587\u6587\u4ef6\u540d/\u30c7\u30fc\u30bf.csv", b"cjk\n", 0o644, _mt(11))
    write_file(f"{root}/unicode/with space and 'quotes' & $dollar", b"shell\n", 0o644, _mt(12))
    # Names of exactly 255 bytes (the usual file-system limit).
    write_file(f"{root}/long/{'a' * 255}", b"ascii 255\n", 0o644, _mt(13))
    cjk255 = "\u4e2d" * 85
    assert len(cjk255.encode()) == 255
    write_file(f"{root}/long/{cjk255}", b"cjk 255\n", 0o644, _mt(14))
    os.makedirs(f"{root}/long/{'d' * 255}")
    # Symlinks: relative, absolute, dangling, to a directory.
    os.symlink("exec.sh", f"{root}/link-rel")
    os.symlink("/etc/hostname", f"{root}/link-abs")
    os.symlink("does/not/exist", f"{root}/link-dangling")
    os.symlink("multi", f"{root}/link-dir")
    # Empty directories, one with an unusual mode and mtime.
    os.makedirs(f"{root}/empty-dir")
    os.makedirs(f"{root}/empty-700")
    os.chmod(f"{root}/empty-700", 0o700)
    os.utime(f"{root}/empty-700", ns=(_mt(15), _mt(15)))
    os.utime(f"{root}/empty-dir", ns=(_mt(16), _mt(16)))
    # Directories with files and a mode of their own: recorded, mode and mtime restored.
    os.chmod(f"{root}/multi", 0o750)
    os.utime(f"{root}/multi", ns=(_mt(17), _mt(17)))
    os.chmod(f"{root}/long", 0o555)


def test_edge_cases_round_trip(engine: Engine, tmp_path) -> None:
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    edge_case_tree(src)
    before = snapshot(src)
    engine.create_repo("demo")
    result = import_directory(engine, src, "demo", "main", "edge cases")
    assert result.commit is not None
    assert result.files == len(before)
    export_tree(engine, "demo", "main", out)
    assert_same_tree(before, snapshot(out))
    # The import did not touch its source.
    assert_same_tree(before, snapshot(src))
    # Exporting a commit id (not the branch) and over an existing export gives the same.
    export_tree(engine, "demo", result.commit.id, out)
    assert_same_tree(before, snapshot(out))


def test_reimport_unchanged_makes_no_commit(engine: Engine, tmp_path) -> None:
    src = str(tmp_path / "src")
    random_files(src, 300, seed=1, sizes=(0, 4096))
    os.symlink("d000", f"{src}/link")
    os.makedirs(f"{src}/empty")
    engine.create_repo("demo")
    first = import_directory(engine, src, "demo", "main", "v1")
    head = engine.head("demo", "main")
    assert first.commit is not None and head == first.commit.id
    again = import_directory(engine, src, "demo", "main", "v1 again")
    assert again.commit is None
    assert again.added == again.changed == again.removed == 0
    assert again.bytes_hashed == 0  # unchanged files are not even read
    assert engine.head("demo", "main") == head
    assert len(engine.log("demo", "main")) == 2  # "Repository created" + v1
    # --rehash reads everything but still finds nothing to commit.
    rehashed = import_directory(engine, src, "demo", "main", "rehash", rehash=True)
    assert rehashed.commit is None
    assert engine.head("demo", "main") == head


def test_rehash_finds_same_size_same_mtime_edit(sqlite_engine: Engine, tmp_path) -> None:
    src = str(tmp_path / "src")
    write_file(f"{src}/f", b"A" * 1000, 0o644, _mt(1))
    sqlite_engine.create_repo("demo")
    import_directory(sqlite_engine, src, "demo", "main", "v1")
    write_file(f"{src}/f", b"B" * 1000, 0o644, _mt(1))
    # Size and mtime equal: the fast path trusts them (documented), --rehash does not.
    assert import_directory(sqlite_engine, src, "demo", "main", "fast").commit is None
    assert import_directory(sqlite_engine, src, "demo", "main", "rehash", rehash=True).commit is not None
    assert sqlite_engine.read("demo", "main", "f") == b"B" * 1000


def test_no_delete_keeps_files(engine: Engine, tmp_path) -> None:
    src = str(tmp_path / "src")
    write_file(f"{src}/keep", b"keep", 0o644, _mt(1))
    write_file(f"{src}/gone", b"gone", 0o644, _mt(2))
    write_file(f"{src}/sub/also-gone", b"also", 0o644, _mt(3))
    engine.create_repo("demo")
    import_directory(engine, src, "demo", "main", "v1")
    os.unlink(f"{src}/gone")
    shutil.rmtree(f"{src}/sub")
    write_file(f"{src}/new", b"new", 0o644, _mt(4))
    write_file(f"{src}/keep", b"keep v2", 0o644, _mt(5))
    r = import_directory(engine, src, "demo", "main", "add only", delete=False)
    assert (r.added, r.changed, r.removed) == (1, 1, 0)
    paths = {p for p, _ in engine.walk("demo", "main")}
    assert paths == {"keep", "gone", "sub/also-gone", "new"}
    assert engine.read("demo", "main", "gone") == b"gone"
    assert engine.read("demo", "main", "keep") == b"keep v2"
    # Without --no-delete the same import removes what SRC lacks.
    r = import_directory(engine, src, "demo", "main", "mirror")
    assert (r.added, r.changed, r.removed) == (0, 0, 2)
    assert {p for p, _ in engine.walk("demo", "main")} == {"keep", "new"}


def test_import_with_prefix(engine: Engine, tmp_path) -> None:
    a, b, out = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out")
    random_files(a, 40, seed=2, fanout=8)
    os.makedirs(f"{a}/empty")
    random_files(b, 30, seed=3, fanout=5)
    snap_a, snap_b = snapshot(a), snapshot(b)
    engine.create_repo("demo")
    import_directory(engine, a, "demo", "main", "train", prefix="data/train")
    import_directory(engine, b, "demo", "main", "val", prefix="/data/val/")
    paths = {p for p, _ in engine.walk("demo", "main")}
    assert paths == {f"data/train/{p}" for p in snap_a} | {f"data/val/{p}" for p in snap_b}
    export_tree(engine, "demo", "main", out + "-train", prefix="data/train")
    assert_same_tree(snap_a, snapshot(out + "-train"))
    export_tree(engine, "demo", "main", out + "-all")
    assert_same_tree(
        {**{f"data/train/{p}": v for p, v in snap_a.items()}, **{f"data/val/{p}": v for p, v in snap_b.items()}},
        snapshot(out + "-all"),
    )
    # Re-importing the prefix with a file removed deletes only under that prefix.
    victim = min(p for p, v in snap_b.items() if v[0] == "file")
    os.unlink(f"{b}/{victim}")
    r = import_directory(engine, b, "demo", "main", "val v2", prefix="data/val")
    assert (r.added, r.changed, r.removed) == (0, 0, 1)
    changes = [(c.path, c.kind) for c in engine.diff("demo", "main~1", "main")]
    assert changes == [(f"data/val/{victim}", "removed")]
    with pytest.raises(BadRequest):
        import_directory(engine, b, "demo", "main", "bad prefix", prefix="../escape")


def test_v2_diff_lists_exactly_the_changed_paths(engine: Engine, tmp_path) -> None:
    src, out1, out2 = str(tmp_path / "src"), str(tmp_path / "out1"), str(tmp_path / "out2")
    random_files(src, 200, seed=4, sizes=(0, 3000), fanout=10)
    write_file(f"{src}/big.bin", random.Random(5).randbytes(2 * MiB), 0o644, _mt(1))
    os.symlink("d000", f"{src}/link")
    os.makedirs(f"{src}/empty-a")
    engine.create_repo("demo")
    v1_snap = snapshot(src)
    v1 = import_directory(engine, src, "demo", "main", "v1").commit
    assert v1 is not None

    files = sorted(p for p, v in v1_snap.items() if v[0] == "file" and p != "big.bin")
    rng = random.Random(6)
    picked = rng.sample(files, 40)
    edited, renamed, deleted, chmodded, touched = picked[:10], picked[10:20], picked[20:30], picked[30:35], picked[35:40]
    expected: dict[str, str] = {}
    for p in edited:
        write_file(f"{src}/{p}", rng.randbytes(rng.randint(1, 3000)), 0o644, _mt(100))
        expected[p] = "changed"
    for p in renamed:
        os.rename(f"{src}/{p}", f"{src}/{p}.renamed")
        expected[p] = "removed"
        expected[p + ".renamed"] = "added"
    for p in deleted:
        os.unlink(f"{src}/{p}")
        expected[p] = "removed"
    for p in chmodded:
        os.chmod(f"{src}/{p}", 0o600)
        expected[p] = "changed"
    for p in touched:
        os.utime(f"{src}/{p}", ns=(_mt(200), _mt(200)))
        expected[p] = "changed"
    # One changed chunk in the middle of a big file.
    with open(f"{src}/big.bin", "r+b") as f:
        f.seek(MiB)
        f.write(b"patched!")
    expected["big.bin"] = "changed"
    write_file(f"{src}/brand/new/file.txt", b"new\n", 0o644, _mt(300))
    expected["brand/new/file.txt"] = "added"
    os.unlink(f"{src}/link")
    os.symlink("d001", f"{src}/link")
    expected["link"] = "changed"
    os.rmdir(f"{src}/empty-a")
    expected["empty-a"] = "removed"
    os.makedirs(f"{src}/empty-b")
    expected["empty-b"] = "added"

    v2_snap = snapshot(src)
    r = import_directory(engine, src, "demo", "main", "v2")
    assert r.commit is not None
    assert (r.added, r.changed, r.removed) == (
        sum(k == "added" for k in expected.values()),
        sum(k == "changed" for k in expected.values()),
        sum(k == "removed" for k in expected.values()),
    )
    got = {c.path: c.kind for c in engine.diff("demo", v1.id, "main")}
    assert got == expected
    # The reverse diff is the mirror image.
    mirror = {"added": "removed", "removed": "added", "changed": "changed"}
    assert {c.path: c.kind for c in engine.diff("demo", "main", v1.id)} == {p: mirror[k] for p, k in expected.items()}
    # Both versions still export exactly.
    export_tree(engine, "demo", v1.id, out1)
    assert_same_tree(v1_snap, snapshot(out1))
    export_tree(engine, "demo", "main", out2)
    assert_same_tree(v2_snap, snapshot(out2))
    # Only the patched chunk of big.bin was new.
    assert r.new_bytes < 600 * 1024 + 3000 * 10 + 100


# -- large inputs -------------------------------------------------------------


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, FABRIC_AUTHOR="tester")


def run_measured(args: list[str], tmp: str) -> tuple[int, str, str, int, float]:
    """Run the fabric CLI; return (exit code, stdout, stderr, peak RSS in bytes, seconds).

    The peak RSS is the CLI process's own high-water mark (``VmHWM``, see
    tests/helpers/peak_rss.py), which excludes the memory of this pytest process.
    """
    out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    rss_path = os.path.join(tmp, "rss.json")
    start = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        rc = subprocess.run(
            [sys.executable, "-m", "tests.helpers.peak_rss", rss_path, *args],
            stdout=out, stderr=err, env=_env(), cwd=ROOT, timeout=1800, check=False,
        ).returncode
    took = time.monotonic() - start
    with open(out_path, errors="replace") as f:
        stdout = f.read()
    with open(err_path, errors="replace") as f:
        stderr = f.read()
    with open(rss_path) as f:
        measured = json.load(f)
    assert measured["exit_code"] == rc
    return rc, stdout, stderr, measured["vm_hwm_bytes"], took


@pytest.fixture
def big_space(tmp_path):
    """tmp_path, emptied afterwards even on failure (pytest keeps old temp dirs; these hold GiBs)."""
    yield tmp_path
    for name in ("src", "out", "hub"):
        shutil.rmtree(tmp_path / name, ignore_errors=True)


@pytest.mark.slow
def test_file_over_2gib_round_trip_with_bounded_memory(big_space, record_property) -> None:
    tmp_path = big_space
    data = str(tmp_path / "hub")
    src, out, tiny = tmp_path / "src", tmp_path / "out", tmp_path / "tiny"
    src.mkdir()
    tiny.mkdir()
    (tiny / "x").write_bytes(b"x")
    size = 2 * GiB + MiB
    t = time.monotonic()
    digest = write_stream(str(src / "huge.bin"), size)
    write_seconds = time.monotonic() - t
    os.utime(src / "huge.bin", ns=(_mt(1), _mt(1)))
    write_file(str(src / "small.txt"), b"beside the big one\n", 0o640, _mt(2))
    expected = snapshot(str(src), hash_content=False)

    rc, _, err, _, _ = run_measured(["--data", data, "repo", "create", "big"], str(tmp_path))
    assert rc == 0, err
    # Baseline: the same command on a one-byte tree (interpreter, modules, engine).
    rc, _, err, base_rss, _ = run_measured(["--data", data, "-q", "import", str(tiny), "big@main", "-m", "tiny"], str(tmp_path))
    assert rc == 0, err
    rc, stdout, err, peak_rss, import_s = run_measured(
        ["--data", data, "-q", "--json", "import", str(src), "big@main", "-m", "2 GiB"], str(tmp_path)
    )
    assert rc == 0, err
    result = json.loads(stdout)
    assert result["added"] == 2 and result["removed"] == 1
    assert result["bytes_hashed"] == size + len(b"beside the big one\n")
    growth = peak_rss - base_rss

    rc, _, err, export_rss, export_s = run_measured(["--data", data, "-q", "export", "big@main", str(out)], str(tmp_path))
    assert rc == 0, err
    t = time.monotonic()
    got = snapshot(str(out), hash_content=False)
    assert_same_tree(expected, got)
    assert file_digest(str(out / "huge.bin")) == digest
    hash_s = time.monotonic() - t

    # Ranged reads across the 2 GiB boundary come back exact.
    e = Engine.open(data)
    try:
        with open(src / "huge.bin", "rb") as f:
            for off in (0, 2 * GiB - 7, size - 5):
                f.seek(off)
                assert e.read("big", "main", "huge.bin", off, 13) == f.read(13)
        stats = e.stats()
    finally:
        e.close()

    def mib_s(secs: float) -> float:
        return size / MiB / secs

    figures = {
        "write_s": round(write_seconds, 1),
        "import_s": round(import_s, 1),
        "import_MiB_s": round(mib_s(import_s)),
        "export_s": round(export_s, 1),
        "export_MiB_s": round(mib_s(export_s)),
        "hash_s": round(hash_s, 1),
        "import_peak_rss_MiB": round(peak_rss / MiB),
        "baseline_rss_MiB": round(base_rss / MiB),
        "import_rss_growth_MiB": round(growth / MiB),
        "export_peak_rss_MiB": round(export_rss / MiB),
        "stored_bytes": stats["stored_bytes"],
    }
    print("2GiB figures:", figures)
    for k, v in figures.items():
        record_property(k, v)
    assert growth < 400 * MiB, f"import of a 2 GiB file grew RSS by {growth / MiB:.0f} MiB"
    assert export_rss - base_rss < 400 * MiB, f"export of a 2 GiB file peaked at {export_rss / MiB:.0f} MiB"
    # Random data is stored raw: stored size is close to the logical size, not above it by much.
    assert size <= stats["stored_bytes"] < size * 1.01


@pytest.mark.slow
def test_100k_small_files_round_trip(sqlite_engine: Engine, tmp_path, record_property) -> None:
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    t = time.monotonic()
    total = random_files(src, 100_000, seed=8, sizes=(0, 2048), fanout=100)
    make_s = time.monotonic() - t
    t = time.monotonic()
    expected = snapshot(src)
    snap_s = time.monotonic() - t
    sqlite_engine.create_repo("many")
    t = time.monotonic()
    r = import_directory(sqlite_engine, src, "many", "main", "100k files")
    import_s = time.monotonic() - t
    assert r.commit is not None and r.added == 100_000 and r.files == 100_000
    t = time.monotonic()
    res = export_tree(sqlite_engine, "many", "main", out)
    export_s = time.monotonic() - t
    assert res.files == 100_000 and res.bytes == total
    assert_same_tree(expected, snapshot(out))
    # Changing one file of 100k commits a small change, and re-import reads only it.
    victim = f"{src}/d042/f000042.bin"
    write_file(victim, b"changed", 0o644, _mt(9))
    t = time.monotonic()
    r2 = import_directory(sqlite_engine, src, "many", "main", "one change")
    reimport_s = time.monotonic() - t
    assert (r2.added, r2.changed, r2.removed, r2.bytes_hashed) == (0, 1, 0, 7)
    assert [(c.path, c.kind) for c in sqlite_engine.diff("many", "main~1", "main")] == [("d042/f000042.bin", "changed")]
    figures = {
        "files": 100_000,
        "bytes": total,
        "make_s": round(make_s, 1),
        "snapshot_s": round(snap_s, 1),
        "import_s": round(import_s, 1),
        "import_files_s": round(100_000 / import_s),
        "export_s": round(export_s, 1),
        "export_files_s": round(100_000 / export_s),
        "reimport_one_change_s": round(reimport_s, 1),
    }
    print("100k figures:", figures)
    for k, v in figures.items():
        record_property(k, v)
