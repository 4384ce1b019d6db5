"""SpokePlane: the data plane of a spoke, a cache in front of a hub.

Reads (resolve, stat, list, log, diff, file bytes) are answered from the
local cache and fetched from the hub only when missing: metadata objects in
batches, chunks through the fetch scheduler. Writes and ref changes go to the
hub; writes asking ``local`` durability are queued on the spoke's disk and
pushed when the hub is reachable. Reads of a branch see the hub's staging
area and this spoke's queued writes.
"""

from __future__ import annotations

import bisect
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import BinaryIO

import httpx
from prometheus_client import CollectorRegistry

from fabric.api.peers import peer_request
from fabric.cache.disk import DiskCache
from fabric.cache.spoke_layout import chunk_dir
from fabric.client.bandwidth import Bandwidth, ThrottledTransport
from fabric.client.breaker import BreakerTransport, CircuitBreaker
from fabric.client.http import UPLOAD_PACK_SIZE, HttpPlane, Timeouts
from fabric.client.transport import HttpClientTransport
from fabric.engine.reader import Reader, View
from fabric.engine.refs import parse_ref
from fabric.engine.tree import Trees
from fabric.errors import BadRequest, ChunksMissing, Corruption, FabricError, NotFound, Unavailable
from fabric.format import frames, packs
from fabric.format.ingest import PackSession, file_entry, ingest_stream
from fabric.format.listing import Change, Listing, change_kind
from fabric.format.model import FILE, Commit, Entry, stored_ids
from fabric.format.paths import COMMIT_ID_RE, check_path, check_prefix, is_full_commit_id
from fabric.plane.dataplane import DataPlane
from fabric.plane.metrics import MetricsPlane
from fabric.plane.reads import HintedEntries
from fabric.util.progress import Progress

from .coherence import RefTracker, StagingCache
from .fetch import HINT, MEMORY_CACHE, READAHEAD, SERVE_WINDOW, FetchScheduler
from .hints import Lookahead, default_window
from .jobs import current_job
from .learned import PREFETCH_SHARE, LearnedPrefetch
from .membership import HubMembership, StaticMembership
from .metacache import SpokeMetaStore
from .mirrors import CAPACITY as MIRROR_CAPACITY
from .mirrors import MirrorStore
from .ownership import ChunkOwnership
from .peers import PEER_TIMEOUTS, GroupFetch
from .remember import Remembered
from .replicas import PROMOTE_AFTER, open_replicas
from .replication import Replication
from .seeds import BUDGET as SEED_COPIES_BUDGET
from .seeds import SpokeSeeds
from .state import SpokeState
from .topup import top_up_ids
from .traffic import PREFETCH, PUSH, CountingTransport, Traffic, current_purpose
from .workload import WorkloadStore
from .writeback import UPLOAD_HOLD, open_writeback

HUB = "hub"
LOCAL = "local"
#: Local, and a copy at one peer spoke of the group (:mod:`spoke.replication`).
REPLICATED = "replicated"
#: Writes queued at the spoke (pushed to the hub by the write-back).
QUEUED = (LOCAL, REPLICATED)
#: Share of the cache budget for metadata objects (ranges, commits, chunk lists).
META_SHARE = 0.1
#: How long answers about repositories and bucket bindings are reused without asking the hub.
ANSWER_TTL = 30.0
#: Name prefix of the metrics of calls to the hub: ``fabric_upstream_calls_total``, ``fabric_upstream_call_seconds``.
UPSTREAM_METRICS = "fabric_upstream"
#: How long a ``local`` write waits for room among the pinned chunks before CacheFull (507).
FULL_WAIT = 120.0
#: How long a call to the hub may wait: a hub that stays silent longer counts as unreachable (the
#: circuit breaker opens and reads are served as while it is down). ``fabric spoke --hub-timeout``.
HUB_TIMEOUTS = Timeouts(connect=5.0, read=10.0, write=60.0, pool=10.0, slow=300.0)


def _frame_intact(_chunk_id: bytes, frame: bytes) -> bool:
    """A cached frame is read back only if its checksum holds (its id was checked when it arrived)."""
    return frames.verify_checksum(frame)


class OverlayStaging:
    """Queued local writes on top of the hub's staging snapshot (a :class:`fabric.engine.reader.Staging`)."""

    def __init__(self, pending: dict[str, bytes | None], base) -> None:  # noqa: ANN001 - a Staging
        self.pending = pending
        self.base = base
        self._keys = sorted(pending)

    def entry(self, path: str) -> tuple[bool, bytes | None]:
        if path in self.pending:
            return True, self.pending[path]
        return self.base.entry(path)

    def between(self, start: str, end: str | None) -> Iterator[tuple[str, bytes | None]]:
        i = bisect.bisect_left(self._keys, start)
        mine = [k for k in self._keys[i:] if end is None or k < end]
        j = 0
        for path, enc in self.base.between(start, end):
            while j < len(mine) and mine[j] < path:
                yield mine[j], self.pending[mine[j]]
                j += 1
            if j < len(mine) and mine[j] == path:
                continue
            yield path, enc
        for k in mine[j:]:
            yield k, self.pending[k]


