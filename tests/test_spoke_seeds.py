"""``fabric spoke --seed-copies DIR`` (issue 16, restore from a warm spoke): plain copies of
the files written through a spoke, for ``--passthrough`` mounts beside it
(``--copies-dir DIR``), whose kernel then reads them instead of asking the mount for bytes.

Real hub, real spoke, real mounts.
"""

from __future__ import annotations

import hashlib
import io
import os

from fabric.client.copies import open_copy
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import Hub
from tests.spokeserver import random_bytes, start_spoke, wait_for
from tests.test_fuse_passthrough import kernel_stats, needs_passthrough

MIB = 1024 * 1024


def _copies(spoke) -> dict:  # noqa: ANN001 - tests.spokeserver.Spoke
    stats = spoke.stats()
    return {k: v for k, v in stats.items() if k.startswith("seeds_")}


@needs_fuse
@needs_passthrough
def test_a_checkpoint_written_through_the_spoke_is_restored_beside_it_from_its_copies(hub: Hub, tmp_path):
    repo = hub.new_repo("spokeseed")
    seeds = str(tmp_path / "copies")
    shards = {"ckpt/shard0.bin": random_bytes(3 * MIB + 5, 71), "ckpt/shard1.bin": random_bytes(2 * MIB, 72),
              "ckpt/.metadata": b"m" * 4000}  # too small to copy
    with start_spoke(hub.url, tmp_path / "spoke", "256MiB", token=hub.token,
                     args=["--seed-copies", seeds, "--seed-copies-size", "64MiB"]) as spoke:
        with mounted(spoke.url, hub.token, f"{repo}@main", tmp_path / "rw", "--rw") as mp:  # at `local`: queued there
            os.makedirs(f"{mp}/ckpt")
            for name, data in shards.items():
                with open(f"{mp}/{name}", "wb") as f:
                    f.write(data)
        wait_for(lambda: _copies(spoke)["seeds_placed"] >= 2, timeout=30, interval=0.2)
        assert _copies(spoke)["seeds_placed"] == 2, _copies(spoke)
        assert _copies(spoke)["seeds_failed"] == 0
        wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=60, interval=0.3)
        commit = hub.plane().commit(repo, "main", "step 1").id
        for name, data in shards.items():
            entry = hub.plane().stat_chunks(repo, "main", name)
            fd = open_copy(seeds, entry)
            assert (fd is None) == (len(data) < MIB)
            if fd is not None:
                assert os.pread(fd, len(data) + 1, 0) == data  # the version's bytes, whole
                os.close(fd)

        with mounted(spoke.url, hub.token, f"{repo}@{commit}", tmp_path / "ro", "--passthrough", "--cache-dir",
                     str(tmp_path / "c"), "--copies-dir", seeds) as ro:
            for name, data in shards.items():
                with open(f"{ro}/{name}", "rb") as f:
                    assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
            got = kernel_stats(ro, lambda s: s["passthrough_opens"] + s["cached_opens"] >= 3)
            assert got["passthrough_opens"] == 2 and got["copies"]["made"] == 0  # the spoke's copies, none filled


def test_files_whose_chunks_the_spoke_lacks_or_over_the_budget_get_no_copy(hub: Hub, tmp_path):
    """A file staged at the spoke whose chunks only the hub has (a copy of one written there):
    assembling a copy would fetch them over the WAN, so none is made; nor of a file over the budget."""
    repo = hub.new_repo("spokeseedno")
    seeds = str(tmp_path / "copies")
    hub.plane().put_object(repo, "main", "at-hub.bin", io.BytesIO(random_bytes(2 * MIB, 75)))
    elsewhere = hub.plane().stat_chunks(repo, "main", "at-hub.bin")
    with start_spoke(hub.url, tmp_path / "spoke", "256MiB", token=hub.token,
                     args=["--seed-copies", seeds, "--seed-copies-size", "4MiB"]) as spoke:
        plane = spoke.plane()
        plane.put_object(repo, "main", "big.bin", io.BytesIO(random_bytes(5 * MIB, 73)), durability="local")
        plane.stage(repo, "main", {"copied.bin": elsewhere}, durability="local")
        plane.put_object(repo, "main", "fits.bin", io.BytesIO(random_bytes(2 * MIB, 74)), durability="local")
        wait_for(lambda: _copies(spoke)["seeds_placed"] >= 1, timeout=30, interval=0.2)
        wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=60, interval=0.3)
        assert _copies(spoke)["seeds_placed"] == 1 and _copies(spoke)["seeds_waiting"] == 0, _copies(spoke)
        assert open_copy(seeds, hub.plane().stat_chunks(repo, "main", "big.bin")) is None
        assert open_copy(seeds, hub.plane().stat_chunks(repo, "main", "copied.bin")) is None
        fd = open_copy(seeds, hub.plane().stat_chunks(repo, "main", "fits.bin"))
        assert fd is not None
        os.close(fd)
