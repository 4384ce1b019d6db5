"""Loader hints (``POST /api/v1/repos/{repo}/hints``) at a hub and at a spoke.

Real hub and spoke processes on loopback. What is asserted is counted by the spoke
(``GET /api/v1/stats``: ``jobs``, ``prefetch``), never timed: a job that hints its
order finds its reads in the cache; the spoke never holds more than its window
fetched ahead of a job; a bad hint is refused and changes nothing.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from fabric.client.http import HttpPlane
from fabric.errors import BadRequest, Forbidden, NotFound
from fabric.plane.jobs import JOB_HEADER, MAX_HINT_PATHS
from tests.hubserver import Hub, metric_value, unique_name
from tests.spokeserver import Spoke, random_bytes, start_spoke
from tests.test_auth import make_token

KiB, MiB = 1 << 10, 1 << 20
pytestmark = pytest.mark.timeout(180)


def make_repo(hub: Hub, stem: str, n: int, size: int, seed: int) -> tuple[str, dict[str, bytes]]:
    repo = unique_name(stem)
    plane = hub.plane()
    plane.create_repo(repo)
    files = {f"train/{i:04d}.bin": random_bytes(size, seed + i) for i in range(n)}
    for path, data in files.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    plane.put_object(repo, "main", "train/sub/x.bin", io.BytesIO(b"x"))
    plane.commit(repo, "main", "data")
    return repo, files


@pytest.fixture(scope="module")
def dataset(hub: Hub) -> tuple[str, dict[str, bytes]]:
    return make_repo(hub, "hints", 8, 256 * KiB, 7000)


@pytest.fixture
def spoke(hub: Hub, tmp_path) -> Iterator[Spoke]:
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token) as s:
        yield s


def wait_for(what: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def job_stats(spoke: Spoke, job: str) -> dict:
    return spoke.stats()["jobs"].get(job, {})


def hint_prefetched(spoke: Spoke, job: str) -> int:
    return job_stats(spoke, job).get("prefetch", {}).get("hint", {}).get("prefetched_bytes", 0)


# -- hints make hits -----------------------------------------------------------------------
def test_a_job_that_hints_finds_its_reads_cached_and_one_that_does_not_misses(hub: Hub, spoke: Spoke) -> None:
    hinted_repo, hinted = make_repo(hub, "hinted", 8, 256 * KiB, 100)
    cold_repo, cold = make_repo(hub, "unhinted", 8, 256 * KiB, 200)
    total = sum(map(len, hinted.values()))
    order = sorted(hinted, reverse=True)  # not path order: the spoke follows the hint

    plane = HttpPlane(spoke.url, hub.token, job="hinted")
    answer = plane.hint(hinted_repo, "main", order)
    assert answer == {"job": "hinted", "paths": 8, "bytes": total, "window_bytes": answer["window_bytes"]}
    assert answer["window_bytes"] >= total  # the default window (a quarter of the cache) holds all of it
    wait_for(lambda: hint_prefetched(spoke, "hinted") >= total)
    for path in order:
        assert plane.read(hinted_repo, "main", path) == hinted[path]
    other = HttpPlane(spoke.url, hub.token, job="unhinted")
    for path in sorted(cold):
        assert other.read(cold_repo, "main", path) == cold[path]

    jobs = spoke.stats()["jobs"]
    assert jobs["hinted"]["demand_bytes"] == total and jobs["hinted"]["hit_ratio"] == 1.0
    assert jobs["hinted"]["wan_wait_seconds"] == 0
    assert jobs["hinted"]["prefetch_coverage"] == 1.0
    hint = jobs["hinted"]["prefetch"]["hint"]
    assert hint["prefetched_bytes"] == hint["used_bytes"] == total and hint["accuracy"] == 1.0 and hint["wasted_bytes"] == 0
    assert jobs["unhinted"]["demand_bytes"] == total and jobs["unhinted"]["hit_ratio"] == 0.0
    assert jobs["unhinted"]["wan_wait_seconds"] > 0
    text = httpx.get(spoke.url + "/metrics").text
    assert metric_value(text, "fabric_spoke_job_prefetch_covered_bytes_total", job="hinted", kind="hint") == total
    assert metric_value(text, "fabric_spoke_job_hit_ratio", job="unhinted") == 0.0


def test_hinting_what_is_cached_fetches_nothing(hub: Hub, spoke: Spoke, dataset) -> None:
    repo, files = dataset
    reader = HttpPlane(spoke.url, hub.token)
    for path in files:
        reader.read(repo, "main", path)
    before = spoke.stats().get("upstream_bytes_received_prefetch", 0)
    HttpPlane(spoke.url, hub.token, job="again").hint(repo, "main", sorted(files))
    time.sleep(1.0)  # give the lookahead its turn: nothing may be fetched
    stats = spoke.stats()
    assert stats.get("upstream_bytes_received_prefetch", 0) == before
    assert hint_prefetched(spoke, "again") == 0


# -- the window bound ----------------------------------------------------------------------------
def test_the_lookahead_stays_within_its_window_and_moves_with_the_reads(hub: Hub, tmp_path) -> None:
    repo, files = make_repo(hub, "window", 12, 512 * KiB, 300)
    order = sorted(files)
    window = 1 * MiB
    with start_spoke(hub.url, tmp_path / "c", "64MiB", token=hub.token, args=["--hint-window", "1MiB"]) as spoke:
        plane = HttpPlane(spoke.url, hub.token, job="windowed")
        assert plane.hint(repo, "main", order)["window_bytes"] == window
        done = 0
        for k, path in enumerate(order):
            # The window ahead of the read position holds the next file whole (512 KiB < 1 MiB).
            wait_for(lambda k=k: hint_prefetched(spoke, "windowed") >= (k + 1) * 512 * KiB)
            assert plane.read(repo, "main", path) == files[path]
            done += len(files[path])
        stats = spoke.stats()
        job = stats["jobs"]["windowed"]
        assert job["demand_bytes"] == done and job["hit_ratio"] == 1.0
        ahead = stats["prefetch"]["ahead_max_bytes"]["windowed"]["hint"]
        assert 512 * KiB <= ahead <= window
        assert job["prefetch"]["hint"]["prefetched_bytes"] == done  # the window moved all the way, nothing twice
        assert stats["cache_chunk_bytes"] <= 64 * MiB


def test_a_data_set_larger_than_the_cache_keeps_what_the_next_epoch_will_read(hub: Hub, tmp_path) -> None:
    """Two epochs, each in a new random order sent as a hint, over 1.5x the cache, read by
    two workers at once: the first fetches every chunk once (what a worker is still
    reading is not evicted because the other started the next file), the second finds in
    the cache what the first left there (what is read soon stays, what was read goes),
    where keeping the most recently used would have evicted most of it before its turn."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    repo, files = make_repo(hub, "epochs", 24, 1 * MiB, 500)
    total = sum(map(len, files.values()))
    with start_spoke(hub.url, tmp_path / "c", "16MiB", token=hub.token) as spoke:
        plane = HttpPlane(spoke.url, hub.token, job="epochs")
        fetched = []
        for epoch in range(2):
            order = sorted(files)
            random.Random(epoch).shuffle(order)
            plane.hint(repo, "main", order)
            before = spoke.stats().get("upstream_bytes_received", 0)
            with ThreadPoolExecutor(2) as workers:
                got = list(workers.map(lambda p: plane.read(repo, "main", p), order))
            assert got == [files[p] for p in order]
            fetched.append(spoke.stats()["upstream_bytes_received"] - before)
            assert spoke.stats()["cache_chunk_bytes"] <= 16 * MiB
        assert fetched[0] <= 1.05 * total, fetched  # nothing fetched twice (frames cost a little more)
        # What a cache of 2/3 of the data can save at best: 1/3 fetched again. Keeping the
        # most recently read files (and fetching a window ahead) fetched about 70% again.
        assert fetched[1] <= 0.5 * total, fetched


