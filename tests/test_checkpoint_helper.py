"""``fabric.checkpoint``: atomic checkpoints, retention and gc, against a real hub.

A step is complete only once tagged: staged files and untagged commits are never listed; a
writer killed at random points of its saves always leaves the last complete step loadable
and equal to what was saved; retention plus gc frees exactly the chunks no kept checkpoint
shares; torch DCP checkpoints go through ``fabric://`` and load back equal.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from fabric.checkpoint import Checkpoints, Retention, latest, list_checkpoints, load, save
from fabric.format.checkpoint_names import STEP_META
from tests.ci_requirements import missing
from tests.fuse_helpers import fabric, mounted, needs_fuse
from tests.hubserver import ROOT, Hub, metric_value, unique_name
from tests.test_fsspec import frames_requests

# Single-process DCP checkpoints (no_dist=True) are what these tests mean to make.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
KiB = 1 << 10
MiB = 1 << 20


def files_state(step: int, shared: bytes = b"") -> dict[str, bytes]:
    """What a files checkpoint of ``step`` holds: a few files of their own, optionally one shared by every step."""
    rng = random.Random(step)
    state = {"model/weights.bin": rng.randbytes(96 * KiB), "optim.bin": rng.randbytes(32 * KiB), "meta.json": b'{"step": %d}' % step}
    if shared:
        state["shared.bin"] = shared
    return state


def dcp_state(step: int) -> dict:
    """What a DCP checkpoint of ``step`` holds (tensors from a generator seeded by the step)."""
    torch = importlib.import_module("torch")
    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(192, 128, generator=g), "b": torch.randn(128, generator=g)}, "step": step}


def need_torch():
    try:
        return importlib.import_module("torch.distributed.checkpoint")
    except ImportError as exc:
        missing(f"torch (the torch extra): {exc}")


def assert_dcp_equal(a, b) -> None:
    torch = importlib.import_module("torch")
    assert a["step"] == b["step"]
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def blank_dcp_state() -> dict:
    torch = importlib.import_module("torch")
    return {"model": {"w": torch.zeros(192, 128), "b": torch.zeros(128)}, "step": -1}


def run_of(hub: Hub, stem: str, **options) -> Checkpoints:
    return Checkpoints(unique_name(stem), "train", server=hub.url, token=hub.token, **options)


def tree_paths(ck: Checkpoints, commit: str) -> list[str]:
    return sorted(p for p, _ in ck.plane.walk(ck.repo, commit, ""))


# -- save, list, latest, load ------------------------------------------------------------


def test_files_checkpoints_save_list_latest_load(hub: Hub):
    ck = run_of(hub, "ckfiles")
    assert ck.latest() is None and ck.list() == []  # no repository yet: the first save makes it
    saved = [ck.save(files_state(step), step) for step in (10, 20, 30)]
    assert [c.step for c in ck.list()] == [10, 20, 30]
    assert ck.latest() == saved[-1]
    assert ck.load() == files_state(30)
    assert ck.load(20) == files_state(20)
    root = ck.plane.log(ck.repo, "main")[-1].id
    for c in saved:
        # Each checkpoint is a commit of its own: only its step's files, its parent the empty first commit.
        assert tree_paths(ck, c.commit) == sorted(f"step-{c.step}/{n}" for n in files_state(c.step))
        commit = ck.plane.get_commit(ck.repo, c.commit)
        assert commit.parents == (root,) and commit.meta[STEP_META] == str(c.step)
        assert c.tag == f"ckpt.train.step-{c.step}"
        assert ck.fs.cat(f"{c.path}/optim.bin") == files_state(c.step)["optim.bin"]
    # The module-level helpers reach the same run.
    opts = {"server": hub.url, "token": hub.token}
    assert [c.step for c in list_checkpoints(repo=ck.repo, run="train", **opts)] == [10, 20, 30]
    assert latest(repo=ck.repo, run="train", **opts) == saved[-1]
    assert load(repo=ck.repo, run="train", step=10, **opts) == files_state(10)
    save(files_state(40), 40, repo=ck.repo, run="train", **opts)
    assert ck.latest().step == 40
    assert not list(ck.plane.uncommitted(ck.repo, ck.branch))


def _repo_exists(ck: Checkpoints) -> bool:
    return any(r["name"] == ck.repo for r in ck.plane.list_repos())


def test_unfinished_saves_are_never_listed_and_are_dropped_by_the_next(hub: Hub):
    ck = run_of(hub, "ckcrash")
    first = ck.save(files_state(1), 1)
    # A save that died after staging some files: nothing new is listed, the branch's files are staged only.
    ck.begin(2)
    ck.plane.put_object(ck.repo, ck.branch, "step-2/model/weights.bin", io.BytesIO(b"half"))
    assert ck.list() == [first] and ck.latest() == first
    # A save that died after its commit, before its tag: still not complete.
    base = ck.begin(2)
    ck.plane.put_object(ck.repo, ck.branch, "step-2/orphan.bin", io.BytesIO(b"orphan"))
    untagged = ck.plane.commit(ck.repo, ck.branch, "died before the tag", meta={STEP_META: "2"}, expected_head=base)
    assert ck.latest() == first
    # The next save starts from the empty base again: none of the leftovers is in it.
    second = ck.save(files_state(2), 2)
    assert second.commit != untagged.id
    assert tree_paths(ck, second.commit) == sorted(f"step-2/{n}" for n in files_state(2))
    assert ck.load() == files_state(2) and ck.load(1) == files_state(1)
    assert [c.step for c in ck.list()] == [1, 2]


def test_bad_input_is_refused_and_changes_nothing(hub: Hub):
    ck = run_of(hub, "ckbad")
    first = ck.save(files_state(5), 5)
    head = ck.plane.resolve_commit(ck.repo, ck.branch)
    tags = ck.plane.list_tags(ck.repo)
    for step in (-1, True, "7", 1.5, 10**18):
        with pytest.raises(ValueError, match="invalid step"):
            ck.save(files_state(7), step)
    for name in ("../escape", "", "a//b", "/abs"):
        with pytest.raises(ValueError, match="checkpoint file name"):
            ck.save({"ok.bin": b"x", name: b"y"}, 7)
    with pytest.raises(FileExistsError, match="step 5 .* saved already"):
        ck.save(files_state(6), 5)
    with pytest.raises(TypeError, match="DCP saves only"):
        ck.save(files_state(7), 7, thread_count=2)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint of step 6"):
        ck.load(6)
    with pytest.raises(ValueError, match="invalid run name"):
        Checkpoints(ck.repo, "bad.run", server=hub.url, token=hub.token)
    with pytest.raises(ValueError, match="may not contain"):
        Checkpoints(ck.repo, branch="x.step-1", server=hub.url, token=hub.token)
    with pytest.raises(ValueError, match="invalid repository name"):
        Checkpoints("Bad_Repo", server=hub.url, token=hub.token)
    with pytest.raises(ValueError, match="keep_last"):
        Retention(keep_last=0)
    with pytest.raises(ValueError, match="keep_every"):
        Retention(keep_every=0)
    with pytest.raises(ValueError, match="prune needs a retention policy"):
        ck.prune()
    assert ck.plane.resolve_commit(ck.repo, ck.branch) == head
    assert ck.plane.list_tags(ck.repo) == tags and ck.list() == [first]
    assert not list(ck.plane.uncommitted(ck.repo, ck.branch))
    # Without create_repo a missing repository is an error, and none is created.
    gone = Checkpoints(unique_name("ckmissing"), server=hub.url, token=hub.token, create_repo=False)
    with pytest.raises(FileNotFoundError):
        gone.save(files_state(1), 1)
    assert not _repo_exists(gone)


def test_overwrite_replaces_a_step(hub: Hub):
    ck = run_of(hub, "ckover")
    old = ck.save(files_state(3), 3)
    new = ck.save(files_state(4), 3, overwrite=True)
    assert new.commit != old.commit and ck.list() == [new]
    assert ck.load(3) == files_state(4)


# -- kill -9 of the writer ---------------------------------------------------------------

WRITER = """
import sys
from fabric.checkpoint import Checkpoints
from tests.test_checkpoint_helper import dcp_state, files_state
repo, fmt, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
ck = Checkpoints(repo, "train")
if fmt == "files":
    state_for = files_state
