"""kill -9 at any instant leaves the store consistent (objects before references).

The real ``fabric`` command runs in a subprocess and is killed with SIGKILL
after delays spread over its measured duration; then ``fabric fsck`` must be
clean and the branch must point at the old commit or at the new one.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from fabric.engine.engine import Engine
from tests.helpers.fstree import assert_same_tree, random_files, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, FABRIC_AUTHOR="tester")


def start(data: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fabric.cli.main", "--data", data, "-q", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )


def kill_after(proc: subprocess.Popen, delay: float) -> bool:
    """SIGKILL ``proc`` after ``delay`` seconds; True if it was still running."""
    try:
        proc.wait(timeout=delay)
        alive = False
    except subprocess.TimeoutExpired:
        alive = True
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    return alive


def kill_when(proc: subprocess.Popen, ready, timeout: float = 60.0) -> bool:
    """SIGKILL ``proc`` as soon as ``ready()`` is true; True if it was still running then."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
            return True
        time.sleep(0.0005)
    proc.communicate(timeout=60)
    return False


def timed(data: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "--data", data, "-q", *args], capture_output=True, env=_env(), timeout=600, check=False
    )
    return p, time.monotonic() - t


def branch_head(cli, repo: str, branch: str) -> str:
    return {b["name"]: b["commit_id"] for b in cli("--json", "branch", "list", repo).json()}[branch]


def assert_fsck_clean(cli) -> dict:
    r = cli("--json", "fsck", check=False)
    assert r.returncode == 0, f"fsck after a crash found problems:\n{r.stdout}\n{r.stderr}"
    report = r.json()
    assert report["ok"] and report["problems"] == []
    return report


def make_tree(root: str, seed: int, files: int = 3000) -> int:
    """~200 MiB in a few thousand files: mostly random, some compressible, a few large."""
    total = random_files(root, files, seed=seed, sizes=(1024, 130 * 1024), fanout=60, compressible=0.2)
    rng = random.Random(seed)
    for i in range(3):
        with open(os.path.join(root, f"large{i}.bin"), "wb") as f:
            f.write(rng.randbytes(4 * MiB))
            total += 4 * MiB
    return total


def startup_seconds(data: str) -> float:
    """How long the CLI takes to start and open the hub (kills before that test nothing)."""
    _, took = timed(data, "repo", "list")
    return took


def delays(start: float, duration: float, n: int, seed: int) -> list[float]:
    """Kill points spread over the run after start-up (chunking, pack writes, commit)."""
    rng = random.Random(seed)
    start = min(start, duration / 2)  # a slow start-up measurement (busy machine) must not push kills past the end
    return [start + (duration - start) * (i + rng.random()) / n for i in range(n)]


@pytest.mark.slow
def test_kill_during_import(cli, tmp_path) -> None:
    data = cli.data
    v0, big = tmp_path / "v0", tmp_path / "big"
    random_files(str(v0), 50, seed=100)
    size = make_tree(str(big), seed=200)
    big_snap = snapshot(str(big))
    # An uninterrupted import of the same tree tells how long one takes.
    cli("repo", "create", "ref")
    p, duration = timed(data, "import", str(big), "ref@main", "-m", "reference")
    assert p.returncode == 0, p.stderr
    cli("repo", "delete", "ref", "--yes")
    cli("gc", "--grace", "0")
    boot = startup_seconds(data)
    print(f"uninterrupted import: {size / MiB:.0f} MiB in {duration:.2f}s (start-up {boot:.2f}s)")

    outcomes = []
    # Kill points over the first 90% of a run (a loaded machine varies run times, and
    # the test needs kills that land before the commit as well as around it).
    for i, delay in enumerate(delays(boot, duration * 0.9, 5, seed=300)):
        repo = f"demo{i}"
        cli("repo", "create", repo)
        cli("import", str(v0), f"{repo}@main", "-m", "v0")
        old = branch_head(cli, repo, "main")
        killed = kill_after(start(data, "import", str(big), f"{repo}@main", "-m", "big"), delay)
        assert_fsck_clean(cli)
        after_kill = branch_head(cli, repo, "main")
        # Finish the job with an uninterrupted import (it reuses what the killed one stored).
        r = cli("--json", "import", str(big), f"{repo}@main", "-m", "big again")
        final = branch_head(cli, repo, "main")
        if after_kill == old:
            assert r.json()["commit_id"] == final != old
        else:
            assert after_kill == final and r.json()["commit_id"] is None, "the branch moved to a commit that is not the import's"
        outcomes.append(("killed" if killed else "finished", round(delay, 2), "old" if after_kill == old else "new"))
        # The branch now equals the tree, byte for byte.
        out = tmp_path / f"out{i}"
        cli("export", f"{repo}@main", str(out))
        assert_same_tree(big_snap, snapshot(str(out)))
        # Start the next round from an empty store, so its import writes every chunk again.
        cli("repo", "delete", repo, "--yes")
        cli("gc", "--grace", "0")
        assert cli("--json", "stats").json()["chunks"] == 0
    print("kill outcomes:", outcomes)
    assert sum(o[0] == "killed" and o[2] == "old" for o in outcomes) >= 2, outcomes
    assert_fsck_clean(cli)


