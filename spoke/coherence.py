"""Coherence at a spoke: which commit a branch or tag names now, and its staging.

The hub pushes every ref and staging change down the watch stream, so while
the stream is up a spoke answers "where is main?" without a round trip and
sees every commit that completed before (close-to-open, bounded by the
stream's delivery delay). When the stream is down, a value fetched less than
``lease`` seconds ago is still used; after that the spoke asks the hub, and
if the hub cannot be reached it serves the last value it knew, marked stale.
Even while the stream is live, a value is checked with the hub once it is
:data:`LIVE_LEASE_FACTOR` leases old: a stream that lost an event (a bug, a hub
restored from a backup) leaves a branch stale for that long at most, never for good.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from fabric.client.http import HttpPlane
from fabric.errors import FabricError, Unavailable
from fabric.format.model import Entry

from .state import SpokeState
from .traffic import METADATA, Traffic

log = logging.getLogger("fabric.spoke")

#: The stream counts as live while something (event or heartbeat) arrived this recently.
STREAM_SILENCE_LIMIT = 12.0
#: While the stream is live, a ref is trusted for this many leases (60 s by default), then checked.
LIVE_LEASE_FACTOR = 6


@dataclass
class _Ref:
    commit: str
    fetched: float
    by_event: float = 0.0
    #: Set by a listing that no event of the stream has been matched to yet (see ``_apply``).
    from_listing: bool = False


class RefTracker:
    def __init__(self, upstream: HttpPlane, traffic: Traffic, state: SpokeState, lease: float = 10.0) -> None:
        self.upstream = upstream
        self.traffic = traffic
        self.state = state
        self.lease = lease
        self._lock = threading.Lock()
        # Refs remembered from before a restart count as expired: used only while the hub is away.
        self._refs: dict[tuple[str, str, str], _Ref] = {
            (repo, kind, name): _Ref(commit, float("-inf")) for repo, kind, name, commit in state.refs()
        }
        self._listed: dict[str, float] = {}
        self._staging_seq: dict[tuple[str, str], int] = {}
        self._generation: dict[tuple[str, str], int] = {}
        self.seq: int | None = None
        self._last_heard = 0.0
        self._connected_since: float | None = None
        # When the stream first spoke: it carries every change after that (reconnections resume
        # at ``seq``), so only refs listed since then are kept current by it alone.
        self._origin: float | None = None
        self._stop = threading.Event()
        self.events = 0
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    # -- the stream ----------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                with self.traffic.purpose(METADATA):
                    for event in self.upstream.watch(self.seq):
                        if self._stop.is_set():
                            return
                        self._heard()
                        backoff = 0.2
                        if event.get("type") == "resync":
                            self._resync()
                        elif event.get("type") != "heartbeat":
                            self._apply(event)
                        self.seq = event["seq"]
            except FabricError as exc:
                log.info("watch stream down: %s", exc.message)
            except Exception as exc:  # noqa: BLE001 - keep reconnecting whatever broke
                log.info("watch stream down: %s", exc)
            with self._lock:
                self._connected_since = None
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _heard(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._last_heard = now
            if self._connected_since is None:
                self._connected_since = now
            if self._origin is None:
                self._origin = now

    def _apply(self, event: dict) -> None:
        self.events += 1
        repo, kind, name, new = event["repo"], event["kind"], event["name"], event["new"]
        now = time.monotonic()
        with self._lock:
            if kind == "repo":
                for key in [k for k in self._refs if k[0] == repo]:
                    del self._refs[key]
                self._listed.pop(repo, None)
                self.state.forget_repo(repo)
            elif kind == "staging":
                self._staging_seq[(repo, name)] = int(new)
            else:
                if kind == "branch":
                    self._generation[(repo, name)] = self._generation.get((repo, name), 0) + 1
                current = self._refs.get((repo, kind, name))
                if current is not None and current.from_listing and current.commit not in (event["old"], new):
                    # The stream can lag behind a listing: an event that neither led to the listed
                    # commit nor starts from it came before the listing, which already holds it.
                    return
                self._set((repo, kind, name), _Ref(new, now, now) if new is not None else None)

    def _resync(self) -> None:
        """The hub pruned events this spoke had not seen: forget what the stream vouched
        for, so each ref is fetched again (or served within its lease) before it is trusted."""
        log.info("watch stream: missed pruned events, reloading refs")
        with self._lock:
            for key, ref in self._refs.items():
                self._refs[key] = _Ref(ref.commit, float("-inf"))
                if key[1] == "branch":
                    self._generation[key[0], key[2]] = self._generation.get((key[0], key[2]), 0) + 1
            self._listed.clear()
            self._staging_seq.clear()
            self._origin = None

    def live(self) -> bool:
        """Is the watch stream delivering (so cached refs are current)?"""
        with self._lock:
            return self._connected_since is not None and time.monotonic() - self._last_heard < STREAM_SILENCE_LIMIT

    # -- lookups -------------------------------------------------------------
    def ref(self, repo: str, kind: str, name: str) -> tuple[str | None, bool]:
        """``(commit or None if no such ref, stale)`` for a branch or tag."""
        key = (repo, kind, name)
        now = time.monotonic()
        with self._lock:
            hit = self._refs.get(key)
            live = self._connected_since is not None and now - self._last_heard < STREAM_SILENCE_LIMIT
            listed = self._listed.get(repo)
            authoritative = live and listed is not None and listed >= (self._connected_since or now)
            followed = live and hit is not None and self._origin is not None and hit.fetched >= self._origin
        age = now - hit.fetched if hit is not None else 0.0
        if hit is not None and (age < self.lease or (followed and age < self.lease * LIVE_LEASE_FACTOR)):
            return hit.commit, False
        if hit is None and authoritative:
            return None, False
        try:
            self.refresh(repo)
        except Unavailable:
            if hit is not None:
                return hit.commit, True
            raise
        with self._lock:
            hit = self._refs.get(key)
        return (hit.commit if hit else None), False

    def refresh(self, repo: str) -> None:
        """Fetch every branch and tag of ``repo`` from the hub."""
        started = time.monotonic()
        with self.traffic.purpose(METADATA):
            branches = self.upstream.list_branches(repo)
            tags = self.upstream.list_tags(repo)
        with self._lock:
            fresh = {(repo, "branch", b["name"]): b["commit_id"] for b in branches}
            fresh.update({(repo, "tag", t["name"]): t["commit_id"] for t in tags})
            for key in [k for k in self._refs if k[0] == repo and k not in fresh]:
                if self._refs[key].by_event < started:
                    self._set(key, None)
            for key, commit in fresh.items():
                old = self._refs.get(key)
                if old is None or old.by_event < started:
                    # Fresh as of ``started`` at least (the hub listed it after that).
                    self._set(key, _Ref(commit, started, from_listing=True))
            self._listed[repo] = started

    def observed(self, repo: str, branch: str, head: str, started: float) -> None:
        """The hub answered, to a request sent at ``started``, that ``branch`` is at ``head``
        (a staging snapshot carries it): newer than any event that came before that."""
        key = (repo, "branch", branch)
        with self._lock:
            old = self._refs.get(key)
            if old is None or (old.commit != head and old.by_event < started):
                self._set(key, _Ref(head, started, from_listing=True))

    def known(self, repo: str, kind: str) -> list[dict]:
        """``[{name, commit_id}]``: the refs of one kind last seen in ``repo`` (answers while the hub is away)."""
        with self._lock:
            found = [(n, r.commit) for (rp, k, n), r in self._refs.items() if rp == repo and k == kind]
        return [{"name": n, "commit_id": c} for n, c in sorted(found)]

    def note(self, repo: str, kind: str, name: str, commit: str | None) -> None:
        """Record a ref change this spoke made itself (read-your-writes before the event arrives)."""
        with self._lock:
            self._set((repo, kind, name), _Ref(commit, time.monotonic(), time.monotonic()) if commit else None)

    def _set(self, key: tuple[str, str, str], ref: _Ref | None) -> None:
        """Update a ref in memory and in the spoke's state (called with the lock held)."""
        old = self._refs.get(key)
        if ref is None:
            self._refs.pop(key, None)
        else:
            self._refs[key] = ref
        if (old.commit if old else None) != (ref.commit if ref else None):
            self.state.save_ref(*key, ref.commit if ref else None)

    def staging_seq(self, repo: str, branch: str) -> int | None:
        with self._lock:
            return self._staging_seq.get((repo, branch))

    def generation(self, repo: str, branch: str) -> int:
        """Counts branch events (commits, resets, discards) seen for a branch."""
        with self._lock:
            return self._generation.get((repo, branch), 0)


