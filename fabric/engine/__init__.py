"""The versioning engine: the hub's implementation of the data plane.

Owns: content-addressed metadata objects (:mod:`.metastore`), trees cut into
ranges (:mod:`.tree`), the read side shared with spokes (:mod:`.reader`), ref
expressions (:mod:`.refs`), chunks in packs on an object store
(:mod:`.chunkstore`), commits, branches, tags, diff and merge
(:mod:`.engine`), and fsck and gc (:mod:`.maintenance`). It knows nothing of
HTTP, S3 or FUSE.

May import: :mod:`fabric.plane`, :mod:`fabric.catalog`, :mod:`fabric.store`,
:mod:`fabric.cache`, :mod:`fabric.format`, :mod:`fabric.util`,
:mod:`fabric.errors`.
"""
