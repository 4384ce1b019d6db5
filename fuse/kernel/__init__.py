"""The kernel's FUSE protocol spoken on ``/dev/fuse`` without libfuse.

libfuse 3.14 (Debian bookworm) cannot ask the kernel for FUSE passthrough (the INIT flag came
in libfuse 3.16). A read-only mount of a commit asked to (``fabric mount --passthrough``) is
served by this package instead: :mod:`fuse.kernel.protocol` (the wire format),
:mod:`fuse.kernel.session` (mounting, the request loop) and :mod:`fuse.kernel.immutable`
(the requests of an immutable mount, answered by :class:`~fuse.fs.FabricFS`, with files
whose plain copy is on disk (:mod:`fabric.cache.files`) read by the kernel itself).
"""
