"""``fabric mount --rw --commit-checkpoints`` (fuse/checkpoint_commits.py): a DCP save through
the mount becomes a commit and a ``BRANCH.step-N`` tag once its ``.metadata`` is renamed into
place, and ``fabric.checkpoint`` finds it; a save that never got there is never listed."""

from __future__ import annotations

import os
import signal
import time
import warnings

import pytest

from fabric.checkpoint import Checkpoints
from fabric.format import checkpoint_names as names
from fuse.checkpoint_commits import checkpoint_step, step_tag
from fuse.mount import read_stats
from testbed.wanproxy import WanProxy
from tests.fuse_helpers import fabric, mount_log, mount_to_kill, mounted, needs_fuse
from tests.hubserver import unique_name

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install -e '.[torch]'")
dcp = pytest.importorskip("torch.distributed.checkpoint")


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(512, 256, generator=g), "b": torch.randn(256, generator=g)}, "step": torch.tensor([seed])}


def blank() -> dict:
    return {"model": {"w": torch.zeros(512, 256), "b": torch.zeros(256)}, "step": torch.tensor([0])}


def assert_equal(a: dict, b: dict) -> None:
    assert torch.equal(a["model"]["w"], b["model"]["w"]) and torch.equal(a["model"]["b"], b["model"]["b"])
    assert torch.equal(a["step"], b["step"])


def save(directory: str, sd: dict, overwrite: bool = False) -> None:
    os.makedirs(directory, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(directory, thread_count=2, overwrite=overwrite))


