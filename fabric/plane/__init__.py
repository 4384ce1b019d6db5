"""The data plane: the interfaces every protocol frontend is written against.

Owns: the data-plane interface (:mod:`.dataplane`), the wire form of its values
shared by the HTTP client and the REST API (:mod:`.wire`).

May import: :mod:`fabric.auth` (for :class:`~fabric.auth.principal.Principal`),
:mod:`fabric.format`, :mod:`fabric.util`, :mod:`fabric.errors`.
"""
