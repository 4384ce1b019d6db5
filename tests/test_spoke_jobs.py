"""Job ids (``X-Fabric-Job``) and per-job accounting at a spoke; the fetch scheduler's
order between demand reads and prefetches. Real hub and spoke processes on loopback;
the scheduler test drives a real FetchScheduler and DiskCache with a gated fetch, and the
"held ahead" test a real PrefetchStats."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import httpx
import pytest

from fabric.cache.disk import DiskCache
from fabric.client.http import HttpPlane
from fabric.errors import BadRequest
from fabric.format import frames
from fabric.format.chunking import chunk_id
from fabric.plane.jobs import JOB_ENV, JOB_HEADER
from spoke.fetch import DEMAND_PRIORITY, HINT, FetchScheduler
from spoke.jobs import JobTable
from spoke.prefetch_stats import PrefetchStats
from spoke.traffic import Traffic
from tests.fuse_helpers import fabric, mounted, needs_fuse
from tests.hubserver import Hub, metric_value, unique_name
from tests.spokeserver import Spoke, random_bytes, start_spoke

KiB = 1 << 10
pytestmark = pytest.mark.timeout(120)


def put_files(hub: Hub, repo: str, files: dict[str, bytes]) -> None:
    plane = hub.plane()
    plane.create_repo(repo)
    for path, data in files.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    plane.commit(repo, "main", "data")


@pytest.fixture
def spoke(hub: Hub, tmp_path) -> Iterator[Spoke]:
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as s:
        yield s


# -- the job id --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "semi;colon", "slash/job", "é"])
def test_a_bad_job_id_is_refused_with_400_by_hub_and_spoke(hub: Hub, spoke: Spoke, bad: str) -> None:
    for url in (hub.url, spoke.url):
        r = httpx.get(f"{url}/api/v1/repos", headers={"Authorization": f"Bearer {hub.token}", JOB_HEADER: bad.encode()})
        assert r.status_code == 400, (url, r.text)
        assert JOB_HEADER in r.json()["error"]["message"] and "job id" in r.json()["error"]["message"]


def test_a_good_job_id_is_accepted_by_the_hub(hub: Hub) -> None:
    plane = HttpPlane(hub.url, hub.token, job="train-7:epoch@3.a_b")
    assert isinstance(plane.list_repos(), list)


def test_http_plane_takes_its_job_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(JOB_ENV, "from-env")
    assert HttpPlane("http://127.0.0.1:1").http.headers[JOB_HEADER] == "from-env"
    assert HttpPlane("http://127.0.0.1:1", job="given").http.headers[JOB_HEADER] == "given"
    monkeypatch.setenv(JOB_ENV, "bad job")
    with pytest.raises(BadRequest):
        HttpPlane("http://127.0.0.1:1")
    monkeypatch.delenv(JOB_ENV)
    assert JOB_HEADER not in HttpPlane("http://127.0.0.1:1").http.headers


# -- per-job accounting ---------------------------------------------------------------------
def test_each_jobs_reads_are_counted_apart_in_stats_and_metrics(hub: Hub, spoke: Spoke) -> None:
    """Two jobs read at once: each one's demand bytes, hits and hub waits are its own."""
    repo = unique_name("jobs")
    files = {f"f{i}.bin": random_bytes(256 * KiB, 500 + i) for i in range(8)}
    put_files(hub, repo, files)
    total = sum(len(d) for d in files.values())

    def read_as(job: str, errors: list) -> None:
        try:
            plane = HttpPlane(spoke.url, hub.token, job=job)
            for path, data in files.items():
                assert plane.read(repo, "main", path) == data
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    errors: list = []
    first = [threading.Thread(target=read_as, args=("cold-a", errors)), threading.Thread(target=read_as, args=("cold-b", errors))]
    for t in first:
        t.start()
    for t in first:
        t.join()
    assert not errors
    read_as("warm", errors)  # everything is cached now
    assert not errors

    jobs = spoke.stats()["jobs"]
    for job in ("cold-a", "cold-b", "warm"):
        assert jobs[job]["demand_bytes"] == total, job
    # Between them the two cold jobs fetched every chunk once: what one fetched the other may have hit.
    assert jobs["cold-a"]["hit_bytes"] + jobs["cold-b"]["hit_bytes"] < total
    assert jobs["cold-a"]["wan_wait_seconds"] + jobs["cold-b"]["wan_wait_seconds"] > 0
    assert jobs["warm"]["hit_ratio"] == 1.0 and jobs["warm"]["wan_wait_seconds"] == 0

    text = httpx.get(spoke.url + "/metrics").text
    assert metric_value(text, "fabric_spoke_job_demand_bytes_total", job="warm") == total
    assert metric_value(text, "fabric_spoke_job_hit_ratio", job="warm") == 1.0
    assert metric_value(text, "fabric_spoke_job_wan_wait_seconds_total", job="cold-a") == pytest.approx(jobs["cold-a"]["wan_wait_seconds"], abs=1e-5)
    # A read without a job is in no job's figures.
    before = spoke.stats()["jobs"]
    HttpPlane(spoke.url, hub.token).read(repo, "main", "f0.bin")
    assert spoke.stats()["jobs"].keys() == before.keys()


