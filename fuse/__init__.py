"""FUSE file system over a data plane: mounts of commits, tags and branches (``fabric mount``)."""
