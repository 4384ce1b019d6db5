"""The read path: opening and reading committed (or staged) file versions.

Read-only mounts of a commit or tag are immutable: entries and chunks are
cached for good, there are no open handles (reads go by path, one
:class:`~fuse.reader.FileReader` per recently read file) and the kernel keeps
its page cache. Branch mounts follow the head with close-to-open coherence:
``open`` fetches the current entry and pins a handle to that version
(snapshot isolation), dropping the kernel's cached pages of an older one.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections import OrderedDict
from typing import Any

from fabric.cache.lru import BytesLRU
from fabric.client.local_reads import LocalReadReports
from fabric.client.spoke_files import SpokeFiles
from fabric.errors import NotFound
from fabric.format.model import DIR, FILE, Entry
from fuse.errors import err
from fuse.handles import RHandle, WHandle, content_sig
from fuse.libfuse import invalidate_path
from fuse.namespace import Dir, SiblingOrder, join, split
from fuse.opens import OpenReports
from fuse.reader import Fetcher, FileReader, chunk_disk_cache
from fuse.state import MountState
from fuse.topups import TopUps

log = logging.getLogger("fabric.fuse")

#: Sibling readahead: when files of a directory are opened in order, fetch the next ones' chunks:
#: at most this many files ahead, and a window of bytes that starts at :data:`SIBLINGS_BYTES` and
#: doubles each time a reader opens a file of it whose chunks are still on their way (the window
#: did not cover the time the data takes to come), up to :data:`SIBLINGS_MAX_BYTES` (and a
#: quarter of the memory cache, which holds what is fetched ahead until it is read).
SIBLINGS_AHEAD = 512
SIBLINGS_BYTES = 16 * 1024 * 1024
SIBLINGS_MAX_BYTES = 64 * 1024 * 1024
#: An order is taken for a scan once this share of recent opens continued it (two in a row
#: from none): a random reader continues some order now and then by chance.
SCAN_SCORE = 0.4
#: Readers kept for an immutable mount (which reads by path).
READERS = 4096
#: Top-up hints (fuse/topups.py): after this many opens in a row, each further on in name
#: order than the one before and continuing no order (not next to an open before it), the
#: next :data:`TOPUP_FILES` files by name are named.
TOPUP_AFTER = 2
TOPUP_FILES = 256


class ReadPath:
    """Opens and reads of a mount; owns the chunk caches and the fetcher."""

    def __init__(self, state: MountState) -> None:
        self.state = state
        cfg = state.cfg
        disk = chunk_disk_cache(cfg.cache_dir, cfg.packs_budget) if cfg.cache_dir else None
        self.memory = BytesLRU(cfg.memory_cache)
        #: A mount beside its spoke reads the spoke's cache files and reports those reads to it.
        self.local_reads = LocalReadReports(state.plane.inner, state.repo) if cfg.spoke_cache else None
        spoke_files = SpokeFiles(cfg.spoke_cache, self.local_reads.read) if self.local_reads is not None else None
        self.fetcher = Fetcher(state.plane, self.memory, disk, cfg.fetch_workers, repo=state.repo, spoke_files=spoke_files)
        self.readers: OrderedDict[str, FileReader] = OrderedDict()
        self.readers_lock = threading.Lock()
        self.read_bytes = 0  # asked by the kernel (what its page cache lacked)
        #: A mount of a commit reading for a job tells the server of its opens (a branch mount asks anyway).
        self.opens = OpenReports(state.plane.inner, state.repo, state.commit_id) if state.immutable and cfg.job else None
        self.top_ups = TopUps(state.plane.inner, state.repo, state.commit_id if state.immutable else state.branch)
        #: Bytes sibling readahead keeps fetched ahead of a reader (see :data:`SIBLINGS_BYTES`).
        self.siblings_window = SIBLINGS_BYTES
        self._siblings_max = max(SIBLINGS_BYTES, min(SIBLINGS_MAX_BYTES, cfg.memory_cache // 4))

    def close(self) -> None:
        self.fetcher.close()
        if self.fetcher.disk is not None:
            self.fetcher.disk.close()
        if self.local_reads is not None:
            self.local_reads.close()
        if self.opens is not None:
            self.opens.close()
        self.top_ups.close()

    # -- entries -----------------------------------------------------------------------
    def fresh_file(self, p: str) -> Entry:
        """:meth:`fresh_entry` of a path that must be a file to be opened: ENOENT, EISDIR or EINVAL."""
        e = self.fresh_entry(p)
        if e is None:
            raise err(errno.ENOENT)
        if e.kind == DIR:
            raise err(errno.EISDIR)
        if e.kind != FILE:
            raise err(errno.EINVAL)
        return e

    def fresh_entry(self, p: str) -> Entry | None:
        """The current entry with its chunk list (branch: asked anew; commit: cached)."""
        st = self.state
        if st.immutable:
            e = st.ns.lookup(p)
            if e is not None and e.kind == FILE and e.chunklist and not e.chunks:
                e = st.plane.stat_chunks(st.repo, st.commit_id, p)
                st.ns.update(p, e)
            return e
        try:
            e = st.plane.stat_chunks(st.repo, st.branch, p)
        except NotFound:
            st.ns.update(p, None)
            return None
        cached = st.ns.lookup(p)
        if e.kind != DIR and (cached is None or cached.kind == DIR) and st.ns.has_below(st.branch, p):
            return cached or st.implicit  # a directory of the same name shadows it
        if cached is None or content_sig(cached) != content_sig(e) or cached.mode != e.mode or cached.uid != e.uid:
            st.ns.update(p, e)
        return e

    # -- opening -----------------------------------------------------------------------
    def open(self, p: str, fi: Any) -> None:
        """Open the current version of ``p`` for reading (a branch mount's file without local state)."""
        st = self.state
        e = self.fresh_file(p)
        sig = content_sig(e)
        old = st.kernel_sig.get(p)
        if old is not None and old != sig and st.handles.reading(p, old):
            # Handles of the old version are open and keep reading it from the page cache
            # (snapshot isolation): this one reads the new version around the cache.
            fi.direct_io = 1
        else:
            if old != sig or st.kernel_attrs.get(p) != sig:
                # The kernel may hold another version's size or pages (a listing may have told it
                # of a version other than the one whose pages it holds): drop them before this
                # open returns; it asks for the attributes again.
                invalidate_path(p)
            fi.keep_cache = 1 if old == sig else 0
            st.kernel_sig[p] = sig
            st.kernel_attrs[p] = sig
        fi.fh = st.handles.add(RHandle(e, FileReader(self.fetcher, e.chunks, st.cfg.readahead), p))
        self._prefetch_siblings(p)

    def _prefetch_siblings(self, p: str) -> None:
        """Files of one directory opened in order: fetch the next ones' chunks ahead, at most
        :data:`SIBLINGS_AHEAD` files and :attr:`siblings_window` bytes beyond the one opened.

        Two orders are followed: by name (``ls``, rsync, Python's ``sorted(os.listdir())``)
        and by inode number (GNU ``cp -r`` and ``tar`` sort a directory's entries by inode for
        fast reads on disk file systems; a path's number here is a hash of it). Each open
        scores each order by whether it continues it; only the order that has been
        continued most lately, and often enough (:data:`SCAN_SCORE`), is fetched along (a scan
        in one order, or random opens, continue an order now and then by chance)."""
        parent, name = split(p)
        d = self.state.ns.cached(parent)
        if d is None:
            return
        number = self.state.inodes.of
        orders = (d.order("name"), d.order("inode", lambda n: number(join(parent, n), d.children.get(n))))
        continued = [order for order in orders if order.opened(name)]
        best = max(orders, key=lambda order: order.score)
        if best in continued and best.score >= SCAN_SCORE:
            self._ahead_in(best, best.index[name], d)
        elif not continued and orders[0].forward >= TOPUP_AFTER:
            self._top_up(orders[0], orders[0].index[name], parent)

    def _ahead_in(self, order: SiblingOrder, i: int, d: Dir) -> None:
        """Keep the chunks of the files after position ``i`` of ``order`` fetched ahead; a
        reader that caught up with them (its file's chunks still on their way, or never asked
        for) doubles the window."""
        names = order.names
        opened = d.children.get(names[i])
        if order.prefetched_to >= 0 and opened is not None and opened.kind == FILE and opened.chunks:
            if i > order.prefetched_to or self.fetcher.loading(opened.chunks[-1][0]):
                self.siblings_window = min(2 * self.siblings_window, self._siblings_max)
        window = self.siblings_window
        ahead = names[i + 1 : order.prefetched_to + 1]
        size = self._bytes_of(ahead, d)
        if len(ahead) >= SIBLINGS_AHEAD // 2 or size >= window // 2:
            return  # still half a window ahead: the next request goes out when the reader gets closer
        chunks: list[tuple[bytes, int]] = []
        j = max(i + 1, order.prefetched_to + 1)
        while j < len(names) and j <= i + SIBLINGS_AHEAD and size < window:
            e = d.children.get(names[j])
            if e is not None and e.kind == FILE:
                chunks.extend(e.chunks)
                size += e.size
            j += 1
        order.prefetched_to = max(order.prefetched_to, j - 1)
        if chunks:
            self.fetcher.prefetch(chunks)

    def _top_up(self, order: SiblingOrder, i: int, parent: str) -> None:
        """A reader skipping forward through ``order`` opened position ``i``: name the files
        after it in a top-up hint, unless half of those named before are still ahead. Where
        the directory ends first, the hint goes on into the directories after it."""
        if order.topped_to - i > TOPUP_FILES // 2:
            return
        end = min(len(order.names), i + 1 + TOPUP_FILES)
        paths = [join(parent, n) for n in order.names[max(i + 1, order.topped_to + 1) : end]]
        order.topped_to = max(order.topped_to, end - 1)
        if end == len(order.names):
            paths += self._files_after(parent, TOPUP_FILES - (end - i - 1))
        self.top_ups.ahead(paths)

    def _files_after(self, d: str, budget: int) -> list[str]:
        """Up to ``budget`` files, by name, of the directories that follow ``d`` in its parent and
        are listed already: a reader going through a tree in name order (rsync, after its walk
        listed every directory) goes on there. None past the first directory not listed."""
        if not d or budget <= 0:
            return []
        up, name = split(d)
        listing = self.state.ns.cached(up)
        if listing is None:
            return []
        out: list[str] = []
        for sibling in sorted(n for n, e in list(listing.children.items()) if e.kind == DIR and n > name):
            path = join(up, sibling)
            below = self.state.ns.cached(path)
            if below is None:
                break
            out += (join(path, n) for n in below.order("name").names[: budget - len(out)])
            if len(out) >= budget:
                break
        return out

    @staticmethod
    def _bytes_of(names: list[str], d: Dir) -> int:
        return sum(e.size for e in (d.children.get(n) for n in names) if e is not None and e.kind == FILE)

    def _path_reader(self, p: str) -> FileReader:
        """Immutable mounts read by path (no open handles): one reader per recently read file."""
        r = self.readers.get(p)
        if r is not None:
            return r
        e = self.fresh_entry(p)
        if e is None:
            raise err(errno.ENOENT)
        if e.kind != FILE:
            raise err(errno.EISDIR if e.kind == DIR else errno.EINVAL)
        with self.readers_lock:
            r = self.readers.get(p)
            if r is None:
                r = self.readers[p] = FileReader(self.fetcher, e.chunks, self.state.cfg.readahead)
                while len(self.readers) > READERS:
                    self.readers.popitem(last=False)
        if self.opens is not None:
            self.opens.opened(p)  # an immutable mount's first read of a file is its open
        self._prefetch_siblings(p)
        return r

    # -- reading -----------------------------------------------------------------------
    def read(self, p: str | None, dst: memoryview, offset: int, fh: int) -> int:
        """Copy ``[offset, offset + len(dst))`` of the file open as ``fh`` (or of ``p``, on an
        immutable mount) into ``dst``; returns the bytes copied."""
        self.read_bytes += len(dst)
        h = self.state.handles.get(fh)
        if h is None and self.state.immutable and p is not None:
            return self._path_reader(p).read_into(dst, offset)
        if isinstance(h, RHandle):
            return h.reader.read_into(dst, offset)
        if isinstance(h, WHandle):
            wf = h.wf
            held = wf.hold_unless_staging()  # (a staging of it changes nothing this reads)
            try:
                if wf.fd is not None:
                    data = wf.read(offset, len(dst))
                    dst[: len(data)] = data
                    return len(data)
                base = wf.base
            finally:
                if held:
                    wf.lock.release()
            assert base is not None
            if h.reader is None or h.reader_base is not base:
                h.reader, h.reader_base = self.reader_for(base), base
            return h.reader.read_into(dst, offset)
        raise err(errno.EBADF)

    def reader_for(self, e: Entry) -> FileReader:
        """A reader of a staged or committed version (EIO if its chunk list is not at hand)."""
        if e.chunklist and not e.chunks:
            raise err(errno.EIO)
        return FileReader(self.fetcher, e.chunks, self.state.cfg.readahead)