# -- demand before prefetch ------------------------------------------------------------------
def test_a_demand_read_is_fetched_before_queued_hint_prefetches(tmp_path) -> None:
    """With the one worker busy and 40 hint prefetches queued, a demand read's chunk goes in
    the very next batch the worker takes: it never waits behind the prefetches."""
    raws = [random_bytes(4 * KiB, 900 + i) for i in range(41)]
    ids = [chunk_id(r) for r in raws]
    by_id = {cid: frames.encode(r) for cid, r in zip(ids, raws, strict=True)}
    gate = threading.Event()
    batches: list[list[bytes]] = []

    def fetch(batch: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        batches.append(list(batch))
        if len(batches) == 1:
            gate.wait(30)
        for cid in batch:
            yield cid, by_id[cid]

    cache = DiskCache(str(tmp_path / "c"), 64 << 20)
    sched = FetchScheduler(fetch, cache, Traffic(), workers=1, batch_ids=4)
    try:
        sched.prefetch(ids[:1], HINT, job="j", kind="hint")  # occupies the worker until the gate opens
        while not batches:
            threading.Event().wait(0.01)
        sched.prefetch(ids[1:40], HINT, job="j", kind="hint")
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.extend(sched.read([ids[40]], DEMAND_PRIORITY)))
        reader.start()
        while ids[40] not in sched._pending:
            threading.Event().wait(0.01)
        gate.set()
        reader.join(30)
        assert got == [raws[40]]
        assert ids[40] in batches[1], "the demand read waited behind prefetches"
        stats = sched.prefetch_stats.snapshot()["totals"]["hint"]
        assert stats["prefetched_bytes"] >= 4 * KiB  # the first batch, at least, was a hint prefetch
    finally:
        gate.set()
        sched.stop()
        cache.close()


@needs_fuse
def test_a_mount_run_with_fabric_job_is_accounted_to_that_job(hub: Hub, spoke: Spoke, tmp_path, monkeypatch) -> None:
    """``FABRIC_JOB`` in the mount's environment tags every read it makes at the spoke."""
    repo = unique_name("mountjob")
    files = {f"d/f{i}.bin": random_bytes(300 * KiB, 700 + i) for i in range(4)}
    put_files(hub, repo, files)
    monkeypatch.setenv(JOB_ENV, "mount-job")
    with mounted(spoke.url, hub.token, f"{repo}@main", tmp_path / "mnt") as mnt:
        for path, data in files.items():
            with open(f"{mnt}/{path}", "rb") as f:
                assert f.read() == data
    job = spoke.stats()["jobs"]["mount-job"]
    assert job["demand_bytes"] == sum(len(d) for d in files.values())
    assert job["hit_ratio"] == 0.0 and job["wan_wait_seconds"] > 0
    # `fabric stats` prints the job's figures as an indented section, one per line.
    text = fabric("--server", spoke.url, "stats", token=hub.token).stdout.splitlines()
    assert "  mount-job:" in text and f"    demand_bytes: {job['demand_bytes']}" in text


def test_a_chunk_a_read_asks_for_is_no_longer_counted_ahead_and_its_bytes_once() -> None:
    """The lookahead moves on when a read is asked (the fetch scheduler's listeners), before
    its bytes are sent: from then on the chunk is not held ahead, and its later use or waste
    takes nothing off a second time."""
    cached = {b"a", b"b", b"c", b"d"}
    stats = PrefetchStats(JobTable(), cached.__contains__)
    for cid in (b"a", b"b", b"c"):
        stats.fetched(cid, 100, "job", "hint")
    assert stats._ahead[("job", "hint")] == 300
    stats.reading([b"a", b"b", b"x"])  # x: never prefetched
    assert stats._ahead[("job", "hint")] == 100
    stats.fetched(b"d", 100, "job", "hint")
    assert stats.snapshot()["ahead_max_bytes"]["job"]["hint"] == 300  # a and b were no longer ahead of d
    stats.demanded(b"a", 100, "job", True)
    cached.discard(b"b")
    stats.sweep()  # b, evicted unread after its read was asked: wasted, not taken off again
    assert stats._ahead[("job", "hint")] == 200
    stats.demanded(b"c", 100, "job", True)
    stats.demanded(b"d", 100, "job", True)
    assert stats._ahead[("job", "hint")] == 0
    totals = stats.snapshot()["totals"]["hint"]
    assert (totals["used_bytes"], totals["wasted_bytes"]) == (300, 100)