def test_a_new_hint_replaces_the_order_and_append_extends_it(hub: Hub, tmp_path) -> None:
    repo, files = make_repo(hub, "append", 6, 512 * KiB, 400)
    order = sorted(files)
    with start_spoke(hub.url, tmp_path / "c", "64MiB", token=hub.token, args=["--hint-window", "1MiB"]) as spoke:
        plane = HttpPlane(spoke.url, hub.token, job="appender")
        plane.hint(repo, "main", order[:1])
        wait_for(lambda: hint_prefetched(spoke, "appender") >= 512 * KiB)
        assert plane.read(repo, "main", order[0]) == files[order[0]]
        time.sleep(0.5)
        assert hint_prefetched(spoke, "appender") == 512 * KiB  # the order ended: nothing more is fetched
        plane.hint(repo, "main", order[1:3], append=True)
        wait_for(lambda: hint_prefetched(spoke, "appender") >= 3 * 512 * KiB)
        plane.hint(repo, "main", order[4:5])  # a new order: file 3 is skipped
        wait_for(lambda: hint_prefetched(spoke, "appender") >= 4 * 512 * KiB)
        for path in order[1:3] + order[4:5]:
            assert plane.read(repo, "main", path) == files[path]
        job = job_stats(spoke, "appender")
        assert job["hit_ratio"] == 1.0 and job["prefetch"]["hint"]["prefetched_bytes"] == 4 * 512 * KiB


