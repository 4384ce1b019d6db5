"""The settings of one mount (``fabric mount`` options), as the mount process receives them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MountConfig:
    repo: str
    ref: str
    writable: bool = False
    uid: int = 0  # owner of entries that record none
    gid: int = 0
    attr_timeout: float = 1.0  # branch mounts
    server_timeout: float = 120.0
    readahead: int = 32 * 1024 * 1024
    memory_cache: int = 512 * 1024 * 1024
    cache_dir: str | None = None
    cache_size: int = 10 * 1024**3
    spoke_cache: str | None = None  # the --cache directory of the spoke mounted, on this machine (fabric/client/spoke_files.py)
    write_dir: str | None = None
    commit_interval: float = 0.0
    commit_on_unmount: bool = False
    commit_message: str = "fabric mount"
    commit_checkpoints: bool = False  # a DCP save's final rename commits and tags it (fuse/checkpoint_commits.py)
    durability: str = "local"
    writeback: bool = False  # fsync and close return once the file is in write_dir (fuse/writeback.py)
    writeback_backlog: int = 4 * 1024**3  # at most this many bytes parked; beyond, fsync stages inline
    stream_writes: bool = True  # chunk and send files written in order while they are written
    fetch_workers: int = 4
    passthrough: bool = False  # serve on the kernel's protocol, files with a copy in cache_dir read by the kernel (fuse/kernel)
    copies_dir: str | None = None  # where the plain copies are (default cache_dir); one several processes may share
    check_copies: bool = True  # serve no copy last checked (read whole) more than a day before: the scrub, or its first open (fabric/cache/scrub.py)
    seed_copies: str | None = None  # a --passthrough mount's --copies-dir: copies of the files staged are left there (fabric/cache/seeds.py)
    seed_copies_size: int = 5 * 1024**3
    job: str | None = None  # FABRIC_JOB: the job the mount reads for (a spoke learns its opens, fuse/opens.py)
    bwlimit: str | None = None  # --bwlimit: caps on the bytes a second to and from the server (fabric/client/bandwidth.py)

    @property
    def copies_budget(self) -> int:
        """With --passthrough, half of --cache-size is the files' plain copies (fuse/kernel)."""
        return self.cache_size // 2 if self.passthrough else 0

    @property
    def packs_budget(self) -> int:
        """What --cache-size leaves the chunk packs."""
        return self.cache_size - self.copies_budget
