"""The CSI Node service: mount a volume at a pod's target path, report on it, unmount it."""

from __future__ import annotations

import logging
import os
from contextlib import closing

import grpc

from csi import flush
from csi.mounts import Mounts, PublishRequest
from csi.proto import pb, services
from csi.rpc import RpcError, VolumeLocks, invalid, require, rpc
from csi.volumes import Volume, check_server, nearest_server, parse_mount_flags, parse_share, parse_volume_id
from fabric.client.http import HttpPlane

log = logging.getLogger("fabric.csi")

Mode = pb.VolumeCapability.AccessMode
READ_ONLY_MODES = (Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY)
RPC = pb.NodeServiceCapability.RPC
SERVER_TIMEOUT = 30.0  # seconds a call to the fabric server may take before the RPC fails UNAVAILABLE


def volume_of(volume_id: str, context: dict[str, str]) -> Volume:
    """The volume a publish names: its ``server`` and ``share`` context, else its id."""
    if context.get("server") or context.get("share"):
        if not (context.get("server") and context.get("share")):
            raise invalid("volume attributes need both server and share (e.g. server: http://spoke:8700, share: datasets@v1)")
        repo, ref, subdir = parse_share(context["share"])
        return Volume(check_server(context["server"]), repo, ref, subdir)
    volume = parse_volume_id(volume_id)
    if volume is None:
        raise RpcError(grpc.StatusCode.NOT_FOUND, f"volume {volume_id!r} is unknown: a static PV needs volumeAttributes server and share")
    return volume


def check_target(path: str) -> str:
    if not os.path.isabs(path) or os.path.normpath(path) != path.rstrip("/") or "\0" in path:
        raise invalid(f"target path {path!r} must be an absolute, normalised path")
    return os.path.normpath(path)


class Node(services.NodeServicer):
    def __init__(
        self, node_id: str, mounts: Mounts, local_spokes: dict[str, str] | None = None, local_spoke_copies: dict[str, str] | None = None
    ):
        """``local_spokes``: URL -> cache directory of the spokes on this node (``--local-spoke``);
        ``local_spoke_copies``: URL -> their copies directory (``--local-spoke-copies``)."""
        self.node_id = node_id
        self.mounts = mounts
        self.local_spokes = local_spokes or {}
        self.local_spoke_copies = local_spoke_copies or {}
        self.locks = VolumeLocks()
        self._adopt()

    def _adopt(self) -> None:
        """Take over the publications a previous driver process left (they keep serving), and
        stage in the background what stopped writeback mounts left parked (:mod:`csi.flush`)."""
        flush.resume(self.mounts.state_dir)
        for pub in self.mounts.all():
            problem = self.mounts.problem(pub)
            if problem:
                log.warning("volume %s at %s: %s (it is cleaned up at unpublish)", pub.volume_id, pub.target, problem)
            else:
                log.info("adopted volume %s at %s (mount pid %d)", pub.volume_id, pub.target, pub.pid)

    @rpc
    def NodeGetInfo(self, request, context):
        return pb.NodeGetInfoResponse(node_id=self.node_id)

    @rpc
    def NodeGetCapabilities(self, request, context):
        kinds = (RPC.GET_VOLUME_STATS, RPC.VOLUME_CONDITION, RPC.SINGLE_NODE_MULTI_WRITER)
        return pb.NodeGetCapabilitiesResponse(capabilities=[pb.NodeServiceCapability(rpc=RPC(type=k)) for k in kinds])

    @rpc
    def NodePublishVolume(self, request, context):
        require(request.volume_id, "volume_id")
        require(request.target_path, "target_path")
        require(request.HasField("volume_capability"), "volume_capability")
        target = check_target(request.target_path)
        cap = request.volume_capability
        if cap.HasField("block"):
            raise invalid("fabric volumes are file systems: use volumeMode Filesystem, not Block")
        volume = volume_of(request.volume_id, dict(request.volume_context))
        options = parse_mount_flags(list(cap.mount.mount_flags))
        writable = not (request.readonly or options.read_only or cap.access_mode.mode in READ_ONLY_MODES)
        nearest = nearest_server(volume.server)
        spoke_cache, spoke_copies = self.local_spokes.get(nearest, ""), self.local_spoke_copies.get(nearest, "")
        publish = PublishRequest(request.volume_id, volume, target, writable, options, spoke_cache, spoke_copies)
        token = request.secrets.get("token") or None
        with self.locks.hold(target, request.volume_id):
            existing = self.mounts.get(target)
            if existing is not None:
                if existing.request != publish:
                    raise RpcError(grpc.StatusCode.ALREADY_EXISTS, f"{target} already has volume {existing.volume_id!r} published with other options")
                if self.mounts.problem(existing) is None:
                    return pb.NodePublishVolumeResponse()
                self.mounts.unpublish(target)  # a dead mount: publish it afresh
            with closing(HttpPlane(volume.server, token, timeout=SERVER_TIMEOUT)) as plane:
                plane.resolve_commit(volume.repo, volume.ref)  # NOT_FOUND for an unknown repository or ref
                if writable and volume.ref not in {b["name"] for b in plane.list_branches(volume.repo)}:
                    raise invalid(f"{volume.repo}@{volume.ref} is not a branch: only branches can be mounted writable (use ReadOnlyMany or ro)")
            pub = self.mounts.publish(publish, token)
            log.info("published %s (%s from %s, %s) at %s, mount pid %d", request.volume_id, volume.share, volume.server, "rw" if writable else "ro", target, pub.pid)
        return pb.NodePublishVolumeResponse()

    @rpc
    def NodeUnpublishVolume(self, request, context):
        require(request.volume_id, "volume_id")
        require(request.target_path, "target_path")
        target = check_target(request.target_path)
        with self.locks.hold(target, request.volume_id):
            existing = self.mounts.get(target)
            if existing is not None and existing.volume_id != request.volume_id:
                raise RpcError(grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id!r} is not published at {target}")
            self.mounts.unpublish(target)
        return pb.NodeUnpublishVolumeResponse()

    @rpc
    def NodeGetVolumeStats(self, request, context):
        require(request.volume_id, "volume_id")
        require(request.volume_path, "volume_path")
        pub = self.mounts.get(check_target(request.volume_path))
        if pub is None or pub.volume_id != request.volume_id:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id!r} is not published at {request.volume_path}")
        problem = self.mounts.problem(pub)
        if problem:
            return pb.NodeGetVolumeStatsResponse(volume_condition=pb.VolumeCondition(abnormal=True, message=problem))
        st = os.statvfs(pub.target)
        unit = pb.VolumeUsage.Unit
        usage = [
            pb.VolumeUsage(unit=unit.BYTES, total=st.f_blocks * st.f_frsize, available=st.f_bavail * st.f_frsize, used=(st.f_blocks - st.f_bfree) * st.f_frsize),
            pb.VolumeUsage(unit=unit.INODES, total=st.f_files, available=st.f_favail, used=st.f_files - st.f_ffree),
        ]
        return pb.NodeGetVolumeStatsResponse(usage=usage, volume_condition=pb.VolumeCondition(abnormal=False, message="mounted"))