else:
    import tempfile
    import warnings
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")
    state_for = dcp_state
    # DCP's first save in a process takes seconds of warm-up: do it before the clock starts.
    dcp.save(dcp_state(0), checkpoint_id=tempfile.mkdtemp(), no_dist=True)
print("ready", flush=True)
while True:
    ck.save(state_for(step), step)
    print(step, flush=True)
    step += 1
"""


def settle(ck: Checkpoints, quiet: float = 0.3, timeout: float = 10.0) -> None:
    """Wait until the run's checkpoints stop changing: a request the killed writer had sent
    (the tag of the step it was finishing) may still be running at the hub."""
    listed = [c.step for c in ck.list()]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = [c.step for c in ck.list()]
        if now == listed:
            return
        listed = now
    raise AssertionError(f"checkpoints still changing {timeout} s after the writer was killed: {listed}")


def kill_rounds(hub: Hub, fmt: str, rounds: int, window: tuple[float, float]) -> list[tuple[int | None, int]]:
    """Run the writer ``rounds`` times, each SIGKILLed a random time after it is ready; after
    each kill, the latest complete checkpoint must load equal to what was saved for it."""
    repo = unique_name(f"ckkill{fmt}")
    ck = Checkpoints(repo, "train", server=hub.url, token=hub.token)
    env = dict(os.environ, PYTHONPATH=ROOT, FABRIC_SERVER=hub.url, FABRIC_TOKEN=hub.token or "")
    rng = random.Random(f"{fmt}-kill")
    seen: list[tuple[int | None, int]] = []
    before = None
    for _ in range(rounds):
        start = 0 if before is None else before.step + 1
        proc = subprocess.Popen([sys.executable, "-c", WRITER, repo, fmt, str(start)], stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(*window))
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            out, _ = proc.communicate(timeout=30)
        finished = [int(line) for line in out.split()]
        settle(ck)
        newest = ck.latest()
        # The step in flight may have been tagged just before the kill, never one beyond it.
        if finished:
            assert newest is not None and newest.step in (finished[-1], finished[-1] + 1), (finished, newest)
        elif before is not None:
            assert newest is not None and newest.step in (before.step, before.step + 1)
        if newest is not None:
            if fmt == "files":
                assert ck.load(newest.step) == files_state(newest.step)
            else:
                assert_dcp_equal(ck.load(newest.step, blank_dcp_state()), dcp_state(newest.step))
            assert [c.step for c in ck.list()] == list(range(newest.step + 1))
        seen.append((finished[-1] if finished else None, newest.step if newest else -1))
        before = newest
    # A clean save after the kills holds only its own files; nothing is left staged.
    step = before.step + 1 if before else 0
    state = files_state(step) if fmt == "files" else dcp_state(step)
    done = ck.save(state, step)
    assert {p.split("/")[0] for p in tree_paths(ck, done.commit)} == {f"step-{step}"}
    assert not list(ck.plane.uncommitted(ck.repo, ck.branch))
    return seen


def test_kill9_mid_save_keeps_the_latest_complete_checkpoint(hub: Hub):
    seen = kill_rounds(hub, "files", rounds=6, window=(0.05, 0.8))
    print("files: (last finished, latest) per round", seen)
    assert any(step >= 0 for _, step in seen)  # saves did complete between the kills


def test_kill9_mid_dcp_save_keeps_the_latest_complete_checkpoint(hub: Hub):
    need_torch()
    seen = kill_rounds(hub, "dcp", rounds=3, window=(0.05, 1.5))
    print("dcp: (last finished, latest) per round", seen)
    assert any(step >= 0 for _, step in seen)


# -- retention and gc ------------------------------------------------------------------


def chunk_ids(ck: Checkpoints, commit: str) -> set[bytes]:
    return {bytes(cid) for p in tree_paths(ck, commit) for cid, _ in ck.plane.stat_chunks(ck.repo, commit, p).chunks}


def test_retention_and_gc_free_exactly_the_dropped_chunks(fresh_hub: Hub):
    hub = fresh_hub
    shared = random.Random("shared").randbytes(MiB)
    ck = run_of(hub, "ckretain", retention=Retention(keep_last=2, keep_every=4, keep_tagged=True))
    ids: dict[int, set[bytes]] = {}
    commits: dict[int, str] = {}
    for step in range(1, 10):
        c = ck.save(files_state(step, shared), step)
        ids[step], commits[step] = chunk_ids(ck, c.commit), c.commit
        if step == 3:
            ck.plane.create_tag(ck.repo, "best", c.commit)  # tagged by hand: kept whatever its age
    kept = {3, 4, 8, 9}
    assert [c.step for c in ck.list()] == sorted(kept)
    dropped_only = set().union(*(ids[s] for s in ids if s not in kept)) - set().union(*(ids[s] for s in kept))
    shared_ids = set.intersection(*ids.values())
    assert dropped_only and shared_ids and not dropped_only & shared_ids
    stored = hub.plane().stats()["stored_bytes"]

    report = hub.plane().gc(grace=0)
    assert report["chunks_deleted"] == len(dropped_only)
    everything = set().union(*ids.values())
    assert set(hub.plane().missing_chunks(list(everything))) == dropped_only
    freed = stored - hub.plane().stats()["stored_bytes"]
    dropped_bytes = sum(len(v) for s in ids if s not in kept for n, v in files_state(s).items())
    print(f"gc freed {freed} stored bytes for {dropped_bytes} bytes of dropped-only files ({len(dropped_only)} chunks)")
    assert dropped_bytes <= freed < dropped_bytes + 64 * KiB, (freed, dropped_bytes)
    for step in kept:
        assert ck.load(step) == files_state(step, shared)
    for step in set(ids) - kept:
        with pytest.raises(FileNotFoundError):
            ck.load(step)
        with pytest.raises(FileNotFoundError):  # its own chunks are gone: even its commit id reads nothing
            ck.fs.cat(f"{ck.repo}@{commits[step]}/step-{step}/model/weights.bin")
    # The next save prunes again: 4 and 8 (every 4th) and 3 (tagged) stay, 9 goes.
    ck.save(files_state(10, shared), 10)
    ck.save(files_state(11, shared), 11)
    assert [c.step for c in ck.list()] == [3, 4, 8, 10, 11]
    assert hub.plane().fsck(deep=True)["ok"]


# -- torch DCP through fabric:// --------------------------------------------------------


def test_dcp_checkpoints_save_and_load_through_fabric(hub: Hub):
    dcp = need_torch()
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    ck = run_of(hub, "ckdcp", retention=Retention(keep_last=2))
    for step in (100, 200, 300):
        ck.save(dcp_state(step), step, thread_count=2)
    assert [c.step for c in ck.list()] == [200, 300]
    newest = ck.latest()
    assert tree_paths(ck, newest.commit) == ["step-300/.metadata", "step-300/__0_0.distcp", "step-300/__0_1.distcp"]
    assert_dcp_equal(ck.load(state_dict=blank_dcp_state()), dcp_state(300))
    assert_dcp_equal(ck.load(200, blank_dcp_state()), dcp_state(200))
    # Plain DCP reads the pinned URL too.
    state = blank_dcp_state()
    dcp.load(state, storage_reader=FsspecReader(newest.url, server=hub.url, token=hub.token), no_dist=True)
    assert_dcp_equal(state, dcp_state(300))
    with pytest.raises(ValueError, match="pass the state_dict"):
        ck.load(300)


def test_a_dcp_checkpoint_loads_from_the_copies_its_save_left_on_this_machine(hub: Hub, tmp_path):
    need_torch()
    torch = importlib.import_module("torch")
    copies = str(tmp_path / "copies")
    big = {"model": {"w": torch.randn(1024, 768), "b": torch.randn(768)}, "step": 7}  # 3 MiB: its shard is copied
    ck = run_of(hub, "ckcopies", copies=copies)
    ck.save(big, 7, thread_count=1)
    deadline = time.monotonic() + 20
    while not (placed := [p for p in (tmp_path / "copies" / "files").glob("??/*")]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(placed) == 1 and placed[0].stat().st_size > 3 * 1024 * 1024

    def load_counting_frames(**options) -> int:
        before = frames_requests(hub.metrics())
        blank = {"model": {"w": torch.zeros(1024, 768), "b": torch.zeros(768)}, "step": -1}
        state = Checkpoints(ck.repo, "train", server=hub.url, token=hub.token, **options).load(7, blank)
        assert_dcp_equal(state, big)
        return frames_requests(hub.metrics()) - before

    assert load_counting_frames(copies=copies) < load_counting_frames()  # the shard came from its copy


def test_a_files_checkpoint_loads_from_the_copies_its_save_left_on_this_machine(hub: Hub, tmp_path):
    copies = str(tmp_path / "copies")
    state = {"weights.bin": os.urandom(3 * 1024 * 1024 + 11), "meta.json": b'{"step": 5}'}
    ck = run_of(hub, "ckfilescopies", copies=copies)
    ck.save(state, 5)
    deadline = time.monotonic() + 20
    while not (placed := list((tmp_path / "copies" / "files").glob("??/*"))) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p.stat().st_size for p in placed] == [len(state["weights.bin"])]  # (the small file has none)

    def load_counting_bytes(**options) -> float:
        before = metric_value(hub.metrics(), "fabric_http_bytes_total", direction="out")
        assert Checkpoints(ck.repo, "train", server=hub.url, token=hub.token, **options).load(5) == state
        return metric_value(hub.metrics(), "fabric_http_bytes_total", direction="out") - before

    assert load_counting_bytes(copies=copies) < 1024 * 1024 < load_counting_bytes()  # the weights came from their copy


def test_importing_the_helper_does_not_import_torch():
    code = "import sys, fabric.checkpoint, fabric.checkpoint.files; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))


@needs_fuse
def test_dcp_checkpoint_loads_through_a_mount(hub: Hub, tmp_path):
    """A mount of the repository at the checkpoint's commit serves DCP's plain FileSystemReader."""
    dcp = need_torch()
    ck = run_of(hub, "ckmount")
    saved = ck.save(dcp_state(7), 7)
    with mounted(hub.url, hub.token, f"{ck.repo}@{saved.commit}", tmp_path / "mnt") as mp:
        state = blank_dcp_state()
        dcp.load(state, storage_reader=dcp.FileSystemReader(f"{mp}/step-7"), no_dist=True)
    assert_dcp_equal(state, dcp_state(7))


RANK = """
import os, sys, warnings
import torch.distributed as dist
from fabric.checkpoint import Checkpoints
from tests.test_checkpoint_helper import assert_dcp_equal, blank_dcp_state, dcp_state
warnings.simplefilter("ignore")
dist.init_process_group("gloo")
ck = Checkpoints(sys.argv[1], "train")
for step in (1, 2):
    got = ck.save(dcp_state(step), step)
    assert got is not None and got.step == step, got
