"""What a fabric volume is: its id, its share, its mount options, its templates.

A volume is a ``server`` (a hub or spoke URL, or a comma-separated list, nearest
first) and a ``share`` (``REPO@REF[/subdir]``), as with the NFS CSI driver's
``server`` and ``share``. A dynamically provisioned volume's id carries all of it,
so any controller or node can act on it without shared state::

    SERVER#REPO@REF#SUBDIR#ONDELETE#NAME

(``SUBDIR`` may be empty; ``ONDELETE`` is ``retain``, ``delete`` or ``archive``;
``NAME`` is the name the provisioner gave the volume, the PV's name). A static PV
may use any handle: its ``volumeAttributes`` name the server and share.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from fabric.errors import BadRequest, InvalidName, InvalidPath
from fabric.format.paths import check_path, check_ref_name

ON_DELETE = ("retain", "delete", "archive")
ID_SEPARATOR = "#"

# The provisioner passes these with --extra-create-metadata; templates name them.
TEMPLATE_KEYS = {
    "pvc.metadata.name": "csi.storage.k8s.io/pvc/name",
    "pvc.metadata.namespace": "csi.storage.k8s.io/pvc/namespace",
    "pv.metadata.name": "csi.storage.k8s.io/pv/name",
}
_TEMPLATE = re.compile(r"\$\{([^}]*)\}")


class VolumeError(BadRequest):
    """A volume id, share, template or mount option that cannot be used."""


@dataclass(frozen=True)
class Volume:
    server: str
    repo: str
    ref: str
    subdir: str = ""
    on_delete: str = "retain"
    name: str = ""

    @property
    def share(self) -> str:
        """``REPO@REF[/subdir]``: the volume context's ``share``."""
        return f"{self.repo}@{self.ref}" + (f"/{self.subdir}" if self.subdir else "")

    @property
    def volume_id(self) -> str:
        return ID_SEPARATOR.join((self.server, f"{self.repo}@{self.ref}", self.subdir, self.on_delete, self.name))

    def context(self) -> dict[str, str]:
        return {"server": self.server, "share": self.share}


def check_server(server: str) -> str:
    servers = [s.strip() for s in server.split(",")]
    if not server or any(not re.fullmatch(r"https?://[^\s#,]+", s) for s in servers):
        raise VolumeError(f"server {server!r}: give http(s)://HOST:PORT, or several comma-separated, nearest first")
    return ",".join(servers)


#: What the directory of each ``URL=DIR`` node setting is, and an example of one.
_SPOKE_DIRS = {"--local-spoke": ("cache directory", "/var/lib/fabric/spoke-cache"),
               "--local-spoke-copies": ("copies directory", "/var/lib/fabric/spoke-copies")}


def parse_local_spoke(value: str, flag: str = "--local-spoke") -> tuple[str, str]:
    """``URL=DIR`` (``fabric csi --local-spoke``, or ``--local-spoke-copies``): the spoke on this
    node that ``URL`` reaches, and its ``--cache`` directory (its ``--seed-copies`` directory) as
    this node's mounts see it."""
    what, example = _SPOKE_DIRS[flag]
    url, eq, directory = value.partition("=")
    if not eq or "," in url or not directory:
        raise VolumeError(f"{flag} {value!r}: give URL=DIR, e.g. http://fabric-spoke.fabric.svc:8700={example}")
    if not os.path.isabs(directory) or os.path.normpath(directory) != directory.rstrip("/"):
        raise VolumeError(f"{flag} {value!r}: the {what} must be an absolute, normalised path")
    try:
        return check_server(url).rstrip("/"), os.path.normpath(directory)
    except VolumeError as exc:
        raise VolumeError(f"{flag} {value!r}: {exc}") from None


def nearest_server(server: str) -> str:
    """The first (nearest) URL of a volume's ``server`` list."""
    return server.split(",")[0].rstrip("/")


def parse_share(share: str) -> tuple[str, str, str]:
    """``REPO@REF[/subdir]`` -> ``(repo, ref, subdir)``; VolumeError for anything else."""
    repo, at, rest = share.partition("@")
    ref, _, subdir = rest.partition("/")
    if not at or not repo or not ref:
        raise VolumeError(f"share {share!r}: give REPO@REF or REPO@REF/DIRECTORY, e.g. datasets@main/team-a")
    return repo, _checked_ref(ref), check_subdir(subdir)


def _checked_ref(ref: str) -> str:
    try:
        if re.fullmatch(r"[0-9a-f]{64}", ref):
            return ref  # a full commit id
        return check_ref_name(ref, "ref")
    except InvalidName as exc:
        raise VolumeError(str(exc)) from None


def check_subdir(subdir: str) -> str:
    subdir = subdir.strip("/")
    try:
        return check_path(subdir, allow_empty=True)
    except InvalidPath as exc:
        raise VolumeError(f"sub-directory {subdir!r}: {exc}") from None


