"""The spoke's write-back queue: one branch's refused writes do not stop the others,
refused writes are parked where an operator sees them (stats, /metrics, `fabric
writeback`), and a replay after a crash never overwrites newer data at the hub.

Real processes: a hub (stopped and started again on its data) and a spoke on loopback.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import time
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner

from fabric.cli.main import cli
from fabric.engine.engine import Engine
from tests.hubserver import metric_value, unique_name
from tests.spokeserver import RestartableHub, Spoke, random_bytes, start_restartable_hub, start_spoke, wait_for

pytestmark = pytest.mark.timeout(180)

LEASE = 1.0


@pytest.fixture
def hub(tmp_path) -> Iterator[RestartableHub]:
    with start_restartable_hub(tmp_path / "hub") as h:
        yield h


def put(c: httpx.Client, repo: str, branch: str, path: str, data: bytes) -> None:
    r = c.put(
        f"/api/v1/repos/{repo}/branches/{branch}/objects",
        params={"path": path},
        content=data,
        headers={"X-Fabric-Durability": "local", "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 201, r.text


def read(plane, repo: str, ref: str, path: str) -> bytes | None:
    try:
        return b"".join(plane.read_stream(repo, ref, path))
    except Exception:  # noqa: BLE001 - not there (yet)
        return None


def spoke_metric(spoke: Spoke, what: str) -> float:
    text = httpx.get(spoke.url + "/metrics", timeout=10).text
    return metric_value(text, "fabric_spoke", what=what)


def fabric(spoke: Spoke, token: str, *args: str) -> object:
    result = CliRunner().invoke(cli, ["--server", spoke.url, "--token", token, "--json", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def queued(cache: str) -> int:
    db = sqlite3.connect(f"file:{os.path.join(cache, 'writeback.db')}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
    finally:
        db.close()


def test_deleted_branch_is_parked_while_other_branches_land_then_retried_or_dropped(hub, tmp_path) -> None:
    plane = hub.plane()
    repo, other = unique_name("park"), unique_name("park")
    plane.create_repo(repo)
    plane.create_repo(other)
    for name in ("doomed", "gone"):
        plane.create_branch(repo, name, "main")
    data = {k: random_bytes(200_000, i) for i, k in enumerate(("a", "a2", "g", "b", "c"))}
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token, lease=LEASE) as spoke:
        with spoke.client(timeout=30) as c:
            for r, ref in ((repo, "doomed"), (repo, "gone"), (repo, "main"), (other, "main")):  # the spoke learns them
                listed = c.get(f"/api/v1/repos/{r}/refs/{ref}/list")
                assert listed.status_code == 200, f"{r}@{ref}: {listed.text}"
            hub.stop()
            # Queued while the hub is away: the oldest writes go to branches deleted meanwhile.
            put(c, repo, "doomed", "a.bin", data["a"])
            put(c, repo, "doomed", "a2.bin", data["a2"])
            put(c, repo, "gone", "g.bin", data["g"])
            put(c, repo, "main", "b.bin", data["b"])
            put(c, other, "main", "c.bin", data["c"])
        engine = Engine.open(hub.data)
        try:
            engine.delete_branch(repo, "doomed")
            engine.delete_branch(repo, "gone")
        finally:
            engine.close()
        hub.start()
        plane = hub.plane()

        # The writes to the other branch and the other repository land; the refused ones are parked.
        wait_for(lambda: read(plane, repo, "main", "b.bin") == data["b"], timeout=30, interval=0.2)
        wait_for(lambda: read(plane, other, "main", "c.bin") == data["c"], timeout=30, interval=0.2)
        wait_for(lambda: spoke_metric(spoke, "writeback_parked") == 3, timeout=30, interval=0.2)
        assert spoke.stats()["writeback_pending"] == 0
        assert queued(spoke.cache) == 3
        parked = fabric(spoke, hub.token, "writeback", "list")
        assert [(p["repo"], p["branch"], p["path"]) for p in parked] == [
            (repo, "doomed", "a.bin"),
            (repo, "doomed", "a2.bin"),
            (repo, "gone", "g.bin"),
        ]
        assert all("not_found" in p["error"] and p["age"] >= 0 for p in parked)
        human = CliRunner().invoke(cli, ["--server", spoke.url, "--token", hub.token, "writeback", "list"])
        assert human.exit_code == 0 and "doomed" in human.output and "a.bin" in human.output
        assert spoke.stats()["cache_pinned_bytes"] > 0
        # Not an operator: refused.
        reader = plane.create_token("reader", roles={repo: "read"})["token"]
        with spoke.client(reader) as c:
            assert c.get("/api/v1/writeback/parked").status_code == 403
            assert c.delete("/api/v1/writeback/parked").status_code == 403
        assert spoke_metric(spoke, "writeback_parked") == 3

        # The branch is back: retried, its writes land in order.
        plane.create_branch(repo, "doomed", "main")
        doomed_ids = [p["id"] for p in parked if p["branch"] == "doomed"]
        assert fabric(spoke, hub.token, "writeback", "retry", str(doomed_ids[0]))["count"] == 1
        assert fabric(spoke, hub.token, "writeback", "retry", str(doomed_ids[1]))["count"] == 1
        wait_for(lambda: read(plane, repo, "doomed", "a2.bin") == data["a2"], timeout=30, interval=0.2)
        assert read(plane, repo, "doomed", "a.bin") == data["a"]

        # The other one is dropped: gone from the queue, its chunks unpinned.
        gone_id = next(p["id"] for p in parked if p["branch"] == "gone")
        assert fabric(spoke, hub.token, "writeback", "drop", str(gone_id))["count"] == 1
        assert fabric(spoke, hub.token, "writeback", "list") == []
        wait_for(lambda: queued(spoke.cache) == 0, timeout=10)
        assert spoke_metric(spoke, "writeback_parked") == 0
        assert spoke.stats()["cache_pinned_bytes"] == 0
        # An id that is not parked: a clear 404, nothing changes.
        result = CliRunner().invoke(cli, ["--server", spoke.url, "--token", hub.token, "writeback", "drop", str(gone_id)])
        assert result.exit_code == 3 and "no parked write-back entry" in result.output


def test_a_token_without_write_access_parks_and_other_repositories_still_land(hub, tmp_path) -> None:
    plane = hub.plane()
    writable, readonly = unique_name("rw"), unique_name("ro")
    plane.create_repo(writable)
    plane.create_repo(readonly)
    spoke_token = plane.create_token("spoke", roles={writable: "write", readonly: "read"})["token"]
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=spoke_token, lease=LEASE) as spoke:
        with spoke.client(hub.token, timeout=30) as c:
            put(c, readonly, "main", "x.bin", random_bytes(100_000, 1))
            put(c, writable, "main", "y.bin", random_bytes(100_000, 2))
        wait_for(lambda: read(plane, writable, "main", "y.bin") is not None, timeout=30, interval=0.2)
        wait_for(lambda: spoke_metric(spoke, "writeback_parked") == 1, timeout=30, interval=0.2)
        parked = fabric(spoke, hub.token, "writeback", "list")
        assert [(p["repo"], p["path"]) for p in parked] == [(readonly, "x.bin")]
        assert "forbidden" in parked[0]["error"]
        assert read(plane, readonly, "main", "x.bin") is None
        # A commit of that branch at the spoke would leave the parked write out: refused, and says why.
        with spoke.client(hub.token, timeout=30) as c:
            r = c.post(f"/api/v1/repos/{readonly}/branches/main/commits", json={"message": "m"})
            assert r.status_code == 409 and "parked" in r.json()["error"]["message"], r.text


def test_a_replay_after_a_crash_never_overwrites_newer_data(hub, tmp_path) -> None:
    """The crash window: the hub staged a batch, the spoke died before deleting its rows."""
    plane = hub.plane()
    repo = unique_name("replay")
    plane.create_repo(repo)
    plane.create_branch(repo, "b2", "main")
    old = random_bytes(150_000, 10)
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token, lease=LEASE) as spoke:
        with spoke.client(timeout=30) as c:
            for branch in ("main", "b2"):
                put(c, repo, branch, "p.bin", old)
        wait_for(lambda: spoke.stats()["writeback_pending"] == 0, timeout=30, interval=0.1)
        landed = {}
        for branch in ("main", "b2"):
            head, seq, rows = plane.staging_snapshot(repo, branch)
            landed[branch] = (head, seq, dict(rows)["p.bin"])
        spoke.kill()

        # Put the rows back as the crash left them: staged at the hub, still queued here,
        # marked with the staging seq and head the spoke saw before it sent them. On main
        # also a write that never reached the hub (q.bin): it must still land.
        db = sqlite3.connect(os.path.join(spoke.cache, "writeback.db"))
        try:
            if "tried" not in {r[1] for r in db.execute("PRAGMA table_info(ops)")}:
                db.execute("ALTER TABLE ops ADD COLUMN tried TEXT")  # the queue of a spoke before parking
            for branch, (head, seq, enc) in landed.items():
                for path in ("p.bin", "q.bin") if branch == "main" else ("p.bin",):
                    db.execute(
                        "INSERT INTO ops (repo, branch, path, entry, created, tried) VALUES (?, ?, ?, ?, ?, ?)",
                        (repo, branch, path, enc, time.time(), f"{seq - 1} {head}"),
                    )
            db.commit()
        finally:
            db.close()

        # Meanwhile other clients write the same path: staged on main, committed on b2.
        new_main, new_b2 = random_bytes(120_000, 11), random_bytes(120_000, 12)
        plane.put_object(repo, "main", "p.bin", io.BytesIO(new_main))
        plane.put_object(repo, "b2", "p.bin", io.BytesIO(new_b2))
        c2 = plane.commit(repo, "b2", "newer").id

        spoke.start()
        wait_for(lambda: queued(spoke.cache) == 0, timeout=30, interval=0.2)
        assert read(plane, repo, "main", "p.bin") == new_main
        assert read(plane, repo, "main", "q.bin") == old
        assert read(plane, repo, "b2", "p.bin") == new_b2
        assert plane.resolve_commit(repo, "b2") == c2
        assert list(plane.uncommitted(repo, "b2")) == []
        assert spoke_metric(spoke, "writeback_superseded") == 2


def test_a_malformed_conditional_stage_is_refused_and_stages_nothing(hub) -> None:
    plane = hub.plane()
    repo = unique_name("cond")
    plane.create_repo(repo)
    with hub.client() as c:
        for bad in ("12", "x " + "0" * 64, "3 nothex", "3 abc"):
            r = c.post(
                f"/api/v1/repos/{repo}/branches/main/entries",
                content=b"\x81\xa7changes\x80",
                headers={"Content-Type": "application/msgpack", "X-Fabric-Stage-Since": bad},
            )
            assert r.status_code == 400, (bad, r.text)
            assert "X-Fabric-Stage-Since" in r.json()["error"]["message"]
    assert plane.staging_snapshot(repo, "main")[1] == 0
