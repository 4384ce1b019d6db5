"""FUSE file system over a data plane: mounts of commits, tags and branches (``fabric mount``)."""

import os

# mfusepy loads libfuse 2 (``libfuse.so.2``) when it finds it, and libfuse 3 only otherwise;
# the mounts use libfuse 3's API (``fuse_invalidate_path``). On a machine that has both (s3fs
# and older sshfs pull libfuse 2 in), ask for libfuse 3, unless the user named a library.
if not os.environ.get("FUSE_LIBRARY_PATH"):
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
