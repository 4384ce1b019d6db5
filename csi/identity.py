"""The CSI Identity service: the driver's name, its capabilities, readiness."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

from csi.proto import pb, services
from csi.rpc import rpc


def fabric_version() -> str:
    try:
        return version("fabric")
    except PackageNotFoundError:
        return "0+unknown"


class Identity(services.IdentityServicer):
    def __init__(self, name: str, controller: bool, ready_socket: str | None = None):
        self.name = name
        self.controller = controller
        self.ready_socket = ready_socket  # the mounter's: not ready until it listens

    @rpc
    def GetPluginInfo(self, request, context):
        return pb.GetPluginInfoResponse(name=self.name, vendor_version=fabric_version())

    @rpc
    def GetPluginCapabilities(self, request, context):
        caps = []
        if self.controller:
            service = pb.PluginCapability.Service(type=pb.PluginCapability.Service.CONTROLLER_SERVICE)
            caps.append(pb.PluginCapability(service=service))
        return pb.GetPluginCapabilitiesResponse(capabilities=caps)

    @rpc
    def Probe(self, request, context):
        ready = self.ready_socket is None or os.path.exists(self.ready_socket)
        response = pb.ProbeResponse()
        response.ready.value = ready
        return response