state = ck.load(state_dict=blank_dcp_state())
assert_dcp_equal(state, dcp_state(2))
dist.barrier()
dist.destroy_process_group()
print("rank", os.environ["RANK"], "ok", got.commit, flush=True)
# What is tested ends here. torch's C++ teardown at interpreter exit now and then aborts
# ("terminate called without an active exception": a gloo or store thread still joinable),
# which is torch's, not the helper's: leave without it.
os._exit(0)
"""


def test_dcp_checkpoints_of_a_process_group(hub: Hub):
    """Two ranks (gloo) save through the helper: rank 0 begins and finishes, every rank gets the checkpoint and loads it."""
    need_torch()
    from fabric.util.net import free_port

    repo = unique_name("ckranks")
    env = dict(os.environ, PYTHONPATH=ROOT, FABRIC_SERVER=hub.url, FABRIC_TOKEN=hub.token or "")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK, repo], env=dict(env, RANK=str(r)), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and " ok " in out, (p.returncode, out[-1000:], err[-3000:])
    commits = {out.split()[-1] for out, _ in outs}
    ck = Checkpoints(repo, "train", server=hub.url, token=hub.token)
    assert [c.step for c in ck.list()] == [1, 2] and commits == {ck.latest().commit}


# -- the CLI view ---------------------------------------------------------------------------


def test_fabric_checkpoints_lists_complete_steps_per_run(hub: Hub):
    ck = run_of(hub, "ckcli")
    for step in (10, 20, 30):
        ck.save(files_state(step), step)
    other = Checkpoints(ck.repo, "other", server=hub.url, token=hub.token)
    other.save(files_state(5), 5)
    other.begin(6)  # a save in progress is not listed
    ck.plane.create_tag(ck.repo, "release.step-x", "main")  # nor a tag that only looks like one

    def listed(*args: str) -> list[dict]:
        return json.loads(fabric("--server", hub.url, "--json", "checkpoints", ck.repo, *args, token=hub.token).stdout)

    rows = listed()
    assert [(r["branch"], r["step"]) for r in rows] == [("ckpt.other", 5), ("ckpt.train", 10), ("ckpt.train", 20), ("ckpt.train", 30)]
    assert rows[-1]["commit"] == ck.latest().commit and rows[-1]["path"] == f"fabric://{ck.repo}@{ck.latest().commit}/step-30/"
    assert [(r["branch"], r["step"]) for r in listed("--latest")] == [("ckpt.other", 5), ("ckpt.train", 30)]
    assert [r["step"] for r in listed("--run", "train")] == [10, 20, 30]
    human = fabric("--server", hub.url, "checkpoints", ck.repo, "--run", "other", token=hub.token).stdout
    assert "ckpt.other" in human and " 5 " in human and ck.list()[0].commit[:12] not in human
    bad = fabric("--server", hub.url, "checkpoints", ck.repo, "--run", "no/slash", token=hub.token, check=False)
    assert bad.returncode != 0 and "invalid run name" in bad.stderr
    gone = fabric("--server", hub.url, "checkpoints", "no-such-repo-x", token=hub.token, check=False)
    assert gone.returncode != 0 and "no-such-repo-x" in gone.stderr