def wait_for(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s")


def commits_made(mp) -> int | None:
    """The mount's checkpoint commits so far (its stats file, rewritten every second), or None before it is written."""
    try:
        return read_stats(str(mp))["checkpoint_commits"]["committed"]
    except FileNotFoundError:
        return None


def test_step_and_tag_names() -> None:
    assert [checkpoint_step(d) for d in ("step-900", "run/checkpoint-12", "global_step7", "iter_0000100", "final")] == [900, 12, 7, 100, None]
    assert step_tag("ckpt.run1", "step-900") == "ckpt.run1.step-900"
    # Only the helper's layout gets its tag: step-N at the branch's root.
    assert step_tag("ckpt.run1", "run/step-900") is None
    assert step_tag("ckpt.run1", "checkpoint-900") is None
    assert step_tag("ckpt.run1", "step-09") is None
    assert step_tag("bad.step-1", "step-900") is None  # a branch the helper refuses


@needs_fuse
@pytest.mark.parametrize("writeback", [False, True], ids=["staged-at-fsync", "writeback"])
def test_a_dcp_save_through_the_mount_becomes_a_tagged_checkpoint_only_when_complete(hub, tmp_path, writeback) -> None:
    repo = unique_name("ckmount")
    plane = hub.plane()
    plane.create_repo(repo)
    plane.create_branch(repo, "ckpt.run1", "main")
    runs = Checkpoints(repo, "run1", server=hub.url, token=hub.token, create_repo=False)
    options = ["--rw", "--commit-checkpoints"]
    if writeback:
        options += ["--writeback", "--write-dir", str(tmp_path / "writes")]
    mp = tmp_path / "mnt"
    with mounted(hub.url, hub.token, f"{repo}@ckpt.run1", mp, *options):
        save(str(mp / "step-5"), state(5))
        first = wait_for(runs.latest)
        assert first.step == 5
        meta = plane.get_commit(repo, first.commit).meta
        assert meta[names.STEP_META] == "5" and meta[names.FORMAT_META] == names.DCP and meta[names.DIR_META] == "step-5"
        in_commit = sorted(path for path, _ in plane.walk(repo, first.commit, "step-5/"))
        assert "step-5/.metadata" in in_commit and len([p for p in in_commit if p.endswith(".distcp")]) >= 2, in_commit
        assert_equal(runs.load(state_dict=blank()), state(5))
        listed = fabric("--server", hub.url, "checkpoints", repo, "--run", "run1", "--json", token=hub.token).stdout
        assert first.commit in listed and "ckpt.run1.step-5" in listed, listed

        # A save that dies before its final rename: shards, no .metadata. Never listed.
        os.makedirs(mp / "step-7")
        (mp / "step-7" / "__0_0.distcp").write_bytes(os.urandom(4096))
        save(str(mp / "step-9"), state(9))
        wait_for(lambda: [c.step for c in runs.list()] == [5, 9])
        # The same step saved again: its tag moves to the new commit.
        nine = runs.latest()
        save(str(mp / "step-9"), state(19), overwrite=True)
        moved = wait_for(lambda: (c := runs.latest()) is not None and c.commit != nine.commit and c)
        assert moved.step == 9
        assert_equal(runs.load(state_dict=blank()), state(19))
        # A checkpoint elsewhere gets a commit of its own, and no tag of the helper's.
        wait_for(lambda: commits_made(mp) == 3)  # (the stats are a second behind)
        save(str(mp / "experiments" / "step-3"), state(3))
        wait_for(lambda: commits_made(mp) == 4)
    assert [c.step for c in runs.list()] == [5, 9]
    head = plane.get_commit(repo, "ckpt.run1")
    assert head.meta[names.DIR_META] == "experiments/step-3" and head.meta[names.STEP_META] == "3"
    log = mount_log(str(mp))
    assert "ERROR" not in log, log[-3000:]


@needs_fuse
@pytest.mark.timeout(300)
def test_a_checkpoint_parked_by_a_killed_mount_is_committed_by_the_mount_that_takes_it_over(hub, tmp_path) -> None:
    """With --writeback the save returns once its files are on the mount's disk. kill -9 of the
    mount before they reach the hub (a slow link): no tag; the mount started on the same
    --write-dir stages them and commits the checkpoint."""
    repo = unique_name("ckkill")
    plane = hub.plane()
    plane.create_repo(repo)
    plane.create_branch(repo, "ckpt.run1", "main")
    runs = Checkpoints(repo, "run1", server=hub.url, token=hub.token, create_repo=False)
    mp = str(tmp_path / "mnt")
    opts = ("--rw", "--commit-checkpoints", "--writeback", "--write-dir", str(tmp_path / "writes"))
    port = int(hub.url.rsplit(":", 1)[1])
    with WanProxy("127.0.0.1", port, rate_mbit=1) as link, mount_to_kill(link.url_for(), hub.token, f"{repo}@ckpt.run1", mp, opts) as pid:
        save(os.path.join(mp, "step-4"), state(4))  # about 600 KB: seconds over 1 Mbit/s
        os.kill(pid, signal.SIGKILL)
    assert runs.list() == []
    with mounted(hub.url, hub.token, f"{repo}@ckpt.run1", mp, *opts) as again:
        assert ".metadata" in os.listdir(os.path.join(again, "step-4"))
        ckpt = wait_for(runs.latest)
        assert ckpt.step == 4
        assert_equal(runs.load(state_dict=blank()), state(4))
    assert "took over" in mount_log(mp)


@needs_fuse
def test_a_checkpoint_staged_and_never_committed_is_committed_by_the_next_mount(hub, tmp_path) -> None:
    """A mount killed after it staged a save's ``.metadata`` but before its commit leaves the
    save among the branch's uncommitted changes; the next mount with --commit-checkpoints
    commits and tags it. A directory without ``.metadata`` is left alone."""
    repo = unique_name("ckstaged")
    plane = hub.plane()
    plane.create_repo(repo)
    plane.create_branch(repo, "ckpt.run1", "main")
    runs = Checkpoints(repo, "run1", server=hub.url, token=hub.token, create_repo=False)
    mp = tmp_path / "mnt"
    with mounted(hub.url, hub.token, f"{repo}@ckpt.run1", mp, "--rw"):  # (no --commit-checkpoints: staged only)
        save(str(mp / "step-6"), state(6))
        os.makedirs(mp / "step-8")
        (mp / "step-8" / "__0_0.distcp").write_bytes(b"half a save")
    assert runs.list() == []
    with mounted(hub.url, hub.token, f"{repo}@ckpt.run1", mp, "--rw", "--commit-checkpoints"):
        ckpt = wait_for(runs.latest)
        assert ckpt.step == 6
        assert_equal(runs.load(state_dict=blank()), state(6))
    assert [c.step for c in runs.list()] == [6]


@needs_fuse
def test_commit_checkpoints_needs_a_writable_mount(hub, tmp_path) -> None:
    repo = unique_name("ckro")
    hub.plane().create_repo(repo)
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = fabric("mount", hub.url, f"{repo}@main", str(mp), "--commit-checkpoints", token=hub.token, check=False)
    assert proc.returncode != 0
    assert "--commit-checkpoints need --rw" in proc.stderr
    assert not os.path.ismount(mp)
