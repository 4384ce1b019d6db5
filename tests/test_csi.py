"""The CSI driver called the way kubelet and the external-provisioner call it.

Real hub on loopback, real ``fabric csi`` on a unix socket, real FUSE mounts at the
target paths (bind mounts of the share's sub-directory).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import io
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest

from csi import flush
from csi.mounts import TAKE_WAIT, Mounts, PublishRequest, is_mounted
from csi.proto import pb
from csi.volumes import Volume, parse_mount_flags
from fabric.errors import NotFound
from fabric.format.model import SYMLINK, Entry
from fabric.util.dirlock import DirectoryInUse, DirLock, lock_holder
from fabric.util.processes import process_alive
from fuse.journal import Journal, Record
from fuse.kernel.protocol import kernel_has_passthrough
from fuse.mount import read_stats
from testbed.wanproxy import WanProxy
from tests.ci_requirements import requires
from tests.csi_driver import CsiDriver
from tests.fuse_helpers import needs_fuse
from tests.spokeserver import start_spoke, wait_for

pytestmark = needs_fuse

Mode = pb.VolumeCapability.AccessMode
RWX = Mode.MULTI_NODE_MULTI_WRITER
ROX = Mode.MULTI_NODE_READER_ONLY


def capability(mode=RWX, *flags: str):
    return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(mount_flags=list(flags)), access_mode=Mode(mode=mode))


def code_of(call, request) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=120)
    return info.value.code()


def claim_parameters(hub, share: str, **extra: str) -> dict:
    return {
        "server": hub.url,
        "share": share,
        "csi.storage.k8s.io/pvc/name": "claim-a",
        "csi.storage.k8s.io/pvc/namespace": "team",
        "csi.storage.k8s.io/pv/name": "pvc-0001",
        **extra,
    }


@pytest.fixture
def repo(hub):
    """A repository with one committed file on main and a tag v1."""
    name = "csi" + hashlib.sha1(os.urandom(8)).hexdigest()[:8]
    plane = hub.plane()
    plane.create_repo(name)
    plane.put_object(name, "main", "data/a.txt", io.BytesIO(b"alpha\n"))
    plane.put_object(name, "main", "big/blob.bin", io.BytesIO(os.urandom(24 << 20)))
    plane.commit(name, "main", "seed")
    plane.create_tag(name, "v1", "main")
    return name


@pytest.fixture
def driver(tmp_path):
    with CsiDriver(tmp_path) as d:
        yield d


def publish(d: CsiDriver, volume_id: str, target: str, token: str, context: dict | None = None, mode=RWX, *flags: str, readonly=False):
    return d.node.NodePublishVolume(
        pb.NodePublishVolumeRequest(
            volume_id=volume_id,
            target_path=target,
            volume_capability=capability(mode, *flags),
            readonly=readonly,
            secrets={"token": token},
            volume_context=context or {},
        ),
        timeout=180,
    )


def unpublish(d: CsiDriver, volume_id: str, target: str):
    return d.node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target), timeout=180)


def test_identity_and_capabilities_are_truthful_and_repeatable(driver):
    for _ in range(2):
        info = driver.identity.GetPluginInfo(pb.GetPluginInfoRequest())
        assert info.name == "csi.fabric.dev" and info.vendor_version
        assert driver.identity.Probe(pb.ProbeRequest()).ready.value is True
        caps = driver.identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest()).capabilities
        assert [c.service.type for c in caps] == [pb.PluginCapability.Service.CONTROLLER_SERVICE]
        assert driver.node.NodeGetInfo(pb.NodeGetInfoRequest()).node_id == "node-1"
        node_caps = {c.rpc.type for c in driver.node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest()).capabilities}
        assert pb.NodeServiceCapability.RPC.GET_VOLUME_STATS in node_caps
        assert pb.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME not in node_caps
        ctl_caps = {c.rpc.type for c in driver.controller.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest()).capabilities}
        assert pb.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME in ctl_caps
        assert pb.ControllerServiceCapability.RPC.GET_CAPACITY not in ctl_caps
    with pytest.raises(grpc.RpcError) as info:
        driver.controller.GetCapacity(pb.GetCapacityRequest())
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED and "no fixed capacity" in info.value.details()


def test_dynamic_volume_written_by_one_pod_is_read_by_another(hub, repo, driver, tmp_path):
    params = claim_parameters(hub, f"{repo}@main", subDir="${pvc.metadata.namespace}/${pvc.metadata.name}", onDelete="archive")
    create = pb.CreateVolumeRequest(
        name="pvc-0001",
        capacity_range=pb.CapacityRange(required_bytes=1 << 30),
        volume_capabilities=[capability()],
        parameters=params,
        secrets={"token": hub.token},
    )
    volume = driver.controller.CreateVolume(create, timeout=60).volume
    assert volume.volume_context == {"server": hub.url, "share": f"{repo}@main/team/claim-a"}
    assert volume.capacity_bytes == 1 << 30
    assert driver.controller.CreateVolume(create, timeout=60).volume == volume  # idempotent
    assert hub.plane().stat(repo, "main", "team/claim-a").kind == "dir"
    bigger = pb.CreateVolumeRequest()
    bigger.CopyFrom(create)
    bigger.capacity_range.required_bytes = 2 << 30
    assert code_of(driver.controller.CreateVolume, bigger) == grpc.StatusCode.ALREADY_EXISTS

    writer, reader = str(tmp_path / "pod-a" / "mount"), str(tmp_path / "pod-b" / "mount")
    os.makedirs(os.path.dirname(writer)), os.makedirs(os.path.dirname(reader))
    publish(driver, volume.volume_id, writer, hub.token, dict(volume.volume_context), RWX, "durability=hub")
    publish(driver, volume.volume_id, writer, hub.token, dict(volume.volume_context), RWX, "durability=hub")  # repeated: OK
    assert os.listdir(writer) == []  # the pod sees its own sub-directory only
    with open(os.path.join(writer, "result.txt"), "wb") as f:
        f.write(b"written by pod a\n")
        os.fsync(f.fileno())
    publish(driver, volume.volume_id, reader, hub.token, dict(volume.volume_context), RWX)
    with open(os.path.join(reader, "result.txt"), "rb") as f:
        assert f.read() == b"written by pod a\n"

    assert not any(hub.token in cmdline for cmdline in _command_lines()), "a token is on a command line"

    other = pb.NodePublishVolumeRequest(volume_id="other-volume", target_path=writer, volume_capability=capability(ROX), volume_context={"server": hub.url, "share": f"{repo}@v1"})
    assert code_of(driver.node.NodePublishVolume, other) == grpc.StatusCode.ALREADY_EXISTS

    stats = driver.node.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=writer), timeout=60)
    assert not stats.volume_condition.abnormal
    assert {u.unit for u in stats.usage} == {pb.VolumeUsage.BYTES, pb.VolumeUsage.INODES}
    assert code_of(driver.node.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="nope", volume_path=writer)) == grpc.StatusCode.NOT_FOUND

    for target in (writer, reader):
        unpublish(driver, volume.volume_id, target)
        unpublish(driver, volume.volume_id, target)  # repeated: OK
        assert not is_mounted(target) and not os.path.exists(target)
    assert Mounts(driver.state).all() == []

    delete = pb.DeleteVolumeRequest(volume_id=volume.volume_id, secrets={"token": hub.token})
    driver.controller.DeleteVolume(delete, timeout=60)
    driver.controller.DeleteVolume(delete, timeout=60)  # repeated: OK
    plane = hub.plane()
    assert plane.read(repo, "archive-pvc-0001", "team/claim-a/result.txt") == b"written by pod a\n"
    with pytest.raises(NotFound):
        plane.stat(repo, "main", "team/claim-a")
    assert plane.read(repo, "main", "data/a.txt") == b"alpha\n"  # the rest of the branch is untouched
    assert hub.token not in driver.all_logs()


def test_static_read_only_volume_of_a_tag(hub, repo, driver, tmp_path):
    plane = hub.plane()
    target = str(tmp_path / "pod" / "mount")
    os.makedirs(os.path.dirname(target))
    context = {"server": hub.url, "share": f"{repo}@v1/data"}
    publish(driver, "static-imagenet", target, hub.token, context, ROX)
    assert open(os.path.join(target, "a.txt"), "rb").read() == b"alpha\n"
    with pytest.raises(OSError) as info:
        open(os.path.join(target, "new.txt"), "wb")
    assert info.value.errno == errno.EROFS
    unpublish(driver, "static-imagenet", target)

    # Writable on a tag, a ref that does not exist, a sub-directory that does not: refused, nothing left behind.
    assert code_of(driver.node.NodePublishVolume, _publish_request(target, hub, f"{repo}@v1", RWX)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(driver.node.NodePublishVolume, _publish_request(target, hub, f"{repo}@v9", ROX)) == grpc.StatusCode.NOT_FOUND
    assert code_of(driver.node.NodePublishVolume, _publish_request(target, hub, f"{repo}@v1/missing", ROX)) == grpc.StatusCode.NOT_FOUND
    # A sub-directory that is a link out of the volume is not followed on the node.
    plane.commit_changes(repo, "main", {"escape": Entry(SYMLINK, 4, 0o777, time.time_ns(), target="/etc")}, "a link out")
    assert code_of(driver.node.NodePublishVolume, _publish_request(target, hub, f"{repo}@main/escape", ROX)) == grpc.StatusCode.NOT_FOUND
    # A token that cannot read the repository learns nothing of it.
    assert code_of(driver.node.NodePublishVolume, _publish_request(target, hub, f"{repo}@v1", ROX, token="not-a-token")) == grpc.StatusCode.UNAUTHENTICATED
    assert not os.path.exists(target) and Mounts(driver.state).all() == []


@requires(None if os.geteuid() == 0 and kernel_has_passthrough() else "FUSE passthrough needs root and CONFIG_FUSE_PASSTHROUGH")
def test_a_passthrough_volume_of_a_tag_reads_a_file_the_second_time_from_its_copy(hub, repo, driver, tmp_path, monkeypatch):
    data = os.urandom(5 << 20)
    plane = hub.plane()
    plane.put_object(repo, "main", "pt/shard.bin", io.BytesIO(data))
    plane.commit(repo, "main", "a shard")
    plane.create_tag(repo, "v2", "main")
    target = str(tmp_path / "pod" / "mount")
    os.makedirs(os.path.dirname(target))
    publish(driver, "pt-vol", target, hub.token, {"server": hub.url, "share": f"{repo}@v2/pt"}, ROX, "cache-size=1G", "passthrough")
    pub = Mounts(driver.state).get(target)
    with open(f"/proc/{pub.pid}/cmdline", "rb") as f:
        assert b"--passthrough" in f.read().split(b"\0")
    monkeypatch.setenv("FABRIC_MOUNT_STATE", os.path.join(driver.state, "fuse"))

    def counters() -> dict:
        with contextlib.suppress(OSError, ValueError):
            return read_stats(pub.private)["kernel"] or {}
        return {}

    with open(os.path.join(target, "shard.bin"), "rb") as f:  # from chunks, filling a copy on the way
        assert f.read() == data
    wait_for(lambda: counters().get("copies", {}).get("made") == 1, timeout=10, interval=0.2)
    with open(os.path.join(target, "shard.bin"), "rb") as f:  # from the copy
        assert f.read() == data
    wait_for(lambda: counters().get("passthrough_opens") == 1, timeout=10, interval=0.2)
    unpublish(driver, "pt-vol", target)
    assert not os.path.exists(target)


@requires(None if os.geteuid() == 0 and kernel_has_passthrough() else "FUSE passthrough needs root and CONFIG_FUSE_PASSTHROUGH")
def test_a_checkpoint_a_writeback_volume_saved_is_read_by_a_passthrough_volume_on_the_node_from_its_copies(
        hub, repo, driver, tmp_path, monkeypatch):
    """The node's copies of a repository: a ``writeback`` volume leaves a copy of each large file
    it stages there, and a ``passthrough`` volume of a tag of the same repository hands those
    copies to the kernel (restore on the node that saved the checkpoint, without a byte
    through the mount)."""
    data = os.urandom(3 << 20)
    hub.plane().put_object(repo, "main", "ck/.keep", io.BytesIO(b""))
    writer, reader = str(tmp_path / "trainer" / "mount"), str(tmp_path / "restorer" / "mount")
    os.makedirs(os.path.dirname(writer)), os.makedirs(os.path.dirname(reader))
    publish(driver, "ck-vol", writer, hub.token, {"server": hub.url, "share": f"{repo}@main/ck"}, RWX, "writeback")
    with open(os.path.join(writer, "shard0.bin"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    copies = os.path.join(driver.state, "copies")
    wait_for(lambda: [p for p in glob.glob(os.path.join(copies, "*", "files", "??", "*")) if os.path.getsize(p) == len(data)],
             timeout=30, interval=0.1)
    unpublish(driver, "ck-vol", writer)
    plane = hub.plane()
    plane.commit(repo, "main", "step 1")
    plane.create_tag(repo, "ck1", "main")
    publish(driver, "ck-restore", reader, hub.token, {"server": hub.url, "share": f"{repo}@ck1/ck"}, ROX, "cache-size=1G", "passthrough")
    pub = Mounts(driver.state).get(reader)
    monkeypatch.setenv("FABRIC_MOUNT_STATE", os.path.join(driver.state, "fuse"))
    with open(os.path.join(reader, "shard0.bin"), "rb") as f:
        assert f.read() == data
    def kernel() -> dict:
        with contextlib.suppress(OSError, ValueError):
            return read_stats(pub.private)["kernel"] or {}
        return {}

    wait_for(lambda: kernel().get("passthrough_opens") == 1, timeout=10, interval=0.2)
    assert kernel()["copies"]["made"] == 0 and kernel()["read_requests"] == 0  # the writer's copy, read by the kernel
    unpublish(driver, "ck-restore", reader)


def test_a_volume_served_by_the_nodes_spoke_reads_its_cache_files(hub, repo, tmp_path):
    """--local-spoke: the mount of a volume whose nearest server is this node's spoke reads the
    chunks that spoke holds from its cache directory; a directory that is not (yet) a spoke's
    cache costs only that, and the node's setting is no part of a repeated publish's identity."""
    plane = hub.plane()
    want = b"".join(plane.read_stream(repo, "v1", "big/blob.bin"))
    chunks = len(plane.stat_chunks(repo, "v1", "big/blob.bin").chunks)
    cache = tmp_path / "spoke-cache"
    with start_spoke(hub.url, cache, "256MiB", token=hub.token) as spoke:
        assert b"".join(spoke.plane().read_stream(repo, "v1", "big/blob.bin")) == want  # the spoke is warm
        not_a_cache = tmp_path / "empty"
        not_a_cache.mkdir()
        for directory, reads_files in ((cache, True), (not_a_cache, False)):
            with CsiDriver(tmp_path / f"driver-{reads_files}", mounter=True, local_spokes=(f"{spoke.url}/={directory}",)) as d:
                target = str(tmp_path / f"pod-{reads_files}" / "mount")
                os.makedirs(os.path.dirname(target))
                context = {"server": f"{spoke.url},{hub.url}", "share": f"{repo}@v1"}
                reported = spoke.stats()["cache_local_reads"]
                publish(d, "static-blob", target, hub.token, context, ROX)
                pub = Mounts(d.state).get(target)
                with open(f"/proc/{pub.pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                assert (b"--spoke-cache" in argv) is reads_files and (str(directory).encode() in argv) is reads_files
                publish(d, "static-blob", target, hub.token, context, ROX)  # repeated: the same publish
                with open(os.path.join(target, "big", "blob.bin"), "rb") as f:
                    assert hashlib.sha256(f.read()).digest() == hashlib.sha256(want).digest()
                unpublish(d, "static-blob", target)
                local_reads = spoke.stats()["cache_local_reads"] - reported
                if reads_files:
                    assert local_reads >= chunks
                else:
                    assert local_reads == 0
                    assert "is not a spoke's cache directory" in d.all_logs()


@requires(None if os.geteuid() == 0 and kernel_has_passthrough() else "FUSE passthrough needs root and CONFIG_FUSE_PASSTHROUGH")
def test_a_passthrough_volume_served_by_the_nodes_spoke_reads_the_spokes_copies(hub, tmp_path, monkeypatch):
    """--local-spoke-copies: a checkpoint written through the node's spoke from anywhere (here:
    its API), which the spoke keeps plain copies of (--seed-copies), is restored by a
    ``passthrough`` volume with the kernel reading the spoke's copy: no copy filled, no read
    request. Without the setting the volume fills a copy of its own."""
    repo = hub.new_repo("csiseeds")
    data = os.urandom(3 << 20)
    seeds = str(tmp_path / "spoke-copies")
    with start_spoke(hub.url, tmp_path / "spoke-cache", "256MiB", token=hub.token,
                     args=["--seed-copies", seeds, "--seed-copies-size", "64MiB"]) as spoke:
        spoke.plane().put_object(repo, "main", "ck/shard0.bin", io.BytesIO(data), durability="local")
        wait_for(lambda: spoke.stats()["seeds_placed"] == 1, timeout=30, interval=0.2)
        wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=60, interval=0.3)
        hub.plane().commit(repo, "main", "step 1")
        hub.plane().create_tag(repo, "ck1", "main")
        wait_for(lambda: "ck1" in {t["name"] for t in spoke.plane().list_tags(repo)}, timeout=30, interval=0.2)
        for node_copies in (True, False):
            copies = (f"{spoke.url}/={seeds}",) if node_copies else ()
            with CsiDriver(tmp_path / f"driver-{node_copies}", mounter=True, local_spoke_copies=copies) as d:
                target = str(tmp_path / f"pod-{node_copies}" / "mount")
                os.makedirs(os.path.dirname(target))
                context = {"server": f"{spoke.url},{hub.url}", "share": f"{repo}@ck1/ck"}
                publish(d, "restore", target, hub.token, context, ROX, "cache-size=1G", "passthrough")
                pub = Mounts(d.state).get(target)
                monkeypatch.setenv("FABRIC_MOUNT_STATE", os.path.join(d.state, "fuse"))
                with open(os.path.join(target, "shard0.bin"), "rb") as f:
                    assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()

                def kernel(private: str = pub.private) -> dict:
                    with contextlib.suppress(OSError, ValueError):
                        return read_stats(private)["kernel"] or {}
                    return {}

                if node_copies:
                    wait_for(lambda: kernel().get("passthrough_opens") == 1, timeout=10, interval=0.2)
                    assert kernel()["copies"]["made"] == 0 and kernel()["read_requests"] == 0  # the spoke's copy
                else:
                    wait_for(lambda: kernel().get("cached_opens") == 1, timeout=10, interval=0.2)
                    assert kernel()["passthrough_opens"] == 0 and kernel()["read_requests"] > 0
                unpublish(d, "restore", target)


@pytest.mark.parametrize("flag", ["--local-spoke", "--local-spoke-copies"])
def test_bad_local_spoke_values_are_refused(tmp_path, flag):
    for value in ("http://spoke:8700", "spoke:8700=/cache", "http://spoke:8700=relative/dir", "http://a:1,http://b:2=/cache"):
        proc = subprocess.run(
            [sys.executable, "-m", "fabric.cli.main", "csi", "--node", "--node-id", "n", "--endpoint", f"unix://{tmp_path}/s.sock", flag, value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and f"{flag} {value!r}" in proc.stderr, (value, proc.stderr)
    assert not os.path.exists(tmp_path / "s.sock")


def _command_lines() -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return out


def _publish_request(target: str, hub, share: str, mode, token: str | None = None):
    return pb.NodePublishVolumeRequest(
        volume_id="v",
        target_path=target,
        volume_capability=capability(mode),
        secrets={"token": token or hub.token},
        volume_context={"server": hub.url, "share": share},
    )


def test_branch_per_claim_is_created_and_deleted(hub, repo, driver):
    params = claim_parameters(hub, repo + "@${pvc.metadata.name}", onDelete="delete")
    volume = driver.controller.CreateVolume(
        pb.CreateVolumeRequest(name="pvc-0002", volume_capabilities=[capability()], parameters=params, secrets={"token": hub.token}), timeout=60
    ).volume
    plane = hub.plane()
    assert "claim-a" in {b["name"] for b in plane.list_branches(repo)}
    assert plane.read(repo, "claim-a", "data/a.txt") == b"alpha\n"  # made from the default branch
    driver.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=volume.volume_id, secrets={"token": hub.token}), timeout=60)
    assert "claim-a" not in {b["name"] for b in plane.list_branches(repo)}
    # The repository's default branch is never deleted for a claim.
    guard = driver.controller.CreateVolume(
        pb.CreateVolumeRequest(name="pvc-0003", volume_capabilities=[capability()], parameters=claim_parameters(hub, f"{repo}@main", onDelete="delete"), secrets={"token": hub.token}),
        timeout=60,
    ).volume
    assert code_of(driver.controller.DeleteVolume, pb.DeleteVolumeRequest(volume_id=guard.volume_id, secrets={"token": hub.token})) == grpc.StatusCode.FAILED_PRECONDITION
    assert "main" in {b["name"] for b in plane.list_branches(repo)}


def test_missing_and_wrong_arguments_get_the_codes_the_spec_requires(hub, repo, driver, tmp_path):
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    ok_params = claim_parameters(hub, f"{repo}@main")
    target = str(tmp_path / "t")
    cases = [
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(volume_capabilities=[capability()], parameters=ok_params), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", parameters=ok_params), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[capability()], parameters={"server": hub.url}), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[capability()], parameters={**ok_params, "colour": "red"}), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[capability()], parameters={**ok_params, "onDelete": "shred"}), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[capability()], parameters={**ok_params, "subDir": "${pod.name}"}), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[capability()], parameters={**ok_params, "subDir": "../up"}), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[capability()], parameters={**ok_params, "share": f"{repo}@v1"}), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(), access_mode=Mode(mode=RWX))], parameters=ok_params), invalid),
        (driver.controller.CreateVolume, pb.CreateVolumeRequest(name="x", volume_capabilities=[capability()], parameters={**ok_params, "share": "no-such-repo@main"}), invalid),
        (driver.controller.DeleteVolume, pb.DeleteVolumeRequest(), invalid),
        (driver.controller.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(volume_capabilities=[capability()]), invalid),
        (driver.controller.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(volume_id="unknown", volume_capabilities=[capability()]), grpc.StatusCode.NOT_FOUND),
        (driver.node.NodePublishVolume, pb.NodePublishVolumeRequest(target_path=target, volume_capability=capability()), invalid),
        (driver.node.NodePublishVolume, pb.NodePublishVolumeRequest(volume_id="v", volume_capability=capability()), invalid),
        (driver.node.NodePublishVolume, pb.NodePublishVolumeRequest(volume_id="v", target_path=target), invalid),
        (driver.node.NodePublishVolume, pb.NodePublishVolumeRequest(volume_id="v", target_path="relative/path", volume_capability=capability()), invalid),
        (driver.node.NodePublishVolume, pb.NodePublishVolumeRequest(volume_id="v", target_path=target, volume_capability=capability(), volume_context={"server": hub.url}), invalid),
        (driver.node.NodePublishVolume, pb.NodePublishVolumeRequest(volume_id="v", target_path=target, volume_capability=capability(RWX, "sync"), volume_context={"server": hub.url, "share": f"{repo}@main"}), invalid),
        (driver.node.NodePublishVolume, pb.NodePublishVolumeRequest(volume_id="unknown-handle", target_path=target, volume_capability=capability()), grpc.StatusCode.NOT_FOUND),
        (driver.node.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(target_path=target), invalid),
        (driver.node.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="v"), invalid),
        (driver.node.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_path=target), invalid),
        (driver.node.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="v"), invalid),
        (driver.node.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="v", volume_path=target), grpc.StatusCode.NOT_FOUND),
    ]
    for call, request, want in cases:
        if "secrets" in request.DESCRIPTOR.fields_by_name:
            request.secrets["token"] = hub.token  # a token that may do it all: the arguments are what is wrong
        assert code_of(call, request) == want, f"{call._method}: {request}"
    # A volume id that is not ours is deleted (it does not exist): OK, as the spec requires.
    driver.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="not-one-of-ours"), timeout=30)
    assert "x" not in {b["name"] for b in hub.plane().list_branches(repo)} and not os.path.exists(target)


def _slow_reader(path: str, out: str) -> subprocess.Popen:
    """A pod reading a file slowly (1 MiB per 50 ms) and writing its digest to ``out``."""
    code = (
        "import hashlib,sys,time\n"
        "h=hashlib.sha256()\n"
        "with open(sys.argv[1],'rb') as f:\n"
        "    while b:=f.read(1<<20):\n"
        "        h.update(b); time.sleep(0.05)\n"
        "open(sys.argv[2],'w').write(h.hexdigest())\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, path, out])


@pytest.mark.parametrize("mounter", [False, True], ids=["driver-owns-mounts", "mounter-owns-mounts"])
def test_restarting_the_driver_leaves_a_volume_being_read_mounted(hub, repo, tmp_path, mounter):
    expected = hashlib.sha256(hub.plane().read(repo, "v1", "big/blob.bin")).hexdigest()
    target = str(tmp_path / "pod" / "mount")
    os.makedirs(os.path.dirname(target))
    with CsiDriver(tmp_path / "csi", mounter=mounter) as d:
        publish(d, "imagenet-v1", target, hub.token, {"server": hub.url, "share": f"{repo}@v1"}, ROX)
        reader = _slow_reader(os.path.join(target, "big", "blob.bin"), str(tmp_path / "digest"))
        time.sleep(0.3)
        d.kill()
        assert reader.poll() is None, "the read should still be going when the driver dies"
        d.start()
        assert reader.wait(120) == 0
        assert (tmp_path / "digest").read_text() == expected
        assert is_mounted(target)
        assert "adopted volume imagenet-v1" in d.log()
        stats = d.node.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id="imagenet-v1", volume_path=target), timeout=60)
        assert not stats.volume_condition.abnormal
        unpublish(d, "imagenet-v1", target)
        assert not is_mounted(target) and not os.path.exists(target)


def test_a_writeback_volume_restarted_on_the_node_takes_over_its_dead_mounts_write_dir(hub, repo, driver, tmp_path):
    """``writeback``: the mount parks fsynced files in a write directory of the node's; a pod
    whose mount was killed and that is published again on the node gets that same directory,
    so the new mount takes over what the killed one parked: it serves it at once and stages it."""
    context = {"server": hub.url, "share": f"{repo}@main/wb"}
    hub.plane().put_object(repo, "main", "wb/.keep", io.BytesIO(b""))
    first, second = str(tmp_path / "pod-1" / "mount"), str(tmp_path / "pod-2" / "mount")
    os.makedirs(os.path.dirname(first)), os.makedirs(os.path.dirname(second))
    publish(driver, "wb-vol", first, hub.token, context, RWX, "writeback")
    pub = Mounts(driver.state).get(first)
    with open(f"/proc/{pub.pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    write_dir = argv[argv.index(b"--write-dir") + 1].decode()
    assert b"--writeback" in argv and write_dir.startswith(os.path.join(driver.state, "writes"))
    with open(os.path.join(first, "step-1.bin"), "wb") as f:
        f.write(b"parked by the first pod\n")
        os.fsync(f.fileno())
    os.kill(pub.pid, signal.SIGKILL)
    while process_alive(pub.pid):
        time.sleep(0.05)
    unpublish(driver, "wb-vol", first)
    publish(driver, "wb-vol", second, hub.token, context, RWX, "writeback")
    with open(f"/proc/{Mounts(driver.state).get(second).pid}/cmdline", "rb") as f:
        assert write_dir.encode() in f.read().split(b"\0")  # the dead mount's directory, taken over
    with open(os.path.join(second, "step-1.bin"), "rb") as f:
        assert f.read() == b"parked by the first pod\n"
    wait_for(lambda: [n for n in os.listdir(os.path.join(write_dir, "writeback")) if n.endswith(".json")] == [], timeout=30, interval=0.1)
    assert os.path.exists(flush.info_path(driver.state, write_dir))
    unpublish(driver, "wb-vol", second)
    assert not os.path.exists(flush.info_path(driver.state, write_dir)), "nothing left to stage: the node keeps no token"


def test_what_a_killed_writeback_mount_parked_reaches_the_branch_after_unpublish_without_a_new_pod(hub, repo, driver, tmp_path):
    """No pod of the volume comes back to the node: after unpublish the node stages what the
    killed mount parked (and, with ``commit-on-unmount``, commits it), then forgets the token
    it kept for that."""
    context = {"server": hub.url, "share": f"{repo}@main/wb"}
    plane = hub.plane()
    plane.put_object(repo, "main", "wb/.keep", io.BytesIO(b""))
    target = str(tmp_path / "pod" / "mount")
    os.makedirs(os.path.dirname(target))
    publish(driver, "wb-gone", target, hub.token, context, RWX, "writeback", "commit-on-unmount")
    pub = Mounts(driver.state).get(target)
    info = flush.info_path(driver.state, pub.write_dir)
    assert pub.write_dir and os.stat(info).st_mode & 0o777 == 0o600, "the token it keeps is root's alone"
    data = os.urandom(2 << 20)
    with open(os.path.join(target, "step-9.bin"), "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    os.kill(pub.pid, signal.SIGKILL)
    while process_alive(pub.pid):
        time.sleep(0.05)
    assert flush.parked(pub.write_dir) == 1
    unpublish(driver, "wb-gone", target)
    wait_for(lambda: plane.get_commit(repo, "main").message == flush.COMMIT_MESSAGE, timeout=90, interval=0.2)
    assert plane.read(repo, "main", "wb/step-9.bin") == data
    assert flush.parked(pub.write_dir) == 0
    wait_for(lambda: not os.path.exists(info), timeout=30, interval=0.1)


def test_a_driver_started_again_stages_what_a_write_dir_still_parks(hub, repo, tmp_path):
    """A flush that could not finish (the server was away, the node rebooted) is taken up again
    when the driver starts; a directory that parks nothing has its record (and token) forgotten."""
    state = tmp_path / "csi" / "state"
    parking, empty = str(state / "writes" / "vol-0"), str(state / "writes" / "vol-1")
    journal = Journal(parking)
    with open(journal.data_path("r1"), "wb") as f:
        f.write(b"parked before the reboot\n")
    journal.write(Record("r1", repo, "main", "after/reboot.txt", 0o100644, 0, 0, 1, 1, {}), durable=True)
    journal.close()
    Journal(empty).close()
    for write_dir in (parking, empty):
        flush.remember(str(state), write_dir, hub.url, hub.token, "local", commit=False)
    with CsiDriver(tmp_path / "csi"):
        plane = hub.plane()
        wait_for(lambda: not os.path.exists(flush.info_path(str(state), parking)), timeout=60, interval=0.1)
        assert plane.read(repo, "main", "after/reboot.txt") == b"parked before the reboot\n"
        assert not os.path.exists(flush.info_path(str(state), empty))
        assert flush.parked(parking) == 0


def test_unpublish_cleans_up_after_the_mount_process_died(hub, repo, driver, tmp_path):
    target = str(tmp_path / "pod" / "mount")
    os.makedirs(os.path.dirname(target))
    publish(driver, "vol", target, hub.token, {"server": hub.url, "share": f"{repo}@v1"}, ROX)
    pub = Mounts(driver.state).get(target)
    os.kill(pub.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process_alive(pub.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(OSError) as info:  # what the pod sees: "Transport endpoint is not connected"
        os.listdir(target)
    assert info.value.errno in (errno.ENOTCONN, errno.ECONNABORTED), info.value
    stats = driver.node.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id="vol", volume_path=target), timeout=60)
    assert stats.volume_condition.abnormal and "not running" in stats.volume_condition.message
    unpublish(driver, "vol", target)
    assert not is_mounted(target) and not is_mounted(pub.private)
    assert not os.path.exists(target) and Mounts(driver.state).all() == []


@pytest.mark.parametrize("policy", ["retain", "delete"])
def test_on_delete_of_a_claims_directory(hub, repo, driver, policy):
    params = claim_parameters(hub, f"{repo}@main", subDir="${pvc.metadata.name}", onDelete=policy)
    create = pb.CreateVolumeRequest(name="pvc-0004", volume_capabilities=[capability()], parameters=params, secrets={"token": hub.token})
    volume = driver.controller.CreateVolume(create, timeout=60).volume
    plane = hub.plane()
    plane.put_object(repo, "main", "claim-a/weights.bin", io.BytesIO(b"w" * 1000))
    driver.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=volume.volume_id, secrets={"token": hub.token}), timeout=60)
    if policy == "retain":
        assert plane.read(repo, "main", "claim-a/weights.bin") == b"w" * 1000
    else:
        for path in ("claim-a/weights.bin", "claim-a"):
            with pytest.raises(NotFound):
                plane.stat(repo, "main", path)
    assert plane.read(repo, "main", "data/a.txt") == b"alpha\n"
    assert not [t for t in plane.list_tags(repo) if t["name"].startswith("archive-")]
    # The name is free again: a new claim of that name is a new volume.
    assert driver.controller.CreateVolume(create, timeout=60).volume.volume_id == volume.volume_id


_HOLD_AFTER_THE_LOCKER_EXITS = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
if os.fork() == 0:  # the lock goes on in the child, whose parent, the locker /proc/locks names, is gone
    os.write(1, b"locked\n")
    time.sleep(float(sys.argv[2]))
    os._exit(0)
os._exit(0)
"""