# -- bad hints ---------------------------------------------------------------------------------
def hint_status(spoke_or_hub, token: str, repo: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        f"{spoke_or_hub.url}/api/v1/repos/{repo}/hints",
        json=body,
        headers={"Authorization": f"Bearer {token}", **(headers or {})},
        timeout=60,
    )


@pytest.mark.parametrize("where", ["hub", "spoke"])
def test_bad_hints_are_refused_and_change_nothing(hub: Hub, spoke: Spoke, dataset, where: str) -> None:
    repo, files = dataset
    server = hub if where == "hub" else spoke
    paths = sorted(files)
    cases = [
        ({"ref": "main", "paths": [*paths, "train/missing.bin"], "job": "j1"}, 404, "train/missing.bin"),
        ({"ref": "main", "paths": [*paths, "train/sub"], "job": "j1"}, 404, "train/sub"),
        ({"ref": "main", "paths": ["train/../x"], "job": "j1"}, 400, "path"),
        ({"ref": "main", "paths": ["a"] * (MAX_HINT_PATHS + 1), "job": "j1"}, 400, "append"),
        ({"ref": "main", "paths": paths, "job": "bad job"}, 400, "job id"),
        ({"ref": "main", "paths": paths}, 400, "job id"),
        ({"ref": "main", "paths": "train/0000.bin", "job": "j1"}, 400, "paths"),
        ({"ref": "nope", "paths": paths, "job": "j1"}, 404, "nope"),
    ]
    for body, status, word in cases:
        r = hint_status(server, hub.token, repo, body)
        assert r.status_code == status, (body if len(str(body)) < 300 else body["paths"][:3], r.text)
        assert word in r.json()["error"]["message"]
    r = hint_status(server, hub.token, repo, {"ref": "main", "paths": paths}, {JOB_HEADER: "bad job"})
    assert r.status_code == 400
    if where == "spoke":
        time.sleep(0.5)
        stats = spoke.stats()
        assert "j1" not in stats["jobs"] and stats["prefetch"]["totals"]["hint"]["prefetched_bytes"] == 0
    # The same hint, valid, is taken (the job from the header).
    r = hint_status(server, hub.token, repo, {"ref": "main", "paths": paths}, {JOB_HEADER: "j1"})
    assert r.status_code == 200 and r.json()["job"] == "j1"
    if where == "hub":
        assert r.json()["window_bytes"] == 0


