"""Bounded catalog work (issue 11, point 6): ref events are pruned, and a long diff or
list of uncommitted changes paged through REST costs work proportional to its size.

The hub runs in this process, on a real uvicorn server over loopback, so the test
can count what the engine reads: range objects (a counting MetaStore, as in
test_tree.py) and staging rows (a counting Database). Neither changes behaviour.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from fabric.auth.tokens import TokenStore
from fabric.catalog import Catalog, Database
from fabric.catalog.catalog import PRUNE_EVERY
from fabric.client.http import HttpPlane
from fabric.engine.engine import Engine
from fabric.engine.metastore import RANGE, MetaStore
from fabric.format.model import Entry
from fabric.store import LocalStore
from fabric.util.net import free_port
from hub.app import create_app

N = 20_000
PAGE = 1000  # the REST default page size


class CountingMetaStore(MetaStore):
    """A real MetaStore that counts range reads (a test instrument)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.range_reads = 0

    def get(self, kind: bytes, oid: str) -> Any:
        if kind == RANGE:
            self.range_reads += 1
        return super().get(kind, oid)


class CountingDatabase(Database):
    """A real catalog database that counts the staging rows its queries return (a test instrument)."""

    staging_rows = 0

    def query(self, sql: str, params=()) -> list[tuple]:
        rows = super().query(sql, params)
        if "FROM staging" in sql:
            self.staging_rows += len(rows)
        return rows


def open_engine(tmp_path, db_url: str, **catalog_options: Any) -> Engine:
    engine = Engine(Catalog(CountingDatabase(db_url), **catalog_options), LocalStore(str(tmp_path / "store")))
    engine.trees.meta = CountingMetaStore(engine.store)
    return engine