def test_a_publish_waits_for_a_write_dir_holder_that_is_letting_go(hub, repo, tmp_path):
    """A write directory held for a moment by a process that is no mount (as a flush hands it
    from its ``fabric mount-flush`` to its own last look) is waited for, not passed over: the new
    mount gets the directory, and what its dead mount parked."""
    mounts = Mounts(str(tmp_path / "state"))
    req = PublishRequest("v", Volume(hub.url, repo, "main"), "/t", True, parse_mount_flags(["writeback"]))
    write_dir = mounts._write_dir(req)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_AFTER_THE_LOCKER_EXITS, write_dir, "0.5"], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"locked\n"
    assert holder.wait(10) == 0  # (the locker is gone; its child holds the lock half a second more)
    with pytest.raises(DirectoryInUse):
        DirLock(write_dir, "write-back directory")
    t0 = time.monotonic()
    assert mounts._write_dir(req) == write_dir
    assert time.monotonic() - t0 < 2 * TAKE_WAIT


def test_a_publish_stops_the_flush_of_the_write_dir_it_takes_over(hub, repo, tmp_path):
    """A flush of a write directory, still uploading over a slow link, is stopped by a
    writeback publish of the volume on the node, which then gets that directory with what
    the flush had not staged yet."""
    state = str(tmp_path / "state")
    mounts = Mounts(state)
    req = PublishRequest("v", Volume(hub.url, repo, "main"), "/t", True, parse_mount_flags(["writeback"]))
    write_dir = mounts._write_dir(req)
    journal = Journal(write_dir)
    with open(journal.data_path("big"), "wb") as f:
        f.write(os.urandom(16 << 20))
    journal.write(Record("big", repo, "main", "big.bin", 0o100644, 0, 0, 1, 1, {}), durable=True)
    journal.close()
    with WanProxy("127.0.0.1", int(hub.url.rsplit(":", 1)[1]), rate_mbit=8) as link:  # 16 MiB: about 17 s
        flush.remember(state, write_dir, link.url_for(), hub.token, "local", commit=False)
        pid = flush.start(state, write_dir)
        try:
            d = os.stat(write_dir)
            assert lock_holder(d.st_dev, d.st_ino) is not None, "start returns once the flush holds the directory"
            t0 = time.monotonic()
            assert mounts._write_dir(req) == write_dir
            assert time.monotonic() - t0 < flush.STOP_WAIT
            wait_for(lambda: not process_alive(pid), timeout=10, interval=0.05)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert flush.parked(write_dir) == 1, "what it had not staged is left for the new mount"
    assert os.path.exists(flush.info_path(state, write_dir)), "and so is the record of how to stage it"