@pytest.mark.parametrize("where", ["hub", "spoke"])
def test_a_token_learns_nothing_about_a_repository_it_cannot_read(hub: Hub, spoke: Spoke, dataset, where: str) -> None:
    repo, files = dataset
    server = hub if where == "hub" else spoke
    own = unique_name("own")
    hub.plane().create_repo(own)
    token = make_token(hub, unique_name("reader"), {own: "read"})["token"]
    body = {"ref": "main", "paths": sorted(files), "job": "snoop"}
    exists = hint_status(server, token, repo, body)
    absent = hint_status(server, token, unique_name("absent"), body)
    assert exists.status_code == absent.status_code == 403
    shape = exists.json()["error"]["message"].replace(repo, "R")
    assert shape == absent.json()["error"]["message"].replace(absent.request.url.path.split("/")[4], "R")
    with pytest.raises(Forbidden):
        HttpPlane(server.url, token, job="snoop").hint(repo, "main", sorted(files))


def test_the_python_planes_answer_alike(hub: Hub, spoke: Spoke, dataset) -> None:
    repo, files = dataset
    for url in (hub.url, spoke.url):
        plane = HttpPlane(url, hub.token, job="py")
        assert plane.hint(repo, "main", sorted(files) * 2)["bytes"] == 2 * sum(map(len, files.values()))
        with pytest.raises(NotFound, match="train/none"):
            plane.hint(repo, "main", ["train/none"])
        with pytest.raises(BadRequest):
            plane.hint(repo, "main", ["/abs"])


def test_fsspec_hints_carry_its_job_to_the_spoke(hub: Hub, spoke: Spoke, dataset) -> None:
    from fabric.fsspec.filesystem import FabricFileSystem

    repo, files = dataset
    fs = FabricFileSystem(server=spoke.url, token=hub.token, job="fs-job", skip_instance_cache=True)
    answer = fs.hint([f"fabric://{repo}@main/{p}" for p in sorted(files)] + [f"{repo}/{sorted(files)[0]}"])
    assert answer["job"] == "fs-job" and answer["paths"] == len(files) + 1
    wait_for(lambda: hint_prefetched(spoke, "fs-job") >= sum(map(len, files.values())))
    assert fs.cat_file(f"{repo}@main/{sorted(files)[1]}") == files[sorted(files)[1]]
    assert job_stats(spoke, "fs-job")["demand_bytes"] > 0
    with pytest.raises(FileNotFoundError):
        fs.hint([f"{repo}@main/train/none.bin"])
    with pytest.raises(ValueError):
        FabricFileSystem(server=spoke.url, token=hub.token, job="bad job", skip_instance_cache=True)


# -- the lookahead's own work ----------------------------------------------------------------
class _RecordingFetcher:
    """What :class:`spoke.hints.Lookahead` asks of a fetch scheduler, recorded (no fetching)."""

    def __init__(self) -> None:
        import threading

        self.calls: list[list[bytes]] = []
        self.changed = threading.Condition()
        self.prefetch_stats = self

    def on_demand(self, listener) -> None:
        self.listener = listener

    def prefetch(self, ids, priority, job=None, kind="readahead") -> None:
        with self.changed:
            self.calls.append(list(ids))
            self.changed.notify_all()

    def waste_job(self, job, kind) -> None:
        pass


class _RecordingPlans:
    """The plans :class:`spoke.hints.Lookahead` gives the cache, recorded in order."""

    def __init__(self) -> None:
        import threading

        self.calls: list[list[bytes]] = []
        self.changed = threading.Condition()

    def __call__(self, name: str, ids) -> None:
        with self.changed:
            self.calls.append(list(ids))
            self.changed.notify_all()


