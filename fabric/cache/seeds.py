"""Plain copies placed in a ``--passthrough`` mount's ``--cache-dir`` by a process that wrote
the files (``fabric mount --rw --seed-copies DIR``): a checkpoint saved through a writable
mount is then restored on the same machine, through a ``--passthrough`` mount of its commit
or tag with ``--cache-dir DIR``, by the kernel reading local files (:mod:`fuse.kernel`)
instead of out of chunks.

- **Names**: a seed is named as :class:`~fabric.cache.files.FileCopies` names its copies
  (``files/XX/KEY-SUM``), so a passthrough mount takes it up at its start, or at the first
  open of its key while it runs, and checks it at that first open as it checks any copy.
- **Placing**: :meth:`CopySeeder.seed` makes ``files/incoming/PID-KEY`` at once, a hard link
  to the writer's file (no bytes copied), and the writer may then drop its file. Where no link
  can be made (``DIR`` on another file system), the seed is copied in the background, in the
  kernel (``copy_file_range``, which shares the blocks on XFS and btrfs, else ``sendfile``),
  from a duplicate of the writer's descriptor, which keeps the file until then. In the
  background too the seed's size is checked, its bytes summed (xxh3-128) and flushed
  (``fdatasync``), and it is renamed to its name: the directory never shows a partial copy
  under a copy's name. Entries of
  ``incoming/`` whose process is gone (a crash) are removed when a seeder starts.
- **Budget**: the copies in the directory stay within ``budget`` bytes: placing a seed
  removes the least recently opened others (oldest mtime; a passthrough mount touches a copy
  at each open). A passthrough mount reading the directory also evicts within its own budget.
- **Failures** (disk full, an I/O error, another file system without room) drop the seed and
  are counted; the file was staged already, so nothing is lost but the fast restore.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from fabric.cache.files import FILES, INCOMING, MIN_SIZE, copy_files, copy_path, find_copy, place_copy, remove_orphans, unlink_quietly

log = logging.getLogger("fabric.cache")

#: Bytes per copy call when a seed cannot be a hard link.
COPY_STEP = 64 * 1024 * 1024


class CopySeeder:
    """Places copies of complete files under ``root/files`` for passthrough mounts to read."""

    def __init__(self, root: str, budget: int, min_size: int = MIN_SIZE) -> None:
        self.dir = os.path.join(root, FILES)
        self.incoming = os.path.join(self.dir, INCOMING)
        self.budget, self.min_size = budget, min_size
        os.makedirs(self.incoming, mode=0o700, exist_ok=True)
        remove_orphans(self.incoming)  # (what seeders that are gone left)
        self._placer = ThreadPoolExecutor(1, thread_name_prefix="fabric-seeds")
        self._lock = threading.Lock()
        self.seeded = self.linked = self.failed = self.evicted = 0

    def close(self) -> None:
        """Place the seeds begun already."""
        self._placer.shutdown(wait=True)

    def seed(self, fd: int, key: str, size: int) -> bool:
        """Take the file open as ``fd`` (read-only is enough), ``size`` bytes of the file version
        named ``key``, as a copy; the caller may close and drop its file once this returns. A
        link is made now; a copy, where no link can be made, in the background from a
        duplicate of ``fd`` (which keeps the file until then). False where no seed is made (too
        small or too large for the budget, one of that key there already or on its way, or
        neither a link nor a duplicate could be made)."""
        if size < self.min_size or size > self.budget or find_copy(self.dir, key) is not None:
            return False
        tmp = os.path.join(self.incoming, f"{os.getpid()}-{key}")
        try:
            linked = _link(fd, tmp)
            source = None if linked else os.dup(fd)
        except FileExistsError:
            return False  # the same version, seeded a moment ago: on its way
        except OSError as exc:
            self._failed(tmp, f"cannot make it: {exc}")
            return False
        try:
            self._placer.submit(self._place, tmp, key, size, source)
        except RuntimeError:  # closed
            if source is None:
                unlink_quietly(tmp)
            else:
                os.close(source)
            return False
        if linked:
            with self._lock:
                self.linked += 1
        return True

    def _place(self, tmp: str, key: str, size: int, source: int | None) -> None:
        """Copy ``source`` to ``tmp`` unless ``tmp`` is a link already; check, sum, flush and
        name it."""
        try:
            if source is not None:
                try:
                    if find_copy(self.dir, key) is not None:
                        return
                    _copy(source, tmp, size)
                finally:
                    os.close(source)
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                if (got := os.fstat(fd).st_size) != size:
                    raise OSError(errno.EIO, f"{got} bytes, not the version's {size}")
                dest = copy_path(self.dir, key, place_copy(self.dir, key, fd, tmp))
            finally:
                os.close(fd)
            os.utime(dest)  # the most recent: the last to be evicted
        except FileExistsError:
            return  # (a copy of the same version on its way: the first one is kept)
        except OSError as exc:
            self._failed(tmp, str(exc))
            return
        with self._lock:
            self.seeded += 1
        self._evict(keep=dest)

    def _evict(self, keep: str) -> None:
        """Remove the least recently opened copies until the directory's fit the budget."""
        found: list[tuple[float, int, str]] = []
        for f, named in copy_files(self.dir):
            if named is not None:
                st = f.stat(follow_symlinks=False)
                found.append((st.st_mtime, st.st_size, f.path))
        total = sum(size for _, size, _ in found)
        for _, size, path in sorted(found):
            if total <= self.budget:
                return
            if path != keep:
                unlink_quietly(path)
                total -= size
                with self._lock:
                    self.evicted += 1

    def _failed(self, tmp: str, why: str) -> None:
        log.info("no copy of %s kept for a passthrough mount: %s", os.path.basename(tmp), why)
        unlink_quietly(tmp)
        with self._lock:
            self.failed += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"seeded": self.seeded, "linked": self.linked, "failed": self.failed, "evicted": self.evicted}


def _link(fd: int, dest: str) -> bool:
    """Make ``dest`` a name of the file open as ``fd``; False where none can be made: another
    file system, or a file that had a name and lost it (a ``--writeback`` mount's file is
    named in its journal until its local state is dropped, for this)."""
    proc_fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:  # (linkat with AT_SYMLINK_FOLLOW: a name for the file itself, even one made O_TMPFILE)
        os.link(str(fd), dest, src_dir_fd=proc_fds, follow_symlinks=True)
        return True
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.ENOENT, errno.EMLINK):
            raise
        return False
    finally:
        os.close(proc_fds)


def _copy(fd: int, dest: str, size: int) -> None:
    """Copy the ``size`` bytes of the file open as ``fd`` to a new file ``dest``, in the kernel."""
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        offset, in_kernel = 0, True
        while offset < size:
            step = min(COPY_STEP, size - offset)
            if in_kernel:
                try:  # (shares the blocks where the file system can: XFS, btrfs)
                    n = os.copy_file_range(fd, out, step, offset, offset)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    in_kernel = False
                    continue
            else:
                n = os.sendfile(out, fd, offset, step)
            if n == 0:
                raise OSError(errno.EIO, f"the file ended at {offset} of {size} bytes")
            offset += n
    except BaseException:
        os.close(out)
        unlink_quietly(dest)
        raise
    os.close(out)
