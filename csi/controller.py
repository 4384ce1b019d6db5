"""The CSI Controller service: volumes created and deleted for the external-provisioner.

A StorageClass names a ``server``, a ``share`` (``REPO@REF``) and optionally a
``subDir``; both may use ``${pvc.metadata.namespace}``, ``${pvc.metadata.name}`` and
``${pv.metadata.name}``. CreateVolume makes the branch (from the repository's
default branch) when the share names one that does not exist yet — a branch per
claim — and commits the sub-directory when it is new. DeleteVolume follows
``onDelete``: ``retain`` keeps everything; ``delete`` removes the sub-directory (its
removal is staged on the branch) or, without one, deletes the branch; ``archive``
first commits what is staged on the branch and tags it ``archive-<volume name>``.

The controller keeps one record per volume name in its state directory, only to
answer a repeated CreateVolume with the same volume and an incompatible one with
ALREADY_EXISTS; everything DeleteVolume needs is in the volume id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from contextlib import closing, suppress

import grpc

from csi.proto import pb, services
from csi.rpc import RpcError, VolumeLocks, invalid, require, rpc
from csi.volumes import ON_DELETE, Volume, check_server, check_subdir, expand, parse_share, parse_volume_id
from fabric.client.http import HttpPlane
from fabric.errors import BadRequest, Conflict, NotFound
from fabric.format.model import DIR, Entry
from fabric.util.jsonfile import write_json

log = logging.getLogger("fabric.csi")

Mode = pb.VolumeCapability.AccessMode
WRITER_MODES = (Mode.SINGLE_NODE_WRITER, Mode.MULTI_NODE_SINGLE_WRITER, Mode.MULTI_NODE_MULTI_WRITER, Mode.SINGLE_NODE_SINGLE_WRITER, Mode.SINGLE_NODE_MULTI_WRITER)
RPC = pb.ControllerServiceCapability.RPC
SERVER_TIMEOUT = 30.0
ARCHIVE_PREFIX = "archive-"


def check_capabilities(caps, writable_ref: bool | None) -> None:
    """INVALID_ARGUMENT unless every capability is a mount; writers need a branch."""
    require(len(caps), "volume_capabilities")
    for cap in caps:
        if cap.HasField("block"):
            raise invalid("fabric volumes are file systems: use volumeMode Filesystem, not Block")
        if cap.access_mode.mode == Mode.UNKNOWN:
            raise invalid("every volume capability needs an access mode")
        if writable_ref is False and cap.access_mode.mode in WRITER_MODES:
            raise invalid("a commit or tag is read-only: use ReadOnlyMany, or a branch for ReadWriteMany")


class Controller(services.ControllerServicer):
    def __init__(self, state_dir: str):
        self.records = os.path.join(state_dir, "volumes")
        os.makedirs(self.records, mode=0o700, exist_ok=True)
        self.locks = VolumeLocks()

    # -- records of created volumes (idempotency) ---------------------------------

    def _record_path(self, name: str) -> str:
        return os.path.join(self.records, hashlib.sha256(name.encode()).hexdigest()[:24] + ".json")

    def _recorded(self, name: str) -> dict | None:
        try:
            with open(self._record_path(name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _record(self, name: str, record: dict) -> None:
        write_json(self._record_path(name), record)

    # -- RPCs ---------------------------------------------------------------------

    @rpc
    def ControllerGetCapabilities(self, request, context):
        kinds = (RPC.CREATE_DELETE_VOLUME, RPC.SINGLE_NODE_MULTI_WRITER)
        return pb.ControllerGetCapabilitiesResponse(capabilities=[pb.ControllerServiceCapability(rpc=RPC(type=k)) for k in kinds])

    @rpc
    def GetCapacity(self, request, context):
        raise RpcError(
            grpc.StatusCode.UNIMPLEMENTED,
            "GetCapacity is not supported: a fabric volume is a directory or branch of a deduplicated repository, with no fixed capacity",
        )

    @rpc
    def CreateVolume(self, request, context):
        require(request.name, "name")
        check_capabilities(request.volume_capabilities, None)
        if request.HasField("volume_content_source"):
            raise invalid("volume_content_source is not supported: make a branch from a tag or commit instead (share: REPO@NEW-BRANCH)")
        params = dict(request.parameters)
        require(params.get("server"), "parameter server")
        require(params.get("share"), "parameter share")
        unknown = sorted(k for k in params if k not in ("server", "share", "subDir", "onDelete") and not k.startswith("csi.storage.k8s.io/"))
        if unknown:
            raise invalid(f"unknown parameters {unknown}: a fabric StorageClass takes server, share, subDir and onDelete")
        on_delete = params.get("onDelete", "retain")
        if on_delete not in ON_DELETE:
            raise invalid(f"onDelete {on_delete!r}: use retain, delete or archive")
        repo, ref, share_dir = parse_share(expand(params["share"], params))
        subdir = check_subdir("/".join(p for p in (share_dir, expand(params.get("subDir", ""), params)) if p))
        volume = Volume(check_server(params["server"]), repo, ref, subdir, on_delete, request.name)
        capacity = request.capacity_range.required_bytes
        if request.capacity_range.limit_bytes and capacity > request.capacity_range.limit_bytes:
            raise RpcError(grpc.StatusCode.OUT_OF_RANGE, "required_bytes is larger than limit_bytes")
        wanted = {"volume_id": volume.volume_id, "capacity": capacity}
        with self.locks.hold(request.name):
            recorded = self._recorded(request.name)
            if recorded is not None and recorded != wanted:
                raise RpcError(grpc.StatusCode.ALREADY_EXISTS, f"volume {request.name!r} exists with other parameters or capacity")
            self._make(volume, request.secrets.get("token") or None, request.volume_capabilities)
            self._record(request.name, wanted)
        log.info("created volume %s (%s from %s, onDelete %s)", volume.volume_id, volume.share, volume.server, on_delete)
        return pb.CreateVolumeResponse(volume=pb.Volume(volume_id=volume.volume_id, capacity_bytes=capacity, volume_context=volume.context()))

    def _make(self, volume: Volume, token: str | None, caps) -> None:
        """The branch and sub-directory of ``volume``, made if missing (idempotent)."""
        with closing(HttpPlane(volume.server, token, timeout=SERVER_TIMEOUT)) as plane:
            try:
                default = plane.get_repo(volume.repo).get("default_branch") or "main"
            except NotFound:
                raise invalid(f"repository {volume.repo!r} does not exist at {volume.server} (create it with `fabric repo create`)") from None
            is_branch = volume.ref in {b["name"] for b in plane.list_branches(volume.repo)}
            if not is_branch:
                try:
                    plane.resolve_commit(volume.repo, volume.ref)
                except NotFound:
                    with suppress(Conflict):  # made meanwhile by another request
                        plane.create_branch(volume.repo, volume.ref, default)
                    log.info("created branch %s@%s from %s", volume.repo, volume.ref, default)
                    is_branch = True
            check_capabilities(caps, is_branch)
            if volume.subdir:
                self._make_subdir(plane, volume, is_branch)

    def _make_subdir(self, plane: HttpPlane, volume: Volume, is_branch: bool) -> None:
        try:
            entry = plane.stat(volume.repo, volume.ref, volume.subdir)
            if entry.kind != DIR:
                raise invalid(f"{volume.subdir!r} exists in {volume.repo}@{volume.ref} and is not a directory")
            return
        except NotFound:
            if not is_branch:
                raise invalid(f"{volume.subdir!r} does not exist in {volume.repo}@{volume.ref}") from None
        dir_entry = Entry(DIR, 0, 0o777, time.time_ns())
        plane.commit_changes(volume.repo, volume.ref, {volume.subdir: dir_entry}, f"csi: create volume {volume.name}", author="fabric-csi")

    @rpc
    def DeleteVolume(self, request, context):
        require(request.volume_id, "volume_id")
        volume = parse_volume_id(request.volume_id)
        if volume is None:
            log.info("delete of %r: not a volume this driver created, nothing to do", request.volume_id)
            return pb.DeleteVolumeResponse()
        with self.locks.hold(volume.name or request.volume_id):
            if volume.on_delete != "retain":
                self._remove(volume, request.secrets.get("token") or None)
            try:
                os.unlink(self._record_path(volume.name))
            except FileNotFoundError:
                pass
        log.info("deleted volume %s (onDelete %s)", request.volume_id, volume.on_delete)
        return pb.DeleteVolumeResponse()

    def _remove(self, volume: Volume, token: str | None) -> None:
        with closing(HttpPlane(volume.server, token, timeout=SERVER_TIMEOUT)) as plane:
            try:
                repo = plane.get_repo(volume.repo)
                branches = {b["name"] for b in plane.list_branches(volume.repo)}
            except NotFound:
                return  # the repository is gone: so is the volume
            if volume.ref not in branches:
                return  # deleted already (or a tag: nothing of ours to remove)
            if volume.on_delete == "archive":
                self._archive(plane, volume)
            if volume.subdir:
                gone = {path: None for path, _ in plane.walk(volume.repo, volume.ref, volume.subdir + "/")}
                try:
                    plane.stat(volume.repo, volume.ref, volume.subdir)
                    gone[volume.subdir] = None
                except NotFound:
                    pass
                if gone:
                    plane.stage(volume.repo, volume.ref, gone)
            elif volume.ref == repo.get("default_branch", "main"):
                raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, f"refusing to delete {volume.repo}@{volume.ref}: it is the repository's default branch")
            else:
                plane.delete_branch(volume.repo, volume.ref)

    def _archive(self, plane: HttpPlane, volume: Volume) -> None:
        tag = ARCHIVE_PREFIX + (volume.name or hashlib.sha256(volume.volume_id.encode()).hexdigest()[:16])
        if tag in {t["name"] for t in plane.list_tags(volume.repo)}:
            return  # archived by an earlier attempt of this delete
        try:
            plane.commit(volume.repo, volume.ref, f"csi: archive volume {volume.name}", author="fabric-csi")
        except BadRequest:
            pass  # nothing staged: the head already holds everything
        try:
            plane.create_tag(volume.repo, tag, volume.ref)
        except Conflict:
            pass
        log.info("archived %s@%s as tag %s", volume.repo, volume.ref, tag)

    @rpc
    def ValidateVolumeCapabilities(self, request, context):
        require(request.volume_id, "volume_id")
        require(len(request.volume_capabilities), "volume_capabilities")
        volume = parse_volume_id(request.volume_id)
        if volume is None:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"volume {request.volume_id!r} is unknown")
        with closing(HttpPlane(volume.server, request.secrets.get("token") or None, timeout=SERVER_TIMEOUT)) as plane:
            plane.resolve_commit(volume.repo, volume.ref)  # NOT_FOUND when the volume's ref is gone
            is_branch = volume.ref in {b["name"] for b in plane.list_branches(volume.repo)}
            if volume.subdir:
                plane.stat(volume.repo, volume.ref, volume.subdir)
        try:
            check_capabilities(request.volume_capabilities, is_branch)
        except RpcError as exc:
            return pb.ValidateVolumeCapabilitiesResponse(message=exc.message)
        confirmed = pb.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=dict(request.volume_context), volume_capabilities=list(request.volume_capabilities), parameters=dict(request.parameters)
        )
        return pb.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)