def test_the_window_is_worked_out_again_only_after_an_eighth_of_it_was_read() -> None:
    """A job reading a chunk at a time must not make the spoke walk its whole window per read
    (which took half a spoke's CPU in a 1.1 GiB export); every chunk is still asked for ahead."""
    from fabric.format.model import Entry
    from spoke.hints import REFILL_FRACTION, Lookahead

    chunk, per_file, files_n = 64 * KiB, 4, 64
    files = [
        Entry(size=per_file * chunk, chunks=tuple((bytes([f + 1, c + 1]) * 16, chunk) for c in range(per_file)))
        for f in range(files_n)
    ]
    window = 64 * chunk
    fetcher = _RecordingFetcher()
    look = Lookahead(fetcher, lambda es: [e.chunks for e in es], window)
    try:
        look.hint("job", "repo", files, append=False)

        def advanced(n: int) -> None:
            with fetcher.changed:
                assert fetcher.changed.wait_for(lambda: len(fetcher.calls) >= n, timeout=10), "the lookahead did not advance"

        advanced(1)
        assert sum(1 for _ in fetcher.calls[0]) * chunk == window  # the first window, whole
        order = [cid for e in files for cid, _ in e.chunks]
        for k, cid in enumerate(order):
            asked = {c for call in fetcher.calls for c in call}
            assert cid in asked, f"chunk {k} was read before the lookahead asked for it"
            before = len(fetcher.calls)
            fetcher.listener("job", [cid])
            if look._orders[("job", "repo")].dirty:
                advanced(before + 1)
        refills = len(fetcher.calls) - 1
        per_refill = int(window * REFILL_FRACTION / chunk)
        assert refills <= (len(order) - window // chunk) // per_refill + 2, refills  # old code: one per read (256)
        assert all(len(call) * chunk <= window for call in fetcher.calls)
        asked = [cid for call in fetcher.calls for cid in call]
        assert sorted(asked) == sorted(order)  # each chunk asked for once: a refill asks only for new ones
    finally:
        look.stop()


def test_many_hinting_jobs_share_what_the_caches_plans_may_hold(monkeypatch) -> None:
    """The cache keeps PLAN_MAX_IDS planned places in all and drops whole plans beyond that:
    with many jobs each plan gets an equal share (never less than its window), so one job's
    plan does not push another's out."""
    import threading

    import spoke.hints as hints
    from fabric.format.model import Entry

    monkeypatch.setattr(hints, "PLAN_MAX_IDS", 64)
    monkeypatch.setattr(hints, "PLAN_IDS", 16)
    chunk = 64 * KiB
    files = [Entry(size=chunk, chunks=((bytes([f + 1]) * 32, chunk),)) for f in range(64)]
    plans: dict[str, list[bytes]] = {}
    changed = threading.Condition()

    def plan(name: str, ids) -> None:
        with changed:
            plans[name] = list(ids)
            changed.notify_all()

    look = hints.Lookahead(_RecordingFetcher(), lambda es: [e.chunks for e in es], 4 * chunk, plan)
    try:
        def planned(job: str, n: int) -> None:
            with changed:
                assert changed.wait_for(lambda: len(plans.get(f"hint {job} repo", ())) == n, timeout=10), plans

        look.hint("first", "repo", files, append=False)
        planned("first", 16)  # alone: PLAN_IDS
        for k in range(7):
            look.hint(f"job{k}", "repo", files, append=False)
        planned("job6", 8)  # eight orders: 64 / 8
        for k in range(7, 31):
            look.hint(f"job{k}", "repo", files, append=False)
        planned("job30", 4)  # 32 orders: 2 each, but never less than the window (4)
    finally:
        look.stop()


def test_the_read_plan_reaches_past_the_window_and_is_worked_out_again_halfway(monkeypatch) -> None:
    """The cache is told what the job reads next up to PLAN_IDS chunks ahead (so with a data
    set larger than the cache it keeps what comes soon), while only the window is fetched."""

    import spoke.hints as hints
    from fabric.format.model import Entry

    monkeypatch.setattr(hints, "PLAN_IDS", 16)
    chunk, files_n = 64 * KiB, 64
    files = [Entry(size=chunk, chunks=((bytes([f + 1]) * 32, chunk),)) for f in range(files_n)]
    order = [e.chunks[0][0] for e in files]
    window = 4 * chunk
    plan = _RecordingPlans()
    plans = plan.calls

    def planned(want: list[bytes]) -> None:
        with plan.changed:
            assert plan.changed.wait_for(lambda: plans and plans[-1] == want, timeout=10), plans[-1:]

    fetcher = _RecordingFetcher()
    look = hints.Lookahead(fetcher, lambda es: [e.chunks for e in es], window, plan)
    try:
        look.hint("job", "repo", files, append=False)
        planned(order[:16])
        with fetcher.changed:
            assert fetcher.changed.wait_for(lambda: fetcher.calls, timeout=10)
        assert fetcher.calls[0] == order[:4]  # fetched: the window only
        made = len(plans)
        fetcher.listener("job", order[:7])  # not yet half the plan: the plan stands
        time.sleep(0.3)
        assert len(plans) == made
        fetcher.listener("job", order[7:8])
        planned(order[8:24])
        fetcher.listener("job", order[8:56])
        planned(order[56:])  # the plan reaches the order's end
        made = len(plans)
        fetcher.listener("job", order[56:63])
        time.sleep(0.3)
        assert len(plans) == made  # nothing further to plan
        assert all(len(call) <= window // chunk for call in fetcher.calls)
    finally:
        look.stop()


def test_an_order_that_fits_its_window_is_planned_once() -> None:
    """Each plan replaces the last under the cache's lock, where demand reads wait: an order
    whose window holds it whole (a cached data set's next epoch) is planned once, not twice."""

    from fabric.format.model import Entry
    from spoke.hints import Lookahead

    chunk = 64 * KiB
    files = [Entry(size=chunk, chunks=((bytes([f + 1]) * 32, chunk),)) for f in range(16)]
    plan = _RecordingPlans()
    calls = plan.calls
    fetcher = _RecordingFetcher()
    look = Lookahead(fetcher, lambda es: [e.chunks for e in es], 64 * chunk, plan)
    try:
        for epoch, order in enumerate((files, files[::-1])):
            look.hint("job", "repo", order, append=False)
            with fetcher.changed:
                assert fetcher.changed.wait_for(lambda n=epoch + 1: len(fetcher.calls) >= n, timeout=10)
            time.sleep(0.2)  # a second plan, if any, comes right after the fetch
            with plan.changed:
                assert len(calls) == epoch + 1, calls
                assert calls[-1] == [e.chunks[0][0] for e in order]
    finally:
        look.stop()


def test_a_next_epochs_order_over_cached_data_is_worked_out_after_the_epochs_first_reads() -> None:
    """The next epoch's order of a job, when the cache holds its head, is worked out
    SETTLE_SECONDS after the hint (its first batches read cached chunks meanwhile, and
    the lookahead's work would only delay them); a first order, an order whose head is not
    cached, and an appended part are worked out at once."""
    from fabric.format.model import Entry
    from spoke import hints

    chunk = 64 * KiB
    files = [Entry(size=chunk, chunks=((bytes([f + 1]) * 32, chunk),)) for f in range(16)]
    cached = {e.chunks[0][0] for e in files[:12]}  # not the last four
    fetcher = _RecordingFetcher()
    look = hints.Lookahead(fetcher, lambda es: [e.chunks for e in es], 64 * chunk, None, cached.__contains__)

    def hint_and_time(order, append=False) -> float:
        with fetcher.changed:
            n = len(fetcher.calls)
        t0 = time.monotonic()
        look.hint("job", "repo", order, append=append)
        with fetcher.changed:
            assert fetcher.changed.wait_for(lambda: len(fetcher.calls) > n, timeout=10), "the order was never worked out"
        return time.monotonic() - t0

    try:
        assert hint_and_time(files[:12]) < hints.SETTLE_SECONDS / 2  # a job's first order
        assert hint_and_time(files[:12][::-1]) >= hints.SETTLE_SECONDS * 0.9  # its next epoch, cached
        assert hint_and_time(files[12:], append=True) < hints.SETTLE_SECONDS / 2  # more of the same epoch
        assert hint_and_time(files[::-1]) < hints.SETTLE_SECONDS / 2  # its head is not cached: at once
    finally:
        look.stop()
