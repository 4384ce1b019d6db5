"""Volume ids, shares, StorageClass templates and mount options of the CSI driver."""

from __future__ import annotations

import subprocess
import sys

import pytest

from csi.mounts import Mounts, PublishRequest
from csi.volumes import MountOptions, Volume, VolumeError, expand, nearest_server, parse_local_spoke, parse_mount_flags, parse_share, parse_volume_id
from tests.hubserver import ROOT

PARAMS = {"csi.storage.k8s.io/pvc/name": "claim", "csi.storage.k8s.io/pvc/namespace": "ns", "csi.storage.k8s.io/pv/name": "pvc-1"}


def test_a_volume_id_carries_everything_delete_needs():
    vol = Volume("http://spoke:8700,http://hub:8600", "datasets", "main", "ns/claim", "archive", "pvc-1")
    assert parse_volume_id(vol.volume_id) == vol
    assert vol.context() == {"server": "http://spoke:8700,http://hub:8600", "share": "datasets@main/ns/claim"}
    for foreign in ("", "pvc-1234", "a#b#c#d", "http://x#repo@main##shred#n", "ftp://x#repo@main##retain#n", "http://x#repo@main#../up#retain#n"):
        assert parse_volume_id(foreign) is None


def test_shares_and_templates():
    assert parse_share("datasets@v1") == ("datasets", "v1", "")
    assert parse_share("datasets@main/team/a/") == ("datasets", "main", "team/a")
    for bad in ("datasets", "@main", "datasets@", "datasets@ma..in", "datasets@main/../etc"):
        with pytest.raises(VolumeError):
            parse_share(bad)
    assert expand("${pvc.metadata.namespace}/${pvc.metadata.name}-${pv.metadata.name}", PARAMS) == "ns/claim-pvc-1"
    with pytest.raises(VolumeError, match="unknown template"):
        expand("${pod.name}", PARAMS)
    with pytest.raises(VolumeError, match="extra-create-metadata"):
        expand("${pvc.metadata.name}", {})


def test_mount_options():
    opts = parse_mount_flags(["ro", "durability=replicated,cache-size=20G", "commit-interval=30", "commit-on-unmount"])
    assert opts.read_only and opts.durability == "replicated"
    assert opts.mount_args("/c") == ["--durability", "replicated", "--cache-dir", "/c", "--cache-size", "20G", "--commit-interval", "30", "--commit-on-unmount"]
    assert parse_mount_flags([]).mount_args("/c") == ["--durability", "local"]
    assert parse_mount_flags(["bwlimit=10M:100M"]).mount_args("/c") == ["--durability", "local", "--bwlimit", "10M:100M"]
    for bad in (["durability=disk"], ["cache-size=lots"], ["nolock"], ["commit-interval=-1"], ["ro=1"]):
        with pytest.raises(VolumeError, match="fabric volumes take"):
            parse_mount_flags(bad)
    with pytest.raises(VolumeError, match="bwlimit=fast"):
        parse_mount_flags(["bwlimit=fast"])


def test_local_spoke_values_and_the_nearest_server():
    assert parse_local_spoke("http://fabric-spoke:8700/=/var/lib/fabric/spoke-cache/") == ("http://fabric-spoke:8700", "/var/lib/fabric/spoke-cache")
    assert parse_local_spoke("http://fabric-spoke:8700=/var/lib/fabric/spoke-copies", "--local-spoke-copies") == (
        "http://fabric-spoke:8700", "/var/lib/fabric/spoke-copies")
    for bad in ("http://spoke:8700", "http://spoke:8700=", "spoke:8700=/cache", "http://spoke:8700=cache", "http://spoke:8700=/a/../b", "http://a:1,http://b:2=/cache"):
        with pytest.raises(VolumeError, match="--local-spoke "):
            parse_local_spoke(bad)
        with pytest.raises(VolumeError, match="--local-spoke-copies "):
            parse_local_spoke(bad, "--local-spoke-copies")
    assert nearest_server("http://spoke:8700/,http://hub:8600") == "http://spoke:8700"
    assert nearest_server("http://hub:8600") == "http://hub:8600"


def test_a_publication_recorded_before_local_spokes_loads():
    req = PublishRequest("v", Volume("http://hub:8600", "r", "main"), "/t", False, MountOptions(), "/var/lib/fabric/spoke-cache")
    record = req.to_json()
    assert PublishRequest.from_json(record).spoke_cache == "/var/lib/fabric/spoke-cache"
    del record["spoke_cache"]
    old = PublishRequest.from_json(record)
    assert old.spoke_cache == "" and old == req  # a node setting: not part of the publish's identity


def test_writeback_is_a_flag_for_writable_publishes():
    opts = parse_mount_flags(["writeback,durability=local"])
    assert opts.writeback
    assert opts.mount_args("/c", "/w") == ["--durability", "local", "--writeback", "--write-dir", "/w"]
    assert opts.mount_args("/c") == ["--durability", "local"]  # (a read-only publish: no write directory)
    assert opts.mount_args("/c", "/w", "/k") == ["--durability", "local", "--writeback", "--write-dir", "/w", "--seed-copies", "/k"]
    assert opts.mount_args("/c", None, "/k") == ["--durability", "local"]
    with pytest.raises(VolumeError, match="fabric volumes take"):
        parse_mount_flags(["writeback=1"])


def test_passthrough_is_a_flag_that_needs_a_cache_size():
    opts = parse_mount_flags(["ro,cache-size=50G", "passthrough"])
    assert opts.mount_args("/c") == ["--durability", "local", "--cache-dir", "/c", "--cache-size", "50G", "--passthrough"]
    assert opts.mount_args("/c", None, "/k") == ["--durability", "local", "--cache-dir", "/c", "--cache-size", "50G", "--passthrough",
                                                 "--copies-dir", "/k"]
    with pytest.raises(VolumeError, match="passthrough needs cache-size"):
        parse_mount_flags(["ro,passthrough"])
    with pytest.raises(VolumeError, match="fabric volumes take"):
        parse_mount_flags(["passthrough=yes"])


def test_each_live_writeback_mount_of_a_volume_gets_its_own_write_dir_and_a_dead_ones_is_taken_over(tmp_path):
    mounts = Mounts(str(tmp_path / "state"))
    vol = Volume("http://spoke:8700", "ckpt", "main")
    req = PublishRequest("v", vol, "/t", True, parse_mount_flags(["writeback"]))
    first = mounts._write_dir(req)
    assert first is not None and first.endswith("-0")
    assert mounts._write_dir(PublishRequest("v", vol, "/t", False, req.options)) is None  # read-only: none
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from fabric.util.dirlock import DirLock; DirLock(sys.argv[1]); print('held', flush=True); time.sleep(60)", first],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"  # (a live mount holds it)
        second = mounts._write_dir(req)
        assert second is not None and second.endswith("-1")
    finally:
        holder.kill()
        holder.wait(10)
    assert mounts._write_dir(req) == first  # its mount is gone: the next takes its journal over