@dataclass
class BranchStaging:
    """A snapshot of a branch's staging area (implements :class:`fabric.engine.reader.Staging`)."""

    head: str
    seq: int
    items: dict[str, bytes | None]
    fetched: float
    generation: int = 0
    _keys: list[str] | None = field(default=None, repr=False)

    def entry(self, path: str) -> tuple[bool, bytes | None]:
        if path in self.items:
            return True, self.items[path]
        return False, None

    def add(self, rows: Mapping[str, bytes | None], seq: int) -> None:
        """Rows staged at ``seq``, right after this snapshot's."""
        self.items.update(rows)
        self.seq = seq
        self._keys = None

    def between(self, start: str, end: str | None) -> Iterator[tuple[str, bytes | None]]:
        if self._keys is None:
            self._keys = sorted(self.items)
        i = bisect.bisect_left(self._keys, start)
        for path in self._keys[i:]:
            if end is not None and path >= end:
                return
            yield path, self.items[path]


@dataclass
class UnknownStaging:
    """The staging area of a branch this spoke has no snapshot of while the hub is away (say,
    just after a restart): every lookup is Unavailable, never "nothing staged", so a path
    staged at the hub is not read as absent (or as its committed version). Queued local
    writes, which an :class:`OverlayStaging` puts on top, are still served."""

    head: str
    why: str

    def entry(self, path: str) -> tuple[bool, bytes | None]:
        raise Unavailable(self.why)

    def between(self, start: str, end: str | None) -> Iterator[tuple[str, bytes | None]]:
        raise Unavailable(self.why)