class SpokePlane(DataPlane):
    def __init__(
        self,
        hub_url: str,
        token: str | None,
        cache_dir: str,
        cache_size: int,
        lease: float = 10.0,
        durability: str = HUB,
        fetch_workers: int = 4,
        upload_hold: float = UPLOAD_HOLD,
        hub_timeouts: Timeouts = HUB_TIMEOUTS,
        memory_cache: int = MEMORY_CACHE,
        hint_window: int | None = None,
        prefetch_share: float = PREFETCH_SHARE,
        prefetch_window: int | None = None,
        group: str | None = None,
        peers: Sequence[str] = (),
        advertise: str | None = None,
        peer_timeouts: Timeouts = PEER_TIMEOUTS,
        full_wait: float = FULL_WAIT,
        replica_takeover: float = PROMOTE_AFTER,
        mirror_capacity: int = MIRROR_CAPACITY,
        seed_copies: str | None = None,
        seed_copies_size: int = SEED_COPIES_BUDGET,
        hub_bandwidth: Bandwidth | None = None,
    ) -> None:
        """``hub_bandwidth``: caps on the bytes a second sent to and received from the hub
        (:mod:`fabric.client.bandwidth`; the region's other traffic keeps the rest of the link).
        ``group``: join this spoke group at the hub; ``peers``: a fixed group of these
        spokes instead; either needs ``advertise``, the URL the other members reach this
        spoke at. Chunks are then fetched from their owner in the group (:mod:`spoke.peers`).
        ``memory_cache``: bytes of verified, decoded chunks kept in memory in front of the
        disk cache (:class:`spoke.fetch.FetchScheduler`).
        ``hint_window``: the most bytes fetched ahead of a hinting job's read position
        (default :func:`spoke.hints.default_window` of the chunk cache's budget).
        ``prefetch_share``: the share of the fetch workers learned (background) prefetch may
        keep busy (at least one; 0 turns learned prefetch off); ``prefetch_window``: the most
        bytes it fetches ahead of a job (default: half the chunk cache), once the job has shown
        it reads the learned working set; until then at most the hint window (:mod:`spoke.learned`).
        ``full_wait``: how long a ``local`` write waits for the write-back to free room in a
        cache full of writes not yet at the hub (back-pressure) before it fails (0: at once).
        ``replica_takeover``: how long the origin of copies kept here (:mod:`spoke.replicas`), or a
        mount whose parked files are kept here (:mod:`spoke.mirrors`), may be silent before this
        spoke pushes its writes to the hub. ``mirror_capacity``: the most bytes of such mounts'
        files kept here at once (beyond, a mount stages its file inline). ``seed_copies``: a
        directory where plain copies of the files written here are left, within
        ``seed_copies_size`` bytes, for ``--passthrough`` mounts beside this spoke
        (:mod:`spoke.seeds`)."""
        if not 0 <= prefetch_share <= 1:
            raise BadRequest(f"the prefetch share is a fraction of the fetch workers, 0 to 1, not {prefetch_share}")
        if durability not in (HUB, *QUEUED):
            raise BadRequest(f"unknown durability {durability!r}: use 'hub', 'local' or 'replicated'")
        if durability == REPLICATED and advertise is None:
            raise BadRequest("durability 'replicated' needs a spoke group (group or peers) to keep the copies")
        if group is not None and peers:
            raise BadRequest("a spoke is in a group registered at the hub (group) or in a fixed list (peers), not both")
        if (group is not None or bool(peers)) != (advertise is not None):
            raise BadRequest("a spoke in a group needs the URL its peers reach it at (advertise), and only then")
        if not 0 <= full_wait <= 3600:
            raise BadRequest(f"the full wait is 0 to 3600 seconds, not {full_wait}")
        self.full_wait = full_wait
        self.traffic = Traffic()
        #: Bytes to and from the other spokes of the group (the LAN), apart from the hub's.
        self.peer_traffic = Traffic("peer")
        #: Calls to the hub by operation and outcome, with their latency (for the spoke's /metrics).
        self.upstream_metrics = CollectorRegistry()
        #: Shared by every call to the hub: once one times out, the others fail fast (``Unavailable``)
        #: and take the "hub is away" path, until a probe gets an answer.
        self.breaker = CircuitBreaker()
        transport: httpx.BaseTransport = BreakerTransport(self.breaker, CountingTransport(self.traffic, HttpClientTransport(retries=1)))
        if hub_bandwidth:  # prefetch gives way to the other calls within the cap
            transport = ThrottledTransport(transport, hub_bandwidth, background=lambda: current_purpose() == PREFETCH)
        hub = HttpPlane(hub_url, token, hub_timeouts, transport)
        # How the hub's console names this spoke (hub/watch.py, SPOKE_HEADER).
        hub.http.headers["X-Fabric-Spoke"] = advertise or socket.gethostname()
        self.upstream = MetricsPlane(hub, self.upstream_metrics, UPSTREAM_METRICS)
        os.makedirs(cache_dir, exist_ok=True)
        self.writeback = open_writeback(cache_dir, upload_hold)
        self.replicas = open_replicas(cache_dir, replica_takeover)  # copies of other spokes' replicated writes
        self.mirrors = MirrorStore(os.path.join(cache_dir, "mirrors"), mirror_capacity, replica_takeover)  # other machines' parked files
        meta_budget = max(1 << 20, int(cache_size * META_SHARE))
        self.chunk_cache = DiskCache(
            chunk_dir(cache_dir),
            cache_size - meta_budget,
            _frame_intact,
            self.writeback.pinned_chunks() | self.replicas.pinned_chunks(),
        )
        self.meta_cache = DiskCache(os.path.join(cache_dir, "meta"), meta_budget)
        self.meta = SpokeMetaStore(self.meta_cache, self.upstream.get_objects, self.traffic)
        self.trees = Trees(self.meta)
        self.membership: HubMembership | StaticMembership | None = None
        if group is not None and advertise is not None:
            beats = BreakerTransport(self.breaker, CountingTransport(self.traffic, httpx.HTTPTransport()))
            self.membership = HubMembership(advertise, group, hub_url, token, self.traffic, beats, hub_timeouts.connect)
        elif advertise is not None:
            self.membership = StaticMembership(advertise, list(peers))
        self.group = None
        self.replication: Replication | None = None
        if self.membership is not None:
            self.group = GroupFetch(self.membership, self.upstream.frames, token, self.peer_traffic, peer_timeouts)
            self.replication = Replication(self.membership, token, self.chunk_cache, self.peer_traffic)
        self.fetcher = FetchScheduler(
            self.upstream.frames, self.chunk_cache, self.traffic, fetch_workers, background_workers=int(prefetch_share * fetch_workers),
            group_frames=self.group.fetch if self.group is not None else None,  # from the owners; prefetch fills their caches
            memory=memory_cache,
        )
        self.reader = Reader(self.meta, self.trees, self.fetcher.read)
        #: Plain copies of the files written here, for passthrough mounts beside it (--seed-copies).
        self.seeds = (SpokeSeeds(seed_copies, seed_copies_size, self.reader.read_entry, self._holds_every_chunk)
                      if seed_copies else None)
        self.hinted = HintedEntries()  # a job's next epoch hints the same files
        window = default_window(self.chunk_cache.budget) if hint_window is None else hint_window
        if not 0 <= window <= self.chunk_cache.budget // 2:
            raise BadRequest(f"the hint window must be 0 to half the chunk cache ({self.chunk_cache.budget // 2} bytes), not {window}")
        self.lookahead = Lookahead(
            self.fetcher, self.reader.chunk_lists, window, lambda name, ids: self.chunk_cache.plan(ids, name), self.chunk_cache.__contains__
        )
        learned_window = self.chunk_cache.budget // 2 if prefetch_window is None else prefetch_window
        if not 0 <= learned_window <= self.chunk_cache.budget // 2:
            raise BadRequest(f"the prefetch window must be 0 to half the chunk cache ({self.chunk_cache.budget // 2} bytes), not {learned_window}")
        self.learned = LearnedPrefetch(
            WorkloadStore(cache_dir), self._resolver, self.fetcher, self.chunk_cache, learned_window, prefetch_share > 0,
            hinted=self.lookahead.hinting, first_window=window,
        )
        self.state = SpokeState(cache_dir)
        self.tracker = RefTracker(self.upstream, self.traffic, self.state, lease)
        self.staging = StagingCache(self.upstream, self.tracker, self.traffic, self.state)
        self.ownership = ChunkOwnership(lambda repo, ids: self.upstream.missing_chunks(ids, HUB, repo=repo))
        self.durability = durability
        self._answers = Remembered(ANSWER_TTL)
        self.local_reads = 0  # chunks mounts beside this spoke read from its cache files
        self._lock = threading.Lock()
        self.tracker.start()
        self.writeback.start(self.chunk_cache, self.upstream, self.traffic, self._landed)
        self.replicas.start(self.chunk_cache, self.writeback.enqueue, self.writeback.pinned_chunks)
        self.mirrors.start(self._stage_mirrored)

    def _landed(self, repo: str, branch: str, changes: dict[str, Entry | None], seq: int | None) -> None:
        """A batch of queued writes is staged at the hub."""
        self.staging.add_own(repo, branch, changes, seq)
        if self.replication is not None:
            self.replication.landed(repo, branch, changes)

    def close(self) -> None:
        if self.membership is not None:
            self.membership.close()
        if self.group is not None:
            self.group.close()
        if self.replication is not None:
            self.replication.close()
        self.tracker.stop()
        self.writeback.stop()
        self.replicas.stop()
        self.mirrors.stop()
        if self.seeds is not None:
            self.seeds.close()
        self.lookahead.stop()
        self.learned.close()
        self.fetcher.stop()
        self.upstream.close()

    # -- views ---------------------------------------------------------------
    def view(self, repo: str, ref: str) -> tuple[View, bool]:
        """What a read of ``repo@ref`` sees now, and whether it may be stale (hub away)."""
        expr = parse_ref(ref)
        # A full commit id names immutable data: no ref lookup, so it is served while the hub is away
        # (branch names cannot look like one). A branch the hub cannot be asked about may be a known tag.
        full_id = is_full_commit_id(expr.base)
        try:
            commit, stale = (None, False) if full_id else self.tracker.ref(repo, "branch", expr.base)
        except Unavailable:
            commit, stale = None, True
        branch, staging = None, None
        if commit is not None and expr.plain:
            # Queued writes first: one that lands meanwhile is in the staging snapshot fetched next.
            pending = self.writeback.pending(repo, expr.base)
            snap, snap_stale = self.staging.get(repo, expr.base, commit)
            commit, stale, branch = snap.head, stale or snap_stale, expr.base
            staging = OverlayStaging(pending, snap)
        elif commit is None:
            if not full_id:
                commit, stale = self.tracker.ref(repo, "tag", expr.base)
            if commit is None:
                commit = self._commit_id(repo, expr.base)
        for _ in range(expr.ancestors):
            parents = self.reader.get_commit(commit).parents
            if not parents:
                raise NotFound(f"{ref!r} goes back past the first commit of {repo!r}")
            commit = parents[0]
        return View(repo, commit, self.reader.get_commit(commit).tree, branch, staging), stale

    def _commit_id(self, repo: str, text: str) -> str:
        if not COMMIT_ID_RE.match(text):
            raise NotFound(f"no branch, tag or commit {text!r} in repository {repo!r}")
        if len(text) == 64:
            if not self.state.has_commit(repo, text):
                # Commit objects are shared by every repository: only the hub knows whether this one
                # is in ``repo`` (a role on one repository must not open another's commits).
                self.upstream.resolve_commit(repo, text)
                self.state.add_commit(repo, text)
            self.reader.get_commit(text)
            return text
        return self.upstream.resolve_commit(repo, text)

    def is_stale(self, repo: str, ref: str) -> bool:
        return self.view(repo, ref)[1]

    # -- repositories --------------------------------------------------------
    def create_repo(self, name: str, default_branch: str = "main", owner: str | None = None) -> dict:
        """``owner``: the caller's token id, forwarded to the hub (which makes the caller own it)."""
        info = self.upstream.create_repo(name, default_branch, owner=owner)
        self._answers.forget(("repos",))
        return info

    def get_repo(self, name: str) -> dict:
        return self._answers.get(("repo", name), lambda: self.upstream.get_repo(name))

    def list_repos(self) -> list[dict]:
        return self._answers.get(("repos",), self.upstream.list_repos)

    def delete_repo(self, name: str) -> None:
        self.upstream.delete_repo(name)
        self._answers.forget(("repo", name))
        self._answers.forget(("repos",))

    # -- refs (changes go to the hub) -----------------------------------------
    def resolve_commit(self, repo: str, ref: str) -> str:
        return self.view(repo, ref)[0].commit_id

    def list_branches(self, repo: str) -> list[dict]:
        return self._refs_or_known(repo, "branch", self.upstream.list_branches)

    def _refs_or_known(self, repo: str, kind: str, fetch: Callable[[str], list[dict]]) -> list[dict]:
        """The hub's list of refs; while it is away, the refs this spoke last saw of a repository it knows."""
        try:
            return fetch(repo)
        except Unavailable:
            if not self.tracker.known(repo, "branch"):
                raise
            return self.tracker.known(repo, kind)

    def create_branch(self, repo: str, name: str, source: str) -> dict:
        info = self.upstream.create_branch(repo, name, source)
        self.tracker.note(repo, "branch", name, info["commit_id"])
        return info

    def delete_branch(self, repo: str, name: str) -> None:
        self.upstream.delete_branch(repo, name)
        self.tracker.note(repo, "branch", name, None)

    def reset_branch(self, repo: str, name: str, ref: str) -> dict:
        with self.writeback.discarding(repo, name):  # queued writes are uncommitted changes too
            info = self.upstream.reset_branch(repo, name, ref)
        self._moved(repo, name, info["commit_id"])
        return info

    def list_tags(self, repo: str) -> list[dict]:
        return self._refs_or_known(repo, "tag", self.upstream.list_tags)

    def create_tag(self, repo: str, name: str, ref: str) -> dict:
        info = self.upstream.create_tag(repo, name, ref)
        self.tracker.note(repo, "tag", name, info["commit_id"])
        return info

    def delete_tag(self, repo: str, name: str) -> None:
        self.upstream.delete_tag(repo, name)
        self.tracker.note(repo, "tag", name, None)

    def _moved(self, repo: str, branch: str, commit: str) -> None:
        self.tracker.note(repo, "branch", branch, commit)
        self.staging.invalidate(repo, branch)

    # -- commits -------------------------------------------------------------
    def get_commit(self, repo: str, commit_id: str) -> Commit:
        return self.reader.get_commit(commit_id)

    def log(self, repo: str, ref: str, path: str | None = None, limit: int = 100, after: str | None = None) -> list[Commit]:
        if path:
            check_path(path.rstrip("/"))
        return self.reader.log(self.view(repo, ref)[0].commit_id, path, limit, after)

    def commit(
        self,
        repo: str,
        branch: str,
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        self.writeback.flush(repo, branch)  # queued writes land before the commit that should hold them
        c = self.upstream.commit(repo, branch, message, author, meta, expected_head, allow_empty)
        self._moved(repo, branch, c.id)
        return c

    def commit_changes(
        self,
        repo: str,
        branch: str,
        changes: Mapping[str, Entry | None],
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        with self.traffic.purpose(PUSH):
            c = self.upstream.commit_changes(repo, branch, changes, message, author, meta, expected_head, allow_empty)
        self._moved(repo, branch, c.id)
        return c

    def diff(self, repo: str, left: str, right: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        check_prefix(prefix)
        ltree, rtree = self.view(repo, left)[0].tree, self.view(repo, right)[0].tree
        for path, a, b in self.trees.diff(ltree, rtree, prefix, after):
            yield Change(path, change_kind(a, b), a, b)

    def uncommitted(self, repo: str, branch: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        return self.upstream.uncommitted(repo, branch, prefix, after)

    def merge(
        self, repo: str, source: str, dest: str, strategy: str | None = None, message: str | None = None, author: str | None = None
    ) -> Commit:
        c = self.upstream.merge(repo, source, dest, strategy, message, author)
        self._moved(repo, dest, c.id)
        return c

    def revert(self, repo: str, branch: str, commit_ref: str, parent: int = 1, author: str | None = None) -> Commit:
        c = self.upstream.revert(repo, branch, commit_ref, parent, author)
        self._moved(repo, branch, c.id)
        return c

    # -- reading -------------------------------------------------------------
    def stat(self, repo: str, ref: str, path: str) -> Entry:
        check_path(path)
        entry = self.reader.stat(self.view(repo, ref)[0], path)
        if entry is None:
            raise NotFound(f"{path!r} not found in {repo}@{ref}")
        return entry

    def stat_chunks(self, repo: str, ref: str, path: str) -> Entry:
        entry = self.stat(repo, ref, path)
        if entry.chunklist:
            entry = entry.with_(chunks=self.reader.chunk_list(entry), chunklist=None)
        if entry.kind == FILE:  # a file of repo uses chunks of repo: its reader will fetch them
            self.ownership.learn(repo, stored_ids(entry.chunks))
            self.learned.opened(repo, ref, path, entry.size)
        return entry

    def _resolver(self, repo: str, ref: str) -> Callable[[str], tuple[int, list[bytes]] | None]:
        """For learned prefetch: a path of ``repo@ref`` (as seen now) -> its size and stored chunk ids."""
        view = self.view(repo, ref)[0]

        def resolve(path: str) -> tuple[int, list[bytes]] | None:
            entry = self.reader.stat(view, path)
            if entry is None or entry.kind != FILE:
                return None
            return entry.size, list(stored_ids(self.reader.chunk_list(entry)))

        return resolve

    def hint(self, repo: str, ref: str, paths: Sequence[str], job: str, append: bool = False, top_up: bool = False) -> dict:
        """Check the hint whole (every path a file at ``ref``), then make it ``job``'s order in
        ``repo``: chunks are fetched ahead of the job's reads (:mod:`spoke.hints`). A top-up
        fetches the chunks this spoke lacks of the files it holds in part (:mod:`spoke.topup`)."""
        view = self.view(repo, ref)[0]
        entries = self.hinted.check(repo, ref, paths, job, lambda path: self.reader.stat(view, path), view.fixed_tree)
        if top_up:
            ids, _ = top_up_ids(list(entries.values()), self.reader.chunk_lists, self.chunk_cache.__contains__, self.lookahead.window_bytes)
            self.fetcher.prefetch(ids, HINT, job=job, kind="hint")
        else:
            self.lookahead.hint(job, repo, [entries[p] for p in paths], append)
        total = sum(entries[p].size for p in paths)
        return {"job": job, "paths": len(paths), "bytes": total, "window_bytes": self.lookahead.window_bytes}

    def list(self, repo: str, ref: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> Listing:
        check_prefix(prefix)
        if delimiter not in ("", "/"):
            raise BadRequest("only '/' is supported as a delimiter")
        if limit < 1:
            raise BadRequest("limit must be at least 1")
        return self.reader.list_view(self.view(repo, ref)[0], prefix, delimiter, after, limit)

    def read_stream(self, repo: str, ref: str, path: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        return self.open_file(repo, ref, path, None, offset, length)

    def open_file(
        self, repo: str, ref: str, path: str, entry: Entry | None = None, offset: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        if entry is None or (entry.kind == FILE and not entry.chunks and not entry.chunklist and entry.size):
            entry = self.stat(repo, ref, path)
        if entry.kind != FILE:
            raise BadRequest(f"{path!r} in {repo}@{ref} is a {entry.kind}, not a file")
        job = current_job()
        self.learned.opened(repo, ref, path, entry.size)

        def readahead(ids: list[bytes]) -> None:
            self.fetcher.prefetch(ids, READAHEAD, job=job)  # what this spoke lacks, from the hub
            self.fetcher.will_read(ids)  # what it holds, from its disk

        return self.reader.read_entry(entry, offset, length, readahead=readahead)

    # -- writing -------------------------------------------------------------
    def _durability(self, asked: str | None) -> str:
        mode = asked or self.durability
        if mode not in (HUB, *QUEUED):
            raise BadRequest(f"unknown durability {mode!r}: use 'hub', 'local' or 'replicated'")
        if mode == REPLICATED and self.replication is None:
            raise BadRequest("durability 'replicated' needs a spoke in a group (--group or --peers): this spoke is in none")
        return mode

    def _queue(self, repo: str, branch: str, changes: dict[str, Entry | None], mode: str) -> None:
        """Queue writes for the hub (their chunks pinned here); with ``replicated``, once a
        peer spoke keeps copies of them too."""
        if mode == REPLICATED:
            assert self.replication is not None
            self.replication.send_entries(repo, branch, changes)
        self.writeback.enqueue(repo, branch, changes)
        self._written(changes)

    def _holds_every_chunk(self, entry: Entry) -> bool:
        """Whether this spoke's cache holds every chunk of a file entry (its list inline)."""
        ids = stored_ids(entry.chunks)
        return bool(entry.chunks) and all(cid in self.chunk_cache for cid in ids)

    def _written(self, changes: Mapping[str, Entry | None]) -> None:
        """Files were written through this spoke (queued or staged at the hub)."""
        if self.seeds is not None:
            self.seeds.written(changes)

    def put_object(
        self,
        repo: str,
        branch: str,
        path: str,
        stream: BinaryIO,
        mode: int = 0o644,
        mtime_ns: int | None = None,
        meta: Mapping[str, str] | None = None,
        durability: str | None = None,
    ) -> Entry:
        check_path(path)
        level = self._durability(durability)
        if level in QUEUED:
            self._require_branch(repo, branch)
            sink = PackSession(lambda ids: list(ids), lambda b: self._pin_pack(repo, b), UPLOAD_PACK_SIZE)
            chunks, md5 = ingest_stream(stream, sink)
            sink.close()
            entry = file_entry(chunks, md5, mode, mtime_ns if mtime_ns is not None else time.time_ns(), meta)
            self._queue(repo, branch, {path: entry}, level)
            return entry
        try:
            with self.traffic.purpose(PUSH):
                sink = self._hub_sink(repo)
                chunks, md5 = ingest_stream(stream, sink)
                sink.close()
                entry = file_entry(chunks, md5, mode, mtime_ns if mtime_ns is not None else time.time_ns(), meta)
                self.upstream.stage(repo, branch, {path: entry})
            self._written({path: entry})
        except Unavailable as exc:
            raise Unavailable(
                f"the hub is unreachable and this write asked for hub durability ({exc.message}); "
                "retry later, or write with durability 'local' to queue it at the spoke"
            ) from exc
        self.staging.invalidate(repo, branch)
        return entry

    def _stage_mirrored(self, repo: str, branch: str, path: str, data: BinaryIO, mode: int, mtime_ns: int, meta: Mapping[str, str]) -> bool:
        """A parked file of a mount that was lost (:mod:`spoke.mirrors`), queued here for the
        hub; False, and nothing written, when the branch holds a version of the path as new or
        newer by its mtime (the mount staged a later version itself: both times are its clock's)."""
        try:
            current: Entry | None = self.stat(repo, branch, path)
        except NotFound:
            current = None
        if current is not None and current.kind == FILE and current.mtime_ns >= mtime_ns:
            return False
        self.put_object(repo, branch, path, data, mode, mtime_ns, meta, durability=LOCAL)
        return True

    def _require_branch(self, repo: str, branch: str) -> None:
        commit, _ = self.tracker.ref(repo, "branch", branch)
        if commit is None:
            raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")

    def _pin_pack(self, repo: str, builder: packs.PackBuilder) -> None:
        self._pin_frames(repo, builder.finish(), builder.chunks)

    def _pin_frames(self, repo: str, pack: bytes, chunks: Sequence[packs.PackedChunk]) -> int:
        """Keep a pack's frames (chunks of ``repo``) pinned (and on disk for good) in the cache
        until the queued writes that use them reach the hub, and start sending them there as
        soon as they are written, while the cache makes them durable (a push of chunks the
        spoke then fails to keep is harmless: the client is not answered and sends them
        again); how many were new here."""
        return self._pin(repo, pack, chunks, written=lambda: self.writeback.send_early(repo, [c.id for c in chunks]))

    def _pin(
        self, repo: str, pack: bytes, chunks: Sequence[packs.PackedChunk], written: Callable[[], None] | None = None
    ) -> int:
        """Pin a verified pack's frames as chunks of ``repo``, waiting up to ``full_wait`` for
        room; how many were new here. ``written``: as for :meth:`DiskCache.put_pinned`."""
        new = self.chunk_cache.put_pinned(
            ((c.id, pack[c.offset : c.offset + c.length]) for c in chunks), wait=self.full_wait, written=written
        )
        self.ownership.learn(repo, (c.id for c in chunks))
        return new

    def _cache_pack(self, repo: str | None, builder: packs.PackBuilder) -> None:
        data = builder.finish()
        self.upstream.receive_pack(data, repo=repo)
        if repo is not None:
            self.ownership.learn(repo, (c.id for c in builder.chunks))
        for c in builder.chunks:
            self.chunk_cache.put(c.id, data[c.offset : c.offset + c.length])

    def stage(
        self, repo: str, branch: str, changes: Mapping[str, Entry | None], durability: str | None = None
    ) -> int | None:
        level = self._durability(durability)
        if level in QUEUED:
            for path in changes:
                check_path(path)
            self._require_branch(repo, branch)
            self._hold_chunks(repo, branch, changes)
            self._queue(repo, branch, dict(changes), level)
            return None
        seq = self.upstream.stage(repo, branch, changes, HUB)
        self.staging.add_own(repo, branch, changes, seq)
        self._written(changes)
        return seq

    def _hold_chunks(self, repo: str, branch: str, changes: Mapping[str, Entry | None]) -> None:
        """Pin the chunks that queued entries need until they reach the hub.

        A chunk must be a chunk of ``repo``: known here as one and in this cache
        (uploaded here for ``repo``), or already used at one of the paths changed (a
        chmod, a rename), or the hub must say it has it for ``repo``. BadRequest when
        nobody has it (the write would be lost), and then nothing is pinned."""
        needed = {cid for e in changes.values() if e is not None and e.kind == FILE for cid in stored_ids(e.chunks)}
        foreign = set(self.ownership.unknown(repo, needed))
        unknown = [cid for cid in needed if cid in foreign or cid not in self.chunk_cache]
        if unknown:
            in_use = self._chunks_at(repo, branch, changes)
            unknown = [cid for cid in unknown if cid not in in_use]
        if unknown:
            try:
                lost = self.upstream.missing_chunks(unknown, HUB, repo=repo)
            except Unavailable as exc:
                raise Unavailable(
                    f"{len(unknown)} chunk(s) of this write are neither in the spoke's cache nor known to be at the hub, "
                    f"which cannot be asked now ({exc.message}); upload them to the spoke first"
                ) from exc
            if lost:
                raise ChunksMissing(
                    f"chunk {lost[0].hex()} ({len(lost)} in all) is not stored for repository {repo!r}: "
                    "upload it before staging entries that use it",
                    (cid.hex() for cid in lost),
                )
            self.ownership.learn(repo, unknown)
        for cid in needed:
            self.chunk_cache.pin(cid)  # one evicted meanwhile was at the hub (only pinned blobs are not)

    def _chunks_at(self, repo: str, branch: str, paths: Iterable[str]) -> set[bytes]:
        """Chunk ids of the files now at ``paths`` on the branch (those this spoke can see)."""
        view = self.view(repo, branch)[0]
        out: set[bytes] = set()
        for path in paths:
            try:
                current = self.reader.stat(view, path)
                if current is not None and current.kind == FILE:
                    out.update(cid for cid, _ in self.reader.chunk_list(current))
            except Unavailable:
                continue
        return out

    def delete_object(self, repo: str, branch: str, path: str, durability: str | None = None) -> None:
        check_path(path)
        level = self._durability(durability)
        if level in QUEUED:
            self.stat(repo, branch, path)  # NotFound if absent
            self._queue(repo, branch, {path: None}, level)
            return
        self.upstream.delete_object(repo, branch, path, HUB)
        self.staging.invalidate(repo, branch)

    def discard(self, repo: str, branch: str) -> None:
        with self.writeback.discarding(repo, branch):  # queued writes are uncommitted changes too
            self.upstream.discard(repo, branch)
        self.staging.invalidate(repo, branch)

    # -- chunk exchange ------------------------------------------------------
    def missing_chunks(
        self, ids: Sequence[bytes], durability: str | None = None, repo: str | None = None
    ) -> list[bytes]:
        if self._durability(durability) in QUEUED:
            foreign = set(self.ownership.unknown(repo, ids)) if repo is not None else set()
            return [cid for cid in dict.fromkeys(ids) if cid in foreign or cid not in self.chunk_cache]
        return self.upstream.missing_chunks(ids, HUB, repo=repo)

    def receive_pack(self, data: bytes, durability: str | None = None, repo: str | None = None) -> tuple[int, int]:
        level = self._durability(durability)
        if level in QUEUED:
            if repo is None:
                raise BadRequest(f"a pack kept at the spoke (durability {level!r}) must name its repository (?repo=)")
            chunks = packs.verify_pack(data)  # whole, before anything is kept
            new = self._pin_frames(repo, data, chunks)
            if level == REPLICATED:
                assert self.replication is not None
                self.replication.send_pack(repo, data)
            return len(chunks), new
        result = self.upstream.receive_pack(data, HUB, repo=repo)
        if repo is not None:
            self.ownership.learn(repo, (c.id for c in packs.parse_index(data)))  # the hub verified it
        return result

    # -- copies of other spokes' replicated writes (spoke/replicas.py) --------
    def keep_replica_pack(self, repo: str, data: bytes) -> tuple[int, int]:
        """Pin a pack of another spoke's replicated write (not sent to the hub: its origin does)."""
        chunks = packs.verify_pack(data)
        new = self._pin(repo, data, chunks)
        self.replicas.hold_pack([c.id for c in chunks])
        return len(chunks), new

    def keep_replica_entries(self, origin: str, repo: str, branch: str, changes: Mapping[str, Entry | None]) -> None:
        """Keep copies of another spoke's writes; BadRequest (nothing kept) if a chunk they need is not here."""
        for path in changes:
            check_path(path)
        needed = {cid for e in changes.values() if e is not None and e.kind == FILE for cid in stored_ids(e.chunks)}
        lacking = self.missing_chunks(list(needed), LOCAL, repo=repo)
        if lacking:
            raise BadRequest(f"chunk {lacking[0].hex()} ({len(lacking)} in all) of these copies is not here: send it first")
        for cid in needed:
            self.chunk_cache.pin(cid)
        self.replicas.add(origin, repo, branch, changes)

    def replica_landed(self, origin: str, repo: str, branch: str, changes: Mapping[str, Entry | None]) -> None:
        self.replicas.release(self.replicas.landed(origin, repo, branch, changes))

    def frames(self, ids: Sequence[bytes], repo: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        if repo is not None:
            self.ownership.require(repo, ids)
        ids = list(ids)
        if self.group is not None and peer_request():
            self.group.asked_by_peer(len(ids))
            return self._peer_frames(ids)
        return self.fetcher.frames_for(ids, current_job())

    def _peer_frames(self, ids: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """Frames for a peer of the group: what this spoke lacks comes from its hub (never a
        third spoke), fetched in this thread a window at a time (:mod:`spoke.peers`)."""
        for i in range(0, len(ids), SERVE_WINDOW):
            window = ids[i : i + SERVE_WINDOW]
            self.fetcher.fetch_here(window, self.upstream.frames)
            yield from self.fetcher.frames_for(window)

    def share_chunks(self, source_repo: str, repo: str, ids: Sequence[bytes]) -> None:
        self.upstream.share_chunks(source_repo, repo, ids)
        self.ownership.learn(repo, ids)

    def chunk_sink(self, repo: str | None = None) -> PackSession:
        """Chunks of this process's own writers (the S3 gateway), kept at the spoke's durability:
        at ``local`` and ``replicated`` pinned here (those not here yet) and sent on to the hub
        early, as chunks uploaded to the spoke are; at ``hub`` sent to the hub (only those it
        lacks, for ``repo``) and cached here."""
        level = self._durability(None)
        if repo is not None and level in QUEUED:
            return PackSession(lambda ids: self.missing_chunks(ids, level, repo), lambda b: self._pin_pack(repo, b), UPLOAD_PACK_SIZE)
        return self._hub_sink(repo)

    def _hub_sink(self, repo: str | None) -> PackSession:
        """New chunks go to the hub (only those it lacks, for ``repo``) and into this spoke's cache."""
        return PackSession(
            lambda ids: self.upstream.missing_chunks(ids, repo=repo),
            lambda b: self._cache_pack(repo, b),
            UPLOAD_PACK_SIZE,
        )

    def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        self.meta.prefetch(b"", [oid for oid in ids])
        out = {}
        for oid in ids:
            try:
                out[oid] = self.meta.raw(oid)
            except FabricError:
                continue
        return out

    def staging_snapshot(self, repo: str, branch: str, since_seq: int = 0) -> tuple[str, int, list[tuple[str, bytes | None]]]:
        return self.upstream.staging_snapshot(repo, branch, since_seq)

    # -- bucket bindings (kept at the hub) ------------------------------------
    def list_buckets(self) -> list[dict]:
        return self.upstream.list_buckets()

    def get_bucket(self, name: str) -> dict:
        def fetch() -> dict | None:
            try:
                return self.upstream.get_bucket(name)
            except NotFound:
                return None  # remembered as well: while the hub is away, an unbound name stays unbound

        info = self._answers.get(("bucket", name), fetch)
        if info is None:
            raise NotFound(f"no bucket is bound to the name {name!r}")
        return info

    def create_bucket(
        self, name: str, repo: str, ref: str, created_by_s3: bool = False, owner: str | None = None
    ) -> dict:
        """``owner``: the caller's token id, forwarded to the hub (which checks the caller's role)."""
        info = self.upstream.create_bucket(name, repo, ref, created_by_s3, owner=owner)
        self._answers.forget(("bucket", name))
        return info

    def delete_bucket(self, name: str) -> None:
        self.upstream.delete_bucket(name)
        self._answers.forget(("bucket", name))

    # -- administration ------------------------------------------------------
    def read_locally(self, ids: list[bytes]) -> None:
        """A client beside this spoke read these chunks from its cache files: reads of the cache
        (recency, plans, hits, the job's lookahead and figures), as if it had served them
        (spoke/local_reads_api.py)."""
        self.fetcher.read_beside(ids, current_job())
        with self._lock:
            self.local_reads += len(ids)

    def stats(self) -> dict:
        chunk, meta = self.chunk_cache.stats(), self.meta_cache.stats()
        breaker = self.breaker.state()
        return {
            "role": "spoke",
            **self.traffic.snapshot(),
            **self.peer_traffic.snapshot(),
            "group": None if self.group is None else {**self.membership.describe(), **self.group.stats()},
            "cache_bytes": chunk["cache_bytes"] + meta["cache_bytes"],
            "cache_budget_bytes": chunk["cache_budget_bytes"] + meta["cache_budget_bytes"],
            "cache_chunk_bytes": chunk["cache_bytes"],
            "cache_meta_bytes": meta["cache_bytes"],
            "cache_pinned_bytes": chunk["cache_pinned_bytes"],
            "cache_evictions": chunk["cache_evictions"] + meta["cache_evictions"],
            "cache_corruptions": chunk["cache_corruptions"] + meta["cache_corruptions"],
            "cache_files_reused": chunk["cache_files_reused"] + meta["cache_files_reused"],
            "cache_refetched": self.fetcher.refetched,
            "cache_hit_bytes": self.fetcher.hit_bytes,
            "cache_miss_bytes": self.fetcher.miss_bytes,
            "cache_local_reads": self.local_reads,
            "hint_window_bytes": self.lookahead.window_bytes,
            "prefetch": self.fetcher.prefetch_stats.snapshot(),
            "jobs": self.fetcher.jobs.snapshot(),
            "learned_prefetch": {**self.learned.stats(), "background_in_flight_max": self.fetcher.background_busy_max},
            "writeback_pending": self.writeback.count(),
            "writeback_landed": self.writeback.landed,
            "writeback_early_chunks": self.writeback.early_sent,
            **self.writeback.stats(),
            **self.replicas.stats(),
            **self.mirrors.stats(),
            **(self.seeds.stats() if self.seeds is not None else {}),
            "replication_copied_bytes": self.replication.copied_bytes if self.replication is not None else 0,
            "watch_stream_live": self.tracker.live(),
            "watch_events": self.tracker.events,
            "hub_reachable": breaker["reachable"],
            "hub_breaker_open_since": breaker["open_since"],
            "hub_breaker_trips": breaker["trips"],
            "hub_breaker_last_error": breaker["last_error"],
        }

    def fsck(self, deep: bool = True, progress: Progress | None = None) -> dict:
        """Verify the spoke's cache: every cached frame against its checksum and id."""
        problems = []
        checked = 0
        for key in self.chunk_cache.keys():
            try:
                frame = self.chunk_cache.scrub(key)
            except Corruption:
                problems.append(f"cached chunk {key.hex()} was corrupt and has been dropped")
                continue
            if frame is None:
                continue  # evicted (or rewritten) since the listing: nothing to check
            checked += 1
            try:
                frames.decode(frame, key)
            except FabricError as exc:
                self.chunk_cache.drop(key)
                problems.append(f"{exc.message} (dropped from the cache)")
        return {"ok": not problems, "chunks": checked, "problems": problems, "scope": "spoke cache"}

    def gc(self, grace: float | None = None, dry_run: bool = False, progress: Progress | None = None) -> dict:
        """Garbage collection is the hub's: forwarded."""
        return self.upstream.gc(grace, dry_run)