@pytest.mark.slow
def test_kill_during_commit(cli, tmp_path) -> None:
    data = cli.data
    cli("repo", "create", "demo")
    src = tmp_path / "src"
    random_files(str(src), 20, seed=1, sizes=(70_000, 300_000), fanout=4)
    cli("import", str(src), "demo@main", "-m", "base")
    n = 20_000
    engine = Engine.open(data)
    try:
        base = engine.head("demo", "main")
        samples = [e for _, e in engine.walk("demo", "main")]
        staged = {f"staged/{i // 1000:02d}/{i:06d}": samples[i % len(samples)] for i in range(n)}
        staged["d000/f000000.bin"] = None  # and one deletion
        engine.create_branch("demo", "ref", "main")
        engine.stage("demo", "ref", staged)
    finally:
        engine.close()
    p, duration = timed(data, "commit", "demo@ref", "-m", "ref")
    assert p.returncode == 0, p.stderr
    boot = startup_seconds(data)
    engine = Engine.open(data)
    try:
        ref_tree_id = engine.get_commit("demo", engine.head("demo", "ref")).tree
    finally:
        engine.close()
    print(f"uninterrupted commit of {n} staged entries: {duration:.2f}s (start-up {boot:.2f}s)")

    outcomes = []
    for i, delay in enumerate(delays(boot, duration * 1.05, 5, seed=7)):
        branch = f"b{i}"
        engine = Engine.open(data)
        try:
            engine.create_branch("demo", branch, "main")
            engine.stage("demo", branch, staged)
        finally:
            engine.close()
        killed = kill_after(start(data, "commit", f"demo@{branch}", "-m", "staged"), delay)
        assert_fsck_clean(cli)
        engine = Engine.open(data)
        try:
            head = engine.head("demo", branch)
            pending = list(engine.uncommitted("demo", branch))
            if head == base:
                # The old commit, with every staged change still staged.
                assert len(pending) == n + 1
                c = engine.commit("demo", branch, "again")
                assert c.tree == ref_tree_id
            else:
                # The new commit, with exactly the staged changes folded in.
                assert engine.get_commit("demo", head).parents == (base,)
                assert engine.get_commit("demo", head).tree == ref_tree_id
                assert pending == []
            engine.delete_branch("demo", branch)
        finally:
            engine.close()
        outcomes.append(("killed" if killed else "finished", round(delay, 2), "old" if head == base else "new"))
    print("kill outcomes:", outcomes)
    assert sum(o[0] == "killed" and o[2] == "old" for o in outcomes) >= 2, outcomes
    cli("gc", "--grace", "0")
    assert_fsck_clean(cli)


