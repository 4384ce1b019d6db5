"""The data plane: the interfaces every protocol frontend is written against.

Owns: the data-plane interface (:mod:`.dataplane`), the union of small role
interfaces, each method with its contract (:mod:`.repos`, :mod:`.refs`,
:mod:`.history`, :mod:`.reads`, :mod:`.writes`, :mod:`.exchange`,
:mod:`.admin`, :mod:`.buckets`); decorators around any plane (:mod:`.wrapper`,
:mod:`.retry`, :mod:`.metrics`); the wire form of plane values shared by the
HTTP client and the REST API (:mod:`.wire`).

May import: :mod:`fabric.auth`, :mod:`fabric.format`, :mod:`fabric.util`,
:mod:`fabric.errors`, and the third-party libraries its wrappers need (httpx
errors for retry, prometheus_client for metrics).
"""
