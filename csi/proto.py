"""The CSI messages and services, compiled from ``csi.proto`` when first imported."""

try:
    import grpc
    import grpc_tools  # noqa: F401  (protos_and_services compiles with it)
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(f"the CSI driver needs grpcio and grpcio-tools: pip install 'fabric[csi]' ({exc})") from exc

pb, services = grpc.protos_and_services("csi/csi.proto")