@pytest.mark.slow
def test_kill_during_gc(cli, tmp_path) -> None:
    data = cli.data
    cli("repo", "create", "demo")
    keep = tmp_path / "keep"
    random_files(str(keep), 300, seed=11, sizes=(1000, 60_000), fanout=10)
    cli("import", str(keep), "demo@main", "-m", "keep")
    keep_snap = snapshot(str(keep))
    survivors: dict[str, bytes] = {}

    def make_garbage(i: int) -> None:
        rng = random.Random(i)
        e = Engine.open(data)
        try:
            e.create_branch("demo", "junk", "main")
            # Fully dead packs: each put is its own pack; the branch is then deleted.
            for k in range(120):
                e.put_object("demo", "junk", f"junk/{k}", io.BytesIO(rng.randbytes(rng.randint(1, 200_000))))
            # Partially dead packs: a prefix of a big file survives on main (its chunks are shared).
            for k in range(6):
                blob = rng.randbytes(2 * MiB)
                e.put_object("demo", "junk", f"big/{k}", io.BytesIO(blob))
                e.put_object("demo", "main", f"survivor{i}-{k}", io.BytesIO(blob[: 300_000]))
                survivors[f"survivor{i}-{k}"] = blob[:300_000]
            e.commit("demo", "junk", "junk")
            e.commit("demo", "main", f"survivors {i}")
            e.delete_branch("demo", "junk")
        finally:
            e.close()

    def check_readable() -> None:
        assert_fsck_clean(cli)
        e = Engine.open(data)
        try:
            for path, content in survivors.items():
                assert e.read("demo", "main", path) == content
        finally:
            e.close()

    make_garbage(99)
    p, duration = timed(data, "--json", "gc", "--grace", "0")
    assert p.returncode == 0, p.stderr
    boot = startup_seconds(data)
    print(f"uninterrupted gc: {duration:.2f}s (start-up {boot:.2f}s): {p.stdout.decode()}")
    check_readable()

    def pack_files() -> int:
        root = os.path.join(data, "store", "packs")
        n = 0
        for d in os.listdir(root):
            try:
                n += sum(not name.startswith(".") for name in os.listdir(os.path.join(root, d)))
            except FileNotFoundError:  # gc removed the emptied directory meanwhile
                pass
        return n

    # Kill before anything is deleted (walk, chunk index), then after the 1st, 30th
    # and 90th of its ~120 dead packs is gone (pack deletion and repacking).
    outcomes = []
    for i, after in enumerate([0, 1, 30, 90]):
        make_garbage(i)
        before = pack_files()
        proc = start(data, "gc", "--grace", "0")
        if after == 0:
            killed = kill_after(proc, boot + 0.05)
        else:
            killed = kill_when(proc, lambda n=before - after: pack_files() <= n)
        deleted_by_killed = before - pack_files()
        check_readable()
        # gc runs to completion after the crash and leaves no garbage behind.
        rest = cli("--json", "gc", "--grace", "0").json()
        check_readable()
        again = cli("--json", "gc", "--grace", "0").json()
        assert again["chunks_deleted"] == again["packs_deleted"] == again["objects_deleted"] == 0, again
        outcomes.append((after, "killed" if killed else "finished", deleted_by_killed, rest["packs_deleted"]))
    print("gc kill outcomes:", outcomes)
    # At least two kills landed in the middle of the work: some packs gone, some left.
    assert sum(o[1] == "killed" and o[2] > 0 and o[3] > 0 for o in outcomes) >= 2, outcomes
    out = tmp_path / "out"
    cli("export", "demo@main", str(out))
    got = snapshot(str(out))
    for path in survivors:
        got.pop(path)
    assert_same_tree(keep_snap, got)
    e = Engine.open(data)
    try:
        on_disk = {info.key.rsplit("/", 1)[-1] for info in e.store.list("packs/")}
        indexed = {row[0] for row in e.catalog.packs()}
        assert on_disk == indexed, "pack files and the pack index disagree after gc"
    finally:
        e.close()


def test_put_killed_leaves_nothing_visible(cli, tmp_path) -> None:
    """A `fabric put` of a stream killed mid-way stages nothing."""
    cli("repo", "create", "demo")
    data = cli.data
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric.cli.main", "--data", data, "-q", "put", "demo@main", "big", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdin is not None
    for _ in range(40):
        proc.stdin.write(os.urandom(MiB))
    proc.stdin.flush()
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert cli("--json", "status", "demo@main").json() == []
    assert_fsck_clean(cli)
    e = Engine.open(data)
    try:
        e.put_object("demo", "main", "after", io.BytesIO(b"still works"))
        e.commit("demo", "main", "after the crash")
        assert e.read("demo", "main", "after") == b"still works"
    finally:
        e.close()


def _temp_files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out.extend(os.path.join(d, n) for n in names if n.startswith(".tmp-"))
    return out


def test_gc_removes_temp_files_left_by_a_killed_writer(cli, tmp_path) -> None:
    data = cli.data
    cli("repo", "create", "demo")
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big.bin", "wb") as f:
        f.writelines(os.urandom(MiB) for _ in range(100))
    store = os.path.join(data, "store")
    proc = start(data, "import", str(src), "demo@main", "-m", "big")
    assert kill_when(proc, lambda: bool(_temp_files(os.path.join(store, "packs")))), "import finished before a pack was written"
    assert _temp_files(store), "the killed writer left no temporary file (nothing to test)"
    assert_fsck_clean(cli)
    cli("gc", "--grace", "0")
    assert _temp_files(store) == []