class StagingCache:
    """Per-branch staging snapshots, refreshed incrementally when the hub says they changed."""

    def __init__(self, upstream: HttpPlane, tracker: RefTracker, traffic: Traffic, state: SpokeState) -> None:
        self.upstream = upstream
        self.tracker = tracker
        self.traffic = traffic
        self.state = state
        self._lock = threading.Lock()
        self._snaps: dict[tuple[str, str], BranchStaging] = {}
        self._invalidations: dict[tuple[str, str], int] = {}
        #: Branches with a change the state could not record (disk full), and the lock that keeps
        #: recording in order, so that a change recorded later knows of an earlier one skipped.
        self._unrecorded: set[tuple[str, str]] = set()
        self._recording = threading.Lock()

    def _recorded(self, repo: str, branch: str) -> BranchStaging | None:
        """The snapshot in memory, else the one recorded before a restart (refreshed before use
        while the hub answers). Called with the lock held."""
        snap = self._snaps.get((repo, branch))
        if snap is None and (rec := self.state.staging(repo, branch)) is not None:
            head, seq, items = rec
            snap = self._snaps[(repo, branch)] = BranchStaging(head, seq, items, -1e18, self.tracker.generation(repo, branch))
        return snap

    def invalidate(self, repo: str, branch: str) -> None:
        with self._lock:
            self._invalidations[(repo, branch)] = self._invalidations.get((repo, branch), 0) + 1
            snap = self._snaps.get((repo, branch))
            if snap is not None:
                snap.fetched = -1e18  # forces an (incremental) refresh on the next read

    def add_own(self, repo: str, branch: str, changes: Mapping[str, Entry | None], seq: int | None) -> None:
        """This spoke staged ``changes`` at the hub, where they got staging seq ``seq``. When
        nothing else was staged since the cached snapshot (its seq is ``seq - 1``) they are
        added to it, sparing the next read a round trip; otherwise the snapshot is refreshed
        on the next read. Either way a fetch already under way is not trusted."""
        key = (repo, branch)
        rows = {p: e.encode() if e is not None else None for p, e in changes.items()}
        with self._lock:
            self._invalidations[key] = self._invalidations.get(key, 0) + 1
            snap = self._recorded(repo, branch)
            if snap is None:
                return
            if seq is not None and snap.fetched > 0 and snap.seq == seq - 1:
                snap.add(rows, seq)
            else:
                # Whatever else is staged, these are: kept (and recorded) until the refresh, so a
                # restart while the hub is away does not lose sight of writes that left the queue.
                snap.add(rows, snap.seq)
                snap.fetched = -1e18
            head, recorded_seq = snap.head, snap.seq
        self._record(repo, branch, snap, (head, recorded_seq, rows))

    def get(self, repo: str, branch: str, head: str) -> tuple[BranchStaging | UnknownStaging, bool]:
        """``(snapshot, stale)`` of the staging area; the snapshot's ``head`` may be newer than ``head``.
        With the hub away, the last snapshot (stale), or :class:`UnknownStaging` if there is none."""
        with self._lock:
            snap = self._recorded(repo, branch)
        now = time.monotonic()
        live = self.tracker.live()
        same = snap is not None and snap.head == head and snap.generation == self.tracker.generation(repo, branch)
        if snap is not None and same and snap.fetched > 0:
            seq = self.tracker.staging_seq(repo, branch)
            if live and (seq is None or seq <= snap.seq):
                return snap, False
            if not live and now - snap.fetched < self.tracker.lease:
                return snap, False
        try:
            snap = self._fetch(repo, branch, snap if (same and live) else None)
        except Unavailable as exc:
            if snap is not None:
                return snap, True
            why = f"the changes staged on {repo}@{branch} are not known here while the hub is away ({exc.message})"
            return UnknownStaging(head, why), True
        return snap, False

    def _fetch(self, repo: str, branch: str, base: BranchStaging | None) -> BranchStaging:
        """A fresh snapshot; incremental on top of ``base`` when given."""
        generation = self.tracker.generation(repo, branch)
        with self._lock:
            invalidations = self._invalidations.get((repo, branch), 0)
        started = time.monotonic()
        with self.traffic.purpose(METADATA):
            head, seq, rows = self.upstream.staging_snapshot(repo, branch, base.seq if base else 0)
            if base is not None and head != base.head:
                head, seq, rows = self.upstream.staging_snapshot(repo, branch, 0)
                base = None
        self.tracker.observed(repo, branch, head, started)
        items = dict(base.items) if base is not None else {}
        items.update(rows)
        snap = BranchStaging(head, seq, items, time.monotonic(), generation)
        with self._lock:
            current = self._invalidations.get((repo, branch), 0) == invalidations
            if current:
                self._snaps[(repo, branch)] = snap
            else:  # invalidated while it was being fetched: it may predate a write that landed
                snap.fetched = -1e18
                self._snaps.setdefault((repo, branch), snap)  # the older one holds that write
        if current:  # an older record plus this spoke's landed writes beats a snapshot that may predate them
            self._record(repo, branch, snap, (head, seq, dict(rows)) if base is not None else None)
        return snap

    def _record(
        self, repo: str, branch: str, snap: BranchStaging, change: tuple[str, int, dict[str, bytes | None]] | None
    ) -> None:
        """Record ``snap`` in the spoke's state, which a restart starts from: ``change``, (head,
        seq, rows) since the record, on top of the record; the whole snapshot when it is None,
        or after a change could not be recorded (the disk was full). For a change recorded on
        top of a record that missed an earlier one would claim a seq whose rows the record
        lacks, and a restart would fetch only what came after it: a write that landed would
        read as its older value (soak seed 1 in CI: an S3 GET found a key absent 33 s after its PUT)."""
        key = (repo, branch)
        with self._recording:
            whole = change is None or key in self._unrecorded
            if whole:
                with self._lock:
                    change = (snap.head, snap.seq, dict(snap.items))
            head, seq, rows = change
            if self.state.save_staging(repo, branch, head, seq, rows, replace=whole):
                if whole:
                    self._unrecorded.discard(key)
            else:
                self._unrecorded.add(key)