@contextlib.contextmanager
def serve(engine: Engine) -> Iterator[str]:
    """The hub app over ``engine`` on a loopback port (no auth); yields its URL."""
    port = free_port()
    app = create_app(engine, TokenStore(engine.catalog.db), auth=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the in-process hub did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def entry(i: int, version: int = 0) -> Entry:
    return Entry(size=0, mtime_ns=i * 10 + version)


def path(i: int) -> str:
    return f"data/shard-{i:06d}.bin"


# -- diff and uncommitted paging ------------------------------------------------------


def test_paged_diff_reads_each_range_about_once(tmp_path, db_url: str) -> None:
    engine = open_engine(tmp_path, db_url)
    engine.create_repo("big")
    first = engine.head("big", "main")
    engine.commit_changes("big", "main", {path(i): entry(i) for i in range(N)}, "twenty thousand files")
    ranges = len(engine.trees.ranges(engine.resolve("big", "main").tree))
    counter = engine.trees.meta
    with serve(engine) as url:
        plane = HttpPlane(url)
        counter.range_reads = 0
        changes = list(plane.diff("big", first, "main"))
    assert [c.path for c in changes] == [path(i) for i in range(N)]
    assert {c.kind for c in changes} == {"added"}
    pages = N // PAGE + 1
    # Each page opens the ranges its changes live in (and the one holding its ``after``),
    # never the ranges of the pages before it.
    assert counter.range_reads <= ranges + 3 * pages, (counter.range_reads, ranges, pages)


def test_paged_uncommitted_reads_each_staged_row_about_once(tmp_path, db_url: str) -> None:
    engine = open_engine(tmp_path, db_url)
    engine.create_repo("wip")
    engine.stage("wip", "main", {path(i): entry(i) for i in range(N)})
    with serve(engine) as url:
        plane = HttpPlane(url)
        engine.catalog.db.staging_rows = 0
        changes = list(plane.uncommitted("wip", "main"))
    assert [c.path for c in changes] == [path(i) for i in range(N)]
    assert engine.catalog.db.staging_rows <= 3 * N, engine.catalog.db.staging_rows


def test_diff_and_uncommitted_resume_after_a_path(tmp_path, db_url: str) -> None:
    """``after`` gives exactly the changes past it, whatever ranges the two trees share."""
    engine = open_engine(tmp_path, db_url)
    engine.create_repo("resume")
    engine.commit_changes("resume", "main", {path(i): entry(i) for i in range(3000)}, "base")
    base = engine.head("resume", "main")
    change: dict[str, Entry | None] = {path(i): entry(i, 1) for i in range(0, 3000, 7)}
    change.update({path(i): None for i in range(3, 3000, 11)})
    change.update({f"data/shard-{i:06d}.bin.new": entry(i) for i in range(0, 3000, 13)})
    change.update({f"other/{i}": entry(i) for i in range(50)})
    engine.commit_changes("resume", "main", change, "edit")
    engine.stage("resume", "main", change)
    full = [(c.path, c.kind) for c in engine.diff("resume", base, "main")]
    staged = [c.path for c in engine.uncommitted("resume", "main")]
    assert len(full) > 700
    for after in ["", "data/", path(0), path(1499), path(1500) + ".new", "data/zzz", "other/25", "zzz"]:
        assert [(c.path, c.kind) for c in engine.diff("resume", base, "main", after=after)] == [
            x for x in full if x[0] > after
        ], after
        assert [c.path for c in engine.uncommitted("resume", "main", after=after)] == [p for p in staged if p > after]
        under = [(c.path, c.kind) for c in engine.diff("resume", base, "main", prefix="data/", after=after)]
        assert under == [x for x in full if x[0] > after and x[0].startswith("data/")], after
    with serve(engine) as url:
        plane = HttpPlane(url)
        assert [(c.path, c.kind) for c in plane.diff("resume", base, "main", after=path(2000))] == [
            x for x in full if x[0] > path(2000)
        ]


# -- ref events ---------------------------------------------------------------------


def event_rows(engine: Engine) -> int:
    return engine.catalog.db.query("SELECT COUNT(*) FROM ref_events")[0][0]


def test_ref_events_stay_bounded_under_many_staged_writes(tmp_path, db_url: str) -> None:
    engine = open_engine(tmp_path, db_url, event_keep=100, event_retention=0)
    engine.create_repo("busy")
    for i in range(3000):
        engine.stage("busy", "main", {"hot.bin": entry(i)})
    assert event_rows(engine) <= 100 + PRUNE_EVERY
    last = engine.catalog.last_event_seq()
    assert last >= 3001
    # The newest events are all there, in order.
    assert [e[0] for e in engine.catalog.events_after(last - 100)] == list(range(last - 99, last + 1))
    assert engine.catalog.events_pruned_through() > 0


def test_ref_events_within_the_retention_window_are_kept_up_to_a_maximum(tmp_path, db_url: str) -> None:
    engine = open_engine(tmp_path, db_url, event_keep=100, event_retention=3600, event_max=1000)
    engine.create_repo("busy")
    for i in range(600):
        engine.stage("busy", "main", {"hot.bin": entry(i)})
    assert event_rows(engine) == 601  # all younger than the window
    assert engine.catalog.events_pruned_through() == 0
    for i in range(1500):
        engine.stage("busy", "main", {"hot.bin": entry(i)})
    assert event_rows(engine) <= 1000 + PRUNE_EVERY


def test_bad_event_retention_settings_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="keep"):
        Catalog(Database(f"sqlite:///{tmp_path}/c.db"), event_keep=0)


def test_a_subscriber_behind_the_pruned_history_is_told_to_resync(tmp_path, db_url: str) -> None:
    engine = open_engine(tmp_path, db_url, event_keep=50, event_retention=0)
    engine.create_repo("watched")
    for i in range(PRUNE_EVERY * 2):
        engine.stage("watched", "main", {"f": entry(i)})
    last = engine.catalog.last_event_seq()
    with serve(engine) as url:
        plane = HttpPlane(url)
        # Resuming from a seq whose followers were pruned: one resync line, then the stream ends.
        assert list(plane.watch(since=1, read_timeout=10)) == [{"type": "resync", "seq": last}]
        # Resuming within what is kept: the events, as before.
        stream = plane.watch(since=last - 5, read_timeout=10)
        got = [next(stream)["seq"] for _ in range(5)]
        stream.close()
        assert got == list(range(last - 4, last + 1))