def parse_volume_id(volume_id: str) -> Volume | None:
    """The volume a dynamic volume id names; None if it is not one of ours."""
    parts = volume_id.split(ID_SEPARATOR)
    if len(parts) != 5 or parts[3] not in ON_DELETE:
        return None
    try:
        repo, ref, _ = parse_share(parts[1])
        return Volume(check_server(parts[0]), repo, ref, check_subdir(parts[2]), parts[3], parts[4])
    except VolumeError:
        return None


def expand(template: str, parameters: dict[str, str]) -> str:
    """Fill ``${pvc.metadata.name}``, ``${pvc.metadata.namespace}`` and ``${pv.metadata.name}``."""

    def one(match: re.Match) -> str:
        key = match.group(1)
        if key not in TEMPLATE_KEYS:
            raise VolumeError(f"unknown template ${{{key}}} in {template!r}: use {', '.join('${' + k + '}' for k in TEMPLATE_KEYS)}")
        value = parameters.get(TEMPLATE_KEYS[key])
        if not value:
            raise VolumeError(f"${{{key}}} in {template!r} needs the external-provisioner's --extra-create-metadata")
        return value

    return _TEMPLATE.sub(one, template)


@dataclass(frozen=True)
class MountOptions:
    """The PV's ``mountOptions`` as ``fabric mount`` options."""

    read_only: bool = False
    durability: str = "local"
    cache_size: str = ""
    commit_interval: str = ""
    commit_on_unmount: bool = False
    writeback: bool = False
    passthrough: bool = False
    bwlimit: str = ""

    def mount_args(self, cache_dir: str, write_dir: str | None = None, copies_dir: str | None = None) -> list[str]:
        """``cache-size`` keeps chunks on the node's disk, in ``cache_dir``, up to that size;
        ``writeback`` parks writes in ``write_dir`` (given for a writable publish only) and
        leaves a copy of each large file it stages in ``copies_dir``, the node's copies of the
        repository, which a ``passthrough`` volume reads."""
        args = ["--durability", self.durability]
        if self.cache_size:
            args += ["--cache-dir", cache_dir, "--cache-size", self.cache_size]
        if self.writeback and write_dir:
            args += ["--writeback", "--write-dir", write_dir]
            if copies_dir:
                args += ["--seed-copies", copies_dir]
        if self.passthrough:
            args.append("--passthrough")
            if copies_dir:
                args += ["--copies-dir", copies_dir]
        if self.commit_interval:
            args += ["--commit-interval", self.commit_interval]
        if self.commit_on_unmount:
            args.append("--commit-on-unmount")
        if self.bwlimit:
            args += ["--bwlimit", self.bwlimit]
        return args


def _bwlimit(value: str) -> str:
    """A ``bwlimit=`` value as ``fabric mount --bwlimit`` takes it; VolumeError otherwise."""
    from fabric.client.bandwidth import parse_bwlimit

    try:
        parse_bwlimit(value)
    except BadRequest as exc:
        raise VolumeError(f"mount option bwlimit={value}: {exc.message}") from None
    return value


def parse_mount_flags(flags: list[str]) -> MountOptions:
    """``ro``, ``durability=…``, ``cache-size=…``, ``commit-interval=…``, ``commit-on-unmount``,
    ``writeback``, ``passthrough`` (with ``cache-size``), ``bwlimit=RATE`` or ``bwlimit=UP:DOWN``."""
    values: dict = {}
    for flag in flags:
        for item in flag.split(","):
            key, eq, value = item.strip().partition("=")
            if key in ("", "rw"):
                continue
            if key == "ro" and not eq:
                values["read_only"] = True
            elif key == "durability" and value in ("local", "replicated", "hub"):
                values["durability"] = value
            elif key == "cache-size" and re.fullmatch(r"\d+(\.\d+)?[kmgtKMGT]?i?[bB]?", value):
                values["cache_size"] = value
            elif key == "commit-interval" and re.fullmatch(r"\d+(\.\d+)?", value):
                values["commit_interval"] = value
            elif key == "commit-on-unmount" and not eq:
                values["commit_on_unmount"] = True
            elif key == "writeback" and not eq:
                values["writeback"] = True
            elif key == "passthrough" and not eq:
                values["passthrough"] = True
            elif key == "bwlimit" and eq:
                values["bwlimit"] = _bwlimit(value)
            else:
                raise VolumeError(
                    f"mount option {item.strip()!r}: fabric volumes take ro, durability=local|replicated|hub, "
                    "cache-size=SIZE, commit-interval=SECONDS, commit-on-unmount, writeback, passthrough and bwlimit=RATE|UP:DOWN"
                )
    if values.get("passthrough") and not values.get("cache_size"):
        raise VolumeError("mount option passthrough needs cache-size=SIZE: the files the kernel reads are copies on the node's disk")
    return MountOptions(**values)
