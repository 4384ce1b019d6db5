"""PyTorch distributed checkpoints written into and read from a ``--rw`` mount (torch extra).

``FileSystemWriter`` writes shards from threads, fsyncs them, writes
``.metadata.tmp`` and renames it over ``.metadata``; ``FileSystemReader``
must load the state dict back equal, in the same mount and after a remount.
"""

from __future__ import annotations

import os
import warnings

import pytest

from tests.fuse_helpers import fabric, mount_log, mounted, needs_fuse
from tests.hubserver import unique_name

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install -e '.[torch]'")
dcp = pytest.importorskip("torch.distributed.checkpoint")

pytestmark = needs_fuse


def _state_dict(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "embed.weight": torch.randn(4096, 256, generator=g),
            "layer.0.weight": torch.randn(1024, 1024, generator=g),
            "layer.0.bias": torch.randn(1024, generator=g),
            "head.weight": torch.randn(1000, 512, generator=g).to(torch.bfloat16),
            "steps": torch.tensor([12345], dtype=torch.int64),
        },
        "optim": {"lr": torch.tensor(3e-4), "momentum": torch.randn(1024, 1024, generator=g)},
    }


def _empty_like(sd: dict) -> dict:
    return {k: _empty_like(v) if isinstance(v, dict) else torch.zeros_like(v) for k, v in sd.items()}


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _assert_equal(a[k], b[k])
        else:
            assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("writeback", [False, True], ids=["staged-at-fsync", "writeback"])
def test_distributed_checkpoint_roundtrip(hub, tmp_path, writeback):
    """With ``--writeback`` the shards are staged after their close, and the final rename of
    ``.metadata.tmp`` (a file only the mount has) is made on the mount alone."""
    repo = unique_name("ckpt")
    hub.plane().create_repo(repo)
    sd = _state_dict(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = ("--rw", "--writeback", "--write-dir", str(tmp_path / "writes")) if writeback else ("--rw",)
        with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "mnt", *options) as mnt:
            ckpt = os.path.join(mnt, "run1", "step-100")
            os.makedirs(ckpt)
            writer = dcp.FileSystemWriter(ckpt, thread_count=4, sync_files=True, single_file_per_rank=False)
            dcp.save(sd, storage_writer=writer)
            names = os.listdir(ckpt)
            assert ".metadata" in names and ".metadata.tmp" not in names, names
            assert len([n for n in names if n.endswith(".distcp")]) >= 2  # written by several threads
            loaded = _empty_like(sd)
            dcp.load(loaded, storage_reader=dcp.FileSystemReader(ckpt))
            _assert_equal(sd, loaded)
            # A second save over the first (renames .metadata.tmp over an existing .metadata).
            sd2 = _state_dict(2)
            dcp.save(sd2, storage_writer=dcp.FileSystemWriter(ckpt, thread_count=2, overwrite=True))
        log = mount_log(str(tmp_path / "mnt"))
        assert "ERROR" not in log, log[-3000:]
        if writeback:  # (unmounting staged every parked file)
            assert [n for n in os.listdir(tmp_path / "writes" / "writeback") if n != ".lock"] == []
        fabric("--server", hub.url, "commit", f"{repo}@main", "-m", "checkpoint", token=hub.token)
        with mounted(hub.url, hub.token, f"{repo}@main", tmp_path / "again") as mnt:
            loaded = _empty_like(sd2)
            dcp.load(loaded, storage_reader=dcp.FileSystemReader(os.path.join(mnt, "run1", "step-100")))
            _assert_equal(sd2, loaded)
